"""`&&`, `||`, `!` and the functions erf, gelu, gelu_tanh, softplus, clamp and float (issue 15):
parsed, checked, laid out by `fmt`, and computed alike by the numpy reference and the GLSL on
the Vulkan device, element by element (not only normwise), over the ranges where each function
is hard: erf's two branches and its switch at |x| = 0.5, tiny and large arguments."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fusec.dsl.check import check
from fusec.dsl.diagnostics import DiagnosticError
from fusec.dsl.format import format_source
from fusec.dsl.parse import parse
from fusec.dsl.reference import run_reference

FUNCTIONS = """\
region fns(x: f32[N], lo: f32[N], hi: f32[N]) -> (
        e: f32[N], g: f32[N], t: f32[N], s: f32[N], c: f32[N], f: f32[N])
    const N = 4096 in 1 .. 65536, M = 7 in 1 .. 65536
    launch workgroup 64
    e[n] = erf(x[n])
    g[n] = gelu(x[n])
    t[n] = gelu_tanh(x[n])
    s[n] = softplus(x[n])
    c[n] = clamp(x[n], lo[n], hi[n])
    f[n] = float(n % M) * 0.5 + float(M)
"""

LOGIC = """\
region logic(a: f32[N], b: f32[N]) -> y: f32[N], z: f32[N], w: f32[N]
    const N = 64 in 1 .. 4096, M = 20 in 1 .. 4096
    launch workgroup 64
    y[n] = a[n] && b[n]
    z[n] = a[n] || !b[n]
    w[n] = select(n >= M && a[n] > 0.0 || !(b[n] < 0.5), a[n] + 1.0, b[n] - 1.0)
"""


def _arguments(rng: np.random.Generator, n: int) -> np.ndarray:
    """Arguments where the functions are hard: tiny, around erf's switch at 0.5, where erf
    saturates, and large enough that exp overflows f32; both signs; never 0."""
    parts = [
        rng.uniform(1e-7, 1e-3, n // 8),
        rng.uniform(0.45, 0.55, n // 8),
        rng.uniform(0.0, 1.0, n // 8),
        rng.uniform(1.0, 4.0, n // 8),
        rng.uniform(4.0, 12.0, n // 8),
        rng.uniform(12.0, 120.0, n // 8),
    ]
    mags = np.concatenate(parts)
    mags = np.concatenate([mags, rng.uniform(0.0, 2.0, n - mags.size)])
    mags[mags == 0] = 0.25
    signs = np.where(rng.random(n) < 0.5, -1.0, 1.0)
    return (mags * signs).astype(np.float32)


def _run(
    dev: Any, text: str, name: str, inputs: dict[str, np.ndarray], consts: dict[str, int], tmp: Path
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(fused outputs, unfused outputs) of a region built from `text`, run on `dev`."""
    from fusec.codegen.build import build_source, write_build
    from fusec.runtime.dispatch import Build, RegionRunner

    build = Build.load(write_build(build_source(text, f"{name}.fuse"), tmp / name))
    runner = RegionRunner(dev, build, name, consts)
    try:
        fused = runner.run(inputs, fused=True)
        unfused = runner.run(inputs, fused=False)
    finally:
        runner.close()
    return fused.outputs, unfused.outputs


@pytest.mark.shaderc
@pytest.mark.vulkan
def test_functions_element_by_element(dev: Any, tmp_path: Path) -> None:
    rng = np.random.default_rng()
    n = 4096
    x = _arguments(rng, n)
    lo = rng.uniform(-1.0, 0.5, n).astype(np.float32)
    hi = (lo + rng.uniform(0.01, 1.0, n)).astype(np.float32)
    inputs = {"x": x, "lo": lo, "hi": hi}
    consts = {"N": n, "M": int(rng.integers(3, 50))}
    ref = run_reference(check(parse(FUNCTIONS, "fns.fuse")).region("fns"), inputs, consts)
    x64 = x.astype(np.float64)
    # the reference itself against the definitions
    erf = np.array([math.erf(v) for v in x64])
    np.testing.assert_allclose(ref["e"], erf, rtol=1.2e-7)  # the outputs are f32
    phi = np.array([math.erf(v / math.sqrt(2)) for v in x64])
    np.testing.assert_allclose(ref["g"], 0.5 * x64 * (1 + phi), rtol=1.2e-7)
    softplus = np.log1p(np.exp(-np.abs(x64))) + np.maximum(x64, 0)
    np.testing.assert_allclose(ref["s"], softplus, rtol=1.2e-7, atol=1.2e-38)  # f32 underflow
    for outputs in _run(dev, FUNCTIONS, "fns", inputs, consts, tmp_path):
        got = {k: v.astype(np.float64) for k, v in outputs.items()}
        # erf: relative 1e-6 below |x| = 0.5 (the series), absolute 3e-7 above (A&S 7.1.26)
        small = np.abs(x64) < 0.5
        rel = np.abs(got["e"][small] - ref["e"][small]) / np.abs(ref["e"][small])
        assert rel.max() < 1e-6, rel.max()
        assert np.abs(got["e"][~small] - ref["e"][~small]).max() < 3e-7
        # gelu, its tanh form and softplus: within 1e-6 of max(1, |value|), no NaN or inf
        for name in ("g", "t", "s"):
            assert np.all(np.isfinite(got[name])), name
            err = np.abs(got[name] - ref[name]) / np.maximum(1.0, np.abs(ref[name]))
            assert err.max() < 2e-6, (name, err.max(), x64[err.argmax()])
        np.testing.assert_array_equal(got["c"], ref["c"])  # min and max are exact
        np.testing.assert_array_equal(got["f"], ref["f"])


