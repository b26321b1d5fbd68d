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
import sqlite3
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
from .shaderc import backend, compile_glsl, compiler_id
from .spirv import header_problem
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
        # and expression (integer divisions of constants, glsl._Derived)
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
    )


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


def select_regions(program: ir.Program, names: tuple[str, ...]) -> list[ir.Region]:
    """The regions of `names` (every region when empty), in the source's order; an unknown name
    is a diagnostic that lists the regions there are."""
    known = {r.name for r in program.regions}
    for n in names:
        if n not in known:
            raise DiagnosticError(
                [
                    Diagnostic(
                        None,
                        f"no region '{n}' in {program.path}",
                        "regions: " + ", ".join(r.name for r in program.regions),
                    )
                ]
            )
    return [r for r in program.regions if not names or r.name in names]


_MAX_CACHED_SPV_BYTES = 64 << 20


_KERNEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]{0,199}")


def _kernel_hashes(data: dict[str, Any]) -> dict[str, str]:
    """Kernel name -> sha256 of its SPIR-V, for every kernel a manifest lists (names that could
    leave the folder are skipped)."""
    hashes = {}
    for region in data.get("regions") or []:
        if not isinstance(region, dict):
            continue
        for product in ("fused", "unfused", "fused_shared"):
            for k in region.get(product) or []:
                if not isinstance(k, dict) or not isinstance(k.get("sha256"), str):
                    continue
                name = str(k.get("name"))
                if _KERNEL_NAME.fullmatch(name) and ".." not in name:
                    hashes[name] = k["sha256"]
    return hashes


class _SpvCache:
    """SPIR-V from an earlier build folder, reused for a kernel whose GLSL is unchanged.  The old
    manifest is read once; a cached file is used only when the compiler and the manifest format
    are the same and its bytes still have the sha256 the old manifest recorded."""

    def __init__(self, folder_path: Path | None) -> None:
        self.path = folder_path
        self.hashes: dict[str, str] = {}
        if folder_path is None:
            return
        try:
            mpath = folder_path / "manifest.json"
            if not mpath.is_file() or mpath.is_symlink():
                return
            old = json.loads(mpath.read_text())
        except (OSError, ValueError, RecursionError):
            return
        if not isinstance(old, dict) or not manifest.is_sealed(old):
            return  # edited after its build: nothing in it is reused
        if old.get("compiler_id") != compiler_id() or old.get("format") != manifest.FORMAT:
            return
        self.hashes = _kernel_hashes(old)

    def get(self, name: str, glsl: str) -> bytes | None:
        want = self.hashes.get(name)
        if want is None or self.path is None:
            return None
        try:
            if (self.path / "glsl" / f"{name}.comp").read_text() != glsl:
                return None
            with open(self.path / f"{name}.spv", "rb") as f:
                spv = f.read(_MAX_CACHED_SPV_BYTES + 1)
        except (OSError, ValueError):
            return None
        return spv if hashlib.sha256(spv).hexdigest() == want else None


_IDENTIFIER = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)\b")  # captured: split keeps them
# GLSL words with a `_` that the generated code uses (the `gl_` and `GL_` ones aside)
_GLSL_WORDS = frozenset(
    ("local_size_x", "constant_id", "float16_t", "spirv_instruction", "spirv_literal")
)

OBJECT_ENTRIES = 4096  # kernels kept in the object cache; the least recently used go first
OBJECT_CACHE = True  # False: builds neither read nor write the object cache
_OBJECTS_TABLE = "kernels_v3"  # a new name for each new layout of an entry


def _spirv_header_ok(spv: object) -> bool:
    """A SPIR-V header (codegen/spirv.py): what the object cache insists on before it keeps or
    returns a module."""
    return isinstance(spv, bytes) and header_problem(spv) is None


