"""The budget gate at run time, in two steps.

Before a fused pipeline is created, its estimate (from the manifest, so no compiler is needed) is
judged against the budget on the gate's target, after the target's capabilities (`capability`).
The target is the device's own (an H200 is `sm90`, a RADV device its family) or one named per
call; a CPU device has no target and is not gated.  LDS depends on the constants of this run, so
occupancy is recomputed here with the same formula the estimator uses.

Right after the fused pipeline is created, where the device reports pipeline executable
statistics (RADV; NVIDIA's `Register Count`), the driver's numbers are judged against the same
budget (`confirm`): a kernel that really spills, or whose real occupancy is below the budget, is
refused although its estimate passed, and the record (`DriverCheck`) keeps both numbers so the
message says which estimate was wrong.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import attrs

from fusec.codegen import manifest as mf
from fusec.codegen import manifest_records as mr
from fusec.codegen.budget import Budget, budget_for, capability_refusal, judge
from fusec.codegen.targets import TARGETS, Target, occupancy

from .device import RuntimeFailure

NVIDIA_LOCAL_MEMORY_OFFSET = 2**36  # FACTS.md: NVIDIA reports `Local Memory Size` offset by 2^36


def default_wave(target: Target, workgroup_size: int, subgroup: mr.Subgroup | None = None) -> int:
    """The wave size a driver picks for a kernel (FACTS.md: RADV compute defaults to wave64
    unless the workgroup has at most 32 threads); when the kernel's subgroup requirement
    excludes it, the largest size it allows that the target can be asked for, as
    Device.subgroup_size_for picks on a device."""
    if target.vendor == "amd":
        wave = 32 if workgroup_size <= 32 else 64
    else:
        wave = target.wave_sizes[0]
    if subgroup is not None and target.size_control and not subgroup.allows(wave):
        usable = [w for w in target.wave_sizes if subgroup.allows(w)]
        if usable:
            return max(usable)
    return wave


def capability(region: mr.Region, consts: Mapping[str, int | float], target: Target) -> str | None:
    """Why `target` cannot run the region's fused product at these constants (None when it
    can): "navi21: gated_ffn_down_splitk: needs float atomic add on buffers, which RDNA2
    lacks"."""
    for k in region.fused:
        lacks = capability_refusal(target, k, mf.shared_bytes(k, consts))
        if lacks is not None:
            return f"{target.name}: {k.name}: {lacks}"
    return None


def check_target(name: str) -> Target:
    if name not in TARGETS:
        raise RuntimeFailure(f"unknown target '{name}'", "known targets: " + ", ".join(TARGETS))
    return TARGETS[name]


def refusal(
    region: mr.Region,
    consts: Mapping[str, int | float],
    target: Target,
    wave: int,
    min_waves: int | None = None,
) -> str | None:
    """Why the fused product is over budget on `target` (None when it is accepted)."""
    budget = budget_for(target.name, region.budget, min_waves)
    for k in region.fused:
        est = estimate_at(k, consts, target, wave)
        if est is None:
            raise RuntimeFailure(
                f"the build has no estimate of {k.name} for {target.name} wave{wave}",
                f"rebuild with --target {target.name}",
            )
        ok, why = judge(target.name, wave, est, budget)
        if not ok:
            return f"{k.name}: {why}"
    return None


def estimate_at(
    kernel: mr.Kernel, consts: Mapping[str, int | float], target: Target, wave: int
) -> mr.Estimate | None:
    """The manifest's estimate of `kernel` on (target, wave), with LDS and occupancy at these
    constants (None when the build has none)."""
    est = kernel.estimate(target.name, wave)
    if est is None:
        return None
    lds = mf.shared_bytes(kernel, consts)
    waves = occupancy(target, wave, est.vgprs - est.spills, lds, kernel.workgroup_size)
    return attrs.evolve(est, lds_bytes=lds, waves_per_simd=waves)


@attrs.frozen
class KernelNumbers:
    """Registers, spills, LDS and occupancy of one kernel, estimated or from the driver."""

    vgprs: int  # register demand per lane (ACO's `Pre-Sched VGPRs`; NVIDIA `Register Count`)
    spills: int  # registers spilled (ACO `Spilled VGPRs`; NVIDIA local memory in 4-byte words)
    lds_bytes: int
    waves_per_simd: int


def driver_numbers(
    target: Target, wave: int, stats: Mapping[str, float], workgroup_size: int
) -> tuple[KernelNumbers, int] | None:
    """The driver's statistics of one pipeline as numbers comparable with the estimate, and the
    VGPRs the driver allocated (None when it reported no register count).  Occupancy comes from
    the allocation and LDS through the estimator's formula: Mesa 25.0's own `Subgroups per
    SIMD` under-reports on RDNA4 and gfx1151 (FACTS.md)."""
    if target.vendor == "amd":
        if "VGPRs" not in stats:
            return None
        allocated = int(stats["VGPRs"])
        demand = int(stats.get("Pre-Sched VGPRs", allocated))
        spills = int(stats.get("Spilled VGPRs", 0))
        lds = int(stats.get("LDS size", 0))
    else:
        if "Register Count" not in stats:
            return None
        allocated = demand = int(stats["Register Count"])
        local = int(stats.get("Local Memory Size", NVIDIA_LOCAL_MEMORY_OFFSET))
        spills = max(0, local - NVIDIA_LOCAL_MEMORY_OFFSET) // 4
        lds = int(stats.get("Shared Memory Size", 0))
    waves = occupancy(target, wave, allocated, lds, workgroup_size)
    return KernelNumbers(demand, spills, lds, waves), allocated


