"""Selection and integers: `topk` stages, `argmax`/`argmin` placement, integer stage values.

Input: a stage's syntax and what check_stages.py resolved of it (its output buffer, its free
indices and their extents being inferred).  Output: the typed `ir.Reduce` of a topk stage, or
diagnostics.  A topk (`t[j] = topk(k, e: body) @ scope`, `argtopk` for the indices) is a
stage's whole value, indexed by its rank `j` of extent k; k is an integer literal or
constant from 1 to TOPK_MAX and at most the extent of `e` at every setting of the constants
(dsl/bounds.py `overrun_at` checks a run's own constants).  An indexed stage's argmax over a
subgroup is its whole value and goes to an output or global memory.  Integer values (indices,
argmax, argtopk) stay in registers or go to u32/i32 outputs; a real output takes `float(...)`
of them.  Not checked here: the expression inside (check_exprs.py).
"""

from __future__ import annotations

from . import bounds, ir
from . import syntax as S
from .check_extents import infer_reduce_extent
from .check_state import CheckState, IndexInfo, Names, walk_syntax
from .types import TOPK_MAX, DType, Placement, Scope

_TOPK_FORM = "t[j] = topk(8, e: p[e]) @ workgroup (argtopk for the indices)"


def written_scope(state: CheckState, e: S.Reduce, default: Scope) -> Scope | None:
    """The scope a reduction names after `@` (`default` without one); None after a diagnostic
    for a name that is no scope."""
    if e.scope is None:
        return default
    try:
        return Scope(e.scope)
    except ValueError:
        state.err(
            e.scope_span,
            f"unknown reduction scope '{e.scope}'",
            "scopes: lane, subgroup, workgroup",
        )
        return None


def topk_of(st: S.Stage) -> S.Reduce | None:
    """The topk or argtopk a stage's value is, if it is one."""
    v = st.value
    return v if isinstance(v, S.Reduce) and v.k is not None else None


def topk_count(state: CheckState, e: S.Reduce, sc: Names) -> ir.Expr | None:
    """k of `topk(k, ...)`: an integer literal, or a constant (a specialization constant, not
    a run-time parameter), from 1 to TOPK_MAX at every setting of the constants."""
    k = e.k
    assert k is not None
    count: ir.Expr | None = None
    if isinstance(k, S.Num) and k.is_int:
        count = ir.Lit(int(k.value), DType.U32, span=k.span)
    elif isinstance(k, S.Name) and k.id in sc.consts:
        c = sc.consts[k.id]
        if c.dtype.is_int and not c.runtime:
            count = ir.ConstRef(c, span=k.span)
    if count is None:
        state.err(
            k.span,
            f"the count of {e.op} must be an integer literal or constant",
            f"write e.g. {e.op}(8, {e.index}: ...) or {e.op}(TK, {e.index}: ...) with "
            "const TK = 8 in 1 .. 16; the count sizes the kernel's arrays",
        )
        return None
    for setting in state.settings:
        n = bounds.evaluate(count, setting.values, {})
        if n is not None and not 1 <= n <= TOPK_MAX:
            at = "" if isinstance(count, ir.Lit) else f" at the {setting.name} constants"
            state.err(
                k.span,
                f"{e.op} keeps 1 to {TOPK_MAX} values, not {n}{at}",
                f"each value costs a round over '{e.index}'; keep k <= {TOPK_MAX}",
            )
            return None
    return count


def prepare_topk(
    state: CheckState,
    st: S.Stage,
    e: S.Reduce,
    sc: Names,
    infos: dict[str, IndexInfo],
    free: list[S.Name],
    fixed: bool,
) -> bool:
    """Before extents are inferred: a topk stage has one index, its rank, whose extent is k
    (a left side or an output may give it; check_topk compares)."""
    if state.tile is not None or state.per is not None:
        what = "a tile region" if state.tile is not None else "a per-workgroup region"
        state.err(
            e.span,
            f"{e.op} is not supported in {what} yet",
            "select in a grid region (without tile or per workgroup)",
        )
        return False
    if len(free) != 1 or fixed:
        state.err(
            st.name_span,
            f"a {e.op} stage has one index, its rank, not {len(st.indices)}",
            f"write {_TOPK_FORM}",
        )
        return False
    k = topk_count(state, e, sc)
    if k is None:
        return False
    info = infos[free[0].id]
    if info.extent is None:
        info.extent = k
        info.extent_origin = free[0].span
    return True


