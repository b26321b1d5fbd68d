"""The committed bandwidth probe is the compiled form of its source, and it copies."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fusec.codegen.shaderc import compile_glsl
from fusec.runtime.device import Device
from fusec.runtime.timing import PROBE, copy_bandwidth_gbs


@pytest.mark.shaderc
def test_committed_probe_matches_its_source() -> None:
    src = PROBE.with_suffix(".comp").read_text()
    fresh = compile_glsl(src, "stream_copy")
    assert fresh == PROBE.read_bytes(), "rebuild runtime/probes/stream_copy.spv (see its .comp)"


@pytest.mark.vulkan
def test_copy_probe_copies_and_measures(tmp_path: Path) -> None:
    from fusec.runtime.buffers import DeviceBuffer
    from fusec.runtime.dispatch import one_shot
    from fusec.runtime.pipelines import Pipeline

    rng = np.random.default_rng()
    data = rng.integers(1, 2**32 - 1, size=4 * 3000, dtype=np.uint32)
    with Device() as dev:
        src, dst = DeviceBuffer(dev, data.nbytes), DeviceBuffer(dev, data.nbytes)
        pipe = Pipeline(dev, PROBE.read_bytes(), 2, [(0, "u32", data.size // 4)], None, False)
        try:
            src.upload(data)
            dst.upload(np.zeros_like(data))
            pipe.bind({0: (src.handle, src.size), 1: (dst.handle, dst.size)})
            with one_shot(dev) as cmd:
                vk = dev.vk
                vk.vkCmdBindPipeline(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, pipe.pipeline)
                vk.vkCmdBindDescriptorSets(
                    cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, pipe.layout, 0, 1, [pipe.set], 0, None
                )
                vk.vkCmdDispatch(cmd, 4, 1, 1)  # fewer groups than words: the grid-stride loop
            assert np.array_equal(dst.download(np.uint32, data.shape), data)
        finally:
            pipe.destroy()
            src.destroy()
            dst.destroy()
        gbs = copy_bandwidth_gbs(dev, size=1 << 22, reps=3)
    assert gbs > 0


@pytest.mark.vulkan
@pytest.mark.parametrize("kind", ["CPU", "DISCRETE_GPU"])
def test_the_probe_size_defaults_by_the_kind_of_device(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a size, a CPU device copies PROBE_BYTES_CPU without a warm-up (its rate is only a
    scale, and a gigabyte takes over a second a round there) and a GPU PROBE_BYTES_GPU after
    one; an explicit size is kept.  (The two defaults are shrunk here: the choice is tested.)"""
    import attrs

    from fusec.runtime import timing

    sizes: list[int] = []
    warmed: list[bool] = []
    real_buffer = timing.DeviceBuffer

    def buffer(dev: Device, size: int) -> object:
        sizes.append(size)
        return real_buffer(dev, size)

    monkeypatch.setattr(timing, "DeviceBuffer", buffer)
    monkeypatch.setattr(timing, "_warm_up", lambda *a, **k: warmed.append(True))
    monkeypatch.setattr(timing, "PROBE_BYTES_CPU", 1 << 20)
    monkeypatch.setattr(timing, "PROBE_BYTES_GPU", 3 << 19)
    with Device() as dev:
        monkeypatch.setattr(dev, "info", attrs.evolve(dev.info, kind=kind))
        assert timing.copy_bandwidth_gbs(dev, reps=1) > 0
        want = 1 << 20 if kind == "CPU" else 3 << 19
        assert sizes == [want, want] and warmed == ([] if kind == "CPU" else [True])
        sizes.clear()
        assert timing.copy_bandwidth_gbs(dev, size=5 << 16, reps=1) > 0
        assert sizes == [5 << 16, 5 << 16]


@pytest.mark.vulkan
@pytest.mark.shaderc
def test_the_dependent_step_probe_is_one_dispatch_fused_and_a_chain_unfused(
    dev: Device, tmp_path: Path
) -> None:
    """bench/dependent_steps.fuse measures what one more dependent dispatch costs (fused
    against unfused, docs/BENCHMARKS.md): that holds only while its regions stay one dispatch
    fused and one per stage, a barrier between each, unfused; and both compute the same."""
    import random

    from fusec.codegen.build import build_source, write_build
    from fusec.runtime.dispatch import Build
    from fusec.runtime.verify import check_region
    from tests.conftest import ROOT

    src = ROOT / "bench" / "dependent_steps.fuse"
    result = build_source(src.read_text(), str(src))
    build = Build.load(write_build(result, tmp_path / "b"))
    n = random.randint(2, 5000)
    for name, stages in (("chain8", 8), ("chain2", 2)):
        rep = check_region(dev, build, result.program.region(name), {"N": n})
        assert rep.ok, rep
        assert (rep.fused_dispatches, rep.fused_barriers) == (1, 0)
        assert (rep.unfused_dispatches, rep.unfused_barriers) == (stages, stages - 1)
