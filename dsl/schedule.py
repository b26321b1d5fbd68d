"""Schedule lines applied to one instance of a region: `syntax.Region` -> `syntax.Region`.

Input: a region as written (dtype parameters, schedule lines) and one choice of its dtypes and
target.  `bind_dtypes` gives the instance with its dtypes bound; stage groups expand in it
(compose.py, run by check.py in between); `apply_schedule` then applies the schedule lines that
hold for it (the region's, or an `instance` line's own block), so a line may name a group's
inner stage by its name after expansion.  The line that decides a setting is the most specific
of those that hold: one with `on` beats one without, then one with `when` beats one without; the
region's `launch` line and stage layouts come last.  Two lines of the same precedence that hold
for an instance and set one thing differently are a diagnostic.  `int8 dot` is checked here (it
is a requirement on the instance, not a setting).

Checked here: a stage a decided line names that the expanded instance lacks.  Not checked here:
the lines' other names (instances.py checks them once per region) and everything the checker
checks on the instance.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence

import attrs

from . import syntax as S
from .diagnostics import Diagnostic
from .packing import Packing, can_pack
from .types import BUFFER_DTYPES

# the suffix of a staged input's stage (`x in shared as q8_0` stages `xq`)
STAGED_SUFFIX = "q"


def holds(line: S.Schedule, bindings: Sequence[tuple[str, str]]) -> bool:
    """Whether `line`'s `when` holds for `bindings` (ignoring its target)."""
    if line.when is None:
        return True
    bound = dict(bindings)
    return bound.get(line.when[0].id) in {d.id for d in line.when[1]}


def _rank(line: S.Schedule) -> int:
    """The precedence of a line: `on` beats `when`, which beats an unqualified line."""
    return 2 * (line.target is not None) + (line.when is not None)


def _settings(line: S.Schedule) -> Iterator[tuple[tuple[str, ...], object, str]]:
    """What a line sets: (key, value, what the key is, for a conflict's message)."""
    body = line.body
    match body:
        case S.ScheduleLaunch(items):
            for it in items:
                yield ("launch", it.key), (it.kind, it.values, it.fallback), f"launch {it.key}"
        case S.ScheduleLayout(stages, items):
            for s in stages:
                for lay in items:
                    yield (
                        ("layout", s.id, lay.index),
                        (lay.unit, lay.vector),
                        f"the layout of '{lay.index}' in stage '{s.id}'",
                    )
        case S.ScheduleStore(name, placement, stored):
            yield (
                ("store", name.id),
                (placement.id if placement else None, stored.id),
                f"how '{name.id}' is stored",
            )
        case S.ScheduleConst(consts):
            for c in consts:
                rng = (c.range[0].value, c.range[1].value) if c.range else None
                yield ("const", c.name), (c.value.value, rng), f"constant '{c.name}'"
        case S.ScheduleIntDot():
            yield ("int8",), True, "int8 dot"
        case S.SchedulePack(weights, packing):
            for w in weights:
                yield ("pack", w.id), packing.id, f"the packing of '{w.id}'"


def _decide(
    lines: tuple[S.Schedule, ...],
    bindings: Sequence[tuple[str, str]],
    target: str | None,
    note: str | None,
    diags: list[Diagnostic],
) -> dict[tuple[str, ...], S.Schedule]:
    """The line that decides each key for an instance and target."""
    chosen: dict[tuple[str, ...], tuple[int, S.Schedule, object]] = {}
    for line in lines:
        if line.target is not None and line.target.id != target:
            continue
        if not holds(line, bindings):
            continue
        rank = _rank(line)
        for key, value, what in _settings(line):
            old = chosen.get(key)
            if old is None or rank > old[0]:
                chosen[key] = (rank, line, value)
            elif rank == old[0] and value != old[2]:
                diags.append(
                    Diagnostic(
                        line.span,
                        f"schedule line sets {what} differently from line "
                        f"{old[1].span.line_col()[0]}, with the same precedence",
                        "make them agree, or qualify one with 'when' or 'on' (the more "
                        "specific line wins)",
                        note,
                    )
                )
    return {k: line for k, (_, line, _) in chosen.items()}


