"""Index arithmetic: an index stays within its dimension, an integer divisor is never 0, and a
repeat count stays within 0 .. MAX_REPEAT_COUNT, at the constants' settings dsl/bounds.py tries.

Input: a typed region-IR expression and the syntax it came from.  Output: a diagnostic per
problem, and whether the expression passed.  Not checked: relations between constants that their
ranges cannot state (dsl/bounds.py), and anything about the values buffers hold.
"""

from __future__ import annotations

from . import bounds, bounds_data, ir
from . import syntax as S
from .check_state import U32_MAX, CheckState
from .span import Span
from .types import DType

# A repeat loop runs in one dispatch; a trip count past this (from a wrapped-around negative
# count, or a typo such as 1e9) would hold the GPU for seconds and trip the driver's watchdog
# (2 s on Windows' TDR).  The Sinkhorn loop of kernels.fuse runs 20 times.
MAX_REPEAT_COUNT = 65536


def _text(span: Span) -> str:
    """The source text of a span, on one line."""
    return " ".join(span.source.text[span.start : span.end].split())


def _where(w: bounds.Witness, *exprs: ir.Expr) -> str:
    """` (at n = 4095)`, or ` (at i = 0, with every constant at the low end of its range: K
    = 1)`: the values of a witness, naming the constants `exprs` mention."""
    parts = [f"{name} = {value}" for name, value in w.at]
    where = f"at {', '.join(parts)}" if parts else ""
    if w.setting.name != "default":
        names: dict[str, None] = {}
        todo = list(exprs)
        while todo:
            x = todo.pop()
            for y in ir.walk(x):
                if isinstance(y, ir.ConstRef) and y.const.name in w.setting.values:
                    names[y.const.name] = None
                elif isinstance(y, ir.IndexRef):
                    todo.append(y.var.extent)
        consts = ", ".join(f"{n} = {w.setting.values[n]}" for n in sorted(names))
        words = bounds.SETTING_WORDS[w.setting.name]
        where += (", with " if where else "with ") + words + (f": {consts}" if consts else "")
    return f" ({where})" if where else ""


def check_index(
    state: CheckState, ix: S.Expr, index: ir.Expr, dim: ir.Expr, name: str, pos: int
) -> bool:
    """An index of `name`'s dimension `pos` must stay within 0 .. dim - 1 (at the settings
    of the constants dsl/bounds.py tries).  Reports and returns False when it does not."""
    if isinstance(index, ir.IndexRef) and index.var.extent == dim:
        return True  # an index variable over the dimension itself
    if any(x.dtype == DType.ERROR for x in ir.walk(dim)):
        return True  # a dimension already diagnosed
    index = bounds.with_selections_as_indices(index)  # `x[i]` with i = argmax(...)
    for setting in state.settings:
        w = bounds.find_overrun(index, dim, setting)
        if w is None:
            continue
        where = _where(w, index, dim)
        shown = ir.format_expr(dim)
        fixed = isinstance(dim, ir.Lit)
        limit = shown if fixed else f"{shown} = {w.limit}"
        last = w.limit - 1 if fixed else f"{shown} - 1"
        if w.exact < 0:
            state.err(
                ix.span,
                f"index '{_text(ix.span)}' of '{name}' must be at least 0, not {w.exact}{where}",
                f"indices are unsigned 32-bit: {w.exact} wraps around to {w.value}, far "
                "past the end; keep every index at 0 or above",
            )
        elif w.exact > U32_MAX:
            state.err(
                ix.span,
                f"index '{_text(ix.span)}' of '{name}' must be below {limit}, not {w.exact}{where}",
                f"indices are unsigned 32-bit: {w.exact} wraps around to {w.value}, "
                f"another element than the one meant; keep the index within 0 .. {last}",
            )
        else:
            state.err(
                ix.span,
                f"index '{_text(ix.span)}' of '{name}' must be below {limit}, not "
                f"{w.value if w.value >= w.limit else w.exact}{where}",
                f"dimension {pos} of '{name}' has {shown} elements: keep the index within "
                f"0 .. {last}" + ("" if fixed else " for every value of the constants"),
            )
        return False
    return True


def check_divisor(state: CheckState, e: S.BinOp, divisor: ir.Expr) -> bool:
    """An integer divisor must not be 0 (at the settings of the constants dsl/bounds.py
    tries).  Reports and returns False when it can be."""
    for setting in state.settings:
        w = bounds.find_zero(divisor, setting)
        if w is None:
            continue
        variables = [v.name for v in bounds.index_vars(divisor)]
        consts = sorted({x.const.name for x in ir.walk(divisor) if isinstance(x, ir.ConstRef)})
        if variables:
            hint = f"keep the divisor at 1 or above for every value of {', '.join(variables)}"
        elif consts:
            of = ", ".join(consts)
            hint = f"keep the divisor at 1 or above: change the value or range of {of}"
        else:
            hint = "divide by a number of 1 or more"
        state.err(
            e.rhs.span,
            f"divisor of '{_text(e.span)}' must not be 0{_where(w, divisor)}",
            hint,
        )
        return False
    return True


