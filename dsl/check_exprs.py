"""Expressions and types: a stage's value, from syntax to typed region IR.

Input: a syntax expression and the index variables in scope.  Output: an `ir.Expr` whose dtype is
`DType.ERROR` where the expression was wrong (after one diagnostic, so that it does not cascade).
Resolves names to buffers, constants, stages and index variables, checks calls, reductions and
lane exchanges, and every index and divisor (check_indices.py).  Not checked here: where the
stage lives (check_placement.py).
"""

from __future__ import annotations

from . import ir
from . import syntax as S
from .check_extents import infer_reduce_extent
from .check_indices import check_divisor, check_index, check_no_wrap
from .check_select import check_index_reduce, written_scope
from .check_state import CheckState, Names, is_tile_value, visible_shape
from .types import EXCHANGE_FUNCTIONS, FUNCTIONS, INDEX_REDUCERS, REDUCERS, DType, Scope

COMPARE_OPS = ("<", "<=", ">", ">=", "==", "!=")
# how a function of several arguments is called, for the hint of a wrong argument count
_CALL_FORMS = {
    "select": "select(c, a, b): a where c is not 0, else b",
    "clamp": "clamp(x, lo, hi): min(max(x, lo), hi)",
    "pow": "pow(x, y)",
    "max": "max(a, b), or the reduction max(k: ...)",
    "min": "min(a, b), or the reduction min(k: ...)",
}


