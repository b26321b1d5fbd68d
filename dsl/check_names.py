"""Names and constants: the region's constants, its input and output buffers and their shapes,
and the buffer a stage's left side names.

Input: a region's syntax.  Output: `ir.ConstDecl`s and `ir.Buffer`s, entered in `Names`, and a
diagnostic for each bad declaration (a failed constant is poisoned: later uses stay silent).
Not checked here: the names inside stage values (check_exprs.py).
"""

from __future__ import annotations

import math

from . import bounds, ir
from . import syntax as S
from .check_indices import check_divisor
from .check_q8 import check_q8_0x_param
from .check_state import U32_MAX, CheckState, Names
from .packing import Packing
from .span import Span
from .types import BUFFER_DTYPES, DType, block_noun


def resolve_names(
    state: CheckState, r: S.Region, sc: Names
) -> tuple[tuple[ir.ConstDecl, ...], tuple[ir.Buffer, ...], tuple[ir.Buffer, ...]]:
    """A region's constants, inputs and outputs, entered in `sc`.  Sets `state.settings` from
    the constants before the buffers, whose shapes' divisors are checked at those settings."""
    consts = resolve_consts(state, r, sc)
    state.settings = bounds.settings(consts)
    inputs = tuple(resolve_buffer(state, p, sc, is_output=False) for p in r.params)
    outputs = tuple(resolve_buffer(state, p, sc, is_output=True) for p in r.outputs)
    return consts, inputs, outputs


def declare(state: CheckState, sc: Names, name: str, span: Span, what: str) -> bool:
    """Enter a name declared at `span`; False, with a diagnostic, when the region has it already."""
    if name in sc.decl_spans:
        line = sc.decl_spans[name].line_col()[0]
        state.err(span, f"{what} '{name}' is already declared on line {line}", "rename one of them")
        return False
    sc.decl_spans[name] = span
    return True


def resolve_consts(state: CheckState, r: S.Region, sc: Names) -> tuple[ir.ConstDecl, ...]:
    """A region's constants and run-time parameters, with their defaults within their ranges."""
    out: list[ir.ConstDecl] = []
    for c in r.consts:
        if not declare(state, sc, c.name, c.span, "constant"):
            continue
        sc.poisoned.add(c.name)  # removed below once the constant is accepted
        is_int = c.value.is_int
        lo = hi = None
        if c.range is not None:
            lo_n, hi_n = c.range
            if c.runtime and lo_n.is_int != hi_n.is_int:
                # a param's dtype comes from its bounds (its default is the low one)
                state.err(
                    lo_n.span.join(hi_n.span),
                    f"bounds of run-time parameter '{c.name}' must both be integers (u32) "
                    "or both reals (f32)",
                    f"write param {c.name} in {_real_text(lo_n)} .. {_real_text(hi_n)} "
                    "for an f32 parameter",
                )
                continue
            if lo_n.is_int != is_int or hi_n.is_int != is_int:
                kind = "an integer" if is_int else "a real"
                state.err(
                    lo_n.span.join(hi_n.span),
                    f"range of '{c.name}' must be {kind} range like its default",
                    "write both bounds in the same kind as the default value",
                )
                continue
            lo, hi = lo_n.value, hi_n.value
            if lo > hi:
                state.err(
                    lo_n.span.join(hi_n.span),
                    f"range of '{c.name}' is empty: {lo} > {hi}",
                    "write the smaller bound first",
                )
                continue
            if not lo <= c.value.value <= hi:
                state.err(
                    c.value.span,
                    f"default of '{c.name}' is {c.value.value}, outside its range {lo} .. {hi}",
                    "change the default or widen the range",
                )
                continue
        if is_int and not 0 <= int(c.value.value) <= U32_MAX:
            state.err(
                c.value.span,
                f"constant '{c.name}' = {c.value.value} does not fit in u32",
                "integer constants are unsigned 32-bit",
            )
            continue
        decl = ir.ConstDecl(
            c.name,
            DType.U32 if is_int else DType.F32,
            c.value.value,
            lo,
            hi,
            # run-time parameters are numbered by their slot in the parameter buffer
            spec_id=sum(d.runtime == c.runtime for d in out),
            span=c.span,
            runtime=c.runtime,
        )
        sc.consts[c.name] = decl
        sc.poisoned.discard(c.name)
        out.append(decl)
    return tuple(out)


def _real_text(n: S.Num) -> str:
    """A bound written as a real: `2` as `2.0`, `0.5` as itself."""
    return f"{float(n.value)!r}"


