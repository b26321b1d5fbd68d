"""Weights repacked at upload (runtime/repack.py, dsl/packing.py): every packed region verifies on
lavapipe at two of the subgroup sizes 4, 8 and 16 (conftest.rotated_sizes: a quarter at 16, slow
to compile) against numpy (which reads the GGUF bytes); the kernels
really read the packed layout (the GGUF bytes uploaded as they are fail); a wrong-size weight is
refused before anything is dispatched; a decode step repacks its weight buffers and refuses a
weight that two regions would read in two layouts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fusec.codegen.build import build_source, check_source, write_build
from fusec.dsl.packing import Packing, pack_blocks
from fusec.dsl.types import DType
from fusec.runtime import dispatch
from fusec.runtime.device import RuntimeFailure
from tests.conftest import at_size, check_on_lavapipe, rotated_sizes

pytestmark = [pytest.mark.vulkan, pytest.mark.shaderc]

DATA = Path(__file__).parents[1] / "data" / "repack.fuse"
BENCH = Path(__file__).parents[2] / "bench" / "repack_regions.fuse"
# the bench file's regions at shapes lavapipe runs quickly (rows not a multiple of the subgroup)
BENCH_CONSTS = ["K=512", "N=37", "H=512", "F=37"]


@pytest.fixture(scope="module")
def program() -> Any:
    return check_source(DATA.read_text(), str(DATA))


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Any:
    out = tmp_path_factory.mktemp("repack") / "build"
    write_build(build_source(DATA.read_text(), str(DATA)), out)
    return dispatch.Build.load(out)


def test_the_manifest_marks_packed_weights(build: Any) -> None:
    packed = {
        r.name: [(b.name, b.packing.layout, b.packing.version) for b in r.inputs if b.packing]
        for r in build.manifest.regions
    }
    assert packed["pd_q6_K"] == [("W", "split", 1)]
    assert packed["pk"] == [("W", "split", 1)]
    assert packed["pp"] == []
    assert sum(1 for v in packed.values() if v) == 9


@pytest.mark.slow
@pytest.mark.parametrize(("width", "subgroup"), [(128, 4), (256, 8), (512, 16)])
@pytest.mark.parametrize("source", [DATA, BENCH], ids=["repack", "bench"])
def test_every_packed_region_verifies_at_lavapipe_subgroup_sizes(
    root: Path, source: Path, width: int, subgroup: int
) -> None:
    consts = [] if source == DATA else [a for c in BENCH_CONSTS for a in ("--const", c)]
    regions = check_source(source.read_text(), str(source)).regions
    assert len(regions) == (10 if source == DATA else 24)
    # by weight type and packing, so that each runs at every size
    kinds: dict[str, list[str]] = {}
    for r in regions:
        weights = sorted({b.dtype.value for b in r.inputs if b.dtype.is_quantized})
        packed = any(b.packing for b in r.inputs)
        kinds.setdefault(f"{weights} packed={packed}", []).append(r.name)
    here = at_size(rotated_sizes(kinds), subgroup)
    args = [a for n in here for a in ("--region", n)]
    out = check_on_lavapipe([str(source.relative_to(root)), *args, *consts], width, subgroup)
    assert out.count(" ok\n") == len(here)
    assert out.count(": fused;") == len(here)


@pytest.mark.parametrize("region", ["pv", "pd_q8_0", "pd_q6_K", "pk"])
def test_the_kernels_read_the_packed_layout(
    dev: Any, build: Any, program: Any, monkeypatch: pytest.MonkeyPatch, region: str
) -> None:
    """Packed, the region verifies; with the GGUF bytes uploaded as they are, it does not."""
    from fusec.runtime.verify import check_region

    consts = {"K": 768, "N": 29}
    rep = check_region(dev, build, program.region(region), consts)
    assert (rep.path, rep.ok) == ("fused", True), [(o.name, o.fused_error) for o in rep.outputs]
    monkeypatch.setattr(dispatch, "device_array", lambda buf, array: array)
    rep = check_region(dev, build, program.region(region), consts)
    assert rep.path == "fused"
    assert not rep.ok
    assert all(not o.ok for o in rep.outputs)


def test_a_wrong_size_weight_is_refused_before_dispatch(dev: Any, build: Any) -> None:
    region = build.region("pv")
    consts = dispatch.const_values(region, {})
    rng = np.random.default_rng(5)
    x = rng.standard_normal(512).astype(np.float32)
    short = rng.integers(0, 255, (24, 16 * 18 - 2), np.uint8)  # two bytes short of 16 blocks
    with pytest.raises(RuntimeFailure) as e:
        dispatch.check_inputs(region, {"x": x, "W": short}, consts)
    (diag,) = e.value.diagnostics
    assert diag.message == (
        "q4_0 weight 'W' must be uint8 blocks of shape (24, 288) (6912 bytes), not uint8 of "
        "shape (24, 286) (6864 bytes)"
    )


def test_a_step_repacks_its_weights(dev: Any, build: Any) -> None:
    from fusec.runtime.step import Call, StepBuffers, step_buffers

    calls = [Call("pv", {"x": "x", "W": "W", "y": "y"})]
    decls = step_buffers(build, calls)
    assert decls["W"].packing is not None and decls["x"].packing is None
    rng = np.random.default_rng(9)
    raw = rng.integers(0, 255, decls["W"].shape, np.uint8)
    bufs = StepBuffers(dev, decls)
    try:
        bufs.upload({"W": raw})
        on_device = bufs.buffers["W"].download(np.uint8, (raw.size,))
    finally:
        bufs.destroy()
    assert np.array_equal(on_device, pack_blocks(DType.Q4_0, Packing.SPLIT, raw))
    assert not np.array_equal(on_device, raw.reshape(-1))


def test_a_step_refuses_one_weight_in_two_layouts(build: Any) -> None:
    from fusec.runtime.step import Call, step_buffers

    calls = [
        Call("pv", {"x": "x", "W": "W", "y": "y1"}),
        Call("pp", {"x": "x", "W": "W", "y": "y2"}),
    ]
    with pytest.raises(RuntimeFailure) as e:
        step_buffers(build, calls)
    (diag,) = e.value.diagnostics
    assert diag.message == (
        "step buffer 'W' is read packed split by region 'pv' but as GGUF bytes by region 'pp'"
    )


@pytest.mark.slow
@pytest.mark.parametrize("weights", ["q4_0", "q4_k_m"])
def test_the_decode_layer_on_sm90_runs_the_packed_projections(
    kernels_folder: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    weights: str,
) -> None:
    """lavapipe taken for an sm90: the layer's projections are the packed __sm90 variants,
    their step buffers repacked, and the layer matches numpy fused and unfused."""
    from fusec.codegen import targets
    from fusec.runtime.cli import main

    def fake(name: str) -> Any:
        return targets.TARGETS["sm90"]

    monkeypatch.setattr(targets, "target_for_device", fake)
    monkeypatch.setattr(dispatch, "target_for_device", fake)
    args = ["bench", str(kernels_folder), "--preset", "tiny", "--weights", weights]
    rc = main([*args, "--reps", "2"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert "checked against numpy" in out.err
    packed = ("rms_norm_mul_matvec", "rms_norm_gated_ffn", "matvec_add")
    for name in packed:
        assert f"{name}_q4_" in out.out + out.err
    text = out.out + out.err
    variants = [w.rstrip(":") for w in text.split() if w.endswith("__sm90:")]
    used = [name for name in variants if name.startswith(packed)]
    # q4_0: every projection packed; Q4_K_M: its q6_K rows (V, the FFN down projection) only,
    # kernels.fuse leaving q4_K in GGUF blocks on sm90 (docs/BENCHMARKS.md)
    assert len(used) >= {"q4_0": 4, "q4_k_m": 2}[weights], text
    # attention's named regions run their sm90 variants too (decode_layer.calls)
    combine = {"q4_0": "attention_combine_store__sm90", "q4_k_m": "attention_combine__sm90"}
    assert combine[weights] in variants, text
    if weights == "q4_k_m":
        assert all("_q6_K" in name for name in used), used
    manifest = dispatch.Build.load(kernels_folder).manifest
    for name in used:
        region = manifest.region(name)
        assert any(b.packing is not None for b in region.inputs), name