def bind_dtypes(
    r: S.Region, name: str, bindings: tuple[tuple[str, str], ...], inst: S.Instance | None
) -> S.Region:
    """One instance before its schedule: named, its dtypes bound, no dtype parameters and no
    schedule lines (stage groups expand in it next, then `apply_schedule` runs)."""
    bound = dict(bindings)

    def dtype(t: S.TypeRef) -> S.TypeRef:
        return attrs.evolve(t, dtype=bound[t.dtype]) if t.dtype in bound else t

    return attrs.evolve(
        r,
        name=name,
        params=tuple(attrs.evolve(p, type=dtype(p.type)) for p in r.params),
        outputs=tuple(attrs.evolve(p, type=dtype(p.type)) for p in r.outputs),
        dtype_params=(),
        schedules=(),
        instance=inst,
    )


def apply_schedule(
    generic: S.Region,
    r: S.Region,
    lines: tuple[S.Schedule, ...],
    bindings: tuple[tuple[str, str], ...],
    target: str | None,
    extra_consts: tuple[S.Const, ...],
    diags: list[Diagnostic],
) -> S.Region | None:
    """The schedule `lines` applied to `r`, an instance of `generic` with its dtypes bound and
    its stage groups expanded (so a line may name a group's inner stage by the name it took
    there); None when a line conflicts or names a stage the instance lacks."""
    inst = r.instance
    note = f"in instance {inst.display}" if inst is not None else None
    n_before = len(diags)
    decided = _decide(lines, bindings, target, note, diags)
    names = {s.name for s in flat_stages(r)} | {p.name for p in r.params}
    for key, line in decided.items():
        if key[0] in ("layout", "store") and key[1] not in names:
            body = line.body
            named = body.stages if isinstance(body, S.ScheduleLayout) else ()
            if isinstance(body, S.ScheduleStore):
                named = (body.name,)
            span = next((n.span for n in named if n.id == key[1]), line.span)
            diags.append(
                Diagnostic(
                    span,
                    f"schedule line names unknown stage '{key[1]}' (its stage groups expanded)",
                    f"stages of {r.name}: "
                    + ", ".join(sorted({s.name for s in flat_stages(r)}))
                    + " (a group's stage renamed for a clash is GROUP_name)",
                    note,
                )
            )
    if len(diags) > n_before:
        return None
    params = r.params
    launch = list(r.launch)
    consts = list(r.consts)
    stages: list[S.Stage | S.Repeat] = list(r.stages)
    staged: list[S.Stage] = []
    for key, line in decided.items():
        body = line.body
        if key[0] == "launch" and isinstance(body, S.ScheduleLaunch):
            item = next(it for it in body.items if it.key == key[1])
            launch = [it for it in launch if it.key != key[1]] + [item]
        elif key[0] == "layout" and isinstance(body, S.ScheduleLayout):
            lay = next(it for it in body.items if it.index == key[2])
            stages = [
                _each(s, functools.partial(_with_layout, stage=key[1], item=lay)) for s in stages
            ]
        elif key[0] == "store" and isinstance(body, S.ScheduleStore):
            if any(p.name == key[1] for p in r.params):
                staged.append(_staging_stage(r, body))
            else:
                stages = [_each(s, functools.partial(_with_store, body=body)) for s in stages]
        elif key[0] == "const" and isinstance(body, S.ScheduleConst):
            new = next(c for c in body.consts if c.name == key[1])
            consts = [_with_const(c, new) for c in consts]
        elif key[0] == "pack" and isinstance(body, S.SchedulePack):
            params = _with_packing(params, key[1], body, note, diags)
    for new in extra_consts:
        consts = [_with_const(c, new) for c in consts]
    # stage the inputs first; every stage then reads the staged copy
    for st in staged:
        source = st.name[: -len(STAGED_SUFFIX)]
        stages = [_each(s, functools.partial(_renamed, old=source, new=st.name)) for s in stages]
    stages = [*staged, *stages]
    consts = _block_bounds(consts, params)
    # keep the launch items in the order they were written
    order = {it.key: i for i, it in enumerate(r.launch)}
    launch.sort(key=lambda it: order.get(it.key, len(order)))
    region = attrs.evolve(
        r, params=params, consts=tuple(consts), launch=tuple(launch), stages=tuple(stages)
    )
    int_dot = decided.get(("int8",))
    if int_dot is not None:
        _check_int_dot(generic, region, int_dot, note, diags)
    return region


