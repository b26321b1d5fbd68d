"""Where time goes inside the persistent product: per-stage device-clock stamps
(docs/PERSISTENT.md, "Stamps").

Input: a `PersistentStep` made with `stamps=True` (its product writes, per ticket, the device
clock of GL_EXT_shader_realtime_clock when the ticket was taken, when its item started, its
waits over, and when it ended: codegen/persistent.py `STAMP_KINDS`).  Output: per stage of the
product, the first start and the last end as offsets from the kernel's first stamp, in µs.

The realtime clock's rate is not specified by Vulkan (GL_EXT_shader_realtime_clock: "the units
of time are not defined"; VK_KHR_shader_clock gives no frequency), so it is measured
(`calibrate_clock`): the product is dispatched twice, `pause_s` apart, each time followed by a
timestamp query (whose period the device reports: `timestampPeriod`); the clock's advance between
the two runs' first stamps over the advance of the timestamps before them is one estimate of its
rate, the last stamps' over the timestamps' after them another; the rate is their mean, their
relative difference its spread (reported).  The delay from a timestamp to the run's first stamp
(or from its last stamp to the timestamp) is about the same in both runs and cancels; what
remains (its jitter: µs on a GPU, ms on lavapipe on loaded cores) is a small part of a pause of
0.3 s.

The clock's width: where every high word of a run reads 0 (lavapipe, Mesa 22 with LLVM 15: the
clock counts ns, truncated to 32 bits), the clock is taken as 32 bits wide and differences are
taken modulo 2**32 (`clock_bits`): right while a run and the pause each span fewer than 2**31
ticks (2.1 s of a 1 GHz clock).

Not done here: the stamps' own cost (a clock read and two stores by one lane per stamp; a
stamped product is timed separately from the one `time_steps` times), and any reading of a
product without stamps.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import attrs
import numpy as np

from fusec.codegen import persistent as pc

from .device import Device, RuntimeFailure
from .dispatch import Build, begin_commands, submit
from .persistent import PersistentStep
from .step import Call, Step, StepBuffers

if TYPE_CHECKING:
    from fusec.runtime import decode_layer as layer

UNWRITTEN = 0xFFFFFFFF  # the stamp buffer's words before a run: a word left so was not written
CLOCK_SOURCE = (
    "clockRealtime2x32EXT (GL_EXT_shader_realtime_clock, VK_KHR_shader_clock shaderDeviceClock); "
    "its rate measured against two timestamp queries"
)


WARM_S = 0.3  # seconds of discarded runs before the stamped ones (measure_stamps)
LEAD_US = 40_000.0  # µs of untimed runs in front of each stamped run in its command buffer
LEAD_MAX = 64


def unavailable(dev: Device) -> str | None:
    """None where the device can run a stamped product, else why not, in one sentence."""
    if dev.info.shader_clock:
        return None
    return (
        f"stamps are not available: '{dev.info.name}' has no shaderDeviceClock "
        "(VK_KHR_shader_clock); the product ran without them"
    )


@attrs.frozen
class Clock:
    ticks_per_us: float
    spread: float  # |two estimates' difference| / their mean
    pause_us: float  # the timestamps' advance the rate was measured over


def _timestamp_mask(dev: Device) -> int:
    bits = dev.timestamp_bits
    return (1 << bits) - 1 if 0 < bits < 64 else (1 << 64) - 1


def clock_bits(raw: np.ndarray) -> int:
    """The clock's width as one run's stamps show it (raw words, shape (..., 2)): 32 where
    every high word is 0, else 64."""
    return 64 if bool(np.any(raw[..., 1])) else 32


def since(ticks: np.ndarray, ref: int, bits: int) -> np.ndarray:
    """`ticks` - `ref` on a clock of `bits` bits, as signed int64: a difference of less than
    2**(bits-1) ticks either way is right across a wrap of the clock."""
    wrap = 1 << bits
    d = (np.asarray(ticks, np.uint64) - np.uint64(ref % wrap)) & np.uint64(wrap - 1)
    if bits == 64:
        return d.view(np.int64)
    signed = d.astype(np.int64)
    return np.where(signed >= wrap >> 1, signed - wrap, signed)


def run_once(
    step: PersistentStep, pool: Any, queries: int, lead: int = 0
) -> tuple[np.ndarray, list[int], int]:
    """One run of the stamped product between timestamps: its stamps as ticks, shape (items,
    3), the raw timestamps, and the clock's width.  `lead`: that many untimed runs first in
    the same command buffer, their stamps cleared after them, so that the GPU has been busy,
    its clocks up, when the timed run starts (`measure_stamps`); the first timestamp is then
    written at the bottom of the pipe, after them (top of pipe, it may be written before the
    lead runs end), else at the top."""
    from .timing import _barrier

    dev, vk = step.dev, step.dev.vk
    assert step.stamps is not None
    words = pc.STAMP_WORDS * step.product.items
    step.stamps.upload(np.full(words, UNWRITTEN, np.uint32))
    cmd = begin_commands(dev)
    try:
        vk.vkCmdResetQueryPool(cmd, pool, 0, queries)
        for _ in range(lead):
            step.record_into(cmd)
            _barrier(dev, cmd)
        if lead:
            vk.vkCmdFillBuffer(cmd, step.stamps.handle, 0, 4 * words, UNWRITTEN)
            _barrier(dev, cmd)
        first = (
            vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT
            if lead
            else vk.VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT
        )
        vk.vkCmdWriteTimestamp(cmd, first, pool, 0)
        step.record_into(cmd)
        vk.vkCmdWriteTimestamp(cmd, vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, pool, 1)
        vk.vkEndCommandBuffer(cmd)
        submit(dev, cmd)
    finally:
        vk.vkFreeCommandBuffers(dev.device, dev.command_pool, 1, [cmd])
    data = vk.ffi.new("uint64_t[]", queries)
    flags = vk.VK_QUERY_RESULT_64_BIT | vk.VK_QUERY_RESULT_WAIT_BIT
    vk.vkGetQueryPoolResults(dev.device, pool, 0, queries, 8 * queries, data, 8, flags)
    raw = step.stamps.download(np.uint32, (step.product.items, 3, 2))
    missing = int(np.sum(np.all(raw == UNWRITTEN, axis=2)))
    if missing:
        raise RuntimeFailure(f"{missing} stamps of the persistent product were not written")
    ticks = raw[..., 0].astype(np.uint64) | (raw[..., 1].astype(np.uint64) << np.uint64(32))
    return ticks, [int(data[i]) for i in range(queries)], clock_bits(raw)


def with_pool(dev: Device, queries: int, body: Callable[[Any], Any]) -> Any:
    from .timing import _timestamps

    pool = _timestamps(dev, queries)
    try:
        return body(pool)
    finally:
        dev.vk.vkDestroyQueryPool(dev.device, pool, None)


def calibrate_clock(step: PersistentStep, pause_s: float = 0.3) -> Clock:
    """The device clock's ticks per µs: two runs `pause_s` apart; the first stamps' advance over
    the advance of the timestamps written before the runs, and the last stamps' over the
    timestamps written after them: two estimates, whose mean is the rate and whose relative
    difference its spread (module docstring)."""
    dev = step.dev
    mask = _timestamp_mask(dev)
    us_per_ts = dev.info.timestamp_period_ns / 1000.0

    def body(pool: Any) -> Clock:
        ticks0, ts0, bits0 = run_once(step, pool, 2)
        time.sleep(pause_s)
        ticks1, ts1, bits1 = run_once(step, pool, 2)
        bits = max(bits0, bits1)
        ref = int(ticks0[0, 0])
        rel0, rel1 = since(ticks0, ref, bits), since(ticks1, ref, bits)
        rates = []
        for clock, stamps in (
            (int(rel1.min()) - int(rel0.min()), 0),  # first stamps, timestamps before
            (int(rel1.max()) - int(rel0.max()), 1),  # last stamps, timestamps after
        ):
            us = ((ts1[stamps] - ts0[stamps]) & mask) * us_per_ts
            if clock <= 0 or us <= 0:
                raise RuntimeFailure(
                    f"the device clock did not advance between two runs ({clock} ticks in "
                    f"{us:.0f} µs of timestamps)"
                )
            rates.append(clock / us)
        rate = (rates[0] + rates[1]) / 2
        return Clock(rate, abs(rates[0] - rates[1]) / rate, ((ts1[1] - ts0[1]) & mask) * us_per_ts)

    result: Clock = with_pool(dev, 2, body)
    return result


def analyze_stamps(
    product: pc.Product, ticks: np.ndarray, rate: float, bits: int = 64
) -> dict[str, Any]:
    """One run's stamps (ticks, shape (items, 3)) per stage: its first start and last end as
    µs from the kernel's first stamp, their span, its median item and median wait (an item's
    ticket taken to its start), and the kernel's span (first stamp to last)."""
    rel = since(ticks, int(ticks[0, 0]), bits)  # ticket 0's: within a run of every other
    us = (rel - rel.min()).astype(np.float64) / rate
    stages = []
    first = 0
    for i, s in enumerate(product.stages):
        rows = us[first : first + s.items]
        first += s.items
        start, end = float(rows[:, 1].min()), float(rows[:, 2].max())
        stages.append(
            {
                "stage": f"{s.name}#{i}",
                "items": s.items,
                "depends": [f"{product.stages[d].name}#{d}" for d in s.depends],
                "start_us": start,
                "end_us": end,
                "span_us": end - start,
                "item_us": float(np.median(rows[:, 2] - rows[:, 1])),
                "wait_us": float(np.median(rows[:, 1] - rows[:, 0])),
            }
        )
    return {"kernel_us": float(us.max()), "stages": stages}


