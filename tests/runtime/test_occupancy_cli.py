"""`fusec occupancy`: `--actual` with a build folder given by a relative path (the statistics
worker runs in another folder), and a table title that says "actual" only for driver numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import fusec_cli

SOURCE = """\
region scale(x: f32[N], g: f32[N]) -> y: f32[N]
    const N = 4096 in 1 .. 1048576
    launch workgroup 256
    y[n] = x[n] * g[n]
"""


@pytest.fixture
def relative_build(tmp_path: Path) -> Path:
    """tmp_path holding `build/`, made by `fusec build scale.fuse -o build` run there."""
    (tmp_path / "scale.fuse").write_text(SOURCE)
    proc = fusec_cli(
        ["build", "scale.fuse", "-o", "build"], capture_output=True, text=True, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    return tmp_path


def _radv_or_skip() -> None:
    from fusec.runtime.actual import radv_env

    if radv_env("gfx1201") is None:
        pytest.skip("RADV (mesa-vulkan-drivers) is not installed")


@pytest.mark.slow
@pytest.mark.shaderc
def test_actual_with_a_relative_build_folder(relative_build: Path) -> None:
    _radv_or_skip()
    proc = fusec_cli(
        ["occupancy", "build", "--actual", "--target", "gfx1201", "--json"],
        capture_output=True,
        text=True,
        cwd=relative_build,
    )
    assert proc.returncode == 0, proc.stderr
    assert "fusec: note" not in proc.stderr, proc.stderr
    rows = json.loads(proc.stdout)
    assert [(r["kernel"], r["wave"]) for r in rows] == [
        ("fused", 32),
        ("fused", 64),
        ("unfused.0", 32),
        ("unfused.0", 64),
    ]
    for r in rows:
        assert r["actual_presched_vgprs"] == 4, r
        assert r["actual_spills"] == 0 and r["actual_waves_per_simd"] == 16, r
    table = fusec_cli(
        ["occupancy", "build", "--actual", "--target", "gfx1201"],
        capture_output=True,
        text=True,
        cwd=relative_build,
    )
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[0].strip() == (
        "fusec occupancy build (estimated; actual from the driver)"
    )


@pytest.mark.shaderc
def test_title_says_actual_only_with_driver_numbers(
    relative_build: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from fusec.runtime.cli import main

    monkeypatch.chdir(relative_build)
    assert main(["occupancy", "build", "--target", "gfx1201"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].strip() == "fusec occupancy build (estimated)"
    assert "act_" not in out
    # --actual where no driver can give numbers: the title does not claim any
    monkeypatch.setattr("fusec.runtime.actual.radv_env", lambda family: None)
    assert main(["occupancy", "build", "--target", "gfx1201", "--actual"]) == 0
    got = capsys.readouterr()
    assert got.out.splitlines()[0].strip() == (
        "fusec occupancy build (estimated; no driver statistics)"
    )
    assert "no statistics for gfx1201" in got.err
