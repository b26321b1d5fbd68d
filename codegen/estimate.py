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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from dsl import ir

from . import kir
from .liveness import Demand, demand
from .targets import Target, occupancy, spill_limit


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
) -> list[Estimate]:
    """The estimate on each (target, wave) of a kernel and the SPIR-V it compiled to: register
    demand and LDS are the kernel's own, measured once; spill limits, granules and occupancy
    are the target's."""
    values = {c.name: c.default for c in kernel.region.consts}
    values.update(consts or {})
    measured = spv if isinstance(spv, Demand) else demand(spv)
    need = measured.vgprs + measured.private_words
    uncertain = (
        f"a private array of {measured.private_words} words indexed by a variable: in registers "
        "(counted) or in scratch memory, as the driver chooses"
        if measured.private_words
        else ""
    )
    sgprs = estimate_sgprs(kernel)
    raw_lds = lds_bytes(kernel, values)
    out = []
    for target, wave in where:
        limit = spill_limit(target, wave, kernel.workgroup_size)
        lds = -(-raw_lds // target.lds_granule) * target.lds_granule
        spills = max(0, need - limit)
        waves = occupancy(target, wave, min(need, limit), lds, kernel.workgroup_size)
        out.append(Estimate(target.name, wave, need, sgprs, lds, spills, waves, uncertain))
    return out
