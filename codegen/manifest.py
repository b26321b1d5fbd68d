"""The manifest: what an engine needs to run prebuilt SPIR-V without the compiler.

Pure data (records in codegen/manifest_records.py, JSON on disk; no Vulkan and no shaderc), so
the runtime can import it.  Here: the format's name, the digest that seals it, its validation
(the published schema, then consistency), the records made from the region IR at build time,
and the evaluation of the small expression trees over constant names that give shapes, grids
and repeat counts.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from fusec.dsl import ir
from fusec.dsl.bounds import apply_op
from fusec.dsl.packing import PACKING_VERSION, SPLIT_PARTS
from fusec.dsl.types import DType

from . import manifest_records as mr
from .grid_plan import counter_buffer, plan_grid
from .manifest_kernel import Packed

# 2: `integrity`, the manifest's own digest; a published schema (manifest.schema.json)
FORMAT = "fusec-manifest/2"


def expr_record(e: ir.Expr) -> mr.Expr:
    """A shape expression of the region IR as the manifest stores it."""
    match e:
        case ir.Lit(v, _):
            return int(v)
        case ir.ConstRef(c):
            return mr.ConstRef(c.name)
        case ir.BinOp(op, lhs, rhs, _):
            return mr.BinOp(op, expr_record(lhs), expr_record(rhs))
    raise AssertionError(f"not a shape expression: {e}")


def eval_expr(e: mr.Expr, consts: Mapping[str, int | float]) -> int:
    """`e` at these constants, in Python integers (no wrapping)."""
    if isinstance(e, int):
        return e
    if isinstance(e, mr.ConstRef):
        return int(consts[e.name])
    return apply_op(e.op, eval_expr(e.lhs, consts), eval_expr(e.rhs, consts))


def eval_u32(e: mr.Expr, consts: Mapping[str, int | float]) -> int:
    """`e` as a shader computes it in uint arithmetic: every step wraps modulo 2^32 (a derived
    constant such as `(C - 1) / NS` then matches the expression it replaces)."""
    if isinstance(e, int):
        return e & 0xFFFFFFFF
    if isinstance(e, mr.ConstRef):
        return int(consts[e.name]) & 0xFFFFFFFF
    a, b = eval_u32(e.lhs, consts), eval_u32(e.rhs, consts)
    if e.op in ("/", "%") and b == 0:
        raise ValueError(f"{format_expr(e)} divides by zero")
    value = apply_op(e.op, a, b)
    return value & 0xFFFFFFFF


def format_expr(e: mr.Expr) -> str:
    """A manifest expression as text, for messages: `(C + NS - 1) / NS`."""
    if isinstance(e, int):
        return str(e)
    if isinstance(e, mr.ConstRef):
        return e.name
    return f"({format_expr(e.lhs)} {e.op} {format_expr(e.rhs)})"


def derived_specs(
    kernel: mr.Kernel, consts: Mapping[str, int | float]
) -> list[tuple[int, str, int | float]]:
    """The kernel's derived specialization constants at these constants: (spec id, "u32",
    value).  ValueError names the expression that divides by zero."""
    return [(d.spec_id, "u32", eval_u32(d.expr, consts)) for d in kernel.derived]


def workgroups(
    kernel: mr.Kernel,
    consts: Mapping[str, int | float],
    subgroup_size: int,
    max_groups: int = 65535,
) -> int:
    """Workgroups to dispatch: enough for the phase with the most work (phases loop over the
    grid, so fewer would still be correct, only slower)."""
    wg = kernel.workgroup_size
    groups = 1
    for item in kernel.grid:
        extent = eval_expr(item.extent, consts)
        if item.per_workgroup is not None:
            per = item.per_workgroup
        else:
            assert item.rows_per_subgroup is not None  # semantic_error: exactly one is set
            per = item.rows_per_subgroup * max(1, wg // subgroup_size)
        groups = max(groups, math.ceil(extent / per))
    return min(groups, max_groups)


def shared_bytes(kernel: mr.Kernel, consts: Mapping[str, int | float]) -> int:
    total = sum(4 * eval_expr(e, consts) for e in kernel.shared_floats)
    if kernel.reduction_scratch:
        total += 4 * kernel.workgroup_size
    if kernel.exchange_scratch:
        total += 4 * kernel.workgroup_size
    if kernel.counters:
        total += 4  # s_last: whether this workgroup arrived last (kir.Arrive)
    return total


QUANT_BLOCK = 32  # elements of a q8_0 activation block (q8_0x)
# per block-quantized dtype: elements and bytes of one block (dsl.types.DType.block and
# block_bytes; llama.cpp ggml/src/ggml-common.h, block_q8_0 ... block_q6_K)
QUANT_BLOCK_ELEMS = {"q8_0": 32, "q4_0": 32, "q4_K": 256, "q6_K": 256, "q8_0x": QUANT_BLOCK}
QUANT_BLOCK_BYTES = {"q8_0": 34, "q4_0": 18, "q4_K": 144, "q6_K": 210, "q8_0x": 48}
# where each GGUF weight block keeps its f16 super-block scales (d, and dmin for q4_K): the
# byte offsets a finiteness check reads
QUANT_SCALE_OFFSETS = {"q8_0": (0,), "q4_0": (0,), "q4_K": (0, 2), "q6_K": (208,)}


def storage_shape(dtype: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The numpy shape a buffer is stored with: element shape, except GGUF-quantized weights,
    which are uint8 rows of blocks (as gguf.quants.quantize returns them)."""
    if dtype in QUANT_BLOCK_BYTES:
        # a q8_0x intermediate may end in a partial block; weights are whole blocks
        block = QUANT_BLOCK_ELEMS[dtype]
        return (*shape[:-1], -(-shape[-1] // block) * QUANT_BLOCK_BYTES[dtype])
    return shape


# ---- validation of a manifest read from disk (untrusted: runtime/prebuilt.py) ----

SCHEMA_PATH = Path(__file__).with_name("manifest.schema.json")
# the most iterations a repeat may run (dsl.check refuses more); a loop_count past it is refused
MAX_LOOP_COUNT = 1 << 16


def _is_integer(_checker: object, instance: object) -> bool:
    return isinstance(instance, int) and not isinstance(instance, bool)


@functools.cache
def _validator() -> Any:
    """The schema's validator, with one rule stricter than JSON Schema's: an integer is written
    without a fraction (64, never 64.0), so the records' `int` fields hold ints."""
    import jsonschema

    schema = json.loads(SCHEMA_PATH.read_text())
    base = jsonschema.Draft202012Validator
    types = base.TYPE_CHECKER.redefine("integer", _is_integer)
    return jsonschema.validators.extend(base, type_checker=types)(schema)


def schema_error(data: Any) -> str | None:
    """The first place where `data` breaks the published schema (manifest.schema.json), as a
    phrase naming the field, or None."""
    try:
        error = next(iter(_validator().iter_errors(data)), None)
    except RecursionError:
        return "nests too deeply"
    if error is None:
        return None
    where = error.json_path.removeprefix("$") or "the top level"
    what = error.message if len(error.message) <= 120 else error.message[:117] + "..."
    return f"field {where} is invalid: {what}"


def _digest(data: Mapping[str, Any]) -> str:
    body = {k: v for k, v in data.items() if k != "integrity"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def seal(data: dict[str, Any]) -> dict[str, Any]:
    """The manifest JSON with its `integrity` digest (the schema says how it is computed)."""
    digest = _digest(data)
    body = {k: v for k, v in data.items() if k not in ("format", "integrity")}
    return {"format": data["format"], "integrity": digest, **body}


def sealed(m: mr.Manifest) -> tuple[mr.Manifest, dict[str, Any]]:
    """The manifest with its `integrity` digest, and its JSON (serialized once)."""
    data = m.to_json()
    data["integrity"] = _digest(data)
    return attrs.evolve(m, integrity=data["integrity"]), data


def is_sealed(data: Mapping[str, Any]) -> bool:
    """True when the manifest's digest matches its content (it was not edited after the build)."""
    try:
        return data.get("integrity") == _digest(data)
    except (RecursionError, TypeError, ValueError):
        return False


def buffer_record(b: ir.Buffer) -> mr.Buffer:
    return mr.Buffer(
        b.name,
        b.dtype.value,
        tuple(expr_record(d) for d in b.shape),
        b.state,
        b.values,
        b.tolerance,
        Packed(b.packing.value, PACKING_VERSION) if b.packing is not None else None,
    )


def const_record(c: ir.ConstDecl) -> mr.Const:
    return mr.Const(c.name, c.dtype.value, c.default, c.lo, c.hi, c.spec_id, c.runtime)


def intermediate_buffer(stage: ir.Stage) -> ir.Buffer:
    """The global buffer an unfused chain (or a `global` placement) stores `stage` into."""
    shape = stage.shape or (ir.Lit(1, DType.U32),)
    dtype = DType.Q8_0X if stage.stored is not None else DType.F32
    if stage.dtype.is_int:
        dtype = DType.U32  # an index (argmax, argtopk) or integer arithmetic
    # a tile value assigned again is `c.1`, `c.2`: buffer names must be identifiers
    return ir.Buffer(stage.name.replace(".", "_v"), dtype, shape, is_output=False, span=stage.span)


def signature_mismatch(region: mr.Region, r: ir.Region) -> str | None:
    """Where a manifest region disagrees with the region its source declares (inputs, outputs,
    constants, the intermediates its stages make), or None."""
    for key, theirs, ours in (
        ("inputs", region.inputs, tuple(buffer_record(b) for b in r.inputs)),
        ("outputs", region.outputs, tuple(buffer_record(b) for b in r.outputs)),
        ("consts", region.consts, tuple(const_record(c) for c in r.consts)),
    ):
        if theirs != ours:
            return f"its {key} differ from those region '{r.name}' of the source declares"
    stages = {}
    for s in r.all_stages():
        b = intermediate_buffer(s)
        stages[b.name] = buffer_record(b)
    if plan_grid(r):  # stages in grid: the arrival counter too
        counter = buffer_record(counter_buffer(r))
        stages[counter.name] = counter
    for buf in region.intermediates:
        if stages.get(buf.name) != buf:
            return f"its intermediate '{buf.name}' is not what a stage of the source makes"
    return None


def _const_names(e: mr.Expr) -> set[str]:
    names: set[str] = set()
    stack = [e]
    while stack:
        item = stack.pop()
        if isinstance(item, mr.ConstRef):
            names.add(item.name)
        elif isinstance(item, mr.BinOp):
            stack += [item.lhs, item.rhs]
    return names


def checked_records(data: Any, sealed: bool = False) -> mr.Manifest | str:
    """The records of a manifest JSON read from disk, or the phrase saying why it is refused:
    it breaks the published schema (a missing key, a wrong type, an unknown value) or is
    inconsistent (`semantic_error`).  The format and the digest are the caller's to check first
    (runtime/prebuilt.py names them in its own words; `sealed`: it found the digest right, so
    it is not computed again).  The schema check, nine tenths of a load, is skipped for content
    that passed it before (`_SchemaMemo`); the rest always runs."""
    memo = _SchemaMemo.of_digest(data["integrity"]) if sealed else _SchemaMemo.of(data)
    if memo is None or not memo.passed():
        problem = schema_error(data)
        if problem is not None:
            return problem
        if memo is not None:
            memo.remember()
    m = mr.Manifest.from_json(data)
    return semantic_error(m) or m


SCHEMA_MEMO_ENTRIES = 256  # manifests remembered as schema-valid; the least recently used go


@attrs.frozen
class _SchemaMemo:
    """That a manifest's content passed the schema, kept in the user's cache folder
    (dsl/cachedir.py, `validated/`) as an empty file named by the schema and validator code it
    passed and the sha256 of the content (the `integrity` digest, recomputed: only a sealed
    manifest has one).  Validation is a pure function of those, so a later load of the same
    bytes with the same fusec skips it; a changed byte, schema or validator misses.  A folder
    that cannot be used is no memo."""

    path: Path

    @classmethod
    def of(cls, data: Any) -> _SchemaMemo | None:
        if not isinstance(data, dict) or not is_sealed(data):
            return None
        return cls.of_digest(data["integrity"])

    @classmethod
    def of_digest(
        cls, integrity: str, check: str | None = None, where: str = "validated"
    ) -> _SchemaMemo | None:
        """The memo of the content whose `integrity` digest the caller found right; `check`
        names another check of that content and its code, kept in a folder of its own `where`
        (runtime/prebuilt.py's of the SPIR-V modules), in place of the schema's."""
        try:
            from fusec.dsl.cachedir import private_folder

            folder = private_folder(where)
        except OSError:
            return None
        digest = str(integrity).removeprefix("sha256:")
        return cls(folder / f"{check or _validator_key()}-{digest}")

    def passed(self) -> bool:
        try:
            os.utime(self.path)  # recently used; FileNotFoundError when never remembered
        except OSError:
            return False
        return True

    def remember(self) -> None:
        try:
            self.path.touch()
            entries = sorted(self.path.parent.iterdir(), key=lambda e: e.stat().st_mtime)
            for old in entries[:-SCHEMA_MEMO_ENTRIES]:
                old.unlink(missing_ok=True)
        except OSError:
            pass


@functools.cache
def _validator_key() -> str:
    """The schema and the code that applies it, as a name part."""
    h = hashlib.sha256(FORMAT.encode())
    for f in (SCHEMA_PATH, Path(__file__)):
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def semantic_error(m: mr.Manifest) -> str | None:
    """What makes a schema-valid manifest inconsistent (names that do not resolve, bindings that
    are not 0..n-1, spec ids that clash, defaults outside their ranges), or None."""
    from .targets import TARGETS

    seen_regions: set[str] = set()
    seen_kernels: set[str] = set()
    seen_files = {m.source_copy, "manifest.json"}
    for region in m.regions:
        rname = region.name
        if rname in seen_regions:
            return f"region '{rname}' appears twice"
        seen_regions.add(rname)
        consts = {c.name: c for c in region.consts}
        if len(consts) != len(region.consts):
            return f"region '{rname}' declares a constant twice"
        fixed = {n for n, c in consts.items() if not c.runtime}
        spec_ids = [c.spec_id for c in region.consts if not c.runtime]
        if len(set(spec_ids)) != len(spec_ids) or any(s >= 1000 for s in spec_ids):
            return f"region '{rname}' has clashing specialization constant ids"
        runtime_ids = [c.spec_id for c in region.consts if c.runtime]
        if len(set(runtime_ids)) != len(runtime_ids):
            return f"region '{rname}' has two run-time parameters in one slot"
        for rule in region.budget:
            if rule.target is not None and rule.target not in TARGETS:
                return f"a budget rule of region '{rname}' names unknown target '{rule.target}'"
        for c in region.consts:
            lo, hi, v = c.lo, c.hi, c.default
            if c.runtime and c.dtype not in ("u32", "f32"):
                # the parameter buffer holds a u32 value or an f32's bits (runtime/param_words.py)
                return f"run-time parameter '{c.name}' is {c.dtype}, not u32 or f32"
            if lo is not None and hi is not None and lo > hi:
                return f"constant '{c.name}' has an empty range"
            if c.dtype in ("u32", "i32"):
                # fusec writes an integer constant's numbers as JSON integers: `1000.0` is not
                # one (it would reach the run as a real)
                for what, x in (("default", v), ("least value", lo), ("largest value", hi)):
                    if x is not None and not isinstance(x, int):
                        return f"constant '{c.name}' is {c.dtype} but its {what} is {x!r}"
            if c.dtype == "i32" and (not float(v).is_integer() or not -(2**31) <= v < 2**31):
                return f"constant '{c.name}' is i32 but its default is {v}"
            if (lo is not None and v < lo) or (hi is not None and v > hi):
                return f"the default of constant '{c.name}' lies outside its range"
            if c.dtype == "u32" and (not float(v).is_integer() or v < 0):
                return f"constant '{c.name}' is u32 but its default is {v}"
        buffers = {b.name: b for b in [*region.inputs, *region.outputs]}
        buffers.update({b.name: b for b in region.intermediates})
        for b in buffers.values():
            if b.dtype in QUANT_BLOCK_BYTES and not b.shape:
                return f"{b.dtype} buffer '{b.name}' has no dimensions"
            packable = b.dtype in {d.value for d in SPLIT_PARTS}
            if b.packing is not None and (b not in region.inputs or not packable):
                return f"buffer '{b.name}' is packed but is not a GGUF weight input"
        exprs: list[mr.Expr] = [d for b in buffers.values() for d in b.shape]
        for w in region.state_writes:
            buf = buffers.get(w.buffer)
            if buf is None or not buf.state or w.axis >= len(buf.shape):
                return f"a state write of region '{rname}' names no state buffer axis"
            if w.at not in consts:
                return f"a state write of region '{rname}' names an unknown constant"
        for k in region.kernels():
            kname = k.name
            if kname in seen_kernels:
                return f"kernel name {kname} appears twice"
            seen_kernels.add(kname)
            sub = k.subgroup
            if (sub.kind == "any") != (not sub.sizes):
                return f"kernel {kname}'s subgroup sizes do not fit its kind '{sub.kind}'"
            for g in k.grid:
                if (g.per_workgroup is None) == (g.rows_per_subgroup is None):
                    return f"a grid item of kernel {kname} needs exactly one of its two counts"
            for est in k.estimates:
                if est.target not in TARGETS:
                    return f"kernel {kname} has an estimate for unknown target '{est.target}'"
            if k.spv in seen_files:
                return f"file {k.spv} is named by two kernels"
            seen_files.add(k.spv)
            numbers = sorted(b.binding for b in k.bindings)
            if numbers != list(range(len(numbers))):
                return f"kernel {kname}'s bindings are not numbered 0 .. {len(numbers) - 1}"
            for bound in k.bindings:
                if bound.buffer not in buffers and not (
                    bound.buffer == ir.PARAMS_BUFFER and len(fixed) < len(consts)
                ):
                    return f"kernel {kname} binds unknown buffer '{bound.buffer}'"
            for z in k.zero_outputs:
                if z not in buffers:
                    return f"kernel {kname} zeroes unknown buffer '{z}'"
            derived_ids = [d.spec_id for d in k.derived]
            if len(set(derived_ids)) != len(derived_ids) or any(s < 1000 for s in derived_ids):
                return f"kernel {kname} has clashing derived specialization constant ids"
            exprs += [g.extent for g in k.grid] + list(k.shared_floats)
            exprs += [d.expr for d in k.derived]
            if k.loop_count is not None:
                exprs.append(k.loop_count)
        for e in exprs:
            unknown = _const_names(e) - fixed
            if unknown:
                return f"region '{rname}' uses unknown constant '{sorted(unknown)[0]}'"
        problem = expression_error(region, {c.name: c.default for c in region.consts})
        if problem is not None:
            return f"region '{rname}' at its defaults: {problem}"
    return None


def region_expressions(region: mr.Region) -> list[mr.Expr]:
    """Every size expression of a region: shapes, grid extents, shared arrays, derived
    constants, repeat counts."""
    exprs: list[mr.Expr] = [d for b in region.buffers() for d in b.shape]
    for k in region.kernels():
        exprs += [g.extent for g in k.grid] + list(k.shared_floats)
        exprs += [d.expr for d in k.derived]
        if k.loop_count is not None:
            exprs.append(k.loop_count)
    return exprs


def expression_error(region: mr.Region, consts: Mapping[str, int | float]) -> str | None:
    """Why some size expression of the region cannot be evaluated at `consts` (a division by
    zero, a value past 2^32, a negative size), or None.  The runtime evaluates them freely after
    this."""
    for e in region_expressions(region):
        try:
            value = eval_expr(e, consts)
        except ZeroDivisionError:
            return f"{format_expr(e)} divides by zero"
        except (ValueError, KeyError, OverflowError, RecursionError):
            return f"{format_expr(e)} cannot be evaluated"
        if not 0 <= value < 2**32:
            return f"{format_expr(e)} is {value}, outside 0 .. 2^32 - 1"
    return None
