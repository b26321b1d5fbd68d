"""The launch shape and the budget: `launch workgroup 256, subgroup >= 16, rows_per_subgroup 2`
and `budget waves >= 4, vgprs <= 128 on gfx1201`.

Input: a region's syntax and the target limits.  Output: an `ir.Launch` and `ir.BudgetRule`s.
Not checked here: whether a device offers the subgroup size (the runtime), or whether a kernel
meets its budget (codegen/budget.py).
"""

from __future__ import annotations

from . import ir
from . import syntax as S
from .check_state import CheckState, pow2

LAUNCH_KEYS = ("workgroup", "subgroup", "rows_per_subgroup")
# the highest `spills <=` a budget may allow: a bound on typos, not a target's limit
MAX_BUDGET_SPILLS = 4096


def check_launch(state: CheckState, r: S.Region) -> ir.Launch | None:
    """The launch shape: workgroup size, subgroup requirement and rows per subgroup, within the
    target limits; None when it is wrong."""
    items: dict[str, S.LaunchItem] = {}
    ok = True
    for it in r.launch:
        if it.key not in LAUNCH_KEYS:
            state.err(
                it.span,
                f"unknown launch parameter '{it.key}'",
                f"launch parameters: {', '.join(LAUNCH_KEYS)}",
            )
            ok = False
        elif it.key in items:
            state.err(
                it.span,
                f"launch parameter '{it.key}' is given twice",
                "give each launch parameter once; a schedule line sets another value per "
                "target or instance",
            )
            ok = False
        items[it.key] = it
    if "workgroup" not in items:
        state.err(
            r.name_span,
            f"region '{r.name}' has no launch workgroup size",
            "add a line such as: launch workgroup 256, subgroup any",
        )
        return None
    wg_item = items["workgroup"]
    wg = wg_item.values[0] if wg_item.kind == "int" else 0
    if wg_item.kind != "int" or not pow2(wg) or wg > state.limits.workgroup_size:
        state.err(
            wg_item.span,
            f"workgroup size must be a power of two from 1 to "
            f"{state.limits.workgroup_size}, not "
            f"{wg if wg_item.kind == 'int' else wg_item.kind}",
            "use 64, 128 or 256",
        )
        return None
    lim = state.limits
    sg_req = ir.SubgroupReq("any", ())
    if "subgroup" in items:
        it = items["subgroup"]
        kind = "choice" if it.kind == "int" else it.kind
        sizes = it.values
        for s in sizes:
            if not pow2(s) or s > lim.max_subgroup_size:
                state.err(
                    it.span,
                    f"subgroup size must be a power of two up to {lim.max_subgroup_size}, not {s}",
                    f"devices offer {lim.min_subgroup_size} to {lim.max_subgroup_size} lanes "
                    "per subgroup",
                )
                ok = False
            elif s > wg:
                state.err(
                    it.span,
                    f"subgroup size {s} is larger than the workgroup ({wg})",
                    f"raise the workgroup size to at least {s}",
                )
                ok = False
        if it.fallback is not None and it.fallback != "shared":
            state.err(
                it.span,
                f"unknown subgroup fallback '{it.fallback}'",
                "the only fallback is: subgroup >= N else shared",
            )
            ok = False
        sg_req = ir.SubgroupReq(kind, tuple(sizes), it.fallback)
    rows = 1
    if "rows_per_subgroup" in items:
        it = items["rows_per_subgroup"]
        rows = it.values[0] if it.kind == "int" else -1
        if it.kind != "int" or not 1 <= rows <= 16:
            shown = rows if it.kind == "int" else it.kind
            state.err(
                it.span,
                f"rows_per_subgroup must be from 1 to 16, not {shown}",
                "2 or 4 keep enough loads in flight",
            )
            ok = False
    return ir.Launch(wg, sg_req, rows) if ok else None


def check_budget(state: CheckState, r: S.Region) -> tuple[ir.BudgetRule, ...]:
    """The budget's rules, each with its limit in range and its target known."""
    rules: list[ir.BudgetRule] = []
    ops = {"waves": ">=", "vgprs": "<=", "spills": "<="}
    lim = state.limits
    ranges = {
        "waves": (1, lim.waves_per_simd),
        "vgprs": (1, lim.lane_registers),
        "spills": (0, MAX_BUDGET_SPILLS),
    }
    for it in r.budget:
        if it.key not in ops:
            state.err(
                it.span,
                f"unknown budget limit '{it.key}'",
                "budget limits: waves >= N, vgprs <= N, spills <= N",
            )
            continue
        if it.op != ops[it.key]:
            state.err(
                it.span,
                f"budget '{it.key}' takes '{ops[it.key]}', not '{it.op}'",
                f"write {it.key} {ops[it.key]} {it.value.value}",
            )
            continue
        lo, hi = ranges[it.key]
        if not it.value.is_int or not lo <= int(it.value.value) <= hi:
            state.err(
                it.value.span,
                f"impossible budget: {it.key} {it.op} {it.value.value}",
                f"{it.key} must be an integer from {lo} to {hi}",
            )
            continue
        if (
            it.target is not None
            and state.known_targets is not None
            and it.target not in state.known_targets
        ):
            state.err(
                it.target_span,
                f"unknown target '{it.target}'",
                "known targets: " + ", ".join(state.known_targets),
            )
            continue
        same = next((x for x in rules if (x.key, x.target) == (it.key, it.target)), None)
        if same is not None:
            # one would silently win over the other (codegen/budget.py reads them in order)
            on = f" on {it.target}" if it.target else ""
            state.err(
                it.span,
                f"budget '{it.key}'{on} is given twice ({it.key} {it.op} {same.limit} and "
                f"{it.value.value})",
                f"keep one {it.key} limit{on}; a limit for one target goes with 'on TARGET'",
            )
            continue
        rules.append(ir.BudgetRule(it.key, int(it.value.value), it.target, span=it.span))
    return tuple(rules)