def check_repeat_count(state: CheckState, e: S.Expr, count: ir.Expr) -> bool:
    """0 .. MAX_REPEAT_COUNT iterations at the constants' settings (dsl/bounds.py); the
    GPU computes the count in unsigned 32-bit arithmetic, where below 0 wraps around."""
    for setting in state.settings:
        value = bounds.evaluate(count, setting.values, {})
        if value is None:
            continue
        exact = bounds.evaluate_exact(count, setting.values, {})
        # in range as the GPU computes it, and not only because it wrapped around
        if value <= MAX_REPEAT_COUNT and 0 <= exact <= MAX_REPEAT_COUNT:
            continue
        w = bounds.Witness(value, exact, (), setting)
        consts = sorted({x.const.name for x in ir.walk(count) if isinstance(x, ir.ConstRef)})
        values = ", ".join(f"{n} = {setting.values[n]}" for n in consts)
        if setting.name != "default":
            where = _where(w, count)
        else:
            where = f" ({values})" if values else ""
        if exact < 0:
            state.err(
                e.span,
                f"repeat count '{_text(e.span)}' must be at least 0, not {exact}{where}",
                f"below 0 the count wraps around to {value} iterations; keep it at 0 or "
                "above for every value of the constants in their ranges",
            )
        elif exact > U32_MAX:
            state.err(
                e.span,
                f"repeat count '{_text(e.span)}' must be at most {MAX_REPEAT_COUNT}, not "
                f"{exact}{where}",
                f"the count is unsigned 32-bit: {exact} wraps around to {value} "
                "iterations; lower the count or the constants' ranges",
            )
        else:
            state.err(
                e.span,
                f"repeat count '{_text(e.span)}' must be at most {MAX_REPEAT_COUNT}, not "
                f"{value if value > MAX_REPEAT_COUNT else exact}{where}",
                "so long a loop may run past the driver's watchdog (seconds); lower the "
                "count or the constants' ranges",
            )
        return False
    return True


def _no_data_wrap(state: CheckState, ix: S.Expr, value: ir.Expr, before: str) -> bool:
    """check_no_wrap for integer arithmetic that reads integer inputs: the GPU computes it
    unsigned, values read included (an i32 -5 is 4294967291 there, and `x[n] < 0` is never
    true), while the reference computes exact integers; so it must stay within 0 .. 2^32 - 1
    for every value the inputs may hold (their declared `in LO .. HI`, else their dtype's).  A
    read converted to a real as it is (`float(x[n])`) keeps its sign and is not asked."""
    if isinstance(value, ir.Load) and before == "it becomes a real":
        return True
    for setting in state.settings:
        got = bounds_data.data_bounds(value, setting)
        if got is None:
            return True  # arithmetic of other kinds: the index checks' rules apply
        lo, hi = got
        if lo >= 0 and hi < bounds.U32:
            continue
        loads = list(dict.fromkeys(bounds_data.int_loads(value)))
        held = ", ".join(
            (
                "'{}' holds {} .. {}".format(x.buffer.name, *bounds_data.load_values(x))
                if x.buffer.values is not None
                else f"'{x.buffer.name}' may hold any {x.dtype.value}"
            )
            for x in loads
        )
        first = loads[0]
        read = _text(first.span) if first.span is not None else f"{first.buffer.name}[...]"
        bound = f"at least 0, not as low as {lo}" if lo < 0 else f"below 2^32, not up to {hi}"
        state.err(
            ix.span,
            f"integer '{_text(ix.span)}' must be {bound} where {held}",
            f"integers are unsigned 32-bit, values read from integer inputs too: it would wrap "
            f"around before {before}; declare the values '{first.buffer.name}' holds (`in 0 .. "
            f"100` after its type) or compute in reals (float({read}))",
        )
        return False
    return True


# what to do instead, by what reads the wrapped integer (check_no_wrap's `before`)
_NO_WRAP_FIX = {
    "it becomes a real": "compute it in reals instead (float(n) - 1.0, float(K) * float(K))",
    "the comparison": "compare in reals (float(n) - 1.0 < 4.0) or move the term across (n < 5)",
    "the division": "reorder the arithmetic so that no part goes below 0 or past 2^32",
    "the remainder": "reorder the arithmetic so that no part goes below 0 (e.g. (n + M - 1) % M)",
}


def check_no_wrap(state: CheckState, ix: S.Expr, value: ir.Expr, before: str) -> bool:
    """Integer arithmetic read by a division, a remainder, a comparison or a conversion to a
    real (`before` says which) must stay within 0 .. 2^32 - 1 (at the settings of the
    constants dsl/bounds.py tries): the GPU computes it unsigned, so `float(n - 1)` at n = 0
    is 4294967295.0 and `(n - 1) % K` is another element than K - 1.  A read of a selection
    (`i = argmax(...)`) counts as an index over the reduction's extent.  Reports and returns
    False when it can leave that range.  A write's own indices are left to check_writes,
    which knows where the mask admits them."""
    if state.in_write_index:
        return True
    if isinstance(value, ir.Lit | ir.ConstRef | ir.IndexRef) or not value.dtype.is_int:
        return True
    if bounds_data.int_loads(value):
        return _no_data_wrap(state, ix, value, before)
    value = bounds.with_selections_as_indices(value)
    for setting in state.settings:
        w = bounds.find_wrap(value, setting)
        if w is None:
            continue
        where = _where(w, value)
        text = _text(ix.span)
        if w.exact < 0:
            state.err(
                ix.span,
                f"integer '{text}' must be at least 0, not {w.exact}{where}",
                f"integers are unsigned 32-bit: {w.exact} wraps around to {w.value} before "
                f"{before}; {_NO_WRAP_FIX[before]}",
            )
        else:
            state.err(
                ix.span,
                f"integer '{text}' must be below 2^32, not {w.exact}{where}",
                f"integers are unsigned 32-bit: {w.exact} wraps around to {w.value} before "
                f"{before}; {_NO_WRAP_FIX[before]}, or lower the constants' ranges",
            )
        return False
    return True
