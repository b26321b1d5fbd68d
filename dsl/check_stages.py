"""Stages: one assignment of a region, `y[n] = sum(k: W[n, k] * x[k]) @ subgroup ...`, checked
from its left side to its placement, and repeat loops of them.

Input: a stage's syntax, with the region's names, launch, tile and per-workgroup index.  Output:
an `ir.Stage` (or `ir.Repeat`), entered in `Names`, or diagnostics.  Runs, per stage, the target
buffer (check_names.py), extent inference (check_extents.py), typing (check_exprs.py) and
placement (check_placement.py).  Not checked here: what concerns several stages at once (the
driver, check.py).
"""

from __future__ import annotations

from . import bounds, ir
from . import syntax as S
from .check_exprs import type_expression
from .check_extents import infer_extents, reads_poisoned
from .check_indices import check_index, check_repeat_count
from .check_names import declare, resolve_shape, resolve_target
from .check_placement import check_layout, check_shared, check_slices, check_stored
from .check_precision import check_precision
from .check_q8 import check_q8_0x_output
from .check_select import (
    check_integer_stage,
    check_select_rows,
    check_topk,
    prepare_topk,
    topk_of,
)
from .check_state import (
    CheckState,
    IndexInfo,
    Names,
    bind_stage,
    is_tile_value,
    shadows_declaration,
    walk_syntax,
)
from .check_tiles import check_tile_stage
from .check_writes import check_write_stage, writes_part
from .types import EXCHANGE_FUNCTIONS, FUNCTIONS, DType, Placement, Scope

# calls that are reductions or selections, not functions (check_exprs and check_select)
_REDUCERS = ("sum", "max", "min", "argmax", "argmin", "topk", "argtopk")

# Lowering recomputes an indexed register stage where it is read, so a stage's expression grows
# by those it reads; twice S.MAX_EXPR_DEPTH still leaves lowering and the GLSL printer (3 Python
# frames per level at most) inside the default recursion limit.
MAX_INLINED_DEPTH = 2 * S.MAX_EXPR_DEPTH


def check_stages(
    state: CheckState, r: S.Region, sc: Names, launch: ir.Launch | None
) -> list[ir.Stage | ir.Repeat]:
    """The stages and repeat loops of a region, in order, each bound for those after it.  A
    stage that fails is poisoned, so that the stages reading it stay silent."""
    stages: list[ir.Stage | ir.Repeat] = []
    per = state.per
    after_grid = False
    for item in r.stages:
        if isinstance(item, S.Repeat):
            rep = check_repeat(state, item, sc, launch)
            if rep is not None:
                stages.append(rep)
            continue
        in_grid = item.placement is not None and item.placement.id == Placement.GRID.value
        # after its stages in grid a per-workgroup region runs in one workgroup (the last to
        # arrive, dsl/check_grid.py): its stages are not indexed by the workgroup's value (but
        # by its group's, with `group`), and they read the stages in grid at every value, with
        # the per index written out
        if after_grid and not in_grid:
            # with `, group h = g / M`, indexed by the group instead (once per group)
            state.per = state.group.var if state.group is not None else None
        else:
            state.per = per
        after_grid = after_grid or in_grid
        stage = check_stage(state, item, sc, launch)
        state.per = per
        if stage is None:
            sc.poisoned.add(item.name)
        else:
            stages.append(stage)
            bind_stage(sc, stage)
    return stages


