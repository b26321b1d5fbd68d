"""Ground truth for the estimator: compile a build's SPIR-V through a driver and read
VK_KHR_pipeline_executable_properties.

Run as a worker (`python -m fusec.runtime.actual BUILD_DIR`) so that the parent can choose the
driver through the environment: for an AMD target, RADV's null device (`RADV_FORCE_FAMILY=<target>`,
`VK_ICD_FILENAMES=.../radeon_icd.json`; no AMD GPU needed), otherwise the device present (the
NVIDIA driver reports `Register Count`).  Prints one JSON list: per kernel and wave, the driver's
statistics by name, or why the device cannot run that kernel (`refused`: a feature it lacks, such
as float atomic add on navi21, whose compiler would abort the process; FACTS.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fusec.codegen import manifest as mf
from fusec.codegen import manifest_records as mr

from .device import Device, RuntimeFailure
from .dispatch import Build, feature_refusal
from .gate import NVIDIA_LOCAL_MEMORY_OFFSET
from .pipelines import Pipeline, pipeline_statistics

__all__ = [
    "NVIDIA_LOCAL_MEMORY_OFFSET",
    "collect",
    "kernel_specs",
    "kernel_statistics",
    "radv_env",
    "run_worker",
]

RADV_ICD = "/usr/share/vulkan/icd.d/radeon_icd.json"


def kernel_specs(region: mr.Region) -> list[tuple[int, str, int | float]]:
    """The specialization constants of a manifest region at their defaults."""
    return [(c.spec_id, c.dtype, c.default) for c in region.consts if not c.runtime]


def kernel_statistics(
    dev: Device,
    spv: bytes,
    kernel: mr.Kernel,
    specs: Sequence[tuple[int, str, int | float]],
    wave: int,
) -> dict[str, Any]:
    """The driver's statistics of `kernel`'s pipeline, created at subgroup size `wave` with
    `specs` (the region's constants and the kernel's derived ones), then destroyed."""
    p = Pipeline(
        dev,
        spv,
        len(kernel.bindings),
        list(specs),
        wave,
        dev.info.full_subgroups and kernel.workgroup_size % wave == 0,
        capture_statistics=True,
    )
    try:
        return pipeline_statistics(dev, p)
    finally:
        p.destroy()


def collect(
    build_dir: str, waves: list[int], only: list[str] | None = None
) -> list[dict[str, Any]]:
    """Statistics of every kernel of the build (or of the kernels named in `only`) at each
    subgroup size in `waves` the device offers.  A kernel needing a feature the device lacks is
    not given to the driver (`refused` instead of `stats`)."""
    build = Build.load(build_dir)
    out: list[dict[str, Any]] = []
    with Device(capture_statistics=True) as dev:
        if not dev.statistics:
            raise RuntimeFailure(f"{dev.info.name} does not report pipeline statistics")
        for region in build.manifest.regions:
            spec = kernel_specs(region)
            defaults = {c.name: c.default for c in region.consts}
            for k in region.kernels():
                if only is not None and k.name not in only:
                    continue
                refused = feature_refusal(dev, k)
                if refused is not None:
                    out.append(
                        {
                            "region": region.name,
                            "kernel": k.name,
                            "device": dev.info.name,
                            "refused": refused,
                        }
                    )
                    continue
                for wave in waves:
                    if not dev.info.min_subgroup_size <= wave <= dev.info.max_subgroup_size:
                        continue
                    try:
                        derived = mf.derived_specs(k, defaults)
                    except ValueError as e:
                        raise RuntimeFailure(
                            f"kernel {k.name} at its default constants: its index math {e}"
                        ) from None
                    stats = kernel_statistics(dev, build.spv(k), k, spec + derived, wave)
                    out.append(
                        {
                            "region": region.name,
                            "kernel": k.name,
                            "wave": wave,
                            "device": dev.info.name,
                            "stats": stats,
                        }
                    )
    return out


def run_worker(
    build_dir: str | Path,
    waves: list[int],
    env_extra: dict[str, str] | None,
    only: list[str] | None = None,
) -> tuple[list[dict[str, Any]] | None, str]:
    """Run `collect` in a child process with `env_extra`; (results, '') or (None, why).  The
    child runs in the repository root (to import fusec), so the build folder is made absolute
    here: a relative one is the caller's."""
    env = {**os.environ, **(env_extra or {})}
    folder = Path(build_dir).resolve()
    kernels = [f"--kernel={name}" for name in only or []]
    proc = subprocess.run(
        [sys.executable, "-m", "fusec.runtime.actual", str(folder), *map(str, waves), *kernels],
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
    only = [a.removeprefix("--kernel=") for a in argv[1:] if a.startswith("--kernel=")]
    waves = [int(a) for a in argv[1:] if not a.startswith("--kernel=")]
    try:
        result = collect(argv[0], waves or [32, 64], only or None)
    except RuntimeFailure as exc:
        print(exc.render(), file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
