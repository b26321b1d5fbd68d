"""Index arithmetic of a checked region: can an index leave its dimension, can a divisor be 0?

Input: region-IR integer expressions (`Lit`, `ConstRef`, `IndexRef`, integer `BinOp`), the
region's constants and, for each index variable, its extent.  Output: a `Witness` (the values at
which the expression goes wrong) or None.  `check_indices.py` turns witnesses into diagnostics.

The constants are tried at three settings (`settings`): their defaults, every one at the low end
of its range, every one at the high end.  At each setting the index variables range over
0 .. extent - 1: interval arithmetic (`ir.bounds_int`) proves most indices in bounds at once;
otherwise the corners of the variables' ranges, then (up to MAX_ENUMERATED combinations) every
value, are evaluated in unsigned 32-bit arithmetic, as the GPU computes them, to find a witness.
A diagnostic therefore always names values at which the index really goes wrong.  So does one
at which the index is in range only because u32 arithmetic wrapped around (`x[i + N * N]` at
N = 65536 reads x[i]): exact arithmetic puts it past the end.

Not checked: combinations of constants other than those three settings.  Ranges are
independent, and kernels.fuse relies on relations between constants that they cannot state:
`pn[(d + n_rot / 2) % n_rot]` of `pn[d: D]` reads past D whenever n_rot > D, `p[d + 1 - 2 *
(d % 2)]` whenever D is odd, and `kc[h / (NQ / NK), ...]` whenever NK does not divide NQ (it
divides by 0 when NK > NQ; the runtime refuses a zero divisor at the values it is given,
runtime/dispatch.py `derived_values`).  An index that reads a buffer (a gather) is not checked.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping, Sequence

import attrs
import numpy as np
import numpy.typing as npt

from . import ir
from .diagnostics import Diagnostic
from .types import DType

U32 = 2**32
# Past this many combinations of index values, a possible overrun that no corner shows is left
# unreported: the check stays cheap (a few milliseconds per index at most).
MAX_ENUMERATED = 1 << 14
SETTING_WORDS = {
    "default": "",
    "low": "every constant at the low end of its range",
    "high": "every constant at the high end of its range",
}


@attrs.frozen
class Setting:
    """Values of a region's integer constants: `name` is "default", "low" or "high"."""

    name: str
    values: Mapping[str, int]


@attrs.frozen
class Witness:
    """Where an expression goes wrong: its value as the GPU computes it (unsigned 32-bit),
    the same in exact arithmetic (negative where the unsigned value wrapped around), the index
    variables' values and the constants' setting."""

    value: int
    exact: int
    at: tuple[tuple[str, int], ...]
    setting: Setting
    limit: int = 0  # the dimension an index was checked against


def settings(consts: Sequence[ir.ConstDecl]) -> list[Setting]:
    """The defaults, then all low ends, then all high ends (each only if it differs)."""
    ints = [c for c in consts if c.dtype.is_int]
    out: list[Setting] = []
    for name in ("default", "low", "high"):
        values = {}
        for c in ints:
            bound = {"default": c.default, "low": c.lo, "high": c.hi}[name]
            values[c.name] = int(bound if bound is not None else c.default)
        if all(s.values != values for s in out):
            out.append(Setting(name, values))
    return out


def is_arithmetic(e: ir.Expr) -> bool:
    """Only literals, constants, index variables and integer + - * / %."""
    return all(
        isinstance(x, ir.Lit | ir.ConstRef | ir.IndexRef)
        or (isinstance(x, ir.BinOp) and x.op in "+-*/%" and x.dtype.is_int)
        for x in ir.walk(e)
    )


def evaluate(e: ir.Expr, consts: Mapping[str, int], at: Mapping[ir.IndexVar, int]) -> int | None:
    """`e` in unsigned 32-bit arithmetic, as the GPU computes it; None where it divides by 0."""
    match e:
        case ir.Lit(v, _):
            return int(v) % U32
        case ir.ConstRef(c):
            return consts[c.name] % U32
        case ir.IndexRef(v):
            return at[v] % U32
        case ir.BinOp(op, lhs, rhs, _):
            a, b = evaluate(lhs, consts, at), evaluate(rhs, consts, at)
            if a is None or b is None or (op in "/%" and b == 0):
                return None
            return apply_op(op, a, b) % U32
    raise AssertionError(f"not index arithmetic: {e}")


