"""The budget gate's verdict: pure data in, (accepted, reason) out.

First the capabilities (`capability_refusal`): a fused kernel that needs a feature, a subgroup
size, shared memory or a workgroup its target's driver does not offer is refused whatever its
registers.  Then the budget (`judge`).

Used at build time (manifest verdicts, `fusec occupancy`) and by the runtime before it creates a
fused pipeline, so it imports nothing but `targets`.  Default budget per target: no spilled
registers and at least `Target.min_waves_default` waves per SIMD; a region overrides it with
`budget waves >= N [on T]`, `budget vgprs <= N [on T]`, `budget spills <= N [on T]`, and a call
overrides both (`fusec check --min-waves N`).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from . import manifest_records as mr
from .targets import FEATURES, TARGETS, Target


@attrs.frozen
class Budget:
    min_waves: int
    max_vgprs: int
    max_spills: int


def budget_for(
    target: str, rules: Sequence[mr.BudgetRule], min_waves_override: int | None = None
) -> Budget:
    """The budget that applies on `target`: defaults, then the region's rules (a rule naming the
    target beats one for every target), then the caller's override."""
    t = TARGETS[target]
    values = {"waves": t.min_waves_default, "vgprs": t.max_vgprs, "spills": 0}
    for specific in (False, True):
        for r in rules:
            if (r.target == target) == specific and r.target in (None, target):
                values[r.key] = r.limit
    if min_waves_override is not None:
        values["waves"] = min_waves_override
    return Budget(values["waves"], values["vgprs"], values["spills"])


def judge(target: str, wave: int, est: mr.Estimate, budget: Budget) -> tuple[bool, str]:
    """Accept or refuse one kernel's estimate; the reason names target, estimate and budget."""
    where = f"{target} wave{wave}"
    if est.spills > budget.max_spills:
        return False, (
            f"{where}: {est.spills} VGPRs would spill (demand {est.vgprs}), "
            f"budget {budget.max_spills}"
        )
    if est.vgprs > budget.max_vgprs:
        return False, f"{where}: {est.vgprs} VGPRs > budget {budget.max_vgprs}"
    if est.waves_per_simd < budget.min_waves:
        return False, (
            f"{where}: {est.waves_per_simd} waves per SIMD (VGPRs {est.vgprs}, "
            f"LDS {est.lds_bytes} B) < budget {budget.min_waves}"
        )
    return True, "within budget"


def capability_refusal(
    t: Target, kernel: mr.Kernel, lds_bytes: int, wave: int | None = None
) -> str | None:
    """Why `t` cannot run this manifest kernel at all, or at subgroup size `wave` (None when it
    can): a feature it lacks, no allowed subgroup size, a workgroup smaller than the subgroup,
    too much shared memory, too large a workgroup.  The words name the capability and the
    target's family, e.g. "needs float atomic add on buffers, which RDNA2 lacks"."""
    family = t.arch or t.name
    for feature in kernel.features:
        if feature not in t.features:
            return f"needs {FEATURES.get(feature, feature)}, which {family} lacks"
    sub = kernel.subgroup
    usable = [w for w in t.wave_sizes if sub.allows(w)]
    if not usable:
        shown = "/".join(map(str, t.wave_sizes))
        return f"needs subgroup size {sub.wanted()}, which {family} lacks ({shown})"
    if wave is not None and wave not in usable:
        return f"needs subgroup size {sub.wanted()}, not {wave}"
    least = wave if wave is not None else min(usable)
    if kernel.workgroup_size < least:
        # the generated loops stride by the subgroup size: the lanes a workgroup lacks would
        # leave elements unread (the runtime's device check refuses the same, dispatch.py)
        return (
            f"its workgroup of {kernel.workgroup_size} is smaller than a subgroup of {least}, "
            f"the least {family} runs it with"
        )
    if lds_bytes > t.max_shared_bytes:
        return (
            f"needs {lds_bytes} bytes of shared memory per workgroup, "
            f"{family} allows {t.max_shared_bytes}"
        )
    if kernel.workgroup_size > t.max_workgroup_size:
        return (
            f"needs a workgroup of {kernel.workgroup_size}, {family} allows {t.max_workgroup_size}"
        )
    return None
