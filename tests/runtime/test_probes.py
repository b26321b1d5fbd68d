"""The committed bandwidth probe is the compiled form of its source, and it copies."""

from __future__ import annotations

from pathlib import Path

import pytest

from codegen.shaderc import compile_glsl
from runtime.device import Device
from runtime.timing import PROBE, copy_bandwidth_gbs


@pytest.mark.shaderc
def test_committed_probe_matches_its_source() -> None:
    src = PROBE.with_suffix(".comp").read_text()
    fresh = compile_glsl(src, "stream_copy")
    assert fresh == PROBE.read_bytes(), "rebuild runtime/probes/stream_copy.spv (see its .comp)"


@pytest.mark.vulkan
def test_copy_probe_measures_a_positive_rate(tmp_path: Path) -> None:
    with Device() as dev:
        gbs = copy_bandwidth_gbs(dev, size=1 << 22, reps=3)
    assert 0.1 < gbs < 100_000
