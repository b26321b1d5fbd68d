"""The decode layer's persistent product built ahead of time: its SPIR-V written into the build
folder by `fusec build FILE --persistent PRESET`, so that the runtime needs no GLSL compiler to
run it (docs/PERSISTENT.md).

A product is found by its key: the SHA-256 of its GLSL without `#line` directives (which name
the source's path on the machine that printed it).  The runtime plans and prints the product as
it always does (Python, no compiler), and runs `persistent/<key>.spv` of the build folder when
there is one; any difference in what it would run (a preset, a weight dtype, a target's
variants, the subgroup size, a switch such as FUSEC_ATTENTION or the product's workgroup size)
is a different text, so a different key: a stale file is never run, only not found.
`persistent/index.json` says what each file is, for people (the runtime reads only the key).

Input: a build folder of kernels.fuse, presets (decode_layer.PRESETS), optionally the weight
dtypes, targets and subgroup sizes to cover.  Output: the files and their records.  Not done
here: the budget gate and the grid (the runtime, on the device it runs on); products under the
non-default switches (FUSEC_PERSISTENT_SCHEDULE, _WORKGROUP_SIZE, _ITEM_GROUP, FUSEC_ATTENTION
and the layer's other switches): those are compiled at run time where a compiler is present.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import attrs

from fusec.codegen import persistent as pc
from fusec.codegen.targets import TARGETS
from fusec.dsl.ir import PARAMS_BUFFER, Program, SubgroupReq

from .dispatch import Build, const_values
from .step import Call

PRODUCTS = "persistent"  # the build folder's subfolder of products
INDEX = "index.json"
# subgroup sizes of a device that is no known target (lavapipe: 4, 8 and 16 by its vector width)
GENERIC_SUBGROUPS = (4, 8, 16, 32, 64)


@attrs.frozen
class Built:
    """One product written: its key (file persistent/<key>.spv) and what it is."""

    key: str
    preset: str
    weights: str
    target: str | None
    subgroup: int
    items: int
    workgroup_size: int


def product_specs(build: Build, calls: Sequence[Call], program: Program) -> list[pc.StageSpec]:
    """The chain `calls` as the product's stages: each region as `program` checks it, the
    call's constants as the build's region evaluates them, its buffers the step buffers (a
    region's run-time parameters a product buffer of its own)."""
    regions = {r.name: r for r in program.regions}
    specs = []
    for i, call in enumerate(calls):
        values = const_values(build.region(call.region), call.consts)
        bind = {**call.bind, PARAMS_BUFFER: f"{i}#{PARAMS_BUFFER}"}
        specs.append(pc.StageSpec(regions[call.region], tuple(values.items()), tuple(bind.items())))
    return specs


def product_key(product: pc.Product) -> str:
    """The key of a product: the SHA-256 of its GLSL without #line directives."""
    text = pc.emit_persistent(product, line_directives=False)
    return hashlib.sha256(text.encode()).hexdigest()


def find_spv(folder: Path, product: pc.Product) -> bytes | None:
    """The product's SPIR-V built ahead of time into `folder`, None when the build has none."""
    path = folder / PRODUCTS / f"{product_key(product)}.spv"
    return path.read_bytes() if path.is_file() else None


def build_products(
    folder: Path,
    presets: Sequence[str],
    weights: Sequence[str] | None = None,
    targets: Sequence[str | None] | None = None,
    subgroups: Sequence[int] | None = None,
) -> list[Built]:
    """Write the persistent product of the layer of each preset into `folder` (a build of
    kernels.fuse): for every weight dtype (`weights`, default all), every target (`targets`,
    default every known one and None, a device of no known target) at each subgroup size it
    runs (`subgroups` restricts them) where every region may run at it.  A product already
    there is not compiled again.  Returns every product covered, one record per key."""
    from fusec.codegen.shaderc import compile_glsl
    from fusec.runtime import decode_layer as layer

    from .persistent import source_program

    build = Build.load(folder)
    program = source_program()
    out_dir = folder / PRODUCTS
    out_dir.mkdir(exist_ok=True)
    index_path = out_dir / INDEX
    index: dict[str, dict[str, object]] = (
        json.loads(index_path.read_text()) if index_path.is_file() else {}
    )
    built: dict[str, Built] = {}
    for name in presets:
        preset = layer.PRESETS[name]
        for wdtype in weights or layer.WEIGHT_DTYPES:
            for tname in [*TARGETS, None] if targets is None else targets:
                sizes = TARGETS[tname].wave_sizes if tname is not None else GENERIC_SUBGROUPS
                calls = layer.calls(preset, wdtype, regions=build.manifest, target=tname)
                specs = product_specs(build, calls, program)
                for size in sizes:
                    if subgroups is not None and size not in subgroups:
                        continue
                    if not _runs_at(build, calls, size):
                        continue
                    try:
                        product = pc.plan_product(specs, size)
                    except pc.NotAnItem:
                        continue
                    key = product_key(product)
                    if key in built:
                        continue
                    spv = out_dir / f"{key}.spv"
                    if not spv.is_file():
                        text = pc.emit_persistent(product, line_directives=False)
                        tmp = spv.with_suffix(".tmp")
                        tmp.write_bytes(compile_glsl(text, f"persistent-{name}-{wdtype}"))
                        tmp.replace(spv)
                    b = Built(key, name, wdtype, tname, size, product.items, product.workgroup_size)
                    built[key] = b
                    index[key] = attrs.asdict(b)
    index_path.write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
    return list(built.values())


def _runs_at(build: Build, calls: Sequence[Call], size: int) -> bool:
    """Whether every fused kernel of the chain may run at subgroup size `size`."""
    return all(
        SubgroupReq(k.subgroup.kind, tuple(k.subgroup.sizes)).allows(size)
        for c in calls
        for k in build.region(c.region).fused
    )
