"""Tile regions -> kernel IR.

A tile region (`tile (src: 4, dst: 4) lane dst + 4 * src, per t`) holds each tile element in
its own lane; one group of lanes per value of `per`.

`lower_tile_fused(region, exchange)`: one kernel whose phase is the whole tile program.  Tile
values are per-lane registers (a value assigned again, in a `repeat` too, is the same register);
a reduction over a tile index combines lanes: xor-shuffles within a subgroup (`exchange =
"shuffle"`) or through shared memory with barriers (`"shared"`), same results.

`lower_tile_unfused(region)`: one kernel per stage, every tile value in a global buffer, a
reduction over a tile index read back serially by each element; a repeat body's kernels are
marked to run `count` times, and at the end of each iteration the body's last value of each
carried variable is copied to the buffer the next iteration reads.

Not done here: choosing the exchange for a device (the runtime), checks (dsl.check).
"""

from __future__ import annotations

import attrs

from fusec.dsl import ir
from fusec.dsl.types import EXCHANGE_FUNCTIONS, DType, Placement, Scope

from . import kir
from .lower import _KernelBuilder
from .manifest import intermediate_buffer


def _tile_indices(tile: ir.Tile) -> tuple[ir.IndexVar, ...]:
    return (tile.per, *tile.dims)


def _resolve(e: kir.KExpr, tile: ir.Tile, builder: _KernelBuilder) -> kir.KExpr:
    """Tile values become per-lane locals; reductions keep their (tile-index) variables."""
    match e:
        case ir.StageRef(stage, idx) if stage.indices == _tile_indices(tile):
            return kir.TileRef(stage.var, idx)
        case ir.StageRef():
            raise AssertionError(f"a tile region reads only tile values: {e}")
        case ir.ConstRef(c) if c.runtime:
            # a run-time parameter: a word of the params buffer, which this kernel binds
            assert builder.region.params is not None
            builder.read(builder.region.params)
            return e
        case ir.Load(buf, idx):
            builder.read(buf)
            return ir.Load(buf, tuple(_resolve(i, tile, builder) for i in idx))  # type: ignore[misc]
        case ir.Call(fn, args, dt):
            return ir.Call(fn, tuple(_resolve(a, tile, builder) for a in args), dt)  # type: ignore[misc]
        case ir.BinOp(op, lhs, rhs, dt):
            return ir.BinOp(op, _resolve(lhs, tile, builder), _resolve(rhs, tile, builder), dt)  # type: ignore[arg-type]
        case ir.Neg(v):
            return ir.Neg(_resolve(v, tile, builder))  # type: ignore[arg-type]
        case ir.Reduce(op, var, body, scope):
            return ir.Reduce(op, var, _resolve(body, tile, builder), scope)  # type: ignore[arg-type]
    return e


def lower_tile_fused(region: ir.Region, exchange: str) -> list[kir.Kernel]:
    tile = region.tile
    assert tile is not None
    suffix = "" if exchange == "shuffle" else ".shared"
    builder = _KernelBuilder(region, f"{region.name}{suffix}")

    def stmts(items: tuple[ir.Stage | ir.Repeat, ...]) -> tuple[kir.TileStmt, ...]:
        out: list[kir.TileStmt] = []
        for item in items:
            if isinstance(item, ir.Repeat):
                out.append(kir.TileRepeat(item.count, stmts(item.stages), span=item.span))
            elif item.output is not None:
                builder.write(item.output)
                builder.stage_names.append(item.name)
                out.append(
                    kir.TileStore(
                        item.output,
                        item.indices,
                        _resolve(item.value, tile, builder),
                        span=item.span,
                    )
                )
            else:
                out.append(
                    kir.TileAssign(item.var, _resolve(item.value, tile, builder), span=item.span)
                )
        return tuple(out)

    body = stmts(region.stages)
    builder.phases.append(kir.TilePhase(tile, body, exchange, span=region.span))
    lanes = ir.BinOp("*", tile.per.extent, ir.Lit(tile.lanes, DType.U32), DType.U32)
    builder.grid.append(kir.GridItem(lanes, region.launch.workgroup_size, None))
    kernel = builder.finish()
    subgroup = region.launch.subgroup
    if exchange == "shared":
        subgroup = ir.SubgroupReq("any", ())
    return [
        attrs.evolve(
            kernel,
            subgroup=subgroup,
            exchange_scratch=exchange == "shared",
            reduction_scratch=False,
        )
    ]


