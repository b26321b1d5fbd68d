"""Regions on which `fusec check` once found a wrong result, found by the front-end fuzzer's
checking pass (bench/fuzz_frontend.py --check-every, docs/FUZZING.md).  Each is minimized; here
`fusec check` runs it fused and unfused on lavapipe against the numpy reference.

- A negated integer (`-N`, `-1`, `-i`) was `0u - N`: unsigned 32-bit arithmetic wrapped it
  around, so `x[i] * -1` multiplied by 4294967295 in both kernels while the reference computed
  -x[i].  A negated integer is now a real.
- `pow(- i - 3.0, N)`: the reference computed (-3)^16, while GLSL's pow is undefined for a
  negative base and lavapipe returns NaN.  The reference now says NaN there, as for the log of a
  negative, and the fuzzer's checker calls the region nonfinite.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fusec.dsl import ir
from fusec.dsl.check import check
from fusec.dsl.parse import parse
from tests.conftest import fusec_cli

NEGATED_INTEGERS = """
region negated_constant(x: f32) -> y: f32
    const N = 64
    launch workgroup 256
    y = -N * N * .5

region negated_literal(x: f32[N]) -> y: f32[N]
    const N = 64
    launch workgroup 64
    y[i] = x[i] * -1

region negated_index(x: f32[N]) -> y: f32[N]
    const N = 64
    launch workgroup 64
    y[i] = x[i] + cos(-i) + select(-i > i, 1.0, 2.0)

region negated_i32(x: i32[N] in -50 .. 50) -> y: f32[N]
    const N = 64
    launch workgroup 64
    y[i] = -x[i] + 0.5
"""


def test_a_negated_integer_is_a_real() -> None:
    program = check(parse(NEGATED_INTEGERS, "neg.fuse"))
    for region in program.regions:
        for stage in region.stages:
            assert isinstance(stage, ir.Stage)
            assert stage.value.dtype.value == "f32", region.name


@pytest.mark.shaderc
@pytest.mark.vulkan
def test_negated_integers_checked_on_lavapipe(tmp_path: Path) -> None:
    source = tmp_path / "neg.fuse"
    source.write_text(NEGATED_INTEGERS)
    proc = fusec_cli(["check", str(source), "--seed", "1"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    regions = re.findall(r"^(\w+) \[", proc.stdout, re.M)
    assert regions == re.findall(r"^region (\w+)", NEGATED_INTEGERS, re.M)
    checked = [line for line in proc.stdout.splitlines() if "max rel err" in line]
    assert len(checked) == len(regions)
    assert all(line.endswith(" ok") for line in checked), proc.stdout


def test_pow_of_a_negative_is_not_defined() -> None:
    """GLSL's pow(x, y) is undefined for x < 0 (lavapipe returns NaN for pow(-3.0, 16.0)): the
    reference says NaN too, not 43046721, so that the checker calls such a region nonfinite
    instead of a mismatch (found by the fuzzer as `pow(- i - 3.0, N)`)."""
    import numpy as np

    from fusec.dsl.reference import run_reference

    source = "region r(x: f32[N]) -> y: f32[N]\n    const N = 4\n    launch workgroup 64\n"
    region = check(parse(source + "    y[i] = pow(x[i], 2.0)\n", "pow.fuse")).regions[0]
    got = run_reference(region, {"x": np.array([-3, -0.5, 0, 2], np.float32)}, {"N": 4})["y"]
    assert np.isnan(got[:2]).all()
    assert got[2:].tolist() == [0.0, 4.0]


@pytest.mark.shaderc
@pytest.mark.vulkan
def test_pow_of_a_negative_is_nonfinite_to_the_fuzzer(tmp_path: Path) -> None:
    from fusec.codegen.build import build_source, write_build
    from tests.fuzz.frontend import check_build

    source = "region r() -> y: f32[N]\n    const N = 16\n    launch workgroup 128\n"
    result = build_source(source + "    y[i] = pow(-i - 3.0, N) + pow(i + 1.0, 2.0)\n", "p.fuse")
    write_build(result, tmp_path / "build")
    check, detail, _ = check_build(result.program, tmp_path / "build", 1)
    assert check == "nonfinite", detail


ROWS_TO_LANES = """
region rows_to_lanes(x: f32[K, N]) -> y: f32[N]
    const N = 64, K = 32
    launch workgroup 64
    y[i] = sum(k: x[k, i]) layout i -> lane x 1

