"""Fuzz prebuilt build folders through `fusec check` (issue 13): thousands of mutated copies of
a small build, each refused in one sentence or verified.

    python bench/fuzz_folders.py [--cases 1000] [--seed 0] [--workers 2] [--reseal]

Builds tests/data/fuzz_base.fuse, then runs seeds seed .. seed+cases-1 in worker processes
(tests/fuzz/folders.py), each case in-process through the CLI's `main`, with one line of JSON
per case, so a crash or a hang (60 s) is blamed on its seed.  With --reseal, an edited manifest
gets a recomputed integrity digest, so the checks behind the digest are the ones exercised.
Prints a table of outcomes and the distinct refusal sentences; exits 1 if any case crashed,
hung, raised an internal error or failed without one sentence.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402
from rich.progress import Progress  # noqa: E402
from rich.table import Table  # noqa: E402

from fusec.codegen.build import build_file  # noqa: E402
from tests.fuzz.folders import Outcome, run_seeds  # noqa: E402

GOOD = {"refused", "verified"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--chunk", type=int, default=50, help="cases per worker process")
    ap.add_argument("--reseal", action="store_true")
    args = ap.parse_args()
    console = Console()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        build_file(ROOT / "tests" / "data" / "fuzz_base.fuse", base)
        seeds = list(range(args.seed, args.seed + args.cases))
        chunks = [seeds[i : i + args.chunk] for i in range(0, len(seeds), args.chunk)]
        results: list[Outcome] = []
        t0 = time.perf_counter()
        with Progress(console=console) as progress:
            task = progress.add_task("mutated folders", total=len(seeds))

            def work(i_chunk: tuple[int, list[int]]) -> list[Outcome]:
                i, chunk = i_chunk
                out = run_seeds(base, Path(tmp) / f"w{i}", chunk, reseal=args.reseal)
                progress.advance(task, len(chunk))
                return out

            with ThreadPoolExecutor(max_workers=args.workers) as pool:
                for out in pool.map(work, enumerate(chunks)):
                    results.extend(out)
        seconds = time.perf_counter() - t0
    kinds = collections.Counter(r.kind for r in results)
    table = Table(
        title=f"{len(results)} mutated folders ({'resealed' if args.reseal else 'edited'}), "
        f"seeds {seeds[0]}..{seeds[-1]}, {seconds:.0f} s"
    )
    table.add_column("outcome")
    table.add_column("cases", justify="right")
    for kind, n in kinds.most_common():
        table.add_row(kind, str(n))
    console.print(table)

    def gist(sentence: str) -> str:
        """The sentence without the folder's name, cut at its first parenthesis."""
        text = sentence.split("is damaged: ", 1)[-1].removeprefix("fusec: error: ")
        return text.split(" (")[0][:90]

    sentences = collections.Counter(gist(r.detail) for r in results if r.kind == "refused")
    console.print("most frequent refusals:")
    for text, n in sentences.most_common(12):
        console.print(f"  {n:5d}  {text}")
    allowed = GOOD | ({"mismatch"} if args.reseal else set())
    bad = [r for r in results if r.kind not in allowed]
    for r in bad:
        console.print(f"[red]seed {r.seed}: {r.kind}[/]: {r.what}: {r.detail}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
