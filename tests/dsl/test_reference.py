"""The numpy reference against the formulas of FACTS.md, on fresh random inputs."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fusec.dsl.check import check
from fusec.dsl.parse import parse_file
from fusec.dsl.reference import run_reference
from tests.conftest import ROOT

PROGRAM = check(parse_file(ROOT / "kernels.fuse"))


@settings(max_examples=25, deadline=None, derandomize=True)
@given(k=st.integers(1, 300), n=st.integers(1, 40), seed=st.integers(0, 2**32 - 1))
def test_rms_norm_mul_matvec_matches_formula(k: int, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(k).astype(np.float32)
    g = rng.standard_normal(k).astype(np.float32)
    w = rng.standard_normal((n, k)).astype(np.float16)
    out = run_reference(
        PROGRAM.region("rms_norm_mul_matvec"), {"x": x, "g": g, "W": w}, {"K": k, "N": n}
    )
    xd = x.astype(np.float64)
    xn = xd / np.sqrt(np.mean(xd * xd) + 1e-6) * g.astype(np.float64)
    expect = w.astype(np.float64) @ xn
    assert out["y"].dtype == np.float32 and out["y"].shape == (n,)
    np.testing.assert_allclose(out["y"], expect, rtol=1e-5, atol=1e-5 * np.abs(expect).max())


def test_reference_catches_a_wrong_weight() -> None:
    rng = np.random.default_rng()
    x, g = rng.standard_normal(64).astype(np.float32), rng.standard_normal(64).astype(np.float32)
    w = rng.standard_normal((8, 64)).astype(np.float32)
    region = PROGRAM.region("rms_norm_mul_matvec_f32")
    a = run_reference(region, {"x": x, "g": g, "W": w}, {"K": 64, "N": 8})["y"]
    w[3, 5] += 1.0
    b = run_reference(region, {"x": x, "g": g, "W": w}, {"K": 64, "N": 8})["y"]
    assert np.abs(a - b)[3] > 0 and np.all(a[[0, 1, 2, 4, 5, 6, 7]] == b[[0, 1, 2, 4, 5, 6, 7]])
