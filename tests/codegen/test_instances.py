"""Dtype-generic regions through the build: every instance of kernels.fuse builds, to the same
SPIR-V as the region of its name that kernels.fuse wrote once per dtype before
(tests/data/per_dtype_regions.fuse), and the manifest records and finds instances."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from fusec.codegen import manifest_records as mr
from fusec.codegen.build import BuildResult, build_source, select_regions, write_build
from fusec.dsl.diagnostics import DiagnosticError
from tests.conftest import ROOT

OLD = ROOT / "tests" / "data" / "per_dtype_regions.fuse"
GENERIC = ("rms_norm_mul_matvec", "gated_ffn", "rms_norm_gated_ffn", "matvec_add")


@functools.cache
def _builds() -> tuple[BuildResult, BuildResult]:
    old = build_source(OLD.read_text(), str(OLD))
    names = tuple(r.name for r in old.program.regions)
    new = build_source((ROOT / "kernels.fuse").read_text(), "kernels.fuse", regions=names)
    return old, new


@pytest.mark.slow
def test_every_instance_builds_to_the_spirv_of_its_old_region() -> None:
    old, new = _builds()
    instances = [r for r in new.manifest.regions if r.instance is not None]
    # 6 + 3 + 4 + 5 instances by the naming rule, matvec_add_q4_0_long and the two
    # gated_ffn_*_dequant by instance lines
    assert len(instances) == 21
    assert {r.name for r in new.manifest.regions} >= {"gated_ffn_down", "gated_ffn_down_splitk"}
    assert {r.instance.of for r in instances if r.instance} == set(GENERIC)
    old_spv = {b.kernel.name: b.spv for b in old.kernels}
    new_spv = {b.kernel.name: b.spv for b in new.kernels}
    assert set(old_spv) == set(new_spv)
    differ = [k for k in old_spv if old_spv[k] != new_spv[k]]
    assert differ == []
    for r in instances:
        before = old.manifest.region(r.name)
        assert before is not None, r.name
        # constants (defaults and ranges: the block raises a K-quant's lower bound), launch
        assert r.consts == before.consts, r.name
        assert r.launch == before.launch, r.name
        assert r.fused == before.fused, r.name


@pytest.mark.slow
def test_the_manifest_finds_an_instance_by_the_dtypes_of_its_buffers() -> None:
    _, new = _builds()
    m = mr.Manifest.from_json(new.manifest_json)
    found = m.instance("rms_norm_mul_matvec", {"W": "q4_K"})
    assert found is not None and found.name == "rms_norm_mul_matvec_q4_K"
    assert found.instance == mr.Instance("rms_norm_mul_matvec", (("Wt", "q4_K"),), None)
    # an instance line's instance is found by its name only; the rule's is the answer
    q4 = m.instance("matvec_add", {"W": "q4_0"})
    assert q4 is not None and q4.name == "matvec_add_q4_0"
    assert m.instance("gated_ffn", {"Wg": "q4_K"}) is None
    assert m.instance("gated_ffn", {"Wg": "q8_0", "Wu": "q8_0"}).name == "gated_ffn_q8_0"  # type: ignore[union-attr]
    # the JSON round trip keeps the instance record
    assert mr.Manifest.from_json(m.to_json()) == m


@pytest.mark.slow
def test_the_comparison_script_finds_identity_and_a_changed_kernel(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from bench.instance_identity import compare

    old, new = _builds()
    write_build(old, tmp_path / "before")
    write_build(new, tmp_path / "after")
    assert compare(tmp_path / "before", tmp_path / "after") == []
    assert capsys.readouterr().out.count("identical") == 21
    spv = tmp_path / "after" / "gated_ffn_q4_0.spv"
    spv.chmod(0o644)
    spv.write_bytes(spv.read_bytes()[:-4] + b"\0\0\0\0")
    assert compare(tmp_path / "before", tmp_path / "after") == [
        "gated_ffn_q4_0 (gated_ffn<q4_0>): SPIR-V differs: gated_ffn_q4_0"
    ]


def test_a_region_is_selected_by_its_instance_display_name() -> None:
    from fusec.codegen.build import check_source

    program = check_source((ROOT / "kernels.fuse").read_text(), "kernels.fuse")
    picked = select_regions(program, ("gated_ffn<q4_0>", "matvec_add", "matvec_add<q4_0>"))
    assert [r.name for r in picked] == ["gated_ffn_q4_0", "matvec_add", "matvec_add_q4_0"]
    with pytest.raises(DiagnosticError, match="no region 'gated_ffn<q4_K>'"):
        select_regions(program, ("gated_ffn<q4_K>",))
