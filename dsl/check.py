"""Semantic checks: `syntax.Module` -> `ir.Program`, or a DiagnosticError listing every problem.

The driver: per region, it runs the checker's passes in order over one `CheckState`
(check_state.py), the record of the target limits, the diagnostics and what earlier passes
decided:

0. `expand_instances` (instances.py): each instance of a generic region with its dtypes bound;
   `expand_groups` (compose.py) on those: stage groups' uses become ordinary stages; then each
   instance's schedule lines apply (schedule.py), so they may name a group's inner stages;
1. `resolve_names` (check_names.py): constants, their ranges, the buffers and their shapes;
2. `check_launch`, `check_budget` (check_launch.py): the launch shape and the budget;
3. `check_tile` or `check_per` (check_tiles.py): how the region spreads over workgroups and lanes;
4. `check_stages` (check_stages.py): each stage in order, its left side, the extents of its
   indices (`infer_extents`, check_extents.py), its value (`type_expression`, check_exprs.py,
   with index arithmetic checked by check_indices.py) and its placement (check_placement.py);
   a topk stage, argmax and argmin, and integer values by check_select.py;
5. what concerns several stages: readers of a stage in slices, stages in grid and those after
   them (check_grid.py), a register tile's size, outputs never assigned.

Index arithmetic must stay within its dimensions and never divide by 0, and repeat counts within
0 .. MAX_REPEAT_COUNT, at the constants' settings dsl/bounds.py tries.

Not checked here: anything that depends on a device or target besides the `Limits` passed in
(the subgroup sizes a device offers, register budgets); codegen and the runtime do that.  Nor
relations between constants that their ranges cannot state (dsl/bounds.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from . import ir
from . import syntax as S
from .check_grid import check_grid_stages
from .check_launch import check_budget, check_launch
from .check_names import resolve_names
from .check_placement import check_slice_readers
from .check_stages import check_stages
from .check_state import DEFAULT_LIMITS, CheckState, Limits, Names
from .check_tiles import (
    check_group,
    check_per,
    check_tile,
    check_tile_registers,
    check_version_names,
)
from .check_writes import check_coverage
from .compose import expand_groups
from .diagnostics import Diagnostic, DiagnosticError
from .instances import expand_instances
from .span import Span
from .types import DType

__all__ = ["Limits", "check"]


def check(
    module: S.Module,
    limits: Limits = DEFAULT_LIMITS,
    known_targets: Sequence[str] | None = None,
) -> ir.Program:
    """Resolve and check a parsed module.  Raises DiagnosticError with every problem found.
    `limits` are those of the targets built for (codegen.build passes them); `known_targets`
    (from codegen) validates target names in budgets; None skips that check."""
    # stage groups' uses become ordinary stages (compose.py) in each instance, after its dtypes
    # are bound (a group's dtypes come from its arguments) and before its schedule lines apply
    # (a schedule line may name a group's inner stage)
    found: list[Diagnostic] = []

    def expand(bound: tuple[S.Region, ...]) -> tuple[S.Region, ...]:
        try:
            return expand_groups(attrs.evolve(module, regions=bound)).regions
        except DiagnosticError as e:
            raise DiagnosticError([*_merged(found), *e.diagnostics]) from None

    concrete, diags = expand_instances(module, known_targets, expand, found)
    seen: dict[str, Span] = {}
    regions = []
    for r in concrete:
        n_before = len(diags)
        region = check_region(CheckState(limits, known_targets, diags), r, seen)
        if region is not None:
            regions.append(attrs.evolve(region, instance=r.instance))
        if r.instance is not None:
            note = f"in instance {r.instance.display}"
            if r.name_span is not None and not r.span.start <= r.name_span.start < r.span.end:
                # made by an `instance NAME = R<...> with ...` line: name it and point there
                line = " ".join(r.name_span.source.line_text(r.name_span.line_col()[0]).split())
                note = f"in instance {r.name}, {r.name_span}: {line}"
            diags[n_before:] = [
                d if d.note else attrs.evolve(d, note=note) for d in diags[n_before:]
            ]
    diags = _merged(diags)
    if not module.regions:
        diags.append(
            Diagnostic(
                None,
                f"{module.path} defines no region",
                "start one with: region name(x: f32[K]) -> y: f32[K]",
            )
        )
    if diags:
        raise DiagnosticError(diags)
    return ir.Program(module.path, tuple(regions))


def _merged(diags: list[Diagnostic]) -> list[Diagnostic]:
    """One diagnostic for the same problem in several instances, its note naming them all."""
    out: list[Diagnostic] = []
    where: dict[tuple[object, str], int] = {}
    for d in diags:
        key = ((d.span.source.path, d.span.start, d.span.end) if d.span else None, d.message)
        at = where.get(key)
        if at is not None and d.note and out[at].note and d.note.startswith("in instance "):
            shown = out[at].note
            assert shown is not None
            first = shown.removeprefix("in instances ").removeprefix("in instance ")
            more = d.note.removeprefix("in instance ")
            out[at] = attrs.evolve(out[at], note=f"in instances {first}, {more}")
            continue
        where[key] = len(out)
        out.append(d)
    return out


def check_region(state: CheckState, r: S.Region, seen: dict[str, Span]) -> ir.Region | None:
    """One region, its passes run in order; None when it has errors (in `state.diags`).  `seen`
    holds the regions before it, by name."""
    if r.name in seen:
        line = seen[r.name].line_col()[0]
        state.err(
            r.name_span,
            f"region '{r.name}' is already defined on line {line}",
            "give each region a unique name",
        )
    seen[r.name] = r.name_span
    n_before = len(state.diags)
    names = Names()
    consts, inputs, outputs = resolve_names(state, r, names)
    launch = check_launch(state, r)
    budget = check_budget(state, r)
    state.tile = check_tile(state, r, names, launch) if r.tile is not None else None
    state.per = check_per(state, r, names) if r.per is not None else None
    if r.per is not None and state.per is None:
        return None
    if r.per is not None and r.per.group is not None and state.per is not None:
        state.group = check_group(state, r, names, state.per)
        if state.group is None:
            return None
    if r.tile is not None and state.tile is None:
        # the tile is wrong: its stages cannot be checked without it (no cascade)
        return None
    if r.tile is not None:
        check_version_names(state, r)
    stages = check_stages(state, r, names, launch)
    flat = [x for s in stages for x in (s.stages if isinstance(s, ir.Repeat) else (s,))]
    if state.tile is not None:
        check_tile_registers(state, r, flat)
    else:
        check_slice_readers(state, flat)
    check_grid_stages(state, flat)
    if len(state.diags) == n_before:
        check_coverage(state, outputs, flat)
    written = {s.output.name for s in flat if s.output is not None} | names.poisoned
    for out in outputs:
        if out.name not in written:
            state.err(
                out.span,
                f"output '{out.name}' is never assigned",
                f"add a stage '{out.name}[...] = ...' to the region body",
            )
    if len(state.diags) > n_before or launch is None:
        return None
    runtime = [c for c in consts if c.runtime]
    params = (
        ir.Buffer(
            ir.PARAMS_BUFFER,
            DType.U32,
            (ir.Lit(len(runtime), DType.U32),),
            is_output=False,
            span=runtime[0].span,
        )
        if runtime
        else None
    )
    return ir.Region(
        r.name,
        inputs,
        outputs,
        consts,
        launch,
        tuple(stages),
        span=r.span,
        budget=budget,
        tile=state.tile,
        per=state.per,
        group=state.group,
        params=params,
    )
