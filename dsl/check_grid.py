"""Stages in grid: a wide stage spread over the whole grid, then the rest in one workgroup.

Input: a region's checked stages.  Output: diagnostics where `in grid` cannot work: a scalar
stage, two runs of grid stages, a grid stage that reads another, or, after the run, a stage
that needs the whole grid again (`in global`, `in slices`, rows -> workgroup) or,
in a per-workgroup region, a value of the workgroup's own index that is not in grid.  (In a
per-workgroup region the stages after the run are not indexed by the workgroup's value:
check_stages.py checks them as in a grid region, and they read the stages in grid with that
index written out.)  The stages before the run are computed by every workgroup, the run by the
grid (each stage with its own layout), and the stages after it by the last workgroup to finish
its share of the run (codegen/grid_plan.py decides this, codegen/lower.py lowers it).

Not checked here: tile regions (dsl/check_tiles.py checks their stages); whether the run is
wide enough to pay for the scratch buffer (a matter of measurement); device support for the
Vulkan memory model (the runtime refuses in one sentence).
"""

from __future__ import annotations

from . import ir
from .check_state import CheckState
from .types import Placement, Scope

_HINT = "e.g. y[n] = sum(k: W[n, k] * x[k]) in grid, then stages that read y[...] in one workgroup"


def _reads(stage: ir.Stage) -> set[ir.Stage]:
    """The stages `stage` reads, looking through the indexed register stages it inlines."""
    out: set[ir.Stage] = set()
    todo = [stage.value]
    while todo:
        for e in ir.walk(todo.pop()):
            if isinstance(e, ir.StageRef) and e.stage not in out:
                out.add(e.stage)
                if e.stage.placement == Placement.REGISTER and not e.stage.is_scalar:
                    todo.append(e.stage.value)
    return out


def check_grid_stages(state: CheckState, stages: list[ir.Stage]) -> None:
    """Diagnostics for stages in grid and the stages after them."""
    grid = [i for i, s in enumerate(stages) if s.placement == Placement.GRID]
    if not grid:
        if state.group is not None:
            state.err(
                state.group.var.span,
                f"group '{state.group.var.name}' needs stages in grid to follow",
                "a group runs the stages after the stages in grid once per group; place the "
                "values the groups read in grid, or drop the group",
            )
        return
    for i in grid:
        s = stages[i]
        if s.is_scalar:
            state.err(s.span, f"'{s.name}' has no index to spread over the grid", _HINT)
            return
        for r in _reads(s):
            if r.placement == Placement.GRID:
                state.err(
                    s.span,
                    f"'{s.name}' reads '{r.name}', which is in grid too: only the last "
                    "workgroup sees a whole grid stage",
                    f"place '{r.name}' in global (a second kernel), or read it after the run",
                )
                return
    last = grid[-1]
    for i in range(grid[0], last):
        s = stages[i]
        if s.placement != Placement.GRID and not (
            s.placement == Placement.REGISTER and not s.is_scalar and s.output is None
        ):
            state.err(
                s.span,
                f"'{s.name}' lies between stages in grid; the stages in grid of a region "
                "must follow one another",
                "move it before the first stage in grid or after the last",
            )
            return
    per = state.per
    for s in stages[last + 1 :]:
        problem = None
        own = sorted(
            r.name
            for r in _reads(s)
            if per is not None and r.indices[:1] == (per,) and r.placement != Placement.GRID
        )
        if own:
            assert per is not None
            state.err(
                s.span,
                f"'{s.name}' runs in the last workgroup, after the stages in grid, and reads "
                f"'{own[0]}', a value of each workgroup's own '{per.name}'",
                f"place '{own[0]}' in grid and read it at the '{per.name}' it needs",
            )
            return
        if s.placement in (Placement.SLICES, Placement.GLOBAL) and s.output is None:
            problem = f"'{s.name}' cannot be in {s.placement.value}"
        elif s.layout is not None and s.layout.row_unit == Scope.WORKGROUP:
            problem = f"the rows of '{s.name}' cannot go to workgroups"
        if problem is not None:
            state.err(
                s.span,
                f"after its stages in grid the region runs in one workgroup: {problem}",
                "place it in register or shared, and its rows on subgroups or lanes",
            )
            return