def check_topk(
    state: CheckState,
    st: S.Stage,
    e: S.Reduce,
    sc: Names,
    env: dict[str, ir.IndexVar],
    rank: ir.IndexVar,
) -> ir.Expr:
    """The typed topk (or argtopk) of a stage indexed by `rank`; ERROR after a diagnostic."""
    bad = ir.Lit(0, DType.ERROR)
    k = topk_count(state, e, sc)
    if k is None:
        return bad
    shown = ir.format_expr(k)
    for setting in state.settings:
        n = bounds.evaluate(rank.extent, setting.values, {})
        want = bounds.evaluate(k, setting.values, {})
        if n != want:
            state.err(
                st.name_span,
                f"'{st.name}' has {n} rank(s) at the {setting.name} constants but {e.op} "
                f"keeps {want}",
                f"give the rank the extent {shown}: {st.name}[{rank.name}] with an output of "
                f"{shown} elements",
            )
            return bad
    reads_rank = [x for x in walk_syntax(e.body) if isinstance(x, S.Name) and x.id == rank.name]
    if reads_rank:
        state.err(
            reads_rank[0].span,
            f"the body of {e.op} cannot read its rank '{rank.name}'",
            f"the body gives one value per '{e.index}'; the rank picks among the results",
        )
        return bad
    scope = written_scope(state, e, Scope.WORKGROUP)
    if scope is None:
        return bad
    inner_env = {n: v for n, v in env.items() if v is not rank}
    extent = infer_reduce_extent(state, e, sc, inner_env)
    if extent is None:
        return bad
    for setting in state.settings:
        n = bounds.evaluate(extent, setting.values, {})
        want = bounds.evaluate(k, setting.values, {})
        if n is not None and want is not None and n < want:
            state.err(
                e.k.span if e.k is not None else e.span,
                f"{e.op} keeps {want} values but '{e.index}' has only {n} at the "
                f"{setting.name} constants ({ir.format_expr(extent)})",
                f"lower k, or raise the low end of the range of {ir.format_expr(extent)}",
            )
            return bad
    key = (e.index, e.body, e.scope)
    var = sc.topk_vars.get(key) or ir.IndexVar(e.index, extent, span=e.index_span)
    if var.extent != extent:
        var = ir.IndexVar(e.index, extent, span=e.index_span)
    sc.topk_vars.setdefault(key, var)
    from .check_exprs import type_expression  # check_exprs reads this module's helpers

    body = type_expression(state, e.body, sc, {**inner_env, e.index: var}, False, ())
    if body.dtype == DType.ERROR:
        return bad
    if any(isinstance(x, ir.Reduce) for x in ir.walk(body)):
        state.err(
            e.body.span,
            "nested reductions are not supported yet",
            "compute the inner reduction as its own stage",
        )
        return bad
    return ir.Reduce(
        e.op, var, body, scope, span=e.span, k=k, rank=ir.IndexRef(rank, span=st.name_span)
    )


def check_integer_stage(
    state: CheckState,
    st: S.Stage,
    value: ir.Expr,
    out_buf: ir.Buffer | None,
    placement: Placement,
) -> bool:
    """Integer values go to integer outputs or stay in registers; integer outputs take
    integer values."""
    if out_buf is not None and out_buf.dtype.is_int and not value.dtype.is_int:
        state.err(
            st.value.span,
            f"dtype mismatch: output '{st.name}' is {out_buf.dtype.value} but the value is "
            f"{value.dtype.value}",
            "an integer output takes an integer value: an index, argmax, argmin, argtopk, "
            "or integer arithmetic of those and constants",
        )
        return False
    if out_buf is None and value.dtype.is_int and placement in (Placement.SHARED, Placement.SLICES):
        state.err(
            st.placement.span if st.placement is not None else st.span,
            f"'{st.name}' is an integer ({value.dtype.value}); it cannot be placed in "
            f"{placement.value} yet",
            "keep it in registers (drop the placement), or place float(...) of it",
        )
        return False
    return True


def check_index_reduce(state: CheckState, e: S.Reduce, scope: Scope, indexed: bool) -> bool:
    """argmax and argmin of an indexed stage reduce @ lane, or @ subgroup one row per subgroup
    (check_select_rows); in a per-workgroup region, whose stages the unfused chain computes as
    rows, @ lane only."""
    if state.per is None and scope == Scope.SUBGROUP:
        return True  # rows -> subgroups: check_select_rows checks the stage around it
    if indexed and scope != Scope.LANE:
        where = "a per-workgroup region" if state.per is not None else "an indexed stage"
        hint = (
            "write @ lane: one lane reduces the row"
            if state.per is not None
            else f"compute {e.op} over the {scope.value} in a scalar stage of its own "
            f"(i = {e.op}({e.index}: ...) @ {scope.value}), or write @ lane"
        )
        state.err(
            e.scope_span if e.scope_span is not None else e.span,
            f"{e.op} in {where} must reduce @ lane, not @ {scope.value}",
            hint,
        )
        return False
    return True


def check_select_rows(
    state: CheckState,
    st: S.Stage,
    value: ir.Expr,
    out_buf: ir.Buffer | None,
    placement: Placement,
    indexed: bool,
) -> bool:
    """An indexed stage's argmax or argmin over a subgroup takes one row per subgroup: it is
    the stage's whole value, and its rows go to an output or global memory (a register or
    shared stage would be computed again inside the phases that read it)."""
    reds = [
        x
        for x in ir.walk(value)
        if isinstance(x, ir.Reduce) and x.op in ("argmax", "argmin") and x.scope == Scope.SUBGROUP
    ]
    if not indexed or not reds:
        return True
    red = reds[0]
    if value is not red:
        state.err(
            red.span,
            f"{red.op} over a subgroup must be its indexed stage's whole value",
            f"compute it as a stage of its own (i[n] = {red.op}(...) @ subgroup, an output or "
            "in global), or reduce @ lane",
        )
        return False
    if (out_buf is None and placement != Placement.GLOBAL) or (
        out_buf is not None and out_buf.state
    ):
        state.err(
            st.name_span,
            f"'{st.name}' takes one row per subgroup; write it to an output or place it in global",
            f"add 'in global' to read it from later stages as {st.name}[...], or reduce @ lane",
        )
        return False
    return True