def evaluate_exact(e: ir.Expr, consts: Mapping[str, int], at: Mapping[ir.IndexVar, int]) -> int:
    """`e` in exact integer arithmetic (for messages: -1 rather than 4294967295)."""
    match e:
        case ir.Lit(v, _):
            return int(v)
        case ir.ConstRef(c):
            return consts[c.name]
        case ir.IndexRef(v):
            return at[v]
        case ir.BinOp(op, lhs, rhs, _):
            a, b = evaluate_exact(lhs, consts, at), evaluate_exact(rhs, consts, at)
            if op in "/%" and b == 0:
                return 0
            return apply_op(op, a, b)
    raise AssertionError(f"not index arithmetic: {e}")


def apply_op(op: str, a: int, b: int) -> int:
    """`a op b` for + - * and, with b != 0, floor / and %: only the operator asked for (a
    table of every result would divide by a 0 beside a `+`).  The one integer operator table
    of index and size arithmetic (codegen.manifest evaluates the manifest's expressions with
    it too)."""
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        return a // b
    if op == "%":
        return a % b
    raise AssertionError(f"not an index operator: {op}")


def with_selections_as_indices(e: ir.Expr) -> ir.Expr:
    """`e` with each read of an argmax, argmin or argtopk stage as an index variable over the
    reduction's extent (the values such a stage holds), and each read of an integer stage of
    those and of index arithmetic as its value, so that an index computed from a selection
    (`x[i]`, `i = argmax(e: p[e])`) is checked as index arithmetic is.  Anything else is left
    as it is (and stays unchecked, as an index read from an input's values)."""
    proxies: dict[int, ir.IndexVar] = {}

    def sub(x: ir.Expr, at: dict[ir.IndexVar, ir.Expr]) -> ir.Expr:
        match x:
            case ir.IndexRef(var) if var in at:
                return at[var]
            case ir.BinOp(op, lhs, rhs, dtype):
                return ir.BinOp(op, sub(lhs, at), sub(rhs, at), dtype, span=x.span)
            case ir.StageRef(stage, idx) if stage.dtype.is_int:
                value = stage.value
                if isinstance(value, ir.Reduce) and value.op in ("argmax", "argmin", "argtopk"):
                    var = proxies.setdefault(
                        id(stage), ir.IndexVar(stage.name, value.var.extent, span=stage.span)
                    )
                    return ir.IndexRef(var)
                inner = dict(zip(stage.indices, (sub(i, at) for i in idx), strict=True))
                return sub(value, inner)
        return x

    return sub(e, {})


def index_vars(e: ir.Expr) -> list[ir.IndexVar]:
    """The index variables `e` mentions, in order of first use."""
    return list(dict.fromkeys(x.var for x in ir.walk(e) if isinstance(x, ir.IndexRef)))


def index_extents(
    variables: Sequence[ir.IndexVar], setting: Setting
) -> dict[ir.IndexVar, int] | None:
    """Each variable's extent at `setting`; None where an extent cannot be computed (a zero
    divisor, diagnosed where it is written) or is empty (nothing is read)."""
    out = {}
    for v in variables:
        if not is_arithmetic(v.extent) or index_vars(v.extent):
            return None
        n = evaluate(v.extent, setting.values, {})
        if n is None or n == 0 or n >= U32 // 2:
            return None
        out[v] = n
    return out


def _assignments(extents: Mapping[ir.IndexVar, int]) -> Iterator[dict[ir.IndexVar, int]]:
    """The corners of the variables' ranges first, then (if there are few) every value."""
    variables = list(extents)
    corners = [sorted({0, extents[v] - 1}) for v in variables]
    for values in itertools.product(*corners):
        yield dict(zip(variables, values, strict=True))
    total = 1
    for v in variables:
        total *= extents[v]
    if total <= MAX_ENUMERATED:
        for values in itertools.product(*(range(extents[v]) for v in variables)):
            yield dict(zip(variables, values, strict=True))


