"""`fusec tune` on the present device: verify each candidate, then time them side by side.

Input: the candidates (runtime/tune_build.py), the region's IR for the numpy reference, the
constants of the run.  Output: per candidate a `Timed` record (median µs, the path it ran, its
error against the reference) or the reason it was dropped.

One draw of random inputs and one reference (`draw`) serve every candidate and every batch (a
schedule changes how the region runs, not what it computes).  Each candidate runs its fused
product once on poisoned outputs and is compared with the reference; a mismatch or a fallback
drops it, loudly.  The rest are recorded as `fusec bench` records a region
(runtime/timing.py): `reps` steps per command buffer, weights rotated among copies past L2, GPU
timestamps around each step; then, after the settling rounds, submitted in interleaved rounds
(A, B, C, A, B, C, ...) so that anything else loading the GPU weighs on all of them alike, and
each one's median taken.  The baseline may run as a fallback (what runs today); it is timed as
it runs.

Not done here: choosing the winner or printing (runtime/tune_cmd.py).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence

import attrs
import numpy as np

from fusec.dsl import ir
from fusec.dsl.reference import run_reference

from .buffers import DeviceBuffer
from .device import Device, RuntimeFailure
from .dispatch import RegionRunner, check_inputs, const_values, submit
from .timing import (
    L2_BYTES,
    _read_us,
    _record,
    _Recorded,
    _release,
    _settle,
    _weight_copies,
    weight_bytes,
)
from .tune_build import Candidate, Dropped
from .verify import output_tolerance, random_inputs, relative_error, tolerance_for


@attrs.frozen
class Timed:
    candidate: Candidate
    path: str
    error: float  # the worst output's error as a fraction of its tolerance (0 when exact)
    median_us: float
    samples: int


def _verify(
    runner: RegionRunner, inputs: Mapping[str, np.ndarray], ref: Mapping[str, np.ndarray]
) -> tuple[str, float, str | None]:
    """(path, worst error / tolerance, why it fails or None) of one fused run."""
    res = runner.run(inputs, fused=True)
    _, tol = tolerance_for(runner.region)
    worst = 0.0
    why = None
    for b in runner.region.outputs:
        err = relative_error(res.outputs[b.name], ref[b.name])
        limit = output_tolerance(b, tol)
        used = err / limit if limit else (0.0 if err == 0 else float("inf"))
        if used > 1 and why is None:
            why = f"output '{b.name}' differs from the reference by {err:.2e} (tolerance {limit:g})"
        worst = max(worst, used)
    return res.path, worst, why


@attrs.frozen
class Draw:
    """One draw of inputs at the run's constants and the numpy reference on it: the same for
    every candidate (a schedule changes how a region runs, not what it computes)."""

    values: Mapping[str, int | float]
    inputs: Mapping[str, np.ndarray]
    ref: Mapping[str, np.ndarray]


def draw(
    region_ir: ir.Region, candidate: Candidate, consts: Mapping[str, int | float], seed: int | None
) -> Draw:
    region = candidate.build.region(candidate.region)
    values = const_values(region, consts)
    inputs = random_inputs(region, values, np.random.default_rng(seed))
    check_inputs(region, inputs, values)
    with np.errstate(all="ignore"):
        ref = run_reference(region_ir, inputs, values)
    return Draw(values, inputs, ref)


def time_candidates(
    dev: Device,
    region_ir: ir.Region,
    candidates: Sequence[Candidate],
    drawn: Draw,
    dropped: Dropped,
    warn: Callable[[str], None],
    reps: int = 20,
    submissions: int = 5,
    copies: int | None = None,
    min_waves: int | None = None,
    advance: Callable[[], None] = lambda: None,
) -> list[Timed]:
    """Verify, then time every candidate side by side; those dropped are counted in `dropped`
    and named through `warn`."""
    region = candidates[0].build.region(candidates[0].region)
    values, inputs, ref = drawn.values, drawn.inputs, drawn.ref
    wb = weight_bytes(region, values)
    if copies is None:
        copies = max(1, min(8, -(-L2_BYTES // max(wb, 1)) + 1)) if wb else 1
    live: list[tuple[Candidate, RegionRunner, str, float]] = []
    recs: list[_Recorded] = []
    extras: list[dict[str, list[DeviceBuffer]]] = []
    try:
        for c in candidates:
            runner = RegionRunner(dev, c.build, c.region, values, None, min_waves)
            live.append((c, runner, "", 0.0))
            path, used, why = _verify(runner, inputs, ref)
            label = c.schedule.label()
            if why is None and not c.baseline and not path.startswith("fused"):
                why = f"ran as {path}"
                dropped.add("device", f"ran as {path.split('(')[0]}(...)")
            elif why is not None:
                dropped.add("mismatch", why.split(" by ")[0])
            if why is not None and c.baseline:
                raise RuntimeFailure(
                    f"the region's own schedule ({label}) does not match the reference: {why}; "
                    "not tuning it"
                )
            if why is not None:
                warn(f"candidate {label} dropped: {why}")
                live.pop()
                runner.close()
                continue
            live[-1] = (c, runner, path, used)
        for _, runner, _, _ in live:
            runner.prepare(inputs)
            extra = _weight_copies(runner, inputs, copies)
            extras.append(extra)
            recs.append(_record(runner, True, extra, copies, reps))
        if dev.info.kind == "CPU":
            for rec in recs:  # a CPU device's times are only a scale: one round to warm up
                submit(dev, rec.cmd)
        else:
            _settle(dev, recs, reps)
        for _ in range(submissions):
            for rec in recs:
                submit(dev, rec.cmd)
                rec.samples += _read_us(dev, rec.pool, 2 * reps)
            advance()
    finally:
        for (_, runner, _, _), rec in zip(live, recs, strict=False):
            _release(runner, rec)
        for extra in extras:
            for bufs in extra.values():
                for buf in bufs:
                    buf.destroy()
        for _, runner, _, _ in live:
            runner.close()
    return [
        Timed(c, path, used, statistics.median(rec.samples), len(rec.samples))
        for (c, _, path, used), rec in zip(live, recs, strict=True)
    ]
