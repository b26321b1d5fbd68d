"""runtime/persistent_stamps.py on lavapipe (which has shaderDeviceClock): the tiny layer's
product with per-item device-clock stamps still matches the numpy layer; every item's stamps
are in order, every stage starts after the stages it depends on ended, and the kernel's span
lies inside the dispatch's timestamps; `fusec bench --persistent --per-dispatch` reports the
stages in its JSON and table, and on a device without the clock says so in one sentence and
still runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import attrs
import numpy as np
import pytest

from fusec.codegen import persistent as pc
from fusec.runtime import decode_layer as layer
from fusec.runtime import persistent as rp
from fusec.runtime import persistent_stamps as ps
from fusec.runtime.step import Step, StepBuffers, decode_tokens, step_buffers
from fusec.runtime.verify import relative_error

ROOT = Path(__file__).resolve().parents[2]
TINY = layer.PRESETS["tiny"]
STAGE_FIELDS = {"stage", "items", "depends", "start_us", "end_us", "span_us", "item_us", "wait_us"}


def test_clock_differences_are_right_across_a_wrap() -> None:
    ticks = np.array([2**32 - 5, 3, 20], np.uint64)  # a 32-bit clock wrapped after the first
    assert ps.since(ticks, 2**32 - 5, 32).tolist() == [0, 8, 25]
    assert ps.since(np.array([7, 2**32 - 2], np.uint64), 9, 32).tolist() == [-2, -11]
    wide = np.array([2**40 + 7, 2**40 - 3], np.uint64)
    assert ps.since(wide, 2**40, 64).tolist() == [7, -3]
    assert ps.clock_bits(np.array([[5, 0], [9, 0]], np.uint32)) == 32
    assert ps.clock_bits(np.array([[5, 0], [9, 1]], np.uint32)) == 64


@pytest.mark.vulkan
@pytest.mark.shaderc
def test_stamped_product_matches_numpy_and_its_stamps_are_ordered(dev: Any, build: Any) -> None:
    if not dev.info.shader_clock:
        pytest.skip("this device has no shaderDeviceClock")
    assert check_stamped(dev, build)["subgroup"] == dev.info.subgroup_size


@pytest.mark.vulkan
@pytest.mark.shaderc
@pytest.mark.slow
# 4 lanes (8 is the default device's, above).  The product at 16 lanes is test_persistent's; the
# stamps add only their stores, and a stamped product compiles in lavapipe for minutes there.
@pytest.mark.parametrize("subgroup", [4])
def test_stamped_product_at_other_subgroup_sizes(kernels_folder: Path, subgroup: int) -> None:
    """check_stamped in a child process whose lavapipe runs subgroups of `subgroup` lanes."""
    if "llvmpipe" not in (os.environ.get("FUSEC_DEVICE") or "llvmpipe"):
        pytest.skip("FUSEC_DEVICE selects a device other than lavapipe")
    env = {
        **os.environ,
        "LP_NATIVE_VECTOR_WIDTH": str(32 * subgroup),
        "PYTHONPATH": str(ROOT),
        "FUSEC_DEVICE": "llvmpipe",
    }
    script = Path(__file__).with_name("stamps_runs.py")
    proc = subprocess.run(
        [sys.executable, str(script), str(kernels_folder)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["subgroup"] == subgroup and out["stages"] > 2, out


@pytest.mark.vulkan
@pytest.mark.shaderc
def test_stamped_product_built_ahead_runs_without_a_compiler(
    dev: Any, kernels_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`fusec build ... --persistent tiny --stamps` writes each product twice, without and with
    stamps; the stamped one runs (and checks) where no GLSL compiler is present, and a build
    without --stamps says which flag writes it."""
    import shutil

    from fusec.codegen import shaderc
    from fusec.runtime import persistent_aot as aot
    from fusec.runtime.dispatch import Build
    from fusec.runtime.persistent import Refused

    if not dev.info.shader_clock:
        pytest.skip("this device has no shaderDeviceClock")
    size = dev.info.subgroup_size
    stamped, plain = tmp_path / "stamped", tmp_path / "plain"
    shutil.copytree(kernels_folder, stamped)
    shutil.copytree(kernels_folder, plain)
    built = aot.build_products(stamped, ["tiny"], ["f16"], [None], [size], stamps=True)
    assert sorted(b.stamps for b in built) == [False, True]
    assert len({b.key for b in built}) == 2 and len({b.sha256 for b in built}) == 2
    index = aot.read_index(stamped)
    assert sorted(e.stamps for e in index.values()) == [False, True]
    aot.build_products(plain, ["tiny"], ["f16"], [None], [size])
    assert [e.stamps for e in aot.read_index(plain).values()] == [False]

    def no_compiler(*args: Any, **kwargs: Any) -> bytes:
        raise AssertionError("compiled at run time")

    monkeypatch.setattr(shaderc, "backend", lambda: "none")
    monkeypatch.setattr(shaderc, "compile_glsl", no_compiler)
    assert check_stamped(dev, Build.load(stamped))["subgroup"] == size
    build = Build.load(plain)
    calls = layer.calls(TINY, "f16", regions=build.manifest)
    bufs = StepBuffers(dev, step_buffers(build, calls))
    try:
        with pytest.raises(Refused, match="--persistent PRESET --stamps writes it"):
            rp.PersistentStep(dev, build, calls, bufs, rp.source_program(), stamps=True)
    finally:
        bufs.destroy()


