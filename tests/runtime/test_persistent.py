"""runtime/persistent.py: the decode layer as one dispatch on lavapipe.  It terminates and
matches the numpy layer and the multi-dispatch chain with LP_NUM_THREADS = 1, 2 and 4 at
subgroup sizes 4, 8 and 16 (child processes under a timeout: a deadlock fails, not hangs);
64 tokens replayed with advancing pos match the chain; the switches are strict; a refused
product falls back to the chain and says why."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fusec.codegen import persistent as pc
from fusec.runtime import decode_layer as layer
from fusec.runtime import persistent as rp
from fusec.runtime.device import RuntimeFailure
from fusec.runtime.dispatch import Build
from fusec.runtime.step import Step, StepBuffers, step_buffers

ROOT = Path(__file__).resolve().parents[2]
TINY = layer.PRESETS["tiny"]
WIDTH = {4: "128", 8: "256", 16: "512"}  # LP_NATIVE_VECTOR_WIDTH for each subgroup size


def _runs(
    folder: Path,
    subgroup: int,
    threads: str,
    wdtype: str,
    first: int,
    last: int,
    target: str | None = None,
    **variant: str,
) -> Any:
    if "llvmpipe" not in (os.environ.get("FUSEC_DEVICE") or "llvmpipe"):
        pytest.skip("FUSEC_DEVICE selects a device other than lavapipe")
    env = {
        **os.environ,
        "LP_NATIVE_VECTOR_WIDTH": WIDTH[subgroup],
        "LP_NUM_THREADS": threads,
        "PYTHONPATH": str(ROOT),
        "FUSEC_DEVICE": "llvmpipe",
        **variant,
    }
    proc = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).parent / "persistent_runs.py"),
            str(folder),
            *(wdtype, str(first), str(last)),
            *([target] if target else []),
        ],
        capture_output=True,
        text=True,
        env=env,
        # a deadlocked product hangs rather than fails; a run takes 1-3 minutes on two loaded
        # cores (lavapipe spends the spinning workgroups' threads)
        timeout=1500,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["subgroup"] == subgroup
    assert out["dispatches"] == 1 and out["chain_dispatches"] > 1
    assert out["paths"] == ["persistent"]
    return out


# Each case compiles a persistent product of its own in lavapipe, a minute or more on two
# cores (four at 16 lanes), so the schedule's variants ride on the subgroup sizes' cases
# instead of compiling three more products.
CASES = [
    # a static schedule on a grid lavapipe holds at once (one workgroup), on one thread
    (4, "1", "f16", {rp.SCHEDULE_SWITCH: "static", rp.WORKGROUPS_SWITCH: "1"}),
    (8, "2", "f16", {}),
    (16, "4", "f16", {}),
    # the items re-planned at 256 lanes, on more workgroups than threads, and larger items:
    # three workgroups of a kernel per ticket
    (
        8,
        "4",
        "q4_0",
        {rp.WORKGROUP_SIZE_SWITCH: "256", rp.WORKGROUPS_SWITCH: "5", rp.GROUP_SWITCH: "3"},
    ),
    # the K-quant product at 4 lanes: at 16 a persistent product compiles for minutes in
    # lavapipe (238 s cold); its regions run at 16 lanes in test_layer_products
    (4, "2", "q4_k_m", {}),
]


@pytest.mark.vulkan
@pytest.mark.shaderc
@pytest.mark.slow
@pytest.mark.parametrize(
    ("subgroup", "threads", "wdtype", "variant"),
    CASES,
    ids=[f"{s}-{t}-{w}" + "".join(f"-{v}" for v in var.values()) for s, t, w, var in CASES],
)
def test_terminates_and_matches_numpy_and_the_chain(
    kernels_folder: Path, subgroup: int, threads: str, wdtype: str, variant: dict[str, str]
) -> None:
    out = _runs(
        kernels_folder, subgroup, threads, wdtype, 5, 7 if wdtype == "f16" else 6, **variant
    )
    tol = layer.TOLERANCE[wdtype]
    assert out["worst"]["numpy"] <= tol and out["worst"]["chain"] <= tol, out


def test_every_variant_and_size_is_a_case() -> None:
    """The cases above cover subgroup sizes 4, 8 and 16, LP_NUM_THREADS 1, 2 and 4, and each
    schedule variant (a switch of persistent.py that changes the product) once."""
    assert {c[0] for c in CASES} == {4, 8, 16} and {c[1] for c in CASES} == {"1", "2", "4"}
    switches = {k for c in CASES for k in c[3]}
    assert switches == {
        rp.SCHEDULE_SWITCH,
        rp.WORKGROUPS_SWITCH,
        rp.GROUP_SWITCH,
        rp.WORKGROUP_SIZE_SWITCH,
    }


@pytest.mark.vulkan
@pytest.mark.shaderc
@pytest.mark.slow
@pytest.mark.parametrize("wdtype", ["q4_0", "q8_0", "f16"])
def test_the_sm90_variants_as_items_match(kernels_folder: Path, wdtype: str) -> None:
    """lavapipe taken for an sm90: the items are the `schedule on sm90` variants (matvec_add at
    1024 lanes; q4_0 and q8_0 weights packed), their packed weights' views bound to the
    product's bindings (the H200 bug: the uvec4 view of the out-projection's weight kept the
    region's own binding, 2, which in the product is Wqkv)."""
    out = _runs(kernels_folder, 8, "2", wdtype, 3, 4, target="sm90")
    tol = layer.TOLERANCE[wdtype]
    assert out["worst"]["numpy"] <= tol and out["worst"]["chain"] <= tol, out
    manifest = Build.load(kernels_folder).manifest
    sm90 = [r for r in out["regions"] if r.endswith("__sm90")]
    assert any(r.startswith("matvec_add") for r in sm90), out["regions"]
    packed = [r for r in sm90 if any(b.packing is not None for b in manifest.region(r).inputs)]
    assert bool(packed) == (wdtype != "f16"), (out["regions"], packed)


