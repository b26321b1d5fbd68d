"""`max` and `min` are reductions (`max(t: ...)`, `sum(t < N: ...)`) and functions of two values
(`max(a, b)`): the word opens a reduction only when an index and a colon follow."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fusec.dsl import ir
from fusec.dsl.check import check
from fusec.dsl.diagnostics import DiagnosticError
from fusec.dsl.parse import parse
from fusec.dsl.reference import run_reference

TEXT = """
region two(a: f32[N], b: f32[N]) -> y: f32[N]
    const N = 64 in 1 .. 1024
    launch workgroup 64, subgroup any
    y[n] = max(a[n], b[n]) - min(a[n] * 2.0, b[n] + 1.0) + max(a[n] < b[n], 0.5)

region both(a: f32[N], b: f32[N]) -> y: f32
    const N = 64 in 1 .. 1024, M = 10 in 1 .. 1024
    launch workgroup 64, subgroup any
    y = max(t < M: max(a[t], b[t])) + sum(t: min(a[t], b[t])) @ workgroup
"""


def _program() -> ir.Program:
    return check(parse(TEXT, "functions.fuse"))


def test_two_argument_max_and_min_are_functions() -> None:
    rng = np.random.default_rng()
    a, b = (rng.standard_normal(37).astype(np.float32) for _ in range(2))
    y = run_reference(_program().region("two"), {"a": a, "b": b}, {"N": 37})["y"]
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    want = np.maximum(a64, b64) - np.minimum(a64 * 2, b64 + 1) + np.maximum(a64 < b64, 0.5)
    np.testing.assert_allclose(y, want, rtol=1e-6)


def test_reductions_with_and_without_extents_still_parse() -> None:
    rng = np.random.default_rng()
    a, b = (rng.standard_normal(64).astype(np.float32) for _ in range(2))
    y = run_reference(_program().region("both"), {"a": a, "b": b}, {"N": 64, "M": 10})["y"]
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    want = np.maximum(a64, b64)[:10].max() + np.minimum(a64, b64).sum()
    np.testing.assert_allclose(y, want, rtol=1e-6)


def test_sum_of_two_values_is_a_diagnostic() -> None:
    text = TEXT.replace("max(a[n], b[n])", "sum(a[n], b[n])")
    with pytest.raises(DiagnosticError) as err:
        check(parse(text, "functions.fuse"))
    assert "'sum' is a reduction, not a function" in str(err.value)
    assert "write sum(k: x[k]) @ workgroup" in str(err.value)


@pytest.mark.shaderc
@pytest.mark.vulkan
@pytest.mark.parametrize("region", ["two", "both"])
def test_functions_and_reductions_run_on_the_device(dev: Any, tmp_path: Path, region: str) -> None:
    from fusec.codegen.build import build_source, write_build
    from fusec.runtime.dispatch import Build
    from fusec.runtime.verify import check_region

    result = build_source(TEXT, "functions.fuse")
    write_build(result, tmp_path / "b")
    rep = check_region(dev, Build.load(tmp_path / "b"), result.program.region(region), {"N": 50})
    assert rep.path == "fused"
    assert rep.ok, [(o.name, o.fused_error, o.unfused_error) for o in rep.outputs]
