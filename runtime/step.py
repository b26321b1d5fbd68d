"""A decode step: a sequence of regions recorded once into one command buffer, replayed per token.

The step's buffers (activations, weights, KV caches) are allocated once and shared by its
regions, which name them through a binding (`region buffer -> step buffer`).  Each region runs
fused or as its unfused chain, as its `RegionRunner` decides (kill switches, budget gate, device
limits), and the step reports which ran per region and why.  A barrier is recorded before a
dispatch only where it touches a buffer written since the last barrier, across regions too.
Run-time parameters (the token position `pos`) live in small host-visible buffers: replaying the
recorded commands for the next token is a host write and a submit, nothing is re-recorded.
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

from fusec.codegen import manifest_records as mr
from fusec.codegen.manifest_kernel import Packed

from .buffers import DeviceBuffer
from .device import Device, RuntimeFailure
from .dispatch import (
    NP_DTYPES,
    Build,
    RegionRunner,
    begin_commands,
    check_memory,
    const_values,
    poison_array,
    shape_of,
    submit,
)
from .pipelines import Pipeline
from .repack import packed_array

if TYPE_CHECKING:
    from .decode_layer import Answers


@attrs.frozen
class Call:
    """One region of a step: its constants, and which step buffer each of its buffers is."""

    region: str
    bind: Mapping[str, str]
    consts: Mapping[str, int | float] = attrs.Factory(dict)


@attrs.frozen
class BufferDecl:
    name: str
    dtype: str
    shape: tuple[int, ...]  # numpy storage shape (uint8 blocks for quantized weights)
    packing: Packed | None = None  # a weight repacked at upload (runtime/repack.py)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * np.dtype(NP_DTYPES[self.dtype]).itemsize


def step_buffers(build: Build, calls: Sequence[Call]) -> dict[str, BufferDecl]:
    """Every step buffer with its dtype and shape, from the first region that names it; a later
    region may view it with another shape of the same size and dtype (qkv[6144] as [48, 128])."""
    decls: dict[str, BufferDecl] = {}
    first: dict[str, str] = {}  # the region that declared each step buffer
    for call in calls:
        region = build.region(call.region)
        values = const_values(region, call.consts)
        named = {b.name: b for b in [*region.inputs, *region.outputs]}
        for local, name in call.bind.items():
            if local not in named:
                known = ", ".join(named)
                raise RuntimeFailure(
                    f"region '{call.region}' has no buffer '{local}'", f"buffers: {known}"
                )
            b = named[local]
            decl = BufferDecl(name, b.dtype, shape_of(b, values), b.packing)
            old = decls.get(name)
            if old is None:
                decls[name] = decl
            elif old.dtype != decl.dtype or old.nbytes != decl.nbytes:
                raise RuntimeFailure(
                    f"step buffer '{name}' is {old.dtype} {old.shape} but region "
                    f"'{call.region}' binds it as {decl.dtype} {decl.shape}"
                )
            elif old.packing != decl.packing:
                # one upload per weight: every region reading it must read one layout
                raise RuntimeFailure(
                    f"step buffer '{name}' is read {_packing_text(old.packing)} by region "
                    f"'{first[name]}' but {_packing_text(decl.packing)} by region "
                    f"'{call.region}'",
                    "give both regions the same 'packed' schedule line for it",
                )
            first.setdefault(name, call.region)
        for b in [*region.inputs, *region.outputs]:
            if b.name not in call.bind:
                raise RuntimeFailure(
                    f"buffer '{b.name}' of region '{call.region}' is not bound to a step buffer"
                )
    return decls


def _packing_text(p: Packed | None) -> str:
    return "as GGUF bytes" if p is None else f"packed {p.layout}"


def set_runtime_params(runners: Sequence[Any], params: Mapping[str, int | float]) -> None:
    """Hand each region's runner the run-time parameters (`param pos`) it declares."""
    for runner in runners:
        mine = {
            k: v
            for k, v in params.items()
            if any(c.name == k and c.runtime for c in runner.region.consts)
        }
        if mine:
            runner.set_params(mine)


