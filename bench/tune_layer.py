"""Tune every region of the decode layer on the present device and write a markdown table.

    python bench/tune_layer.py [--weights f16] [--preset qwen3-8b] [-o docs/tune_layer.md]
                               [-- extra fusec tune arguments, e.g. --max-candidates 40]

For each distinct region of `runtime/decode_layer.calls` (the layer `fusec bench` times), at the
layer's constants, it runs `fusec tune kernels.fuse --region R --const ... --json` (each
candidate verified against numpy, then all timed side by side with GPU timestamps, weights
rotated past L2) and writes one row per region: the baseline's median, the winner's, their
ratio and the winning schedule's launch and layout lines.  Nothing is written into
kernels.fuse (`--write` is the user's call, region by region).  A region `fusec tune` refuses
(nothing to tune, no candidate left) gets a row saying why.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weights", default="f16", help="layer weight dtype (decode_layer)")
    ap.add_argument("--preset", default="qwen3-8b", help="layer shapes (decode_layer.PRESETS)")
    ap.add_argument("--file", default=str(ROOT / "kernels.fuse"))
    ap.add_argument("-o", "--output", default=None, help="markdown file (default: stdout)")
    ap.add_argument("--json", default=None, help="also keep every tune result here")
    ap.add_argument("rest", nargs="*", help="passed on to fusec tune (after --)")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from fusec.runtime import decode_layer as layer

    preset = layer.PRESETS[args.preset]
    regions: dict[str, dict[str, float]] = {}
    for call in layer.calls(preset, args.weights):
        regions.setdefault(call.region, dict(call.consts))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    rows, results = [], {}
    device = None
    for region, consts in regions.items():
        cmd = [sys.executable, "-m", "fusec", "tune", args.file, "--region", region, "--json"]
        for k, v in consts.items():
            cmd += ["--const", f"{k}={v}"]
        cmd += args.rest
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
        took = time.perf_counter() - t0
        print(f"{region}: exit {proc.returncode} in {took:.0f} s", file=sys.stderr)
        if proc.returncode != 0:
            why = (proc.stderr.strip().splitlines() or ["?"])[-1].replace("|", "\\|")
            rows.append(f"| {region} | - | - | - | not tuned: {why} |")
            continue
        out = json.loads(proc.stdout)
        results[region] = out
        cands = out["candidates"]
        base = next(c for c in cands if c["baseline"])
        win = cands[0]
        same = " (today's)" if win["baseline"] else ""
        schedule = "<br>".join(f"`{line}`" for line in win["source"])
        rows.append(
            f"| {region} | {base['median_us']:.2f} | {win['median_us']:.2f} | "
            f"{win['median_us'] / base['median_us']:.3f} | {schedule}{same} |"
        )
        device = out["device"]
    head = [
        f"`fusec tune` over the decode layer ({args.preset}, {args.weights} weights) on "
        f"{device or 'no device'}, {time.strftime('%Y-%m-%d')}: median µs per "
        "step, every candidate of a region timed side by side in one run.",
        "",
        "| region | baseline µs | tuned µs | ratio | winning schedule |",
        "|---|---|---|---|---|",
    ]
    text = "\n".join(head + rows) + "\n"
    if args.output:
        Path(args.output).write_text(text)
    else:
        sys.stdout.write(text)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
