"""Building kernels.fuse: SPIR-V validity, fused/unfused kernel counts, #line mapping, atomic
writes."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from fusec.codegen.build import BuildResult, build_source, write_build
from fusec.dsl.diagnostics import DiagnosticError
from tests.conftest import ROOT

pytestmark = pytest.mark.shaderc


@pytest.fixture
def built(kernels_folder: Path) -> Path:
    """The session's build of kernels.fuse (tests/conftest.py)."""
    return kernels_folder


def test_every_module_passes_spirv_val(built: Path) -> None:
    tool = shutil.which("spirv-val")
    if tool is None:
        pytest.skip("spirv-val not installed (spirv-tools)")
    spvs = sorted(built.glob("*.spv"))
    assert len(spvs) >= 8
    for spv in spvs:
        proc = subprocess.run(
            [tool, "--target-env", "vulkan1.2", str(spv)], capture_output=True, text=True
        )
        assert proc.returncode == 0, f"{spv.name}: {proc.stderr}"


def test_manifest_lists_fused_and_unfused_kernels(built: Path) -> None:
    m = json.loads((built / "manifest.json").read_text())
    regions = {r["name"]: r for r in m["regions"]}
    expect = {  # region: (unfused kernels, intermediates of the unfused chain)
        "rms_norm_mul_matvec": (3, ["ss", "xn"]),
        "rms_norm_mul_matvec_f32": (3, ["ss", "xn"]),
        "rms_norm_mul_matvec_q8_0": (3, ["ss", "xn"]),
        "rms_norm_mul_matvec_q4_0": (3, ["ss", "xn"]),
        "add_rms_norm": (4, ["hh", "ss"]),
        "gated_ffn": (3, ["gate", "up"]),
        "gated_ffn_q8_0": (4, ["xq", "gate", "up"]),
        "gated_ffn_q4_0": (4, ["xq", "gate", "up"]),
        "gated_ffn_q4_0_dequant": (3, ["gate", "up"]),
        "rms_norm_gated_ffn": (5, ["ss", "xn", "gate", "up"]),
    }
    assert set(expect) <= set(regions)
    for name, (n_unfused, inter) in expect.items():
        r = regions[name]
        assert [k["name"] for k in r["fused"]] == [name]
        assert [k["name"] for k in r["unfused"]] == [
            f"{name}.unfused.{i}" for i in range(n_unfused)
        ]
        for k in r["fused"] + r["unfused"]:
            assert (built / k["spv"]).exists()
        assert [b["name"] for b in r["intermediates"]] == inter
    # an `as q8_0` stage's unfused intermediate holds q8_0 blocks (fusec's aligned layout)
    dtypes = {b["name"]: b["dtype"] for b in regions["gated_ffn_q4_0"]["intermediates"]}
    assert dtypes == {"xq": "q8_0x", "gate": "f32", "up": "f32"}
    assert "integer_dot_product" in regions["gated_ffn_q4_0"]["fused"][0]["features"]
    assert "integer_dot_product" not in regions["gated_ffn_q4_0_dequant"]["fused"][0]["features"]


def test_glsl_carries_line_directives(built: Path) -> None:
    text = (built / "glsl" / "rms_norm_mul_matvec.comp").read_text()
    src = (ROOT / "kernels.fuse").read_text().splitlines()
    lines = [int(t.split()[1]) for t in text.splitlines() if t.startswith("#line")]
    assert lines, "no #line directives"
    stage_lines = [i + 1 for i, t in enumerate(src) if t.strip().startswith(("ss ", "xn[", "y["))]
    assert set(lines) <= set(stage_lines)


def test_failed_build_leaves_the_folder_untouched(
    tmp_path: Path, kernels_build: BuildResult
) -> None:
    out = tmp_path / "build"
    write_build(kernels_build, out)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    bad = (ROOT / "kernels.fuse").read_text().replace("W: Wt[N, K]", "W: Wt[N, Q]")
    with pytest.raises(DiagnosticError):
        write_build(build_source(bad, "bad.fuse"), out)
    after = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    assert before == after
    assert [p.name for p in tmp_path.iterdir()] == ["build"], "no temporary folder left behind"


def test_rebuild_replaces_the_folder(tmp_path: Path, kernels_build: BuildResult) -> None:
    out = tmp_path / "build"
    out.mkdir()  # an empty folder is fusec's to fill
    write_build(kernels_build, out)
    first = json.loads((out / "manifest.json").read_text())
    text = (ROOT / "kernels.fuse").read_text().replace("eps = 1e-6", "eps = 1e-5", 1)
    write_build(build_source(text, "kernels.fuse"), out)
    second = json.loads((out / "manifest.json").read_text())
    assert first != second and (out / "source.fuse").read_text() == text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["build"], "no temporary left behind"