def type_expression(
    state: CheckState,
    e: S.Expr,
    sc: Names,
    env: dict[str, ir.IndexVar],
    reduce_ok: bool,
    row_vars: tuple[ir.IndexVar, ...],
) -> ir.Expr:
    """The typed region IR of `e`, with the index variables of `env` bound (`row_vars`: those of
    the stage's rows); `DType.ERROR` after a diagnostic.  `reduce_ok`: a reduction may appear here
    (not inside an index)."""
    bad = ir.Lit(0, DType.ERROR)
    match e:
        case S.Num(v, is_int):
            return ir.Lit(v, DType.U32 if is_int else DType.F32, span=e.span)
        case S.Name(name):
            if name in env:
                return ir.IndexRef(env[name], span=e.span)
            if name in sc.consts:
                return ir.ConstRef(sc.consts[name], span=e.span)
            if is_tile_value(state, name, sc):
                stage = sc.latest[name]
                if any(v.name not in env for v in stage.indices):
                    state.err(
                        e.span,
                        f"tile value '{name}' cannot be read here",
                        "a tile value is read in a stage's value, at its lane's element",
                    )
                    return bad
                # a tile value, at this lane's (or a reduction's rebound) coordinates
                at = tuple(ir.IndexRef(env[v.name], span=e.span) for v in stage.indices)
                return ir.StageRef(stage, at, span=e.span)
            if name in sc.stages:
                stage = sc.stages[name]
                if stage.output is not None:
                    # as for an indexed output (S.Access below): the fused kernel writes
                    # an output and keeps no value of it to read
                    state.err(
                        e.span,
                        f"output '{name}' cannot be read",
                        f"compute it as an intermediate first (e.g. {name}_v = ...), then "
                        f"write {name} = {name}_v and read {name}_v",
                    )
                    return bad
                if state.per is not None and stage.indices == (state.per,):
                    return ir.StageRef(stage, (ir.IndexRef(state.per, span=e.span),), span=e.span)
                if not stage.is_scalar:
                    state.err(
                        e.span,
                        f"'{name}' has {len(stage.indices)} index(es); index it",
                        f"write {name}[" + ", ".join(v.name for v in stage.indices) + "]",
                    )
                    return bad
                return ir.StageRef(stage, (), span=e.span)
            if name in sc.buffers:
                buf = sc.buffers[name]
                state.err(
                    e.span,
                    f"'{name}' is a buffer of {len(buf.shape)} dimension(s); index it",
                    f"write {name}[...]",
                )
                return bad
            if name not in sc.poisoned:
                state.err(
                    e.span,
                    f"unknown name '{name}'",
                    "index names are bound by the stage's left side or by a reduction",
                )
            return bad
        case S.Access(name, indices):
            shape: tuple[ir.Expr, ...]
            if name in sc.buffers:
                buf = sc.buffers[name]
                if buf.is_output:
                    state.err(
                        e.name_span,
                        f"output '{name}' cannot be read",
                        f"compute it as an intermediate first (e.g. {name}_v[...] = ...), then "
                        f"write {name}[...] = {name}_v[...] and read {name}_v",
                    )
                    return bad
                shape = buf.shape
            elif name in sc.stages:
                shape = visible_shape(state, sc.stages[name])
            elif name in env or name in sc.consts:
                what = "an index variable" if name in env else "a constant"
                state.err(
                    e.name_span,
                    f"'{name}' is not indexable",
                    f"'{name}' is {what}, a single value: write {name} without brackets",
                )
                return bad
            elif name in sc.poisoned:
                return bad
            else:
                state.err(
                    e.name_span,
                    f"unknown name '{name}'",
                    "inputs come from the region signature; stages must be defined "
                    "before they are used",
                )
                return bad
            if len(indices) != len(shape):
                state.err(
                    e.span,
                    f"'{name}' has {len(shape)} dimension(s) but is indexed with {len(indices)}",
                    f"give '{name}' one index per dimension, {len(shape)} in all",
                )
                return bad
            idx: list[ir.Expr] = []
            for pos, (ix, size) in enumerate(zip(indices, shape, strict=True)):
                iv = type_expression(state, ix, sc, env, False, row_vars)
                if iv.dtype == DType.ERROR:
                    return bad
                if not iv.dtype.is_int:
                    state.err(
                        ix.span,
                        f"dtype mismatch: an index must be an integer, not {iv.dtype.value}",
                        "index with index variables, integer constants and + - * / % of those",
                    )
                    return bad
                if not check_index(state, ix, iv, size, name, pos):
                    return bad
                idx.append(iv)
            if name in sc.buffers:
                return ir.Load(sc.buffers[name], tuple(idx), span=e.span)
            target = sc.stages[name]
            if state.per is not None and target.indices[:1] == (state.per,):
                idx.insert(0, ir.IndexRef(state.per, span=e.span))  # the workgroup's own value
            return ir.StageRef(target, tuple(idx), span=e.span)
        case S.Call(fn, args):
            if fn in ("sum",):
                state.err(
                    e.span,
                    f"'{fn}' is a reduction, not a function",
                    f"write {fn}(k: x[k]) @ workgroup (or @ subgroup, @ lane)",
                )
                return bad
            if fn in EXCHANGE_FUNCTIONS:
                return _exchange(state, e, sc, env, reduce_ok, row_vars)
            arity = FUNCTIONS.get(fn)
            if arity is None:
                state.err(
                    e.span,
                    f"unknown function '{fn}'",
                    "functions: " + ", ".join(sorted(FUNCTIONS)),
                )
                return bad
            if len(args) != arity:
                state.err(
                    e.span,
                    f"'{fn}' takes {arity} argument(s), not {len(args)}",
                    "write " + _CALL_FORMS.get(fn, f"{fn}(" + ", ".join("xyz"[:arity]) + ")"),
                )
                return bad
            vals = [type_expression(state, a, sc, env, reduce_ok, row_vars) for a in args]
            if any(v.dtype == DType.ERROR for v in vals):
                return bad
            pairs = zip(args, vals, strict=True)
            if not all(check_no_wrap(state, a, v, "it becomes a real") for a, v in pairs):
                return bad
            lo, hi = (_literal(args[1]), _literal(args[2])) if fn == "clamp" else (None, None)
            if lo is not None and hi is not None and lo > hi:
                # GLSL's clamp is undefined where lo > hi (GLSL 4.60, 8.3)
                state.err(
                    e.span,
                    f"clamp's bounds are the wrong way round: {lo!r} > {hi!r}",
                    f"write clamp(x, {hi!r}, {lo!r})",
                )
                return bad
            return ir.Call(fn, tuple(vals), DType.F32, span=e.span)
        case S.BinOp(op, lhs, rhs):
            a = type_expression(state, lhs, sc, env, reduce_ok, row_vars)
            b = type_expression(state, rhs, sc, env, reduce_ok, row_vars)
            if DType.ERROR in (a.dtype, b.dtype):
                return bad
            if op in ("&&", "||"):
                # select(a, b != 0, 0) and select(a, 1, b != 0): 1.0 or 0.0, like a comparison
                zero, one = ir.Lit(0.0, DType.F32, span=e.span), ir.Lit(1.0, DType.F32, span=e.span)
                other = ir.BinOp("!=", b, zero, DType.F32, span=rhs.span)
                pick = (other, zero) if op == "&&" else (one, other)
                return ir.Call("select", (a, *pick), DType.F32, span=e.span)
            dtype = DType.U32 if a.dtype.is_int and b.dtype.is_int else DType.F32
            if op in COMPARE_OPS:
                dtype = DType.F32  # 1.0 or 0.0, for select() and arithmetic
            if op == "%" and dtype != DType.U32:
                state.err(
                    e.span,
                    f"dtype mismatch: '%' takes integers, not {a.dtype.value} and {b.dtype.value}",
                    "'%' is a remainder of indices and integer constants: take it before "
                    "the conversion (float(n % 2)), not of a real",
                )
                return bad
            if op in ("/", "%") and dtype == DType.U32 and not check_divisor(state, e, b):
                return bad
            if not _no_wrap_into(state, op, dtype, (lhs, a), (rhs, b)):
                return bad
            return ir.BinOp(op, a, b, dtype, span=e.span)
        case S.Neg(v):
            inner = type_expression(state, v, sc, env, reduce_ok, row_vars)
            if inner.dtype.is_int:
                if not check_no_wrap(state, v, inner, "it becomes a real"):
                    return bad
                # a real: integer arithmetic is unsigned 32-bit, where `0u - 1u` wraps
                # around to 4294967295, so `x[i] * -1` multiplied by that (docs/FUZZING.md);
                # an index or a repeat count never wants a negated integer either
                zero = ir.Lit(0.0, DType.F32, span=e.span)
                return ir.BinOp("-", zero, inner, DType.F32, span=e.span)
            return ir.Neg(inner, span=e.span) if inner.dtype != DType.ERROR else bad
        case S.Reduce(op, index, body):
            if e.k is not None:
                state.err(
                    e.span,
                    f"{op} must be a stage's whole value",
                    "write t[j] = topk(8, e: p[e]) @ workgroup (argtopk for the indices), "
                    "then read t[j]",
                )
                return bad
            if op not in REDUCERS:
                state.err(
                    e.span,
                    f"unknown reduction '{op}'",
                    "reductions: " + ", ".join(sorted(REDUCERS)),
                )
                return bad
            if not reduce_ok:
                state.err(
                    e.span,
                    "a reduction cannot appear inside an index",
                    "compute it as a stage of its own (i = argmax(k: x[k]) @ workgroup), "
                    "then index with that stage",
                )
                return bad
            tile = state.tile
            if tile is not None and op in INDEX_REDUCERS:
                state.err(
                    e.span,
                    f"{op} is not supported in a tile region yet",
                    f"take the value with {op[3:]}({index}: ...), and its place with "
                    f"select(... == that value, float({index}), ...)",
                )
                return bad
            if tile is not None and index in {v.name for v in tile.dims}:
                # across the lanes of the tile's group: xor-shuffles or shared memory
                dim = next(v for v in tile.dims if v.name == index)
                var = ir.IndexVar(index, dim.extent, span=e.index_span)
                scope: Scope | None = Scope.SUBGROUP
            else:
                scope = _reduce_scope(state, e, row_vars) if tile is None else Scope.LANE
                if scope is None:
                    return bad
                if op in INDEX_REDUCERS and not check_index_reduce(
                    state, e, scope, bool(row_vars) or state.per is not None
                ):
                    return bad
                extent = infer_reduce_extent(state, e, sc, env)
                if extent is None:
                    return bad
                var = ir.IndexVar(index, extent, span=e.index_span)
            inner = type_expression(state, body, sc, {**env, index: var}, False, row_vars)
            if inner.dtype == DType.ERROR:
                return bad
            if any(isinstance(x, ir.Reduce) for x in ir.walk(inner)):
                state.err(
                    body.span,
                    "nested reductions are not supported yet",
                    "compute the inner reduction as its own stage",
                )
                return bad
            assert scope is not None
            return ir.Reduce(op, var, inner, scope, span=e.span)
    state.err(
        getattr(e, "span", None),
        "unsupported expression",
        "write arithmetic, a function call, a reduction or an access such as x[k]",
    )
    return bad