class StepBuffers:
    """The device buffers of a step, shared by its fused and unfused recordings."""

    def __init__(self, dev: Device, decls: Mapping[str, BufferDecl]) -> None:
        """Allocate every step buffer, after checking that the device can hold them all; none
        stay allocated when one fails."""
        dev.check_open()
        self.dev, self.decls = dev, dict(decls)
        check_memory(dev, {name: d.nbytes for name, d in decls.items()}, "the step")
        self.buffers: dict[str, DeviceBuffer] = {}
        try:
            for name, d in decls.items():
                self.buffers[name] = DeviceBuffer(dev, d.nbytes)
        except BaseException:
            self.destroy()
            raise

    def upload(self, arrays: Mapping[str, np.ndarray]) -> None:
        for name, a in arrays.items():
            decl = self.decls.get(name)
            if decl is None:
                raise RuntimeFailure(f"the step has no buffer '{name}'")
            want = np.dtype(NP_DTYPES[decl.dtype])
            if a.dtype != want or a.nbytes != decl.nbytes:
                raise RuntimeFailure(
                    f"step buffer '{name}' takes {want} of shape {decl.shape} ({decl.nbytes} "
                    f"bytes), not {a.dtype} of shape {tuple(a.shape)} ({a.nbytes} bytes)"
                )
            self.buffers[name].upload(packed_array(decl.dtype, decl.packing, np.asarray(a)))

    def download(self, name: str) -> np.ndarray:
        d = self.decls[name]
        return self.buffers[name].download(NP_DTYPES[d.dtype], d.shape)

    def destroy(self) -> None:
        for b in self.buffers.values():
            b.destroy()
        self.buffers = {}


@attrs.frozen
class StepReport:
    paths: tuple[tuple[str, str], ...]  # (region, fused | fallback(reason) | unfused)
    dispatches: int
    barriers: int


class Step:
    """One product of a step (fused, or every region unfused), recorded once."""

    def __init__(
        self, dev: Device, build: Build, calls: Sequence[Call], buffers: StepBuffers, fused: bool
    ) -> None:
        self.dev, self.calls, self.buffers, self.fused = dev, list(calls), buffers, fused
        self.runners: list[RegionRunner] = []
        self._plans: list[tuple[RegionRunner, Sequence[mr.Kernel], list[Pipeline], list[int]]] = []
        self._cmds: list[Any] = []
        try:
            paths = []
            for call in self.calls:
                external = {local: buffers.buffers[name] for local, name in call.bind.items()}
                runner = RegionRunner(dev, build, call.region, call.consts, external=external)
                self.runners.append(runner)
                path, kernels = runner.choose(fused)
                runner.ensure_buffers()
                pipelines, sizes = runner.pipelines_for(kernels)
                self._plans.append((runner, kernels, pipelines, sizes))
                paths.append((call.region, path))
            self.paths = tuple(paths)
        except BaseException:
            self.close()
            raise

    def set_pos(self, **params: int | float) -> None:
        """Run-time parameters for the next submission (each region takes those it declares)."""
        set_runtime_params(self.runners, params)

    def record_into(
        self, cmd: Any, after: Callable[[int, str], None] | None = None
    ) -> tuple[int, int]:
        """Record the step's regions into `cmd`; returns (dispatches, barriers)."""
        dispatches = barriers = 0
        dirty: set[int] = set()
        for runner, kernels, pipelines, sizes in self._plans:
            offset = dispatches

            def shifted(n: int, name: str, offset: int = offset) -> None:
                if after is not None:
                    after(offset + n, name)

            d, b = runner.record(cmd, kernels, pipelines, sizes, after=shifted, dirty=dirty)
            dispatches, barriers = dispatches + d, barriers + b
        return dispatches, barriers

    def record(self) -> tuple[Any, StepReport]:
        """A command buffer holding one step, to be submitted once per token."""
        cmd = begin_commands(self.dev)
        dispatches, barriers = self.record_into(cmd)
        self.dev.vk.vkEndCommandBuffer(cmd)
        self._cmds.append(cmd)
        return cmd, StepReport(self.paths, dispatches, barriers)

    def poison(self, keep: Iterable[str]) -> None:
        """NaN in every step buffer but `keep` (weights, caches, the input) and in every
        region's private intermediates: a value never written shows up in the outputs."""
        kept = set(keep)
        for name, d in self.buffers.decls.items():
            if name not in kept:
                self.buffers.upload({name: poison_array(d.dtype, d.shape)})
        for runner in self.runners:
            counters = runner.region.counters()  # 0 after every dispatch (kir.Arrive)
            for b in runner.region.intermediates:
                if b.name in counters:
                    continue
                shape = shape_of(b, runner.consts)
                runner.buffer(b.name).upload(poison_array(b.dtype, shape))

    def close(self) -> None:
        vk = self.dev.vk
        for cmd in [] if self.dev.closed else self._cmds:  # freed with a closed device
            vk.vkFreeCommandBuffers(self.dev.device, self.dev.command_pool, 1, [cmd])
        self._cmds = []
        for runner in self.runners:
            runner.close()
        self.runners, self._plans = [], []


