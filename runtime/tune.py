"""`fusec tune`: schedules of one region, what applies them to the source and what renders them.

Input: a `.fuse` text and a region name.  Output: the region's schedule as written today (the
baseline) and the schedules to try (`enumerate_schedules`), each a frozen `Schedule`: the launch
fields (workgroup size, rows per subgroup) and, per contraction stage, where its rows go
(`n -> subgroup` or `n -> workgroup`) and how many consecutive elements of the reduced index a
lane takes per step (`k -> lane x N`).

One function applies a schedule to the source (`apply_schedule`) and one renders it as the
source lines it stands for (`render_schedule`).  Until the language has `schedule` lines (issue
18, item 2), both edit the region's existing `launch` clause and each contraction's `layout`
clause, located by the parser's spans; only the items whose value changes are rewritten, so every
other byte of the file stays as it was.  When schedule lines land, these two functions are the
ones to switch.

Not decided here: whether a schedule is valid (the checker, when the candidate is built), within
budget (runtime/tune_build.py) or fast (runtime/tune_time.py, runtime/tune_rank.py).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

import attrs

from fusec.dsl import syntax as S
from fusec.dsl.diagnostics import Diagnostic, DiagnosticError
from fusec.dsl.parse import parse

WORKGROUPS = (64, 128, 256, 512, 1024)
ROWS_PER_SUBGROUP = (1, 2, 3, 4, 8)
ROW_UNITS = ("subgroup", "workgroup")


@attrs.frozen
class StageLayout:
    """One contraction's layout: `index -> rows` for its rows, `reduced -> lane x vector`."""

    stage: str
    rows: str  # "subgroup" | "workgroup"
    vector: int


@attrs.frozen
class Schedule:
    """The launch fields and the per-stage layouts of one candidate.  `rows_per_subgroup` is
    None for a region whose launch names none (and keeps none)."""

    workgroup: int
    rows_per_subgroup: int | None
    layouts: tuple[StageLayout, ...]

    def label(self) -> str:
        """A short name: `wg256 r2 gate,up:subgroup/x8`."""
        parts = [f"wg{self.workgroup}"]
        if self.rows_per_subgroup is not None:
            parts.append(f"r{self.rows_per_subgroup}")
        groups: dict[tuple[str, int], list[str]] = {}
        for lay in self.layouts:
            groups.setdefault((lay.rows, lay.vector), []).append(lay.stage)
        for (rows, vector), stages in groups.items():
            parts.append(f"{','.join(stages)}:{rows}/x{vector}")
        return " ".join(parts)

    def to_json(self) -> dict[str, object]:
        return {
            "workgroup": self.workgroup,
            "rows_per_subgroup": self.rows_per_subgroup,
            "layouts": [
                {"stage": x.stage, "rows": x.rows, "vector": x.vector} for x in self.layouts
            ],
        }


@attrs.frozen
class Contraction:
    """A stage whose layout names a row unit and a lane: its items and its weight's dtype."""

    stage: S.Stage
    rows_item: S.LayoutItem
    lane_item: S.LayoutItem
    weight_dtype: str


def _fail(message: str, hint: str | None = None) -> DiagnosticError:
    return DiagnosticError([Diagnostic(None, message, hint)])


def find_region(text: str, path: str, name: str) -> S.Region:
    """The syntax of region `name` (a diagnostic listing the regions when there is none)."""
    module = parse(text, path)
    for r in module.regions:
        if r.name == name:
            return r
    known = ", ".join(r.name for r in module.regions) or "none"
    raise _fail(f"no region '{name}' in {path}", f"regions: {known}")


def _stages(r: S.Region) -> Iterable[S.Stage]:
    for s in r.stages:
        if isinstance(s, S.Repeat):
            yield from s.stages
        else:
            yield s


