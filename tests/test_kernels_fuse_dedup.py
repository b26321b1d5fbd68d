"""kernels.fuse writes each algorithm once (issue 18): no run of two or more consecutive stage
lines appears in two regions or stage groups (KNOWN_STAGE_RUNS = 0); a repeated single stage
line (`y[n] = r[n] + p[n]`, a use `xn = rms_norm(x, g) in shared`) is allowed.  Lines compare
with their whitespace normalized and their comments removed.

Declaration lines (`const`, `param`, `launch`, `per`, `schedule`) may repeat, in runs too,
but only those in ALLOWED_DECLARATIONS, each with its reason: they state the problem size and
launch shape two algorithms run at (the same model's dimensions, the same measured launch), not
an algorithm. Two regions with the same `const NQ = 32 ...` line compute different things on
the same tensors; folding such lines together would couple regions that are tuned apart.  The
list is exact: a declaration that starts repeating must be added with a reason, one that stops
repeating must be removed.

Run as a script (`python -m tests.test_kernels_fuse_dedup`) it prints every body line found in
more than one region and every repeated run, with the regions holding them.
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

KNOWN_STAGE_RUNS = 0  # repeated runs of two or more stage lines: none

_SHAPES = "the decode layer's dimensions (Qwen3-8B), shared by regions that run on one tensor"
_LAUNCH = "a launch shape measured for each region on its own (docs/BENCHMARKS.md)"
_TUNED = "a schedule line fusec tune wrote for each region on its own (docs/TUNING.md)"
_POS = "the cache row's range, set by the cache the regions share"
# declaration lines allowed in more than one region -> why that is no copied algorithm
ALLOWED_DECLARATIONS: dict[str, str] = {
    "const NQ = 32 in 1 .. 256, NK = 8 in 1 .. 256, D = 128 in 1 .. 256, "
    "C = 1024 in 1 .. 131072": _SHAPES + " (attention_scores, attention_values)",
    "const NQ = 32 in 1 .. 256, NK = 8 in 1 .. 256, D = 128 in 1 .. 256, "
    "C = 1024 in 1 .. 16384": _SHAPES + " (the split attention and its combined form)",
    "const NQ = 32 in 1 .. 256, NK = 8 in 1 .. 256, D = 128 in 2 .. 256, "
    "C = 1024 in 1 .. 131072": _SHAPES + " (the two cache writes)",
    "const n_rot = 128 in 2 .. 256, eps = 1e-6, base = 1e6": "Qwen3's RoPE and norm constants",
    "const NS = 8 in 4 .. 1024": "the number of runs the cache is split into, which "
    "attention_split and attention_split_combine must agree on",
    "const H = 4096 in 1 .. 16384, F = 12288 in 1 .. 1048576": _SHAPES + " (the gated FFNs)",
    "const T = 1 in 1 .. 65536, D = 4096 in 1 .. 65536": "DeepSeek-V4's hidden size and tokens "
    "per step, shared by the hyper-connection stages",
    "launch workgroup 256, subgroup any, rows_per_subgroup 2": _LAUNCH,
    "launch workgroup 256, subgroup any, rows_per_subgroup 1": _LAUNCH,
    "launch workgroup 512, subgroup any, rows_per_subgroup 4": _LAUNCH,
    "launch workgroup 256": _LAUNCH,
    "param pos in 0 .. 16383": _POS,
    "param pos in 0 .. 131071": _POS,
    "param pos in 0 .. 16777215": _POS,
    "const D = 128": "the head size default of the two head-row groups (head_rows_sumsq "
    "states the default it assumes)",
    "const H = 4096 in 1 .. 8192, NQ = 32 in 1 .. 256, NK = 8 in 1 .. 256, "
    "D = 128 in 2 .. 256": _SHAPES + " (the Q|K|V projections)",
    "const T = 1 in 1 .. 65536, iters = 20 in 1 .. 1000, eps = 1e-6": "DeepSeek-V4's Sinkhorn "
    "iterations and epsilon, in both layouts of COMB",
    "launch workgroup 256, subgroup any": _LAUNCH,
    "param pos in 0 .. 4095": _POS,
    "per workgroup h < NQ": "one workgroup per query head, attention's grid",
    "per workgroup head < NQ + 2 * NK": "one workgroup per head of the Q|K|V projection, "
    "the projection's grid in each of its fused forms",
    "const K = 4096 in 1 .. 16384, N = 4096 in 1 .. 1048576": _SHAPES
    + " (the residual projections, with their input in f32 or already rounded to q8_0x)",
    "const eps = 1e-6": "the RMSNorm epsilon of the two norm groups (rms_norm, add_norm)",
    "launch workgroup 512, subgroup any, rows_per_subgroup 1": _LAUNCH,
    "launch workgroup 512, subgroup any, rows_per_subgroup 2": _LAUNCH,
    "schedule on gfx1201 when Wt = f16: workgroup 1024": _TUNED,
    "schedule on sm90: workgroup 512": _TUNED,
    "schedule when Wt = q6_K: const K = 12288": "the FFN down projection's K, the default of "
    "the q6_K instances of both residual projections (Q4_K_M puts q6_K there)",
    "schedule: gate, up layout k -> lane x 32": "a whole q8_0 block per lane, the integer-dot "
    "width of the two FFNs whose weights are always quantized",
    "schedule on gfx1201 when Wt = q4_0: rows_per_subgroup 3": _TUNED,
    "const NS = 8": "the default number of runs of the cache, stated by split_softmax and by "
    "run_softmax, the group it uses",
    "per workgroup g < NQ * NS": "one workgroup per query head and run of the cache, the split "
    "attention's grid (attention_split, attention_rope_split)",
}

_DECLARATION = re.compile(r"(const|param|launch|budget|tile|per|schedule)\b")


def body_lines(region: S.Region | S.StageGroup) -> list[str]:
    """The body of a region or stage group, one normalized line per source line (comments and
    blank lines dropped; a region's schedule lines are one-liners and count too)."""
    source = region.span.source
    items = [*region.consts, *region.stages]
    if isinstance(region, S.Region):
        items += [*region.launch, *region.budget, *region.schedules]
    starts = [x.span.start for x in items if x.span.start > region.name_span.end]
    if isinstance(region, S.Region) and region.tile is not None:
        starts.append(region.tile.span.start)
    if isinstance(region, S.Region) and region.per is not None:
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
    bodies.update({f"stages {g.name}": body_lines(g) for g in module.groups})
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


def test_no_run_of_stage_lines_repeats() -> None:
    _, runs = _report()
    stage_runs = _stage_runs(runs)
    assert len(stage_runs) == KNOWN_STAGE_RUNS, "\n".join(
        f"{sorted(r)}: {list(run)}" for run, r in stage_runs.items()
    )


def test_repeated_declarations_are_the_allowed_ones() -> None:
    lines, _ = _report()
    repeated = {line for line in lines if _DECLARATION.match(line)}
    unexplained = sorted(repeated - set(ALLOWED_DECLARATIONS))
    assert not unexplained, f"declarations repeated without a reason: {unexplained}"
    stale = sorted(set(ALLOWED_DECLARATIONS) - repeated)
    assert not stale, f"no longer repeated, remove from ALLOWED_DECLARATIONS: {stale}"


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
