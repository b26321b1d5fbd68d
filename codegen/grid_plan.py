"""A grid per stage: which workgroups compute each stage of a region with stages in grid.

Input: a checked grid region (dsl/check_grid.py has refused what cannot work: a per-workgroup
or tile region, a scalar in grid, two runs of grid stages, a grid stage reading another, and
after the run a stage needing the whole grid again).  Output: one `kir.StagePlan` per stage,
the decision `lower_fused` follows and the kernel carries for the printer, `explain` and
the manifest:
- before the run, scalars and shared arrays are computed by every workgroup (each needs them
  for its share), and outputs are spread over the grid as usual;
- the run is spread over the grid, each stage as its own layout says, and stored to a global
  scratch buffer;
- after the run, one workgroup computes the rest: the last to finish its share of the run,
  told by a device-scope counter (`kir.Arrive`).  So a small last stage (a softmax over 128
  values) no longer sets the grid of a wide contraction before it (128 x 4096).

Not decided here: the number of workgroups (the grid items of the stages in grid give it, as
for any kernel), or whether the split pays (a matter of measurement, docs/BENCHMARKS.md).
"""

from __future__ import annotations

from fusec.dsl import ir
from fusec.dsl.types import DType, Placement

from .kir import Distribution, StagePlan


def plan_grid(region: ir.Region) -> tuple[StagePlan, ...]:
    """Each stage's distribution; empty when no stage is in grid (one grid for the region)."""
    stages = region.all_stages()
    grid = [i for i, s in enumerate(stages) if s.placement == Placement.GRID]
    if not grid:
        return ()
    plan = []
    for i, s in enumerate(stages):
        if i > grid[-1]:
            dist = Distribution.LAST
        elif s.placement == Placement.GRID or s.output is not None:
            dist = Distribution.GRID
        else:
            dist = Distribution.EACH
        plan.append(StagePlan(s.name, dist))
    return tuple(plan)


def counter_buffer(region: ir.Region) -> ir.Buffer:
    """The arrival counter of a region with stages in grid (kir.Arrive): one u32, or one per
    group (`group h = g / M`), named `arrivals` unless a buffer or stage of the region has
    that name."""
    taken = {b.name for b in [*region.inputs, *region.outputs]}
    taken |= {s.name for s in region.all_stages()}
    name = "arrivals"
    while name in taken:
        name += "_"
    count = region.group.var.extent if region.group is not None else ir.Lit(1, DType.U32)
    return ir.Buffer(name, DType.U32, (count,), is_output=False, span=region.span)
