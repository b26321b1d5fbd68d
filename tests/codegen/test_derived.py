"""Derived specialization constants: integer divisions of constants in a kernel's index math
become specialization constants that the runtime computes (manifest `derived`).  Checked in
the GLSL and the manifest, in their u32 arithmetic, and on lavapipe at constants other than the
defaults, where the SPIR-V's default values would give wrong results."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from fusec.codegen import manifest as mf
from fusec.codegen import manifest_records as mr
from fusec.codegen.build import BuildResult, build_source, write_build
from fusec.codegen.glsl import DERIVED_SPEC_BASE
from fusec.dsl.diagnostics import DiagnosticError
from fusec.runtime.device import Device
from fusec.runtime.dispatch import Build
from fusec.runtime.verify import check_region
from tests.conftest import fusec_cli

pytestmark = pytest.mark.shaderc

TEXT = """
region grouped(x: f32[NK, D]) -> y: f32[NQ, D]
    const NQ = 32 in 1 .. 256, NK = 8 in 1 .. 256, D = 16 in 1 .. 256
    launch workgroup 64, subgroup any
    y[h, d] = x[h / (NQ / NK), d] * 2.0

region runs(x: f32[C]) -> y: f32[NS]
    const C = 100 in 1 .. 4096, NS = 8 in 1 .. 64
    launch workgroup 64, subgroup any
    per workgroup g < NS
    xs[t: (C + NS - 1) / NS] = x[(g * ((C + NS - 1) / NS) + t) % C] * select(
        g * ((C + NS - 1) / NS) + t < C, 1.0, 0.0)   in shared
    y[g] = sum(t: xs[t]) @ workgroup
"""


@pytest.fixture(scope="module")
def result() -> BuildResult:
    return build_source(TEXT, "derived.fuse")


def _kernel(result: BuildResult, region: str) -> dict[str, Any]:
    """The region's first fused kernel as manifest.json holds it."""
    r = result.manifest.region(region)
    assert r is not None
    return r.fused[0].to_json()


def _glsl(result: BuildResult, name: str) -> str:
    return next(b.glsl for b in result.kernels if b.kernel.name == name)


def test_divisions_of_constants_become_derived_constants(result: BuildResult) -> None:
    k = _kernel(result, "grouped")
    assert k["derived"] == [
        {
            "spec_id": DERIVED_SPEC_BASE,
            "expr": {"op": "/", "lhs": {"const": "NQ"}, "rhs": {"const": "NK"}},
        }
    ]
    text = _glsl(result, "grouped")
    # declared with its default value (32 / 8), and used instead of the division
    assert f"layout(constant_id = {DERIVED_SPEC_BASE}) const uint d_0 = 4u;" in text
    assert "c_NQ / c_NK" not in text.split("void main()")[1]
    assert re.search(r"/ d_0\)", text)


def test_a_division_by_an_index_stays_in_the_shader(result: BuildResult) -> None:
    text = _glsl(result, "runs")
    k = _kernel(result, "runs")
    # (C + NS - 1) / NS is derived once, however often it is written
    assert [d["spec_id"] for d in k["derived"]] == [DERIVED_SPEC_BASE]
    assert "shared float s_xs[d_0];" in text
    # x's index divides nothing by a constant-only expression other than d_0: the remainder by
    # C involves the workgroup index and is computed in the shader
    assert "% c_C)" in text


def test_derived_values_follow_shader_uint_arithmetic() -> None:
    expr = {"op": "-", "lhs": {"const": "C"}, "rhs": 1}
    assert mf.eval_u32(mr.expr_from_json(expr), {"C": 0}) == 0xFFFFFFFF  # wraps as a uint does
    ceil = {
        "op": "/",
        "lhs": {
            "op": "-",
            "lhs": {"op": "+", "lhs": {"const": "C"}, "rhs": {"const": "NS"}},
            "rhs": 1,
        },
        "rhs": {"const": "NS"},
    }
    assert mf.eval_u32(mr.expr_from_json(ceil), {"C": 37, "NS": 5}) == 8
    assert (
        mf.eval_u32(mr.expr_from_json({"op": "%", "lhs": {"const": "C"}, "rhs": 7}), {"C": 37}) == 2
    )
    with pytest.raises(ValueError, match="divides by zero"):
        mf.eval_u32(mr.BinOp("/", 1, mr.ConstRef("NS")), {"NS": 0})


@pytest.mark.vulkan
@pytest.mark.parametrize(
    ("region", "consts"),
    [
        ("grouped", {"NQ": 6, "NK": 3, "D": 5}),  # NQ / NK = 2, default 4
        ("grouped", {"NQ": 7, "NK": 7, "D": 16}),  # 1
        ("runs", {"C": 37, "NS": 5}),  # runs of 8, default 13
        ("runs", {"C": 300, "NS": 3}),  # runs of 100
    ],
)
def test_runs_at_other_constants_match_the_reference(
    dev: Device, result: BuildResult, tmp_path: Path, region: str, consts: dict[str, int]
) -> None:
    out = tmp_path / "b"
    write_build(result, out)
    rep = check_region(dev, Build.load(out), result.program.region(region), consts)
    assert rep.path == "fused"
    assert rep.ok, [(o.name, o.fused_error, o.unfused_error) for o in rep.outputs]


ZERO = """
region z(x: f32[N]) -> y: f32[N]
    const N = 8 in 1 .. 64, K = 4 in 1 .. 64, G = {g} in {lo} .. 8
    launch workgroup 64, subgroup any
    y[i] = x[(i / (N / (K / G))) % N]
"""


def test_a_divisor_that_its_ranges_make_zero_is_refused_at_build(tmp_path: Path) -> None:
    """G in 0 .. 8: `K / G` divides by zero at the low end of G's range (dsl/bounds.py)."""
    with pytest.raises(DiagnosticError, match="must not be 0"):
        build_source(ZERO.format(g=2, lo=0), "z.fuse")


@pytest.mark.vulkan
def test_constants_that_divide_by_zero_are_refused_in_one_sentence(tmp_path: Path) -> None:
    src = tmp_path / "z.fuse"
    src.write_text(ZERO.format(g=2, lo=1))  # in range apart, K / G = 0 when G > K
    run = fusec_cli(
        ["check", str(src), "--const", "G=8"], capture_output=True, text=True, cwd=tmp_path
    )
    assert run.returncode == 1
    assert "Traceback" not in run.stderr and "internal error" not in run.stderr
    assert "Warning" not in run.stderr  # refused before the numpy reference runs
    assert (
        "fusec: error: region 'z' cannot run at N = 8, K = 4, G = 8: (N / (K / G)) divides "
        "by zero" in run.stderr
    )
