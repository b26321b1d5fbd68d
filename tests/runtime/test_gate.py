"""The budget gate: a fusion over budget is refused before its pipeline exists, with a reason
naming the target, the estimate and the budget, and the unfused chain runs instead."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fusec.dsl.check import check
from fusec.dsl.parse import parse_file
from fusec.runtime.cli import main
from tests.conftest import ROOT, fusec_cli

PROGRAM = check(parse_file(ROOT / "kernels.fuse"))

OVER = "tests/data/over_budget.fuse"


def _estimate(region: str, target: str, wave: int) -> dict[str, int]:
    """The fused kernel's estimate in the build of OVER (the numbers a refusal must quote)."""
    from fusec.codegen.build import cached_build

    out, _ = cached_build((ROOT / OVER).read_text(), OVER, (target,))
    manifest = json.loads((out / "manifest.json").read_text())
    kernel = next(r for r in manifest["regions"] if r["name"] == region)["fused"][0]
    return next(e for e in kernel["estimates"] if e["target"] == target and e["wave"] == wave)


@pytest.mark.slow
@pytest.mark.shaderc
@pytest.mark.vulkan
def test_over_budget_region_falls_back_and_still_checks(root: Path) -> None:
    proc = fusec_cli(
        [
            "check",
            OVER,
            "--target",
            "gfx1201",
            "--const",
            "K=12288",
        ],
        capture_output=True,
        text=True,
        cwd=root,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    hog = next(ln for ln in lines if ln.startswith("lds_hog"))
    v = _estimate("lds_hog", "gfx1201", 64)["vgprs"]
    assert (
        f"fallback(budget: lds_hog: gfx1201 wave64: 2 waves per SIMD (VGPRs {v}, LDS 50176 B) "
        "< budget 4)"
    ) in hog
    wide = next(ln for ln in lines if ln.startswith("wide_rows"))
    e = _estimate("wide_rows", "gfx1201", 64)
    assert e["spills"] > 0 and e["vgprs"] > 256
    assert (
        f"fallback(budget: wide_rows: gfx1201 wave64: {e['spills']} VGPRs would spill "
        f"(demand {e['vgprs']}), budget 0)"
    ) in wide
    big = next(ln for ln in lines if ln.startswith("big_tile"))
    e = _estimate("big_tile", "gfx1201", 64)
    assert e["spills"] > 0
    assert (
        f"fallback(budget: big_tile: gfx1201 wave64: {e['spills']} VGPRs would spill "
        f"(demand {e['vgprs']})"
    ) in big
    assert "fused 1 dispatch" not in hog and "MISMATCH" not in proc.stdout


@pytest.mark.slow
@pytest.mark.shaderc
@pytest.mark.vulkan
def test_per_call_budget_override(root: Path) -> None:
    """--min-waves raises the minimum for this call only: at K = 4096 in wave64 the fused
    kernels run 14 waves per SIMD (workgroups of 512, 18 KiB of LDS) and 7 (256, 17 KiB of
    LDS); both are below 15 and refused."""
    proc = fusec_cli(
        [
            "check",
            "kernels.fuse",
            "--target",
            "gfx1201",
            "--const",
            "N=77",
            "--min-waves",
            "15",
            "--region",
            "rms_norm_mul_matvec",
            "--region",
            "rms_norm_mul_matvec_f32",
        ],
        capture_output=True,
        text=True,
        cwd=root,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("fallback(budget: rms_norm_mul_matvec") == 2
    assert "< budget 15)" in proc.stdout
    plain = fusec_cli(
        [
            "check",
            "kernels.fuse",
            "--target",
            "gfx1201",
            "--const",
            "N=77",
            "--region",
            "rms_norm_mul_matvec",
            "--region",
            "rms_norm_mul_matvec_f32",
        ],
        capture_output=True,
        text=True,
        cwd=root,
    )
    assert plain.returncode == 0 and plain.stdout.count(": fused;") == 2


@pytest.mark.slow
@pytest.mark.shaderc
def test_occupancy_json_fields(
    root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(
        ["occupancy", "kernels.fuse", "--target", "gfx1201", "--json", "-o", str(tmp_path / "b")]
    )
    assert rc == 0
    rows = json.loads(capsys.readouterr().out)
    # a target variant (`R__sm90`) has rows on its own target only
    assert {r["region"] for r in rows} == {
        r.name
        for r in PROGRAM.regions
        if r.instance is None or r.instance.target in (None, "gfx1201")
    }
    rms = [r for r in rows if r["region"] == "rms_norm_mul_matvec"]
    assert {r["kernel"] for r in rms} == {"fused", "unfused.0", "unfused.1", "unfused.2"}
    assert {r["target"] for r in rows} == {"gfx1201"} and {r["wave"] for r in rows} == {32, 64}
    fields = {
        "region",
        "kernel",
        "target",
        "wave",
        "spv",
        "vgprs",
        "sgprs",
        "lds_bytes",
        "spills",
        "waves_per_simd",
        "accepted",
        "reason",
    }
    for r in rows:
        assert set(r) == fields
        assert Path(r["spv"]).exists()


@pytest.mark.slow
@pytest.mark.shaderc
def test_occupancy_over_budget_reason(
    root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(["occupancy", OVER, "--target", "gfx1151", "--json", "-o", str(tmp_path / "b")]) == 0
    )
    rows = [r for r in json.loads(capsys.readouterr().out) if r["kernel"] == "fused"]
    wide = [r for r in rows if r["region"] == "wide_rows"]
    assert all(not r["accepted"] for r in wide)
    spills, demand = wide[0]["spills"], wide[0]["vgprs"]
    assert spills > 0 and demand == spills + 256
    assert wide[0]["reason"] == (
        f"gfx1151 wave32: {spills} VGPRs would spill (demand {demand}), budget 0"
    )


@pytest.mark.slow
@pytest.mark.shaderc
def test_actual_without_statistics_still_prints_estimates(
    root: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("fusec.runtime.actual.radv_env", lambda family: None)
    rc = main(
        [
            "occupancy",
            "kernels.fuse",
            "--target",
            "gfx1201",
            "--actual",
            "--json",
            "-o",
            str(tmp_path / "b"),
        ]
    )
    out = capsys.readouterr()
    assert rc == 0
    assert (
        "fusec: note: no statistics for gfx1201: RADV (mesa-vulkan-drivers) is not installed"
        in out.err
    )
    rows = json.loads(out.out)
    assert rows and all("actual_vgprs" not in r and r["vgprs"] > 0 for r in rows)


def test_unknown_target_lists_known_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["occupancy", str(ROOT / "kernels.fuse"), "--target", "gfx9000"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("fusec: error: unknown target 'gfx9000'")
    assert "gfx1201, gfx1200, gfx1151, navi31, navi21, sm90" in err
