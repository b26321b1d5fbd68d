"""qkv_rope (NEOX, Qwen3 per-head norm) and qkv_rope_normal (NORMAL pairs): the reference
against an independent RoPE, then fused and unfused against the reference on lavapipe."""

from __future__ import annotations

import numpy as np
import pytest

from fusec.dsl.check import check
from fusec.dsl.parse import parse_file
from fusec.dsl.reference import run_reference
from fusec.runtime.device import Device
from fusec.runtime.dispatch import Build
from fusec.runtime.verify import check_region
from tests.conftest import ROOT

PROGRAM = check(parse_file(ROOT / "kernels.fuse"))
SMALL = {"H": 256, "NQ": 4, "NK": 2, "D": 16, "n_rot": 12}  # dims past n_rot pass through


def _rope(v: np.ndarray, pos: int, base: float, n_rot: int, neox: bool) -> np.ndarray:
    """FACTS.md: theta_i = pos * base^(-2i / n_rot); NEOX pairs (i, i + n_rot/2), NORMAL
    (2i, 2i + 1); x0' = x0 cos - x1 sin, x1' = x0 sin + x1 cos; dims >= n_rot unchanged."""
    out = v.copy()
    for i in range(n_rot // 2):
        a, b = (i, i + n_rot // 2) if neox else (2 * i, 2 * i + 1)
        th = pos * base ** (-2.0 * i / n_rot)
        out[a] = v[a] * np.cos(th) - v[b] * np.sin(th)
        out[b] = v[a] * np.sin(th) + v[b] * np.cos(th)
    return out


@pytest.mark.parametrize("region", ["qkv_rope", "qkv_rope_normal"])
@pytest.mark.parametrize("pos", [0, 1, 4095, 100000])
def test_reference_rope_matches_an_independent_one(region: str, pos: int) -> None:
    rng = np.random.default_rng()
    c = {**SMALL, "pos": pos}
    h, nq, nk, d, n_rot = c["H"], c["NQ"], c["NK"], c["D"], c["n_rot"]
    neox = region == "qkv_rope"
    base = 1e6 if neox else 1e4
    eps = 1e-6
    x = rng.standard_normal(h).astype(np.float32)
    g = rng.standard_normal(h).astype(np.float32)
    w = rng.standard_normal(((nq + 2 * nk) * d, h)).astype(np.float16)
    inputs = {"x": x, "g": g, "W": w}
    qn = rng.standard_normal(d).astype(np.float32)
    kn = rng.standard_normal(d).astype(np.float32)
    if neox:
        inputs |= {"qn": qn, "kn": kn}
    got = run_reference(PROGRAM.region(region), inputs, c)["qkv"].astype(np.float64)
    xd = x.astype(np.float64)
    xn = xd / np.sqrt(np.mean(xd * xd) + eps) * g
    heads = (w.astype(np.float64) @ xn).reshape(nq + 2 * nk, d)
    want = heads.copy()
    for i in range(nq + nk):
        v = heads[i]
        if neox:  # Qwen3: per-head RMSNorm of Q and K before RoPE
            v = v / np.sqrt(np.mean(v * v) + eps) * (qn if i < nq else kn)
        want[i] = _rope(v, pos, base, n_rot, neox)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.slow
@pytest.mark.shaderc
@pytest.mark.vulkan
@pytest.mark.parametrize(
    ("region", "pos"),
    [
        ("qkv_rope", 0),
        ("qkv_rope", 1),
        ("qkv_rope", 4095),
        ("qkv_rope", 100000),
        ("qkv_rope_normal", 0),
        ("qkv_rope_normal", 1),
        ("qkv_rope_normal", 4095),
        ("qkv_rope", 16777215),  # the declared end: angles computed in f64
        ("qkv_rope_normal", 131071),
    ],
)
def test_qkv_rope_on_lavapipe(dev: Device, build: Build, region: str, pos: int) -> None:
    rep = check_region(dev, build, PROGRAM.region(region), {"pos": pos})
    assert rep.path == "fused"
    assert (rep.fused_dispatches, rep.fused_barriers) == (1, 0)
    assert rep.unfused_dispatches >= 5
    for o in rep.outputs:
        assert o.fused_error <= o.tolerance and o.unfused_error <= o.tolerance, o