def check_stamped(dev: Any, build: Any) -> dict[str, Any]:
    """The stamped tiny product (f16, a random state and pos) against numpy, its raw stamps in
    order over two runs, and `measure_stamps`' figures checked; what ran, for the caller."""
    rng = np.random.default_rng()
    wdtype = "f16"
    calls = layer.calls(TINY, wdtype, regions=build.manifest)
    bufs = StepBuffers(dev, step_buffers(build, calls))
    step = None
    try:
        arrays = layer.random_state(TINY, wdtype, rng)
        pos = int(rng.integers(5, TINY.context - 1))
        ref = layer.reference(TINY, arrays, layer.weight_values(arrays, TINY, wdtype), pos, wdtype)
        bufs.upload(arrays)
        step = rp.PersistentStep(dev, build, calls, bufs, rp.source_program(), stamps=True)
        assert step.product.stamps and step.stamps is not None
        step.poison(keep=arrays)
        decode_tokens(cast(Step, step), [pos], lambda p: None, lambda p: None)
        for name, want in ref.items():
            assert relative_error(bufs.download(name), want) <= layer.TOLERANCE[wdtype], name
        product = step.product
        assert len(product.stages) > 2 and any(s.depends for s in product.stages)
        for lead in (0, 1):  # a lone run, and one behind a lead run whose stamps are cleared
            ticks, ts, bits = ps.with_pool(
                dev, 2, lambda pool, lead=lead: ps.run_once(step, pool, 2, lead)
            )
            assert ticks.shape == (product.items, 3) and ts[1] > ts[0]
            rel = ps.since(ticks, int(ticks[0, 0]), bits)
            # each item: ticket taken <= started <= ended
            assert np.all(rel[:, 0] <= rel[:, 1]) and np.all(rel[:, 1] <= rel[:, 2])
            first = np.cumsum([0] + [s.items for s in product.stages])
            starts = [int(rel[first[i] : first[i + 1], 1].min()) for i in range(len(first) - 1)]
            ends = [int(rel[first[i] : first[i + 1], 2].max()) for i in range(len(first) - 1)]
            for j, s in enumerate(product.stages):
                for d in s.depends:  # its end stamp is before its release; the start after
                    assert starts[j] >= ends[d], (s.name, product.stages[d].name)

        out = ps.measure_stamps(step, pos, runs=2)
        assert out["available"] and out["runs"] == 2 and out["clock"] == ps.CLOCK_SOURCE
        assert out["ticks_per_us"] > 0
        assert out["lead_runs"] >= 1 and out["warm_up_s"] == ps.WARM_S
        # the calibration is the only inexact part: its spread, and 1 % for the runs' jitter
        slack = 1 + out["ticks_per_us_spread"] + 0.01
        for run in out["per_run"]:
            assert 0 < run["kernel_us"] <= run["dispatch_us"] * slack, out
        _check_stages(out, product)
        return {"subgroup": step.subgroup_size, "stages": len(product.stages)}
    finally:
        if step is not None:
            step.close()
        bufs.destroy()