def _ranges(setting: Setting) -> dict[str, tuple[int, int]]:
    return {name: (v, v) for name, v in setting.values.items()}


def find_overrun(index: ir.Expr, dim: ir.Expr, setting: Setting) -> Witness | None:
    """Index variable values at which `index` is outside 0 .. dim - 1 at `setting`."""
    if not is_arithmetic(index) or not is_arithmetic(dim):
        return None
    variables = index_vars(index)
    extents = index_extents(variables, setting)
    limit = evaluate(dim, setting.values, {})
    if extents is None or limit is None:
        return None
    spans = {v: (0, n - 1) for v, n in extents.items()}
    lo, hi = ir.bounds_int(index, _ranges(setting), spans)
    if lo >= 0 and hi < limit:
        return None
    for at in _assignments(extents):
        value = evaluate(index, setting.values, at)
        if value is None:
            continue
        exact = evaluate_exact(index, setting.values, at)
        # past the end as the GPU computes it, or back in range only because u32 arithmetic
        # wrapped around (`x[i + N * N]` at N = 65536 reads x[i])
        if value >= limit or not 0 <= exact < limit:
            names = tuple((v.name, n) for v, n in at.items())
            return Witness(value, exact, names, setting, limit)
    return None


def find_wrap(e: ir.Expr, setting: Setting) -> Witness | None:
    """Index variable values at which integer arithmetic `e` leaves 0 .. 2^32 - 1 in exact
    arithmetic at `setting`: there the GPU's unsigned value (`n - 1` at n = 0 is 4294967295)
    is not the number written.  `+ - *` wrap harmlessly on the way to an index (the index is
    checked whole); a division, a remainder, a comparison or a conversion to a real sees the
    wrapped value, so `check_indices.check_no_wrap` asks this of their operands."""
    if not is_arithmetic(e):
        return None
    variables = index_vars(e)
    extents = index_extents(variables, setting)
    if extents is None:
        return None
    spans = {v: (0, n - 1) for v, n in extents.items()}
    lo, hi = ir.bounds_int(e, _ranges(setting), spans)
    if lo >= 0 and hi < U32:
        return None
    for at in _assignments(extents):
        if evaluate(e, setting.values, at) is None:
            continue  # a zero divisor inside, diagnosed where it is written
        exact = evaluate_exact(e, setting.values, at)
        if not 0 <= exact < U32:
            names = tuple((v.name, n) for v, n in at.items())
            return Witness(exact % U32, exact, names, setting)
    return None


def find_zero(divisor: ir.Expr, setting: Setting) -> Witness | None:
    """Index variable values at which `divisor` is 0 at `setting`."""
    if not is_arithmetic(divisor):
        return None
    variables = index_vars(divisor)
    extents = index_extents(variables, setting)
    if extents is None:
        return None
    spans = {v: (0, n - 1) for v, n in extents.items()}
    lo, hi = ir.bounds_int(divisor, _ranges(setting), spans)
    if lo > 0 or hi < 0:
        return None
    for at in _assignments(extents):
        if evaluate(divisor, setting.values, at) == 0:
            names = tuple((v.name, n) for v, n in at.items())
            return Witness(0, 0, names, setting)
    return None


