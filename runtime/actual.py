"""Ground truth for the estimator: compile a build's SPIR-V through a driver and read
VK_KHR_pipeline_executable_properties.

Run as a worker (`python -m runtime.actual BUILD_DIR`) so that the parent can choose the driver
through the environment: for an AMD target, RADV's null device (`RADV_FORCE_FAMILY=<target>`,
`VK_ICD_FILENAMES=.../radeon_icd.json`; no AMD GPU needed), otherwise the device present (the
NVIDIA driver reports `Register Count`).  Prints one JSON list: per kernel and wave, the driver's
statistics by name.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from codegen import manifest as mf

from .device import Device, RuntimeFailure
from .dispatch import Build
from .pipelines import Pipeline, pipeline_statistics

RADV_ICD = "/usr/share/vulkan/icd.d/radeon_icd.json"
NVIDIA_LOCAL_MEMORY_OFFSET = 2**36  # FACTS.md: NVIDIA reports `Local Memory Size` offset by 2^36


def collect(build_dir: str, waves: list[int]) -> list[dict[str, Any]]:
    build = Build.load(build_dir)
    out: list[dict[str, Any]] = []
    with Device(capture_statistics=True) as dev:
        if not dev.statistics:
            raise RuntimeFailure(f"{dev.info.name} does not report pipeline statistics")
        for region in build.manifest["regions"]:
            spec = [
                (c["spec_id"], c["dtype"], c["default"])
                for c in region["consts"]
                if not c.get("runtime")
            ]
            for k in region["fused"] + region["unfused"]:
                for wave in waves:
                    if not dev.info.min_subgroup_size <= wave <= dev.info.max_subgroup_size:
                        continue
                    defaults = {c["name"]: c["default"] for c in region["consts"]}
                    try:
                        derived = mf.derived_specs(k, defaults)
                    except ValueError as e:
                        raise RuntimeFailure(
                            f"kernel {k['name']} at its default constants: its index math {e}"
                        ) from None
                    p = Pipeline(
                        dev,
                        build.spv(k),
                        len(k["bindings"]),
                        spec + derived,
                        wave,
                        dev.info.full_subgroups and k["workgroup_size"] % wave == 0,
                        capture_statistics=True,
                    )
                    try:
                        stats = pipeline_statistics(dev, p)
                    finally:
                        p.destroy()
                    out.append(
                        {
                            "region": region["name"],
                            "kernel": k["name"],
                            "wave": wave,
                            "device": dev.info.name,
                            "stats": stats,
                        }
                    )
    return out


def run_worker(
    build_dir: str | Path, waves: list[int], env_extra: dict[str, str] | None
) -> tuple[list[dict[str, Any]] | None, str]:
    """Run `collect` in a child process with `env_extra`; (results, '') or (None, why)."""
    env = {**os.environ, **(env_extra or {})}
    proc = subprocess.run(
        [sys.executable, "-m", "runtime.actual", str(build_dir), *map(str, waves)],
        capture_output=True,
        text=True,
        env=env,
        cwd=Path(__file__).resolve().parent.parent,
    )
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("fusec: error")]
        return None, (
            lines[-1].removeprefix("fusec: error: ")
            if lines
            else f"the statistics worker failed (exit {proc.returncode})"
        )
    return json.loads(proc.stdout), ""


def radv_env(family: str) -> dict[str, str] | None:
    if not Path(RADV_ICD).exists():
        return None
    return {
        "RADV_FORCE_FAMILY": family,
        "VK_ICD_FILENAMES": RADV_ICD,
        "MESA_VK_DEVICE_SELECT": "",
        "RADV_DEBUG": "nocache",
    }


def main(argv: list[str]) -> int:
    try:
        result = collect(argv[0], [int(w) for w in argv[1:]] or [32, 64])
    except RuntimeFailure as exc:
        print(exc.render(), file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