def resolve_buffer(state: CheckState, p: S.Param, sc: Names, is_output: bool) -> ir.Buffer:
    """An input or output of the region signature: its dtype, shape, value range and tolerance."""
    dtype = BUFFER_DTYPES.get(p.type.dtype)
    if dtype is None:
        known = ", ".join(BUFFER_DTYPES)
        # GGUF's K-quants are spelled as ggml spells them: q4_K, q6_K
        cased = {d.lower(): d for d in BUFFER_DTYPES}.get(p.type.dtype.lower())
        hint = (
            f"dtypes are spelled as ggml spells them: write '{cased}'"
            if cased
            else f"known dtypes: {known}"
        )
        state.err(p.type.span, f"unknown dtype '{p.type.dtype}'", hint)
        dtype = DType.ERROR
    if is_output and dtype.is_quantized:
        state.err(
            p.type.span,
            f"output '{p.name}' must be f32, f16, u32, i32 or q8_0x, not {dtype.value}",
            "GGUF weights are not written; a vector rounded to q8_0 blocks as it is stored "
            "is declared q8_0x[...] (fusec's aligned block layout), else declare it f32",
        )
    shape = tuple(resolve_shape(state, d, sc) for d in p.type.shape)
    if dtype.is_quantized and not is_output:
        _check_blocks(state, p, shape, sc)
    if dtype == DType.Q8_0X and check_q8_0x_param(state, p, shape):
        _check_blocks(state, p, shape, sc)
    if p.state and not is_output:
        state.err(
            p.span,
            f"input '{p.name}' cannot be state",
            "state buffers are outputs kept between runs: move it after ->",
        )
    values = _value_range(state, p, dtype, is_output)
    if p.name == ir.PARAMS_BUFFER:
        state.err(
            p.span,
            f"buffer name '{p.name}' is reserved for the run-time parameters' buffer",
            "rename the buffer",
        )
    tolerance = _tolerance(state, p, is_output)
    if tolerance is not None and dtype.is_int:
        assert p.tolerance is not None
        state.err(
            p.tolerance.span,
            f"output '{p.name}' is {dtype.value}: fusec check compares it exactly",
            "an index must match the reference exactly; drop the tolerance",
        )
        tolerance = None
    buf = ir.Buffer(
        p.name,
        dtype,
        shape,
        is_output,
        span=p.span,
        state=p.state,
        values=values,
        tolerance=tolerance,
        packing=Packing(p.packing.id) if p.packing is not None else None,
    )
    if declare(state, sc, p.name, p.span, "output" if is_output else "input"):
        sc.buffers[p.name] = buf
    return buf


def _tolerance(state: CheckState, p: S.Param, is_output: bool) -> float | None:
    """`y: f32[N] tol E`: the relative error `fusec check` accepts for an output."""
    if p.tolerance is None:
        return None
    tol = float(p.tolerance.value)
    if not is_output:
        state.err(
            p.tolerance.span,
            f"input '{p.name}' cannot have a tolerance",
            "a tolerance says how far an output may be from the reference: move it to an "
            "output after ->",
        )
        return None
    if not (math.isfinite(tol) and 0 < tol < 1):
        state.err(
            p.tolerance.span,
            f"the tolerance of output '{p.name}' must lie above 0 and below 1, not {tol:g}",
            "it bounds max |got - want| / max |want|: e.g. tol 2e-3",
        )
        return None
    return tol


def _value_range(
    state: CheckState, p: S.Param, dtype: DType, is_output: bool
) -> tuple[float, float] | None:
    """`x: f32[N] in LO .. HI`: the values an input is meant to hold."""
    if p.values is None:
        return None
    lo, hi = p.values
    span = lo.span.join(hi.span)
    if is_output:
        state.err(
            span,
            f"output '{p.name}' cannot declare a value range",
            "a range says which values an input is meant to hold; outputs are computed",
        )
        return None
    if dtype.is_int and not (lo.is_int and hi.is_int):
        state.err(
            span,
            f"input '{p.name}' is {dtype.value}: its value range needs whole numbers",
            f"write e.g. '{p.name}: {dtype.value}[...] in 0 .. 100'",
        )
        return None
    limits = {DType.U32: (0, 2**32 - 1), DType.I32: (-(2**31), 2**31 - 1)}.get(dtype)
    if limits is not None and not limits[0] <= lo.value <= hi.value <= limits[1]:
        state.err(
            span,
            f"value range {lo.value} .. {hi.value} of input '{p.name}' is not within "
            f"{dtype.value} ({limits[0]} .. {limits[1]})",
            f"keep the bounds within {limits[0]} .. {limits[1]}",
        )
        return None
    if not lo.value < hi.value:
        state.err(
            span,
            f"empty value range {lo.value} .. {hi.value} for input '{p.name}'",
            "write the smaller bound first: in LO .. HI with LO < HI",
        )
        return None
    return (lo.value, hi.value)