class _ObjectCache:
    """Compiled kernels in the user's cache folder (dsl/cachedir.py), like ccache: the SPIR-V
    and its measured register demand (`Demand`: the peak, the private words, the peak with
    loads moved up and the one with mixed dot products unpacked, each a column, so a warm build
    judges as a cold one), keyed by the sha256
    of the GLSL, the compiler (`compiler_id`) and fusec's own code, so that a change to any of
    them misses.  One SQLite file (`objects.sqlite`: one open, one transaction per build, safe
    between processes); an entry that does not read back as SPIR-V and a demand is ignored, and
    an unusable cache is no cache."""

    def __init__(self) -> None:
        self.db: sqlite3.Connection | None = None
        self.salt = (compiler_id() + "\0" + _code_digest()).encode()
        self.new: list[tuple[str, bytes, int, int, int, int, float]] = []
        if not OBJECT_CACHE:
            return
        try:
            self.db = sqlite3.connect(private_folder("objects") / "objects.sqlite", timeout=10)
            # the table's name carries its columns' version: tables of an older layout
            # (`kernels`: no `loads_up`) are never read, and go
            old = self.db.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name != ? "
                "AND (name = 'kernels' OR name LIKE 'kernels_v%')",  # not _NvidiaMemo's
                (_OBJECTS_TABLE,),
            ).fetchall()
            for (name,) in old:
                self.db.execute(f'DROP TABLE "{name}"')
            self.db.execute(
                f"CREATE TABLE IF NOT EXISTS {_OBJECTS_TABLE} (key TEXT PRIMARY KEY, spv BLOB, "
                "vgprs INTEGER, private INTEGER, loads_up INTEGER, unpacked_dot INTEGER, used REAL)"
            )
        except (OSError, sqlite3.Error):
            self.db = None

    def key(self, glsl: str, names: Iterable[str] = ()) -> str:
        """The GLSL's key, without its `// kernel` comment and `#line` directives, and with the
        region's own names (`names`: buffers, shared arrays, constants, stages) replaced by their
        order of first appearance wherever they end an identifier's `_`-separated part (`b_x`,
        `scale_W`, `B_x_u4`).  Comments, line directives and identifiers reach SPIR-V only as
        debug information, which a build does not ask for: kernels with the same key are the
        same program up to a consistent renaming (`#` stands in, which no identifier holds), and
        compile to the same bytes (tests/codegen/test_rebuild.py holds this for kernels.fuse)."""
        body = "\n".join(
            line for line in glsl.splitlines() if not line.startswith(("#line ", "// kernel "))
        )
        ours = sorted({n for n in names if n}, key=len, reverse=True)
        if ours:
            order: dict[str, str] = {}
            part = re.compile(r"(?<=_)(" + "|".join(map(re.escape, ours)) + r")(?=_|$)")

            def rename(word: str) -> str:
                if word in _GLSL_WORDS or word.startswith(("gl_", "GL_")):
                    return word  # GLSL's own (`local_size_x` for a buffer `x`)
                return part.sub(lambda p: order.setdefault(p.group(1), f"#{len(order)}"), word)

            # the text alternates between what lies between identifiers (even places) and the
            # identifiers (odd places); each distinct identifier is renamed once, in order of
            # first appearance, which numbers the names as a scan of the text would
            pieces = _IDENTIFIER.split(body)
            words = dict.fromkeys(pieces[1::2])
            renamed = {w: rename(w) for w in words}
            pieces[1::2] = [renamed[w] for w in pieces[1::2]]
            body = "".join(pieces)
        return hashlib.sha256(self.salt + body.encode("utf-8", "surrogateescape")).hexdigest()

    def get(self, key: str) -> tuple[bytes, Demand] | None:
        if self.db is None:
            return None
        try:
            row = self.db.execute(
                f"SELECT spv, vgprs, private, loads_up, unpacked_dot FROM {_OBJECTS_TABLE} "
                "WHERE key = ?",
                (key,),
            ).fetchone()
        except sqlite3.Error:
            return None
        if row is None:
            return None
        spv, *numbers = row
        if not _spirv_header_ok(spv) or not all(isinstance(n, int) and n >= 0 for n in numbers):
            return None
        return spv, Demand(*numbers)

    def put(self, key: str, spv: bytes, found: Demand) -> None:
        if not _spirv_header_ok(spv):
            return
        self.new.append(
            (
                key,
                spv,
                found.vgprs,
                found.private_words,
                found.loads_up,
                found.unpacked_dot,
                time.time(),
            )
        )

    def close(self, used: list[str]) -> None:
        """Store the new kernels, mark `used` as recently used, keep the OBJECT_ENTRIES most
        recently used."""
        if self.db is None:
            return
        try:
            with self.db:
                self.db.executemany(
                    f"INSERT OR REPLACE INTO {_OBJECTS_TABLE} VALUES (?,?,?,?,?,?,?)", self.new
                )
                now = time.time()
                self.db.executemany(
                    f"UPDATE {_OBJECTS_TABLE} SET used = ? WHERE key = ?", [(now, k) for k in used]
                )
                self.db.execute(
                    f"DELETE FROM {_OBJECTS_TABLE} WHERE key NOT IN "
                    f"(SELECT key FROM {_OBJECTS_TABLE} ORDER BY used DESC LIMIT ?)",
                    (OBJECT_ENTRIES,),
                )
        except sqlite3.Error:
            pass
        finally:
            self.db.close()


