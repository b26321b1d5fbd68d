"""GPU timing of a region's products: fused and unfused, side by side in one run.

Each repetition is recorded once into one command buffer: the kernels of the product with their
barriers, plus a barrier between repetitions (a decode step depends on the one before), GPU
timestamps around each repetition.  Weights rotate among several copies so that nothing is
served from L2 (FACTS.md: an H200's 50 MiB L2 inflates a 32 MiB matvec to "4398 GB/s").
The floor is the weight bytes over the streaming bandwidth of a large buffer copy measured on
the same device in the same run.  Results are checked against the reference before timing.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from fusec.codegen import manifest_records as mr

from .buffers import DeviceBuffer
from .device import Device, RuntimeFailure
from .dispatch import NP_DTYPES, Build, RegionRunner, begin_commands, shape_of, submit
from .pipelines import Pipeline
from .repack import device_array

L2_BYTES = 60 * 2**20  # H200: 50 MiB; rotate enough copies to exceed it with margin


@attrs.frozen
class ProductTiming:
    path: str
    median_us: float
    samples_us: tuple[float, ...]
    dispatches: int
    barriers: int


@attrs.frozen
class RegionTiming:
    region: str
    consts: dict[str, int | float]
    weight_bytes: int
    copies: int
    fused: ProductTiming
    unfused: ProductTiming
    reps: int = 1  # steps per submission: step i of each submission reads copy i % copies

    def per_copy_us(self, product: ProductTiming) -> list[float]:
        """The product's median per weight copy used (the first min(copies, reps)): a copy that
        streams slower than its twins (seen on the H200, docs/BENCHMARKS.md) shows here, not
        only in the overall median."""
        by_copy: list[list[float]] = [[] for _ in range(min(self.copies, self.reps))]
        for j, us in enumerate(product.samples_us):
            by_copy[(j % self.reps) % self.copies].append(us)
        return [statistics.median(c) for c in by_copy if c]


def weight_inputs(region: mr.Region) -> list[mr.Buffer]:
    """Inputs streamed once per step: every input of two or more dimensions."""
    return [b for b in region.inputs if len(b.shape) >= 2]


def _timestamps(dev: Device, count: int) -> Any:
    vk = dev.vk
    return vk.vkCreateQueryPool(
        dev.device,
        vk.VkQueryPoolCreateInfo(queryType=vk.VK_QUERY_TYPE_TIMESTAMP, queryCount=count),
        None,
    )


def read_stamps_us(dev: Device, pool: Any, count: int) -> list[float]:
    """The first `count` timestamps of `pool`, in µs (waits for them)."""
    vk = dev.vk
    data = vk.ffi.new("uint64_t[]", count)
    vk.vkGetQueryPoolResults(
        dev.device,
        pool,
        0,
        count,
        8 * count,
        data,
        8,
        vk.VK_QUERY_RESULT_64_BIT | vk.VK_QUERY_RESULT_WAIT_BIT,
    )
    period = dev.info.timestamp_period_ns / 1000.0
    return [data[i] * period for i in range(count)]


def _read_us(dev: Device, pool: Any, count: int) -> list[float]:
    """µs between each pair of timestamps (before, after)."""
    t = read_stamps_us(dev, pool, count)
    return [t[2 * i + 1] - t[2 * i] for i in range(count // 2)]


def _barrier(dev: Device, cmd: Any) -> None:
    vk = dev.vk
    b = vk.VkMemoryBarrier(
        srcAccessMask=vk.VK_ACCESS_SHADER_WRITE_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT,
        dstAccessMask=vk.VK_ACCESS_SHADER_READ_BIT
        | vk.VK_ACCESS_SHADER_WRITE_BIT
        | vk.VK_ACCESS_TRANSFER_READ_BIT
        | vk.VK_ACCESS_TRANSFER_WRITE_BIT,
    )
    stages = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | vk.VK_PIPELINE_STAGE_TRANSFER_BIT
    vk.vkCmdPipelineBarrier(cmd, stages, stages, 0, 1, [b], 0, None, 0, None)


def _warm_up(dev: Device, cmd: Any, seconds: float = 0.3) -> None:
    """Submit `cmd` until `seconds` have passed: an idle GPU runs at low clocks at first."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        submit(dev, cmd)


def _settle(
    dev: Device, recs: list[_Recorded], reps: int, least_s: float = 0.5, most_s: float = 8.0
) -> None:
    """Submit the recorded products alternately until each one's median is steady: the last
    three rounds within 2%.  Freshly allocated weights stream slower at first on the H200 (seen
    2026-11-29: 116, 70, 66, 50, 50 us for f16 gated_ffn over its first seconds of use, with new
    buffers each time), so a fixed short warm-up timed some regions 2-3x too slow."""
    t0 = time.perf_counter()
    rounds: list[list[float]] = []
    while time.perf_counter() - t0 < most_s:
        medians = []
        for rec in recs:
            submit(dev, rec.cmd)
            medians.append(statistics.median(_read_us(dev, rec.pool, 2 * reps) or [0.0]))
        rounds.append(medians)
        last = rounds[-3:]
        steady = len(last) == 3 and all(
            max(r[i] for r in last) <= 1.02 * min(r[i] for r in last) for i in range(len(recs))
        )
        if steady and time.perf_counter() - t0 >= least_s:
            return


