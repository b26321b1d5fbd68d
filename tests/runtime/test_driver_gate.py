"""The gate confirms at pipeline creation (runtime/gate.py `confirm`, RegionRunner.choose):
where the device reports pipeline executable statistics, the driver's numbers of the freshly
created fused pipeline are judged against the budget, and a fused kernel that really spills falls
back to the unfused chain with the driver's numbers and the estimate that was wrong.

The device is RADV's null device forced to gfx1201 (a child process: the driver is chosen through
the environment); it creates pipelines with the real AMD compiler (ACO) and never dispatches."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fusec.codegen import manifest as mf
from fusec.codegen import manifest_records as mr
from fusec.codegen.budget import Budget
from fusec.codegen.targets import TARGETS
from fusec.runtime.gate import (
    NVIDIA_LOCAL_MEMORY_OFFSET,
    KernelNumbers,
    driver_numbers,
    judge_driver,
)
from tests.conftest import ROOT

# ACO keeps the per-lane array of 4 x 64 floats live across the slot reductions: ~259 Pre-Sched
# VGPRs on gfx1201, a few spilled (FACTS.md); `scale` fits easily
SOURCE = """\
region regtile(x: f32[T, 4, 64], g: f32[64]) -> y: f32[T, 4, 64]
    const T = 64 in 1 .. 65536
    launch workgroup 64, subgroup >= 4
    tile (i: 64, s: 4) lane s, slot i, per t
    a = x[t, s, i] * g[i]
    b = exp(a - max(i: a))
    c = b / sum(i: b)
    d = a * c - sum(i: a * c)
    e = d * rsqrt(sum(i: d * d) / 64.0 + 1e-6)
    y[t, s, i] = e * a + c * b

region scale(x: f32[N], g: f32[N]) -> y: f32[N]
    const N = 4096 in 1 .. 1048576
    launch workgroup 256
    y[n] = x[n] * g[n]
"""

# run in the child: the runtime's decision for each region, and the driver's numbers it used
CHILD = """
import json, sys, time
import attrs
from fusec.runtime.device import Device
from fusec.runtime.dispatch import Build, RegionRunner
build = Build.load(sys.argv[1])
out = {}
with Device() as dev:
    for name in sys.argv[2:]:
        runner = RegionRunner(dev, build, name)
        try:
            path, kernels = runner.choose(True)
            out[name] = {
                "device": dev.info.name,
                "statistics": dev.statistics,
                "path": path,
                "kernels": [k.name for k in kernels],
                "checks": [attrs.asdict(c) for c in runner.driver_checks],
                "kept": sorted(runner._confirmed),
            }
        finally:
            runner.close()