def errors_from(
    step: Step,
    bufs: StepBuffers,
    start: Mapping[str, np.ndarray],
    answers: Answers,
    within: float,
    run: Callable[[], object],
) -> dict[str, float]:
    """`run` (a step, or a recording of steps, at one position) from the state `start`: its
    x and caches uploaded, every other buffer the step writes poisoned; then the relative
    error of each output against the right answer nearest it (`Answers.nearest`: numpy's
    where within `within`)."""
    bufs.upload({k: start[k] for k in ("x", "kc", "vt")})
    step.poison(keep=start)
    run()
    got = {n: bufs.download(n) for n in answers.numpy}
    return answers.nearest(got, within).errors


def decode_tokens(
    step: Step,
    positions: Sequence[int],
    before: Callable[[int], None],
    after: Callable[[int], None],
    replay: bool = True,
) -> StepReport:
    """For each position in order: `before(pos)` (e.g. upload the token's input), set `pos`,
    submit, `after(pos)` (e.g. download the outputs).  `replay`: the command buffer is recorded
    once and submitted for every token; otherwise a fresh one is recorded per token (the
    replay's oracle)."""
    vk = step.dev.vk
    cmd, report = step.record() if replay else (None, StepReport(step.paths, 0, 0))
    for pos in positions:
        before(pos)
        step.set_pos(pos=pos)
        if cmd is not None:
            submit(step.dev, cmd)
        else:
            fresh = begin_commands(step.dev)
            d, b = step.record_into(fresh)
            vk.vkEndCommandBuffer(fresh)
            submit(step.dev, fresh)
            vk.vkFreeCommandBuffers(step.dev.device, step.dev.command_pool, 1, [fresh])
            report = StepReport(step.paths, d, b)
        after(pos)
    return report


@attrs.frozen
class StepTiming:
    fused: StepReport
    unfused: StepReport
    fused_us: tuple[float, ...]  # one sample per step
    unfused_us: tuple[float, ...]
    # (kernel, median µs from the previous timestamp), one entry per dispatch of a step
    fused_profile: tuple[tuple[str, float], ...] = ()
    unfused_profile: tuple[tuple[str, float], ...] = ()


