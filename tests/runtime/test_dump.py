"""`fusec build FILE --dump kir|glsl [--region R]...`: the kernel IR or the GLSL of each kernel on
stdout, the text the goldens hold (tests/codegen/test_golden.py); nothing compiled, no folder
written."""

from __future__ import annotations

from pathlib import Path

import pytest

from fusec.codegen.build import check_source
from fusec.codegen.dump import dump_region
from fusec.runtime.cli import main
from tests.conftest import ROOT

SOURCE = """\
region scale_sum(x: f32[N]) -> y: f32[N]
    const N = 64 in 1 .. 4096
    launch workgroup 64
    t[i] = x[i] * 2.0                        in shared
    s = sum(k: t[k]) @ workgroup
    y[i] = t[i] + s

region twice(x: f32[N]) -> y: f32[N]
    const N = 64 in 1 .. 4096
    launch workgroup 64
    y[i] = x[i] * 2.0
"""


@pytest.fixture
def src(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "s.fuse"
    path.write_text(SOURCE)
    return path


def test_dump_kir_prints_every_kernel_of_the_region(
    src: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["build", str(src), "--dump", "kir", "--region", "scale_sum"]) == 0
    out = capsys.readouterr().out
    program = check_source(SOURCE, str(src))
    assert out == dump_region(program.region("scale_sum"), "kir")
    kernels = [line.split()[1] for line in out.splitlines() if line.startswith("kernel ")]
    assert kernels == [
        "scale_sum",
        "scale_sum.unfused.0",
        "scale_sum.unfused.1",
        "scale_sum.unfused.2",
    ]
    assert "    fill shared.t[i < N] = (x[i] * 2.0)\n      then barrier\n" in out
    assert "    scalar $s = sum(k < N: shared.t[k]) @ workgroup\n" in out
    assert "twice" not in out
    assert sorted(p.name for p in src.parent.iterdir()) == ["s.fuse"], "no folder written"


def test_dump_glsl_prints_each_kernel_without_line_directives(
    src: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["build", str(src), "--dump", "glsl"]) == 0
    out = capsys.readouterr().out
    heads = [line for line in out.splitlines() if line.startswith("// ---- ")]
    assert heads == [
        "// ---- scale_sum ----",
        "// ---- scale_sum.unfused.0 ----",
        "// ---- scale_sum.unfused.1 ----",
        "// ---- scale_sum.unfused.2 ----",
        "// ---- twice ----",
        "// ---- twice.unfused.0 ----",
    ]
    assert out.count("#version 450") == len(heads) and out.count("void main()") == len(heads)
    assert "#line" not in out
    assert sorted(p.name for p in src.parent.iterdir()) == ["s.fuse"], "no folder written"


def test_dump_of_an_unknown_region_lists_the_regions(
    src: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["build", str(src), "--dump", "kir", "--region", "nope"]) == 1
    err = capsys.readouterr().err
    assert err == (f"fusec: error: no region 'nope' in {src}\n  hint: regions: scale_sum, twice\n")


def test_region_without_dump_is_refused(src: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["build", str(src), "--region", "twice"]) == 1
    assert capsys.readouterr().err == (
        "fusec: error: --region selects what --dump prints\n"
        "  hint: fusec build FILE --dump kir --region R\n"
    )
    assert sorted(p.name for p in src.parent.iterdir()) == ["s.fuse"]


def test_kernels_fuse_dump_matches_its_golden(capsys: pytest.CaptureFixture[str]) -> None:
    golden = ROOT / "tests" / "golden" / "add_rms_norm.kir"
    if not golden.is_file():
        pytest.fail("tests/golden/add_rms_norm.kir is missing; run pytest --update-golden")
    assert (
        main(["build", str(ROOT / "kernels.fuse"), "--dump", "kir", "--region", "add_rms_norm"])
        == 0
    )
    assert capsys.readouterr().out == golden.read_text()
