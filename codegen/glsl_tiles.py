"""Tile phases (`kir.TilePhase`): a tile's slots per lane, its body of tile statements and the
exchanges (subgroup shuffles and shared-memory exchanges) between lanes.

Input: a `kir.TilePhase`.  Output: GLSL lines on the kernel writer.  Not done here: lowering of
tiles to phases (`lower_tile.py`)."""

from __future__ import annotations

from fusec.dsl import ir

from . import kir
from .glsl_expr import _Printer, buffer_id, combine, global_invocation
from .glsl_writer import KernelWriter


class TileEmitter(KernelWriter):
    """Emits tile phases."""

    def tile_phase(self, p: kir.TilePhase) -> None:
        tile, g = p.tile, p.tile.lanes
        per = _Printer({}).expr(tile.per.extent)
        self.out("uint li = gl_LocalInvocationIndex;")
        self.out(f"uint lane = li % {g}u;  // lane within the tile's group")
        self.out(f"uint grp = {global_invocation(self.k.workgroup_size)} / {g}u;")
        self.out(
            f"bool live = grp < {per};  // every lane joins every exchange; only live groups store"
        )
        self.out(f"uint tt = min(grp, {per} - 1u);")
        coords = {tile.per.name: "tt"}
        for v, stride in zip(tile.dims, tile.strides, strict=True):
            if stride:
                self.out(f"uint {self.ivar(v)} = (lane / {stride}u) % {tile.extent_of(v)}u;")
                coords[v.name] = self.ivar(v)
        self.tile_coords = coords
        for var in sorted(kir.tile_vars(p.body)):
            self.out(f"float v_{var}[{tile.slots}];  // one register per slot")
        self.tile_body(p, p.body, 1)

    def slot_coords(self, tile: ir.Tile, slot: int) -> dict[str, int]:
        """Values of the slot indices held in `slot`."""
        out = {}
        for v, stride in zip(tile.dims, tile.slot_strides or (0,) * len(tile.dims), strict=True):
            if stride:
                out[v.name] = (slot // stride) % tile.extent_of(v)
        return out

    def tile_printer(self, tile: ir.Tile, value: kir.KExpr, slot: int) -> _Printer:
        slot_values = self.slot_coords(tile, slot)
        env: dict[ir.IndexVar, str] = {}
        for x in kir.kwalk(value):
            var = x.var if isinstance(x, ir.IndexRef | ir.Reduce) else None
            if var is None:
                continue
            if var.name in slot_values:
                env[var] = f"{slot_values[var.name]}u"
            elif var.name in self.tile_coords:
                env[var] = self.tile_coords[var.name]
        return _Printer(env, tile=tile, slot_values=slot_values)

    def tile_body(self, p: kir.TilePhase, body: tuple[kir.TileStmt, ...], indent: int) -> None:
        tile = p.tile
        for st in body:
            match st:
                case kir.TileRepeat(count, inner):
                    n = self.n_red
                    self.n_red += 1
                    cnt = _Printer({}).expr(count)
                    hint = self.serial_hint(count)
                    self.out(f"{hint}for (uint it{n} = 0u; it{n} < {cnt}; ++it{n}) {{", indent)
                    self.tile_body(p, inner, indent + 1)
                    self.out("}", indent)
                case kir.TileAssign(var, value):
                    # every slot first, from the values before this statement
                    results = []
                    for slot in range(tile.slots):
                        pr = self.tile_printer(tile, value, slot)
                        self.tile_exchanges(p, value, pr, indent)
                        name = f"n{self.n_red}"
                        self.n_red += 1
                        self.out(f"float {name} = {pr.as_float(value)};", indent)
                        results.append(name)
                    for slot, name in enumerate(results):
                        self.out(f"v_{var}[{slot}] = {name};", indent)
                case kir.TileStore(buf, indices, value):
                    for slot in range(tile.slots):
                        pr = self.tile_printer(tile, value, slot)
                        self.tile_exchanges(p, value, pr, indent)
                        for v in indices:
                            pr.env[v] = (
                                f"{pr.slot_values[v.name]}u"
                                if v.name in pr.slot_values
                                else self.tile_coords[v.name]
                            )
                        flat = pr.flat(buf.shape, tuple(ir.IndexRef(v) for v in indices))
                        self.out(
                            f"if (live) {{ b_{buffer_id(buf)}[{flat}] = "
                            f"{self.convert(buf, value, pr, indent)}; }}",
                            indent,
                        )

    def tile_exchanges(self, p: kir.TilePhase, value: kir.KExpr, pr: _Printer, indent: int) -> None:
        """Reductions over tile indices and explicit shuffles, into locals first: over a lane
        index by exchange between lanes, over a slot index serially within the lane."""
        tile, g = p.tile, p.tile.lanes
        for x in reversed(kir.kwalk(value)):  # innermost first
            if isinstance(x, ir.Reduce) and x.var.name in pr.slot_values:
                name = f"r{self.n_red}"
                self.n_red += 1
                dim = next(v for v in tile.dims if v.name == x.var.name)
                terms = []
                for d in range(tile.extent_of(dim)):
                    sub = _Printer(
                        {**pr.env, x.var: f"{d}u"},
                        pr.reduce_names,
                        pr.overrides,
                        tile,
                        {**pr.slot_values, dim.name: d},
                    )
                    terms.append(sub.as_float(x.body))
                self.out(f"float {name} = {terms[0]};", indent)
                for t in terms[1:]:
                    self.out(f"{name} = {combine(x.op, name, t)};", indent)
                pr.reduce_names[id(x)] = name
            elif isinstance(x, ir.Reduce) and x.var.name in self.tile_coords:
                dim = next(v for v in tile.dims if v.name == x.var.name)
                stride = tile.strides[tile.dims.index(dim)]
                n = tile.extent_of(dim)
                name = f"r{self.n_red}"
                self.n_red += 1
                body = pr.as_float(x.body)
                if p.exchange == "shuffle":
                    self.out(f"float {name} = {body};", indent)
                    m = stride
                    while m < stride * n:
                        other = f"subgroupShuffleXor({name}, {m}u)"
                        self.out(f"{name} = {combine(x.op, name, other)};", indent)
                        m *= 2
                else:
                    self.out(f"s_exchange[li] = {body};", indent)
                    self.out("barrier();", indent)
                    self.out(f"uint {name}_b = li - {self.ivar(dim)} * {stride}u;", indent)
                    self.out(f"float {name} = s_exchange[{name}_b];", indent)
                    for d in range(1, n):
                        other = f"s_exchange[{name}_b + {d * stride}u]"
                        self.out(f"{name} = {combine(x.op, name, other)};", indent)
                    self.out("barrier();", indent)
                pr.reduce_names[id(x)] = name
            elif isinstance(x, ir.Call) and x.fn in ("shuffle_xor", "shuffle", "broadcast"):
                name = f"x{self.n_red}"
                self.n_red += 1
                v = pr.as_float(x.args[0])
                arg = x.args[1]
                assert isinstance(arg, ir.Lit)
                k = int(arg.value)
                if p.exchange == "shuffle":
                    if x.fn == "shuffle_xor":
                        got = f"subgroupShuffleXor({v}, {k}u)"
                    else:
                        got = f"subgroupShuffle({v}, (gl_SubgroupInvocationID & ~{g - 1}u) | {k}u)"
                    self.out(f"float {name} = {got};", indent)
                else:
                    src = f"li ^ {k}u" if x.fn == "shuffle_xor" else f"(li & ~{g - 1}u) | {k}u"
                    self.out(f"s_exchange[li] = {v};", indent)
                    self.out("barrier();", indent)
                    self.out(f"float {name} = s_exchange[{src}];", indent)
                    self.out("barrier();", indent)
                pr.overrides[id(x)] = name
