"""The budget gate's verdict: pure data in, (accepted, reason) out.

Used at build time (manifest verdicts, `fusec occupancy`) and by the runtime before it creates a
fused pipeline, so it imports nothing but `targets`.  Default budget per target: no spilled
registers and at least `Target.min_waves_default` waves per SIMD; a region overrides it with
`budget waves >= N [on T]`, `budget vgprs <= N [on T]`, `budget spills <= N [on T]`, and a call
overrides both (`fusec check --min-waves N`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from .targets import TARGETS


@attrs.frozen
class Budget:
    min_waves: int
    max_vgprs: int
    max_spills: int


def budget_for(
    target: str, rules: Sequence[Mapping[str, Any]], min_waves_override: int | None = None
) -> Budget:
    """The budget that applies on `target`: defaults, then the region's rules (a rule naming the
    target beats one for every target), then the caller's override."""
    t = TARGETS[target]
    values = {"waves": t.min_waves_default, "vgprs": t.max_vgprs, "spills": 0}
    for specific in (False, True):
        for r in rules:
            if (r["target"] == target) == specific and r["target"] in (None, target):
                values[r["key"]] = int(r["limit"])
    if min_waves_override is not None:
        values["waves"] = min_waves_override
    return Budget(values["waves"], values["vgprs"], values["spills"])


def judge(target: str, wave: int, est: Mapping[str, Any], budget: Budget) -> tuple[bool, str]:
    """Accept or refuse one kernel's estimate; the reason names target, estimate and budget."""
    where = f"{target} wave{wave}"
    if est["spills"] > budget.max_spills:
        return False, (
            f"{where}: {est['spills']} VGPRs would spill (demand {est['vgprs']}), "
            f"budget {budget.max_spills}"
        )
    if est["vgprs"] > budget.max_vgprs:
        return False, f"{where}: {est['vgprs']} VGPRs > budget {budget.max_vgprs}"
    if est["waves_per_simd"] < budget.min_waves:
        return False, (
            f"{where}: {est['waves_per_simd']} waves per SIMD (VGPRs {est['vgprs']}, "
            f"LDS {est['lds_bytes']} B) < budget {budget.min_waves}"
        )
    return True, "within budget"