class _NvidiaMemo:
    """codegen/nvidia.py's features of each SPIR-V module, kept beside the object cache (its
    SQLite file, a table of its own keyed by the sha256 of the module and the object cache's
    salt), so that a warm build reads them rather than measuring again.  An entry that does not
    read back as three non-negative numbers is ignored; an unusable file is no memo."""

    def __init__(self, salt: bytes) -> None:
        self.db: sqlite3.Connection | None = None
        self.salt = salt
        self.new: list[tuple[str, int, float, float, float]] = []
        self.used: list[str] = []
        if not OBJECT_CACHE:
            return
        try:
            self.db = sqlite3.connect(private_folder("objects") / "objects.sqlite", timeout=10)
            self.db.execute(
                "CREATE TABLE IF NOT EXISTS nvidia (key TEXT PRIMARY KEY, sunk INTEGER, "
                "words REAL, reuse REAL, used REAL)"
            )
        except (OSError, sqlite3.Error):
            self.db = None

    def features(self, spv: bytes) -> NvidiaFeatures:
        """The module's features: from the memo, else measured (and kept at `close`)."""
        key = hashlib.sha256(self.salt + spv).hexdigest()
        if self.db is not None:
            try:
                row = self.db.execute(
                    "SELECT sunk, words, reuse FROM nvidia WHERE key = ?", (key,)
                ).fetchone()
            except sqlite3.Error:
                row = None
            if (
                row is not None
                and all(isinstance(n, int | float) and n >= 0 for n in row)
                and isinstance(row[0], int)
            ):
                self.used.append(key)
                return NvidiaFeatures(row[0], float(row[1]), float(row[2]))
        found = analyze_nvidia(spv)
        self.new.append((key, found.sunk, found.block_words, found.reuse_words, time.time()))
        return found

    def close(self) -> None:
        if self.db is None:
            return
        try:
            with self.db:
                self.db.executemany("INSERT OR REPLACE INTO nvidia VALUES (?,?,?,?,?)", self.new)
                now = time.time()
                self.db.executemany(
                    "UPDATE nvidia SET used = ? WHERE key = ?", [(now, k) for k in self.used]
                )
                self.db.execute(
                    "DELETE FROM nvidia WHERE key NOT IN "
                    "(SELECT key FROM nvidia ORDER BY used DESC LIMIT ?)",
                    (OBJECT_ENTRIES,),
                )
        except sqlite3.Error:
            pass
        finally:
            self.db.close()


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
) -> BuildResult:
    """Compile a `.fuse` text in memory.  Raises DiagnosticError on bad input.
    `targets` selects the targets whose shared-memory limit applies (all known by default; the
    manifest always holds estimates for every known target); `cache_dir`, an
    earlier build folder, lets kernels whose GLSL did not change skip the compiler; `regions`
    builds only those regions (the whole source is still checked)."""
    with _few_collections():
        return _build_source(text, path, targets, cache_dir, regions)


def _build_source(
    text: str,
    path: str,
    targets: tuple[str, ...],
    cache_dir: str | Path | None,
    only: tuple[str, ...],
) -> BuildResult:
    t0 = time.perf_counter()
    names = targets or tuple(TARGETS)
    program = check_source(text, path, names)
    selected = select_regions(program, only)
    source = program.regions[0].span.source if program.regions else Source(path, text)
    sources = {path: source}
    cache = _SpvCache(Path(cache_dir) if cache_dir is not None else None)
    objects = _ObjectCache()

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
    memo = _NvidiaMemo(objects.salt)
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
    text = Path(path).read_text()
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
        for name, sha256 in _kernel_hashes(data).items():
            glsl.append((name, (out / "glsl" / f"{name}.comp").read_text()))
            with open(out / f"{name}.spv", "rb") as f:
                spv = f.read(_MAX_CACHED_SPV_BYTES + 1)
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


def _code_digest() -> str:
    """A hash of the compiler's own code: a cached build from another fusec is never reused."""
    h = hashlib.sha256()
    for package in (Path(__file__).parent, Path(ir.__file__).parent):
        for f in sorted([*package.glob("*.py"), *package.glob("*.lark")]):
            h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def cache_key(text: str, path: str, targets: tuple[str, ...], regions: tuple[str, ...] = ()) -> str:
    """Content address of a build: the source, its name (diagnostics and the manifest carry it),
    the targets, the regions built, the manifest format, the compiler backend and fusec's own
    code."""
    h = hashlib.sha256()
    selection = ",".join(targets) + ("|" + ",".join(sorted(set(regions))) if regions else "")
    for part in (text, path, selection, manifest.FORMAT, compiler_id(), _code_digest()):
        h.update(part.encode("utf-8", "surrogateescape") + b"\0")
    return h.hexdigest()[:32]


def cached_build(
    text: str, path: str, targets: tuple[str, ...] = (), regions: tuple[str, ...] = ()
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
    out = root / cache_key(text, path, targets, regions)
    if (out / "manifest.json").is_file():
        with contextlib.suppress(OSError, NotImplementedError):
            os.utime(out, follow_symlinks=False)  # recently used
        return out, None
    result = build_source(text, path, targets, regions=regions)
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
