"""Front-end fuzzing, the long run (issue 13): generated and mutated `.fuse` sources through
parse, check and build in worker processes, and a share of what builds through `fusec check`; a
summary table; exit status 1 on any internal error, mismatch, crash or hang.

    python bench/fuzz_frontend.py                      # 10,000 cases, seed 0, 2 workers
    python bench/fuzz_frontend.py --cases 2000 --seed 7 --report findings.json
    python bench/fuzz_frontend.py --show 4711          # print case 4711 of seed 0 and exit

Case i of a seed is the same on every machine: even cases are derived from dsl/fuse.lark, odd
ones mutate kernels.fuse or a test source (tests/fuzz/frontend.py).  Every fifth case compiles
its GLSL with shaderc; the others stop just before it.  Every fifth case (`--check-every`, the
same ones by default) is also checked if it builds: compiled and run as `fusec check DIR --seed
S` runs it, on the default Vulkan device, opened once per worker: verified, refused in one
sentence, skipped (too large to check quickly), ill-conditioned (docs/FUZZING.md), or a
mismatch.  Each distinct internal error (exception type and the fusec line it came from) is
shown once, with its smallest source shrunk further; mismatches are grouped by which products
(fused, unfused) missed the reference.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402
from rich.markup import escape  # noqa: E402
from rich.progress import (  # noqa: E402
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table  # noqa: E402

from tests.fuzz.frontend import (  # noqa: E402
    CHECKS,
    KINDS,
    REACHED,
    Job,
    Pool,
    generated_case,
    mutated_case,
    shrink,
)

FAILURES = ("internal", "mismatch", "hang", "crash")


def case(seed: int, index: int) -> tuple[str, str, str]:
    """(origin, description, text) of case `index`."""
    if index % 2 == 0:
        return ("generated", *generated_case(seed, index))
    return ("mutated", *mutated_case(seed, index))


@dataclass
class Group:
    """Every case that failed the same way."""

    kind: str
    signature: str
    cases: list[int] = field(default_factory=list)
    smallest: tuple[int, str] | None = None  # (case, text)
    detail: str = ""
    compile: bool = False
    check_seed: int | None = None
    reproducer: str = ""


def _job(seed: int, index: int, compile_every: int, check_every: int) -> Job:
    """Case `index` as a job: every `compile_every`'th compiles, and every `check_every`'th
    (0: none) is checked if it builds, compiled, on inputs drawn from a seed of its own."""
    _, _, text = case(seed, index)
    checked = check_every > 0 and (index // 2) % check_every == 0 and len(text) < 20_000
    compile = checked or ((index // 2) % compile_every == 0 and len(text) < 20_000)
    check_seed = seed * 1_000_003 + index if checked else None
    return Job(index, text, compile=compile, write=index % 7 == 0, check_seed=check_seed)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds per case (a hang)")
    ap.add_argument("--compile-every", type=int, default=5, metavar="N")
    ap.add_argument(
        "--check-every",
        type=int,
        default=5,
        metavar="N",
        help="check every Nth case with fusec check, if it builds (0: none)",
    )
    ap.add_argument("--first", type=int, default=0, help="index of the first case")
    ap.add_argument("--max-minutes", type=float, default=None, help="stop starting cases then")
    ap.add_argument("--no-shrink", action="store_true")
    ap.add_argument("--report", type=Path, default=None, help="write the groups as JSON")
    ap.add_argument("--show", type=int, default=None, metavar="CASE", help="print a case, exit")
    args = ap.parse_args(argv)
    console = Console()
    if not console.is_terminal:
        console = Console(width=max(console.width, 130))

    if args.show is not None:
        origin, what, text = case(args.seed, args.show)
        print(f"# {what}", file=sys.stderr)
        sys.stdout.write(text)
        return 0

    counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    reached: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    checks: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    groups: dict[str, Group] = {}
    notes: collections.Counter[str] = collections.Counter()
    slowest: tuple[float, int] = (0.0, -1)
    started = time.monotonic()
    done = 0

    def jobs() -> Iterator[Job]:
        for i in range(args.first, args.first + args.cases):
            if args.max_minutes is not None and time.monotonic() - started > 60 * args.max_minutes:
                return
            yield _job(args.seed, i, args.compile_every, args.check_every)

    columns = (
        TextColumn("[bold]fuzz[/]"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    with Pool(args.workers, args.timeout) as pool:
        with Progress(*columns, console=console, transient=False) as progress:
            task = progress.add_task("", total=args.cases)
            for job, o in pool.map(jobs()):
                index = int(job.key)
                origin = "generated" if index % 2 == 0 else "mutated"
                counts[origin][o.kind] += 1
                reached[origin][o.reached] += 1
                if o.check:
                    checks[origin][o.check] += 1
                for n in o.notes:
                    notes[n.split(": ")[0]] += 1
                slowest = max(slowest, (o.seconds, index))
                if o.kind in FAILURES:
                    g = groups.setdefault(o.signature, Group(o.kind, o.signature))
                    g.cases.append(index)
                    if g.smallest is None or len(job.text) < len(g.smallest[1]):
                        g.smallest, g.detail, g.compile = (index, job.text), o.detail, job.compile
                        g.check_seed = job.check_seed
                done += 1
                bad = sum(len(g.cases) for g in groups.values())
                progress.update(
                    task, advance=1, description=f"{bad} failing, {len(groups)} distinct"
                )

        if not args.no_shrink:
            for g in groups.values():
                assert g.smallest is not None
                if g.kind == "hang":
                    g.reproducer = g.smallest[1]
                    continue
                console.print(f"shrinking {g.signature} (case {g.smallest[0]})")

                def same(text: str, g: Group = g) -> bool:
                    o = pool.run(Job(0, text, compile=g.compile, check_seed=g.check_seed))
                    return o.signature == g.signature

                # a checked case runs on the device each time: seconds, not milliseconds
                g.reproducer = shrink(
                    g.smallest[1], same, budget=300 if g.check_seed is None else 80
                )
        else:
            for g in groups.values():
                assert g.smallest is not None
                g.reproducer = g.smallest[1]

    elapsed = time.monotonic() - started
    _summary(console, args, counts, reached, checks, groups, notes, slowest, done, elapsed)
    if args.report is not None:
        report = [
            {
                "kind": g.kind,
                "signature": g.signature,
                "count": len(g.cases),
                "cases": g.cases[:20],
                "compile": g.compile,
                "check_seed": g.check_seed,
                "detail": g.detail,
                "reproducer": g.reproducer,
            }
            for g in sorted(groups.values(), key=lambda g: -len(g.cases))
        ]
        args.report.write_text(json.dumps(report, indent=1) + "\n")
    return 1 if groups else 0


def _summary(
    console: Console,
    args: argparse.Namespace,
    counts: dict[str, collections.Counter[str]],
    reached: dict[str, collections.Counter[str]],
    checks: dict[str, collections.Counter[str]],
    groups: dict[str, Group],
    notes: collections.Counter[str],
    slowest: tuple[float, int],
    done: int,
    elapsed: float,
) -> None:
    t = Table(title=f"{done} cases, seed {args.seed}, {elapsed:.0f} s, {args.workers} worker(s)")
    t.add_column("source")
    for k in KINDS:
        t.add_column(k, justify="right")
    t.add_column("parsed", justify="right")
    t.add_column("checked", justify="right")
    t.add_column("built", justify="right")
    for origin in ("generated", "mutated"):
        c, r = counts[origin], reached[origin]
        n = sum(c.values()) or 1
        past = [sum(r[s] for s in REACHED[i:]) for i in (1, 2, 3)]
        t.add_row(origin, *(str(c[k]) for k in KINDS), *(f"{100 * p / n:.0f}%" for p in past))
    console.print(t)
    if any(checks.values()):
        c_table = Table(title="built cases run through fusec check")
        c_table.add_column("source")
        for k in CHECKS:
            c_table.add_column(k, justify="right")
        for origin in ("generated", "mutated"):
            c_table.add_row(origin, *(str(checks[origin][k]) for k in CHECKS))
        console.print(c_table)
    console.print(f"slowest case: {slowest[0]:.2f} s (case {slowest[1]}); timeout {args.timeout} s")
    if notes:
        console.print(
            "diagnostics that look wrong (not failures): "
            + ", ".join(f"{k} x{v}" for k, v in notes.most_common())
        )
    if not groups:
        console.print("[green]no internal error, mismatch, crash or hang[/]")
        return
    g_table = Table(title=f"{len(groups)} distinct failure(s)", show_lines=True)
    g_table.add_column("kind")
    g_table.add_column("where")
    g_table.add_column("cases", justify="right")
    g_table.add_column("first case", justify="right")
    g_table.add_column("reproducer (shrunk)")
    for g in sorted(groups.values(), key=lambda g: -len(g.cases)):
        repro = g.reproducer if len(g.reproducer) < 600 else g.reproducer[:600] + " ..."
        # escaped: rich would read `x[i, k]` as markup and print `x`
        g_table.add_row(
            g.kind, escape(g.signature), str(len(g.cases)), str(g.cases[0]), escape(repr(repro))
        )
    console.print(g_table)


if __name__ == "__main__":
    sys.exit(main())
