"""A decode step as one dispatch: the persistent product of its regions (codegen/persistent.py,
docs/PERSISTENT.md), beside the multi-dispatch chain (`step.Step`), which stays its fallback and
oracle.

`PersistentStep` records like a `step.Step` (`record_into`, `set_pos`, `poison`, `paths`), so
`decode_tokens` and `time_steps` run it unchanged.  It takes each region's buffers and run-time
parameters from a `RegionRunner` of its own (the step's buffers shared, as a Step does), plans
the product at the device's subgroup size, takes its SPIR-V from the build folder
(runtime/persistent_aot.py) or else compiles it (shaderc, where present), judges it with the
budget gate on the device's target (`estimate_product`, the default budget: a product has no
`budget` lines of its own) and dispatches it on a grid of `grid_workgroups`.

Which product runs is one switch, FUSEC_PERSISTENT (`off`, the default, or `on`), parsed
strictly; `persistent_or_chain` says which ran and why (a refused product falls back to the
multi-dispatch chain).  FUSEC_PERSISTENT_WORKGROUPS (a positive integer) overrides the grid, for
sweeps on a GPU.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import attrs
import numpy as np

from fusec.codegen import manifest_records as mr
from fusec.codegen import persistent as pc
from fusec.codegen.budget import budget_for, judge
from fusec.codegen.targets import Target, target_for_device
from fusec.dsl.diagnostics import DiagnosticError
from fusec.dsl.ir import PARAMS_BUFFER, Program

from .buffers import DeviceBuffer
from .device import Device, RuntimeFailure, choice_switch
from .dispatch import Build, RegionRunner, poison_array
from .gate import KernelNumbers, driver_numbers, judge_driver
from .persistent_aot import find_spv, product_specs
from .pipelines import Pipeline, pipeline_statistics
from .step import Call, Step, StepBuffers, set_runtime_params

if TYPE_CHECKING:
    from fusec.runtime import decode_layer as layer

PERSISTENT = ("off", "on")
PERSISTENT_SWITCH = "FUSEC_PERSISTENT"
DEFAULT_PERSISTENT = "off"
WORKGROUPS_SWITCH = "FUSEC_PERSISTENT_WORKGROUPS"
SCHEDULE_SWITCH = "FUSEC_PERSISTENT_SCHEDULE"  # ticket (default) | static
WORKGROUP_SIZE_SWITCH = "FUSEC_PERSISTENT_WORKGROUP_SIZE"  # default: the largest region's
GROUP_SWITCH = "FUSEC_PERSISTENT_ITEM_GROUP"  # workgroups of a kernel per item (default 1)
# Compute units when the device reports none (VK_NV_shader_sm_builtins' shaderSMCount,
# VK_AMD_shader_core_properties' CUs): the H200 has 132 SMs (FACTS.md); a CPU device runs as
# many workgroups at once as it has threads, and a few more cost only a ticket each.
DEFAULT_UNITS = {"nvidia": 132, "amd": 32, None: 8}
# SIMDs (NVIDIA: SM sub-partitions) per compute unit: Hopper SMs have 4 (NVIDIA H100
# whitepaper); an RDNA CU has 2 SIMD32 (RDNA whitepaper).  The estimate's waves are per SIMD.
SIMDS_PER_UNIT = {"nvidia": 4, "amd": 2}


def persistent_product(value: str | None = None) -> str:
    """`on` or `off`: `value`, else FUSEC_PERSISTENT, else the default; any other value is
    refused in one sentence (as FUSEC_ATTENTION is)."""
    return choice_switch(
        PERSISTENT_SWITCH, value, PERSISTENT, DEFAULT_PERSISTENT, "a persistent product setting"
    )


def workgroups_override(env: Mapping[str, str] | None = None) -> int | None:
    """FUSEC_PERSISTENT_WORKGROUPS as a positive integer, None when unset."""
    return _positive(env, WORKGROUPS_SWITCH, "a number of workgroups", "the estimate's grid")


def group_override(env: Mapping[str, str] | None = None) -> int:
    """FUSEC_PERSISTENT_ITEM_GROUP as a positive integer, 1 when unset."""
    return _positive(env, GROUP_SWITCH, "a number of workgroups per item", "one") or 1


def _positive(env: Mapping[str, str] | None, name: str, what: str, default: str) -> int | None:
    text = (os.environ if env is None else env).get(name)
    if text is None:
        return None
    if not text.isdigit() or int(text) < 1:
        raise RuntimeFailure(
            f"{name}={text!r} is not {what}",
            f"use a positive integer, or leave it unset for {default}",
        )
    return int(text)


def schedule_override(env: Mapping[str, str] | None = None) -> str:
    """FUSEC_PERSISTENT_SCHEDULE: `ticket` (the default) or `static`, strictly."""
    text = (os.environ if env is None else env).get(SCHEDULE_SWITCH, "ticket")
    return choice_switch(SCHEDULE_SWITCH, text, pc.SCHEDULES, "ticket", "a schedule")


def workgroup_size_override(env: Mapping[str, str] | None = None) -> int | None:
    """FUSEC_PERSISTENT_WORKGROUP_SIZE: the product's workgroup size (a power of two from 32
    to 1024), None when unset."""
    text = (os.environ if env is None else env).get(WORKGROUP_SIZE_SWITCH)
    if text is None:
        return None
    if not text.isdigit() or int(text) not in (32, 64, 128, 256, 512, 1024):
        raise RuntimeFailure(
            f"{WORKGROUP_SIZE_SWITCH}={text!r} is not a workgroup size",
            "use a power of two from 32 to 1024, or leave it unset for the largest region's",
        )
    return int(text)


def compute_units(dev: Device) -> int | None:
    """The device's compute units where it reports them: SMs (VK_NV_shader_sm_builtins) or
    CUs (VK_AMD_shader_core_properties); None otherwise."""
    vk = dev.vk
    exts = {
        str(e.extensionName) for e in vk.vkEnumerateDeviceExtensionProperties(dev.physical, None)
    }
    try:
        if "VK_NV_shader_sm_builtins" in exts:
            nv = vk.VkPhysicalDeviceShaderSMBuiltinsPropertiesNV()
            vk.vkGetPhysicalDeviceProperties2(
                dev.physical, vk.VkPhysicalDeviceProperties2(pNext=nv)
            )
            return int(nv.shaderSMCount) or None
        if "VK_AMD_shader_core_properties" in exts:
            amd = vk.VkPhysicalDeviceShaderCorePropertiesAMD()
            vk.vkGetPhysicalDeviceProperties2(
                dev.physical, vk.VkPhysicalDeviceProperties2(pNext=amd)
            )
            cus = amd.shaderEngineCount * amd.shaderArraysPerEngineCount
            return int(cus * amd.computeUnitsPerShaderArray) or None
    except (AttributeError, TypeError):  # a vulkan package without these structures
        return None
    return None


def grid_workgroups(
    product: pc.Product,
    target: Target | None,
    waves_per_simd: int | None,
    wave: int,
    units: int | None,
    override: int | None = None,
) -> tuple[int, str]:
    """The grid and why: resident workgroups = compute units x workgroups per unit (the
    estimate's waves per SIMD x SIMDs per unit / waves per workgroup), never more than the
    product has items.  Any grid is deadlock-free (codegen/persistent.py); one beyond the
    resident workgroups only adds workgroups that find no item left."""
    if override is not None:
        return min(override, product.items), f"{WORKGROUPS_SWITCH}={override}"
    vendor = target.vendor if target is not None else None
    n = units or DEFAULT_UNITS[vendor]
    source = "reported" if units else "default"
    if target is None or not waves_per_simd:
        return min(n, product.items), f"{n} units ({source}), one workgroup each"
    per_wg = max(1, product.workgroup_size // wave)
    per_unit = max(1, waves_per_simd * SIMDS_PER_UNIT[target.vendor] // per_wg)
    return (
        min(n * per_unit, product.items),
        f"{n} units ({source}) x {per_unit} workgroups ({waves_per_simd} waves per SIMD)",
    )


@functools.cache
def source_program() -> Program:
    """kernels.fuse, checked as a build checks it: the regions the layer's items are lowered
    from (the same source as the build the layer runs)."""
    from fusec.codegen.build import check_source
    from fusec.runtime.decode_layer import KERNELS_FUSE

    return check_source(KERNELS_FUSE.read_text(), str(KERNELS_FUSE))


def confirm_product(
    target: Target,
    size: int,
    stats: Mapping[str, float],
    workgroup_size: int,
    estimated: KernelNumbers | None,
    waves: int | None,
) -> tuple[int | None, str]:
    """The gate at pipeline creation for the persistent product, as for a fused region
    (runtime/gate.py): the driver's statistics of its freshly created pipeline judged against
    the budget.  Returns the waves per SIMD the grid is sized from (the driver's where it
    reports them: an estimate above them would size a grid the device cannot hold at once)
    and a note for the verdict; raises Refused, naming the estimate that was wrong, when the
    driver's numbers break the budget."""
    numbers = driver_numbers(target, size, stats, workgroup_size)
    if numbers is None:
        return waves, "; the driver reports no register count"
    driver, allocated = numbers
    why = judge_driver(
        "persistent", target, size, estimated, driver, allocated, budget_for(target.name, ())
    )
    if why is not None:
        raise Refused(f"driver: {why}")
    est = "no estimate" if estimated is None else f"estimated {estimated.vgprs}"
    return driver.waves_per_simd, (
        f"; driver: {driver.vgprs} registers ({est}), {driver.spills} spilled, "
        f"{driver.waves_per_simd} waves per SIMD"
    )


class Refused(Exception):
    """The persistent product cannot run here; the reason, for the report."""


@attrs.frozen
class ProductReport:
    product: str  # "persistent" | "multi-dispatch"
    why: str


class PersistentStep:
    """A step's regions as one dispatch (a persistent product), recorded like a `Step`."""

    fused = True  # every region's fused kernel, as items

    def __init__(
        self,
        dev: Device,
        build: Build,
        calls: Sequence[Call],
        buffers: StepBuffers,
        program: Program,
        workgroups: int | None = None,
        stamps: bool = False,
    ) -> None:
        """`program`: the checked source the build was made from (its regions are re-lowered
        as items).  `stamps`: the product writes device-clock stamps per item into
        `self.stamps` (runtime/persistent_stamps.py reads them; the device must have
        shaderDeviceClock).  Raises Refused when the product cannot run here or the gate
        refuses it."""
        self.dev, self.calls, self.buffers = dev, list(calls), buffers
        self.runners: list[RegionRunner] = []
        self._cmds: list[Any] = []
        self.pipeline: Pipeline | None = None
        self.counters: DeviceBuffer | None = None
        self.stamps: DeviceBuffer | None = None
        try:
            self._make(build, program, workgroups, stamps)
        except BaseException:
            self.close()
            raise

    def _make(self, build: Build, program: Program, workgroups: int | None, stamps: bool) -> None:
        dev = self.dev
        if stamps and not dev.info.shader_clock:
            raise Refused(f"'{dev.info.name}' has no shaderDeviceClock (VK_KHR_shader_clock)")
        for call in self.calls:
            external = {local: self.buffers.buffers[name] for local, name in call.bind.items()}
            runner = RegionRunner(dev, build, call.region, call.consts, external=external)
            self.runners.append(runner)
            runner.ensure_buffers()
        specs = product_specs(build, self.calls, program)
        sizes = {
            dev.subgroup_size_for(k.subgroup.kind, k.subgroup.sizes)
            for r in self.runners
            for k in r.region.fused
        }
        if len(sizes) != 1 or None in sizes:
            raise Refused(f"the regions run at different subgroup sizes here ({sizes})")
        (size,) = sizes
        assert size is not None
        schedule = schedule_override()
        try:
            product = pc.plan_product(
                specs, size, workgroup_size_override(), schedule, group_override(), stamps
            )
        except pc.NotAnItem as e:
            raise Refused(str(e)) from None
        if product.lds_bytes > dev.info.max_shared_bytes:
            raise Refused(
                f"{product.lds_bytes} bytes of shared memory, more than the device's "
                f"{dev.info.max_shared_bytes}"
            )
        from fusec.codegen.shaderc import backend, compile_glsl

        self.glsl = pc.emit_persistent(product)
        found = find_spv(build.path, product)
        if found is not None:
            spv, self.compiled = found, "SPIR-V built ahead of time"
        elif backend() == "none":
            raise Refused(
                "this build has no SPIR-V of the product with stamps and there is no GLSL "
                "compiler here (fusec build FILE --persistent PRESET --stamps writes it)"
                if stamps
                else "this build has no SPIR-V of the product and there is no GLSL compiler here "
                "(fusec build FILE --persistent PRESET writes it)"
            )
        else:
            try:
                spv = compile_glsl(self.glsl, "persistent")
            except DiagnosticError as e:
                raise RuntimeFailure(f"the persistent product does not compile: {e}") from None
            self.compiled = "compiled at run time: this build has no SPIR-V of it"
        target = target_for_device(dev.info.name)
        waves = None
        estimated: KernelNumbers | None = None
        self.verdict = "not judged: the device is no known target"
        if target is not None and size in target.wave_sizes:
            est = pc.estimate_product(product, spv, target, size)
            record = mr.Estimate(
                est.target,
                est.wave,
                est.vgprs,
                est.sgprs,
                est.lds_bytes,
                est.spills,
                est.waves_per_simd,
                est.uncertain,
                est.loads_up,
            )
            ok, why = judge(target.name, size, record, budget_for(target.name, ()))
            if not ok:
                raise Refused(f"budget: {why}")
            waves, self.verdict = est.waves_per_simd, f"accepted ({why})" if why else "accepted"
            estimated = KernelNumbers(est.vgprs, est.spills, est.lds_bytes, est.waves_per_simd)
        self.product = product
        self.counters = DeviceBuffer(dev, 4 * product.counter_words)
        self.counters.upload(np.zeros(product.counter_words, np.uint32))  # each dispatch leaves 0s
        required = size if dev.info.size_control else None
        full = dev.info.full_subgroups and required is not None
        bound = self._bound(product.buffers)
        if product.stamps:  # the optional binding after the product's buffers
            self.stamps = DeviceBuffer(dev, 4 * pc.STAMP_WORDS * product.items)
            bound.append(self.stamps)
        judged = target is not None and size in target.wave_sizes and dev.statistics
        self.pipeline = Pipeline(dev, spv, len(bound), [], required, full, bool(judged))
        self.pipeline.bind({i: (b.handle, b.size) for i, b in enumerate(bound)})
        if judged:
            assert target is not None
            stats = pipeline_statistics(dev, self.pipeline)
            waves, note = confirm_product(
                target, size, stats, product.workgroup_size, estimated, waves
            )
            self.verdict += note
        override = workgroups if workgroups is not None else workgroups_override()
        if schedule == "static" and override is None and waves is None:
            # a static schedule deadlocks on a grid the device cannot hold at once
            raise Refused(
                f"{SCHEDULE_SWITCH}=static needs a grid the device holds at once: no estimate "
                f"here; set {WORKGROUPS_SWITCH}"
            )
        self.workgroups, self.grid_why = grid_workgroups(
            product, target, waves, size, compute_units(dev), override
        )
        self.subgroup_size = size
        self.paths = tuple((c.region, "persistent") for c in self.calls)

    def _bound(self, names: Sequence[str]) -> list[DeviceBuffer]:
        out = []
        for name in names:
            if name == pc.COUNTERS:
                assert self.counters is not None
                out.append(self.counters)
            elif name.endswith(f"#{PARAMS_BUFFER}"):
                out.append(self.runners[int(name.split("#")[0])].buffer(PARAMS_BUFFER))
            else:
                out.append(self.buffers.buffers[name])
        return out

    def set_pos(self, **params: int) -> None:
        set_runtime_params(self.runners, params)

    def record_into(
        self, cmd: Any, after: Callable[[int, str], None] | None = None
    ) -> tuple[int, int]:
        """One dispatch; returns (dispatches, barriers)."""
        vk, p = self.dev.vk, self.pipeline
        assert p is not None
        vk.vkCmdBindPipeline(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, p.pipeline)
        vk.vkCmdBindDescriptorSets(
            cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, p.layout, 0, 1, [p.sets[0]], 0, None
        )
        vk.vkCmdDispatch(cmd, self.workgroups, 1, 1)
        if after is not None:
            after(0, "persistent")
        return 1, 0

    def record(self) -> tuple[Any, Any]:
        from .dispatch import begin_commands
        from .step import StepReport

        cmd = begin_commands(self.dev)
        d, b = self.record_into(cmd)
        self.dev.vk.vkEndCommandBuffer(cmd)
        self._cmds.append(cmd)
        return cmd, StepReport(self.paths, d, b)

    def poison(self, keep: Iterable[str]) -> None:
        """NaN in every step buffer but `keep` (the product has no intermediates of its own:
        its items keep them in registers and shared memory)."""
        kept = set(keep)
        for name, d in self.buffers.decls.items():
            if name not in kept:
                self.buffers.upload({name: poison_array(d.dtype, d.shape)})

    def close(self) -> None:
        vk = self.dev.vk
        for cmd in [] if self.dev.closed else self._cmds:
            vk.vkFreeCommandBuffers(self.dev.device, self.dev.command_pool, 1, [cmd])
        self._cmds = []
        if self.pipeline is not None:
            self.pipeline.destroy()
            self.pipeline = None
        if self.counters is not None:
            self.counters.destroy()
            self.counters = None
        if self.stamps is not None:
            self.stamps.destroy()
            self.stamps = None
        for runner in self.runners:
            runner.close()
        self.runners = []


def persistent_or_chain(
    dev: Device,
    build: Build,
    calls: Sequence[Call],
    buffers: StepBuffers,
    program: Program,
    product: str | None = None,
) -> tuple[Step | PersistentStep, ProductReport]:
    """The step as the persistent product where the switch asks for it and it may run here,
    else the multi-dispatch chain (fused regions); which ran and why."""
    if persistent_product(product) == "off":
        step: Step | PersistentStep = Step(dev, build, calls, buffers, True)
        return step, ProductReport("multi-dispatch", f"{PERSISTENT_SWITCH}=off")
    try:
        ps = PersistentStep(dev, build, calls, buffers, program)
    except Refused as e:
        return Step(dev, build, calls, buffers, True), ProductReport(
            "multi-dispatch", f"persistent refused: {e}"
        )
    why = (
        f"one dispatch of {ps.product.items} items on {ps.workgroups} workgroups "
        f"({ps.grid_why}); gate {ps.verdict}; {ps.compiled}"
    )
    return ps, ProductReport("persistent", why)


def bench_persistent(
    dev: Device,
    build: Build,
    calls: Sequence[Call],
    buffers: StepBuffers,
    arrays: Mapping[str, np.ndarray],
    answers: layer.Answers,
    wdtype: str,
    fused: Step,
    pos: int,
    args: Any,
) -> dict[str, Any]:
    """`fusec bench --preset P --persistent`: the layer's persistent product checked against
    the numpy layer's right answers (`answers`), then timed alternately with the fused chain
    `fused` (time_steps); its report: the product that ran and why, µs, the chain's µs beside
    it, the grid."""
    from fusec.runtime import decode_layer as layer

    from .step import decode_tokens, errors_from, median, time_steps

    step, report = persistent_or_chain(dev, build, calls, buffers, source_program(), "on")
    timed = cast(Step, step)  # a PersistentStep records as a Step does

    def check(s: Step, run: Any, when: str) -> dict[str, float]:
        """`s`'s results against numpy; refused in one sentence off tolerance."""
        tol = layer.TOLERANCE[wdtype]
        errs = errors_from(s, buffers, arrays, answers, tol, run)
        if any(e > tol for e in errs.values()):
            product = "persistent product" if s is timed else "fused chain"
            raise RuntimeFailure(f"the {product} does not match the numpy layer {when} ({errs})")
        return errs

    try:
        errors = check(
            timed,
            lambda: decode_tokens(timed, [pos], lambda p: None, lambda p: None),
            "before timing; not timing it",
        )
        # what was timed is checked too (time_steps: each recording repeats the step at pos)
        t = time_steps(
            timed,
            fused,
            pos,
            args.reps,
            per_dispatch=args.per_dispatch,
            verify=lambda s, run: check(s, run, "in its timed recording; times discarded"),
        )
        out: dict[str, Any] = {
            "product": report.product,
            "why": report.why,
            "median_us": round(median(t.fused_us), 2),
            "fused_us": round(median(t.unfused_us), 2),
            "dispatches": t.fused.dispatches,
            "barriers": t.fused.barriers,
            "errors": {n: float(f"{e:.3g}") for n, e in errors.items()},
            "samples": len(t.fused_us),
        }
        if isinstance(step, PersistentStep):
            out["workgroups"] = step.workgroups
            out["items"] = {
                f"{s.name}#{i}": {"items": s.items, "workgroups": s.workgroups}
                for i, s in enumerate(step.product.stages)
            }
        if t.fused_profile:
            out["per_dispatch"] = [{"kernel": k, "us": round(v, 2)} for k, v in t.fused_profile]
        if args.per_dispatch:  # where time goes inside the product: per-stage stamps
            from .persistent_stamps import bench_stamps

            out["stamps"] = (
                bench_stamps(
                    dev, build, calls, buffers, arrays, answers, wdtype, pos, min(args.reps, 20)
                )
                if isinstance(step, PersistentStep)
                else {"available": False, "why": "stamps are not available: the chain ran"}
            )
        return out
    finally:
        step.close()