def check_stage(
    state: CheckState, st: S.Stage, sc: Names, launch: ir.Launch | None
) -> ir.Stage | None:
    """One stage: its left side, the extents of its indices, its value, its layout and its
    placement; None when it is wrong."""
    if state.tile is not None:
        return check_tile_stage(state, st, sc)
    n_before = len(state.diags)
    ok, out_buf = resolve_target(state, st, sc)
    if not ok:
        return None
    if out_buf is None and not declare(state, sc, st.name, st.name_span, "stage"):
        return None
    placement = Placement.GLOBAL if out_buf is not None else Placement.REGISTER
    if st.placement is not None:
        try:
            placement = Placement(st.placement.id)
        except ValueError:
            state.err(
                st.placement.span,
                f"unknown placement '{st.placement.id}'",
                "placements: register, shared, global, slices, grid",
            )
            return None
        if out_buf is not None and placement != Placement.GLOBAL:
            state.err(
                st.placement.span,
                f"output '{st.name}' lives in global memory; it "
                f"cannot be placed in {placement.value}",
                "drop the placement, or compute an intermediate and copy it out",
            )
            return None
    if writes_part(st):
        if out_buf is not None and out_buf.dtype == DType.Q8_0X:
            state.err(
                st.name_span,
                f"output '{st.name}' is q8_0x and is written whole, by one stage, along its "
                "index: its blocks are rounded as they are stored",
                f"write {st.name}[k] = ... for every k, or declare it f32",
            )
            return None
        return check_write_stage(state, st, sc, out_buf)
    # a state output may be written at a fixed position: `kc[k, pos, d] = ...`
    fixed: dict[int, ir.Expr] = {}
    lhs = [ix for ix in st.indices if isinstance(ix, S.Name)]  # every one: not writes_part(st)
    for i, ix in enumerate(lhs):
        c = sc.consts.get(ix.id)
        if c is None:
            continue
        if out_buf is None or not out_buf.state:
            state.err(
                ix.span,
                f"'{ix.id}' is a {'run-time parameter' if c.runtime else 'constant'}; "
                "only a state output is written at a fixed index",
                f"declare the output as state ({st.name}: state f32[...]), or index by name",
            )
            return None
        if not c.dtype.is_int:
            state.err(
                ix.span,
                f"index '{ix.id}' must be an integer, not {c.dtype.value}",
                f"a fixed index is an integer constant or param; give '{ix.id}' an integer value",
            )
            return None
        fixed[i] = ir.ConstRef(c, span=ix.span)
    free = [ix for i, ix in enumerate(lhs) if i not in fixed]
    # index variables of the left side
    infos: dict[str, IndexInfo] = {}
    for ix in free:
        if ix.id in infos:
            state.err(
                ix.span,
                f"index '{ix.id}' appears twice on the left side",
                "name each dimension's index differently (y[i, j] = ...)",
            )
            return None
        if shadows_declaration(state, sc, ix.id, ix.span):
            return None
        infos[ix.id] = IndexInfo(ix.id, ix.span)
    for ix in free:
        if ix.id in st.extents:
            infos[ix.id].extent = resolve_shape(state, st.extents[ix.id], sc)
            infos[ix.id].extent_origin = ix.span
            infos[ix.id].explicit = True
    if out_buf is not None:
        call = st.value if isinstance(st.value, S.Call) else None
        known = (*FUNCTIONS, *EXCHANGE_FUNCTIONS, *_REDUCERS)
        if call is not None and call.fn not in known and len(out_buf.shape) != len(st.indices):
            # `y = nope(x, g)`: a stage group's use that names no group (groups are expanded
            # before this), not a stage whose indices are missing
            state.err(
                call.span,
                f"unknown function or stage group '{call.fn}'",
                "stage groups are declared with 'stages NAME(...) -> ...'; functions: "
                + ", ".join(sorted(FUNCTIONS)),
            )
            return None
        if len(out_buf.shape) != len(st.indices):
            state.err(
                st.name_span,
                f"output '{st.name}' has {len(out_buf.shape)} "
                f"dimension(s) but the stage writes {len(st.indices)}",
                f"write {st.name}[" + ", ".join("ijkl"[: len(out_buf.shape)]) + "]",
            )
            return None
        for i, (ix, dim) in enumerate(zip(lhs, out_buf.shape, strict=True)):
            if i not in fixed:
                infos[ix.id].extent = dim
                infos[ix.id].extent_origin = out_buf.span
    if out_buf is not None and len(out_buf.shape) == len(st.indices):
        for i, pos_expr in fixed.items():
            if not check_index(state, lhs[i], pos_expr, out_buf.shape[i], st.name, i):
                return None
        if state.per is not None and not _check_per_output(state, st, out_buf, free):
            return None
    if out_buf is not None and out_buf.state and not fixed:
        state.err(
            st.name_span,
            f"state output '{st.name}' is written whole; write part of it at a fixed index",
            f"write e.g. {st.name}[k, pos, d] = ... with a run-time parameter pos",
        )
        return None
    topk = topk_of(st)
    if topk is not None and not prepare_topk(state, st, topk, sc, infos, free, bool(fixed)):
        return None
    # infer extents from uses, then type the value with the variables bound
    infer_extents(state, st.value, sc, infos, set(infos))
    if state.per is not None and state.per.name in infos:
        infos[state.per.name].extent = state.per.extent  # the workgroup's own index
    for ix in free:
        info = infos[ix.id]
        if state.per is not None and ix.id == state.per.name:
            info.var = state.per
            continue
        if info.extent is None and reads_poisoned(st.value, sc):
            return None  # a stage it reads failed, with a diagnostic of its own
        if info.extent is None:
            state.err(
                ix.span,
                f"cannot infer the extent of index '{ix.id}'",
                f"use '{ix.id}' directly as an index of an input on the right side",
            )
            return None
        info.var = ir.IndexVar(ix.id, info.extent, span=ix.span)
    if len(state.diags) > n_before:
        return None
    env = {name: info.var for name, info in infos.items() if info.var is not None}
    if state.per is not None:
        env[state.per.name] = state.per
    if topk is not None:
        value = check_topk(state, st, topk, sc, env, env[free[0].id])
    else:
        value = type_expression(
            state,
            st.value,
            sc,
            env,
            reduce_ok=True,
            row_vars=tuple(v for v in env.values() if v is not state.per),
        )
    if len(state.diags) > n_before or value.dtype == DType.ERROR:
        return None
    if out_buf is not None and not out_buf.dtype.is_int and value.dtype.is_int:
        state.err(
            st.value.span,
            f"dtype mismatch: output '{st.name}' is "
            f"{out_buf.dtype.value} but the value is {value.dtype.value}",
            "convert it with float(...)",
        )
        return None
    if not check_integer_stage(state, st, value, out_buf, placement):
        return None
    if not check_select_rows(state, st, value, out_buf, placement, bool(free)):
        return None
    n_layout = len(state.diags)
    layout = check_layout(state, st, env, value)
    if len(state.diags) > n_layout:
        return None
    if layout is not None and layout.row_unit == Scope.WORKGROUP:
        # every lane of the workgroup strides over the reduced index of the same rows
        item = next(it for it in st.layout if it.unit == "workgroup")
        if placement in (Placement.SHARED, Placement.SLICES) or state.per is not None:
            state.err(
                item.span,
                "rows -> workgroup needs a stage kept in registers or global memory, "
                "in a grid region",
                "use rows -> subgroup for shared values and per-workgroup regions",
            )
            return None
        if launch is not None and launch.rows_per_subgroup > 4:
            state.err(
                item.span,
                f"rows -> workgroup takes at most 4 rows at a time, not {launch.rows_per_subgroup}",
                "lower rows_per_subgroup",
            )
            return None
    if placement == Placement.SLICES and not check_slices(state, st, free, layout):
        return None
    indices = tuple(env[ix.id] for ix in free)
    out_index = (
        tuple(fixed.get(i) or ir.IndexRef(env[ix.id], span=ix.span) for i, ix in enumerate(lhs))
        if fixed
        else None
    )
    if state.per is not None and out_buf is None:
        indices = (state.per, *indices)  # implicitly indexed by the workgroup's value
    stored = check_stored(state, st, placement, indices, value, launch)
    if out_buf is not None and out_buf.dtype == DType.Q8_0X:
        stored = check_q8_0x_output(state, st, out_buf, indices, value, layout, launch)
    if stored == DType.F64:
        promoted = check_precision(state, st, placement, indices, value)
        if promoted is None:
            return None
        value, stored = promoted, None  # the value's own dtype says f64
    if len(state.diags) > n_layout:
        return None
    stage = ir.Stage(
        st.name,
        indices,
        value,
        value.dtype,
        placement,
        layout,
        out_buf,
        span=st.span,
        var=st.name,
        out_index=out_index,
        stored=stored,
    )
    if placement == Placement.SHARED:
        check_shared(state, stage, st, sc)
    depth = inlined_depth(state, value)
    if depth > MAX_INLINED_DEPTH:
        state.err(
            st.span,
            f"'{st.name}' must be nested at most {MAX_INLINED_DEPTH} levels deep with the "
            f"register stages it reads substituted, not {depth}",
            "a register stage is recomputed where it is read: place one of those it reads "
            "in shared memory (in shared)",
        )
        return None
    if placement == Placement.REGISTER and not stage.is_scalar:
        state.depths[stage] = depth
    return stage