@pytest.mark.shaderc
@pytest.mark.vulkan
def test_logic_truth_tables(dev: Any, tmp_path: Path) -> None:
    rng = np.random.default_rng()
    n = 64
    # every pair of zero, a tiny value, one, a negative and NaN-free values around 0.5
    values = np.array([0.0, 1e-30, 1.0, -2.0, 0.49, 0.51, 3.0, -0.0], np.float32)
    a = rng.choice(values, n).astype(np.float32)
    b = rng.choice(values, n).astype(np.float32)
    consts = {"N": n, "M": int(rng.integers(1, n))}
    ref = run_reference(check(parse(LOGIC, "logic.fuse")).region("logic"), {"a": a, "b": b}, consts)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    np.testing.assert_array_equal(ref["y"], ((a64 != 0) & (b64 != 0)).astype(float))
    np.testing.assert_array_equal(ref["z"], ((a64 != 0) | (b64 == 0)).astype(float))
    idx = np.arange(n)
    cond = ((idx >= consts["M"]) & (a64 > 0)) | ~(b64 < 0.5)
    np.testing.assert_array_equal(ref["w"], np.where(cond, a64 + 1, b64 - 1))
    for outputs in _run(dev, LOGIC, "logic", {"a": a, "b": b}, consts, tmp_path):
        for name in ("y", "z", "w"):
            np.testing.assert_array_equal(outputs[name].astype(np.float64), ref[name])


def test_precedence_follows_c() -> None:
    """`!` binds like a unary minus, `&&` before `||`, both after comparisons."""
    text = LOGIC.replace("y[n] = a[n] && b[n]", "y[n] = !a[n] < 0.5 || a[n] > 0.0 && b[n] > 0.0")
    region = check(parse(text, "p.fuse")).region("logic")
    a = np.array([0.0, 1.0, -1.0, 2.0], np.float32)
    b = np.array([1.0, 1.0, 1.0, -1.0], np.float32)
    y = run_reference(region, {"a": a, "b": b}, {"N": 4, "M": 2})["y"]
    # ((!a) < 0.5) || ((a > 0) && (b > 0)): !a is 1 for a == 0, else 0
    want = ((a == 0).astype(float) < 0.5) | ((a > 0) & (b > 0))
    np.testing.assert_array_equal(y, want.astype(float))


def test_fmt_glues_not_and_spaces_logic() -> None:
    text = LOGIC.replace("!b[n]", "! b[n]").replace("a[n] && b[n]", "a[n]&&b[n]")
    out = format_source(text, "l.fuse")
    assert "y[n] = a[n] && b[n]" in out
    assert "z[n] = a[n] || !b[n]" in out
    assert "!(b[n] < 0.5)" in out
    assert format_source(out, "l.fuse") == out


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("y[n] = a[n] & b[n]", "unexpected character '&'"),
        ("y[n] = clamp(a[n], b[n])", "'clamp' takes 3 argument(s), not 2"),
        ("y[n] = erf(a[n], b[n])", "'erf' takes 1 argument(s), not 2"),
        ("y[n] = gelu_fast(a[n])", "unknown function 'gelu_fast'"),
    ],
)
def test_misuse_is_one_diagnostic(line: str, message: str) -> None:
    text = LOGIC.replace("y[n] = a[n] && b[n]", line)
    with pytest.raises(DiagnosticError) as err:
        check(parse(text, "m.fuse"))
    rendered = err.value.render()
    assert message in rendered and "m.fuse:4:" in rendered, rendered
