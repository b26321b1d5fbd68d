"""Stages and placement: where a stage's value lives and how it is laid out over lanes.

Input: a typed stage.  Output: its `ir.Layout` and stored dtype, and diagnostics for a layout,
a placement (`in shared`, `in slices`) or a storage (`as q8_0`) the stage cannot have, and for a
shared intermediate larger than the target's shared memory.  Not checked here: the registers a
stage needs (codegen/estimate.py), or the subgroup size a device has.
"""

from __future__ import annotations

from . import ir
from . import syntax as S
from .check_state import CheckState, Names, pow2, visible_shape
from .types import Q8_SHARED_WORDS, QUANT_BLOCK, DType, Placement, Scope


def check_layout(
    state: CheckState, st: S.Stage, env: dict[str, ir.IndexVar], value: ir.Expr
) -> ir.Layout | None:
    """The stage's layout, None when it gives none (lowering then takes the layout of the
    register stages it inlines, or the default: rows -> subgroup, one element per lane)."""
    if not st.layout:
        return None
    row_unit = Scope.SUBGROUP
    vector = 1
    reduce_vars = {r.var.name for r in ir.walk(value) if isinstance(r, ir.Reduce)}
    for it in st.layout:
        if it.index in env:
            if it.unit not in ("subgroup", "lane", "workgroup"):
                state.err(
                    it.span,
                    f"row index '{it.index}' can map to subgroup, lane or workgroup, "
                    f"not '{it.unit}'",
                    "rows -> subgroup spreads K over lanes",
                )
                return None
            if it.vector != 1:
                state.err(it.span, "rows take no vector width", f"write {it.index} -> {it.unit}")
                return None
            row_unit = Scope(it.unit)
        elif it.index in reduce_vars:
            if it.unit != "lane":
                state.err(
                    it.span,
                    f"reduced index '{it.index}' maps to lane, not '{it.unit}'",
                    f"write {it.index} -> lane x 4",
                )
                return None
            if not pow2(it.vector) or it.vector > 32:
                state.err(
                    it.span,
                    f"vector width must be a power of two up to 32, not {it.vector}",
                    "4 or 8 elements per lane per load",
                )
                return None
            vector = it.vector
        else:
            known = ", ".join(sorted(set(env) | reduce_vars)) or "none"
            state.err(
                it.span,
                f"layout names index '{it.index}', which this stage does not have",
                f"indices of this stage: {known}",
            )
            return None
    return ir.Layout(row_unit, vector)


def check_stored(
    state: CheckState,
    st: S.Stage,
    placement: Placement,
    indices: tuple[ir.IndexVar, ...],
    value: ir.Expr,
    launch: ir.Launch | None,
) -> DType | None:
    """`in shared as q8_0`: a one-index shared stage of elementwise values, kept as q8_0
    blocks along its index (the last block padded with zeros); `as f64`: computed in double
    precision (checked by check_precision)."""
    if st.stored is None:
        return None
    name = st.stored.id
    if name == DType.F64.value:
        return DType.F64  # computed in double precision (check_precision.check_precision)
    if name != DType.Q8_0.value:
        state.err(
            st.stored.span,
            f"a stage cannot be stored as '{name}'",
            "stages are stored as f32 (the default), q8_0 ('in shared as q8_0') or computed "
            "in f64 ('in register as f64')",
        )
        return None
    if placement != Placement.SHARED:
        state.err(
            st.stored.span,
            f"only a shared stage is stored as q8_0; '{st.name}' is in {placement.value}",
            f"write '{st.name}[...] = ... in shared as q8_0'",
        )
        return None
    if state.per is not None or len(indices) != 1:
        state.err(
            st.name_span,
            f"a q8_0 stage has exactly one index, its blocks' direction; '{st.name}' has "
            f"{len(indices)}" + (" (with the per-workgroup index)" if state.per else ""),
            "quantize a vector, e.g. xq[k] = x[k] in shared as q8_0, in a grid region",
        )
        return None
    if any(r.scope != Scope.LANE for r in ir.walk(value) if isinstance(r, ir.Reduce)):
        state.err(
            st.value.span,
            f"'{st.name}' holds a reduction across lanes; a q8_0 stage is quantized "
            "elementwise, 4 lanes per block",
            "compute the reduction in an earlier stage, then quantize its result",
        )
        return None
    if launch is not None and launch.workgroup_size < 4:
        state.err(
            st.stored.span,
            f"a q8_0 stage is quantized by 4 lanes per block; the workgroup has "
            f"{launch.workgroup_size}",
            "launch a workgroup of at least 4",
        )
        return None
    return DType.Q8_0