def _with_packing(
    params: tuple[S.Param, ...],
    name: str,
    body: S.SchedulePack,
    note: str | None,
    diags: list[Diagnostic],
) -> tuple[S.Param, ...]:
    """`W packed split`: the input `name` marked with its packing, when its dtype (bound for
    this instance) is a GGUF block dtype; else a diagnostic.  An unknown packing or input was
    reported once for the region (instances.py)."""
    param = next((p for p in params if p.name == name), None)
    if param is None or body.packing.id not in {p.value for p in Packing}:
        return params
    dt = BUFFER_DTYPES.get(param.type.dtype)
    if dt is None or not can_pack(dt):
        weight = next(w for w in body.weights if w.id == name)
        diags.append(
            Diagnostic(
                weight.span,
                f"'{name}' is {param.type.dtype}, and only GGUF block weights (q8_0, q4_0, "
                "q4_K, q6_K) can be packed",
                "name only GGUF weights, and limit the line to their quantized dtypes: "
                f"schedule when Wt = q4_0: W packed {body.packing.id}",
                note,
            )
        )
        return params
    return tuple(attrs.evolve(p, packing=body.packing) if p is param else p for p in params)


def flat_stages(r: S.Region) -> Iterator[S.Stage]:
    for s in r.stages:
        if isinstance(s, S.Repeat):
            yield from s.stages
        else:
            yield s


def _each(s: S.Stage | S.Repeat, f: Callable[[S.Stage], S.Stage]) -> S.Stage | S.Repeat:
    """`f` of a stage, or of each stage of a repeat block."""
    if isinstance(s, S.Repeat):
        return attrs.evolve(s, stages=tuple(f(x) for x in s.stages))
    return f(s)


def _with_layout(s: S.Stage, stage: str, item: S.LayoutItem) -> S.Stage:
    if s.name != stage:
        return s
    layout = [it if it.index != item.index else item for it in s.layout]
    if not any(it.index == item.index for it in s.layout):
        layout.append(item)
    return attrs.evolve(s, layout=tuple(layout))


def _with_store(s: S.Stage, body: S.ScheduleStore) -> S.Stage:
    if s.name != body.name.id:
        return s
    placement = body.placement if body.placement is not None else s.placement
    return attrs.evolve(s, placement=placement, stored=body.stored)


def _with_const(c: S.Const, new: S.Const) -> S.Const:
    if c.name != new.name:
        return c
    return attrs.evolve(c, value=new.value, range=new.range if new.range is not None else c.range)


def _block_bounds(consts: list[S.Const], params: tuple[S.Param, ...]) -> list[S.Const]:
    """Raise the lower bound of a quantized weight's last dimension to its block."""
    lows: dict[str, int] = {}
    for p in params:
        dt = BUFFER_DTYPES.get(p.type.dtype)
        if dt is None or not dt.is_quantized or not p.type.shape:
            continue
        last = p.type.shape[-1]
        if isinstance(last, S.Name):
            lows[last.id] = max(lows.get(last.id, 0), dt.block)
    out = []
    for c in consts:
        low = lows.get(c.name)
        if low is not None and c.range is not None and not c.runtime:
            lo, hi = c.range
            if isinstance(lo.value, int) and lo.value < low:
                c = attrs.evolve(c, range=(attrs.evolve(lo, value=low), hi))
        out.append(c)
    return out


def _staging_stage(r: S.Region, body: S.ScheduleStore) -> S.Stage:
    """`xq[k] = x[k] in shared as q8_0` for `x in shared as q8_0`, indexed as the first
    stage that reads `x` indexes it (by plain index names)."""
    source = body.name.id
    rank = len(next(p for p in r.params if p.name == source).type.shape)
    names: tuple[str, ...] = tuple(f"i{d}" for d in range(rank))
    for s in flat_stages(r):
        found = next(_accesses(s.value, source), None)
        if found is not None and all(isinstance(i, S.Name) for i in found.indices):
            names = tuple(i.id for i in found.indices if isinstance(i, S.Name))
            break
    span = body.span
    idx = tuple(S.Name(n, span=body.name.span) for n in names)
    value = S.Access(source, idx, span=body.name.span, name_span=body.name.span)
    placement = body.placement if body.placement is not None else S.Name("shared", span=span)
    return S.Stage(
        source + STAGED_SUFFIX,
        idx,
        value,
        placement,
        (),
        span=span,
        name_span=body.name.span,
        stored=body.stored,
    )


def _accesses(e: S.Expr, name: str) -> Iterator[S.Access]:
    match e:
        case S.Access(n, indices):
            if n == name:
                yield e
            for i in indices:
                yield from _accesses(i, name)
        case S.Call(_, args):
            for a in args:
                yield from _accesses(a, name)
        case S.Reduce():
            yield from _accesses(e.body, name)
        case S.BinOp(_, lhs, rhs):
            yield from _accesses(lhs, name)
            yield from _accesses(rhs, name)
        case S.Neg(v):
            yield from _accesses(v, name)
        case _:
            pass