def _check_stages(out: dict[str, Any], product: pc.Product | None = None) -> None:
    stages = out["stages"]
    assert all(set(s) == STAGE_FIELDS for s in stages), stages
    by_name = {s["stage"]: s for s in stages}
    for s in stages:
        assert 0 <= s["start_us"] <= s["end_us"] <= out["kernel_us"], s
        assert s["span_us"] == pytest.approx(s["end_us"] - s["start_us"], abs=0.02)
        assert s["items"] > 0 and s["item_us"] > 0 and s["wait_us"] >= 0
        for d in s["depends"]:
            assert by_name[d]["end_us"] <= s["start_us"], (d, s)
    if product is not None:
        assert [s["stage"] for s in stages] == [
            f"{x.name}#{i}" for i, x in enumerate(product.stages)
        ]
        assert [s["items"] for s in stages] == [x.items for x in product.stages]
    assert stages[0]["start_us"] < 0.1 * out["kernel_us"]


@pytest.mark.vulkan
@pytest.mark.shaderc
@pytest.mark.slow
def test_bench_reports_each_stage(kernels_folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fusec.runtime.cli import main

    args = ["bench", str(kernels_folder), "--preset", "tiny", "--persistent", "--per-dispatch"]
    assert main([*args, "--reps", "2", "--json"]) == 0
    x = json.loads(capsys.readouterr().out)
    st = x["persistent"]["stamps"]
    assert st["available"], st
    assert st["runs"] == 2 and len(st["per_run"]) == 2
    assert max(st["errors"].values()) <= layer.TOLERANCE["f16"]
    assert [s["stage"].split("#")[0] for s in st["stages"]] == [
        p["region"] for p in x["fused"]["paths"]
    ]
    _check_stages(st)
    assert main([*args, "--reps", "1"]) == 0
    text = capsys.readouterr().out
    assert "persistent, per stage (device clock" in text
    for s in st["stages"]:
        assert s["stage"] in text


@pytest.mark.vulkan
@pytest.mark.shaderc
@pytest.mark.slow
def test_a_device_without_the_clock_says_so_and_still_benches(
    kernels_folder: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The device's feature query answering no shaderDeviceClock: the extension is not enabled,
    the stamped product is refused, and the bench reports why in one sentence."""
    from fusec.runtime import device
    from fusec.runtime.cli import main

    real = device.Device._info

    def no_clock(self: Any, index: int, pd: Any) -> Any:
        return attrs.evolve(real(self, index, pd), shader_clock=False)

    monkeypatch.setattr(device.Device, "_info", no_clock)
    args = ["bench", str(kernels_folder), "--preset", "tiny", "--persistent", "--per-dispatch"]
    assert main([*args, "--reps", "1", "--json"]) == 0
    x = json.loads(capsys.readouterr().out)
    st = x["persistent"]["stamps"]
    assert st == {"available": False, "why": st["why"]}
    assert st["why"].startswith("stamps are not available: ") and "shaderDeviceClock" in st["why"]
    assert x["persistent"]["median_us"] > 0 and x["persistent"]["product"] == "persistent"
    assert main([*args, "--reps", "1"]) == 0
    out = capsys.readouterr()
    assert " ".join(st["why"].split()) in " ".join(out.out.split())
    assert "Traceback" not in out.err
