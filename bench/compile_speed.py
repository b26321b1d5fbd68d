"""Compile speed (issue 20): wall time of the commands an engineer repeats while writing an op.

    python bench/compile_speed.py [--repo DIR] [--runs 5] [--file kernels.fuse]

Times, as child processes (`python -m fusec`, or `python -m runtime.cli` in a checkout from
before the `fusec` package, run in DIR, default this checkout), medians
of --runs:
- `build FILE -o fresh/` into a new folder each run (with the user cache that the first build
  filled, and again with an empty cache folder);
- `build FILE -o same/` again with nothing changed (a rebuild);
- `occupancy FILE --target gfx1201 --json` with its build already made (cached, or `-o`);
- `check FILE --region R` (start-up and one region on the default Vulkan device);
- `--help`.
Point --repo at another checkout (e.g. `git worktree add /tmp/before <commit>`) to measure
before and after in one run; the same Python runs both.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def wall(cmd: list[str], cwd: Path, env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr}")
    return seconds


def measure(repo: Path, runs: int, source: str, region: str) -> dict[str, float]:
    entry = "fusec" if (repo / "fusec" / "__main__.py").is_file() else "runtime.cli"
    fusec = [sys.executable, "-m", entry]
    times: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "FUSEC_CACHE_DIR": str(Path(tmp) / "cache"), "PYTHONPATH": str(repo)}
        same = Path(tmp) / "same"
        wall([*fusec, "build", source, "-o", str(same)], repo, env)
        wall([*fusec, "occupancy", source, "--target", "gfx1201", "--json"], repo, env)
        for i in range(runs):
            steps = {
                "build fresh": ["build", source, "-o", str(Path(tmp) / f"fresh{i}")],
                "rebuild, nothing changed": ["build", source, "-o", str(same)],
                "occupancy --json": ["occupancy", source, "--target", "gfx1201", "--json"],
                f"check --region {region}": ["check", source, "--region", region, "--seed", "1"],
                "--help": ["--help"],
            }
            for name, args in steps.items():
                times.setdefault(name, []).append(wall([*fusec, *args], repo, env))
            # the same fresh build with an empty user cache (no compiled kernels to reuse)
            cold = {**env, "FUSEC_CACHE_DIR": str(Path(tmp) / f"cold{i}")}
            out = str(Path(tmp) / f"coldout{i}")
            times.setdefault("build fresh, empty cache", []).append(
                wall([*fusec, "build", source, "-o", out], repo, cold)
            )
    return {name: statistics.median(v) for name, v in times.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", type=Path, action="append", default=[])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--file", default="kernels.fuse")
    ap.add_argument("--region", default="add_rms_norm")
    args = ap.parse_args()
    repos = args.repo or [ROOT]
    results = {str(r): measure(r.resolve(), args.runs, args.file, args.region) for r in repos}
    names = list(next(iter(results.values())))
    print(f"median wall seconds of {args.runs} runs, {args.file}, load {os.getloadavg()[0]:.2f}")
    print(f"{'command':32s}" + "".join(f"{Path(r).name:>14s}" for r in results))
    for name in names:
        print(f"{name:32s}" + "".join(f"{results[r][name]:14.2f}" for r in results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
