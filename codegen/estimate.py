"""Kernel -> resource estimate per target and wave size: register demand per lane, uniform
(SGPR-like) values, LDS bytes, predicted spills, waves per SIMD.

The register demand is measured on the SPIR-V the kernel compiled to (codegen/liveness.py): a
divergence and liveness analysis that applies the moves a GPU compiler makes before it
allocates registers, each rule cited there.  Nothing in it is fitted to kernels.fuse; it is held
against ACO's `Pre-Sched VGPRs` (RADV's null device) on kernels.fuse and on generated regions
(tests/codegen/test_estimate.py, tests/estimator/, docs/ESTIMATOR.md).

A private array the program still indexes by a variable after optimization may live in registers
or in scratch memory; which one is the driver's choice.  Such a kernel is judged as if every word
were a register (the conservative reading: more registers, fewer waves) and says so in
`uncertain`.  LDS comes from the kernel IR at the run's constants; occupancy and the spill limit
are the target's (codegen/targets.py).

Occupancy as ACO sets it (Mesa 25.0, the version held against): the waves the registers and LDS
allow, rounded down to whole workgroups per WGP (`whole_workgroup_waves`).  ACO's scheduler then
aims at an occupancy of its own (`scheduler_aim`) and moves loads up while the demand stays
within that aim's registers; how far it can raise the demand is the second number the liveness
analysis measures (`Demand.loads_up`, the peak with every load moved up).  The waves are those of
the demand raised toward it and capped at the aim's bound (`estimate_waves`); the estimate
carries both numbers (docs/ESTIMATOR.md has the figures against ACO).  On a target without a
mixed-signedness dot product (`Target.mixed_dot`, RDNA2) the demand is the one measured with
such products' signed operands unpacked (`Demand.unpacked_dot`, liveness.py rule 13).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from fusec.dsl import ir

from . import kir
from .liveness import Demand, demand
from .nvidia import NvidiaFeatures, analyze_nvidia, estimate_nvidia_registers
from .targets import Target, occupancy, spill_limit, waves_per_workgroup

# RDNA: a workgroup's waves all run on the SIMDs of one WGP (compute runs in WGP mode), 2 CUs of
# 2 SIMDs; at most 32 workgroups of more than one wave per WGP (Mesa 25.0 ACO, `aco_ir.cpp`
# `max_suitable_waves`).
_SIMDS_PER_WGP = 4
_MAX_WORKGROUPS_PER_WGP = 32


def whole_workgroup_waves(t: Target, wave: int, waves: int, workgroup_size: int) -> int:
    """Waves per SIMD once the SIMDs of a WGP hold whole workgroups: ACO rounds the wave count
    its registers allow down to what a whole number of workgroups fills, spread over the four
    SIMDs (Mesa 25.0 ACO `max_suitable_waves`, applied by `update_vgpr_sgpr_demand` before the
    register allocator, which then may use every register of the lower count).  A 512-lane
    workgroup in wave32 is 16 waves, 4 per SIMD: 10 waves' worth of registers hold 2 such
    workgroups, 8 waves."""
    if t.vendor != "amd":
        return waves
    per_wg = waves_per_workgroup(workgroup_size, wave)
    groups = waves * _SIMDS_PER_WGP // per_wg
    if per_wg > 1:
        groups = min(groups, _MAX_WORKGROUPS_PER_WGP)
    least = -(-per_wg // _SIMDS_PER_WGP)  # one workgroup
    return max(least, -(-groups * per_wg // _SIMDS_PER_WGP))


def scheduler_aim(t: Target, wave: int, vgprs: int, waves: int, workgroup_size: int) -> int:
    """The occupancy ACO's scheduler aims at for a kernel of `vgprs` demand that `waves` waves
    fit (Mesa 25.0 `aco_scheduler.cpp` `schedule_program`): with `f = P / 256` (6 on RDNA3/4
    in wave32, 3 in wave64; 4 and 2 on RDNA2), `waves` itself when at most `5 f`, else `5 f`,
    `6 f` or `7 f` for demands of 29 or more, 25 to 28, and less; at least one workgroup, at
    most `waves`, whole workgroups (`whole_workgroup_waves`), then rounded down to a multiple
    of `f` (at least `f`): the scheduler counts waves as GCN did.  It then moves loads up as
    long as the demand stays within that occupancy's registers less 2."""
    factor = t.vgpr_file[wave] // 256
    if waves <= 5 * factor:
        aim = waves
    elif vgprs >= 29:
        aim = 5 * factor
    elif vgprs >= 25:
        aim = 6 * factor
    else:
        aim = 7 * factor
    aim = min(max(aim, -(-waves_per_workgroup(workgroup_size, wave) // _SIMDS_PER_WGP)), waves)
    aim = whole_workgroup_waves(t, wave, aim, workgroup_size)
    return max(aim // factor, 1) * factor


def scheduled_fewest_waves(
    t: Target, wave: int, vgprs: int, waves: int, workgroup_size: int, lds_bytes: int
) -> int:
    """The fewest waves a kernel of `vgprs` demand (`waves` before scheduling) may end at
    after ACO's scheduler: the occupancy of its aim's register bound (`scheduler_aim`), which
    it reaches when the code has loads enough to move up.  Checked with a probe of 32
    independent vec4 loads per loop iteration and 0-150 values held across the loop, on gfx1201
    and navi21, wave32 and wave64: the driver's registers are this bound's every time (e.g.
    120 VGPRs, 12 waves, in wave32 on gfx1201 for any demand up to 118).  On the corpus ACO's
    waves lie between this and `waves` for 99.4-99.9% of kernels (docs/ESTIMATOR.md)."""
    if t.vendor != "amd":
        return waves
    aim = scheduler_aim(t, wave, vgprs, waves, workgroup_size)
    bound = min(registers_for_waves(t, wave, aim) - 2, spill_limit(t, wave, workgroup_size))
    if vgprs >= bound:
        return waves
    fewest = occupancy(t, wave, bound, lds_bytes, workgroup_size)
    whole = whole_workgroup_waves(t, wave, fewest, workgroup_size)
    if whole < fewest:
        regs = registers_for_waves(t, wave, whole)
        fewest = occupancy(t, wave, regs, lds_bytes, workgroup_size)
    return min(fewest, waves)


def registers_for_waves(t: Target, wave: int, waves: int) -> int:
    """The most VGPRs a lane may have at `waves` waves per SIMD (ACO
    `get_addr_regs_from_waves`): the register allocator's bound at that occupancy."""
    g = t.vgpr_granule[wave]
    return min(t.max_vgprs, t.vgpr_file[wave] // max(waves, 1) // g * g)


@attrs.frozen
class Estimate:
    target: str
    wave: int
    vgprs: int  # estimated demand per lane
    sgprs: int
    lds_bytes: int
    spills: int
    waves_per_simd: int
    uncertain: str = ""  # why the estimate may be wrong, when it may
    # the demand ACO's scheduler may raise it to (codegen/liveness_moves.py `_move_loads_up`)
    loads_up: int = 0

    def as_dict(self) -> dict[str, int | str]:
        out = attrs.asdict(self)
        if not self.uncertain:
            del out["uncertain"]
        return out


def estimate_sgprs(kernel: kir.Kernel) -> int:
    """Uniform values: 2 per buffer address, workgroup id and sizes, spec constants, loop bounds."""
    return 2 * len(kernel.bindings) + 4 + len(kernel.region.consts) + len(kernel.phases)


def lds_bytes(kernel: kir.Kernel, consts: Mapping[str, int | float]) -> int:
    total = sum(4 * ir.evaluate_int(a.words, dict(consts)) for a in kernel.shared)
    if kernel.reduction_scratch:
        total += 4 * kernel.workgroup_size
    if kernel.exchange_scratch:
        total += 4 * kernel.workgroup_size
    if kernel.counters:
        total += 4  # s_last: whether this workgroup arrived last (kir.Arrive)
    return total


def estimate(
    kernel: kir.Kernel,
    spv: bytes | Demand,
    target: Target,
    wave: int,
    consts: Mapping[str, int | float] | None = None,
) -> Estimate:
    return estimates(kernel, spv, [(target, wave)], consts)[0]


def estimates(
    kernel: kir.Kernel,
    spv: bytes | Demand,
    where: Sequence[tuple[Target, int]],
    consts: Mapping[str, int | float] | None = None,
    *,
    nvidia: NvidiaFeatures | None = None,
) -> list[Estimate]:
    """The estimate on each (target, wave) of a kernel and the SPIR-V it compiled to: register
    demand and LDS are the kernel's own, measured once; spill limits, granules and occupancy
    are the target's.  On an NVIDIA target the registers are those its driver picks, predicted
    from the SPIR-V's features (`nvidia`, measured on `spv` when it is the bytes;
    codegen/nvidia.py); with neither, the demand."""
    values = {c.name: c.default for c in kernel.region.consts}
    values.update(consts or {})
    measured = spv if isinstance(spv, Demand) else demand(spv)
    uncertain = (
        f"a private array of {measured.private_words} words indexed by a variable: in registers "
        "(counted) or in scratch memory, as the driver chooses"
        if measured.private_words
        else ""
    )
    sgprs = estimate_sgprs(kernel)
    raw_lds = lds_bytes(kernel, values)
    if nvidia is None and isinstance(spv, bytes) and any(t.vendor == "nvidia" for t, _ in where):
        nvidia = analyze_nvidia(spv)
    out = []
    for target, wave in where:
        # without a mixed-signedness dot product, its signed operand is unpacked (liveness.py)
        unpacked = 0 if target.mixed_dot else measured.unpacked_dot - measured.vgprs
        need = measured.vgprs + measured.private_words + unpacked
        if target.vendor == "nvidia" and nvidia is not None:
            need = estimate_nvidia_registers(nvidia) + measured.private_words
        limit = spill_limit(target, wave, kernel.workgroup_size)
        lds = -(-raw_lds // target.lds_granule) * target.lds_granule
        spills = max(0, need - limit)
        reach = measured.loads_up + measured.private_words + unpacked
        waves = estimate_waves(target, wave, need, reach, lds, kernel.workgroup_size)
        out.append(Estimate(target.name, wave, need, sgprs, lds, spills, waves, uncertain, reach))
    return out


def _waves_at(t: Target, wave: int, vgprs: int, lds_bytes: int, workgroup_size: int) -> int:
    """Waves per SIMD of a kernel of `vgprs` registers, rounded down to whole workgroups; the
    allocator may then use the registers of the lower count, which is the occupancy the
    driver's register count gives."""
    waves = occupancy(t, wave, vgprs, lds_bytes, workgroup_size)
    whole = whole_workgroup_waves(t, wave, waves, workgroup_size)
    if whole < waves:
        regs = registers_for_waves(t, wave, whole)
        waves = occupancy(t, wave, regs, lds_bytes, workgroup_size)
    return waves


def estimate_waves(
    t: Target, wave: int, vgprs: int, loads_up: int, lds_bytes: int, workgroup_size: int
) -> int:
    """Waves per SIMD after ACO's scheduler: the demand's waves (`_waves_at`), unless the
    scheduler's aim (`scheduler_aim`) leaves it registers to move loads up, in which case it
    raises the demand toward `loads_up` (the peak with every load moved up,
    codegen/liveness_moves.py `_move_loads_up`) and stops at the aim's bound."""
    limit = spill_limit(t, wave, workgroup_size)
    vgprs = min(vgprs, limit)
    waves = _waves_at(t, wave, vgprs, lds_bytes, workgroup_size)
    if t.vendor != "amd":
        return waves
    aim = scheduler_aim(t, wave, vgprs, waves, workgroup_size)
    bound = min(registers_for_waves(t, wave, aim) - 2, limit)
    if vgprs >= bound:
        return waves
    scheduled = min(max(vgprs, loads_up), bound)
    return min(waves, _waves_at(t, wave, scheduled, lds_bytes, workgroup_size))
