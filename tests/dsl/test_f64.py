"""Stages computed in double precision (`in register as f64`, issue 15 item 5): a rotary
angle holds 1e-4 over a position range of 131072 where its f32 form does not, the generator's
double exp, log and pow are exact enough to survive a factor of 1e5 before sin and cos, the
kernels that need doubles say so (feature `float64`) and a device without them refuses them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fusec.dsl import ir
from fusec.dsl.check import check
from fusec.dsl.parse import parse
from fusec.dsl.reference import run_reference
from fusec.dsl.types import DType
from tests.conftest import fusec_cli

ROPE = """\
region rope(x: f32[H, D]) -> y: f32[H, D]
    const H = 4 in 1 .. 64, D = 64 in 2 .. 256, n_rot = 64 in 2 .. 256, base = 1e6
    param pos in 0 .. 131071
    launch workgroup 64, subgroup any
    th[d: D] = pos * pow(base, -2.0 * (d % (n_rot / 2)) / n_rot)  in register as f64
    sg[d: D] = select(d < n_rot / 2, -1.0, 1.0)
    rot[h: H, d: D] = x[h, d] * cos(th[d]) + sg[d] * x[h, (d + n_rot / 2) % n_rot] * sin(th[d])
    y[h: H, d: D] = select(d < n_rot, rot[h, d], x[h, d])
"""

# exp, log and pow in double, each times 1e5 before sin or cos: an error of 1e-12 in the double
# result is 1e-7 in the output (angles up to 4e6 here; fn_angle64 keeps about 1e-9 of them)
AMPLIFIED = """\
region amp(a: f32[N], b: f32[N]) -> (s: f32[N], c: f32[N], p: f32[N], q: f32[N])
    const N = 1024 in 1 .. 65536, A = 1e5
    launch workgroup 64
    te[n: N] = A * exp(a[n])              in register as f64
    tl[n: N] = A * log(b[n])              in register as f64
    tp[n: N] = A * pow(1.0 + abs(a[n]), a[n]) in register as f64
    tq[n: N] = sqrt(abs(a[n])) * A + abs(a[n]) in register as f64
    s[n] = sin(te[n]) + cos(tl[n])
    c[n] = cos(te[n]) * sin(tl[n])
    p[n] = sin(tp[n])
    q[n] = cos(tq[n]) + float(te[n] > tl[n])