def _record_steps(step: Step, reps: int, per_dispatch: bool) -> tuple[Any, Any, int, StepReport]:
    """`reps` steps in one command buffer, a barrier between steps (each depends on the one
    before) and timestamps around each step, or after every dispatch with `per_dispatch`."""
    from .timing import _barrier, _timestamps

    vk = step.dev.vk
    cmd = begin_commands(step.dev)
    probe = begin_commands(step.dev)
    n_disp, _ = step.record_into(probe)  # count the dispatches to size the query pool
    vk.vkEndCommandBuffer(probe)
    vk.vkFreeCommandBuffers(step.dev.device, step.dev.command_pool, 1, [probe])
    per = n_disp + 1 if per_dispatch else 2
    pool = _timestamps(step.dev, per * reps)
    vk.vkCmdResetQueryPool(cmd, pool, 0, per * reps)
    report = StepReport(step.paths, 0, 0)
    for i in range(reps):
        _barrier(step.dev, cmd)
        base = i * per
        vk.vkCmdWriteTimestamp(cmd, vk.VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, pool, base)

        def stamp(n: int, name: str, base: int = base) -> None:
            vk.vkCmdWriteTimestamp(cmd, vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, pool, base + n + 1)

        d, b = step.record_into(cmd, after=stamp if per_dispatch else None)
        if not per_dispatch:
            vk.vkCmdWriteTimestamp(cmd, vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, pool, base + 1)
        report = StepReport(step.paths, d, b)
    vk.vkEndCommandBuffer(cmd)
    step._cmds.append(cmd)
    return cmd, pool, per, report


def _samples(dev: Device, pool: Any, per: int, reps: int) -> list[list[float]]:
    """Per step, the µs between consecutive timestamps."""
    from .timing import read_stamps_us

    t = read_stamps_us(dev, pool, per * reps)
    return [[t[i * per + j + 1] - t[i * per + j] for j in range(per - 1)] for i in range(reps)]


def time_steps(
    fused: Step,
    unfused: Step,
    pos: int,
    reps: int = 20,
    submissions: int = 5,
    per_dispatch: bool = False,
    warm_s: float = 0.3,
    verify: Callable[[Step, Callable[[], object]], object] | None = None,
) -> StepTiming:
    """Fused and unfused steps side by side over the same buffers: each recorded once with
    `reps` steps, submitted alternately `submissions` times after a warm-up; GPU timestamps.
    `verify(step, run)`, after the timing, is called for each recording that was timed (the
    steps', and with `per_dispatch` their stamped ones) with `run` submitting it, so that what
    was timed is what is checked."""
    from .timing import _warm_up

    dev, vk = fused.dev, fused.dev.vk
    for s in (fused, unfused):
        s.set_pos(pos=pos)
    recs = [_record_steps(s, reps, False) for s in (fused, unfused)]
    pools = [r[1] for r in recs]
    try:
        samples: list[list[float]] = [[], []]
        for cmd, _, _, _ in recs:
            _warm_up(dev, cmd, warm_s)
        for _ in range(submissions):
            for k, (cmd, pool, per, _) in enumerate(recs):
                submit(dev, cmd)
                samples[k] += [x[0] for x in _samples(dev, pool, per, reps)]
        if verify is not None:
            for (cmd, _, _, _), s in zip(recs, (fused, unfused), strict=True):
                verify(s, functools.partial(submit, dev, cmd))
        profiles: list[tuple[tuple[str, float], ...]] = [(), ()]
        if per_dispatch:
            for k, s in enumerate((fused, unfused)):
                names = _dispatch_names(s)
                cmd, pool, per, _ = _record_steps(s, reps, True)
                pools.append(pool)
                _warm_up(dev, cmd, warm_s / 3)
                submit(dev, cmd)
                rows = _samples(dev, pool, per, reps)
                profiles[k] = tuple(
                    (name, median([r[j] for r in rows])) for j, name in enumerate(names)
                )
                if verify is not None:  # the per-dispatch recording is timed too
                    verify(s, functools.partial(submit, dev, cmd))
    finally:
        for pool in pools:
            vk.vkDestroyQueryPool(dev.device, pool, None)
    return StepTiming(
        recs[0][3], recs[1][3], tuple(samples[0]), tuple(samples[1]), profiles[0], profiles[1]
    )


def _dispatch_names(step: Step) -> list[str]:
    names: list[str] = []
    cmd = begin_commands(step.dev)
    step.record_into(cmd, after=lambda n, name: names.append(name))
    step.dev.vk.vkEndCommandBuffer(cmd)
    step.dev.vk.vkFreeCommandBuffers(step.dev.device, step.dev.command_pool, 1, [cmd])
    return names


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")
