"""Integer arithmetic on values read from integer inputs (`x[n] - 10` with `x: u32[N] in 0 ..
5`): its exact bounds over every value the inputs may hold, for dsl/check_indices.py, which asks
that what a division, a remainder, a comparison or a conversion to a real reads stays within
0 .. 2^32 - 1 (the GPU computes it unsigned, the reference exactly).

Input: a checked integer expression and a setting of the constants (dsl/bounds.py).  Output:
the reads of integer inputs in it, the values each may give (the input's declared `in LO ..
HI`, else its dtype's), and the expression's smallest and largest value (interval arithmetic,
ir.interval_op); None where it holds anything else.
"""

from __future__ import annotations

import math

from . import ir
from .bounds import U32, Setting, index_extents, index_vars
from .types import DType

_INT_DTYPE_RANGES = {DType.U32: (0, U32 - 1), DType.I32: (-(2**31), 2**31 - 1)}


def int_loads(e: ir.Expr) -> list[ir.Load]:
    """The reads of integer (u32, i32) inputs in `e`, outside other reads' indices."""
    return [x for x in _outer(e) if isinstance(x, ir.Load) and x.dtype in _INT_DTYPE_RANGES]


def _outer(e: ir.Expr) -> list[ir.Expr]:
    out = [e]
    if not isinstance(e, ir.Load):
        for child in ir.children(e):
            out += _outer(child)
    return out


def load_values(load: ir.Load) -> tuple[int, int]:
    """The values a read of an integer input may give: its declared `in LO .. HI`, else all of
    its dtype's."""
    declared = load.buffer.values
    if declared is not None:
        return math.ceil(declared[0]), math.floor(declared[1])
    return _INT_DTYPE_RANGES[load.dtype]


def data_bounds(e: ir.Expr, setting: Setting) -> tuple[int, int] | None:
    """Exact bounds of integer arithmetic that reads integer inputs (`x[n] - 10`, `x[n] / 2`),
    each read taking the values of `load_values`, constants at `setting` and index variables
    over their extents; None where `e` holds anything else (a selection, a call)."""
    extents = index_extents(index_vars(e), setting)
    if extents is None:
        return None
    spans = {v: (0, n - 1) for v, n in extents.items()}

    def walk(x: ir.Expr) -> tuple[int, int] | None:
        match x:
            case ir.Load() if x.dtype in _INT_DTYPE_RANGES:
                return load_values(x)
            case ir.Lit(v, _):
                return int(v), int(v)
            case ir.ConstRef(decl) if decl.name in setting.values:
                v = setting.values[decl.name]
                return v, v
            case ir.IndexRef(var) if var in spans:
                return spans[var]
            case ir.BinOp(op, lhs, rhs, dtype) if op in "+-*/%" and dtype.is_int:
                a, b = walk(lhs), walk(rhs)
                if a is None or b is None:
                    return None
                return ir.interval_op(op, a, b)
        return None

    return walk(e)
