"""Tiles and per-workgroup indices: how a region spreads over workgroups and lanes.

`tile (src: 4, dst: 4) lane dst + 4 * src, per t` gives each value of t a group of lanes, each
tile element its own (lane, slot); `per workgroup head < NH` gives each value of head a
workgroup.  Input: a region's syntax, its launch and the target limits.  Output: an `ir.Tile` or
the per-workgroup `ir.IndexVar`, the stages of a tile region, and diagnostics.  Not checked here:
the exchange a device picks for a tile (the runtime).
"""

from __future__ import annotations

import math

from . import ir
from . import syntax as S
from .check_exprs import type_expression
from .check_names import declare, resolve_shape, resolve_target
from .check_state import CheckState, Names, pow2, walk_syntax
from .types import DType, Placement


def _eval_index(e: ir.Expr, values: dict[str, int | float]) -> int:
    """An integer expression over constants and index values (given by name)."""
    match e:
        case ir.IndexRef(v):
            return int(values[v.name])
        case ir.BinOp(op, lhs, rhs, _):
            a, b = _eval_index(lhs, values), _eval_index(rhs, values)
            return {
                "+": a + b,
                "-": a - b,
                "*": a * b,
                "/": a // max(b, 1),
                "%": a % max(b, 1),
            }.get(op, 0)
    return ir.evaluate_int(e, values)


def check_tile(
    state: CheckState, r: S.Region, sc: Names, launch: ir.Launch | None
) -> ir.Tile | None:
    """The tile: its indices, the lane and slot each element goes to, and that the launch
    holds whole groups of its lanes; None when it is wrong."""
    t = r.tile
    assert t is not None
    n0 = len(state.diags)
    if t.per is None:
        state.err(
            t.span,
            "a tile needs 'per <index>': the index whose values get one group of lanes each",
            "e.g. tile (src: 4, dst: 4) lane dst + 4 * src, per t",
        )
        return None
    dims: list[ir.IndexVar] = []
    values = {c.name: c.default for c in sc.consts.values()}
    for d in t.dims:
        ext = resolve_shape(state, d.extent, sc)
        if ext.dtype == DType.ERROR:
            return None
        n = ir.evaluate_int(ext, values)
        if n == 1:
            state.err(
                d.extent.span,
                f"tile index '{d.name}' must have at least 2 values, not 1",
                f"drop '{d.name}' from the tile (its one value is 0), or give it 2, 4, 8 ...",
            )
            return None
        if not pow2(n) or n > 256:
            state.err(
                d.extent.span,
                f"tile index '{d.name}' has {n} values; a tile index "
                "spans a power of two of lanes or slots, up to 256",
                "pad the index to 2, 4, 8 ...",
            )
            return None
        dims.append(ir.IndexVar(d.name, ir.Lit(n, DType.U32), span=d.span))
    # lane and slot formulas: evaluated for every element, they must place each element
    # in its own (lane, slot), each index on its own bits of one of them
    lane_map = _tile_lanes(state, t.lane, dims, sc)
    slot_map = _tile_lanes(state, t.slot, dims, sc) if t.slot is not None else None
    if lane_map is None or (t.slot is not None and slot_map is None):
        return None
    strides = _tile_strides(state, t.lane, lane_map, dims, "lane")
    slot_strides = (
        _tile_strides(state, t.slot, slot_map, dims, "slot")
        if t.slot is not None and slot_map is not None
        else tuple(0 for _ in dims)
    )
    if strides is None or slot_strides is None:
        return None
    for v, a, b in zip(dims, strides, slot_strides, strict=True):
        if (a == 0) == (b == 0):
            where = "both" if a else "neither"
            state.err(
                t.span,
                f"tile index '{v.name}' appears in {where} of the lane and slot formulas",
                "give each tile index to exactly one of them",
            )
            return None
    extent = {v.name: ir.evaluate_int(v.extent, {}) for v in dims}
    group = math.prod(extent[v.name] for v, a in zip(dims, strides, strict=True) if a)
    slots = math.prod(extent[v.name] for v, b in zip(dims, slot_strides, strict=True) if b)
    seen: dict[tuple[int, int], tuple[int, ...]] = {}
    for coords, lane in lane_map.items():
        key = (lane, slot_map[coords] if slot_map is not None else 0)
        if key in seen:
            a_ = ", ".join(f"{v.name}={c}" for v, c in zip(dims, seen[key], strict=True))
            b_ = ", ".join(f"{v.name}={c}" for v, c in zip(dims, coords, strict=True))
            state.err(
                t.lane.span,
                f"the layout maps two tile elements to lane {key[0]}"
                + (f", slot {key[1]}" if slot_map is not None else "")
                + f" ({a_} and {b_})",
                "give each index its own stride, e.g. dst + 4 * src",
            )
            return None
        seen[key] = coords
    for label, mapping, size, formula in (
        ("lane", lane_map, group, t.lane),
        ("slot", slot_map, slots, t.slot),
    ):
        if mapping is None or formula is None:
            continue
        used = sorted(set(mapping.values()))
        if used != list(range(size)):
            outside = next((x for x in used if not 0 <= x < size), None)
            if outside is not None:
                coords = next(c for c, x in mapping.items() if x == outside)
                state.err(
                    formula.span,
                    f"the {label} formula does not cover the tile: "
                    f"element ({', '.join(map(str, coords))}) goes to {label} {outside}, "
                    f"outside 0..{size - 1}",
                    f"a tile with {size} {label}s uses {label}s 0..{size - 1}",
                )
            else:
                state.err(
                    formula.span,
                    f"the {label} formula leaves {label}s unused",
                    f"each {label} 0..{size - 1} holds one element",
                )
            return None
    if group > state.limits.max_subgroup_size:
        state.err(
            t.span,
            f"a tile of {group} lanes is wider than any subgroup "
            f"({state.limits.max_subgroup_size})",
            "move indices from the lane formula to slots",
        )
        return None
    # the launch must keep whole groups inside a workgroup, and within a subgroup or
    # exchange through shared memory
    shared_fallback = False
    if launch is not None:
        sg = launch.subgroup
        if launch.workgroup_size % group:
            state.err(
                t.span,
                f"the workgroup ({launch.workgroup_size}) does not hold whole {group}-lane tiles",
                f"use a workgroup size that is a multiple of {group}",
            )
            return None
        shared_fallback = sg.kind == "at_least" and sg.fallback == "shared"
        guaranteed = min(sg.sizes) if sg.kind in ("at_least", "choice") else 1
        if guaranteed < group and not shared_fallback:
            state.err(
                t.span,
                f"a tile of {group} lanes is wider than the subgroup the launch "
                f"guarantees ({guaranteed} lane{'s' if guaranteed != 1 else ''})",
                f"write 'subgroup >= {group}', or 'subgroup >= {group} else shared' to "
                "exchange through shared memory on narrower subgroups",
            )
            return None
    per = ir.IndexVar(t.per, _per_extent(r, t.per, sc) or ir.Lit(1, DType.ERROR), span=t.span)
    if per.extent.dtype == DType.ERROR:
        state.err(
            t.span,
            f"cannot infer the extent of '{t.per}'",
            f"index an input or the output with '{t.per}'",
        )
        return None
    if len(state.diags) > n0:
        return None
    return ir.Tile(
        tuple(dims),
        tuple(strides),
        per,
        shared_fallback,
        span=t.span,
        slot_strides=tuple(slot_strides),
    )


