"""Region inputs and outputs of q8_0 activation blocks (`q8_0x[K]`, fusec's aligned layout).

An input `a: q8_0x[K]` is a vector already rounded to q8_0 blocks (by the kernel that produced
it); a contraction `sum(k: W[n, k] * a[k])` with GGUF weights reads its blocks straight from
global memory with integer dot products (codegen/plan.py, `ActSource.GLOBAL`).  An output
`y: q8_0x[N]` is written by a stage whose f32 values the kernel rounds to blocks of 32 before
storing, as gguf quantizes q8_0.

Input: a region parameter, or a stage that writes a q8_0x output.  Output: diagnostics, and the
stage's stored dtype (q8_0).  Not checked here: that a contraction actually takes the
integer dot product path (a q8_0x input may be read like any float vector; it then reads one
element at a time).
"""

from __future__ import annotations

from . import ir
from . import syntax as S
from .check_state import CheckState
from .types import DType, Placement, Scope


def check_q8_0x_param(state: CheckState, p: S.Param, shape: tuple[ir.Expr, ...]) -> bool:
    """A q8_0x buffer is one vector (its blocks run along its only index) and never state;
    whole blocks are checked with the weights' rule (check_names._check_blocks)."""
    if p.state:
        state.err(
            p.type.span,
            f"state output '{p.name}' cannot be q8_0x; a state buffer is written in part",
            "declare it f32 or f16",
        )
        return False
    if len(shape) != 1:
        state.err(
            p.type.span,
            f"q8_0x buffer '{p.name}' must be a vector (one dimension), "
            f"not {len(shape)} dimensions",
            "declare it as q8_0x[K]: its 32-element blocks run along K "
            "(flatten it, e.g. q8_0x[NQ * D])",
        )
        return False
    return True


def check_q8_0x_output(
    state: CheckState,
    st: S.Stage,
    out_buf: ir.Buffer,
    indices: tuple[ir.IndexVar, ...],
    value: ir.Expr,
    layout: ir.Layout | None,
    launch: ir.Launch | None,
) -> DType | None:
    """A stage writing a q8_0x output, in a grid region: elementwise along its one index (the
    grid covers the blocks, 4 lanes per block, each computing 8 of its values), or a
    contraction with rows -> subgroup (each workgroup takes chunks of rows that are whole
    blocks, its subgroups' rows rounded up to a multiple of 32, and rounds them through shared
    memory: codegen/lower.py, glsl_contract).  Returns the stage's stored dtype (q8_0), or None
    after a diagnostic."""
    if out_buf.state or len(out_buf.shape) != 1 or len(indices) != 1:
        return None  # check_q8_0x_param refused the buffer
    if state.per is not None:
        state.err(
            st.name_span,
            f"output '{st.name}' is q8_0x; a per-workgroup region cannot round its blocks "
            "(a workgroup's share need not be whole blocks)",
            "write it as f32 here, or compute it in a grid region",
        )
        return None
    layout = layout or _inlined_layout(value)
    across = _reduces_across(value)
    if across and layout is not None and layout.row_unit != Scope.SUBGROUP:
        unit = f"rows -> {layout.row_unit.value}"
        state.err(
            st.value.span,
            f"output '{st.name}' is q8_0x, and its value is a reduction across lanes with "
            f"{unit}: a block's 32 rows are rounded together, by the workgroup whose "
            "subgroups computed them",
            f"give it a layout with rows -> subgroup, e.g. layout {_row_name(st)} -> "
            "subgroup, k -> lane x 32; or compute it into an f32 output",
        )
        return None
    if launch is not None and launch.workgroup_size < 4:
        state.err(
            st.name_span,
            f"output '{st.name}' is q8_0x: its blocks are rounded by 4 lanes each; the "
            f"workgroup has {launch.workgroup_size}",
            "launch a workgroup of at least 4",
        )
        return None
    return DType.Q8_0


def _register_refs(value: ir.Expr) -> list[ir.Stage]:
    """The indexed register stages `value` reads (lowering inlines them)."""
    return [
        e.stage
        for e in ir.walk(value)
        if isinstance(e, ir.StageRef)
        and e.stage.placement == Placement.REGISTER
        and not e.stage.is_scalar
    ]


def _reduces_across(value: ir.Expr) -> bool:
    """A reduction across lanes in `value` or in a register stage it inlines."""
    if any(isinstance(r, ir.Reduce) and r.scope != Scope.LANE for r in ir.walk(value)):
        return True
    return any(_reduces_across(s.value) for s in _register_refs(value))


def _inlined_layout(value: ir.Expr) -> ir.Layout | None:
    """The layout lowering takes for a stage without one (codegen/lower.py resolve_layout): that
    of a register stage it inlines, else None (rows -> subgroup)."""
    for s in _register_refs(value):
        found = s.layout or _inlined_layout(s.value)
        if found is not None:
            return found
    return None


def _row_name(st: S.Stage) -> str:
    return next((ix.id for ix in st.indices if isinstance(ix, S.Name)), "n")