@pytest.mark.vulkan
@pytest.mark.shaderc
@pytest.mark.slow
def test_64_tokens_replayed_match_the_chain(kernels_folder: Path) -> None:
    """One recording of each product, replayed at pos 0 .. 63 (the whole cache)."""
    out = _runs(kernels_folder, 8, "2", "f16", 0, TINY.context - 1)
    assert out["tokens"] == 64 and out["moved"]
    assert out["worst"]["chain"] <= layer.TOLERANCE["f16"], out
    assert out["worst"]["numpy"] <= layer.TOLERANCE["f16"], out


def test_the_switch_is_strict(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(rp.PERSISTENT_SWITCH, raising=False)
    assert rp.persistent_product() == "off"
    monkeypatch.setenv(rp.PERSISTENT_SWITCH, "on")
    assert rp.persistent_product() == "on"
    for bad in ("1", "ON", "yes", " on"):
        monkeypatch.setenv(rp.PERSISTENT_SWITCH, bad)
        with pytest.raises(RuntimeFailure, match="is not a persistent product setting"):
            rp.persistent_product()
    assert rp.workgroups_override({}) is None
    assert rp.workgroups_override({rp.WORKGROUPS_SWITCH: "264"}) == 264
    for bad in ("0", "-3", "x", "2.5", ""):  # set but empty: refused, never taken as unset
        with pytest.raises(RuntimeFailure, match="is not a number of workgroups"):
            rp.workgroups_override({rp.WORKGROUPS_SWITCH: bad})
    assert rp.group_override({}) == 1 and rp.group_override({rp.GROUP_SWITCH: "4"}) == 4
    with pytest.raises(RuntimeFailure, match="is not a number of workgroups per item"):
        rp.group_override({rp.GROUP_SWITCH: "0"})
    assert rp.schedule_override({}) == "ticket"
    assert rp.schedule_override({rp.SCHEDULE_SWITCH: "static"}) == "static"
    for bad in ("Static", ""):
        with pytest.raises(RuntimeFailure, match="is not a schedule"):
            rp.schedule_override({rp.SCHEDULE_SWITCH: bad})
    assert rp.workgroup_size_override({rp.WORKGROUP_SIZE_SWITCH: "256"}) == 256
    for bad in ("300", "16", "2048", "x", ""):
        with pytest.raises(RuntimeFailure, match="is not a workgroup size"):
            rp.workgroup_size_override({rp.WORKGROUP_SIZE_SWITCH: bad})


def test_the_grid_is_units_times_resident_workgroups() -> None:
    from fusec.codegen.targets import TARGETS

    product = pc.Product((), 512, (pc.COUNTERS,), 4)
    product = _with_items(product, 10_000)
    sm90 = TARGETS["sm90"]
    # 8 waves per SMSP x 4 SMSPs / 16 warps a workgroup = 2 workgroups per SM
    assert rp.grid_workgroups(product, sm90, 8, 32, 132)[0] == 264
    assert rp.grid_workgroups(product, sm90, 8, 32, None)[0] == 132 * 2  # the default SMs
    assert rp.grid_workgroups(product, sm90, 1, 32, 132)[0] == 132  # at least one a unit
    assert rp.grid_workgroups(product, None, None, 8, None)[0] == rp.DEFAULT_UNITS[None]
    assert rp.grid_workgroups(product, sm90, 8, 32, 132, override=50)[0] == 50
    assert rp.grid_workgroups(_with_items(product, 7), sm90, 8, 32, 132)[0] == 7


def _with_items(product: pc.Product, n: int) -> pc.Product:
    class Fixed(pc.Product):
        @property
        def items(self) -> int:
            return n

    return Fixed(product.stages, product.workgroup_size, product.buffers, product.lds_bytes)


@pytest.mark.vulkan
@pytest.mark.shaderc
def test_off_and_refused_products_run_the_chain(
    dev: Any, build: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert rp.compute_units(dev) is None  # lavapipe reports no SMs nor CUs: the default grid
    calls = layer.calls(TINY, "f16", regions=build.manifest)
    bufs = StepBuffers(dev, step_buffers(build, calls))
    try:
        bufs.upload(layer.random_state(TINY, "f16", np.random.default_rng()))
        step, report = rp.persistent_or_chain(dev, build, calls, bufs, rp.source_program(), "off")
        assert isinstance(step, Step) and report.product == "multi-dispatch"
        assert report.why == "FUSEC_PERSISTENT=off"
        step.close()

        def refuse(*args: Any, **kwargs: Any) -> pc.Product:
            raise pc.NotAnItem("matvec_add: made up for the test")

        monkeypatch.setattr(pc, "plan_product", refuse)
        step, report = rp.persistent_or_chain(dev, build, calls, bufs, rp.source_program(), "on")
        assert isinstance(step, Step) and report.product == "multi-dispatch"
        assert report.why == "persistent refused: matvec_add: made up for the test"
        assert all(p == "fused" for _, p in step.paths)
        step.close()
        monkeypatch.undo()
        step, report = rp.persistent_or_chain(dev, build, calls, bufs, rp.source_program(), "on")
        assert isinstance(step, rp.PersistentStep) and report.product == "persistent"
        assert "one dispatch of" in report.why and "not judged" in report.why  # lavapipe
        step.close()
    finally:
        bufs.destroy()


@pytest.mark.vulkan
@pytest.mark.shaderc
@pytest.mark.slow
def test_the_switch_turns_the_layer_into_one_dispatch(
    dev: Any, build: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FUSEC_PERSISTENT=on: examples/decode_layer's layer runs as one dispatch and matches the
    numpy layer; unset, the multi-dispatch chain runs."""
    from examples.decode_layer.run import decode

    monkeypatch.setenv(rp.PERSISTENT_SWITCH, "on")
    one = decode(dev, build, TINY, "f16", [11, 12])
    monkeypatch.delenv(rp.PERSISTENT_SWITCH)
    chain = decode(dev, build, TINY, "f16", [11])
    assert one.report.dispatches == 1 and one.report.barriers == 0
    assert {p for _, p in one.report.paths} == {"persistent"}
    assert chain.report.dispatches == len(chain.report.paths) > 1
    for t in one.tokens:
        assert set(t.errors) == {"out", "kc", "vt"}
        assert all(e <= layer.TOLERANCE["f16"] for e in t.errors.values()), t


@pytest.mark.vulkan
@pytest.mark.shaderc
@pytest.mark.slow
def test_a_product_built_ahead_of_time_runs_without_a_compiler(
    kernels_folder: Path,
    tmp_path: Path,
    dev: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`fusec build ... --persistent tiny`'s product (here: f16, this device's subgroup size) is
    run with no GLSL compiler present and matches numpy; a build without it falls back to the
    chain, saying why in one sentence."""
    import shutil

    from examples.decode_layer.run import decode
    from fusec.codegen import shaderc
    from fusec.runtime import persistent_aot as aot

    with_products, without = tmp_path / "with", tmp_path / "without"
    shutil.copytree(kernels_folder, with_products)
    shutil.copytree(kernels_folder, without)
    size = dev.info.subgroup_size
    built = aot.build_products(with_products, ["tiny"], ["f16"], [None], [size])
    assert [(b.preset, b.weights, b.target, b.subgroup) for b in built] == [
        ("tiny", "f16", None, size)
    ]
    assert (with_products / aot.PRODUCTS / f"{built[0].key}.spv").read_bytes()[:4] == (
        b"\x03\x02\x23\x07"
    )
    index = json.loads((with_products / aot.PRODUCTS / aot.INDEX).read_text())
    assert index[built[0].key]["items"] == built[0].items > 1

    def no_compiler(*args: Any, **kwargs: Any) -> bytes:
        raise AssertionError("compiled at run time")

    monkeypatch.setattr(shaderc, "backend", lambda: "none")
    monkeypatch.setattr(shaderc, "compile_glsl", no_compiler)
    build = Build.load(with_products)
    run = decode(dev, build, TINY, "f16", [6, 7], persistent=True)
    assert run.report.dispatches == 1 and {p for _, p in run.report.paths} == {"persistent"}
    for t in run.tokens:
        assert max(t.errors.values()) <= layer.TOLERANCE["f16"], t
    monkeypatch.setenv(rp.PERSISTENT_SWITCH, "on")
    chain = decode(dev, Build.load(without), TINY, "f16", [6, 7])
    assert chain.report.dispatches > 1
    assert "persistent refused: this build has no SPIR-V of the product" in capsys.readouterr().err
    for t in chain.tokens:
        assert max(t.errors.values()) <= layer.TOLERANCE["f16"], t


def test_build_refuses_an_unknown_preset_before_building(tmp_path: Path) -> None:
    from tests.conftest import fusec_cli

    out = tmp_path / "b"
    args = ["build", str(ROOT / "kernels.fuse"), "-o", str(out), "--persistent", "tiny7"]
    proc = fusec_cli(args, capture_output=True, text=True)
    assert proc.returncode != 0
    assert "error: unknown preset 'tiny7'" in proc.stderr and "qwen3-8b" in proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists()


@pytest.mark.shaderc
def test_build_of_another_file_refuses_persistent_and_leaves_the_folder(tmp_path: Path) -> None:
    """A source without the decode layer's regions: `--persistent` is refused before DIR is
    written, so the build already there stays as it was (found by a new-user probe: DIR was
    replaced by the new build, then the command failed with an empty persistent/ inside)."""
    import random

    from tests.conftest import fusec_cli

    def source(name: str) -> Path:
        n = random.choice([16, 48, 64, 200])
        path = tmp_path / f"{name}.fuse"
        path.write_text(
            f"region {name}(x: f32[N]) -> y: f32[N]\n    const N = {n} in 1 .. 4096\n"
            "    launch workgroup 64\n    y[n] = x[n] * 2.0\n"
        )
        return path

    out = tmp_path / "b"
    assert (
        fusec_cli(["build", str(source("first")), "-o", str(out)], capture_output=True).returncode
        == 0
    )
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    args = ["build", str(source("second")), "-o", str(out), "--persistent", "tiny"]
    proc = fusec_cli(args, capture_output=True, text=True)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith("fusec: error: --persistent needs the decode layer's regions")
    assert proc.stderr.count("error:") == 1 and "Traceback" not in proc.stderr
    after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before and not (out / "persistent").exists()


def test_build_refuses_stamps_without_a_persistent_product(tmp_path: Path) -> None:
    from tests.conftest import fusec_cli

    out = tmp_path / "b"
    args = ["build", str(ROOT / "kernels.fuse"), "-o", str(out), "--stamps"]
    proc = fusec_cli(args, capture_output=True, text=True)
    assert proc.returncode != 0
    assert "error: --stamps adds stamps to the persistent products" in proc.stderr, proc.stderr
    assert "--persistent PRESET --stamps" in proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists()


@pytest.mark.parametrize("registers", [24, 40, 72, 128])
def test_the_driver_confirms_the_product_at_pipeline_creation(registers: int) -> None:
    """rp.confirm_product on an H200's statistics (NVIDIA `Register Count`, `Local Memory Size`
    offset by 2^36): within the budget the grid is sized from the driver's waves, not the
    estimate's; a spilling product is refused naming the estimate that was wrong; no register
    count leaves the estimate's waves."""
    from fusec.codegen.targets import TARGETS, occupancy
    from fusec.runtime.gate import NVIDIA_LOCAL_MEMORY_OFFSET, KernelNumbers

    sm90, wg = TARGETS["sm90"], 512
    estimated = KernelNumbers(33, 0, 4096, occupancy(sm90, 32, 33, 4096, wg))
    stats = {
        "Register Count": float(registers),
        "Local Memory Size": float(NVIDIA_LOCAL_MEMORY_OFFSET),
        "Shared Memory Size": 4096.0,
    }
    waves, note = rp.confirm_product(sm90, 32, stats, wg, estimated, estimated.waves_per_simd)
    assert waves == occupancy(sm90, 32, registers, 4096, wg)
    assert f"driver: {registers} registers (estimated 33), 0 spilled" in note, note
    spilled = {**stats, "Local Memory Size": float(NVIDIA_LOCAL_MEMORY_OFFSET + 4 * 7)}
    with pytest.raises(rp.Refused, match=r"driver: sm90 wave32: persistent spills 7 .*estimated 0"):
        rp.confirm_product(sm90, 32, spilled, wg, estimated, estimated.waves_per_simd)
    assert rp.confirm_product(sm90, 32, {}, wg, estimated, 5) == (
        5,
        "; the driver reports no register count",
    )