print(json.dumps(out))
"""


def _decide(folder: Path, regions: list[str]) -> dict[str, Any]:
    from fusec.runtime.actual import radv_env

    env = radv_env("gfx1201")
    if env is None:
        pytest.skip("RADV (mesa-vulkan-drivers) is not installed")
    import os

    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(folder), *regions],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from fusec.codegen.build import build_file

    src = tmp_path_factory.mktemp("src") / "regtile.fuse"
    src.write_text(SOURCE)
    out = tmp_path_factory.mktemp("regtile") / "build"
    build_file(src, out)
    return out


def _with_wrong_estimate(folder: Path, dest: Path) -> Path:
    """A copy of the build whose manifest claims that regtile's fused kernel needs 100 VGPRs and
    spills nothing on gfx1201 (resealed, so it loads as an intact build)."""
    import shutil

    shutil.copytree(folder, dest)
    data = json.loads((dest / "manifest.json").read_text())
    region = next(r for r in data["regions"] if r["name"] == "regtile")
    for est in region["fused"][0]["estimates"]:
        if est["target"] == "gfx1201":
            est.update(vgprs=100, spills=0, waves_per_simd=max(1, 768 // 100))
    for v in region["verdicts"]["gfx1201"].values():
        v.update(accepted=True, reason="within budget")
    (dest / "manifest.json").write_text(json.dumps(mf.seal(data), indent=1))
    return dest


@pytest.mark.slow
@pytest.mark.shaderc
def test_regtile_never_runs_fused_on_gfx1201(folder: Path) -> None:
    """With the estimator's own numbers: the budget gate refuses regtile before its pipeline
    exists when the estimate predicts the spill (no driver numbers then), the driver's
    numbers refuse it otherwise."""
    got = _decide(folder, ["regtile"])["regtile"]
    assert got["device"] == "Null hardware (RADV GFX1201)" and got["statistics"]
    assert got["kept"] == []
    if got["path"].startswith("fallback(budget: "):
        assert got["path"].startswith("fallback(budget: regtile: gfx1201 wave64: ")
        assert "VGPRs would spill" in got["path"] and got["checks"] == []
    else:
        assert got["path"].startswith("fallback(driver: gfx1201 wave64: regtile spills ")


@pytest.mark.slow
@pytest.mark.shaderc
def test_the_driver_refuses_what_a_wrong_estimate_accepted(folder: Path, tmp_path: Path) -> None:
    wrong = _with_wrong_estimate(folder, tmp_path / "wrong")
    got = _decide(wrong, ["regtile", "scale"])
    regtile = got["regtile"]
    (check,) = regtile["checks"]
    assert (check["kernel"], check["target"], check["wave"]) == ("regtile", "gfx1201", 64)
    assert check["estimated"] == {
        "vgprs": 100,
        "spills": 0,
        "lds_bytes": 0,
        "waves_per_simd": 7,
    }
    driver = check["driver"]
    assert driver["spills"] > 0 and driver["vgprs"] > 256 and check["allocated_vgprs"] == 256
    assert driver["waves_per_simd"] == 2  # 768 // 264 (256 VGPRs in granules of 12), wave64
    assert regtile["path"] == f"fallback(driver: {check['refusal']})"
    assert re.fullmatch(
        rf"fallback\(driver: gfx1201 wave64: regtile spills {driver['spills']} VGPRs "
        rf"\(estimated 0\), demand {driver['vgprs']} VGPRs \(estimated 100\), budget 0\)",
        regtile["path"],
    ), regtile["path"]
    assert regtile["kernels"] == [f"regtile.unfused.{i}" for i in range(6)]
    assert regtile["kept"] == []  # the refused pipeline was destroyed
    # a kernel the driver confirms runs fused, its created pipeline kept for pipelines_for
    scale = got["scale"]
    assert scale["path"] == "fused" and scale["kept"] == ["scale"]
    (fits,) = scale["checks"]
    assert fits["refusal"] is None
    assert fits["driver"] == {"vgprs": 4, "spills": 0, "lds_bytes": 0, "waves_per_simd": 16}
    assert fits["estimated"]["spills"] == 0 and fits["estimated"]["waves_per_simd"] == 16


def test_nvidia_local_memory_counts_as_spills() -> None:
    """NVIDIA's `Local Memory Size` is offset by 2^36 (FACTS.md); what is above it spills."""
    sm90 = TARGETS["sm90"]
    stats = {
        "Register Count": 40.0,
        "Local Memory Size": float(NVIDIA_LOCAL_MEMORY_OFFSET + 64),
        "Shared Memory Size": 0.0,
    }
    numbers = driver_numbers(sm90, 32, stats, 256)
    assert numbers is not None
    driver, allocated = numbers
    assert allocated == 40 and driver == KernelNumbers(40, 16, 0, 12)
    why = judge_driver(
        "k", sm90, 32, KernelNumbers(38, 0, 0, 12), driver, allocated, Budget(4, 255, 0)
    )
    assert why == (
        "sm90 wave32: k spills 16 VGPRs (estimated 0), demand 40 VGPRs (estimated 38), budget 0"
    )
    clean = {"Register Count": 40.0, "Local Memory Size": float(NVIDIA_LOCAL_MEMORY_OFFSET)}
    numbers = driver_numbers(sm90, 32, clean, 256)
    assert numbers is not None and numbers[0].spills == 0
    assert driver_numbers(sm90, 32, {"Binary Size": 1.0}, 256) is None


def test_driver_occupancy_below_budget_names_the_estimate() -> None:
    gfx1201 = TARGETS["gfx1201"]
    numbers = driver_numbers(
        gfx1201, 64, {"VGPRs": 120.0, "Pre-Sched VGPRs": 118.0, "LDS size": 0.0}, 256
    )
    assert numbers is not None
    driver, allocated = numbers
    assert driver == KernelNumbers(118, 0, 0, 6)  # 768 // 120
    why = judge_driver(
        "k", gfx1201, 64, KernelNumbers(60, 0, 0, 12), driver, allocated, Budget(8, 256, 0)
    )
    assert why == (
        "gfx1201 wave64: k runs 6 waves per SIMD (estimated 12; VGPRs 120, LDS 0 B) < budget 8"
    )
    assert judge_driver("k", gfx1201, 64, None, driver, allocated, Budget(4, 256, 0)) is None
    assert judge_driver("k", gfx1201, 64, None, driver, allocated, Budget(4, 100, 0)) == (
        "gfx1201 wave64: k needs 118 VGPRs (no estimate) > budget 100"
    )


def test_named_target_wave_follows_the_subgroup_requirement() -> None:
    """The gate judges a named target at the wave size its driver would give the kernel: RADV's
    default (wave64 past 32 threads) unless the kernel's requirement excludes it."""
    from fusec.runtime.gate import default_wave

    gfx1201, sm90 = TARGETS["gfx1201"], TARGETS["sm90"]
    assert default_wave(gfx1201, 256) == 64
    assert default_wave(gfx1201, 32) == 32
    assert default_wave(gfx1201, 256, mr.Subgroup("any", ())) == 64
    assert default_wave(gfx1201, 256, mr.Subgroup("choice", (32,))) == 32
    assert default_wave(gfx1201, 32, mr.Subgroup("at_least", (64,))) == 64
    assert default_wave(sm90, 256, mr.Subgroup("at_least", (16,))) == 32