region rows_to_lanes_max(x: f32[K, N]) -> y: f32[N]
    const N = 64, K = 32
    launch workgroup 1024
    y[i] = max(k: x[k, i]) * i layout i -> lane
"""


@pytest.mark.shaderc
@pytest.mark.vulkan
def test_rows_to_lanes_reduce_per_lane(tmp_path: Path) -> None:
    """`layout i -> lane` gives each lane a row, yet its reduction over k strode over the
    subgroup's lanes and combined them with subgroupAdd: the lanes' different rows summed
    together, fused and unfused (the fuzzer's `max(k: x[k, i]) * i layout i -> lane x 1`)."""
    source = tmp_path / "lanes.fuse"
    source.write_text(ROWS_TO_LANES)
    proc = fusec_cli(["check", str(source), "--seed", "1"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checked = [line for line in proc.stdout.splitlines() if "max rel err" in line]
    assert len(checked) == 2 and all(line.endswith(" ok") for line in checked), proc.stdout


TANH_NEAR_ZERO = """
region tanh_near_zero(x: f32[N] in -0.05 .. 0.05) -> y: f32[N]
    const N = 4096
    launch workgroup 64
    y[i] = tanh(x[i]) + tanh(x[i] * 1e-4) * 1e4 + tanh(x[i] * 100.0)

region tanh_divisor(a: f32[N]) -> y: f32
    const N = 64
    launch workgroup 128
    t = sum(k: a[k]) / tanh(1e-6)
    y = t * 0.5
"""


@pytest.mark.shaderc
@pytest.mark.vulkan
def test_tanh_near_zero_keeps_its_digits(tmp_path: Path) -> None:
    """GLSL's tanh cancels near 0 (lavapipe: tanh(1e-6) = 1.19e-6, 19% off), which the fuzzer
    found as `sum(k: a[k]) / tanh(1e-6)`; below 0.01 fusec computes x - x^3 / 3."""
    source = tmp_path / "tanh.fuse"
    source.write_text(TANH_NEAR_ZERO)
    proc = fusec_cli(["check", str(source), "--seed", "3"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checked = [line for line in proc.stdout.splitlines() if "max rel err" in line]
    assert len(checked) == 2 and all(line.endswith(" ok") for line in checked), proc.stdout


SMALL_WORKGROUP = """
region r(x: f32[M, N]) -> y: f32[M]
    const M = 64 in 1 .. 1024, N = 64 in 1 .. 1024
    launch workgroup 1
    y[i] = sum(k: x[i, k] * x[i, k]) - 0.0
"""


@pytest.mark.shaderc
@pytest.mark.vulkan
def test_a_workgroup_smaller_than_its_subgroup_is_refused(tmp_path: Path) -> None:
    """`launch workgroup 1` on a device whose subgroups have 8 lanes: the generated loops stride
    by the subgroup size, so 7 of every 8 elements went unread (error 0.86).  The runtime now
    refuses such a kernel in one sentence (the fused product falls back; the unfused chain is
    refused)."""
    src = tmp_path / "r.fuse"
    src.write_text(SMALL_WORKGROUP)
    run = fusec_cli(["check", str(src), "--seed", "1"], capture_output=True, text=True)
    assert run.returncode == 1, run.stdout
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fusec: error: kernel r.unfused.0")
    assert "workgroup 1 is smaller than its subgroup" in lines[0]


def test_the_reference_pow_is_undefined_where_glsl_s_is() -> None:
    """GLSL's pow is exp2(y * log2(x)): undefined for x < 0 and for x = 0 with y <= 0, and NaN
    for x = 1 with an infinite y (seed 1 case 6550: `pow(1.0, .5 / min(x[i], i))` at i = 0)."""
    import numpy as np

    from fusec.dsl.reference import _pow

    x = np.array([1.0, 1.0, 0.0, -2.0, 2.0, 0.0, 4.0])
    y = np.array([np.inf, -np.inf, 0.0, 2.0, 3.0, 2.0, 0.5])
    got = _pow(x, y)
    assert np.isnan(got[:4]).all()
    assert got[4:].tolist() == [8.0, 0.0, 2.0]