def _check_blocks(state: CheckState, p: S.Param, shape: tuple[ir.Expr, ...], sc: Names) -> None:
    """A quantized weight has rows, and each a whole number of blocks (32 elements for
    q8_0 / q4_0, 256 for the K-quants)."""
    block = BUFFER_DTYPES[p.type.dtype].block
    if not shape:
        # a scalar has no row to cut into blocks (the runtime sized such a buffer from its
        # last dimension and failed: docs/FUZZING.md)
        state.err(
            p.span,
            f"{p.type.dtype} {block_noun(p.type.dtype)} '{p.name}' must have a shape: it is "
            "stored in "
            f"{block}-element blocks along its last dimension",
            f"declare it as {p.type.dtype}[K] with K a multiple of {block}, or as f32",
        )
        return
    if any(d.dtype == DType.ERROR for d in shape):
        return
    values = {c.name: c.default for c in sc.consts.values()}
    last = shape[-1]
    k = ir.evaluate_int(last, values)
    name = ir.format_expr(last)
    if k % block:
        vector = p.type.dtype == DType.Q8_0X.value
        state.err(
            p.span,
            f"{p.type.dtype} {'vector' if vector else 'weight'} '{p.name}' has {k} elements "
            f"{'' if vector else 'per row '}({name}), not a multiple of the {block}-element block",
            f"make {name} a multiple of {block}, or "
            + (f"declare '{p.name}' f32" if vector else f"store '{p.name}' as f16"),
        )


def resolve_shape(state: CheckState, e: S.Expr, sc: Names) -> ir.Expr:
    """A dimension: an integer, an integer constant, or + - * / of those; `DType.ERROR` when
    wrong."""
    match e:
        case S.Num(v, True):
            if v < 1:
                state.err(
                    e.span,
                    f"dimension must be at least 1, not {v}",
                    "an empty dimension holds nothing; give it 1 or more elements",
                )
            return ir.Lit(int(v), DType.U32, span=e.span)
        case S.Num(v, False):
            state.err(
                e.span,
                f"dimension must be an integer, not the real {v}",
                "shapes are integers or integer constants",
            )
            return ir.Lit(1, DType.ERROR)
        case S.Name(name):
            c = sc.consts.get(name)
            if c is None and name in sc.poisoned:
                return ir.Lit(1, DType.ERROR)
            if c is None:
                state.err(
                    e.span,
                    f"unknown constant '{name}' in a shape",
                    f"declare it: const {name} = <default>",
                )
                return ir.Lit(1, DType.ERROR)
            if c.runtime:
                state.err(
                    e.span,
                    f"'{name}' is a run-time parameter; it cannot size a dimension",
                    "shapes, extents and trip counts use constants (const), fixed at "
                    "pipeline creation",
                )
                return ir.Lit(1, DType.ERROR)
            if c.dtype != DType.U32:
                state.err(
                    e.span,
                    f"dtype mismatch: dimension '{name}' must be an integer "
                    f"constant, not {c.dtype.value}",
                    f"declare {name} with an integer default",
                )
                return ir.Lit(1, DType.ERROR)
            if int(c.default) < 1 or (c.lo is not None and c.lo < 1):
                state.err(
                    e.span,
                    f"constant '{name}' is used as a dimension, so it must be "
                    f"at least 1, not {c.lo if c.lo is not None and c.lo < 1 else c.default}",
                    f"give '{name}' a range starting at 1",
                )
            return ir.ConstRef(c, span=e.span)
        case S.BinOp(op, lhs, rhs) if op in "+-*/":
            a, b = resolve_shape(state, lhs, sc), resolve_shape(state, rhs, sc)
            checked = op != "/" or DType.ERROR in (a.dtype, b.dtype)
            if not checked and not check_divisor(state, e, b):
                return ir.Lit(1, DType.ERROR)
            return ir.BinOp(op, a, b, DType.U32, span=e.span)
    state.err(
        e.span,
        "a dimension must be an integer, a constant, or + - * / of those",
        "declare a constant for the size (const N = 4096) and write N",
    )
    return ir.Lit(1, DType.ERROR)


def resolve_target(state: CheckState, st: S.Stage, sc: Names) -> tuple[bool, ir.Buffer | None]:
    """The output a stage writes (None for an intermediate); False when the left side
    names an input or an output already written."""
    out_buf = sc.buffers.get(st.name)
    if out_buf is not None and not out_buf.is_output:
        state.err(
            st.name_span,
            f"cannot assign to input '{st.name}'",
            "inputs are read-only; name the result differently",
        )
        return False, None
    prior = [s for s in sc.stages.values() if s.output is out_buf]
    # stages that write parts of an output under masks or at computed indices may share it
    # (dsl/check_writes.py checks that they write each element once)
    partial = st.mask is not None or any(not isinstance(ix, S.Name) for ix in st.indices)
    if out_buf is not None and prior and not (partial and all(s.writes_part for s in prior)):
        state.err(
            st.name_span,
            f"output '{st.name}' is assigned twice",
            "each output is written by exactly one stage",
        )
        return False, None
    return True, out_buf
