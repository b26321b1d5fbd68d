"""Semantic checks: `syntax.Module` -> `ir.Program`, or a DiagnosticError listing every problem.

Resolves names (buffers, constants, stages, index variables), infers each index variable's extent
from the accesses that use it, types every expression, and checks the launch shape, constant
ranges, placements, layouts and the shared-memory footprint of shared intermediates.  Index
arithmetic must stay within its dimensions and never divide by 0, and repeat counts within 0 ..
MAX_REPEAT_COUNT, at the constants' settings dsl/bounds.py tries.

Not checked here: anything that depends on a device or target besides the shared-memory limit
passed in (subgroup sizes a device offers, register budgets); codegen and the runtime do that.
Nor relations between constants that their ranges cannot state (dsl/bounds.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs

from . import bounds, ir
from . import syntax as S
from .diagnostics import Diagnostic, DiagnosticError
from .span import Span
from .types import (
    BUFFER_DTYPES,
    EXCHANGE_FUNCTIONS,
    FUNCTIONS,
    Q8_SHARED_WORDS,
    QUANT_BLOCK,
    REDUCERS,
    DType,
    Placement,
    Scope,
)

# Smallest `maxComputeSharedMemorySize` among the targets we know (NVIDIA through Vulkan: 48 KiB;
# FACTS.md).  Callers building for specific targets pass their own limit.
DEFAULT_SHARED_LIMIT_BYTES = 48 * 1024
MAX_WORKGROUP_SIZE = 1024  # Vulkan's guaranteed maxComputeWorkGroupInvocations is 128; 1024 is
# what every desktop GPU offers.  A device with less is refused at run time.
LAUNCH_KEYS = ("workgroup", "subgroup", "rows_per_subgroup")
U32_MAX = 2**32 - 1
COMPARE_OPS = ("<", "<=", ">", ">=", "==", "!=")
# how a function of several arguments is called, for the hint of a wrong argument count
_CALL_FORMS = {
    "select": "select(c, a, b): a where c is not 0, else b",
    "clamp": "clamp(x, lo, hi): min(max(x, lo), hi)",
    "pow": "pow(x, y)",
    "max": "max(a, b), or the reduction max(k: ...)",
    "min": "min(a, b), or the reduction min(k: ...)",
}
MAX_LANE_REGISTERS = 256  # VGPRs per lane on every target we know (codegen/targets.py)
# A repeat loop runs in one dispatch; a trip count past this (from a wrapped-around negative
# count, or a typo such as 1e9) would hold the GPU for seconds and trip the driver's watchdog
# (2 s on Windows' TDR).  The Sinkhorn loop of kernels.fuse runs 20 times.
MAX_REPEAT_COUNT = 65536
# Lowering recomputes an indexed register stage where it is read, so a stage's expression grows
# by those it reads; twice S.MAX_EXPR_DEPTH still leaves lowering and the GLSL printer (3 Python
# frames per level at most) inside the default recursion limit.
MAX_INLINED_DEPTH = 2 * S.MAX_EXPR_DEPTH


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


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


def _text(span: Span) -> str:
    """The source text of a span, on one line."""
    return " ".join(span.source.text[span.start : span.end].split())


def _where(w: bounds.Witness, *exprs: ir.Expr) -> str:
    """` (at n = 4095)`, or ` (at i = 0, with every constant at the low end of its range: K
    = 1)`: the values of a witness, naming the constants `exprs` mention."""
    parts = [f"{name} = {value}" for name, value in w.at]
    where = f"at {', '.join(parts)}" if parts else ""
    if w.setting.name != "default":
        names: dict[str, None] = {}
        todo = list(exprs)
        while todo:
            x = todo.pop()
            for y in ir.walk(x):
                if isinstance(y, ir.ConstRef) and y.const.name in w.setting.values:
                    names[y.const.name] = None
                elif isinstance(y, ir.IndexRef):
                    todo.append(y.var.extent)
        consts = ", ".join(f"{n} = {w.setting.values[n]}" for n in sorted(names))
        words = bounds.SETTING_WORDS[w.setting.name]
        where += (", with " if where else "with ") + words + (f": {consts}" if consts else "")
    return f" ({where})" if where else ""


def _walk_syntax(e: S.Expr) -> list[S.Expr]:
    out: list[S.Expr] = [e]
    match e:
        case S.Access(_, idx):
            for i in idx:
                out += _walk_syntax(i)
        case S.Call(_, args):
            for a in args:
                out += _walk_syntax(a)
        case S.BinOp(_, lhs, rhs):
            out += _walk_syntax(lhs) + _walk_syntax(rhs)
        case S.Neg(v):
            out += _walk_syntax(v)
        case S.Reduce(_, _, body):
            out += _walk_syntax(body)
    return out


@attrs.define
class _Scope:
    """Names visible in one region."""

    buffers: dict[str, ir.Buffer] = attrs.Factory(dict)
    consts: dict[str, ir.ConstDecl] = attrs.Factory(dict)
    stages: dict[str, ir.Stage] = attrs.Factory(dict)
    decl_spans: dict[str, Span] = attrs.Factory(dict)
    poisoned: set[str] = attrs.Factory(set)  # names whose declaration failed: no cascades
    latest: dict[str, ir.Stage] = attrs.Factory(dict)  # variable -> its current version


@attrs.define
class _IndexInfo:
    """An index variable while its extent is being inferred."""

    name: str
    span: Span
    extent: ir.Expr | None = None
    extent_origin: Span | None = None
    var: ir.IndexVar | None = None
    explicit: bool = False  # written `t[h: 4]`: may index a larger dimension (a sub-range)


class _Checker:
    def __init__(self, shared_limit_bytes: int, known_targets: Sequence[str] | None) -> None:
        self.diags: list[Diagnostic] = []
        self.shared_limit = shared_limit_bytes
        self.known_targets = known_targets
        self.tile: ir.Tile | None = None
        self.per: ir.IndexVar | None = None
        self.settings: list[bounds.Setting] = []  # the constants' settings index checks try
        self.depths: dict[ir.Stage, int] = {}  # a register stage's depth, its reads substituted

    def err(self, span: Span | None, message: str, hint: str | None = None) -> None:
        self.diags.append(Diagnostic(span, message, hint))

    # --- region -----------------------------------------------------------------------------
    def region(self, r: S.Region, seen: dict[str, Span]) -> ir.Region | None:
        if r.name in seen:
            line = seen[r.name].line_col()[0]
            self.err(
                r.name_span,
                f"region '{r.name}' is already defined on line {line}",
                "give each region a unique name",
            )
        seen[r.name] = r.name_span
        n_before = len(self.diags)
        sc = _Scope()
        consts = self.consts(r, sc)
        self.settings = bounds.settings(consts)
        inputs = tuple(self.buffer(p, sc, is_output=False) for p in r.params)
        outputs = tuple(self.buffer(p, sc, is_output=True) for p in r.outputs)
        launch = self.launch(r)
        budget = self.budget(r)
        self.tile = self.tile_decl(r, sc, launch) if r.tile is not None else None
        self.per = self.per_decl(r, sc) if r.per is not None else None
        if r.per is not None and self.per is None:
            return None
        stages: list[ir.Stage | ir.Repeat] = []
        if r.tile is not None and self.tile is None:
            # the tile is wrong: its stages cannot be checked without it (no cascade)
            return None
        if r.tile is not None:
            self.check_version_names(r)
        for item in r.stages:
            if isinstance(item, S.Repeat):
                rep = self.repeat(item, sc, launch)
                if rep is not None:
                    stages.append(rep)
                continue
            stage = self.stage(item, sc, launch)
            if stage is None:
                sc.poisoned.add(item.name)
            else:
                stages.append(stage)
                self.bind_stage(sc, stage)
        flat = [x for s in stages for x in (s.stages if isinstance(s, ir.Repeat) else (s,))]
        if self.tile is not None and r.tile is not None:
            # values read across slots (by a reduction over a slot index) hold every slot
            # at once; others are computed slot by slot (the estimator counts the rest)
            slot_dims = {d.name for d in self.tile.dims if self.tile.on_slots(d)}
            values = {
                ref.stage.var
                for x in flat
                for red in ir.walk(x.value)
                if isinstance(red, ir.Reduce) and red.var.name in slot_dims
                for ref in ir.walk(red.body)
                if isinstance(ref, ir.StageRef)
            }
            floats = len(values) * self.tile.slots
            if floats > MAX_LANE_REGISTERS:
                self.err(
                    r.tile.span,
                    f"register tile too large: {len(values)} value(s) read "
                    f"across {self.tile.slots} slots = {floats} floats per lane, more than the "
                    f"{MAX_LANE_REGISTERS} registers a lane has on any target",
                    "put more of the tile on lanes, or hold fewer values at once",
                )
        if self.tile is None:
            self.check_slice_readers(flat)
        written = {s.output.name for s in flat if s.output is not None} | sc.poisoned
        for out in outputs:
            if out.name not in written:
                self.err(
                    out.span,
                    f"output '{out.name}' is never assigned",
                    f"add a stage '{out.name}[...] = ...' to the region body",
                )
        if len(self.diags) > n_before or launch is None:
            return None
        runtime = [c for c in consts if c.runtime]
        params = (
            ir.Buffer(
                ir.PARAMS_BUFFER,
                DType.U32,
                (ir.Lit(len(runtime), DType.U32),),
                is_output=False,
                span=runtime[0].span,
            )
            if runtime
            else None
        )
        return ir.Region(
            r.name,
            inputs,
            outputs,
            consts,
            launch,
            tuple(stages),
            span=r.span,
            budget=budget,
            tile=self.tile,
            per=self.per,
            params=params,
        )

    def visible_shape(self, stage: ir.Stage) -> tuple[ir.Expr, ...]:
        """A stage's shape as written: without the implicit per-workgroup index."""
        if self.per is not None and stage.indices[:1] == (self.per,):
            return stage.shape[1:]
        return stage.shape

    def per_decl(self, r: S.Region, sc: _Scope) -> ir.IndexVar | None:
        p = r.per
        assert p is not None
        if p.unit != "workgroup" or p.op != "<":
            self.err(
                p.span,
                "write 'per workgroup NAME < EXTENT'",
                "e.g. per workgroup head < NQ + 2 * NK",
            )
            return None
        if r.tile is not None:
            self.err(p.span, "a region has either a tile or a per-workgroup index, not both")
            return None
        ext = self.shape_expr(p.extent, sc)
        if ext.dtype == DType.ERROR:
            return None
        return ir.IndexVar(p.index, ext, span=p.span)

    def bind_stage(self, sc: _Scope, stage: ir.Stage) -> None:
        sc.stages[stage.name] = stage
        sc.latest[stage.var] = stage

    # --- tiles and repeats ---------------------------------------------------------------------
    def tile_decl(self, r: S.Region, sc: _Scope, launch: ir.Launch | None) -> ir.Tile | None:
        t = r.tile
        assert t is not None
        n0 = len(self.diags)
        if t.per is None:
            self.err(
                t.span,
                "a tile needs 'per <index>': the index whose values get one group of lanes each",
                "e.g. tile (src: 4, dst: 4) lane dst + 4 * src, per t",
            )
            return None
        dims: list[ir.IndexVar] = []
        values = {c.name: c.default for c in sc.consts.values()}
        for d in t.dims:
            ext = self.shape_expr(d.extent, sc)
            if ext.dtype == DType.ERROR:
                return None
            n = ir.evaluate_int(ext, values)
            if n == 1:
                self.err(
                    d.extent.span,
                    f"tile index '{d.name}' must have at least 2 values, not 1",
                    f"drop '{d.name}' from the tile (its one value is 0), or give it 2, 4, 8 ...",
                )
                return None
            if not _pow2(n) or n > 256:
                self.err(
                    d.extent.span,
                    f"tile index '{d.name}' has {n} values; a tile index "
                    "spans a power of two of lanes or slots, up to 256",
                    "pad the index to 2, 4, 8 ...",
                )
                return None
            dims.append(ir.IndexVar(d.name, ir.Lit(n, DType.U32), span=d.span))
        # lane and slot formulas: evaluated for every element, they must place each element
        # in its own (lane, slot), each index on its own bits of one of them
        lane_map = self.tile_lanes(t.lane, dims, sc)
        slot_map = self.tile_lanes(t.slot, dims, sc) if t.slot is not None else None
        if lane_map is None or (t.slot is not None and slot_map is None):
            return None
        strides = self.tile_strides(t.lane, lane_map, dims, "lane")
        slot_strides = (
            self.tile_strides(t.slot, slot_map, dims, "slot")
            if t.slot is not None and slot_map is not None
            else tuple(0 for _ in dims)
        )
        if strides is None or slot_strides is None:
            return None
        for v, a, b in zip(dims, strides, slot_strides, strict=True):
            if (a == 0) == (b == 0):
                where = "both" if a else "neither"
                self.err(
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
                self.err(
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
                    self.err(
                        formula.span,
                        f"the {label} formula does not cover the tile: "
                        f"element ({', '.join(map(str, coords))}) goes to {label} {outside}, "
                        f"outside 0..{size - 1}",
                        f"a tile with {size} {label}s uses {label}s 0..{size - 1}",
                    )
                else:
                    self.err(
                        formula.span,
                        f"the {label} formula leaves {label}s unused",
                        f"each {label} 0..{size - 1} holds one element",
                    )
                return None
        if group > 128:
            self.err(
                t.span,
                f"a tile of {group} lanes is wider than any subgroup (128)",
                "move indices from the lane formula to slots",
            )
            return None
        # the launch must keep whole groups inside a workgroup, and within a subgroup or
        # exchange through shared memory
        shared_fallback = False
        if launch is not None:
            sg = launch.subgroup
            if launch.workgroup_size % group:
                self.err(
                    t.span,
                    f"the workgroup ({launch.workgroup_size}) does not hold whole "
                    f"{group}-lane tiles",
                    f"use a workgroup size that is a multiple of {group}",
                )
                return None
            shared_fallback = sg.kind == "at_least" and sg.fallback == "shared"
            guaranteed = min(sg.sizes) if sg.kind in ("at_least", "choice") else 1
            if guaranteed < group and not shared_fallback:
                self.err(
                    t.span,
                    f"a {group}-lane tile is wider than the subgroup the launch "
                    f"guarantees ({guaranteed} lane{'s' if guaranteed != 1 else ''})",
                    f"write 'subgroup >= {group}', or 'subgroup >= {group} else shared' to "
                    "exchange through shared memory on narrower subgroups",
                )
                return None
        per = ir.IndexVar(
            t.per, self.per_extent(r, t.per, sc) or ir.Lit(1, DType.ERROR), span=t.span
        )
        if per.extent.dtype == DType.ERROR:
            self.err(
                t.span,
                f"cannot infer the extent of '{t.per}'",
                f"index an input or the output with '{t.per}'",
            )
            return None
        if len(self.diags) > n0:
            return None
        return ir.Tile(
            tuple(dims),
            tuple(strides),
            per,
            shared_fallback,
            span=t.span,
            slot_strides=tuple(slot_strides),
        )

    def tile_strides(
        self,
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
            if zero != 0 or value != linear or not all(st == 0 or _pow2(st) for st in strides):
                self.err(
                    formula.span,
                    f"the {label} formula must give each tile index its own "
                    f"{label} bits ({label} = sum of index * power-of-two stride)",
                    "e.g. lane dst + 4 * src",
                )
                return None
        return tuple(strides)

    def tile_lanes(
        self, formula: S.Expr, dims: list[ir.IndexVar], sc: _Scope
    ) -> dict[tuple[int, ...], int] | None:
        env = {v.name: v for v in dims}
        lane = self.expr(formula, sc, env, reduce_ok=False, row_vars=())
        if lane.dtype == DType.ERROR:
            return None
        if not lane.dtype.is_int:
            self.err(formula.span, "a lane or slot formula must be an integer expression")
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

    def per_extent(self, r: S.Region, name: str, sc: _Scope) -> ir.Expr | None:
        """The extent of the tile's `per` index: the dimension it subscripts first."""
        items: list[S.Stage] = []
        for it in r.stages:
            items.extend(it.stages if isinstance(it, S.Repeat) else (it,))
        for st in items:
            if st.name in sc.buffers and any(ix.id == name for ix in st.indices):
                pos = next(i for i, ix in enumerate(st.indices) if ix.id == name)
                shape = sc.buffers[st.name].shape
                if pos < len(shape):
                    return shape[pos]
            for e in _walk_syntax(st.value):
                if isinstance(e, S.Access) and e.name in sc.buffers:
                    for pos, ix in enumerate(e.indices):
                        if isinstance(ix, S.Name) and ix.id == name:
                            shape = sc.buffers[e.name].shape
                            if pos < len(shape):
                                return shape[pos]
        return None

    def repeat(self, rp: S.Repeat, sc: _Scope, launch: ir.Launch | None) -> ir.Repeat | None:
        if self.tile is None:
            self.err(
                rp.span,
                "repeat is only supported in a tile region",
                "declare a tile (tile (i: 4) lane i, per t) or unroll the stages",
            )
            return None
        tile_values = [
            x
            for x in _walk_syntax(rp.count)
            if isinstance(x, S.Name | S.Access)
            and self.is_tile_value(x.id if isinstance(x, S.Name) else x.name, sc)
        ]
        if tile_values:
            x = tile_values[0]
            name = x.id if isinstance(x, S.Name) else x.name
            self.err(
                x.span,
                f"a repeat count must be a constant expression, not the tile value '{name}'",
                "a loop runs the same number of times on every lane: count with constants, "
                "e.g. repeat iters - 1:",
            )
            return None
        count = self.expr(rp.count, sc, {}, reduce_ok=False, row_vars=())
        if count.dtype == DType.ERROR:
            return None
        if not count.dtype.is_int:
            self.err(
                rp.count.span,
                f"a repeat count must be an integer, not {count.dtype.value}",
                "use integer constants, e.g. repeat iters - 1:",
            )
            return None
        if not bounds.is_arithmetic(count) or bounds.index_vars(count):
            self.err(
                rp.count.span,
                "a repeat count must be computed from constants and integers",
                "use integer constants, e.g. repeat iters - 1:",
            )
            return None
        if not self.check_repeat_count(rp.count, count):
            return None
        before = dict(sc.latest)
        body: list[ir.Stage] = []
        for st in rp.stages:
            if st.indices or st.name in sc.buffers:
                self.err(
                    st.name_span,
                    "a repeat body assigns tile values only",
                    "store outputs after the loop",
                )
                return None
            stage = self.stage(st, sc, launch)
            if stage is None:
                sc.poisoned.add(st.name)
                return None
            body.append(stage)
            self.bind_stage(sc, stage)
        carried = []
        for var in dict.fromkeys(s.var for s in body):
            last = [s for s in body if s.var == var][-1]
            if var in before:
                carried.append((before[var], last))
                # after the loop (and at the top of each iteration) the value is the carried one
                sc.latest[var] = before[var]
        return ir.Repeat(count, tuple(body), tuple(carried), span=rp.span)

    def is_tile_value(self, name: str, sc: _Scope) -> bool:
        tile = self.tile
        stage = sc.latest.get(name)
        return tile is not None and stage is not None and stage.indices == (tile.per, *tile.dims)

    def check_repeat_count(self, e: S.Expr, count: ir.Expr) -> bool:
        """0 .. MAX_REPEAT_COUNT iterations at the constants' settings (dsl/bounds.py); the
        GPU computes the count in unsigned 32-bit arithmetic, where below 0 wraps around."""
        for setting in self.settings:
            value = bounds.evaluate(count, setting.values, {})
            if value is None:
                continue
            exact = bounds.evaluate_exact(count, setting.values, {})
            # in range as the GPU computes it, and not only because it wrapped around
            if value <= MAX_REPEAT_COUNT and 0 <= exact <= MAX_REPEAT_COUNT:
                continue
            w = bounds.Witness(value, exact, (), setting)
            consts = sorted({x.const.name for x in ir.walk(count) if isinstance(x, ir.ConstRef)})
            values = ", ".join(f"{n} = {setting.values[n]}" for n in consts)
            if setting.name != "default":
                where = _where(w, count)
            else:
                where = f" ({values})" if values else ""
            if exact < 0:
                self.err(
                    e.span,
                    f"repeat count '{_text(e.span)}' must be at least 0, not {exact}{where}",
                    f"below 0 the count wraps around to {value} iterations; keep it at 0 or "
                    "above for every value of the constants in their ranges",
                )
            elif exact > U32_MAX:
                self.err(
                    e.span,
                    f"repeat count '{_text(e.span)}' must be at most {MAX_REPEAT_COUNT}, not "
                    f"{exact}{where}",
                    f"the count is unsigned 32-bit: {exact} wraps around to {value} "
                    "iterations; lower the count or the constants' ranges",
                )
            else:
                self.err(
                    e.span,
                    f"repeat count '{_text(e.span)}' must be at most {MAX_REPEAT_COUNT}, not "
                    f"{value if value > MAX_REPEAT_COUNT else exact}{where}",
                    "so long a loop may run past the driver's watchdog (seconds); lower the "
                    "count or the constants' ranges",
                )
            return False
        return True

    def declare(self, sc: _Scope, name: str, span: Span, what: str) -> bool:
        if name in sc.decl_spans:
            line = sc.decl_spans[name].line_col()[0]
            self.err(
                span, f"{what} '{name}' is already declared on line {line}", "rename one of them"
            )
            return False
        sc.decl_spans[name] = span
        return True

    # --- constants -----------------------------------------------------------------------------
    def consts(self, r: S.Region, sc: _Scope) -> tuple[ir.ConstDecl, ...]:
        out: list[ir.ConstDecl] = []
        for c in r.consts:
            if not self.declare(sc, c.name, c.span, "constant"):
                continue
            sc.poisoned.add(c.name)  # removed below once the constant is accepted
            is_int = c.value.is_int
            lo = hi = None
            if c.range is not None:
                lo_n, hi_n = c.range
                if lo_n.is_int != is_int or hi_n.is_int != is_int:
                    kind = "an integer" if is_int else "a real"
                    self.err(
                        lo_n.span.join(hi_n.span),
                        f"range of '{c.name}' must be {kind} range like its default",
                        "write both bounds in the same kind as the default value",
                    )
                    continue
                lo, hi = lo_n.value, hi_n.value
                if lo > hi:
                    self.err(
                        lo_n.span.join(hi_n.span),
                        f"range of '{c.name}' is empty: {lo} > {hi}",
                        "write the smaller bound first",
                    )
                    continue
                if not lo <= c.value.value <= hi:
                    self.err(
                        c.value.span,
                        f"default of '{c.name}' is {c.value.value}, outside its range {lo} .. {hi}",
                        "change the default or widen the range",
                    )
                    continue
            if c.runtime and not is_int:
                self.err(
                    c.span,
                    f"run-time parameter '{c.name}' must have an integer range",
                    f"write param {c.name} in 0 .. 4095",
                )
                continue
            if is_int and not 0 <= int(c.value.value) <= U32_MAX:
                self.err(
                    c.value.span,
                    f"constant '{c.name}' = {c.value.value} does not fit in u32",
                    "integer constants are unsigned 32-bit",
                )
                continue
            decl = ir.ConstDecl(
                c.name,
                DType.U32 if is_int else DType.F32,
                c.value.value,
                lo,
                hi,
                # run-time parameters are numbered by their slot in the parameter buffer
                spec_id=sum(d.runtime == c.runtime for d in out),
                span=c.span,
                runtime=c.runtime,
            )
            sc.consts[c.name] = decl
            sc.poisoned.discard(c.name)
            out.append(decl)
        return tuple(out)

    # --- buffers -------------------------------------------------------------------------------
    def buffer(self, p: S.Param, sc: _Scope, is_output: bool) -> ir.Buffer:
        dtype = BUFFER_DTYPES.get(p.type.dtype)
        if dtype is None:
            known = ", ".join(BUFFER_DTYPES)
            # GGUF's K-quants are spelled as ggml spells them: q4_K, q6_K
            cased = {d.lower(): d for d in BUFFER_DTYPES}.get(p.type.dtype.lower())
            hint = (
                f"dtypes are spelled as ggml spells them: write '{cased}'"
                if cased
                else f"known dtypes: {known}"
            )
            self.err(p.type.span, f"unknown dtype '{p.type.dtype}'", hint)
            dtype = DType.ERROR
        if is_output and (dtype.is_int or dtype.is_quantized):
            self.err(
                p.type.span,
                f"output '{p.name}' must be f32 or f16, not {dtype.value}",
                "fusec computes in f32; declare the output f32 or f16",
            )
        shape = tuple(self.shape_expr(d, sc) for d in p.type.shape)
        if dtype.is_quantized and not is_output:
            self.check_blocks(p, shape, sc)
        if p.state and not is_output:
            self.err(
                p.span,
                f"input '{p.name}' cannot be state",
                "state buffers are outputs kept between runs: move it after ->",
            )
        values = self.value_range(p, dtype, is_output)
        if p.name == ir.PARAMS_BUFFER:
            self.err(
                p.span,
                f"buffer name '{p.name}' is reserved for the run-time parameters' buffer",
                "rename the buffer",
            )
        tolerance = self.tolerance(p, is_output)
        buf = ir.Buffer(
            p.name,
            dtype,
            shape,
            is_output,
            span=p.span,
            state=p.state,
            values=values,
            tolerance=tolerance,
        )
        if self.declare(sc, p.name, p.span, "output" if is_output else "input"):
            sc.buffers[p.name] = buf
        return buf

    def tolerance(self, p: S.Param, is_output: bool) -> float | None:
        """`y: f32[N] tol E`: the relative error `fusec check` accepts for an output."""
        if p.tolerance is None:
            return None
        tol = float(p.tolerance.value)
        if not is_output:
            self.err(
                p.tolerance.span,
                f"input '{p.name}' cannot have a tolerance",
                "a tolerance says how far an output may be from the reference: move it to an "
                "output after ->",
            )
            return None
        if not (math.isfinite(tol) and 0 < tol < 1):
            self.err(
                p.tolerance.span,
                f"the tolerance of output '{p.name}' must lie between 0 and 1, not {tol:g}",
                "it bounds max |got - want| / max |want|: e.g. tol 2e-3",
            )
            return None
        return tol

    def value_range(self, p: S.Param, dtype: DType, is_output: bool) -> tuple[float, float] | None:
        """`x: f32[N] in LO .. HI`: the values an input is meant to hold."""
        if p.values is None:
            return None
        lo, hi = p.values
        span = lo.span.join(hi.span)
        if is_output:
            self.err(
                span,
                f"output '{p.name}' cannot declare a value range",
                "a range says which values an input is meant to hold; outputs are computed",
            )
            return None
        if dtype.is_int and not (lo.is_int and hi.is_int):
            self.err(
                span,
                f"input '{p.name}' is {dtype.value}: its value range needs whole numbers",
                f"write e.g. '{p.name}: {dtype.value}[...] in 0 .. 100'",
            )
            return None
        limits = {DType.U32: (0, 2**32 - 1), DType.I32: (-(2**31), 2**31 - 1)}.get(dtype)
        if limits is not None and not limits[0] <= lo.value <= hi.value <= limits[1]:
            self.err(
                span,
                f"value range {lo.value} .. {hi.value} of input '{p.name}' is not within "
                f"{dtype.value} ({limits[0]} .. {limits[1]})",
                f"keep the bounds within {limits[0]} .. {limits[1]}",
            )
            return None
        if not lo.value < hi.value:
            self.err(
                span,
                f"empty value range {lo.value} .. {hi.value} for input '{p.name}'",
                "write the smaller bound first: in LO .. HI with LO < HI",
            )
            return None
        return (lo.value, hi.value)

    def check_blocks(self, p: S.Param, shape: tuple[ir.Expr, ...], sc: _Scope) -> None:
        """A quantized weight has rows, and each a whole number of blocks (32 elements for
        q8_0 / q4_0, 256 for the K-quants)."""
        block = BUFFER_DTYPES[p.type.dtype].block
        if not shape:
            # a scalar has no row to cut into blocks (the runtime sized such a buffer from its
            # last dimension and failed: docs/FUZZING.md)
            self.err(
                p.span,
                f"{p.type.dtype} weight '{p.name}' must have a shape: it is stored in "
                f"{block}-element blocks along its last dimension",
                f"declare it as {p.type.dtype}[K] with K a multiple of {block}, or as f32",
            )
            return
        if any(d.dtype == DType.ERROR for d in shape):
            return
        values = {c.name: c.default for c in sc.consts.values()}
        last = shape[-1]
        k = ir.evaluate_int(last, values)
        name = ir.format_expr(last)
        if k % block:
            self.err(
                p.span,
                f"{p.type.dtype} weight '{p.name}' has {k} elements per row "
                f"({name}), not a multiple of the {block}-element block",
                f"make {name} a multiple of {block}, or store '{p.name}' as f16",
            )

    def shape_expr(self, e: S.Expr, sc: _Scope) -> ir.Expr:
        match e:
            case S.Num(v, True):
                if v < 1:
                    self.err(e.span, f"dimension must be at least 1, not {v}")
                return ir.Lit(int(v), DType.U32)
            case S.Num(v, False):
                self.err(
                    e.span,
                    f"dimension must be an integer, not the real {v}",
                    "shapes are integers or integer constants",
                )
                return ir.Lit(1, DType.ERROR)
            case S.Name(name):
                c = sc.consts.get(name)
                if c is None and name in sc.poisoned:
                    return ir.Lit(1, DType.ERROR)
                if c is None:
                    self.err(
                        e.span,
                        f"unknown constant '{name}' in a shape",
                        f"declare it: const {name} = <default>",
                    )
                    return ir.Lit(1, DType.ERROR)
                if c.runtime:
                    self.err(
                        e.span,
                        f"'{name}' is a run-time parameter; it cannot size a dimension",
                        "shapes, extents and trip counts use constants (const), fixed at "
                        "pipeline creation",
                    )
                    return ir.Lit(1, DType.ERROR)
                if c.dtype != DType.U32:
                    self.err(
                        e.span,
                        f"dtype mismatch: dimension '{name}' must be an integer "
                        f"constant, not {c.dtype.value}",
                        f"declare {name} with an integer default",
                    )
                    return ir.Lit(1, DType.ERROR)
                if int(c.default) < 1 or (c.lo is not None and c.lo < 1):
                    self.err(
                        e.span,
                        f"constant '{name}' is used as a dimension, so it must be "
                        f"at least 1, not {c.lo if c.lo is not None and c.lo < 1 else c.default}",
                        f"give '{name}' a range starting at 1",
                    )
                return ir.ConstRef(c)
            case S.BinOp(op, lhs, rhs) if op in "+-*/":
                a, b = self.shape_expr(lhs, sc), self.shape_expr(rhs, sc)
                checked = op != "/" or DType.ERROR in (a.dtype, b.dtype)
                if not checked and not self.check_divisor(e, b):
                    return ir.Lit(1, DType.ERROR)
                return ir.BinOp(op, a, b, DType.U32)
        self.err(e.span, "a dimension must be an integer, a constant, or + - * / of those")
        return ir.Lit(1, DType.ERROR)

    # --- launch --------------------------------------------------------------------------------
    def launch(self, r: S.Region) -> ir.Launch | None:
        items: dict[str, S.LaunchItem] = {}
        ok = True
        for it in r.launch:
            if it.key not in LAUNCH_KEYS:
                self.err(
                    it.span,
                    f"unknown launch parameter '{it.key}'",
                    f"launch parameters: {', '.join(LAUNCH_KEYS)}",
                )
                ok = False
            elif it.key in items:
                self.err(it.span, f"launch parameter '{it.key}' is given twice")
                ok = False
            items[it.key] = it
        if "workgroup" not in items:
            self.err(
                r.name_span,
                f"region '{r.name}' has no launch workgroup size",
                "add a line such as: launch workgroup 256, subgroup any",
            )
            return None
        wg_item = items["workgroup"]
        wg = wg_item.values[0] if wg_item.kind == "int" else 0
        if wg_item.kind != "int" or not _pow2(wg) or wg > MAX_WORKGROUP_SIZE:
            self.err(
                wg_item.span,
                f"workgroup size must be a power of two from 1 to "
                f"{MAX_WORKGROUP_SIZE}, not {wg or wg_item.kind}",
                "use 64, 128 or 256",
            )
            return None
        sg_req = ir.SubgroupReq("any", ())
        if "subgroup" in items:
            it = items["subgroup"]
            kind = "choice" if it.kind == "int" else it.kind
            sizes = it.values
            for s in sizes:
                if not _pow2(s) or s > 128:
                    self.err(
                        it.span,
                        f"subgroup size must be a power of two up to 128, not {s}",
                        "devices offer 4 to 128 lanes per subgroup",
                    )
                    ok = False
                elif s > wg:
                    self.err(
                        it.span,
                        f"subgroup size {s} is larger than the workgroup ({wg})",
                        f"raise the workgroup size to at least {s}",
                    )
                    ok = False
            if it.fallback is not None and it.fallback != "shared":
                self.err(
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
                self.err(
                    it.span,
                    f"rows_per_subgroup must be from 1 to 16, not {shown}",
                    "2 or 4 keep enough loads in flight",
                )
                ok = False
        return ir.Launch(wg, sg_req, rows) if ok else None

    # --- budget --------------------------------------------------------------------------------
    def budget(self, r: S.Region) -> tuple[ir.BudgetRule, ...]:
        rules: list[ir.BudgetRule] = []
        ops = {"waves": ">=", "vgprs": "<=", "spills": "<="}
        ranges = {"waves": (1, 16), "vgprs": (1, 256), "spills": (0, 4096)}
        for it in r.budget:
            if it.key not in ops:
                self.err(
                    it.span,
                    f"unknown budget limit '{it.key}'",
                    "budget limits: waves >= N, vgprs <= N, spills <= N",
                )
                continue
            if it.op != ops[it.key]:
                self.err(
                    it.span,
                    f"budget '{it.key}' takes '{ops[it.key]}', not '{it.op}'",
                    f"write {it.key} {ops[it.key]} {it.value.value}",
                )
                continue
            lo, hi = ranges[it.key]
            if not it.value.is_int or not lo <= int(it.value.value) <= hi:
                self.err(
                    it.value.span,
                    f"impossible budget: {it.key} {it.op} {it.value.value}",
                    f"{it.key} must be an integer from {lo} to {hi}",
                )
                continue
            if (
                it.target is not None
                and self.known_targets is not None
                and it.target not in self.known_targets
            ):
                self.err(
                    it.target_span,
                    f"unknown target '{it.target}'",
                    "known targets: " + ", ".join(self.known_targets),
                )
                continue
            rules.append(ir.BudgetRule(it.key, int(it.value.value), it.target, span=it.span))
        return tuple(rules)

    # --- stages --------------------------------------------------------------------------------
    def target_buffer(self, st: S.Stage, sc: _Scope) -> tuple[bool, ir.Buffer | None]:
        """The output a stage writes (None for an intermediate); False when the left side
        names an input or an output already written."""
        out_buf = sc.buffers.get(st.name)
        if out_buf is not None and not out_buf.is_output:
            self.err(
                st.name_span,
                f"cannot assign to input '{st.name}'",
                "inputs are read-only; name the result differently",
            )
            return False, None
        if out_buf is not None and any(s.output is out_buf for s in sc.stages.values()):
            self.err(
                st.name_span,
                f"output '{st.name}' is assigned twice",
                "each output is written by exactly one stage",
            )
            return False, None
        return True, out_buf

    def check_version_names(self, r: S.Region) -> None:
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
                self.err(
                    span,
                    f"'{name}' is the name fusec gives a later value of '{value}', which is "
                    f"assigned {count[value]} times",
                    f"rename '{name}'",
                )
                return

    def tile_stage(self, st: S.Stage, sc: _Scope) -> ir.Stage | None:
        """A stage of a tile region: a bare name is a per-lane tile value (may be assigned
        again); an output is stored with the tile's indices."""
        tile = self.tile
        assert tile is not None
        if st.stored is not None:
            self.err(
                st.stored.span,
                f"a tile value lives in registers; it cannot be stored as {st.stored.id}",
                f"drop 'as {st.stored.id}'",
            )
            return None
        n_before = len(self.diags)
        names = {v.name: v for v in (tile.per, *tile.dims)}
        ok, out_buf = self.target_buffer(st, sc)
        if not ok:
            return None
        if st.indices or out_buf is not None:
            if out_buf is None:
                self.err(
                    st.name_span,
                    f"'{st.name}' is not an output; in a tile region, values are written bare",
                    f"write {st.name} = ...",
                )
                return None
            wanted = list(names)
            got = [ix.id for ix in st.indices]
            if sorted(got) != sorted(wanted):
                self.err(
                    st.name_span,
                    f"output '{st.name}' of a tile region must be indexed by "
                    f"the tile's indices ({', '.join(wanted)}), not ({', '.join(got)})",
                    f"write {st.name}[{', '.join(names)}]",
                )
                return None
            if len(out_buf.shape) != len(got):
                self.err(
                    st.name_span,
                    f"output '{st.name}' has {len(out_buf.shape)} "
                    f"dimension(s) but the stage writes {len(got)}",
                )
                return None
            values = {c.name: c.default for c in sc.consts.values()}
            for ix, dim in zip(st.indices, out_buf.shape, strict=True):
                var = names[ix.id]
                if var is tile.per:
                    if dim != var.extent:
                        self.err(
                            ix.span,
                            f"shape mismatch: '{ix.id}' ranges over "
                            f"{ir.format_expr(var.extent)} but dimension of "
                            f"'{st.name}' is {ir.format_expr(dim)}",
                        )
                        return None
                elif ir.evaluate_int(dim, values) != tile.extent_of(var):
                    self.err(
                        ix.span,
                        f"shape mismatch: tile index '{ix.id}' has "
                        f"{tile.extent_of(var)} values but the dimension of '{st.name}' "
                        f"is {ir.format_expr(dim)}",
                    )
                    return None
            indices = tuple(names[ix.id] for ix in st.indices)
            name, var_name = st.name, st.name
        else:
            prior = sc.latest.get(st.name)
            if prior is not None and prior.indices == (tile.per, *tile.dims):
                n = sum(1 for x in sc.stages.values() if x.var == st.name)
                name, var_name = f"{st.name}.{n}", st.name
            elif not self.declare(sc, st.name, st.name_span, "stage"):
                return None
            else:
                name, var_name = st.name, st.name
            indices = (tile.per, *tile.dims)
        env = dict(names)
        value = self.expr(st.value, sc, env, reduce_ok=True, row_vars=())
        if len(self.diags) > n_before or value.dtype == DType.ERROR:
            return None
        placement = Placement.GLOBAL if out_buf is not None else Placement.REGISTER
        return ir.Stage(
            name, indices, value, value.dtype, placement, None, out_buf, span=st.span, var=var_name
        )

    def stage(self, st: S.Stage, sc: _Scope, launch: ir.Launch | None) -> ir.Stage | None:
        if self.tile is not None:
            return self.tile_stage(st, sc)
        n_before = len(self.diags)
        ok, out_buf = self.target_buffer(st, sc)
        if not ok:
            return None
        if out_buf is None and not self.declare(sc, st.name, st.name_span, "stage"):
            return None
        placement = Placement.GLOBAL if out_buf is not None else Placement.REGISTER
        if st.placement is not None:
            try:
                placement = Placement(st.placement.id)
            except ValueError:
                self.err(
                    st.placement.span,
                    f"unknown placement '{st.placement.id}'",
                    "placements: register, shared, global, slices",
                )
                return None
            if out_buf is not None and placement != Placement.GLOBAL:
                self.err(
                    st.placement.span,
                    f"output '{st.name}' lives in global memory; it "
                    f"cannot be placed in {placement.value}",
                    "drop the placement, or compute an intermediate and copy it out",
                )
                return None
        # a state output may be written at a fixed position: `kc[k, pos, d] = ...`
        fixed: dict[int, ir.Expr] = {}
        for i, ix in enumerate(st.indices):
            c = sc.consts.get(ix.id)
            if c is None:
                continue
            if out_buf is None or not out_buf.state:
                self.err(
                    ix.span,
                    f"'{ix.id}' is a {'run-time parameter' if c.runtime else 'constant'}; "
                    "only a state output is written at a fixed index",
                    f"declare the output as state ({st.name}: state f32[...]), or index by name",
                )
                return None
            if not c.dtype.is_int:
                self.err(ix.span, f"index '{ix.id}' must be an integer, not {c.dtype.value}")
                return None
            fixed[i] = ir.ConstRef(c)
        free = [ix for i, ix in enumerate(st.indices) if i not in fixed]
        # index variables of the left side
        infos: dict[str, _IndexInfo] = {}
        for ix in free:
            if ix.id in infos:
                self.err(ix.span, f"index '{ix.id}' appears twice on the left side")
                return None
            if ix.id in sc.decl_spans or ix.id in sc.buffers:
                self.err(
                    ix.span,
                    f"index '{ix.id}' shadows a declaration of the same name",
                    "use a different index name",
                )
                return None
            infos[ix.id] = _IndexInfo(ix.id, ix.span)
        for ix in free:
            if ix.id in st.extents:
                infos[ix.id].extent = self.shape_expr(st.extents[ix.id], sc)
                infos[ix.id].extent_origin = ix.span
                infos[ix.id].explicit = True
        if out_buf is not None:
            if len(out_buf.shape) != len(st.indices):
                self.err(
                    st.name_span,
                    f"output '{st.name}' has {len(out_buf.shape)} "
                    f"dimension(s) but the stage writes {len(st.indices)}",
                    f"write {st.name}[" + ", ".join("ijkl"[: len(out_buf.shape)]) + "]",
                )
                return None
            for i, (ix, dim) in enumerate(zip(st.indices, out_buf.shape, strict=True)):
                if i not in fixed:
                    infos[ix.id].extent = dim
                    infos[ix.id].extent_origin = out_buf.span
        if out_buf is not None and len(out_buf.shape) == len(st.indices):
            for i, pos_expr in fixed.items():
                if not self.check_index(st.indices[i], pos_expr, out_buf.shape[i], st.name, i):
                    return None
            if self.per is not None and not self.check_per_output(st, out_buf, free):
                return None
        if out_buf is not None and out_buf.state and not fixed:
            self.err(
                st.name_span,
                f"state output '{st.name}' is written whole; write part of it at a fixed index",
                f"write e.g. {st.name}[k, pos, d] = ... with a run-time parameter pos",
            )
            return None
        # infer extents from uses, then type the value with the variables bound
        self.infer(st.value, sc, infos, set(infos))
        if self.per is not None and self.per.name in infos:
            infos[self.per.name].extent = self.per.extent  # the workgroup's own index
        for ix in free:
            info = infos[ix.id]
            if self.per is not None and ix.id == self.per.name:
                info.var = self.per
                continue
            if info.extent is None:
                self.err(
                    ix.span,
                    f"cannot infer the extent of index '{ix.id}'",
                    f"use '{ix.id}' directly as an index of an input on the right side",
                )
                return None
            info.var = ir.IndexVar(ix.id, info.extent, span=ix.span)
        if len(self.diags) > n_before:
            return None
        env = {name: info.var for name, info in infos.items() if info.var is not None}
        if self.per is not None:
            env[self.per.name] = self.per
        value = self.expr(
            st.value,
            sc,
            env,
            reduce_ok=True,
            row_vars=tuple(v for v in env.values() if v is not self.per),
        )
        if len(self.diags) > n_before or value.dtype == DType.ERROR:
            return None
        if out_buf is not None and value.dtype.is_int:
            self.err(
                st.value.span,
                f"dtype mismatch: output '{st.name}' is "
                f"{out_buf.dtype.value} but the value is {value.dtype.value}",
                "convert with an arithmetic float expression, e.g. multiply by 1.0",
            )
            return None
        n_layout = len(self.diags)
        layout = self.layout(st, env, value)
        if len(self.diags) > n_layout:
            return None
        if layout is not None and layout.row_unit == Scope.WORKGROUP:
            # every lane of the workgroup strides over the reduced index of the same rows
            item = next(it for it in st.layout if it.unit == "workgroup")
            if placement in (Placement.SHARED, Placement.SLICES) or self.per is not None:
                self.err(
                    item.span,
                    "rows -> workgroup needs a stage kept in registers or global memory, "
                    "in a grid region",
                    "use rows -> subgroup for shared values and per-workgroup regions",
                )
                return None
            if launch is not None and launch.rows_per_subgroup > 4:
                self.err(
                    item.span,
                    f"rows -> workgroup takes at most 4 rows at a time, not "
                    f"{launch.rows_per_subgroup}",
                    "lower rows_per_subgroup",
                )
                return None
        if placement == Placement.SLICES and not self.check_slices(st, free, layout):
            return None
        indices = tuple(env[ix.id] for ix in free)
        out_index = (
            tuple(fixed.get(i) or ir.IndexRef(env[ix.id]) for i, ix in enumerate(st.indices))
            if fixed
            else None
        )
        if self.per is not None and out_buf is None:
            indices = (self.per, *indices)  # implicitly indexed by the workgroup's value
        stored = self.stored(st, placement, indices, value, launch)
        if len(self.diags) > n_layout:
            return None
        stage = ir.Stage(
            st.name,
            indices,
            value,
            value.dtype,
            placement,
            layout,
            out_buf,
            span=st.span,
            var=st.name,
            out_index=out_index,
            stored=stored,
        )
        if placement == Placement.SHARED:
            self.check_shared(stage, st, sc)
        depth = self.inlined_depth(value)
        if depth > MAX_INLINED_DEPTH:
            self.err(
                st.span,
                f"'{st.name}' must be nested at most {MAX_INLINED_DEPTH} levels deep with the "
                f"register stages it reads substituted, not {depth}",
                "a register stage is recomputed where it is read: place one of those it reads "
                "in shared memory (in shared)",
            )
            return None
        if placement == Placement.REGISTER and not stage.is_scalar:
            self.depths[stage] = depth
        return stage

    def check_slices(self, st: S.Stage, free: list[S.Name], layout: ir.Layout | None) -> bool:
        """`in slices`: each workgroup keeps the rows of one index that its subgroups computed,
        for a later sum over that index (codegen/lower.py `slice_stage`, `split_k`)."""
        assert st.placement is not None
        problem = None
        if self.per is not None:
            problem = "a stage in slices needs a grid region, not a per-workgroup one"
        elif not free:
            problem = f"'{st.name}' has no index to slice"
        elif len(free) > 1:
            problem = f"'{st.name}' has {len(free)} indices; a stage in slices has one"
        elif layout is not None and layout.row_unit == Scope.LANE:
            problem = f"the rows of '{st.name}' must go to subgroups to be sliced, not to lanes"
        if problem is None:
            return True
        self.err(
            st.placement.span,
            problem,
            "in slices keeps the rows of a one-index stage, e.g. h[f] = ... in slices, for a "
            "later sum over f; otherwise place it in shared or global",
        )
        return False

    def check_slice_readers(self, stages: list[ir.Stage]) -> None:
        """A stage in slices is only in the memory of the workgroup that computed each slice:
        only a sum over its index into an output (split-K, float atomics) can read it."""
        for x in stages:
            sliced = {
                e.stage
                for e in ir.walk(x.value)
                if isinstance(e, ir.StageRef) and e.stage.placement == Placement.SLICES
            }
            if not sliced:
                continue
            red = x.value
            ok = (
                x.output is not None
                and x.output.dtype == DType.F32
                and x.out_index is None
                and len(x.indices) == 1
                and len(sliced) == 1
                and isinstance(red, ir.Reduce)
                and red.op == "sum"
                and all(
                    e.indices == (ir.IndexRef(red.var),)
                    for e in ir.walk(red.body)
                    if isinstance(e, ir.StageRef) and e.stage in sliced
                )
            )
            if ok:
                continue
            name = min(s.name for s in sliced)
            self.err(
                x.span,
                f"'{name}' is in slices: only an f32 output of one index that sums over the "
                f"index of '{name}' can read it",
                f"write e.g. y[n] = sum(f: W[n, f] * {name}[f]), or place '{name}' in shared or "
                "global",
            )

    def check_per_output(self, st: S.Stage, out_buf: ir.Buffer, free: list[S.Name]) -> bool:
        """In a per-workgroup region each workgroup stores the part of an output at its own
        value of the per index: that index comes first among the output's indices (the fixed
        ones of a state output aside), and its dimension holds every value."""
        per = self.per
        assert per is not None
        if not free or free[0].id != per.name:
            self.err(
                free[0].span if free else st.name_span,
                f"output '{st.name}' of a per-workgroup region must be indexed by '{per.name}' "
                "first" + (f", not by '{free[0].id}'" if free else ""),
                f"each workgroup stores the part of '{st.name}' at its own '{per.name}': write "
                f"{st.name}[{per.name}, ...], or compute '{st.name}' in a region without "
                "'per workgroup'",
            )
            return False
        pos = next(i for i, ix in enumerate(st.indices) if ix is free[0])
        return self.check_index(free[0], ir.IndexRef(per), out_buf.shape[pos], st.name, pos)

    def stored(
        self,
        st: S.Stage,
        placement: Placement,
        indices: tuple[ir.IndexVar, ...],
        value: ir.Expr,
        launch: ir.Launch | None,
    ) -> DType | None:
        """`in shared as q8_0`: a one-index shared stage of elementwise values, kept as q8_0
        blocks along its index (the last block padded with zeros)."""
        if st.stored is None:
            return None
        name = st.stored.id
        if name != DType.Q8_0.value:
            self.err(
                st.stored.span,
                f"a stage cannot be stored as '{name}'",
                "stages are stored as f32 (the default) or q8_0: write 'as q8_0'",
            )
            return None
        if placement != Placement.SHARED:
            self.err(
                st.stored.span,
                f"only a shared stage is stored as q8_0; '{st.name}' is in {placement.value}",
                f"write '{st.name}[...] = ... in shared as q8_0'",
            )
            return None
        if self.per is not None or len(indices) != 1:
            self.err(
                st.name_span,
                f"a q8_0 stage has exactly one index, its blocks' direction; '{st.name}' has "
                f"{len(indices)}" + (" (with the per-workgroup index)" if self.per else ""),
                "quantize a vector, e.g. xq[k] = x[k] in shared as q8_0, in a grid region",
            )
            return None
        if any(r.scope != Scope.LANE for r in ir.walk(value) if isinstance(r, ir.Reduce)):
            self.err(
                st.value.span,
                f"'{st.name}' holds a reduction across lanes; a q8_0 stage is quantized "
                "elementwise, 4 lanes per block",
                "compute the reduction in an earlier stage, then quantize its result",
            )
            return None
        if launch is not None and launch.workgroup_size < 4:
            self.err(
                st.stored.span,
                f"a q8_0 stage is quantized by 4 lanes per block; the workgroup has "
                f"{launch.workgroup_size}",
                "launch a workgroup of at least 4",
            )
            return None
        return DType.Q8_0

    def check_shared(self, stage: ir.Stage, st: S.Stage, sc: _Scope) -> None:
        defaults: dict[str, int | float] = {c.name: c.default for c in sc.consts.values()}
        ranges = {
            c.name: (
                int(c.lo if c.lo is not None else c.default),
                int(c.hi if c.hi is not None else c.default),
            )
            for c in sc.consts.values()
            if c.dtype.is_int
        }
        for values in (defaults, None):
            count = 1
            for dim in self.visible_shape(stage):
                count *= (
                    ir.evaluate_int(dim, values)
                    if values is not None
                    else ir.bounds_int(dim, ranges)[1]
                )
            # q8_0: per 32-element block, 32 int8 quants, the scale and the sum of the quants
            size = -(-count // QUANT_BLOCK) * Q8_SHARED_WORDS * 4 if stage.stored else count * 4
            if size > self.shared_limit:
                dims = ", ".join(ir.format_expr(d) for d in self.visible_shape(stage)) or "scalar"
                need = (
                    f"needs {size} bytes at the default constants"
                    if values is not None
                    else f"may need up to {size} bytes over the constants' ranges"
                )
                self.err(
                    st.span,
                    f"shared intermediate '{stage.name}' [{dims}] {need}, more than the "
                    f"{self.shared_limit}-byte shared-memory limit",
                    "place it in register (recomputed where used) or global, or lower the "
                    "constant's range",
                )
                return

    def layout(self, st: S.Stage, env: dict[str, ir.IndexVar], value: ir.Expr) -> ir.Layout | None:
        """The stage's layout, None when it gives none (lowering then takes the layout of the
        register stages it inlines, or the default: rows -> subgroup, one element per lane)."""
        if not st.layout:
            return None
        row_unit = Scope.SUBGROUP
        vector = 1
        reduce_vars = {r.var.name for r in ir.walk(value) if isinstance(r, ir.Reduce)}
        for it in st.layout:
            if it.index in env:
                if it.unit not in ("subgroup", "lane", "workgroup"):
                    self.err(
                        it.span,
                        f"row index '{it.index}' can map to subgroup, lane or workgroup, "
                        f"not '{it.unit}'",
                        "rows -> subgroup spreads K over lanes",
                    )
                    return None
                if it.vector != 1:
                    self.err(it.span, "rows take no vector width", f"write {it.index} -> {it.unit}")
                    return None
                row_unit = Scope(it.unit)
            elif it.index in reduce_vars:
                if it.unit != "lane":
                    self.err(
                        it.span,
                        f"reduced index '{it.index}' maps to lane, not '{it.unit}'",
                        f"write {it.index} -> lane x 4",
                    )
                    return None
                if not _pow2(it.vector) or it.vector > 32:
                    self.err(
                        it.span,
                        f"vector width must be a power of two up to 32, not {it.vector}",
                        "4 or 8 elements per lane per load",
                    )
                    return None
                vector = it.vector
            else:
                known = ", ".join(sorted(set(env) | reduce_vars)) or "none"
                self.err(
                    it.span,
                    f"layout names index '{it.index}', which this stage does not have",
                    f"indices of this stage: {known}",
                )
                return None
        return ir.Layout(row_unit, vector)

    # --- index arithmetic ------------------------------------------------------------------------
    def check_index(self, ix: S.Expr, index: ir.Expr, dim: ir.Expr, name: str, pos: int) -> bool:
        """An index of `name`'s dimension `pos` must stay within 0 .. dim - 1 (at the settings
        of the constants dsl/bounds.py tries).  Reports and returns False when it does not."""
        if isinstance(index, ir.IndexRef) and index.var.extent == dim:
            return True  # an index variable over the dimension itself
        if any(x.dtype == DType.ERROR for x in ir.walk(dim)):
            return True  # a dimension already diagnosed
        for setting in self.settings:
            w = bounds.find_overrun(index, dim, setting)
            if w is None:
                continue
            where = _where(w, index, dim)
            shown = ir.format_expr(dim)
            fixed = isinstance(dim, ir.Lit)
            limit = shown if fixed else f"{shown} = {w.limit}"
            last = w.limit - 1 if fixed else f"{shown} - 1"
            if w.exact < 0:
                self.err(
                    ix.span,
                    f"index '{_text(ix.span)}' of '{name}' must be at least 0, not "
                    f"{w.exact}{where}",
                    f"indices are unsigned 32-bit: {w.exact} wraps around to {w.value}, far "
                    "past the end; keep every index at 0 or above",
                )
            elif w.exact > U32_MAX:
                self.err(
                    ix.span,
                    f"index '{_text(ix.span)}' of '{name}' must be below {limit}, not "
                    f"{w.exact}{where}",
                    f"indices are unsigned 32-bit: {w.exact} wraps around to {w.value}, "
                    f"another element than the one meant; keep the index within 0 .. {last}",
                )
            else:
                self.err(
                    ix.span,
                    f"index '{_text(ix.span)}' of '{name}' must be below {limit}, not "
                    f"{w.value if w.value >= w.limit else w.exact}{where}",
                    f"dimension {pos} of '{name}' has {shown} elements: keep the index within "
                    f"0 .. {last}" + ("" if fixed else " for every value of the constants"),
                )
            return False
        return True

    def check_divisor(self, e: S.BinOp, divisor: ir.Expr) -> bool:
        """An integer divisor must not be 0 (at the settings of the constants dsl/bounds.py
        tries).  Reports and returns False when it can be."""
        for setting in self.settings:
            w = bounds.find_zero(divisor, setting)
            if w is None:
                continue
            variables = [v.name for v in bounds.index_vars(divisor)]
            consts = sorted({x.const.name for x in ir.walk(divisor) if isinstance(x, ir.ConstRef)})
            if variables:
                hint = f"keep the divisor at 1 or above for every value of {', '.join(variables)}"
            elif consts:
                of = ", ".join(consts)
                hint = f"keep the divisor at 1 or above: change the value or range of {of}"
            else:
                hint = "divide by a number of 1 or more"
            self.err(
                e.rhs.span,
                f"divisor of '{_text(e.span)}' must not be 0{_where(w, divisor)}",
                hint,
            )
            return False
        return True

    def inlined_depth(self, e: ir.Expr) -> int:
        """The depth of `e` once the indexed register stages it reads are substituted (lowering
        recomputes them where they are read)."""
        below = [self.inlined_depth(c) for c in ir.children(e)]
        if isinstance(e, ir.StageRef) and e.stage in self.depths:
            below.append(self.depths[e.stage])
        return 1 + max(below, default=0)

    # --- extent inference ------------------------------------------------------------------------
    def infer(self, e: S.Expr, sc: _Scope, infos: dict[str, _IndexInfo], bound: set[str]) -> None:
        """Record, for every index variable used directly as a subscript, the dimension it meets."""
        match e:
            case S.Access(name, indices):
                shape: tuple[ir.Expr, ...] | None = None
                if name in sc.buffers:
                    shape = sc.buffers[name].shape
                elif name in sc.stages:
                    shape = self.visible_shape(sc.stages[name])
                if shape is not None and len(shape) != len(indices):
                    shape = None  # the index count is diagnosed when the access is typed
                for pos, ix in enumerate(indices):
                    if (
                        isinstance(ix, S.Name)
                        and ix.id in infos
                        and ix.id in bound
                        and shape is not None
                        and pos < len(shape)
                    ):
                        info = infos[ix.id]
                        dim = shape[pos]
                        if info.extent is None:
                            info.extent, info.extent_origin = dim, ix.span
                        elif (
                            info.extent != dim
                            and not info.explicit
                            and DType.ERROR not in (info.extent.dtype, dim.dtype)
                        ):
                            was = ir.format_expr(info.extent)
                            line = info.extent_origin.line_col()[0] if info.extent_origin else 0
                            self.err(
                                ix.span,
                                f"shape mismatch: index '{ix.id}' ranges over "
                                f"{was} (line {line}) but dimension {pos} of '{name}' is "
                                f"{ir.format_expr(dim)}",
                                "index each dimension with a variable of the same extent",
                            )
                    else:
                        self.infer(ix, sc, infos, bound)
            case S.Reduce(_, index, body):
                if index in bound:
                    self.err(
                        e.index_span,
                        f"reduction index '{index}' is already bound by "
                        "the stage or an enclosing reduction",
                        "use a fresh index name",
                    )
                    return
                # a fresh variable per reduction: two reductions may reuse a name with
                # different extents; outer variables stay shared (same objects)
                infos_inner = {**infos, index: _IndexInfo(index, e.index_span)}
                self.infer(body, sc, infos_inner, bound | {index})
            case S.Call(_, args):
                for a in args:
                    self.infer(a, sc, infos, bound)
            case S.BinOp(_, lhs, rhs):
                self.infer(lhs, sc, infos, bound)
                self.infer(rhs, sc, infos, bound)
            case S.Neg(v):
                self.infer(v, sc, infos, bound)
            case _:
                pass

    # --- expressions ---------------------------------------------------------------------------
    def expr(
        self,
        e: S.Expr,
        sc: _Scope,
        env: dict[str, ir.IndexVar],
        reduce_ok: bool,
        row_vars: tuple[ir.IndexVar, ...],
        infos: dict[str, _IndexInfo] | None = None,
    ) -> ir.Expr:
        bad = ir.Lit(0, DType.ERROR)
        match e:
            case S.Num(v, is_int):
                return ir.Lit(v, DType.U32 if is_int else DType.F32)
            case S.Name(name):
                if name in env:
                    return ir.IndexRef(env[name])
                if name in sc.consts:
                    return ir.ConstRef(sc.consts[name])
                if self.is_tile_value(name, sc):
                    stage = sc.latest[name]
                    if any(v.name not in env for v in stage.indices):
                        self.err(
                            e.span,
                            f"tile value '{name}' cannot be read here",
                            "a tile value is read in a stage's value, at its lane's element",
                        )
                        return bad
                    # a tile value, at this lane's (or a reduction's rebound) coordinates
                    return ir.StageRef(
                        stage, tuple(ir.IndexRef(env[v.name]) for v in stage.indices)
                    )
                if name in sc.stages:
                    stage = sc.stages[name]
                    if stage.output is not None:
                        # as for an indexed output (S.Access below): the fused kernel writes
                        # an output and keeps no value of it to read
                        self.err(
                            e.span,
                            f"output '{name}' cannot be read",
                            f"compute it as an intermediate first (e.g. {name}_v = ...), then "
                            f"write {name} = {name}_v and read {name}_v",
                        )
                        return bad
                    if self.per is not None and stage.indices == (self.per,):
                        return ir.StageRef(stage, (ir.IndexRef(self.per),))
                    if not stage.is_scalar:
                        self.err(
                            e.span,
                            f"'{name}' has {len(stage.indices)} index(es); write " + f"{name}[...]",
                        )
                        return bad
                    return ir.StageRef(stage, ())
                if name in sc.buffers:
                    buf = sc.buffers[name]
                    self.err(
                        e.span,
                        f"'{name}' is a buffer of {len(buf.shape)} dimension(s); index it",
                        f"write {name}[...]",
                    )
                    return bad
                if name not in sc.poisoned:
                    self.err(
                        e.span,
                        f"unknown name '{name}'",
                        "index names are bound by the stage's left side or by a reduction",
                    )
                return bad
            case S.Access(name, indices):
                shape: tuple[ir.Expr, ...]
                if name in sc.buffers:
                    buf = sc.buffers[name]
                    if buf.is_output:
                        self.err(
                            e.name_span,
                            f"output '{name}' cannot be read",
                            "read the stage's value through an intermediate instead",
                        )
                        return bad
                    shape = buf.shape
                elif name in sc.stages:
                    shape = self.visible_shape(sc.stages[name])
                elif name in env or name in sc.consts:
                    self.err(e.name_span, f"'{name}' is not indexable")
                    return bad
                elif name in sc.poisoned:
                    return bad
                else:
                    self.err(
                        e.name_span,
                        f"unknown name '{name}'",
                        "inputs come from the region signature; stages must be defined "
                        "before they are used",
                    )
                    return bad
                if len(indices) != len(shape):
                    self.err(
                        e.span,
                        f"'{name}' has {len(shape)} dimension(s) but is indexed "
                        f"with {len(indices)}",
                    )
                    return bad
                idx: list[ir.Expr] = []
                for pos, (ix, size) in enumerate(zip(indices, shape, strict=True)):
                    iv = self.expr(ix, sc, env, False, row_vars)
                    if iv.dtype == DType.ERROR:
                        return bad
                    if not iv.dtype.is_int:
                        self.err(
                            ix.span,
                            f"dtype mismatch: an index must be an integer, not {iv.dtype.value}",
                            "index with index variables, integer constants and + - * / % of those",
                        )
                        return bad
                    if not self.check_index(ix, iv, size, name, pos):
                        return bad
                    idx.append(iv)
                if name in sc.buffers:
                    return ir.Load(sc.buffers[name], tuple(idx))
                target = sc.stages[name]
                if self.per is not None and target.indices[:1] == (self.per,):
                    idx.insert(0, ir.IndexRef(self.per))  # the workgroup's own value
                return ir.StageRef(target, tuple(idx))
            case S.Call(fn, args):
                if fn in ("sum",):
                    self.err(e.span, f"'{fn}' is a reduction: write {fn}(k: ...)")
                    return bad
                if fn in EXCHANGE_FUNCTIONS:
                    return self.exchange(e, sc, env, reduce_ok, row_vars)
                arity = FUNCTIONS.get(fn)
                if arity is None:
                    self.err(
                        e.span,
                        f"unknown function '{fn}'",
                        "functions: " + ", ".join(sorted(FUNCTIONS)),
                    )
                    return bad
                if len(args) != arity:
                    self.err(
                        e.span,
                        f"'{fn}' takes {arity} argument(s), not {len(args)}",
                        "write " + _CALL_FORMS.get(fn, f"{fn}(" + ", ".join("xyz"[:arity]) + ")"),
                    )
                    return bad
                vals = [self.expr(a, sc, env, reduce_ok, row_vars) for a in args]
                if any(v.dtype == DType.ERROR for v in vals):
                    return bad
                return ir.Call(fn, tuple(vals), DType.F32)
            case S.BinOp(op, lhs, rhs):
                a = self.expr(lhs, sc, env, reduce_ok, row_vars)
                b = self.expr(rhs, sc, env, reduce_ok, row_vars)
                if DType.ERROR in (a.dtype, b.dtype):
                    return bad
                if op in ("&&", "||"):
                    # select(a, b != 0, 0) and select(a, 1, b != 0): 1.0 or 0.0, like a comparison
                    zero, one = ir.Lit(0.0, DType.F32), ir.Lit(1.0, DType.F32)
                    other = ir.BinOp("!=", b, zero, DType.F32)
                    pick = (other, zero) if op == "&&" else (one, other)
                    return ir.Call("select", (a, *pick), DType.F32)
                dtype = DType.U32 if a.dtype.is_int and b.dtype.is_int else DType.F32
                if op in COMPARE_OPS:
                    dtype = DType.F32  # 1.0 or 0.0, for select() and arithmetic
                if op == "%" and dtype != DType.U32:
                    self.err(
                        e.span,
                        "dtype mismatch: '%' takes integers, not "
                        f"{a.dtype.value} and {b.dtype.value}",
                    )
                    return bad
                if op in ("/", "%") and dtype == DType.U32 and not self.check_divisor(e, b):
                    return bad
                return ir.BinOp(op, a, b, dtype)
            case S.Neg(v):
                inner = self.expr(v, sc, env, reduce_ok, row_vars)
                if inner.dtype.is_int:
                    # a real: integer arithmetic is unsigned 32-bit, where `0u - 1u` wraps
                    # around to 4294967295, so `x[i] * -1` multiplied by that (docs/FUZZING.md);
                    # an index or a repeat count never wants a negated integer either
                    return ir.BinOp("-", ir.Lit(0.0, DType.F32), inner, DType.F32)
                return ir.Neg(inner) if inner.dtype != DType.ERROR else bad
            case S.Reduce(op, index, body):
                if op not in REDUCERS:
                    self.err(e.span, f"unknown reduction '{op}'")
                    return bad
                if not reduce_ok:
                    self.err(e.span, "a reduction cannot appear inside an index")
                    return bad
                tile = self.tile
                if tile is not None and index in {v.name for v in tile.dims}:
                    # across the lanes of the tile's group: xor-shuffles or shared memory
                    dim = next(v for v in tile.dims if v.name == index)
                    var = ir.IndexVar(index, dim.extent, span=e.index_span)
                    scope: Scope | None = Scope.SUBGROUP
                else:
                    scope = self.scope(e, row_vars) if tile is None else Scope.LANE
                    if scope is None:
                        return bad
                    extent = self.reduce_extent(e, sc, env)
                    if extent is None:
                        return bad
                    var = ir.IndexVar(index, extent, span=e.index_span)
                inner = self.expr(body, sc, {**env, index: var}, False, row_vars)
                if inner.dtype == DType.ERROR:
                    return bad
                if any(isinstance(x, ir.Reduce) for x in ir.walk(inner)):
                    self.err(
                        body.span,
                        "nested reductions are not supported yet",
                        "compute the inner reduction as its own stage",
                    )
                    return bad
                assert scope is not None
                return ir.Reduce(op, var, inner, scope)
        self.err(getattr(e, "span", None), "unsupported expression")
        return bad

    def exchange(
        self,
        e: S.Call,
        sc: _Scope,
        env: dict[str, ir.IndexVar],
        reduce_ok: bool,
        row_vars: tuple[ir.IndexVar, ...],
    ) -> ir.Expr:
        """shuffle_xor(v, mask), shuffle(v, lane), broadcast(v, lane): lanes of the tile group."""
        bad = ir.Lit(0, DType.ERROR)
        tile = self.tile
        if tile is None:
            self.err(
                e.span,
                f"'{e.fn}' exchanges values between the lanes of a tile",
                "declare a tile: tile (i: 16) lane i, per t",
            )
            return bad
        if len(e.args) != 2:
            self.err(e.span, f"'{e.fn}' takes 2 argument(s), not {len(e.args)}")
            return bad
        value = self.expr(e.args[0], sc, env, reduce_ok, row_vars)
        arg = self.expr(e.args[1], sc, env, False, ())
        if DType.ERROR in (value.dtype, arg.dtype):
            return bad
        if not arg.dtype.is_int or any(isinstance(x, ir.IndexRef) for x in ir.walk(arg)):
            self.err(e.args[1].span, f"the lane argument of '{e.fn}' must be an integer constant")
            return bad
        n = ir.evaluate_int(arg, {c.name: c.default for c in sc.consts.values()})
        group = tile.lanes
        what = "xor mask" if e.fn == "shuffle_xor" else "lane"
        if not 0 <= n < group:
            self.err(
                e.args[1].span,
                f"{what} {n} reaches outside the {group}-lane group of the tile",
                f"the tile spans lanes 0..{group - 1}; use a {what} below {group}",
            )
            return bad
        return ir.Call(e.fn, (value, ir.Lit(n, DType.U32)), DType.F32)

    def scope(self, e: S.Reduce, row_vars: tuple[ir.IndexVar, ...]) -> Scope | None:
        if e.scope is None:
            return Scope.SUBGROUP if row_vars else Scope.WORKGROUP
        try:
            scope = Scope(e.scope)
        except ValueError:
            self.err(
                e.scope_span,
                f"unknown reduction scope '{e.scope}'",
                "scopes: lane, subgroup, workgroup",
            )
            return None
        if row_vars and scope == Scope.WORKGROUP:
            self.err(
                e.scope_span,
                "a reduction inside an indexed stage cannot span the workgroup yet",
                "use @ subgroup (rows -> subgroups) or @ lane",
            )
            return None
        return scope

    def reduce_extent(self, e: S.Reduce, sc: _Scope, env: dict[str, ir.IndexVar]) -> ir.Expr | None:
        if e.extent is not None:
            if e.extent_op != "<":
                self.err(
                    e.index_span,
                    f"write the extent of '{e.index}' as '{e.index} < N', "
                    f"not '{e.index} {e.extent_op} ...'",
                )
                return None
            ext = self.shape_expr(e.extent, sc)
            return None if ext.dtype == DType.ERROR else ext
        infos: dict[str, _IndexInfo] = {e.index: _IndexInfo(e.index, e.index_span)}
        self.infer(e.body, sc, infos, set(env) | {e.index})
        extent = infos[e.index].extent
        if extent is None:
            self.err(
                e.index_span,
                f"reduction over '{e.index}', an index its body never uses as a subscript",
                f"reduce over an index that subscripts an input, e.g. sum({e.index}: x[{e.index}])",
            )
            return None
        return extent


def check(
    module: S.Module,
    shared_limit_bytes: int = DEFAULT_SHARED_LIMIT_BYTES,
    known_targets: Sequence[str] | None = None,
) -> ir.Program:
    """Resolve and check a parsed module.  Raises DiagnosticError with every problem found.
    `known_targets` (from codegen) validates target names in budgets; None skips that check."""
    checker = _Checker(shared_limit_bytes, known_targets)
    seen: dict[str, Span] = {}
    regions = []
    for r in module.regions:
        region = checker.region(r, seen)
        if region is not None:
            regions.append(region)
    if not module.regions:
        checker.err(
            None,
            f"{module.path} defines no region",
            "start one with: region name(x: f32[K]) -> y: f32[K]",
        )
    if checker.diags:
        raise DiagnosticError(checker.diags)
    return ir.Program(module.path, tuple(regions))