def overrun_at(
    region: ir.Region, values: Mapping[str, int | float], coverage: bool = True
) -> Diagnostic | None:
    """At the values of one run (`fusec check --const ...`), the first index of the region that
    leaves its dimension, as a diagnostic at that index (None: every index stays inside).  The
    checker tried three settings of the constants; a run may pick others (`n_rot` past `D`).
    With `coverage`, also an output that masked writes do not cover exactly once."""
    zero = zero_divisor_at(region, values)
    if zero is not None:
        return zero
    ints = {k: int(v) for k, v in values.items() if float(v).is_integer()}
    setting = Setting("run", ints)
    for stage in region.all_stages():
        for e in ir.walk(stage.value):
            if isinstance(e, ir.Reduce) and e.k is not None:
                k, n = evaluate(e.k, ints, {}), evaluate(e.var.extent, ints, {})
                if k is not None and n is not None and k > n:
                    run = ", ".join(f"{key}={v}" for key, v in values.items())
                    return Diagnostic(
                        e.span or stage.span,
                        f"in region '{region.name}' at {run}, {e.op} keeps {k} values but "
                        f"'{e.var.name}' has only {n}",
                        f"choose constants with at most {n} values kept",
                    )
            if isinstance(e, ir.Load):
                name, dims = e.buffer.name, e.buffer.shape
            elif isinstance(e, ir.StageRef) and e.indices:
                name, dims = e.stage.name, e.stage.shape
            else:
                continue
            for pos, (index, dim) in enumerate(zip(e.indices, dims, strict=False)):
                if isinstance(index, ir.IndexRef) and index.var.extent == dim:
                    continue
                index = with_selections_as_indices(index)
                w = find_overrun(index, dim, setting)
                if w is not None:
                    at = ", ".join(f"{n} = {v}" for n, v in w.at)
                    run = ", ".join(f"{k}={v}" for k, v in values.items())
                    return Diagnostic(
                        index.span or e.span or stage.span,
                        f"in region '{region.name}' at {run}, index '{ir.format_expr(index)}' "
                        f"of '{name}' reaches {w.value if w.value >= w.limit else w.exact}"
                        + (f" (at {at})" if at else "")
                        + f", past the {w.limit} element(s) of its dimension {pos}",
                        "choose constants that keep every index inside its dimension",
                    )
    return wrap_at(region, values) or write_problem_at(region, values, coverage)


_COMPARE_OPS = ("<", "<=", ">", ">=", "==", "!=")


def value_operands(e: ir.Expr) -> Iterator[ir.Expr]:
    """The integer operands in `e` whose value, not only its residue modulo 2^32, matters: those
    of a division, a remainder or a comparison, of arithmetic with a real and of a function
    (the integer becomes a real); the checker holds them within u32 at its three settings
    (check_indices.check_no_wrap), `wrap_at` at a run's constants."""
    for x in ir.walk(e):
        match x:
            case ir.BinOp(op, lhs, rhs, dtype) if (
                op in _COMPARE_OPS or op in ("/", "%") or not dtype.is_int
            ):
                yield from (o for o in (lhs, rhs) if o.dtype.is_int)
            case ir.Call(fn, args, _) if fn not in ("shuffle_xor", "shuffle", "broadcast"):
                yield from (a for a in args if a.dtype.is_int)


def zero_divisor_at(region: ir.Region, values: Mapping[str, int | float]) -> Diagnostic | None:
    """At the values of one run, the first integer division or remainder of the region whose
    divisor is 0 (`kc[h / (NQ / NK), d]` at NK > NQ), as a diagnostic at the divisor; None
    when none is.  The checker tried its three settings of the constants; a run may pick
    others, and a GPU's integer division by 0 is undefined."""
    ints = {k: int(v) for k, v in values.items() if float(v).is_integer()}
    setting = Setting("run", ints)
    run = ", ".join(f"{k}={v}" for k, v in values.items())
    for stage in region.all_stages():
        for top in [stage.value, *([stage.mask] if stage.mask is not None else [])]:
            for e in ir.walk(top):
                if not (isinstance(e, ir.BinOp) and e.op in ("/", "%")):
                    continue
                if e.dtype not in (DType.U32, DType.I32):
                    continue
                w = find_zero(with_selections_as_indices(e.rhs), setting)
                if w is None:
                    continue
                at = ", ".join(f"{n} = {v}" for n, v in w.at)
                return Diagnostic(
                    e.rhs.span or e.span or stage.span,
                    f"in region '{region.name}' at {run}, the divisor "
                    f"'{ir.format_expr(e.rhs)}' of '{e.op}' is 0" + (f" (at {at})" if at else ""),
                    "choose constants that keep every integer divisor above 0",
                )
    return None