def measure_stamps(
    step: PersistentStep, pos: int, runs: int = 5, warm_s: float = WARM_S
) -> dict[str, Any]:
    """The stamped product run `runs` times at `pos`: per stage the median over runs of
    `analyze_stamps`' figures, the kernel's span beside the dispatch's (timestamps around it),
    the clock's rate and source.  The runs are measured as the plain product is timed, on a
    busy GPU: each timed run right behind `lead_runs` untimed ones in its command buffer (about
    LEAD_US of work, at least one), after `warm_s` seconds of such runs discarded.  A lone run
    is not: on the H200 it took 2.7 to 4.3 times as long as the same stamped product in a
    stream of steps, where the stamps cost 1-2% (docs/PERSISTENT.md)."""
    dev = step.dev
    step.set_pos(pos=pos)
    clock = calibrate_clock(step)
    mask = _timestamp_mask(dev)
    us_per_ts = dev.info.timestamp_period_ns / 1000.0

    def body(pool: Any) -> tuple[int, list[tuple[dict[str, Any], float]]]:
        _, ts, _ = run_once(step, pool, 2)  # a lone run: at least what a run takes
        lone_us = max(1.0, ((ts[1] - ts[0]) & mask) * us_per_ts)
        lead = max(1, min(LEAD_MAX, math.ceil(LEAD_US / lone_us)))
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < warm_s:  # clocks rise under sustained work only
            run_once(step, pool, 2, lead)
        out = []
        for _ in range(runs):
            ticks, ts, bits = run_once(step, pool, 2, lead)
            span = ((ts[1] - ts[0]) & mask) * us_per_ts
            out.append((analyze_stamps(step.product, ticks, clock.ticks_per_us, bits), span))
        return lead, out

    lead, samples = with_pool(dev, 2, body)
    return {**summarize(samples, clock), "warm_up_s": warm_s, "lead_runs": lead}