def _rename(e: S.Expr, old: str, new: str) -> S.Expr:
    match e:
        case S.Access(n, indices):
            idx = tuple(_rename(i, old, new) for i in indices)
            return attrs.evolve(e, name=new if n == old else n, indices=idx)
        case S.Name(n):
            return attrs.evolve(e, id=new) if n == old else e
        case S.Call(_, args):
            return attrs.evolve(e, args=tuple(_rename(a, old, new) for a in args))
        case S.Reduce():
            k = _rename(e.k, old, new) if e.k is not None else None
            return attrs.evolve(e, body=_rename(e.body, old, new), k=k)
        case S.BinOp(_, lhs, rhs):
            return attrs.evolve(e, lhs=_rename(lhs, old, new), rhs=_rename(rhs, old, new))
        case S.Neg(v):
            return attrs.evolve(e, value=_rename(v, old, new))
        case _:
            return e


def _renamed(s: S.Stage, old: str, new: str) -> S.Stage:
    mask = _rename(s.mask, old, new) if s.mask is not None else None
    return attrs.evolve(s, value=_rename(s.value, old, new), mask=mask)


def _check_int_dot(
    generic: S.Region,
    region: S.Region,
    line: S.Schedule,
    note: str | None,
    diags: list[Diagnostic],
) -> None:
    """`int8 dot`: every contraction over a weight of a dtype parameter takes integer dot
    products: a quantized weight, an activation stored as q8_0, a whole block per lane."""
    typed = {
        p.name for p in generic.params if p.type.dtype in {d.name for d in generic.dtype_params}
    }
    if not generic.dtype_params:
        typed = {
            p.name
            for p in generic.params
            if p.type.dtype in BUFFER_DTYPES and BUFFER_DTYPES[p.type.dtype].is_quantized
        }
    dtypes = {p.name: p.type.dtype for p in region.params}
    stages = {s.name: s for s in flat_stages(region)}
    found = False

    def refuse(why: str, hint: str) -> None:
        diags.append(Diagnostic(line.span, f"int8 dot cannot be met: {why}", hint, note))

    for s in stages.values():
        for red in _reduces(s.value):
            body = red.body
            if red.op != "sum" or not (isinstance(body, S.BinOp) and body.op == "*"):
                continue
            pair = (body.lhs, body.rhs)
            weight = next((x for x in pair if isinstance(x, S.Access) and x.name in typed), None)
            if weight is None:
                continue
            found = True
            act = pair[1] if weight is pair[0] else pair[0]
            dt = BUFFER_DTYPES.get(dtypes[weight.name])
            if dt is None or not dt.has_int_dot:
                refuse(
                    f"'{weight.name}' is {dtypes[weight.name]}, and integer dot products take "
                    "quantized weights (q8_0, q4_0, q4_K, q6_K)",
                    "limit the line to quantized dtypes: schedule when Wt in q8_0, q4_0: int8 dot",
                )
                return
            act_name = act.name if isinstance(act, S.Access) else getattr(act, "id", None)
            act_stage = stages.get(act_name) if act_name is not None else None
            if act_stage is None or act_stage.stored is None or act_stage.stored.id != "q8_0":
                shown = act_name or "its activation"
                refuse(
                    f"'{shown}' in stage '{s.name}' is not rounded to q8_0",
                    f"round it: schedule ...: {shown} in shared as q8_0",
                )
                return
            vector = next((it.vector for it in s.layout if it.index == red.index), 1)
            if vector != 32:
                refuse(
                    f"stage '{s.name}' takes {red.index} -> lane x {vector}; integer dot "
                    "products take a whole block of 32 per lane",
                    f"schedule ...: {s.name} layout {red.index} -> lane x 32",
                )
                return
    if not found:
        refuse(
            "no contraction reads a weight whose dtype is a dtype parameter",
            "remove the line, or give the weight a dtype parameter (W: Wt[N, K])",
        )


def _reduces(e: S.Expr) -> Iterator[S.Reduce]:
    match e:
        case S.Reduce():
            yield e
            yield from _reduces(e.body)
        case S.Access(_, indices):
            for i in indices:
                yield from _reduces(i)
        case S.Call(_, args):
            for a in args:
                yield from _reduces(a)
        case S.BinOp(_, lhs, rhs):
            yield from _reduces(lhs)
            yield from _reduces(rhs)
        case S.Neg(v):
            yield from _reduces(v)
        case _:
            pass