"""


def _check(path: Path, consts: dict[str, int], width: int | None = None) -> Any:
    env = {**os.environ}
    if width is not None:
        if "llvmpipe" not in (os.environ.get("FUSEC_DEVICE") or "llvmpipe"):
            pytest.skip("FUSEC_DEVICE selects a device other than lavapipe")
        env.update(LP_NATIVE_VECTOR_WIDTH=str(width), FUSEC_DEVICE="llvmpipe")
    args = ["check", str(path)]
    for k, v in consts.items():
        args += ["--const", f"{k}={v}"]
    return fusec_cli(args, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.shaderc
@pytest.mark.vulkan
@pytest.mark.parametrize(("width", "subgroup"), [(128, 4), (256, 8), (512, 16)])
def test_rope_angles_hold_over_the_declared_positions(
    tmp_path: Path, width: int, subgroup: int
) -> None:
    """`fusec check` runs pos at 0, 1, the middle and 131071 (and here a random high one):
    fused and unfused within 1e-4 at every point, at subgroup 4, 8 and 16."""
    rng = np.random.default_rng()
    path = tmp_path / "rope.fuse"
    path.write_text(ROPE)
    d = int(rng.choice([32, 64, 128]))
    consts = {"H": int(rng.integers(2, 6)), "D": d, "n_rot": d // int(rng.choice([1, 2]))}
    for extra in ({}, {"pos": int(rng.integers(65536, 131072))}):
        done = _check(path, {**consts, **extra}, width)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "MISMATCH" not in done.stdout
        assert f"subgroup {subgroup}" in done.stdout, done.stdout
        if not extra:
            assert "pos=131071" in done.stdout, done.stdout


@pytest.mark.shaderc
@pytest.mark.vulkan
def test_the_f32_angle_misses_where_f64_holds(tmp_path: Path) -> None:
    """Without `as f64` the same region fails the check at the high end (the product pos * f
    alone is off by an ulp of 1e5): the test above can fail."""
    path = tmp_path / "rope32.fuse"
    path.write_text(ROPE.replace("  in register as f64", ""))
    done = _check(path, {"pos": 131071})
    assert done.returncode != 0
    assert "MISMATCH" in done.stdout, done.stdout


@pytest.mark.shaderc
@pytest.mark.vulkan
def test_double_functions_survive_amplification(dev: Any, tmp_path: Path) -> None:
    from fusec.codegen.build import build_source, write_build
    from fusec.runtime.dispatch import Build, RegionRunner

    rng = np.random.default_rng()
    n = 4096
    a = rng.uniform(-6.0, 3.0, n).astype(np.float32)
    b = np.exp(rng.uniform(-40.0, 40.0, n)).astype(np.float32)  # every binade log meets
    inputs = {"a": a, "b": b}
    region = check(parse(AMPLIFIED, "amp.fuse")).region("amp")
    ref = run_reference(region, inputs, {"N": n})
    # the reference is the definition, in float64
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    te, tl = 1e5 * np.exp(a64), 1e5 * np.log(b64)
    np.testing.assert_allclose(ref["s"], np.sin(te) + np.cos(tl), atol=1e-9)
    np.testing.assert_allclose(ref["p"], np.sin(1e5 * (1 + np.abs(a64)) ** a64), atol=1e-9)
    build = Build.load(write_build(build_source(AMPLIFIED, "amp.fuse"), tmp_path / "amp"))
    r = build.region("amp")
    assert all("float64" in k.features for k in (*r.fused, *r.unfused))
    runner = RegionRunner(dev, build, "amp", {"N": n})
    try:
        for fused in (True, False):
            out = runner.run(inputs, fused=fused).outputs
            for name in ("s", "c", "p", "q"):
                err = np.abs(out[name].astype(np.float64) - ref[name])
                # f32 sin and cos of an angle reduced in double: a few ulp of 1
                assert err.max() < 2e-6, (fused, name, err.max(), int(err.argmax()))
    finally:
        runner.close()


def test_f64_stage_is_typed_f64_and_read_as_f32() -> None:
    region = check(parse(ROPE, "rope.fuse")).region("rope")
    th = next(s for s in region.all_stages() if s.name == "th")
    assert th.dtype == DType.F64
    reals = [e for e in ir.walk(th.value) if isinstance(e, ir.BinOp | ir.Call | ir.Lit)]
    assert {e.dtype for e in reals if not e.dtype.is_int} == {DType.F64}
    y = next(s for s in region.all_stages() if s.name == "y")
    assert y.dtype == DType.F32


def test_a_device_without_doubles_refuses_the_kernel(tmp_path: Path) -> None:
    import attrs

    from fusec.codegen.build import build_source, write_build
    from fusec.runtime.device import DeviceInfo
    from fusec.runtime.dispatch import Build, feature_refusal

    build = Build.load(write_build(build_source(ROPE, "rope.fuse"), tmp_path / "rope"))
    kernel = build.region("rope").fused[0]
    info = DeviceInfo(
        0,
        "no-doubles",
        "CPU",
        8,
        8,
        8,
        True,
        True,
        True,
        True,
        True,
        32768,
        1024,
        1.0,
        1 << 22,
        1 << 30,
        1 << 30,
        float64=False,
    )

    class _Dev:
        pass

    dev = _Dev()
    dev.info = info  # type: ignore[attr-defined]
    assert feature_refusal(dev, kernel) == "device lacks shaderFloat64"  # type: ignore[arg-type]
    dev.info = attrs.evolve(info, float64=True)  # type: ignore[attr-defined]
    assert feature_refusal(dev, kernel) is None  # type: ignore[arg-type]


def test_c_header_marks_the_feature(tmp_path: Path) -> None:
    from fusec.codegen.build import build_source, write_build

    folder = write_build(build_source(ROPE, "rope.fuse"), tmp_path / "rope")
    header = tmp_path / "rope.h"
    done = fusec_cli(
        ["export", str(folder), "--c-header", str(header)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "FUSEC_FEATURE_FLOAT64" in header.read_text()