def wrap_at(region: ir.Region, values: Mapping[str, int | float]) -> Diagnostic | None:
    """At the values of one run, the first integer operand of the region (`value_operands`)
    that leaves 0 .. 2^32 - 1 (`float(K - M)` at K < M), as a diagnostic at it; None when none
    does.  The GPU would compute the wrapped value, the reference the exact one."""
    ints = {k: int(v) for k, v in values.items() if float(v).is_integer()}
    setting = Setting("run", ints)
    run = ", ".join(f"{k}={v}" for k, v in values.items())
    for stage in region.all_stages():
        exprs = [stage.value, *([stage.mask] if stage.mask is not None else [])]
        for e in exprs:
            for operand in value_operands(e):
                if isinstance(operand, ir.Lit | ir.ConstRef | ir.IndexRef):
                    continue
                value = with_selections_as_indices(operand)
                w = find_wrap(value, setting)
                if w is None:
                    continue
                at = ", ".join(f"{n} = {v}" for n, v in w.at)
                span = operand.span
                text = (
                    " ".join(span.source.text[span.start : span.end].split())
                    if span is not None
                    else ir.format_expr(operand)
                )
                return Diagnostic(
                    span or stage.span,
                    f"in region '{region.name}' at {run}, integer '{text}' reaches {w.exact}"
                    + (f" (at {at})" if at else "")
                    + ", outside the unsigned 32-bit range it is computed in",
                    "choose constants that keep it within 0 .. 2^32 - 1, or compute it in reals",
                )
    return None


def write_problem_at(
    region: ir.Region, values: Mapping[str, int | float], coverage: bool = True
) -> Diagnostic | None:
    """At the values of one run, the first write at computed indices or under a mask
    (dsl/check_writes.py) that leaves its output (a diagnostic at the index), or, with
    `coverage`, an output such writes do not cover exactly once (at most once for a state
    output; at the stage); None when there is none."""
    ints = {k: int(v) for k, v in values.items() if float(v).is_integer()}
    run = ", ".join(f"{k}={v}" for k, v in values.items())
    hint = "choose constants at which the writes cover each element of the output once"
    for out in region.outputs:
        writers = [s for s in region.all_stages() if s.output is out]
        if not any(s.writes_part for s in writers):
            continue
        dims = [evaluate_exact(d, ints, {}) for d in out.shape]
        if any(d <= 0 for d in dims) or math.prod(dims) > 1 << 62:
            continue
        flats = []
        for s in writers:
            index = s.out_index or tuple(ir.IndexRef(v) for v in s.indices)
            w = enumerate_writes(s.indices, index, s.mask, values)
            if w is None:
                return None  # too many to enumerate
            for pos, (c, dim) in enumerate(zip(w.coords, dims, strict=True)):
                bad = np.flatnonzero((c < 0) | (c >= dim))
                if len(bad):
                    k = int(bad[0])
                    at = ", ".join(
                        f"{v.name} = {int(w.at[k, i])}" for i, v in enumerate(w.variables)
                    )
                    return Diagnostic(
                        index[pos].span or s.span,
                        f"in region '{region.name}' at {run}, index "
                        f"'{ir.format_expr(index[pos])}' of '{out.name}' reaches {int(c[k])}"
                        + (f" (at {at})" if at else "")
                        + f", outside the {dim} element(s) of its dimension {pos}",
                        "choose constants that keep every index inside its dimension",
                    )
            flats.append(np.ravel_multi_index(w.coords, dims) if dims else np.zeros(len(w.at)))
        if not coverage:
            continue
        flat = np.concatenate(flats)
        unique = np.unique(flat)
        size = math.prod(dims)
        if len(unique) < len(flat):
            return Diagnostic(
                writers[0].span,
                f"in region '{region.name}' at {run}, an element of '{out.name}' is written twice",
                hint,
            )
        if not out.state and len(unique) < size:
            return Diagnostic(
                writers[0].span,
                f"in region '{region.name}' at {run}, {size - len(unique)} element(s) of "
                f"'{out.name}' are never written",
                hint,
            )
    return None