def _accesses(e: S.Expr) -> Iterable[S.Access]:
    match e:
        case S.Access():
            yield e
            for i in e.indices:
                yield from _accesses(i)
        case S.Call():
            for a in e.args:
                yield from _accesses(a)
        case S.Reduce():
            yield from _accesses(e.body)
        case S.BinOp():
            yield from _accesses(e.lhs)
            yield from _accesses(e.rhs)
        case S.Neg():
            yield from _accesses(e.value)
        case _:
            return


def contractions(r: S.Region) -> list[Contraction]:
    """The stages a schedule lays out: a layout of one row item (`-> subgroup`/`-> workgroup`)
    and one lane item.  The weight is the first input of two or more dimensions the stage reads
    (its dtype decides the vector widths worth trying); `f32` when it reads none."""
    params = {p.name: p for p in r.params}
    out = []
    for s in _stages(r):
        rows = [x for x in s.layout if x.unit in ROW_UNITS]
        lanes = [x for x in s.layout if x.unit == "lane"]
        if len(rows) != 1 or len(lanes) != 1 or len(s.layout) != 2:
            continue
        dtype = "f32"
        for a in _accesses(s.value):
            p = params.get(a.name)
            if p is not None and len(p.type.shape) >= 2:
                dtype = p.type.dtype
                break
        out.append(Contraction(s, rows[0], lanes[0], dtype))
    return out


def _launch_items(r: S.Region) -> dict[str, S.LaunchItem]:
    return {it.key: it for it in r.launch}


def schedule_of(r: S.Region) -> Schedule:
    """The region's schedule as its source writes it today (the baseline); `r` has passed the
    checker."""
    items = _launch_items(r)
    wg = items.get("workgroup")
    assert wg is not None and wg.kind == "int", "the checker requires a workgroup size"
    rows = items.get("rows_per_subgroup")
    return Schedule(
        wg.values[0],
        rows.values[0] if rows is not None and rows.kind == "int" else None,
        tuple(
            StageLayout(c.stage.name, c.rows_item.unit, c.lane_item.vector) for c in contractions(r)
        ),
    )


def vector_widths(dtype: str, baseline: int) -> tuple[int, ...]:
    """The `lane x N` worth trying for a weight of `dtype`: a quantized weight takes a whole
    32-element block per lane on the integer-dot path (baseline 32) or 8/16 when dequantized;
    f16 2..8 halves (up to a 16-byte load), f32 1..4 floats.  The baseline is always in."""
    if dtype.startswith("q"):
        widths: tuple[int, ...] = (32,) if baseline == 32 else (8, 16)
    elif dtype == "f16":
        widths = (2, 4, 8)
    else:
        widths = (1, 2, 4)
    return tuple(sorted({*widths, baseline}))


@attrs.frozen
class Filters:
    """Narrow the enumeration (`--workgroups`, `--rows`, `--max-candidates`)."""

    workgroups: tuple[int, ...] = ()
    rows: tuple[int, ...] = ()
    max_candidates: int | None = None


def enumerate_schedules(
    r: S.Region, max_workgroup: int = 1024, filters: Filters | None = None
) -> list[Schedule]:
    """Every schedule to try, the baseline first, then the others by how few fields differ from
    it (the nearest first, so `--max-candidates` keeps the baseline's neighbours).  Contractions
    that read the same weight dtype with the same baseline layout (the gate and up projections
    of an FFN) take the same choice.  Validity is left to the checker."""
    f = filters or Filters()
    base = schedule_of(r)
    groups: dict[tuple[str, str, int], list[int]] = {}
    cons = contractions(r)
    for i, c in enumerate(cons):
        key = (c.weight_dtype, c.rows_item.unit, c.lane_item.vector)
        groups.setdefault(key, []).append(i)
    wgs = [w for w in WORKGROUPS if w <= max_workgroup]
    wgs = [w for w in wgs if not f.workgroups or w in f.workgroups]
    if base.rows_per_subgroup is None and not cons:
        rows_opts: list[int | None] = [None]
    else:
        rows_opts = [n for n in ROWS_PER_SUBGROUP if not f.rows or n in f.rows]
    group_opts = [
        [(unit, v) for unit in ROW_UNITS for v in vector_widths(dtype, vector)]
        for (dtype, _, vector) in groups
    ]
    found = []
    for wg, rows, choice in itertools.product(wgs, rows_opts, itertools.product(*group_opts)):
        layouts = list(base.layouts)
        for (unit, vector), members in zip(choice, groups.values(), strict=True):
            for i in members:
                layouts[i] = StageLayout(cons[i].stage.name, unit, vector)
        found.append(Schedule(wg, rows, tuple(layouts)))
    others = sorted((s for s in found if s != base), key=lambda s: _distance(s, base))
    out = [base, *others]
    if f.max_candidates is not None:
        out = out[: max(1, f.max_candidates)]
    return out


