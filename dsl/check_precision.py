"""Checker pass: a register stage computed in double precision (`in register as f64`).

Input: a typed stage value.  Output: the same value with every real operation typed f64, or
None with a diagnostic.  Used where f32 cannot hold what a stage computes, e.g. a rotary
angle `pos * pow(base, -2 * i / n)`: its f32 product is off by an ulp of pos * f (0.008 rad
at pos 131071), and Vulkan lets a driver's f32 `pow` be off by 3 + 2 |y log2 x| ulp (Vulkan
1.3 specification, "Precision and Operation of SPIR-V Instructions"), 43 ulp for a base of
1e6, or 0.3 rad at the same pos.  The generator evaluates such a stage with double
arithmetic (+, -, *, / are correctly rounded in IEEE double on every target fusec names) and
its own double `pow`/`exp`/`log` (codegen/glsl.py), converts it to f32 where an f32 value is
read, and reduces it modulo 2 pi in double before `sin`/`cos` take it."""

from __future__ import annotations

from . import ir
from . import syntax as S
from .check_state import CheckState
from .types import DType, Placement

# functions a stage computed in f64 may call (those with a double form: GLSL's own, or one
# the generator writes); the others take an f32 argument
F64_FUNCTIONS = ("abs", "clamp", "exp", "float", "log", "max", "min", "pow", "select", "sqrt")


def check_precision(
    state: CheckState,
    st: S.Stage,
    placement: Placement,
    indices: tuple[ir.IndexVar, ...],
    value: ir.Expr,
) -> ir.Expr | None:
    """`value` typed f64 throughout (loads, constants, indices and other stages stay as they
    are and are converted where read); None after a diagnostic."""
    assert st.stored is not None
    if placement != Placement.REGISTER or not indices:
        state.err(
            st.stored.span,
            f"only an indexed register stage is computed as f64; '{st.name}' is "
            + (f"in {placement.value}" if placement != Placement.REGISTER else "a scalar"),
            f"write '{st.name}[i: N] = ... in register as f64' and read it where it is needed",
        )
        return None
    ok = True

    def promote(e: ir.Expr) -> ir.Expr:
        nonlocal ok
        match e:
            case ir.Lit(v, dtype) if dtype.is_float:
                return ir.Lit(v, DType.F64, span=e.span)
            case ir.BinOp(op, lhs, rhs, dtype) if not dtype.is_int:
                return ir.BinOp(op, promote(lhs), promote(rhs), DType.F64, span=e.span)
            case ir.Neg(v):
                return ir.Neg(promote(v), span=e.span)
            case ir.Call(fn, args, _):
                if fn not in F64_FUNCTIONS:
                    ok = False
                    state.err(
                        e.span or st.value.span,
                        f"'{fn}' is not computed in f64 (stage '{st.name}' is)",
                        f"f64 stages call {', '.join(F64_FUNCTIONS)}; compute the argument as "
                        f"f64 here and call '{fn}' where the stage is read"
                        + (" (sin and cos reduce an f64 argument modulo 2 pi in f64 first)"),
                    )
                    return e
                return ir.Call(fn, tuple(promote(a) for a in args), DType.F64, span=e.span)
            case ir.Reduce():
                ok = False
                state.err(
                    e.span or st.value.span,
                    f"stage '{st.name}' is computed in f64 and holds a reduction",
                    "reduce in an f32 stage of its own and read it here",
                )
                return e
            case _:
                return e  # an integer, a load, a constant, another stage: converted where read

    promoted = promote(value)
    return promoted if ok else None
