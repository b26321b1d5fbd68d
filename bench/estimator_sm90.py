"""The estimator against the NVIDIA driver's `Register Count` (issue 14): kernels.fuse and a
sample of the generated corpus (tests/estimator/corpus.py), on the H200.

    python bench/estimator_sm90.py prepare DIR [--seed 7 --regions 120]   # here: build folders
    python bench/estimator_sm90.py collect DIR OUT.json                   # on the H200
    python bench/estimator_sm90.py report DIR OUT.json [--markdown]       # here: the comparison

`prepare` builds kernels.fuse and the corpus (in batches of 40 regions) into DIR/kf and
DIR/c<i>; `collect` creates every kernel's pipeline on the device present (runtime/actual.py)
and writes the driver's statistics; `report` compares, per kernel, the estimate for sm90 with
`Register Count`, and the warps per scheduler both give (codegen/targets.py `occupancy`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BATCH = 40


def prepare(out: Path, seed: int, regions: int) -> None:
    from fusec.codegen.build import build_file
    from tests.estimator.corpus import build_batch, corpus

    out.mkdir(parents=True, exist_ok=True)
    build_file(ROOT / "kernels.fuse", out / "kf", ("sm90",))
    cases = corpus(seed, regions)
    for i in range(0, len(cases), BATCH):
        built = build_batch(cases[i : i + BATCH], out / f"c{i // BATCH}")
        if built.build_failed:
            print(f"c{i // BATCH}: left out {sorted(built.build_failed)}", file=sys.stderr)
    print(f"prepared {out}: kernels.fuse and {len(cases)} corpus regions (seed {seed})")


def collect(folder: Path, out: Path) -> None:
    from fusec.runtime.actual import run_worker

    results: dict[str, Any] = {}
    for build in sorted(p for p in folder.iterdir() if (p / "manifest.json").is_file()):
        rows, why = run_worker(build.resolve(), [32], None)
        results[build.name] = rows if rows is not None else {"failed": why}
        print(f"{build.name}: {len(rows) if rows is not None else why}", file=sys.stderr)
    out.write_text(json.dumps(results))


def report(folder: Path, data: Path, markdown: bool) -> int:
    from fusec.codegen import manifest_records as mr
    from fusec.codegen.targets import TARGETS, occupancy
    from fusec.runtime.actual import NVIDIA_LOCAL_MEMORY_OFFSET

    t = TARGETS["sm90"]
    results = json.loads(data.read_text())
    rows = []
    for name, got in sorted(results.items()):
        if not isinstance(got, list):
            print(f"{name}: {got}")
            continue
        manifest = mr.Manifest.from_json(json.loads((folder / name / "manifest.json").read_text()))
        kernels = {k.name: (r.name, k) for r in manifest.regions for k in r.kernels()}
        for g in got:
            if "stats" not in g:
                continue
            region, k = kernels[g["kernel"]]
            est = next(e for e in k.estimates if e.target == "sm90")
            regs = int(g["stats"]["Register Count"])
            local = int(g["stats"].get("Local Memory Size", 0)) - NVIDIA_LOCAL_MEMORY_OFFSET
            lds = est.lds_bytes
            rows.append(
                {
                    "set": name,
                    "region": region,
                    "kernel": g["kernel"],
                    "est": est.vgprs,
                    "regs": regs,
                    "est_waves": est.waves_per_simd,
                    "nv_waves": occupancy(t, 32, regs, lds, k.workgroup_size),
                    "local": max(0, local),
                    "workgroup": k.workgroup_size,
                }
            )
    same = sum(r["est_waves"] == r["nv_waves"] for r in rows)
    spill_ok = sum((r["est"] > t.max_vgprs) == (r["local"] > 0) for r in rows)
    print(
        f"{len(rows)} kernels: warps per scheduler equal for {same} "
        f"({100 * same / max(1, len(rows)):.1f}%); spill prediction right for {spill_ok}"
    )
    for subset in sorted({r["set"][:1] for r in rows}):
        part = [r for r in rows if r["set"][:1] == subset]
        eq = sum(r["est_waves"] == r["nv_waves"] for r in part)
        label = "kernels.fuse" if subset == "k" else "corpus"
        print(f"  {label}: {eq} of {len(part)}")
    if markdown:
        print(
            "| region | kernel | est. demand | Register Count | est. warps | from Register Count |"
        )
        print("|---|---|---|---|---|---|")
        for r in rows:
            print(
                f"| {r['region']} | {r['kernel']} | {r['est']} | {r['regs']} | "
                f"{r['est_waves']} | {r['nv_waves']} |"
            )
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("dir", type=Path)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--regions", type=int, default=120)
    c = sub.add_parser("collect")
    c.add_argument("dir", type=Path)
    c.add_argument("out", type=Path)
    r = sub.add_parser("report")
    r.add_argument("dir", type=Path)
    r.add_argument("data", type=Path)
    r.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    if args.cmd == "prepare":
        prepare(args.dir, args.seed, args.regions)
        return 0
    if args.cmd == "collect":
        collect(args.dir, args.out)
        return 0
    return report(args.dir, args.data, args.markdown)


if __name__ == "__main__":
    sys.exit(main())
