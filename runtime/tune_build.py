"""`fusec tune`: build each candidate schedule and keep those the checker and the budget accept.

Input: the `.fuse` text, the region, the schedules (runtime/tune.py) and the target whose budget
judges them.  Output: `Candidate`s (the schedule, its build folder, the fused kernels' estimate
on the target) and a `Dropped` tally: refused by the checker (its first diagnostic), by the
budget gate (the same `capability_refusal` + `judge` as any fusion, codegen/budget.py), or the
same kernels as an earlier candidate (a layout the region's lowering ignores).  Each candidate is
compiled with `codegen.build` into a folder of its own under one temporary folder; the user's
object cache (codegen/objcache.py) spares the compiler the kernels it has seen.

Not done here: running anything on a device (runtime/tune_time.py).
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import re
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs

from fusec.codegen import manifest_records as mr
from fusec.codegen.budget import budget_for, capability_refusal, judge
from fusec.codegen.targets import Target
from fusec.dsl.diagnostics import DiagnosticError, error

from .dispatch import Build
from .gate import default_wave
from .tune import Schedule, Subject, apply_schedule, concrete_name

BUDGET_RULE = re.compile(r"\s*(waves|vgprs|spills)\s*(>=|<=)\s*(\d+)\s*")


@attrs.frozen
class Candidate:
    schedule: Schedule
    build: Build
    baseline: bool
    region: str  # the region of `build` that runs it (`gated_ffn_q4_0__sm90`)
    # the fused kernels' estimates on the judging target at `wave` (empty without a target)
    wave: int | None
    estimates: tuple[tuple[mr.Kernel, mr.Estimate], ...]
    verdict: str  # "within budget", or the refusal a baseline keeps


@attrs.define
class Dropped:
    """Candidates left out, by stage and reason (one reason counts each candidate once)."""

    reasons: collections.Counter[tuple[str, str]] = attrs.Factory(collections.Counter)

    def add(self, stage: str, reason: str) -> None:
        self.reasons[(stage, reason)] += 1

    def count(self, stage: str) -> int:
        return sum(n for (s, _), n in self.reasons.items() if s == stage)

    def to_json(self) -> list[dict[str, object]]:
        return [{"stage": s, "reason": r, "count": n} for (s, r), n in sorted(self.reasons.items())]


def budget_rules(items: Sequence[str], target: str | None) -> tuple[mr.BudgetRule, ...]:
    """`--budget waves>=8` (and `vgprs<=N`, `spills<=N`) as rules that beat the region's own
    on the judging target; a malformed one is refused in one sentence."""
    rules = []
    for item in items:
        m = BUDGET_RULE.fullmatch(item)
        want = {"waves": ">=", "vgprs": "<=", "spills": "<="}
        if m is None or want[m.group(1)] != m.group(2):
            raise error(None, f"--budget takes waves>=N, vgprs<=N or spills<=N, not '{item}'")
        rules.append(mr.BudgetRule(m.group(1), int(m.group(3)), target))
    return tuple(rules)


def _number_free(message: str) -> str:
    """A diagnostic's message with its numbers kept: the reasons are counted as written."""
    return message.splitlines()[0]


def judge_region(
    region: mr.Region,
    target: Target,
    wave: int,
    extra: tuple[mr.BudgetRule, ...],
    min_waves: int | None,
) -> tuple[str | None, tuple[tuple[mr.Kernel, mr.Estimate], ...]]:
    """(refusal or None, the fused kernels' estimates) on `target` at `wave`, as the build's
    verdicts judge a fusion, with `extra` rules on top of the region's."""
    budget = budget_for(target.name, (*region.budget, *extra), min_waves)
    ests = []
    why = None
    for k in region.fused:
        est = k.estimate(target.name, wave)
        if est is None:
            continue
        ests.append((k, est))
        if why is not None:
            continue
        lacks = capability_refusal(target, k, est.lds_bytes, wave)
        if lacks is not None:
            why = f"{target.name}: {k.name}: {lacks}"
            continue
        ok, reason = judge(target.name, wave, est, budget)
        if not ok:
            why = f"{k.name}: {reason}"
    return why, tuple(ests)


def build_candidates(
    text: str,
    path: str,
    subject: Subject,
    schedules: Sequence[Schedule],
    folder: Path,
    lines_for: str,
    target: Target | None,
    wave_for: Callable[[mr.Kernel], int] | None,
    extra: tuple[mr.BudgetRule, ...] = (),
    min_waves: int | None = None,
    advance: Callable[[], None] = lambda: None,
) -> tuple[list[Candidate], Dropped]:
    """Build every schedule, as schedule lines for target `lines_for`, into a folder of
    `folder` named by its text (the first is the
    baseline, kept whatever the budget says so that the others have something to be compared
    with) and judge it on `target` at the wave `wave_for(first fused kernel)` gives (default:
    the wave the target's driver picks).  A candidate whose folder is already there (`fusec
    tune --keep DIR` on an earlier run, maybe on another machine) is checked but not
    compiled again, so the timing machine needs no compiler."""
    out: list[Candidate] = []
    dropped = Dropped()
    seen: dict[tuple[object, ...], str] = {}
    for i, s in enumerate(schedules):
        baseline = i == 0
        try:
            applied = apply_schedule(text, path, subject, s, lines_for)
            region = concrete_name(applied, path, subject, lines_for)
            build = _built(applied, path, region, folder)
        except DiagnosticError as exc:
            if baseline:
                raise
            dropped.add("checker", _number_free(exc.diagnostics[0].message))
            advance()
            continue
        r = build.region(region)
        key = (r.launch, *((k.sha256, k.workgroup_size, repr(k.grid)) for k in r.fused))
        if key in seen:
            dropped.add("duplicate", f"the same kernels and launch as {seen[key]}")
            advance()
            continue
        seen[key] = s.label()
        why: str | None = None
        ests: tuple[tuple[mr.Kernel, mr.Estimate], ...] = ()
        wave: int | None = None
        if target is not None:
            first = r.fused[0]
            wave = (
                wave_for(first)
                if wave_for is not None
                else default_wave(target, first.workgroup_size, first.subgroup)
            )
            why, ests = judge_region(r, target, wave, extra, min_waves)
        if why is not None and not baseline:
            dropped.add("budget", _budget_reason(why))
            advance()
            continue
        out.append(Candidate(s, build, baseline, region, wave, ests, why or "within budget"))
        advance()
    return out, dropped


def _built(text: str, path: str, region: str, folder: Path) -> Build:
    """The build of `region` of `text`: loaded from `folder/<hash of the text>` when an intact
    build is there (after the checker has passed the text), else compiled into it."""
    from fusec.codegen.build import build_source, check_source, write_build

    key = hashlib.sha256(f"{path}\0{region}\0{text}".encode()).hexdigest()[:20]
    out = folder / f"{region}-{key}"
    if (out / "manifest.json").is_file():
        check_source(text, path)
        with contextlib.suppress(DiagnosticError):
            return Build.load(out)
    result = build_source(text, path, regions=(region,))
    return Build.load(write_build(result, out))


def _budget_reason(why: str) -> str:
    """The refusal without the kernel's own numbers (`gfx1201 wave64: 12 VGPRs would spill
    (demand 268), budget 0` -> `VGPRs would spill`), so that alike refusals count together."""
    if "needs" in why:
        return why
    for words in ("would spill", "VGPRs >", "waves per SIMD"):
        if words in why:
            head = why.split(": ", 2)
            return f"{head[1] if len(head) > 2 else head[0]}: {words.removesuffix(' >')}"
    return why
