"""Tune every region of the decode layer on the present device and write a markdown table.

    python bench/tune_layer.py [--weights f16|q8_0|q4_0|q4_K|q4_k_m] [--preset qwen3-8b]
                               [-o docs/tune_layer.md] [--json-dir DIR]
                               [-- extra fusec tune arguments, e.g. --max-candidates 40]

For each call of `runtime/decode_layer.calls` (the layer `fusec bench` times: its instances
picked from FILE as checked, `gated_ffn_q4_0` for q4_0 weights) with its own constants (a
region called twice at different shapes is tuned twice), it runs `fusec tune FILE --region I
--const ... --json` (each candidate verified against numpy, then all timed side by side with
GPU timestamps, weights rotated past L2) and writes one row per call, named by the instance
(`rms_norm_gated_ffn<q4_0>`): the baseline's median, the winner's, the winner's ratio to the
baseline timed beside it, and the winning schedule lines.  Nothing is written into FILE; each
run's JSON goes to `--json-dir` (one file per call), which `fusec tune FILE --from-json F
--write` writes later, on another machine too.  A region `fusec tune` refuses (nothing to tune,
no candidate left) gets a row saying why.

A whole region's enumeration is up to 150 candidates: about a minute of building (none
where `--keep DIR` holds them from an earlier run) and a few minutes of timing on a GPU.  Under a
per-command time limit, narrow it (`-- --max-candidates 40`) or split the layer (`--only R`).
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
    ap.add_argument(
        "--json-dir", default=None, help="one `fusec tune --json` result per call in this folder"
    )
    ap.add_argument(
        "--only", action="append", default=[], help="only this region (repeatable), to split a run"
    )
    ap.add_argument(
        "--timeout", type=float, default=None, help="seconds per call before it is given up"
    )
    ap.add_argument("rest", nargs="*", help="passed on to fusec tune (after --)")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from fusec.codegen.build import check_source
    from fusec.runtime import decode_layer as layer

    preset = layer.PRESETS[args.preset]
    program = check_source(Path(args.file).read_text(), args.file)
    declared = {r.name: {c.name for c in r.consts} for r in program.regions}
    shown = {r.name: r.instance.display if r.instance else r.name for r in program.regions}
    # one run per region and constants: the layer's two projections through matvec_add
    # (attention output, FFN down) differ in K and N, and their best schedules may too
    calls: dict[tuple[str, tuple[tuple[str, float], ...]], dict[str, float]] = {}
    for call in layer.calls(preset, args.weights, regions=program):
        if args.only and not {call.region, shown.get(call.region)} & set(args.only):
            continue
        consts = dict(call.consts)
        if "pos" in declared.get(call.region, ()):
            consts["pos"] = preset.context - 1  # the full context, as `fusec bench` runs it
        calls.setdefault((call.region, tuple(sorted(consts.items()))), consts)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    rows, results = [], {}
    device = None
    for (region, _), consts in calls.items():
        shape = ", ".join(f"{k}={v}" for k, v in consts.items() if isinstance(v, int))
        label = shown.get(region, region)
        name = f"{label} ({shape})" if shape else label
        cmd = [sys.executable, "-m", "fusec", "tune", args.file, "--region", region, "--json"]
        for k, v in consts.items():
            cmd += ["--const", f"{k}={v}"]
        cmd += args.rest
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(
                cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=args.timeout
            )
        except subprocess.TimeoutExpired:
            print(f"{name}: gave up after {args.timeout:.0f} s", file=sys.stderr)
            rows.append(f"| {name} | - | - | - | not tuned: gave up after {args.timeout:.0f} s |")
            continue
        took = time.perf_counter() - t0
        print(f"{name}: exit {proc.returncode} in {took:.0f} s", file=sys.stderr)
        if proc.returncode != 0:
            why = (proc.stderr.strip().splitlines() or ["?"])[-1].replace("|", "\\|")
            rows.append(f"| {name} | - | - | - | not tuned: {why} |")
            continue
        out = json.loads(proc.stdout)
        results[name] = out
        if args.json_dir:
            stem = region + "".join(f"_{k}{v}" for k, v in consts.items() if isinstance(v, int))
            Path(args.json_dir).mkdir(parents=True, exist_ok=True)
            (Path(args.json_dir) / f"{stem}.json").write_text(json.dumps(out, indent=1))
        cands = out["candidates"]
        base = next(c for c in cands if c["baseline"])
        win = cands[0]
        same = " (today's)" if win["baseline"] else ""
        schedule = "<br>".join(f"`{line}`" for line in win["source"])
        if "median_us" not in win:  # ranked by the estimator (--target without its hardware)
            rows.append(f"| {name} | - | - | ranked, not timed | {schedule}{same} |")
        else:
            rows.append(
                f"| {name} | {base['median_us']:.2f} | {win['median_us']:.2f} | "
                f"{win['ratio']:.3f} | {schedule}{same} |"
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