def _tile_strides(
    state: CheckState,
    formula: S.Expr,
    mapping: dict[tuple[int, ...], int],
    dims: list[ir.IndexVar],
    label: str,
) -> tuple[int, ...] | None:
    """Per index, its stride in a formula that must be a sum of index * power-of-two."""
    zero = mapping[tuple(0 for _ in dims)]
    strides = []
    for i, _ in enumerate(dims):
        unit = tuple(1 if j == i else 0 for j in range(len(dims)))
        strides.append(mapping[unit] - zero)
    for coords, value in mapping.items():
        linear = zero + sum(c * st for c, st in zip(coords, strides, strict=True))
        if zero != 0 or value != linear or not all(st == 0 or pow2(st) for st in strides):
            state.err(
                formula.span,
                f"the {label} formula must give each tile index its own "
                f"{label} bits ({label} = sum of index * power-of-two stride)",
                "e.g. lane dst + 4 * src",
            )
            return None
    return tuple(strides)


def _tile_lanes(
    state: CheckState, formula: S.Expr, dims: list[ir.IndexVar], sc: Names
) -> dict[tuple[int, ...], int] | None:
    """The lane (or slot) of every tile element, by its coordinates, from the formula at the
    default constants."""
    env = {v.name: v for v in dims}
    lane = type_expression(state, formula, sc, env, reduce_ok=False, row_vars=())
    if lane.dtype == DType.ERROR:
        return None
    if not lane.dtype.is_int:
        state.err(
            formula.span,
            "a lane or slot formula must be an integer expression",
            "use the tile's indices, integers and + - * / %: lane dst + 4 * src",
        )
        return None
    values: dict[str, int | float] = {c.name: c.default for c in sc.consts.values()}
    out: dict[tuple[int, ...], int] = {}
    extents = [ir.evaluate_int(v.extent, {}) for v in dims]
    for flat in range(math.prod(extents)):
        coords, rest = [], flat
        for e in reversed(extents):
            coords.append(rest % e)
            rest //= e
        coords.reverse()
        point = {**values, **{v.name: c for v, c in zip(dims, coords, strict=True)}}
        out[tuple(coords)] = _eval_index(lane, point)
    return out


