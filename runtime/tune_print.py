"""The table `fusec tune` prints for a person (runtime/tune_cmd.py makes the result; `--json`
prints the same result as JSON instead): the candidates in rank order with their schedule,
timing or estimate, what was dropped and why, and the winner against the baseline.
"""

from __future__ import annotations

import sys
from typing import Any


def print_result(result: dict[str, Any]) -> None:
    """The result as a rich table on stdout, then the dropped schedules and the winner."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 200)
    timed = result["mode"] == "timed"
    where = (
        f"timed on {result['device']}"
        if timed
        else f"ranked for {result['target']} by the estimator, not timed: {result['why_ranked']}"
    )
    table = Table(
        title=escape(f"fusec tune {result['file']} --region {result['region']} ({where})")
    )
    cols = ["#", "schedule", "baseline"]
    cols += (
        ["median µs", "ratio", "path", "err/tol"]
        if timed
        else ["waves", "VGPRs", "B in flight", "reasoning"]
    )
    for c in cols:
        table.add_column(c, overflow="fold")
    for i, r in enumerate(result["candidates"]):
        cells = [str(i + 1), escape("\n".join(r["source"])), "yes" if r["baseline"] else ""]
        if timed:
            cells += [
                f"{r['median_us']:.2f}",
                f"{r['ratio']:.3f}",
                escape(r["path"]),
                f"{r['error_of_tolerance']:.3f}",
            ]
        else:
            cells += [
                str(r["waves_per_simd"]),
                str(r["vgprs"]),
                f"{r['in_flight_bytes']:,}",
                escape(r["reasoning"]),
            ]
        table.add_row(*cells)
    console.print(table)
    drops = result["dropped"]
    total = sum(d["count"] for d in drops)
    console.print(f"{result['enumerated']} schedule(s) enumerated, {total} dropped:")
    for d in drops:
        console.print(escape(f"  {d['count']:4d}  {d['stage']}: {d['reason']}"))
    console.print(escape(f"winner: {result['winner']} (baseline: {result['baseline']})"))
