"""Render `fusec occupancy --json --actual` output (one or more files) as the Markdown tables of
docs/ESTIMATOR.md: estimate vs driver per kernel, and the worst case per target.

    python bench/estimator_report.py amd.json sm90.json > table.md
"""

from __future__ import annotations

import json
import sys
from typing import Any


def _rows(paths: list[str]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for p in paths:
        with open(p) as f:
            rows += [r for r in json.load(f) if "actual_vgprs" in r]
    return rows


def main(paths: list[str]) -> int:
    rows = _rows(paths)
    by_target: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_target.setdefault(r["target"], []).append(r)
    for target, rs in by_target.items():
        amd = rs[0]["actual_presched_vgprs"] is not None
        print(f"\n### {target}\n")
        if amd:
            print(
                "| region | kernel | wave | est. demand | ACO Pre-Sched | ACO VGPRs (alloc) | "
                "LDS est./ACO | waves est./ACO | spills est./ACO |"
            )
            print("|---|---|---|---|---|---|---|---|---|")
        else:
            print(
                "| region | kernel | est. demand | NVIDIA Register Count | est. warps/scheduler | "
                "from Register Count | local memory (spill) |"
            )
            print("|---|---|---|---|---|---|---|")
        worst, worst_row, same = 0.0, None, 0
        for r in rs:
            ref = r["actual_presched_vgprs"] if amd else r["actual_vgprs"]
            err = abs(r["vgprs"] - ref)
            rel = err / max(4, 0.15 * ref)
            if rel >= worst:
                worst, worst_row = rel, r
            same += r["waves_per_simd"] == r["actual_waves_per_simd"]
            if amd:
                print(
                    f"| {r['region']} | {r['kernel']} | {r['wave']} | {r['vgprs']} | {ref} | "
                    f"{r['actual_vgprs']} | {r['lds_bytes']}/{r['actual_lds_bytes']} | "
                    f"{r['waves_per_simd']}/{r['actual_waves_per_simd']} | "
                    f"{r['spills']}/{r['actual_spills']} |"
                )
            else:
                print(
                    f"| {r['region']} | {r['kernel']} | {r['vgprs']} | {ref} | "
                    f"{r['waves_per_simd']} | {r['actual_waves_per_simd']} | "
                    f"{r['actual_spills']} |"
                )
        assert worst_row is not None
        ref = worst_row["actual_presched_vgprs"] if amd else worst_row["actual_vgprs"]
        print(
            f"\n{len(rs)} kernels; waves equal for {same}/{len(rs)}; worst demand error: "
            f"{worst_row['region']} {worst_row['kernel']} wave{worst_row['wave']}, "
            f"estimated {worst_row['vgprs']} vs {ref} "
            f"({'within' if worst <= 1 else 'OUTSIDE'} max(4, 15%))."
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
