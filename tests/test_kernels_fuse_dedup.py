"""kernels.fuse writes each algorithm once (issue 18): no run of two or more body lines may
appear in two regions; a repeated single line (a `launch` line, `y[n] = r[n] + p[n]`) is
allowed.  Lines compare with their whitespace normalized and their comments removed.

Run as a script (`python -m tests.test_kernels_fuse_dedup`) it prints every body line found in
more than one region and every repeated run, with the regions holding them.

Today's state: the stage runs left are in the dtype families of issue 18 item 1
(OWNED_ELSEWHERE: gated_ffn_down* repeat gated_ffn's gate and up, the two *_dequant regions
each other); the other regions repeat stage lines only as one-liners.  Declarations (`const`,
`param`, `launch`) repeat in runs too.  The KNOWN_* counts are today's: lower them as regions
are rewritten (the test fails when a count grows, and says so when it falls).
"""

from __future__ import annotations

import itertools
import re
from collections import defaultdict
from pathlib import Path

from fusec.dsl import syntax as S
from fusec.dsl.parse import parse_file

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ROOT / "kernels.fuse"

# the families dtype-generic regions replace (issue 18 item 1)
OWNED_ELSEWHERE = ("rms_norm_mul_matvec", "gated_ffn", "rms_norm_gated_ffn", "matvec_add")
KNOWN_STAGE_RUNS = 2  # repeated runs of stage lines, all within OWNED_ELSEWHERE regions
KNOWN_RUNS = 9  # repeated runs of body lines of any kind

_DECLARATION = re.compile(r"(const|param|launch|budget|tile|per)\b")


def body_lines(region: S.Region) -> list[str]:
    """The region's body, one normalized line per source line (comments and blank lines
    dropped)."""
    source = region.span.source
    starts = [
        x.span.start
        for x in (*region.consts, *region.launch, *region.budget, *region.stages)
        if x.span.start > region.name_span.end
    ]
    if region.tile is not None:
        starts.append(region.tile.span.start)
    if region.per is not None:
        starts.append(region.per.span.start)
    first = source.line_col(min(starts))[0]
    last = source.line_col(max(region.span.end - 1, min(starts)))[0]
    lines = []
    for n in range(first, last + 1):
        text = " ".join(source.line_text(n).split("#", 1)[0].split())
        if text:
            lines.append(text)
    return lines


def repeated_runs(bodies: dict[str, list[str]]) -> dict[tuple[str, ...], set[str]]:
    """Every maximal run of two or more consecutive lines that two regions share -> the
    regions holding it."""
    runs: dict[tuple[str, ...], set[str]] = defaultdict(set)
    names = list(bodies)
    for a_i, a in enumerate(names):
        for b in names[a_i + 1 :]:
            la, lb = bodies[a], bodies[b]
            for i in range(len(la)):
                for j in range(len(lb)):
                    if la[i] != lb[j] or (i and j and la[i - 1] == lb[j - 1]):
                        continue
                    n = 0
                    while i + n < len(la) and j + n < len(lb) and la[i + n] == lb[j + n]:
                        n += 1
                    if n >= 2:
                        runs[tuple(la[i : i + n])].update((a, b))
    return dict(runs)


def _is_stage(line: str) -> bool:
    return not _DECLARATION.match(line) and not line.startswith("repeat ")


def _report() -> tuple[dict[str, set[str]], dict[tuple[str, ...], set[str]]]:
    module = parse_file(KERNELS)
    bodies = {r.name: body_lines(r) for r in module.regions}
    where: dict[str, set[str]] = defaultdict(set)
    for name, lines in bodies.items():
        for line in lines:
            where[line].add(name)
    lines = {line: regions for line, regions in where.items() if len(regions) > 1}
    return lines, repeated_runs(bodies)


def _stage_runs(runs: dict[tuple[str, ...], set[str]]) -> dict[tuple[str, ...], set[str]]:
    """The runs that hold at least two stage lines in a row."""
    out = {}
    for run, regions in runs.items():
        stage = [_is_stage(line) for line in run]
        if any(a and b for a, b in itertools.pairwise(stage)):
            out[run] = regions
    return out


def test_no_stage_run_repeats_outside_the_dtype_families() -> None:
    _, runs = _report()
    outside = {
        run: regions
        for run, regions in _stage_runs(runs).items()
        if not all(r.startswith(OWNED_ELSEWHERE) for r in regions)
    }
    assert not outside, "\n".join(f"{sorted(r)}: {list(run)}" for run, r in outside.items())


def test_repeated_runs_do_not_grow() -> None:
    _, runs = _report()
    stage_runs = _stage_runs(runs)
    assert len(stage_runs) <= KNOWN_STAGE_RUNS, sorted(stage_runs)
    assert len(runs) <= KNOWN_RUNS, sorted(runs)
    # a fall is progress: lower the counts above so that it stays
    assert (len(stage_runs), len(runs)) == (KNOWN_STAGE_RUNS, KNOWN_RUNS), (
        f"lower KNOWN_STAGE_RUNS to {len(stage_runs)} and KNOWN_RUNS to {len(runs)}"
    )


def test_the_checker_finds_a_planted_run() -> None:
    bodies = {
        "a": ["const K = 8", "x = 1", "y = x + 1", "z = y"],
        "b": ["x = 1", "y = x + 1", "w = 2"],
        "c": ["x = 1", "w = 2"],
    }
    runs = repeated_runs(bodies)
    assert runs == {("x = 1", "y = x + 1"): {"a", "b"}}
    assert _stage_runs(runs) == runs
    assert _stage_runs({("const K = 8", "x = 1"): {"a", "b"}}) == {}


def main() -> None:
    lines, runs = _report()
    print(f"{len(lines)} body line(s) in more than one region:")
    for line, regions in sorted(lines.items(), key=lambda x: (-len(x[1]), x[0])):
        print(f"  {len(regions):2d}x  {line}")
    stage_runs = _stage_runs(runs)
    print(f"{len(runs)} repeated run(s) of 2+ lines, {len(stage_runs)} with stage lines:")
    for run, regions in sorted(runs.items(), key=lambda x: sorted(x[1])):
        mark = "stages" if run in stage_runs else "decls "
        print(f"  [{mark}] {', '.join(sorted(regions))}")
        for line in run:
            print(f"      {line}")


if __name__ == "__main__":
    main()
