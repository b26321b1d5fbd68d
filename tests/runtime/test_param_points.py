"""`fusec check` runs a region's run-time params at several points of their declared range
(issue 15): the low end, the next value, the middle and the high end, each kept where the
region's indices stay inside their dimensions at the constants of the run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fusec.codegen.build import build_source, write_build
from fusec.dsl.check import check
from fusec.dsl.parse import parse

SOURCE = """\
region cache_row(x: f32[D]) -> kc: state f32[C, D]
    const D = 16 in 1 .. 256, C = 40 in 1 .. 4096
    param pos in 0 .. 100
    launch workgroup 64
    kc[pos, d] = x[d] * (pos + 1)

region ramp(x: f32[N]) -> y: f32[N]
    const N = 64 in 1 .. 4096
    param pos in 3 .. 1003, step in 2 .. 10
    launch workgroup 64
    y[n] = x[n] * pos + step
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from fusec.runtime.dispatch import Build

    out = tmp_path_factory.mktemp("points") / "b"
    return Build.load(write_build(build_source(SOURCE, "points.fuse"), out))


@pytest.mark.shaderc
def test_points_span_the_range(built: Any) -> None:
    from fusec.runtime.verify import param_points

    program = check(parse(SOURCE, "points.fuse"))
    ramp = param_points(built, program.region("ramp"), {"N": 64})
    assert [p["pos"] for p in ramp] == [3, 4, 503, 1003]
    assert [p["step"] for p in ramp] == [2, 3, 6, 10]
    # the cache has C rows: pos stops at C - 1, whatever C is
    for rows in (40, 7, 300):
        points = param_points(built, program.region("cache_row"), {"D": 16, "C": rows})
        assert [p["pos"] for p in points] == sorted({0, 1, min(50, rows - 1), min(100, rows - 1)})
    # a param set with --const is left alone
    assert param_points(built, program.region("ramp"), {"N": 64, "pos": 9, "step": 4}) == [{}]


@pytest.mark.shaderc
@pytest.mark.vulkan
def test_check_reports_the_points_and_the_worst(tmp_path: Path) -> None:
    from tests.conftest import fusec_cli

    (tmp_path / "points.fuse").write_text(SOURCE)
    proc = fusec_cli(
        ["check", "points.fuse", "--seed", "11", "--const", "C=60"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "cache_row: run-time params checked at pos=0; pos=1; pos=50; pos=59" in out, out
    assert (
        "ramp: run-time params checked at pos=3, step=2; pos=4, step=3; pos=503, step=6" in out
    ), out
    assert out.count(" ok") == 2 and "MISMATCH" not in out