@attrs.frozen
class DriverCheck:
    """The gate's confirmation of one fused kernel at pipeline creation: the driver's numbers
    next to the estimate the gate accepted, and why the driver's numbers break the budget
    (None when they do not)."""

    kernel: str
    target: str
    wave: int
    estimated: KernelNumbers | None  # None when the build has no estimate for (target, wave)
    driver: KernelNumbers
    allocated_vgprs: int  # ACO `VGPRs` (raised to keep occupancy), NVIDIA `Register Count`
    refusal: str | None

    def summary(self) -> str:
        """'regtile on gfx1201 wave64, estimate / driver: VGPRs 100 / 259, spills 0 / 5, ...'
        for a report line."""

        def pair(field: str) -> str:
            est = "?" if self.estimated is None else getattr(self.estimated, field)
            return f"{est} / {getattr(self.driver, field)}"

        return (
            f"{self.kernel} on {self.target} wave{self.wave}, estimate / driver: VGPRs "
            f"{pair('vgprs')}, spills {pair('spills')}, LDS {pair('lds_bytes')} B, "
            f"waves per SIMD {pair('waves_per_simd')}"
        )


def judge_driver(
    kernel: str,
    target: Target,
    wave: int,
    estimated: KernelNumbers | None,
    driver: KernelNumbers,
    allocated_vgprs: int,
    budget: Budget,
) -> str | None:
    """Why the driver's numbers break the budget, naming the estimate that was wrong:
    "gfx1201 wave64: regtile spills 5 VGPRs (estimated 0), demand 259 VGPRs (estimated 100)"."""
    where = f"{target.name} wave{wave}: {kernel}"

    def est(field: str) -> str:
        return "no estimate" if estimated is None else f"estimated {getattr(estimated, field)}"

    if driver.spills > budget.max_spills:
        return (
            f"{where} spills {driver.spills} VGPRs ({est('spills')}), demand {driver.vgprs} "
            f"VGPRs ({est('vgprs')}), budget {budget.max_spills}"
        )
    if driver.vgprs > budget.max_vgprs:
        return f"{where} needs {driver.vgprs} VGPRs ({est('vgprs')}) > budget {budget.max_vgprs}"
    if driver.waves_per_simd < budget.min_waves:
        return (
            f"{where} runs {driver.waves_per_simd} waves per SIMD ({est('waves_per_simd')}; "
            f"VGPRs {allocated_vgprs}, LDS {driver.lds_bytes} B) < budget {budget.min_waves}"
        )
    return None


def confirm(
    region: mr.Region,
    kernel: mr.Kernel,
    consts: Mapping[str, int | float],
    target: Target,
    wave: int,
    stats: Mapping[str, float],
    min_waves: int | None = None,
) -> DriverCheck | None:
    """Judge one created fused pipeline by its driver's statistics on `target` (the device's
    own) at subgroup size `wave`; None when the statistics hold no register count."""
    numbers = driver_numbers(target, wave, stats, kernel.workgroup_size)
    if numbers is None:
        return None
    driver, allocated = numbers
    est = estimate_at(kernel, consts, target, wave)
    estimated = (
        None
        if est is None
        else KernelNumbers(est.vgprs, est.spills, est.lds_bytes, est.waves_per_simd)
    )
    budget = budget_for(target.name, region.budget, min_waves)
    why = judge_driver(kernel.name, target, wave, estimated, driver, allocated, budget)
    return DriverCheck(kernel.name, target.name, wave, estimated, driver, allocated, why)


DISABLE_ALL = "FUSEC_DISABLE_FUSION"
DISABLE_SOME = "FUSEC_DISABLE"


def kill_switch(region: str, known: list[str], env: Mapping[str, str] | None = None) -> str | None:
    """Why the environment disables fusion for `region` (None when it does not).

    FUSEC_DISABLE_FUSION: `1` disables every fusion, `0` (or unset) none; FUSEC_DISABLE: a
    comma-separated list of region names.  Anything else is refused, so a typo never silently
    leaves a fusion on or off (FACTS.md: llama.cpp's switch is presence-only; `=0` disables)."""
    env = os.environ if env is None else env
    flag = env.get(DISABLE_ALL)
    if flag is not None and flag not in ("0", "1"):
        raise RuntimeFailure(
            f"{DISABLE_ALL} must be 0 or 1, not {flag!r}",
            f"{DISABLE_ALL}=1 disables every fusion; unset or 0 keeps them",
        )
    names = env.get(DISABLE_SOME)
    listed: list[str] = []
    if names is not None:
        listed = [n.strip() for n in names.split(",")]
        bad = [n for n in listed if n not in known]
        if bad or not names.strip():
            shown = ", ".join(repr(n) for n in bad) or "an empty list"
            raise RuntimeFailure(
                f"{DISABLE_SOME} names no region of this build: {shown}",
                "regions: " + ", ".join(known),
            )
    if flag == "1":
        return f"disabled by {DISABLE_ALL}=1"
    if region in listed:
        return f"disabled by {DISABLE_SOME}"
    return None