def summarize(samples: Sequence[tuple[dict[str, Any], float]], clock: Clock) -> dict[str, Any]:
    """The median over runs of each figure, rounded to 0.01 µs, and each run's kernel and
    dispatch spans (the test checks the kernel inside the dispatch run by run)."""

    def med(xs: Sequence[float]) -> float:
        return round(float(statistics.median(xs)), 2)

    first = samples[0][0]["stages"]
    stages = []
    for j, s in enumerate(first):
        row = {k: v for k, v in s.items() if not k.endswith("_us")}
        for key in ("start_us", "end_us", "span_us", "item_us", "wait_us"):
            row[key] = med([a["stages"][j][key] for a, _ in samples])
        stages.append(row)
    return {
        "available": True,
        "clock": CLOCK_SOURCE,
        "ticks_per_us": float(f"{clock.ticks_per_us:.6g}"),
        "ticks_per_us_spread": float(f"{clock.spread:.3g}"),
        "calibration_us": round(clock.pause_us, 1),
        "runs": len(samples),
        "kernel_us": med([a["kernel_us"] for a, _ in samples]),
        "dispatch_us": med([d for _, d in samples]),
        "per_run": [
            {"kernel_us": round(a["kernel_us"], 2), "dispatch_us": round(d, 2)} for a, d in samples
        ],
        "stages": stages,
    }


def bench_stamps(
    dev: Device,
    build: Build,
    calls: Sequence[Call],
    buffers: StepBuffers,
    arrays: Mapping[str, np.ndarray],
    answers: layer.Answers,
    wdtype: str,
    pos: int,
    runs: int = 5,
) -> dict[str, Any]:
    """`fusec bench --preset P --persistent --per-dispatch`: the stamped product checked
    against the numpy layer (`answers`), then `measure_stamps`; where the device cannot stamp or
    the stamped product is refused, {"available": False, "why": one sentence}."""
    from fusec.runtime import decode_layer as layer

    from .persistent import Refused, source_program
    from .step import decode_tokens, errors_from

    why = unavailable(dev)
    if why is not None:
        return {"available": False, "why": why}
    try:
        step = PersistentStep(dev, build, calls, buffers, source_program(), stamps=True)
    except Refused as e:
        return {"available": False, "why": f"stamps are not available: {e}"}
    try:
        stamped = cast(Step, step)  # a PersistentStep records as a Step does
        tol = layer.TOLERANCE[wdtype]
        errors = errors_from(
            stamped,
            buffers,
            arrays,
            answers,
            tol,
            lambda: decode_tokens(stamped, [pos], lambda p: None, lambda p: None),
        )
        if any(e > tol for e in errors.values()):
            raise RuntimeFailure(
                f"the stamped persistent product does not match the numpy layer ({errors})"
            )
        out = measure_stamps(step, pos, runs)
        out["compiled"] = step.compiled
        out["errors"] = {n: float(f"{e:.3g}") for n, e in errors.items()}
        return out
    finally:
        step.close()
