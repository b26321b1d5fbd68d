"""The budget gate at run time: before a fused pipeline is created, its estimate (from the
manifest, so no compiler is needed) is judged against the budget on the gate's target.

The target is the device's own (an H200 is `sm90`, a RADV device its family) or one named per
call; a CPU device has no target and is not gated.  LDS depends on the constants of this run, so
occupancy is recomputed here with the same formula the estimator uses.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from codegen import manifest as mf
from codegen.budget import budget_for, judge
from codegen.targets import TARGETS, Target, occupancy

from .device import RuntimeFailure


def default_wave(target: Target, workgroup_size: int) -> int:
    """The wave size a driver picks when none is required (FACTS.md: RADV compute defaults to
    wave64 unless the workgroup has at most 32 threads)."""
    if target.vendor == "amd":
        return 32 if workgroup_size <= 32 else 64
    return target.wave_sizes[0]


def check_target(name: str) -> Target:
    if name not in TARGETS:
        raise RuntimeFailure(f"unknown target '{name}'", "known targets: " + ", ".join(TARGETS))
    return TARGETS[name]


def refusal(
    region: Mapping[str, Any],
    consts: Mapping[str, int | float],
    target: Target,
    wave: int,
    min_waves: int | None = None,
) -> str | None:
    """Why the fused product is over budget on `target` (None when it is accepted)."""
    budget = budget_for(target.name, region.get("budget", []), min_waves)
    for k in region["fused"]:
        est = next(
            (e for e in k.get("estimates", []) if e["target"] == target.name and e["wave"] == wave),
            None,
        )
        if est is None:
            raise RuntimeFailure(
                f"the build has no estimate of {k['name']} for {target.name} wave{wave}",
                f"rebuild with --target {target.name}",
            )
        lds = mf.shared_bytes(k, consts)
        est = {
            **est,
            "lds_bytes": lds,
            "waves_per_simd": occupancy(
                target, wave, est["vgprs"] - est["spills"], lds, k["workgroup_size"]
            ),
        }
        ok, why = judge(target.name, wave, est, budget)
        if not ok:
            return f"{k['name']}: {why}"
    return None


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
