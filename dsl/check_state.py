"""What the checker's passes share: the target limits, the names a region declares, and the
facts earlier passes established (the tile, the per-workgroup index, the constants' settings).

Input: nothing; the driver (`check.py`) makes one `CheckState` and one `Names` per region and
hands them to each pass.  Output: none; this module checks nothing itself.  Beside the records
it holds the small helpers more than one pass uses.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from . import bounds, ir
from . import syntax as S
from .diagnostics import Diagnostic
from .span import Span

U32_MAX = 2**32 - 1


@attrs.frozen
class Limits:
    """The limits of the targets a source is checked for.  The defaults are those of the targets
    codegen knows (codegen/targets.py), for dsl/ used on its own; `codegen.build.check_source`
    passes the values of the targets it builds for."""

    # The smallest `maxComputeSharedMemorySize` among the targets (NVIDIA through Vulkan: 48 KiB;
    # FACTS.md)
    shared_bytes: int = 48 * 1024
    # maxComputeWorkGroupInvocations: Vulkan guarantees 128, every desktop GPU offers 1024; a
    # device with less is refused at run time
    workgroup_size: int = 1024
    # registers per lane on the target with the most (a tile holding more spills on every one)
    lane_registers: int = 256
    # waves per SIMD on the target with the most: the highest `waves >=` a budget can ask
    waves_per_simd: int = 16
    # subgroup sizes a device can have: Vulkan's subgroupSize is a power of two up to 128, and
    # devices offer 4 lanes and up
    min_subgroup_size: int = 4
    max_subgroup_size: int = 128


DEFAULT_LIMITS = Limits()


@attrs.define
class CheckState:
    """One region's check: the limits, where diagnostics go (one list for the whole module),
    and what the region-level passes decided, for the stage passes to read."""

    limits: Limits
    known_targets: Sequence[str] | None  # target names a budget may name; None: any
    diags: list[Diagnostic]
    tile: ir.Tile | None = None  # check_tiles.check_tile
    per: ir.IndexVar | None = None  # check_tiles.check_per
    group: ir.Group | None = None  # check_tiles.check_group
    settings: list[bounds.Setting] = attrs.Factory(list)  # the constants' settings index checks try
    # a register stage's depth, its reads substituted (check_stages.inlined_depth)
    depths: dict[ir.Stage, int] = attrs.Factory(dict)
    # while a write's own indices are typed: check_writes checks their parts where the mask
    # admits, so check_indices.check_no_wrap leaves them alone
    in_write_index: bool = False

    def err(self, span: Span | None, message: str, hint: str | None = None) -> None:
        self.diags.append(Diagnostic(span, message, hint))


@attrs.define
class Names:
    """Names visible in one region."""

    buffers: dict[str, ir.Buffer] = attrs.Factory(dict)
    consts: dict[str, ir.ConstDecl] = attrs.Factory(dict)
    stages: dict[str, ir.Stage] = attrs.Factory(dict)
    decl_spans: dict[str, Span] = attrs.Factory(dict)
    poisoned: set[str] = attrs.Factory(set)  # names whose declaration failed: no cascades
    latest: dict[str, ir.Stage] = attrs.Factory(dict)  # variable -> its current version
    # the index of a topk by (index, body, scope) as written: a topk and an argtopk of the
    # same values share it, so lowering computes them once (check_select.py)
    topk_vars: dict[tuple[str, object, str | None], ir.IndexVar] = attrs.Factory(dict)


@attrs.define
class IndexInfo:
    """An index variable while its extent is being inferred."""

    name: str
    span: Span
    extent: ir.Expr | None = None
    extent_origin: Span | None = None
    var: ir.IndexVar | None = None
    explicit: bool = False  # written `t[h: 4]`: may index a larger dimension (a sub-range)


def pow2(n: int) -> bool:
    """`n` is a power of two."""
    return n > 0 and n & (n - 1) == 0


def shadows_declaration(state: CheckState, sc: Names, name: str, span: Span) -> bool:
    """A stage's index named like a declaration of the region (a constant, a buffer, a stage):
    a diagnostic at the index, and True."""
    if name not in sc.decl_spans and name not in sc.buffers:
        return False
    state.err(
        span,
        f"index '{name}' shadows a declaration of the same name",
        "use a different index name",
    )
    return True


def walk_syntax(e: S.Expr) -> list[S.Expr]:
    """`e` and every expression below it."""
    out: list[S.Expr] = [e]
    match e:
        case S.Access(_, idx):
            for i in idx:
                out += walk_syntax(i)
        case S.Call(_, args):
            for a in args:
                out += walk_syntax(a)
        case S.BinOp(_, lhs, rhs):
            out += walk_syntax(lhs) + walk_syntax(rhs)
        case S.Neg(v):
            out += walk_syntax(v)
        case S.Reduce(_, _, body):
            out += walk_syntax(body)
    return out


def visible_shape(state: CheckState, stage: ir.Stage) -> tuple[ir.Expr, ...]:
    """A stage's shape as written: without the implicit per-workgroup index."""
    if state.per is not None and stage.indices[:1] == (state.per,):
        return stage.shape[1:]
    return stage.shape


def bind_stage(sc: Names, stage: ir.Stage) -> None:
    """Make a checked stage visible to the stages after it."""
    sc.stages[stage.name] = stage
    sc.latest[stage.var] = stage


def is_tile_value(state: CheckState, name: str, sc: Names) -> bool:
    """`name` is a value of the tile (held per lane, at every tile element)."""
    tile = state.tile
    stage = sc.latest.get(name)
    return tile is not None and stage is not None and stage.indices == (tile.per, *tile.dims)
