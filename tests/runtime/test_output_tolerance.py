"""An output's own tolerance (`y: f32[N] tol E`, issue 15): carried in the manifest and used by
`fusec check` instead of the one the region's dtypes imply, both ways: a looser one passes an
output the default would pass too, a tighter one fails an output the default passes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import fusec_cli

SOURCE = """\
region halve(x: f32[N] in -4.0 .. 4.0) -> (y: f32[N] tol {tol}, z: f32[N])
    const N = 4096 in 1 .. 65536
    launch workgroup 64
    y[n] = exp(x[n]) * sin(x[n] * 3.0)
    z[n] = exp(x[n]) * sin(x[n] * 3.0)
"""


def _check(tmp_path: Path, tol: str) -> tuple[int, str]:
    (tmp_path / "h.fuse").write_text(SOURCE.format(tol=tol))
    built = fusec_cli(["build", "h.fuse", "-o", "b"], capture_output=True, text=True, cwd=tmp_path)
    assert built.returncode == 0, built.stderr
    outputs = json.loads((tmp_path / "b" / "manifest.json").read_text())["regions"][0]["outputs"]
    assert [o.get("tolerance") for o in outputs] == [float(tol), None]
    proc = fusec_cli(["check", "b", "--seed", "5"], capture_output=True, text=True, cwd=tmp_path)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.shaderc
@pytest.mark.vulkan
def test_a_looser_tolerance_is_reported_and_used(tmp_path: Path) -> None:
    rc, out = _check(tmp_path, "0.01")
    assert rc == 0, out
    # each tolerance says where it comes from: the output's own, or the region's dtypes
    assert "y: max rel err" in out and "(tol 0.01, declared) ok" in out, out
    assert "(tol 0.0001, f32) ok" in out, out


@pytest.mark.shaderc
@pytest.mark.vulkan
def test_a_tighter_tolerance_fails_what_the_default_passes(tmp_path: Path) -> None:
    # f32 exp and sin on the device against the f64 reference: about 1e-7, above 1e-10 and
    # below the f32 default 1e-4
    rc, out = _check(tmp_path, "1e-10")
    assert rc == 1, out
    assert "output 'y' of region 'halve'" in out and "tolerance 1e-10" in out, out
    assert "output 'z'" not in out


def test_the_tolerance_says_where_it_comes_from() -> None:
    """`fusec check` prints, beside each output's tolerance, its source: the output's own
    (`declared`), a q8_0x output's quant step (`q8_0x output`; it read `f32` beside 0.008, a
    new-user probe), else the region's least precise dtype."""
    from fusec.codegen import manifest_records as mr
    from fusec.runtime.verify import Q8_0X_OUTPUT_TOL, output_tolerance, tolerance_basis

    def buf(dtype: str, tol: float | None = None) -> mr.Buffer:
        return mr.Buffer("o", dtype, (mr.ConstRef("N"),), False, None, tol, None)

    for precision, region_tol in (("f32", 1e-4), ("f16", 2e-3)):
        assert tolerance_basis(buf("f32"), precision) == precision
        assert output_tolerance(buf("f32"), region_tol) == region_tol
        assert tolerance_basis(buf("f32", 0.03), precision) == "declared"
        assert output_tolerance(buf("f32", 0.03), region_tol) == 0.03
        assert tolerance_basis(buf("q8_0x"), precision) == "q8_0x output"
        assert output_tolerance(buf("q8_0x"), region_tol) == max(region_tol, Q8_0X_OUTPUT_TOL)