def _no_wrap_into(
    state: CheckState,
    op: str,
    dtype: DType,
    *operands: tuple[S.Expr, ir.Expr],
) -> bool:
    """The integer operands of `op` stay within u32 where their value, not only its residue
    modulo 2^32, matters: an integer division or remainder, a comparison, and arithmetic with
    a real (the integer becomes a real).  `+ - *` of integers wrap harmlessly."""
    if op in COMPARE_OPS:
        before = "the comparison"
    elif dtype == DType.U32 and op in ("/", "%"):
        before = "the division" if op == "/" else "the remainder"
    elif dtype != DType.U32:
        before = "it becomes a real"
    else:
        return True
    return all(check_no_wrap(state, syn, val, before) for syn, val in operands)


def _exchange(
    state: CheckState,
    e: S.Call,
    sc: Names,
    env: dict[str, ir.IndexVar],
    reduce_ok: bool,
    row_vars: tuple[ir.IndexVar, ...],
) -> ir.Expr:
    """shuffle_xor(v, mask), shuffle(v, lane), broadcast(v, lane): lanes of the tile group."""
    bad = ir.Lit(0, DType.ERROR)
    tile = state.tile
    if tile is None:
        state.err(
            e.span,
            f"'{e.fn}' exchanges values between the lanes of a tile",
            "declare a tile: tile (i: 16) lane i, per t",
        )
        return bad
    if len(e.args) != 2:
        state.err(
            e.span,
            f"'{e.fn}' takes 2 argument(s), not {len(e.args)}",
            f"write {e.fn}(value, lane)" if e.fn != "shuffle_xor" else "write shuffle_xor(v, mask)",
        )
        return bad
    value = type_expression(state, e.args[0], sc, env, reduce_ok, row_vars)
    arg = type_expression(state, e.args[1], sc, env, False, ())
    if DType.ERROR in (value.dtype, arg.dtype):
        return bad
    if not arg.dtype.is_int or any(isinstance(x, ir.IndexRef) for x in ir.walk(arg)):
        state.err(
            e.args[1].span,
            f"the lane argument of '{e.fn}' must be an integer constant",
            "use a literal or an integer constant (shuffle_xor(v, 4)); to reduce over a tile "
            "index write sum(dst: v)",
        )
        return bad
    n = ir.evaluate_int(arg, {c.name: c.default for c in sc.consts.values()})
    group = tile.lanes
    what = "xor mask" if e.fn == "shuffle_xor" else "lane"
    if not 0 <= n < group:
        state.err(
            e.args[1].span,
            f"{what} {n} reaches outside the {group}-lane group of the tile",
            f"the tile spans lanes 0..{group - 1}; use a {what} below {group}",
        )
        return bad
    lane = ir.Lit(n, DType.U32, span=e.args[1].span)
    return ir.Call(e.fn, (value, lane), DType.F32, span=e.span)


def _reduce_scope(
    state: CheckState, e: S.Reduce, row_vars: tuple[ir.IndexVar, ...]
) -> Scope | None:
    """The scope of a reduction: as written, else subgroup in an indexed stage and workgroup in a
    scalar one."""
    scope = written_scope(state, e, Scope.SUBGROUP if row_vars else Scope.WORKGROUP)
    if scope is None or e.scope is None:
        return scope
    if row_vars and scope == Scope.WORKGROUP:
        state.err(
            e.scope_span,
            "a reduction inside an indexed stage cannot span the workgroup yet",
            "use @ subgroup (rows -> subgroups) or @ lane",
        )
        return None
    return scope


def _literal(e: S.Expr) -> float | None:
    """The value of a number written as a literal (`2.0`, `-1`), else None."""
    if isinstance(e, S.Num):
        return float(e.value)
    if isinstance(e, S.Neg) and isinstance(e.value, S.Num):
        return -float(e.value.value)
    return None