PROBE = Path(__file__).parent / "probes" / "stream_copy.spv"


# the probe's copy: 1 GiB on a GPU (past any L2); on a CPU device (lavapipe) the rate is only a
# scale for the table and a gigabyte takes over a second a round there, so 64 MiB
PROBE_BYTES_GPU = 1 << 30
PROBE_BYTES_CPU = 1 << 26


def copy_bandwidth_gbs(dev: Device, size: int | None = None, reps: int = 5) -> float:
    """Streaming rate of a large buffer copy by a compute shader (runtime/probes), read + write
    bytes per second (GB/s): the rate at which a kernel can stream weights.  `size` defaults to
    PROBE_BYTES_GPU, or PROBE_BYTES_CPU on a CPU device (which is also not warmed up: it has no
    clocks to bring up)."""
    cpu = dev.info.kind == "CPU"
    if size is None:
        size = PROBE_BYTES_CPU if cpu else PROBE_BYTES_GPU
    vk = dev.vk
    words = size // 16
    src, dst = DeviceBuffer(dev, words * 16), DeviceBuffer(dev, words * 16)
    pipe = Pipeline(dev, PROBE.read_bytes(), 2, [(0, "u32", words)], None, False)
    pipe.bind({0: (src.handle, src.size), 1: (dst.handle, dst.size)})
    pool = _timestamps(dev, 2 * reps)
    try:
        cmd = begin_commands(dev)
        vk.vkCmdResetQueryPool(cmd, pool, 0, 2 * reps)
        vk.vkCmdBindPipeline(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, pipe.pipeline)
        vk.vkCmdBindDescriptorSets(
            cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, pipe.layout, 0, 1, [pipe.set], 0, None
        )
        groups = min(65535, -(-words // 256))
        for i in range(reps):
            _barrier(dev, cmd)
            vk.vkCmdWriteTimestamp(cmd, vk.VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, pool, 2 * i)
            vk.vkCmdDispatch(cmd, groups, 1, 1)
            vk.vkCmdWriteTimestamp(cmd, vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, pool, 2 * i + 1)
        vk.vkEndCommandBuffer(cmd)
        if not cpu:
            _warm_up(dev, cmd)
        # on a GPU, until steady: the last three rounds within 2%, for at most 3 s (after
        # seconds of idle the first rounds ran at 1700 GB/s where a warm H200 copies at 4200,
        # 2026-12-01); a CPU device's rate is only a scale, measured once
        rounds: list[float] = []
        t0 = time.perf_counter()
        while True:
            submit(dev, cmd)
            rounds.append(statistics.median(_read_us(dev, pool, 2 * reps)))
            last = rounds[-3:]
            steady = len(last) == 3 and max(last) <= 1.02 * min(last)
            if cpu or steady or time.perf_counter() - t0 > 3:
                break
        us = rounds[-1]
        vk.vkFreeCommandBuffers(dev.device, dev.command_pool, 1, [cmd])
    finally:
        vk.vkDestroyQueryPool(dev.device, pool, None)
        pipe.destroy()
        src.destroy()
        dst.destroy()
    return 2 * words * 16 / (us * 1e-6) / 1e9


def _weight_copies(
    runner: RegionRunner, inputs: Mapping[str, np.ndarray], copies: int
) -> dict[str, list[DeviceBuffer]]:
    """`copies - 1` extra copies of every weight input (copy 0 is the runner's own buffer)."""
    extra: dict[str, list[DeviceBuffer]] = {}
    for b in weight_inputs(runner.region):
        name = b.name
        extra[name] = []
        for _ in range(copies - 1):
            buf = DeviceBuffer(runner.dev, runner.buffer(name).size)
            buf.upload(device_array(b, np.asarray(inputs[name])))
            extra[name].append(buf)
    return extra


@attrs.define
class _Recorded:
    path: str
    cmd: Any
    pool: Any
    pipelines: list[Any]
    dispatches: int
    barriers: int
    samples: list[float] = attrs.Factory(list)


def _record(
    runner: RegionRunner, fused: bool, extra: dict[str, list[DeviceBuffer]], copies: int, reps: int
) -> _Recorded:
    """One command buffer of `reps` steps of a product, weights rotating among the copies,
    a timestamp before and after each step."""
    dev, vk = runner.dev, runner.dev.vk
    path, kernels = runner.choose(fused)
    pipelines, sizes = runner.pipelines_for(kernels, sets=copies)
    for p, k in zip(pipelines, kernels, strict=True):
        for c in range(1, copies):
            p.bind(
                {
                    b.binding: (
                        (
                            extra[b.buffer][c - 1] if b.buffer in extra else runner.buffer(b.buffer)
                        ).handle,
                        runner.buffer(b.buffer).size,
                    )
                    for b in k.bindings
                },
                set_index=c,
            )
    pool = _timestamps(dev, 2 * reps)
    cmd = begin_commands(dev)
    vk.vkCmdResetQueryPool(cmd, pool, 0, 2 * reps)
    dispatches = barriers = 0
    for i in range(reps):
        _barrier(dev, cmd)  # the previous step's writes
        vk.vkCmdWriteTimestamp(cmd, vk.VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, pool, 2 * i)
        dispatches, barriers = runner.record(cmd, kernels, pipelines, sizes, set_index=i % copies)
        vk.vkCmdWriteTimestamp(cmd, vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, pool, 2 * i + 1)
    vk.vkEndCommandBuffer(cmd)
    return _Recorded(path, cmd, pool, pipelines, dispatches, barriers)


def _release(runner: RegionRunner, rec: _Recorded) -> None:
    vk = runner.dev.vk
    vk.vkFreeCommandBuffers(runner.dev.device, runner.dev.command_pool, 1, [rec.cmd])
    vk.vkDestroyQueryPool(runner.dev.device, rec.pool, None)
    for p in rec.pipelines:
        p.destroy()


def dispatch_profile(
    runner: RegionRunner, inputs: Mapping[str, np.ndarray], fused: bool, reps: int = 20
) -> list[tuple[str, float]]:
    """Median µs of each dispatch of one step (barrier waits included: a timestamp after each
    dispatch, measured from the one before), weights not rotated."""
    dev, vk = runner.dev, runner.dev.vk
    _, kernels = runner.choose(fused)
    runner.prepare(inputs)
    pipelines, sizes = runner.pipelines_for(kernels)
    names: list[str] = []
    count = len(runner._schedule(kernels, pipelines, sizes)) + 1
    pool = _timestamps(dev, count * reps)
    try:
        cmd = begin_commands(dev)
        vk.vkCmdResetQueryPool(cmd, pool, 0, count * reps)
        for i in range(reps):
            _barrier(dev, cmd)
            base = i * count
            vk.vkCmdWriteTimestamp(cmd, vk.VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, pool, base)

            def stamp(n: int, name: str, base: int = base, first: bool = i == 0) -> None:
                vk.vkCmdWriteTimestamp(
                    cmd, vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, pool, base + n + 1
                )
                if first:
                    names.append(name)

            runner.record(cmd, kernels, pipelines, sizes, after=stamp)
        vk.vkEndCommandBuffer(cmd)
        _warm_up(dev, cmd)
        submit(dev, cmd)
        t = read_stamps_us(dev, pool, count * reps)
        out = []
        for n, name in enumerate(names):
            deltas = [t[i * count + n + 1] - t[i * count + n] for i in range(reps)]
            out.append((name, statistics.median(deltas)))
        vk.vkFreeCommandBuffers(dev.device, dev.command_pool, 1, [cmd])
    finally:
        vk.vkDestroyQueryPool(dev.device, pool, None)
        for p in pipelines:
            p.destroy()
    return out


def weight_bytes(region: mr.Region, consts: Mapping[str, int | float]) -> int:
    total = 0
    for b in weight_inputs(region):
        total += math.prod(shape_of(b, consts)) * np.dtype(NP_DTYPES[b.dtype]).itemsize
    return total


def time_region(
    dev: Device,
    build: Build,
    name: str,
    inputs: Mapping[str, np.ndarray],
    consts: Mapping[str, int | float] | None = None,
    reps: int = 50,
    copies: int | None = None,
    submissions: int = 5,
) -> RegionTiming:
    """Fused and unfused side by side: both recorded over the same weight copies, submitted
    alternately (fused, unfused, fused, ...) so that anything else loading the GPU meanwhile
    weighs on both the same."""
    runner = RegionRunner(dev, build, name, consts)
    recs: list[_Recorded] = []
    extra: dict[str, list[DeviceBuffer]] = {}
    try:
        wb = weight_bytes(runner.region, runner.consts)
        if copies is None:
            copies = max(1, min(8, -(-L2_BYTES // max(wb, 1)) + 1)) if wb else 1
        runner.prepare(inputs)
        extra = _weight_copies(runner, inputs, copies)
        recs = [_record(runner, fused, extra, copies, reps) for fused in (True, False)]
        _settle(dev, recs, reps)
        for _ in range(submissions):
            for rec in recs:
                submit(dev, rec.cmd)
                rec.samples += _read_us(dev, rec.pool, 2 * reps)
    finally:
        for rec in recs:
            _release(runner, rec)
        for bufs in extra.values():
            for buf in bufs:
                buf.destroy()
        runner.close()
    fused, unfused = (
        ProductTiming(
            r.path, statistics.median(r.samples), tuple(r.samples), r.dispatches, r.barriers
        )
        for r in recs
    )
    if not fused.samples_us:
        raise RuntimeFailure("no timestamps were recorded")
    return RegionTiming(name, dict(runner.consts), wb, copies, fused, unfused, reps)
