"""`fusec tune`: schedules of one instance of a region, what applies them to the source and what
renders them.

Input: a `.fuse` text, an instance (`gated_ffn<q4_0>`, its name `gated_ffn_q4_0`, or a region
without dtype parameters) and the target the schedule is for.  Output: the instance's schedule on
that target as the file gives it today (the baseline) and the schedules to try
(`enumerate_schedules`), each a frozen `Schedule`: the launch fields (workgroup size, rows per
subgroup) and, per contraction stage, where its rows go (`n -> subgroup` or `n -> workgroup`) and
how many consecutive elements of the reduced index a lane takes per step (`k -> lane x N`; the
widths follow the instance's weight dtype).

One function applies a schedule to the source (`apply_schedule`) and one renders it as the
source lines it stands for (`render_schedule`): `schedule on T when Wt = q4_0: ...` lines (no
`when` for a region without dtype parameters) carrying only the settings that differ from what
the instance has on T without them, put at the end of the region's block, so that the choice
holds for that target and dtype only and every other instance and target keeps its kernels byte
for byte.  Lines an earlier run wrote (the same `on` and `when`, launch and layout settings) and
the `# tuned` comment above them are replaced in place; every other byte of the file is kept.

Not decided here: whether a schedule is valid (the checker, when the candidate is built), within
budget (runtime/tune_build.py) or fast (runtime/tune_time.py, runtime/tune_rank.py).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from fusec.dsl import syntax as S
from fusec.dsl.compose import expand_groups
from fusec.dsl.diagnostics import Diagnostic, DiagnosticError
from fusec.dsl.instances import expand_instances
from fusec.dsl.parse import parse
from fusec.dsl.region_names import resolve_regions

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

    @staticmethod
    def from_json(d: dict[str, Any]) -> Schedule:
        return Schedule(
            int(d["workgroup"]),
            None if d["rows_per_subgroup"] is None else int(d["rows_per_subgroup"]),
            tuple(StageLayout(x["stage"], x["rows"], int(x["vector"])) for x in d["layouts"]),
        )

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


@attrs.frozen
class Subject:
    """What is tuned: an instance of a generic region (`bindings` non-empty) or a plain region."""

    generic: str  # the region as written
    name: str  # the instance's name (`gated_ffn_q4_0`), the region's own for a plain one
    bindings: tuple[tuple[str, str], ...]

    @property
    def display(self) -> str:
        if not self.bindings:
            return self.generic
        return f"{self.generic}<{', '.join(d for _, d in self.bindings)}>"


def _expanded(text: str, path: str) -> tuple[S.Module, tuple[S.Region, ...]]:
    module = parse(text, path)

    def expand(bound: tuple[S.Region, ...]) -> tuple[S.Region, ...]:
        # stage groups expand in each instance before its schedule lines apply, as in check()
        return expand_groups(attrs.evolve(module, regions=bound)).regions

    regions, diags = expand_instances(module, None, expand)
    if diags:
        raise DiagnosticError(diags)
    return module, regions


def resolve(text: str, path: str, spec: str) -> Subject:
    """The instance `spec` names: `gated_ffn<q4_0>`, `gated_ffn_q4_0` or a plain region."""
    _, regions = _expanded(text, path)
    # a target's variant (`R<q4_0> on sm90`) is tuned through its instance, not on its own
    tunable = [r for r in regions if r.instance is None or r.instance.target is None]
    (name,) = resolve_regions(tunable, (spec,), path)
    r = next(r for r in tunable if r.name == name)
    if r.instance is None:
        return Subject(r.name, r.name, ())
    return Subject(r.instance.generic, r.name, r.instance.bindings)


def instance_region(text: str, path: str, subject: Subject, target: str | None) -> S.Region:
    """The instance as the checker sees it on `target`: its variant for `target` where the
    file has `on` lines that hold for it, else the one for every target."""
    _, regions = _expanded(text, path)
    by_name = {r.name: r for r in regions}
    if target is not None and f"{subject.name}__{target}" in by_name:
        return by_name[f"{subject.name}__{target}"]
    return by_name[subject.name]


def find_region(text: str, path: str, spec: str, target: str | None = None) -> S.Region:
    """The syntax of instance or region `spec` on `target` (a diagnostic listing the regions
    when there is none)."""
    return instance_region(text, path, resolve(text, path, spec), target)


def concrete_name(text: str, path: str, subject: Subject, target: str | None) -> str:
    """The name of the region that runs `subject` on `target` in `text`."""
    return instance_region(text, path, subject, target).name


# the first line of the comment `--write` puts above the lines it writes; further lines of it
# start with `#   `
TUNED_MARK = "# tuned "


def _line_bounds(text: str, start: int, end: int) -> tuple[int, int]:
    """The whole lines holding text[start:end], newline included."""
    a = text.rfind("\n", 0, start) + 1
    b = text.find("\n", end)
    return a, (len(text) if b < 0 else b + 1)


def _when_of(subject: Subject) -> str:
    if not subject.bindings:
        return ""
    if len(subject.bindings) > 1:
        raise _fail(
            f"tune writes instances of one dtype parameter; {subject.display} has "
            f"{len(subject.bindings)}"
        )
    param, dtype = subject.bindings[0]
    return f" when {param} = {dtype}"


def _ours(line: S.Schedule, subject: Subject, target: str) -> bool:
    """A launch or layout line for exactly this target and instance (as `--write` writes)."""
    if line.target is None or line.target.id != target:
        return False
    if not isinstance(line.body, S.ScheduleLaunch | S.ScheduleLayout):
        return False
    if not subject.bindings:
        return line.when is None
    if line.when is None or len(line.when[1]) != 1:
        return False
    return (line.when[0].id, line.when[1][0].id) == subject.bindings[0]


def _strip(text: str, path: str, subject: Subject, target: str) -> tuple[str, int | None]:
    """`text` without the lines an earlier `--write` wrote for this instance and target (and
    the `# tuned` comment above them); the offset where they were (None: there were none)."""
    module = parse(text, path)
    region = next(r for r in module.regions if r.name == subject.generic)
    cuts: list[tuple[int, int]] = []
    for line in region.schedules:
        if not _ours(line, subject, target):
            continue
        a, b = _line_bounds(text, line.span.start, line.span.end)
        # the comment lines right above it: `#   ...` continuations under a `# tuned ...`
        above = a
        k = above
        while k > 0:
            prev = text.rfind("\n", 0, k - 1) + 1
            stripped = text[prev:k].strip()
            if stripped.startswith("#   "):
                k = prev
                continue
            if stripped.startswith(TUNED_MARK):
                above = prev
            break
        cuts.append((above, b))
    if not cuts:
        return text, None
    out = text
    for a, b in sorted(cuts, reverse=True):
        out = out[:a] + out[b:]
    return out, min(a for a, _ in cuts)


def schedule_lines(text: str, path: str, subject: Subject, target: str, s: Schedule) -> list[str]:
    """The schedule lines (no indent) that give `subject` the schedule `s` on `target` on top of
    `text` without the lines an earlier `--write` wrote: only the settings that differ."""
    base_text, _ = _strip(text, path, subject, target)
    r = instance_region(base_text, path, subject, target)
    base = schedule_of(r)
    head = f"schedule on {target}{_when_of(subject)}: "
    launch = []
    if s.workgroup != base.workgroup:
        launch.append(f"workgroup {s.workgroup}")
    if s.rows_per_subgroup is not None and s.rows_per_subgroup != base.rows_per_subgroup:
        launch.append(f"rows_per_subgroup {s.rows_per_subgroup}")
    lines = [head + ", ".join(launch)] if launch else []
    cons = contractions(r)
    assert len(cons) == len(s.layouts), "a schedule of another region"
    groups: dict[str, list[str]] = {}
    for c, lay in zip(cons, s.layouts, strict=True):
        items = []
        if c.rows_item.unit != lay.rows:
            items.append(f"{c.rows_item.index} -> {lay.rows}")
        if c.lane_item.vector != lay.vector:
            items.append(
                f"{c.lane_item.index} -> lane" + (f" x {lay.vector}" if lay.vector != 1 else "")
            )
        if items:
            groups.setdefault(", ".join(items), []).append(c.stage.name)
    lines += [f"{head}{', '.join(st)} layout {items}" for items, st in groups.items()]
    return lines


def _comment(comment: str, width: int = 100) -> list[str]:
    """`# tuned ...` and `#   ...` continuation lines of at most `width` characters."""
    out: list[str] = []
    words = comment.split()
    line = TUNED_MARK.rstrip()
    for w in words:
        if len(line) + 1 + len(w) > width and line.strip("# "):
            out.append(line)
            line = "#  "
        line += " " + w
    out.append(line)
    return out


def apply_schedule(
    text: str,
    path: str,
    spec: str | Subject,
    schedule: Schedule,
    target: str,
    comment: str | None = None,
) -> str:
    """`text` with the schedule lines that give instance `spec` the schedule `schedule` on
    `target` (replacing those an earlier run wrote), under `# tuned <comment>` when given;
    every other byte is kept."""
    subject = spec if isinstance(spec, Subject) else resolve(text, path, spec)
    lines = schedule_lines(text, path, subject, target, schedule)
    out, where = _strip(text, path, subject, target)
    if not lines:
        return out
    module = parse(out, path)
    region = next(r for r in module.regions if r.name == subject.generic)
    last = max(
        x.span.end for x in (*region.stages, *region.schedules, *region.launch, *region.consts)
    )
    a, b = _line_bounds(out, last, last)
    indent = out[a:b][: len(out[a:b]) - len(out[a:b].lstrip())]
    at = b if where is None or where > b or where < region.span.start else where
    body = ([] if comment is None else _comment(comment, 100 - len(indent))) + lines
    block = "".join(f"{indent}{x}\n" for x in body)
    if at == len(out) and not out.endswith("\n"):
        block = "\n" + block
    return out[:at] + block + out[at:]


def render_schedule(
    text: str, path: str, spec: str | Subject, schedule: Schedule, target: str
) -> list[str]:
    """The source lines the schedule stands for: the schedule lines `--write` writes, or
    `(as the file has it)` when it writes none."""
    subject = spec if isinstance(spec, Subject) else resolve(text, path, spec)
    return schedule_lines(text, path, subject, target, schedule) or ["(as the file has it)"]


def changed_lines(before: str, after: str) -> list[int]:
    """1-based numbers of the lines of `after` that are not in `before` where they were."""
    import difflib

    a, b = before.split("\n"), after.split("\n")
    out: list[int] = []
    for tag, _, _, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag in ("replace", "insert"):
            out += range(j1 + 1, j2 + 1)
    return out


def describe(schedules: Sequence[Schedule]) -> str:
    return ", ".join(s.label() for s in schedules)
