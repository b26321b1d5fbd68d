"""Input value ranges (`x: f32[N] in LO .. HI`): the values an input is meant to hold, which
`fusec check` draws its random inputs from.  Checked in the manifest, in the drawn inputs, and
on lavapipe with negative values of an i32 input (an i32 element used as a number keeps its
sign)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fusec.codegen.build import BuildResult, build_source, write_build
from fusec.dsl.reference import dequantize
from fusec.dsl.types import DType
from fusec.runtime.device import Device
from fusec.runtime.dispatch import Build
from fusec.runtime.verify import check_region, random_inputs

pytestmark = pytest.mark.shaderc

TEXT = """
region scaled(x: f32[K] in -2.5 .. -0.5, m: i32[K] in -8 .. 8, W: q8_0[N, K] in 1 .. 2) -> y: f32[N]
    const K = 64 in 32 .. 4096, N = 5 in 1 .. 64
    launch workgroup 64, subgroup any, rows_per_subgroup 1
    p[n] = sum(k: W[n, k] * x[k] * m[k])        layout n -> subgroup, k -> lane
    y[n] = p[n]

region plain(x: f32[K], n: u32[K]) -> y: f32[K]
    const K = 64 in 1 .. 4096
    launch workgroup 64
    y[k] = x[k] * n[k]
"""


@pytest.fixture(scope="module")
def result() -> BuildResult:
    return build_source(TEXT, "ranges.fuse")


def _region(result: BuildResult, name: str) -> dict[str, Any]:
    """The region as manifest.json holds it."""
    region = result.manifest.region(name)
    assert region is not None
    return region.to_json()


def test_ranges_reach_the_manifest(result: BuildResult) -> None:
    inputs = {b["name"]: b.get("values") for b in _region(result, "scaled")["inputs"]}
    assert inputs == {"x": [-2.5, -0.5], "m": [-8, 8], "W": [1, 2]}
    assert all("values" not in b for b in _region(result, "plain")["inputs"])


def test_inputs_are_drawn_from_their_ranges(result: BuildResult) -> None:
    region = result.manifest.region("scaled")
    assert region is not None
    consts = {"K": 256, "N": 7}
    for draw in range(5):
        a = random_inputs(region, consts, np.random.default_rng())
        x, m = a["x"], a["m"]
        w = dequantize(a["W"], DType.Q8_0)
        assert x.shape == (256,) and x.dtype == np.float32
        assert np.all((x >= -2.5) & (x <= -0.5)), draw
        assert m.dtype == np.int32 and np.all((m >= -8) & (m <= 8) & (m != 0)), draw
        assert np.any(m < 0) and np.any(m > 0)
        # q8_0 rounding moves a value by at most half a step of its block's scale (max / 127)
        assert np.all((w >= 1 - 2 / 254) & (w <= 2 + 2 / 254)), draw
    plain_region = result.manifest.region("plain")
    assert plain_region is not None
    plain = random_inputs(plain_region, {"K": 1000}, np.random.default_rng())
    assert plain["x"].min() < 0 < plain["x"].max()  # no range: standard normal
    assert np.all((plain["n"] >= 1) & (plain["n"] <= 99))


@pytest.mark.vulkan
@pytest.mark.parametrize("consts", [{}, {"K": 224, "N": 33}])
def test_negative_i32_values_match_the_reference(
    dev: Device, result: BuildResult, tmp_path: Path, consts: dict[str, int]
) -> None:
    out = tmp_path / "b"
    write_build(result, out)
    rep = check_region(dev, Build.load(out), result.program.region("scaled"), consts)
    assert rep.path == "fused"
    assert rep.ok, [(o.name, o.fused_error, o.unfused_error) for o in rep.outputs]


def test_attention_combine_draws_positive_sums(build: Any) -> None:
    """lp is a sum of exponentials: drawn from either sign, the denominator could cancel."""
    region = build.region("attention_combine")
    lp = region.buffer("lp")
    assert lp is not None and lp.values == (0.5, 64)
    a = random_inputs(region, {"NQ": 32, "D": 128, "NS": 8}, np.random.default_rng())
    assert np.all(a["lp"] >= 0.5)