def _distance(s: Schedule, base: Schedule) -> int:
    d = (s.workgroup != base.workgroup) + (s.rows_per_subgroup != base.rows_per_subgroup)
    return d + sum(a != b for a, b in zip(s.layouts, base.layouts, strict=True))


def _edits(text: str, r: S.Region, schedule: Schedule) -> list[tuple[int, int, str]]:
    """(start, end, replacement) for each item whose value the schedule changes."""
    edits = []
    items = _launch_items(r)
    wg = items["workgroup"]
    if wg.values[0] != schedule.workgroup:
        edits.append((wg.span.start, wg.span.end, f"workgroup {schedule.workgroup}"))
    rows = items.get("rows_per_subgroup")
    n = schedule.rows_per_subgroup
    if rows is not None and n is not None and rows.values[0] != n:
        edits.append((rows.span.start, rows.span.end, f"rows_per_subgroup {n}"))
    elif rows is None and n is not None:
        end = max(it.span.end for it in r.launch)
        edits.append((end, end, f", rows_per_subgroup {n}"))
    elif rows is not None and n is None:
        raise AssertionError("a schedule drops rows_per_subgroup only where the region has none")
    cons = contractions(r)
    assert len(cons) == len(schedule.layouts), "a schedule of another region"
    for c, lay in zip(cons, schedule.layouts, strict=True):
        if c.rows_item.unit != lay.rows:
            edits.append(
                (c.rows_item.span.start, c.rows_item.span.end, f"{c.rows_item.index} -> {lay.rows}")
            )
        if c.lane_item.vector != lay.vector:
            lane = f"{c.lane_item.index} -> lane" + (f" x {lay.vector}" if lay.vector != 1 else "")
            edits.append((c.lane_item.span.start, c.lane_item.span.end, lane))
    return sorted(edits)


def apply_schedule(text: str, path: str, region: str, schedule: Schedule) -> str:
    """`text` with region `region`'s launch and layout clauses rewritten to `schedule`; every
    byte outside the changed items is kept."""
    r = find_region(text, path, region)
    out = text
    for start, end, new in reversed(_edits(text, r, schedule)):
        out = out[:start] + new + out[end:]
    return out


def render_schedule(text: str, path: str, region: str, schedule: Schedule) -> list[str]:
    """The source lines the schedule stands for: the `launch ...` clause, then `STAGE: layout
    ...` per contraction, read back from the applied text (so they are what --write writes)."""
    applied = apply_schedule(text, path, region, schedule)
    r = find_region(applied, path, region)
    first, last = r.launch[0].span, r.launch[-1].span
    lines = ["launch " + applied[first.start : last.end]]
    for c in contractions(r):
        items = c.stage.layout
        lines.append(f"{c.stage.name}: layout " + applied[items[0].span.start : items[-1].span.end])
    return lines


def changed_lines(before: str, after: str) -> list[int]:
    """1-based numbers of the lines that differ (same line count: edits never add lines)."""
    a, b = before.split("\n"), after.split("\n")
    assert len(a) == len(b)
    return [i + 1 for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]


def describe(schedules: Sequence[Schedule]) -> str:
    return ", ".join(s.label() for s in schedules)