def _check_per_output(
    state: CheckState, st: S.Stage, out_buf: ir.Buffer, free: list[S.Name]
) -> bool:
    """In a per-workgroup region each workgroup stores the part of an output at its own
    value of the per index: that index comes first among the output's indices (the fixed
    ones of a state output aside), and its dimension holds every value."""
    per = state.per
    assert per is not None
    if not free or free[0].id != per.name:
        state.err(
            free[0].span if free else st.name_span,
            f"output '{st.name}' of a per-workgroup region must be indexed by '{per.name}' "
            "first" + (f", not by '{free[0].id}'" if free else ""),
            f"each workgroup stores the part of '{st.name}' at its own '{per.name}': write "
            f"{st.name}[{per.name}, ...], or compute '{st.name}' in a region without "
            "'per workgroup'",
        )
        return False
    pos = next(i for i, ix in enumerate(st.indices) if ix is free[0])
    return check_index(state, free[0], ir.IndexRef(per), out_buf.shape[pos], st.name, pos)


def check_repeat(
    state: CheckState, rp: S.Repeat, sc: Names, launch: ir.Launch | None
) -> ir.Repeat | None:
    """`repeat COUNT:` in a tile region: a count of constants, and a body that assigns tile
    values only; a value assigned before the loop is carried from one iteration to the next."""
    if state.tile is None:
        state.err(
            rp.span,
            "repeat is only supported in a tile region",
            "declare a tile (tile (i: 4) lane i, per t) or unroll the stages",
        )
        return None
    tile_values = [
        x
        for x in walk_syntax(rp.count)
        if isinstance(x, S.Name | S.Access)
        and is_tile_value(state, x.id if isinstance(x, S.Name) else x.name, sc)
    ]
    if tile_values:
        x = tile_values[0]
        name = x.id if isinstance(x, S.Name) else x.name
        state.err(
            x.span,
            f"a repeat count must be a constant expression, not the tile value '{name}'",
            "a loop runs the same number of times on every lane: count with constants, "
            "e.g. repeat iters - 1:",
        )
        return None
    count = type_expression(state, rp.count, sc, {}, reduce_ok=False, row_vars=())
    if count.dtype == DType.ERROR:
        return None
    if not count.dtype.is_int:
        state.err(
            rp.count.span,
            f"a repeat count must be an integer, not {count.dtype.value}",
            "use integer constants, e.g. repeat iters - 1:",
        )
        return None
    if not bounds.is_arithmetic(count) or bounds.index_vars(count):
        state.err(
            rp.count.span,
            "a repeat count must be computed from constants and integers",
            "use integer constants, e.g. repeat iters - 1:",
        )
        return None
    params = [x for x in walk_syntax(rp.count) if isinstance(x, S.Name) and x.id in sc.consts]
    runtime = [x for x in params if sc.consts[x.id].runtime]
    if runtime:
        # a count is checked against the watchdog's limit for a run's constants before any
        # dispatch (the manifest's loop count); a parameter changes between dispatches
        state.err(
            runtime[0].span,
            f"'{runtime[0].id}' is a run-time parameter; it cannot count a repeat",
            "shapes, extents and trip counts use constants (const), fixed at pipeline creation",
        )
        return None
    if not check_repeat_count(state, rp.count, count):
        return None
    before = dict(sc.latest)
    body: list[ir.Stage] = []
    for st in rp.stages:
        if st.indices or st.name in sc.buffers:
            state.err(
                st.name_span,
                "a repeat body assigns tile values only",
                "store outputs after the loop",
            )
            return None
        stage = check_stage(state, st, sc, launch)
        if stage is None:
            sc.poisoned.add(st.name)
            return None
        body.append(stage)
        bind_stage(sc, stage)
    carried = []
    for var in dict.fromkeys(s.var for s in body):
        last = [s for s in body if s.var == var][-1]
        if var in before:
            carried.append((before[var], last))
            # after the loop (and at the top of each iteration) the value is the carried one
            sc.latest[var] = before[var]
    return ir.Repeat(count, tuple(body), tuple(carried), span=rp.span)


def inlined_depth(state: CheckState, e: ir.Expr) -> int:
    """The depth of `e` once the indexed register stages it reads are substituted (lowering
    recomputes them where they are read)."""
    below = [inlined_depth(state, c) for c in ir.children(e)]
    if isinstance(e, ir.StageRef) and e.stage in state.depths:
        below.append(state.depths[e.stage])
    return 1 + max(below, default=0)
