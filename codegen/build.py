"""`.fuse` file -> build folder: `<region>.spv`, `<region>.unfused.<i>.spv`, GLSL and manifest.json.

The one function that chains the stages: parse, check, lower (fused and unfused), emit GLSL,
compile, write.  The folder is written atomically: everything goes to a temporary sibling, which
replaces DIR only when every kernel compiled.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import os
import re
import shutil
import stat
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import attrs

from fusec.dsl import ir
from fusec.dsl.cachedir import private_folder
from fusec.dsl.check import Limits, check
from fusec.dsl.diagnostics import Diagnostic, DiagnosticError
from fusec.dsl.parse import parse
from fusec.dsl.region_names import resolve_regions, with_variants
from fusec.dsl.span import Source

from . import folder, kir, manifest
from . import manifest_records as mr
from .budget import budget_for, capability_refusal, judge
from .estimate import estimates
from .glsl import DERIVED_SPEC_BASE, buffer_id, emit_kernel, shared_id
from .liveness import Demand, demand
from .lower import intermediates, lower_fused, lower_unfused
from .lower_tile import lower_tile_fused
from .nvidia import NvidiaFeatures, analyze_nvidia
from .objcache import (
    MAX_CACHED_SPV_BYTES,
    NvidiaMemo,
    ObjectCache,
    SpvCache,
    code_digest,
    kernel_hashes,
)
from .shaderc import backend, compile_glsl, compiler_id
from .targets import TARGETS


@attrs.frozen
class BuiltKernel:
    kernel: kir.Kernel
    glsl: str
    spv: bytes
    derived: tuple[ir.Expr, ...] = ()  # values of spec ids DERIVED_SPEC_BASE + i
    demand: Demand | None = None  # measured on `spv` (codegen/liveness.py)
    nvidia: NvidiaFeatures | None = None  # measured on `spv` (codegen/nvidia.py)


@attrs.frozen
class BuildResult:
    program: ir.Program
    kernels: tuple[BuiltKernel, ...]
    manifest: mr.Manifest
    seconds: float
    text: str
    # the manifest as written to manifest.json (serialized once, when it was sealed)
    manifest_json: dict[str, Any] = attrs.field(eq=False, repr=False)


def _estimates(b: BuiltKernel, targets: tuple[str, ...]) -> tuple[mr.Estimate, ...]:
    """The estimate on every (target, wave), measured once per kernel on its SPIR-V."""
    where = [(TARGETS[t], wave) for t in targets for wave in TARGETS[t].wave_sizes]
    measured = b.demand if b.demand is not None else b.spv
    return tuple(
        mr.Estimate(
            e.target,
            e.wave,
            e.vgprs,
            e.sgprs,
            e.lds_bytes,
            e.spills,
            e.waves_per_simd,
            e.uncertain,
            e.loads_up,
        )
        for e in estimates(b.kernel, measured, where, nvidia=b.nvidia or analyze_nvidia(b.spv))
    )


def _subgroup(s: ir.SubgroupReq) -> mr.Subgroup:
    return mr.Subgroup(s.kind, tuple(s.sizes))


def _kernel_record(b: BuiltKernel, targets: tuple[str, ...]) -> mr.Kernel:
    k, spv = b.kernel, b.spv
    return mr.Kernel(
        name=k.name,
        spv=f"{k.name}.spv",
        sha256=hashlib.sha256(spv).hexdigest(),
        stages=tuple(k.stages),
        workgroup_size=k.workgroup_size,
        subgroup=_subgroup(k.subgroup),
        bindings=tuple(mr.Binding(b.binding, b.buffer.name, b.reads, b.writes) for b in k.bindings),
        # 32-bit words of each shared array (f32 elements, or q8_0 blocks of 10 words)
        shared_floats=tuple(manifest.expr_record(a.words) for a in k.shared),
        reduction_scratch=k.reduction_scratch,
        exchange_scratch=k.exchange_scratch,
        grid=tuple(
            mr.GridItem(manifest.expr_record(g.extent), g.per_workgroup, g.rows_per_subgroup)
            for g in k.grid
        ),
        features=(("storage_buffer_16bit",) if k.uses_f16 else ())
        + (("atomic_float_add",) if k.atomics else ())
        + (("integer_dot_product",) if k.uses_int_dot else ())
        + (("float64",) if k.uses_f64 else ())
        + (("vulkan_memory_model",) if k.counters else ()),
        zero_outputs=tuple(k.zero_outputs),
        # specialization constants the runtime computes from the region's constants: spec id
        # and expression (integer divisions of constants, glsl_expr._Derived)
        derived=tuple(
            mr.Derived(DERIVED_SPEC_BASE + i, manifest.expr_record(e))
            for i, e in enumerate(b.derived)
        ),
        estimates=_estimates(b, targets),
        loop=k.loop,
        loop_count=manifest.expr_record(k.loop_count) if k.loop_count is not None else None,
        exchange=next((p.exchange for p in k.phases if isinstance(p, kir.TilePhase)), None),
        counters=tuple(c.name for c in k.counters),
    )


def _verdicts(
    fused: tuple[mr.Kernel, ...], rules: tuple[mr.BudgetRule, ...], targets: tuple[str, ...]
) -> tuple[mr.Verdict, ...]:
    """Per target and wave: can the target run the fused product (capabilities, at the
    default constants' shared memory) and is it within budget; why not."""
    out = []
    for t in targets:
        budget = budget_for(t, rules)
        for wave in TARGETS[t].wave_sizes:
            accepted, reason = True, "within budget"
            for k in fused:
                est = k.estimate(t, wave)
                assert est is not None  # _estimates covers every target and wave
                lacks = capability_refusal(TARGETS[t], k, est.lds_bytes, wave)
                if lacks is not None:
                    accepted, reason = False, f"{t}: {k.name}: {lacks}"
                    break
                ok, why = judge(t, wave, est, budget)
                if not ok:
                    accepted, reason = False, f"{k.name}: {why}"
                    break
            out.append(mr.Verdict(t, wave, accepted, reason))
    return tuple(out)


def _region_record(
    r: ir.Region,
    fused: list[BuiltKernel],
    unfused: list[BuiltKernel],
    shared: list[BuiltKernel],
    targets: tuple[str, ...],
) -> mr.Region:
    rules = tuple(mr.BudgetRule(b.key, b.limit, b.target) for b in r.budget)
    fused_records = tuple(_kernel_record(b, targets) for b in fused)
    return mr.Region(
        name=r.name,
        line=r.span.line_col()[0],
        inputs=tuple(manifest.buffer_record(b) for b in r.inputs),
        outputs=tuple(manifest.buffer_record(b) for b in r.outputs),
        consts=tuple(manifest.const_record(c) for c in r.consts),
        # state outputs written at a fixed index: the index must lie inside the dimension
        state_writes=tuple(
            mr.StateWrite(s.output.name, axis, i.const.name)
            for s in r.all_stages()
            if s.output is not None and s.out_index is not None
            for axis, i in enumerate(s.out_index)
            if isinstance(i, ir.ConstRef)
        ),
        launch=mr.Launch(
            r.launch.workgroup_size, _subgroup(r.launch.subgroup), r.launch.rows_per_subgroup
        ),
        budget=rules,
        verdicts=_verdicts(fused_records, rules, targets),
        fused=fused_records,
        unfused=tuple(_kernel_record(b, targets) for b in unfused),
        intermediates=tuple(
            manifest.buffer_record(b) for b in intermediates([b.kernel for b in fused + unfused])
        ),
        fused_shared=tuple(_kernel_record(b, targets) for b in shared),
        instance=(
            mr.Instance(r.instance.generic, r.instance.bindings, r.instance.target)
            if r.instance is not None
            else None
        ),
    )


OBJECT_CACHE = True  # False: builds neither read nor write the object cache (objcache.py)


def check_source(text: str, path: str, targets: tuple[str, ...] = ()) -> ir.Program:
    """Parse and check, with the limits of the targets: the shared memory of those built for
    (all known by default), the rest the most any known target offers, since a budget may name
    any of them.  The one front end: `build`, `check`, `occupancy` and `explain` all check
    through here, a build folder with the options its manifest records (`build_options`)."""
    names = targets or tuple(TARGETS)
    known = TARGETS.values()
    limits = Limits(
        shared_bytes=min(TARGETS[t].max_shared_bytes for t in names),
        workgroup_size=max(t.max_workgroup_size for t in known),
        lane_registers=max(t.max_vgprs for t in known),
        waves_per_simd=max(t.max_waves_per_simd for t in known),
    )
    return check(parse(text, path), limits, tuple(TARGETS))


def select_regions(
    program: ir.Program, names: tuple[str, ...], variants: bool = False
) -> list[ir.Region]:
    """The regions of `names` (every region when empty), in the source's order; an unknown name
    is a diagnostic that lists the names near it.  An instance of a generic region answers to
    its display name too (`gated_ffn<q4_0>` for `gated_ffn_q4_0`; dsl/region_names.py).  With
    `variants`, a named region brings its target variants (`R__sm90`: what runs on that
    target), as explain and occupancy show them."""
    names = resolve_regions(program.regions, names, program.path)
    if variants:
        names = with_variants(program.regions, names)
    return [r for r in program.regions if not names or r.name in names]


@contextlib.contextmanager
def _few_collections() -> Iterator[None]:
    """Python's cyclic garbage collector runs less often while kernels are emitted and
    measured: they make hundreds of thousands of small objects and hardly any reference cycles,
    and the collector, run every 700 allocations by default, took about a tenth of a cold build
    of kernels.fuse (bench/compile_speed.py)."""
    threshold = gc.get_threshold()
    gc.set_threshold(max(threshold[0], 50_000), *threshold[1:])
    try:
        yield
    finally:
        gc.set_threshold(*threshold)


def products(region: ir.Region) -> list[list[kir.Kernel]]:
    """The kernels a build compiles for `region`, by product: the fused kernels, the unfused
    chain, and the shared-memory variant of a tile that has that fallback."""
    out = [lower_fused(region), lower_unfused(region)]
    if region.tile is not None and region.tile.shared_fallback:
        out.append(lower_tile_fused(region, "shared"))
    return out


def _own_names(k: kir.Kernel) -> set[str]:
    """The names a region's author chose that the kernel's GLSL identifiers carry (the object
    cache's key renames them)."""
    return (
        {buffer_id(b.buffer) for b in k.bindings}
        | {shared_id(a.name) for a in k.shared}
        | {c.name for c in k.region.consts}
        | set(k.stages)
    )


def build_source(
    text: str,
    path: str,
    targets: tuple[str, ...] = (),
    cache_dir: str | Path | None = None,
    regions: tuple[str, ...] = (),
    variants: bool = False,
) -> BuildResult:
    """Compile a `.fuse` text in memory.  Raises DiagnosticError on bad input.
    `targets` selects the targets whose shared-memory limit applies (all known by default; the
    manifest always holds estimates for every known target); `cache_dir`, an
    earlier build folder, lets kernels whose GLSL did not change skip the compiler; `regions`
    builds only those regions (the whole source is still checked), with their target variants
    where `variants`."""
    with _few_collections():
        return _build_source(text, path, targets, cache_dir, regions, variants)


def _build_source(
    text: str,
    path: str,
    targets: tuple[str, ...],
    cache_dir: str | Path | None,
    only: tuple[str, ...],
    variants: bool = False,
) -> BuildResult:
    t0 = time.perf_counter()
    names = targets or tuple(TARGETS)
    program = check_source(text, path, names)
    selected = select_regions(program, only, variants)
    source = program.regions[0].span.source if program.regions else Source(path, text)
    sources = {path: source}
    cache = SpvCache(Path(cache_dir) if cache_dir is not None else None)
    objects = ObjectCache(OBJECT_CACHE)

    def compile_one(kg: tuple[kir.Kernel, str, tuple[ir.Expr, ...]]) -> tuple[bytes, Demand, bool]:
        """(SPIR-V, its register demand, whether the compiler made it just now).  Runs in a
        compile thread: shaderc releases the GIL, so one thread's compile overlaps the other's
        measuring and the main thread's emitting, and no measuring is left over at the end."""
        k, glsl, _ = kg
        reused = cache.get(k.name, glsl)
        if reused is not None:
            try:
                return reused, measured(reused), False
            except ValueError:
                pass  # a folder's SPIR-V that is not well formed: compile instead
        spv = compile_glsl(glsl, k.name, sources)
        return spv, measured(spv), True  # a ValueError here is a bug, reported as one

    # kernels whose GLSL differs compile to the same SPIR-V often enough (names are not in it:
    # 115 modules for kernels.fuse's 136 compiles) that its demand is measured once per module
    by_module: dict[str, Demand] = {}

    def measured(spv: bytes) -> Demand:
        digest = hashlib.sha256(spv).hexdigest()
        found = by_module.get(digest)
        if found is None:
            found = by_module.setdefault(digest, demand(spv))
            analyze_nvidia(spv)  # measured here, in a compile thread; the estimate reuses it
        return found

    # each kernel goes to the compile threads as soon as it is emitted
    spvs: dict[str, bytes] = {}
    demands: dict[str, Demand] = {}
    keys: dict[str, str] = {}
    hits: list[str] = []  # keys found in the object cache
    same: dict[str, list[str]] = {}  # key -> kernels waiting for the compile of an equal one
    lowered = []
    futures: dict[Future[tuple[bytes, Demand, bool]], kir.Kernel] = {}
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        for region in selected:
            emitted_products = []
            for product in products(region):
                emitted = []
                for k in product:
                    kg = (k, *emit_kernel(k))
                    emitted.append(kg)
                    keys[k.name] = objects.key(kg[1], _own_names(k))
                    key = keys[k.name]
                    hit = objects.get(key)
                    if hit is not None:
                        spvs[k.name], demands[k.name] = hit
                        hits.append(key)
                    elif key in same:
                        same[key].append(k.name)  # compiled once, for an equal kernel
                    else:
                        same[key] = []
                        futures[pool.submit(compile_one, kg)] = k
                emitted_products.append(emitted)
            lowered.append((region, emitted_products))
        for future in as_completed(futures):
            k = futures[future]
            spv, found, compiled = future.result()
            if compiled:  # only what the compiler made goes to the user-wide cache
                objects.put(keys[k.name], spv, found)
            for name in (k.name, *same[keys[k.name]]):
                spvs[name], demands[name] = spv, found
    objects.close(hits)
    memo = NvidiaMemo(objects.salt, analyze_nvidia, OBJECT_CACHE)
    nvidia: dict[bytes, NvidiaFeatures] = {}
    for spv in spvs.values():
        if spv not in nvidia:
            nvidia[spv] = memo.features(spv)
    memo.close()
    built: list[BuiltKernel] = []
    regions: list[mr.Region] = []
    for region, products_ in lowered:
        done = [
            [
                BuiltKernel(k, glsl, spvs[k.name], derived, demands[k.name], nvidia[spvs[k.name]])
                for k, glsl, derived in product
            ]
            for product in products_
        ]
        built.extend(b for product in done for b in product)
        # estimates and verdicts for every known target: cheap, and a deployment may meet any
        shared = done[2] if len(done) > 2 else []
        regions.append(_region_record(region, done[0], done[1], shared, tuple(TARGETS)))
    unsealed = mr.Manifest(
        format=manifest.FORMAT,
        integrity="",
        source=path,
        source_copy="source.fuse",
        compiler=backend(),
        compiler_id=compiler_id(),
        # what makes a rebuild of the same folder a no-op (up_to_date)
        build_key=cache_key(text, path, targets, only),
        glsl_sha256=_glsl_digest((b.kernel.name, b.glsl) for b in built),
        build_options=mr.BuildOptions(
            targets=targets, regions=tuple(r.name for r in selected) if only else ()
        ),
        regions=tuple(regions),
    )
    sealed, data = manifest.sealed(unsealed)
    seconds = time.perf_counter() - t0
    return BuildResult(program, tuple(built), sealed, seconds, text, data)


def write_build(result: BuildResult, out_dir: str | Path) -> Path:
    """Write SPIR-V, GLSL and manifest.json into `out_dir`, atomically (codegen/folder.py):
    a destination that is not a fusec build folder is refused, never replaced."""
    out = Path(out_dir)
    folder.check_destination(out)
    try:
        tmp = folder.make_temporary(out)
    except OSError as exc:
        raise DiagnosticError(
            [Diagnostic(None, f"cannot create the output folder {out}: {exc.strerror}")]
        ) from None
    try:
        (tmp / "glsl").mkdir()
        for b in result.kernels:
            (tmp / f"{b.kernel.name}.spv").write_bytes(b.spv)
            (tmp / "glsl" / f"{b.kernel.name}.comp").write_text(b.glsl)
        (tmp / "source.fuse").write_text(result.text)
        (tmp / "manifest.json").write_text(json.dumps(result.manifest_json, indent=1) + "\n")
        folder.swap_into_place(tmp, out)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise DiagnosticError(
            [Diagnostic(None, f"cannot write the output folder {out}: {exc.strerror or exc}")]
        ) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def build_file(path: str | Path, out_dir: str | Path, targets: tuple[str, ...] = ()) -> BuildResult:
    from fusec.dsl.source_file import read_source

    text = read_source(path)
    folder.check_destination(Path(out_dir))
    result = build_source(text, str(path), targets, cache_dir=out_dir)
    write_build(result, out_dir)
    return result


def _glsl_digest(kernels: Iterable[tuple[str, str]]) -> str:
    h = hashlib.sha256()
    for name, glsl in sorted(kernels):
        h.update(name.encode() + b"\0" + glsl.encode("utf-8", "surrogateescape") + b"\0")
    return h.hexdigest()


def up_to_date(text: str, path: str, targets: tuple[str, ...], out: Path) -> mr.Manifest | None:
    """The manifest of `out` when it is a complete build of this very source by this fusec,
    compiler and targets, unedited: a rebuild would write the same bytes, so it can be skipped.
    None when anything differs or cannot be read (then the caller builds)."""
    try:
        mpath = out / "manifest.json"
        if not stat.S_ISREG(mpath.lstat().st_mode):
            return None
        data = json.loads(mpath.read_bytes())
        if (
            not isinstance(data, dict)
            or data.get("format") != manifest.FORMAT
            or data.get("build_key") != cache_key(text, path, targets)
            or not manifest.is_sealed(data)
            or folder.foreign_entries(out) != []
            or (out / "source.fuse").read_text() != text
        ):
            return None
        glsl = []
        for name, sha256 in kernel_hashes(data).items():
            glsl.append((name, (out / "glsl" / f"{name}.comp").read_text()))
            with open(out / f"{name}.spv", "rb") as f:
                spv = f.read(MAX_CACHED_SPV_BYTES + 1)
            if hashlib.sha256(spv).hexdigest() != sha256:
                return None
        if _glsl_digest(glsl) != data.get("glsl_sha256"):
            return None
        # sealed by this very fusec (the build key covers its code), so it has the records' shape
        return mr.Manifest.from_json(data)
    except (OSError, ValueError, RecursionError, TypeError, AttributeError, KeyError):
        return None


CACHE_ENTRIES = 32  # builds kept in the cache folder; the least recently used go first
_CACHE_NAME = re.compile(r"[0-9a-f]{32}")


def cache_key(
    text: str,
    path: str,
    targets: tuple[str, ...],
    regions: tuple[str, ...] = (),
    variants: bool = False,
) -> str:
    """Content address of a build: the source, its name (diagnostics and the manifest carry it),
    the targets, the regions built, the manifest format, the compiler backend and fusec's own
    code."""
    h = hashlib.sha256()
    selection = ",".join(targets) + ("|" + ",".join(sorted(set(regions))) if regions else "")
    selection += "|variants" if regions and variants else ""
    for part in (text, path, selection, manifest.FORMAT, compiler_id(), code_digest()):
        h.update(part.encode("utf-8", "surrogateescape") + b"\0")
    return h.hexdigest()[:32]


def cached_build(
    text: str,
    path: str,
    targets: tuple[str, ...] = (),
    regions: tuple[str, ...] = (),
    variants: bool = False,
) -> tuple[Path, BuildResult | None]:
    """The build folder of this source in the cache (compiled now if it is not there yet), and
    the BuildResult when it was compiled by this call; `regions`: only those regions' kernels
    are compiled.  Never writes outside the cache."""
    try:
        root = private_folder("builds")
    except OSError as exc:
        raise DiagnosticError(
            [
                Diagnostic(
                    None,
                    "cannot use the build cache: "
                    + (f"{exc.filename}: {exc.strerror}" if exc.strerror else str(exc)),
                    "set FUSEC_CACHE_DIR to a folder of your own",
                )
            ]
        ) from None
    out = root / cache_key(text, path, targets, regions, variants)
    if (out / "manifest.json").is_file():
        with contextlib.suppress(OSError, NotImplementedError):
            os.utime(out, follow_symlinks=False)  # recently used
        return out, None
    result = build_source(text, path, targets, regions=regions, variants=variants)
    write_build(result, out)
    _evict(root)
    return out, result


def _evict(root: Path) -> None:
    """Keep the CACHE_ENTRIES most recently used builds."""
    try:
        entries = [e for e in os.scandir(root) if e.is_dir(follow_symlinks=False)]
        entries = [e for e in entries if _CACHE_NAME.fullmatch(e.name)]  # cache_key's names
        entries.sort(key=lambda e: e.stat(follow_symlinks=False).st_mtime, reverse=True)
    except OSError:
        return
    for e in entries[CACHE_ENTRIES:]:
        try:
            if folder.foreign_entries(Path(e.path)) == []:
                shutil.rmtree(e.path, ignore_errors=True)
        except OSError:
            continue  # another process evicted it first
