"""ACO's scheduler aims (codegen/estimate.py `scheduler_aim`) held against the driver: a probe
with loads enough to move (tests/estimator/probe.py) ends at the register bound of the aim, on
gfx1201 and navi21, wave32 and wave64, for demands across the occupancy steps; and the
estimate, from our own demand and the peak with loads moved up (`loads_up`), says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from fusec.codegen.estimate import estimate_waves, scheduled_fewest_waves
from fusec.codegen.targets import TARGETS, occupancy
from fusec.runtime.actual import radv_env
from tests.conftest import ROOT

pytestmark = [pytest.mark.shaderc, pytest.mark.vulkan]
HELD = "0,24,48,56,64,80,104,136"


@pytest.mark.parametrize("family", ["gfx1201", "navi21"])
@pytest.mark.parametrize("wave", [32, 64])
def test_probe_ends_at_the_scheduler_bound(family: str, wave: int) -> None:
    env = radv_env(family)
    if env is None:
        pytest.skip("RADV (mesa-vulkan-drivers) not installed")
    proc = subprocess.run(
        [sys.executable, "-m", "tests.estimator.probe", str(wave), "128", HELD],
        capture_output=True,
        text=True,
        env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    t = TARGETS[family]
    for line in proc.stdout.splitlines():
        r = json.loads(line)
        aco = occupancy(t, wave, r["vgprs"], 0, 128)
        # the aim follows ACO's own demand; ours is within a register or two of it
        before = occupancy(t, wave, r["presched"], 0, 128)
        assert scheduled_fewest_waves(t, wave, r["presched"], before, 128, 0) == aco, r
        assert abs(r["demand"] - r["presched"]) <= 2, r
        # 32 vec4 loads per iteration moved up: about 128 registers more than the demand
        assert r["loads_up"] >= r["demand"] + 120, r
        assert estimate_waves(t, wave, r["demand"], r["loads_up"], 0, 128) == aco, r
