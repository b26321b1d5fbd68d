"""Kill switches: each one changes which path runs, and a bad value is refused."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fusec.runtime.device import RuntimeFailure
from fusec.runtime.gate import kill_switch
from tests.conftest import fusec_cli

KNOWN = ["rms_norm_mul_matvec", "gated_ffn"]


def test_unset_keeps_every_fusion() -> None:
    assert kill_switch("gated_ffn", KNOWN, {}) is None
    assert kill_switch("gated_ffn", KNOWN, {"FUSEC_DISABLE_FUSION": "0"}) is None


def test_global_switch() -> None:
    env = {"FUSEC_DISABLE_FUSION": "1"}
    assert kill_switch("gated_ffn", KNOWN, env) == "disabled by FUSEC_DISABLE_FUSION=1"


def test_per_region_switch() -> None:
    env = {"FUSEC_DISABLE": "gated_ffn"}
    assert kill_switch("gated_ffn", KNOWN, env) == "disabled by FUSEC_DISABLE"
    assert kill_switch("rms_norm_mul_matvec", KNOWN, env) is None
    both = {"FUSEC_DISABLE": "gated_ffn, rms_norm_mul_matvec"}
    assert kill_switch("rms_norm_mul_matvec", KNOWN, both) == "disabled by FUSEC_DISABLE"


@pytest.mark.parametrize("value", ["yes", "true", "", "2", " 1"])
def test_bad_global_values_are_refused(value: str) -> None:
    with pytest.raises(RuntimeFailure, match="FUSEC_DISABLE_FUSION must be 0 or 1"):
        kill_switch("gated_ffn", KNOWN, {"FUSEC_DISABLE_FUSION": value})


@pytest.mark.parametrize("value", ["gated", "", "gated_ffn,,", "GATED_FFN"])
def test_bad_region_lists_are_refused(value: str) -> None:
    with pytest.raises(RuntimeFailure, match="FUSEC_DISABLE names no region"):
        kill_switch("gated_ffn", KNOWN, {"FUSEC_DISABLE": value})


@pytest.mark.shaderc
@pytest.mark.vulkan
@pytest.mark.parametrize(
    ("env", "expect"),
    [
        ({}, ": fused;"),
        ({"FUSEC_DISABLE_FUSION": "1"}, ": fallback(disabled by FUSEC_DISABLE_FUSION=1);"),
        ({"FUSEC_DISABLE": "add_rms_norm"}, ": fallback(disabled by FUSEC_DISABLE);"),
    ],
)
def test_switches_change_the_path_check_reports(
    root: Path, env: dict[str, str], expect: str
) -> None:
    full = {k: v for k, v in os.environ.items() if not k.startswith("FUSEC_DISABLE")} | env
    proc = fusec_cli(
        [
            "check",
            "kernels.fuse",
            "--region",
            "add_rms_norm",
            "--const",
            "K=300",
        ],
        capture_output=True,
        text=True,
        cwd=root,
        env=full,
    )
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("add_rms_norm"))
    assert expect in line
    fused_dispatches = 1 if expect == ": fused;" else 4
    assert f"fused {fused_dispatches} dispatch(es)" in line


@pytest.mark.shaderc
@pytest.mark.vulkan
def test_a_bad_switch_stops_check_with_one_sentence(root: Path) -> None:
    env = {**os.environ, "FUSEC_DISABLE_FUSION": "yes"}
    proc = fusec_cli(
        ["check", "kernels.fuse", "--region", "add_rms_norm"],
        capture_output=True,
        text=True,
        cwd=root,
        env=env,
    )
    assert proc.returncode == 1
    assert proc.stderr.startswith("fusec: error: FUSEC_DISABLE_FUSION must be 0 or 1, not 'yes'")
    assert "Traceback" not in proc.stderr
