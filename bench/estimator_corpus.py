"""The estimator against ACO on a random corpus (issue 14, part 2), the long run: regions of every
kernel family from tests/estimator/corpus.py, built in batches, every distinct kernel compiled
through RADV's null device on each target and wave size; a report per (target, wave), per
family, and the worst kernels by demand error with their region source and GLSL shape.

    python bench/estimator_corpus.py                         # 400 regions, seed 0, 4 targets x 2
    python bench/estimator_corpus.py --regions 800 --seed 7 --json corpus.json
    python bench/estimator_corpus.py --targets gfx1201 --waves 32 --balanced
    python bench/estimator_corpus.py --show 17               # print case 17 of the seed and exit

Case i of a seed is the same region on every machine (`corpus.case_source(seed, i)`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402
from rich.markup import escape  # noqa: E402
from rich.table import Table  # noqa: E402

from fusec.runtime.actual import radv_env  # noqa: E402
from tests.estimator import corpus as C  # noqa: E402


def _pct(x: float) -> str:
    return "-" if x != x else f"{x:.1%}"


def _summary_table(summary: list[dict[str, Any]]) -> Table:
    t = Table(title="estimate vs ACO per target and wave")
    cols = [
        "target", "wave", "kernels", "fused/unfused", "ACO failed", "demand ok", "(fused)",
        "under/over", "waves exact", "est>ACO", "spills agree", "missed/false",
        "accepted spilling", "accepted under waves", "regions acc. spill/under", "refused fits",
    ]  # fmt: skip
    for c in cols:
        t.add_column(c, justify="right")
    for s in summary:
        t.add_row(
            s["target"], str(s["wave"]), str(s["kernels"]), f"{s['fused']}/{s['unfused']}",
            str(s["aco_failed"]), _pct(s["demand_close"]), _pct(s["demand_close_fused"]),
            f"{s['under']}/{s['over']}", _pct(s["waves_exact"]), str(s["waves_high"]),
            _pct(s["spills_agree"]), f"{s['spills_missed']}/{s['spills_false']}",
            str(s["accepted_spilling"]), str(s["accepted_under_waves"]),
            f"{s['regions_accepted_spilling']}/{s['regions_accepted_under_waves']}",
            str(s["refused_but_fits"]),
        )  # fmt: skip
    return t


def family_figures(rows: list[dict[str, Any]], pair: tuple[str, int]) -> list[dict[str, Any]]:
    """Per family and fused/unfused on one pair: demand agreement and the signed error."""
    out = []
    groups: dict[tuple[str, bool], list[dict[str, Any]]] = {}
    for r in rows:
        if (r["target"], r["wave"]) == pair and r["status"] == "ok":
            groups.setdefault((r["family"], r["fused"]), []).append(r)
    for (fam, fused), rs in sorted(groups.items()):
        errs = [r["demand_err"] for r in rs]
        out.append(
            {
                "family": fam,
                "fused": fused,
                "n": len(rs),
                "demand_close": sum(C.demand_close(r) for r in rs) / len(rs),
                "under": sum(
                    e < 0 and not C.demand_close(r) for e, r in zip(errs, rs, strict=True)
                ),
                "over": sum(e > 0 and not C.demand_close(r) for e, r in zip(errs, rs, strict=True)),
                "median_err": statistics.median(errs),
                "min_err": min(errs),
                "max_err": max(errs),
                "spill_miss": sum(r["est_spills"] != r["aco_spills"] for r in rs),
                "waves_exact": sum(r["est_waves"] == r["aco_waves"] for r in rs) / len(rs),
            }
        )
    return out


def _family_table(fig: list[dict[str, Any]], pair: tuple[str, int]) -> Table:
    t = Table(title=f"per family, {pair[0]} wave{pair[1]} (error = estimate - ACO Pre-Sched)")
    for c in ("family", "kind", "n", "demand ok", "under/over", "median err", "err range",
              "waves exact", "spill wrong"):  # fmt: skip
        t.add_column(c, justify="right")
    for f in fig:
        t.add_row(
            f["family"], "fused" if f["fused"] else "unfused", str(f["n"]),
            _pct(f["demand_close"]), f"{f['under']}/{f['over']}", f"{f['median_err']:+g}",
            f"{f['min_err']:+d} .. {f['max_err']:+d}", _pct(f["waves_exact"]),
            str(f["spill_miss"]),
        )  # fmt: skip
    return t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--regions", type=int, default=400, help="regions to generate (N)")
    ap.add_argument("--start", type=int, default=0, help="first case index")
    ap.add_argument("--targets", default=",".join(C.TARGETS_ALL))
    ap.add_argument("--waves", default="32,64")
    ap.add_argument("--jobs", type=int, default=2, help="driver processes at once")
    ap.add_argument("--batch", type=int, default=C.BATCH_REGIONS, help="regions per build")
    ap.add_argument("--balanced", action="store_true", help="unfused kernels <= fused (CI's)")
    ap.add_argument("--worst", type=int, default=10)
    ap.add_argument("--json", metavar="OUT", help="write rows, verdicts, summary, worst cases")
    ap.add_argument("--workdir", help="keep the build folders here (default: a temporary one)")
    ap.add_argument("--show", type=int, metavar="INDEX", help="print case INDEX and exit")
    args = ap.parse_args(argv)
    console = Console()
    if args.show is not None:
        print(C.case_source(args.seed, args.show), end="")
        return 0
    targets = [t for t in args.targets.split(",") if t]
    waves = [int(w) for w in args.waves.split(",") if w]
    if radv_env(targets[0]) is None:
        console.print("RADV (mesa-vulkan-drivers) is not installed: nothing to compare")
        return 2
    pairs = [(t, w) for t in targets for w in waves]
    t0 = time.perf_counter()
    cases = C.corpus(args.seed, args.regions, args.start)

    def progress(msg: str) -> None:
        console.print(f"[dim]{time.perf_counter() - t0:7.1f} s  {escape(msg)}[/dim]")

    with tempfile.TemporaryDirectory(prefix="fusec-corpus-") as tmp:
        work = Path(args.workdir) if args.workdir else Path(tmp)
        res = C.compare(cases, pairs, work, args.jobs, args.batch, progress, args.balanced)
    seconds = time.perf_counter() - t0
    summary = C.summarize(res.rows, res.verdicts)
    console.print(
        f"seed {args.seed}, {len(cases)} regions ({len(res.build_failed)} did not build), "
        f"{res.kernels_total} kernels: {res.kernels_distinct} distinct compared, "
        f"{res.duplicates} duplicates, {res.not_selected} left out; {seconds:.1f} s"
    )
    console.print(_summary_table(summary))
    fams = {f"{t}/{w}": family_figures(res.rows, (t, w)) for t, w in pairs}
    console.print(_family_table(fams[f"{pairs[0][0]}/{pairs[0][1]}"], pairs[0]))
    failures = C.acceptance_failures(res.rows)
    console.print("[bold]acceptance[/bold]: " + ("all thresholds hold" if not failures else ""))
    for f in failures:
        console.print(f"  {escape(f)}")
    aco_failed = sorted({(r["kernel"], r["target"], r["aco_error"]) for r in res.rows
                         if r["status"] != "ok"})  # fmt: skip
    for k, t, why in aco_failed:
        console.print(f"[yellow]ACO failed[/yellow] {k} on {t}: {escape(str(why))}")
    worst = C.worst(res, args.worst)
    cases_out = []
    for i, r in enumerate(worst, 1):
        shape = C.glsl_shape(res.glsl[r["kernel"]])
        src = C.source_of(res, r["region"])
        case = next(c for c in cases if c.name == r["region"])
        console.rule(
            f"#{i} {r['kernel']} ({'fused' if r['fused'] else 'unfused'}) {r['target']} "
            f"wave{r['wave']}: estimated {r['est_vgprs']}, ACO Pre-Sched {r['presched']} "
            f"(alloc {r['aco_vgprs']}, spilled {r['aco_spilled']}), waves {r['est_waves']}/"
            f"{r['aco_waves']}"
        )
        console.print(f"case {case.index} of seed {case.seed}; GLSL shape: {shape}")
        console.print(escape(src), end="")
        cases_out.append({**r, "seed": case.seed, "index": case.index, "source": src,
                          "glsl_shape": shape, "glsl": res.glsl[r["kernel"]]})  # fmt: skip
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "seed": args.seed,
                    "regions": len(cases),
                    "pairs": pairs,
                    "seconds": seconds,
                    "kernels_total": res.kernels_total,
                    "kernels_distinct": res.kernels_distinct,
                    "duplicates": res.duplicates,
                    "not_selected": res.not_selected,
                    "build_failed": res.build_failed,
                    "summary": summary,
                    "families": fams,
                    "acceptance_failures": failures,
                    "worst": cases_out,
                    "rows": res.rows,
                    "verdicts": res.verdicts,
                },
                indent=1,
            )
            + "\n"
        )
        console.print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