def _as_lane(e: ir.Expr, tile: ir.Tile) -> ir.Expr:
    """Reductions over tile indices, read back serially from global memory by each element;
    an exchange (`shuffle_xor(v, m)`, `shuffle(v, k)`, `broadcast(v, k)`) reads `v` at the
    partner element's coordinates (`_at_partner`)."""
    match e:
        case ir.Reduce(op, var, body, _):
            return ir.Reduce(op, var, _as_lane(body, tile), Scope.LANE)
        case ir.Call(fn, (value, ir.Lit(lane)), _) if fn in EXCHANGE_FUNCTIONS:
            return _as_lane(_at_partner(value, tile, fn, int(lane), frozenset()), tile)
        case ir.Call(fn, args, dt):
            return ir.Call(fn, tuple(_as_lane(a, tile) for a in args), dt)
        case ir.BinOp(op, lhs, rhs, dt):
            return ir.BinOp(op, _as_lane(lhs, tile), _as_lane(rhs, tile), dt)
        case ir.Neg(v):
            return ir.Neg(_as_lane(v, tile))
        case ir.Load(buf, idx):
            return ir.Load(buf, tuple(_as_lane(i, tile) for i in idx))
        case ir.StageRef(stage, idx):
            return ir.StageRef(stage, tuple(_as_lane(i, tile) for i in idx))
    return e


def _at_partner(e: ir.Expr, tile: ir.Tile, fn: str, lane: int, bound: frozenset[str]) -> ir.Expr:
    """`e` at the partner lane's element: each lane index of the tile (lane = sum of index *
    stride, each index on its own lane bits) becomes `index ^ bits` for shuffle_xor, or the
    constant `bits` for shuffle and broadcast, where bits are that index's bits of `lane`;
    slot indices, `per` and indices a reduction inside `e` binds stay.  Tile indices go by
    name: a reduction over one (`sum(dst: shuffle_xor(v, 1))`) binds a variable of its own."""
    names = [d.name for d in tile.dims]
    match e:
        case ir.IndexRef(var) if var.name not in bound and var.name in names:
            dim = tile.dims[names.index(var.name)]
            stride = tile.strides[names.index(var.name)]
            if not stride:
                return e  # on slots: the partner lane's register of the same slot
            width = 1 << max(0, tile.extent_of(dim) - 1).bit_length()
            bits = ir.Lit((lane // stride) % width, DType.U32)
            return ir.BinOp("^", e, bits, DType.U32) if fn == "shuffle_xor" else bits
        case ir.Reduce(_, var, body, _):
            return attrs.evolve(e, body=_at_partner(body, tile, fn, lane, bound | {var.name}))
        case ir.Call(f, args, dt):
            return ir.Call(f, tuple(_at_partner(a, tile, fn, lane, bound) for a in args), dt)
        case ir.BinOp(op, lhs, rhs, dt):
            return ir.BinOp(
                op,
                _at_partner(lhs, tile, fn, lane, bound),
                _at_partner(rhs, tile, fn, lane, bound),
                dt,
            )
        case ir.Neg(v):
            return ir.Neg(_at_partner(v, tile, fn, lane, bound))
        case ir.Load(buf, idx):
            return ir.Load(buf, tuple(_at_partner(i, tile, fn, lane, bound) for i in idx))
        case ir.StageRef(stage, idx):
            return ir.StageRef(stage, tuple(_at_partner(i, tile, fn, lane, bound) for i in idx))
    return e


def lower_tile_unfused(region: ir.Region) -> list[kir.Kernel]:
    tile = region.tile
    assert tile is not None
    kernels: list[kir.Kernel] = []
    materialized: dict[ir.Stage, ir.Buffer] = {}
    home: dict[ir.Stage, ir.Buffer] = {}  # stage -> the buffer its readers use

    def emit(
        stage: ir.Stage, loop: int | None, count: ir.Expr | None, target: ir.Buffer | None = None
    ) -> None:
        builder = _KernelBuilder(region, f"{region.name}.unfused.{len(kernels)}")
        builder.globals_.update(home)
        lane_stage = attrs.evolve(
            stage, value=_as_lane(stage.value, tile), layout=None, placement=Placement.GLOBAL
        )
        buf = target or stage.output or intermediate_buffer(stage)
        builder.store(lane_stage, buf)
        # serial reductions read global memory: any subgroup size will do
        kernels.append(
            attrs.evolve(
                builder.finish(), loop=loop, loop_count=count, subgroup=ir.SubgroupReq("any", ())
            )
        )
        if stage.output is None and target is None:
            materialized[stage] = buf
            home[stage] = buf

    for n, item in enumerate(region.stages):
        if isinstance(item, ir.Repeat):
            for stage in item.stages:
                emit(stage, n, item.count)
            for top, last in item.carried:
                copy = ir.Stage(
                    f"{top.name}<-{last.name}",
                    top.indices,
                    ir.StageRef(last, tuple(ir.IndexRef(v) for v in top.indices)),
                    DType.F32,
                    Placement.GLOBAL,
                    None,
                    None,
                    span=item.span,
                    var=top.var,
                )
                emit(copy, n, item.count, target=home[top])
        else:
            emit(item, None, None)
    return kernels
