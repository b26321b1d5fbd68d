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
from .types import DType, Scope


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
    launch: ir.Launch | None,
) -> DType | None:
    """A stage writing a q8_0x output: elementwise along its one index, in a grid region, so
    that the grid covers the blocks (4 lanes per block, each computing 8 of its values) and
    every block's 32 values are rounded by the lanes that computed them.  Returns the stage's
    stored dtype (q8_0), or None after a diagnostic."""
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
    if any(r.scope != Scope.LANE for r in ir.walk(value) if isinstance(r, ir.Reduce)):
        state.err(
            st.value.span,
            f"output '{st.name}' is q8_0x, and its value is a reduction across lanes: a "
            "block's 32 rows would come from different subgroups, and a block is rounded "
            "by the lanes that computed its values",
            f"compute the reduction into an f32 output (or a stage), then round it to q8_0x in "
            f"an elementwise stage of a region of its own, e.g. {st.name}[n] = p[n]",
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