def _per_extent(r: S.Region, name: str, sc: Names) -> ir.Expr | None:
    """The extent of the tile's `per` index: the dimension it subscripts first."""
    items: list[S.Stage] = []
    for it in r.stages:
        items.extend(it.stages if isinstance(it, S.Repeat) else (it,))
    for st in items:
        if st.name in sc.buffers and any(
            isinstance(ix, S.Name) and ix.id == name for ix in st.indices
        ):
            pos = next(
                i for i, ix in enumerate(st.indices) if isinstance(ix, S.Name) and ix.id == name
            )
            shape = sc.buffers[st.name].shape
            if pos < len(shape):
                return shape[pos]
        for e in walk_syntax(st.value):
            if isinstance(e, S.Access) and e.name in sc.buffers:
                for pos, ix in enumerate(e.indices):
                    if isinstance(ix, S.Name) and ix.id == name:
                        shape = sc.buffers[e.name].shape
                        if pos < len(shape):
                            return shape[pos]
    return None


def check_per(state: CheckState, r: S.Region, sc: Names) -> ir.IndexVar | None:
    """The per-workgroup index of `per workgroup NAME < EXTENT`; None when it is wrong."""
    p = r.per
    assert p is not None
    if p.unit != "workgroup" or p.op != "<":
        state.err(
            p.span,
            "write 'per workgroup NAME < EXTENT'",
            "e.g. per workgroup head < NQ + 2 * NK",
        )
        return None
    if r.tile is not None:
        state.err(
            p.span,
            "a region has either a tile or a per-workgroup index, not both",
            "keep the tile (its 'per' index gives each token a lane group) or the 'per "
            "workgroup' line, and split the region in two",
        )
        return None
    ext = resolve_shape(state, p.extent, sc)
    if ext.dtype == DType.ERROR:
        return None
    return ir.IndexVar(p.index, ext, span=p.span)


def check_group(state: CheckState, r: S.Region, sc: Names, per: ir.IndexVar) -> ir.Group | None:
    """`, group h = g / M` of a per-workgroup region: groups of M consecutive workgroups, for
    the stages after the stages in grid (dsl/check_grid.py); None when it is wrong."""
    p = r.per
    assert p is not None and p.group is not None
    word, name, by = p.group
    hint = f"e.g. per workgroup {per.name} < NQ * NS, group h = {per.name} / NS"
    if word != "group":
        state.err(by.span, f"write ', group NAME = {per.name} / SIZE', not '{word}'", hint)
        return None
    if name == per.name or name in sc.decl_spans or name in sc.buffers:
        state.err(
            by.span,
            f"group index '{name}' is already a name of the region",
            "give the group index a name of its own",
        )
        return None
    if not (
        isinstance(by, S.BinOp)
        and by.op == "/"
        and isinstance(by.lhs, S.Name)
        and by.lhs.id == per.name
    ):
        state.err(
            by.span,
            f"a group is '{per.name} / SIZE', consecutive workgroups of one size",
            hint,
        )
        return None
    size = resolve_shape(state, by.rhs, sc)
    if size.dtype == DType.ERROR:
        return None
    extent = ir.BinOp(
        "/",
        ir.BinOp("-", ir.BinOp("+", per.extent, size, DType.U32), ir.Lit(1, DType.U32), DType.U32),
        size,
        DType.U32,
    )
    return ir.Group(ir.IndexVar(name, extent, span=by.span), size)


def check_version_names(state: CheckState, r: S.Region) -> None:
    """A tile value assigned again is `c.1`, `c.2`, ..., and an unfused chain stores them in
    buffers `c_v1`, `c_v2` (codegen/lower.py `intermediate_buffer`): no value may be
    named so."""
    items = [st for it in r.stages for st in (it.stages if isinstance(it, S.Repeat) else (it,))]
    count: dict[str, int] = {}
    for st in items:
        if not st.indices:
            count[st.name] = count.get(st.name, 0) + 1
    taken = {f"{name}_v{i}": name for name, n in count.items() for i in range(1, n)}
    named = [(p.name, p.span) for p in (*r.params, *r.outputs)]
    for name, span in [*named, *((st.name, st.name_span) for st in items)]:
        if name in taken:
            value = taken[name]
            state.err(
                span,
                f"'{name}' is the name fusec gives a later value of '{value}', which is "
                f"assigned {count[value]} times",
                f"rename '{name}'",
            )
            return


