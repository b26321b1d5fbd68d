"""The decode layer's persistent product built ahead of time: its SPIR-V written into the build
folder by `fusec build FILE --persistent PRESET`, so that the runtime needs no GLSL compiler to
run it (docs/PERSISTENT.md).

A product is found by its key: the SHA-256 of its GLSL without `#line` directives (which name
the source's path on the machine that printed it).  The runtime plans and prints the product as
it always does (Python, no compiler), and runs `persistent/<key>.spv` of the build folder when
there is one; any difference in what it would run (a preset, a weight dtype, a target's
variants, the subgroup size, a switch such as FUSEC_ATTENTION or the product's workgroup size)
is a different text, so a different key: a stale file is never run, only not found.
`persistent/index.json` says what each file is (its preset, weights, target, subgroup size, items,
workgroup size, sha256 and whether it records per-stage stamps: `--stamps` builds those too).
Nothing in the folder is trusted (as runtime/prebuilt.py trusts
nothing of a build): before the runtime runs a product's file, the index must be a regular file
of bounded size holding JSON whose every entry has exactly the record's keys and types, the
file's entry must agree with the product planned here (items, workgroup size), and the file must
be a regular file of that sha256 whose SPIR-V declares a GLCompute `main` of the product's
workgroup size and storage buffers of set 0 at the product's bindings only; anything else is
refused in one sentence (`find_spv`, RuntimeFailure).  A damaged index at build time is
replaced, and a file whose sha256 the old index does not vouch for is compiled again.

Input: a build folder of kernels.fuse, presets (decode_layer.PRESETS), optionally the weight
dtypes, targets and subgroup sizes to cover.  Output: the files and their records.  Not done
here: the budget gate and the grid (the runtime, on the device it runs on); products under the
non-default switches (FUSEC_PERSISTENT_SCHEDULE, _WORKGROUP_SIZE, _ITEM_GROUP, FUSEC_ATTENTION
and the layer's other switches): those are compiled at run time where a compiler is present.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from fusec.codegen import persistent as pc
from fusec.codegen import spirv
from fusec.codegen.folder import PERSISTENT_FOLDER
from fusec.codegen.targets import TARGETS
from fusec.dsl.ir import PARAMS_BUFFER, Program, SubgroupReq

from .device import RuntimeFailure
from .dispatch import Build, const_values
from .prebuilt import MAX_SPV_BYTES, read_regular, reflect_compute
from .step import Call

PRODUCTS = PERSISTENT_FOLDER  # the build folder's subfolder of products (codegen/folder.py)
INDEX = "index.json"
MAX_INDEX_BYTES = 16 << 20
_HINT = "rebuild it with fusec build FILE -o DIR --persistent PRESET"
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
    sha256: str  # of persistent/<key>.spv
    stamps: bool  # the product records per-stage device-clock stamps (`--stamps`)


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
    """The product's SPIR-V built ahead of time into `folder`, checked (module docstring); None
    when the build has none (no file and no index entry for it); RuntimeFailure when the folder's
    products are damaged."""
    key = product_key(product)
    products = folder / PRODUCTS
    name = f"{key}.spv"
    if not products.is_dir():
        return None
    present = os.path.lexists(products / name)
    if not present and not os.path.lexists(products / INDEX):
        return None
    index = read_index(folder)
    entry = index.get(key)
    if entry is None:
        if present:
            raise _damaged(folder, f"{name} is not in {PRODUCTS}/{INDEX}")
        return None
    if (entry.items, entry.workgroup_size) != (product.items, product.workgroup_size):
        raise _damaged(
            folder,
            f"{PRODUCTS}/{INDEX} says {name} has {entry.items} items of {entry.workgroup_size} "
            f"lanes; the product of that key has {product.items} of {product.workgroup_size}",
        )
    if entry.stamps != product.stamps:
        raise _damaged(
            folder,
            f"{PRODUCTS}/{INDEX} says {name} is {_stamped(entry.stamps)}; the product of that "
            f"key is {_stamped(product.stamps)}",
        )
    spv = _read(folder, name, MAX_SPV_BYTES)
    if hashlib.sha256(spv).hexdigest() != entry.sha256:
        raise _damaged(folder, f"{name} does not have the sha256 {PRODUCTS}/{INDEX} records")
    _check_declarations(folder, name, spv, product)
    return spv


def _stamped(stamps: bool) -> str:
    return "a product with stamps" if stamps else "a product without stamps"


def _damaged(folder: Path, what: str) -> RuntimeFailure:
    return RuntimeFailure(f"the persistent products of {folder} are damaged: {what}", _HINT)


def _read(folder: Path, name: str, limit: int) -> bytes:
    """The bytes of persistent/`name`: a regular file (no link, no directory) of at most `limit`
    bytes (prebuilt.read_regular), else the products are damaged."""
    try:
        return read_regular(folder / PRODUCTS, name, limit)
    except RuntimeFailure as exc:
        what = exc.diagnostics[0].message.split(" is damaged: ", 1)[-1]
        raise _damaged(folder, what.replace(name, f"{PRODUCTS}/{name}", 1)) from None


def read_index(folder: Path) -> dict[str, Built]:
    """persistent/index.json of `folder`, every entry checked for exactly the record's keys and
    types (RuntimeFailure otherwise)."""
    where = f"{PRODUCTS}/{INDEX}"
    raw = _read(folder, INDEX, MAX_INDEX_BYTES)

    def no_constants(token: str) -> Any:
        raise ValueError(f"{token} is not a JSON number")

    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=no_constants)
    except RecursionError:
        raise _damaged(folder, f"{where} nests too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise _damaged(folder, f"{where} is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise _damaged(folder, f"{where} is not an object of products by key")
    fields = {f.name: f.type for f in attrs.fields(Built)}
    out = {}
    for key, entry in data.items():
        if not _HEX64.fullmatch(key):
            raise _damaged(folder, f"{where} has an entry {key[:80]!r}, which is no product key")
        if not isinstance(entry, dict) or set(entry) != set(fields):
            raise _damaged(
                folder,
                f"{where}: the entry of {key[:12]}... does not hold exactly {sorted(fields)}",
            )
        for field, value in entry.items():
            if not _of_type(value, str(fields[field])):
                raise _damaged(
                    folder,
                    f"{where}: {field} of {key[:12]}... is {repr(value)[:80]}, not {fields[field]}",
                )
        if entry["key"] != key or not _HEX64.fullmatch(entry["sha256"]):
            raise _damaged(
                folder, f"{where}: the entry of {key[:12]}... names another key or no sha256"
            )
        out[key] = Built(**entry)
    return out


_HEX64 = re.compile(r"[0-9a-f]{64}")


def _of_type(value: object, annotation: str) -> bool:
    if annotation == "int":
        return type(value) is int and value > 0
    if annotation == "str":
        return isinstance(value, str)
    if annotation == "bool":
        return isinstance(value, bool)
    assert annotation == "str | None", annotation
    return value is None or isinstance(value, str)


def _check_declarations(folder: Path, name: str, spv: bytes, product: pc.Product) -> None:
    """What the module declares agrees with the product: a GLCompute `main` of its workgroup
    size, storage buffers of set 0 at its bindings only (and the stamp buffer's, binding
    len(buffers), where it has stamps)."""
    refl = reflect_compute(name, spv, product.workgroup_size, "the product")
    if isinstance(refl, str):
        raise _damaged(folder, refl)
    bindings = len(product.buffers) + (1 if product.stamps else 0)
    for (dset, number), bound in sorted(refl.bindings.items()):
        if dset != 0 or number >= bindings:
            raise _damaged(folder, f"{name} uses binding {number} of set {dset}, not the product's")
        if not spirv.is_storage_buffer(bound.storage_class):
            raise _damaged(folder, f"{name} binds no storage buffer at binding {number}")


def _old_index(folder: Path) -> dict[str, Built]:
    """The index a build finds in the folder, {} where there is none or it is damaged (the
    build then compiles every product again)."""
    if not os.path.lexists(folder / PRODUCTS / INDEX):
        return {}
    try:
        return read_index(folder)
    except RuntimeFailure:
        return {}


def build_products(
    folder: Path,
    presets: Sequence[str],
    weights: Sequence[str] | None = None,
    targets: Sequence[str | None] | None = None,
    subgroups: Sequence[int] | None = None,
    stamps: bool = False,
) -> list[Built]:
    """Write the persistent product of the layer of each preset into `folder` (a build of
    kernels.fuse): for every weight dtype (`weights`, default all), every target (`targets`,
    default every known one and None, a device of no known target) at each subgroup size it
    runs (`subgroups` restricts them) where every region may run at it.  A product already
    there whose sha256 the folder's index vouches for is not compiled again (a damaged index
    vouches for none).  `stamps`: each also with per-stage device-clock stamps (the product
    `fusec bench --persistent --per-dispatch` runs).  Returns every product covered, one record
    per key."""
    from fusec.codegen.shaderc import compile_glsl
    from fusec.runtime import decode_layer as layer

    from .persistent import source_program

    build = Build.load(folder)
    program = source_program()
    out_dir = folder / PRODUCTS
    out_dir.mkdir(exist_ok=True)
    index_path = out_dir / INDEX
    old = _old_index(folder)
    index = {k: attrs.asdict(b) for k, b in old.items()}
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
                    for stamped in (False, True) if stamps else (False,):
                        try:
                            product = pc.plan_product(specs, size, stamps=stamped)
                        except pc.NotAnItem:
                            break
                        key = product_key(product)
                        if key in built:
                            continue
                        spv = out_dir / f"{key}.spv"
                        vouched = old[key].sha256 if key in old else None
                        if vouched is None or _sha256_of(spv) != vouched:  # not vouched for
                            text = pc.emit_persistent(product, line_directives=False)
                            tmp = spv.with_suffix(".tmp")
                            tmp.write_bytes(compile_glsl(text, f"persistent-{name}-{wdtype}"))
                            tmp.replace(spv)
                        b = Built(
                            key,
                            name,
                            wdtype,
                            tname,
                            size,
                            product.items,
                            product.workgroup_size,
                            hashlib.sha256(spv.read_bytes()).hexdigest(),
                            stamped,
                        )
                        built[key] = b
                        index[key] = attrs.asdict(b)
    index_path.write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
    return list(built.values())


def _sha256_of(path: Path) -> str | None:
    """The sha256 of a regular file at `path`, None for anything else."""
    if path.is_symlink() or not path.is_file():
        return None
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _runs_at(build: Build, calls: Sequence[Call], size: int) -> bool:
    """Whether every fused kernel of the chain may run at subgroup size `size`."""
    return all(
        SubgroupReq(k.subgroup.kind, tuple(k.subgroup.sizes)).allows(size)
        for c in calls
        for k in build.region(c.region).fused
    )