# --- writes at computed indices, under a mask (dsl/check_writes.py) ---------------------------
# Past this many index combinations of a stage (or elements of an output), its writes are not
# enumerated at that setting of the constants: the check stays within tens of milliseconds.
MAX_WRITES = 1 << 22


@attrs.frozen(eq=False)
class Writes:
    """The elements one stage writes at one setting: per output dimension the index of each
    written element (exact arithmetic, may lie outside the dimension), and the values of the
    stage's own indices there (one row per element, columns in the order of `variables`)."""

    variables: tuple[ir.IndexVar, ...]
    coords: tuple[npt.NDArray[np.int64], ...]
    at: npt.NDArray[np.int64]


def grid_value(
    e: ir.Expr, values: Mapping[str, int | float], axes: Mapping[ir.IndexVar, np.ndarray]
) -> np.ndarray:
    """`e` at every combination of the index variables of `axes` (broadcast numpy arrays), in
    exact integer arithmetic; comparisons give 1.0 or 0.0."""
    match e:
        case ir.Lit(v, _):
            return np.asarray(v)
        case ir.ConstRef(c):
            return np.asarray(values[c.name])
        case ir.IndexRef(v):
            return axes[v]
        case ir.Neg(v):
            return -grid_value(v, values, axes)
        case ir.Call("select", (c, a, b), _):
            return np.where(
                grid_value(c, values, axes) != 0,
                grid_value(a, values, axes),
                grid_value(b, values, axes),
            )
        case ir.Call("float", (x,), _):
            return grid_value(x, values, axes).astype(np.float64)
        case ir.BinOp(op, lhs, rhs, dtype):
            p, q = grid_value(lhs, values, axes), grid_value(rhs, values, axes)
            compare = {"<": np.less, "<=": np.less_equal, ">": np.greater}
            compare |= {">=": np.greater_equal, "==": np.equal, "!=": np.not_equal}
            if op in compare:
                return np.asarray(compare[op](p, q), dtype=np.float64)
            if dtype.is_int and op in "/%":
                p, q = p.astype(np.int64), q.astype(np.int64)
                safe = np.where(q == 0, 1, q)  # a zero divisor is diagnosed where it is written
                return np.asarray(p // safe if op == "/" else p % safe)
            ops = {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.divide}
            return np.asarray(ops[op](p, q))
    raise AssertionError(f"not a condition or index arithmetic: {e}")


def enumerate_writes(
    variables: Sequence[ir.IndexVar],
    out_index: Sequence[ir.Expr],
    mask: ir.Expr | None,
    values: Mapping[str, int | float],
) -> Writes | None:
    """The elements a stage over `variables` writes at `out_index`, where `mask` is nonzero, at
    the constants' `values`; None where there are more than MAX_WRITES combinations or an
    extent cannot be computed."""
    ints = {k: int(v) for k, v in values.items() if float(v).is_integer()}
    extents = []
    for v in variables:
        if not is_arithmetic(v.extent) or index_vars(v.extent):
            return None
        extents.append(evaluate_exact(v.extent, ints, {}))
    total = 1
    for n in extents:
        total *= max(n, 0)
    if total > MAX_WRITES:
        return None
    shape = tuple(max(n, 0) for n in extents)
    axes = {
        v: np.arange(n, dtype=np.int64).reshape([-1 if i == k else 1 for k in range(len(shape))])
        for i, (v, n) in enumerate(zip(variables, shape, strict=True))
    }
    keep = np.ones(shape, dtype=bool)
    if mask is not None:
        keep = np.broadcast_to(grid_value(mask, values, axes) != 0, shape)
    coords = tuple(
        np.broadcast_to(grid_value(i, values, axes).astype(np.int64), shape)[keep]
        for i in out_index
    )
    at = np.stack(
        [np.broadcast_to(axes[v], shape)[keep] for v in variables]
        or [np.zeros(int(keep.sum()), dtype=np.int64)],
        axis=1,
    )[:, : len(variables)]
    return Writes(tuple(variables), coords, at)