def check_slices(
    state: CheckState, st: S.Stage, free: list[S.Name], layout: ir.Layout | None
) -> bool:
    """`in slices`: each workgroup keeps the rows of one index that its subgroups computed,
    for a later sum over that index (codegen/lower.py `slice_stage`, `split_k`)."""
    assert st.placement is not None
    problem = None
    if state.per is not None:
        problem = "a stage in slices needs a grid region, not a per-workgroup one"
    elif not free:
        problem = f"'{st.name}' has no index to slice"
    elif len(free) > 1:
        problem = f"'{st.name}' has {len(free)} indices; a stage in slices has one"
    elif layout is not None and layout.row_unit == Scope.LANE:
        problem = f"the rows of '{st.name}' must go to subgroups to be sliced, not to lanes"
    if problem is None:
        return True
    state.err(
        st.placement.span,
        problem,
        "in slices keeps the rows of a one-index stage, e.g. h[f] = ... in slices, for a "
        "later sum over f; otherwise place it in shared or global",
    )
    return False


def check_slice_readers(state: CheckState, stages: list[ir.Stage]) -> None:
    """A stage in slices is only in the memory of the workgroup that computed each slice:
    only a sum over its index into an output (split-K, float atomics) can read it."""
    for x in stages:
        sliced = {
            e.stage
            for e in ir.walk(x.value)
            if isinstance(e, ir.StageRef) and e.stage.placement == Placement.SLICES
        }
        if not sliced:
            continue
        red = x.value
        ok = (
            x.output is not None
            and x.output.dtype == DType.F32
            and x.out_index is None
            and len(x.indices) == 1
            and len(sliced) == 1
            and isinstance(red, ir.Reduce)
            and red.op == "sum"
            and all(
                e.indices == (ir.IndexRef(red.var),)
                for e in ir.walk(red.body)
                if isinstance(e, ir.StageRef) and e.stage in sliced
            )
        )
        if ok:
            continue
        name = min(s.name for s in sliced)
        state.err(
            x.span,
            f"'{name}' is in slices: only an f32 output of one index that sums over the "
            f"index of '{name}' can read it",
            f"write e.g. y[n] = sum(f: W[n, f] * {name}[f]), or place '{name}' in shared or global",
        )


def check_shared(state: CheckState, stage: ir.Stage, st: S.Stage, sc: Names) -> None:
    """A shared intermediate must fit in the target's shared memory, at the default constants
    and over their whole ranges."""
    defaults: dict[str, int | float] = {c.name: c.default for c in sc.consts.values()}
    ranges = {
        c.name: (
            int(c.lo if c.lo is not None else c.default),
            int(c.hi if c.hi is not None else c.default),
        )
        for c in sc.consts.values()
        if c.dtype.is_int
    }
    for values in (defaults, None):
        count = 1
        for dim in visible_shape(state, stage):
            count *= (
                ir.evaluate_int(dim, values)
                if values is not None
                else ir.bounds_int(dim, ranges)[1]
            )
        # q8_0: per 32-element block, 32 int8 quants, the scale and the sum of the quants
        size = -(-count // QUANT_BLOCK) * Q8_SHARED_WORDS * 4 if stage.stored else count * 4
        if size > state.limits.shared_bytes:
            dims = ", ".join(ir.format_expr(d) for d in visible_shape(state, stage)) or "scalar"
            need = (
                f"needs {size} bytes at the default constants"
                if values is not None
                else f"may need up to {size} bytes over the constants' ranges"
            )
            state.err(
                st.span,
                f"shared intermediate '{stage.name}' [{dims}] {need}, more than the "
                f"{state.limits.shared_bytes}-byte shared-memory limit",
                "place it in register (recomputed where used) or global, or lower the "
                "constant's range",
            )
            return