def check_tile_stage(state: CheckState, st: S.Stage, sc: Names) -> ir.Stage | None:
    """A stage of a tile region: a bare name is a per-lane tile value (may be assigned
    again); an output is stored with the tile's indices."""
    tile = state.tile
    assert tile is not None
    if st.stored is not None:
        state.err(
            st.stored.span,
            f"a tile value lives in registers; it cannot be stored as {st.stored.id}",
            f"drop 'as {st.stored.id}'",
        )
        return None
    n_before = len(state.diags)
    names = {v.name: v for v in (tile.per, *tile.dims)}
    computed = [ix for ix in st.indices if not isinstance(ix, S.Name)]
    if computed or st.mask is not None:
        state.err(
            computed[0].span if computed else st.mask.span,  # type: ignore[union-attr]
            "a tile region writes its outputs at the tile's own index names, unmasked",
            f"write the whole tile, e.g. {st.name}[{', '.join(names)}] = ..., and compute "
            "the part to keep in a region without a tile",
        )
        return None
    lhs = [ix for ix in st.indices if isinstance(ix, S.Name)]
    ok, out_buf = resolve_target(state, st, sc)
    if not ok:
        return None
    if st.indices or out_buf is not None:
        if out_buf is None:
            state.err(
                st.name_span,
                f"'{st.name}' is not an output; in a tile region, values are written bare",
                f"write {st.name} = ...",
            )
            return None
        wanted = list(names)
        got = [ix.id for ix in lhs]
        if sorted(got) != sorted(wanted):
            state.err(
                st.name_span,
                f"output '{st.name}' of a tile region must be indexed by "
                f"the tile's indices ({', '.join(wanted)}), not ({', '.join(got)})",
                f"write {st.name}[{', '.join(names)}]",
            )
            return None
        if len(out_buf.shape) != len(got):
            state.err(
                st.name_span,
                f"output '{st.name}' has {len(out_buf.shape)} "
                f"dimension(s) but the stage writes {len(got)}",
                f"write one index per dimension of '{st.name}', {len(out_buf.shape)} in all",
            )
            return None
        values = {c.name: c.default for c in sc.consts.values()}
        for ix, dim in zip(lhs, out_buf.shape, strict=True):
            var = names[ix.id]
            if var is tile.per:
                if dim != var.extent:
                    state.err(
                        ix.span,
                        f"shape mismatch: '{ix.id}' ranges over "
                        f"{ir.format_expr(var.extent)} but dimension of "
                        f"'{st.name}' is {ir.format_expr(dim)}",
                        f"declare that dimension of '{st.name}' as {ir.format_expr(var.extent)}",
                    )
                    return None
            elif ir.evaluate_int(dim, values) != tile.extent_of(var):
                state.err(
                    ix.span,
                    f"shape mismatch: tile index '{ix.id}' has "
                    f"{tile.extent_of(var)} values but the dimension of '{st.name}' "
                    f"is {ir.format_expr(dim)}",
                    f"declare that dimension of '{st.name}' as {tile.extent_of(var)}",
                )
                return None
        indices = tuple(names[ix.id] for ix in lhs)
        name, var_name = st.name, st.name
    else:
        prior = sc.latest.get(st.name)
        if prior is not None and prior.indices == (tile.per, *tile.dims):
            n = sum(1 for x in sc.stages.values() if x.var == st.name)
            name, var_name = f"{st.name}.{n}", st.name
        elif not declare(state, sc, st.name, st.name_span, "stage"):
            return None
        else:
            name, var_name = st.name, st.name
        indices = (tile.per, *tile.dims)
    env = dict(names)
    value = type_expression(state, st.value, sc, env, reduce_ok=True, row_vars=())
    if len(state.diags) > n_before or value.dtype == DType.ERROR:
        return None
    placement = Placement.GLOBAL if out_buf is not None else Placement.REGISTER
    return ir.Stage(
        name, indices, value, value.dtype, placement, None, out_buf, span=st.span, var=var_name
    )


def check_tile_registers(state: CheckState, r: S.Region, stages: list[ir.Stage]) -> None:
    """The values a lane of a tile region holds at once must fit in its registers.  Values read
    across slots (by a reduction over a slot index) hold every slot at once; others are
    computed slot by slot (the estimator counts the rest)."""
    tile = state.tile
    assert tile is not None and r.tile is not None
    slot_dims = {d.name for d in tile.dims if tile.on_slots(d)}
    values = {
        ref.stage.var
        for x in stages
        for red in ir.walk(x.value)
        if isinstance(red, ir.Reduce) and red.var.name in slot_dims
        for ref in ir.walk(red.body)
        if isinstance(ref, ir.StageRef)
    }
    floats = len(values) * tile.slots
    registers = state.limits.lane_registers
    if floats > registers:
        state.err(
            r.tile.span,
            f"register tile too large: {len(values)} value(s) read "
            f"across {tile.slots} slots = {floats} floats per lane, more than the "
            f"{registers} registers a lane has on any target",
            "put more of the tile on lanes, or hold fewer values at once",
        )
