"""The typed AST of a `.fuse` file, as written (names unresolved).  Produced by `parse.py`.

Every node carries a `span` (excluded from equality and repr) so that later stages can point
diagnostics at the source.  Resolution of names, shapes and dtypes happens in `check.py`.
"""

from __future__ import annotations

from typing import Any, Union

import attrs

from .span import Span

# Limits of the language, checked by parse.py (the README's tutorial states them).
# A name becomes a GLSL identifier (behind a prefix such as `b_`; GLSL allows 1024 characters)
# and a region's name a file name (`<region>.unfused.<i>.spv`; most file systems allow 255
# bytes).  64 characters leave room for both.
MAX_NAME_CHARS = 64
# Every stage of the compiler walks expressions recursively (the parser's transformer, the
# checker, lowering, the GLSL printer, the numpy reference), up to 3 Python frames per level;
# 100 levels stay far inside Python's default recursion limit of 1000 wherever the compiler is
# called from (tests/dsl/test_limits.py builds expressions of exactly this depth).
MAX_EXPR_DEPTH = 100
# The parser (Lark, LALR) reads 85 to 170 KB of expressions a second, and the limits above are
# measured on its tree: this bounds the time before any diagnostic to about 3 s (a 3.5 MB line
# once took 31 s to be refused as too deep; kernels.fuse, 31 regions, is 25 KB).
MAX_SOURCE_BYTES = 256 * 1024


def _span() -> Span:
    return attrs.field(eq=False, repr=False, kw_only=True)  # type: ignore[no-any-return]


# --- expressions -----------------------------------------------------------------------------
@attrs.frozen
class Num:
    value: float | int
    is_int: bool
    span: Span = _span()


@attrs.frozen
class Name:
    id: str
    span: Span = _span()


@attrs.frozen
class Access:
    """`A[i, j]`: an element of an input, output or indexed stage."""

    name: str
    indices: tuple[Expr, ...]
    span: Span = _span()
    name_span: Span = attrs.field(eq=False, repr=False, kw_only=True)


@attrs.frozen
class Call:
    """An elementwise function: `rsqrt(e)`, `max(a, b)`, `select(c, a, b)`."""

    fn: str
    args: tuple[Expr, ...]
    span: Span = _span()


@attrs.frozen
class Reduce:
    """`sum(k: body) @ scope`: reduce `body` over `k`; the scope says which threads share it."""

    op: str
    index: str
    body: Expr
    scope: str | None
    span: Span = _span()
    index_span: Span = attrs.field(eq=False, repr=False, kw_only=True)
    scope_span: Span | None = attrs.field(eq=False, repr=False, kw_only=True, default=None)
    # `sum(j < 4 * D: ...)`: an explicit extent, for an index used only inside expressions
    extent: Expr | None = attrs.field(eq=False, repr=False, kw_only=True, default=None)
    extent_op: str | None = attrs.field(eq=False, repr=False, kw_only=True, default=None)
    # `topk(k, e: ...)`: how many values it keeps (None for the other reducers)
    k: Expr | None = attrs.field(kw_only=True, default=None)


@attrs.frozen
class BinOp:
    op: str
    lhs: Expr
    rhs: Expr
    span: Span = _span()


@attrs.frozen
class Neg:
    value: Expr
    span: Span = _span()


Expr = Union[Num, Name, Access, Call, Reduce, BinOp, Neg]


# --- declarations ------------------------------------------------------------------------------
@attrs.frozen
class TypeRef:
    dtype: str
    shape: tuple[Expr, ...]
    span: Span = _span()


@attrs.frozen
class Param:
    name: str
    type: TypeRef
    span: Span = _span()
    state: bool = attrs.field(default=False, kw_only=True)  # `name: state f32[...]`
    # `name: f32[N] in LO .. HI`: the values an input is meant to hold (checks draw from them)
    values: tuple[Num, Num] | None = attrs.field(default=None, kw_only=True)
    # `name: f32[N] tol 2e-3`: the relative error `fusec check` accepts for an output
    tolerance: Num | None = attrs.field(default=None, kw_only=True)
    # `schedule ...: name packed split` decided for this instance (dsl/schedule.py)
    packing: Name | None = attrs.field(default=None, kw_only=True)


@attrs.frozen
class Const:
    name: str
    value: Num
    range: tuple[Num, Num] | None
    span: Span = _span()
    runtime: bool = attrs.field(default=False, kw_only=True)  # `param pos in 0 .. N`


@attrs.frozen
class LaunchItem:
    """`workgroup 256`, `subgroup 32 | 64`, `subgroup >= 16`, `rows_per_subgroup 2`."""

    key: str
    kind: str  # "int" | "any" | "at_least" | "choice"
    values: tuple[int, ...]
    span: Span = _span()
    fallback: str | None = attrs.field(default=None, kw_only=True)  # `>= 16 else shared`


@attrs.frozen
class BudgetItem:
    """`waves >= 8`, `vgprs <= 128 on gfx1201`, `spills <= 0`."""

    key: str
    op: str
    value: Num
    target: str | None
    span: Span = _span()
    target_span: Span | None = attrs.field(eq=False, repr=False, kw_only=True, default=None)


@attrs.frozen
class LayoutItem:
    """`k -> lane x 8`: index `k` maps onto `lane`, 8 consecutive elements per lane."""

    index: str
    unit: str
    vector: int
    span: Span = _span()


@attrs.frozen
class Stage:
    """`name[i, ...] = value where mask in placement layout ...`.  An index on the left is the
    stage's own index name (a `Name`), or integer arithmetic of index names, constants and
    params for an output written in part (`kc[h - NQ, pos, d]`)."""

    name: str
    indices: tuple[Expr, ...]
    value: Expr
    placement: Name | None
    layout: tuple[LayoutItem, ...]
    span: Span = _span()
    name_span: Span = attrs.field(eq=False, repr=False, kw_only=True)
    # explicit extents written on the left side, `t[a: A, b: B] = ...`
    extents: dict[str, Expr] = attrs.field(factory=dict, eq=False, repr=False, kw_only=True)
    stored: Name | None = attrs.field(default=None, kw_only=True)  # `in shared as q8_0`
    # `... where h >= NQ`: only the elements whose indices pass the condition are written
    mask: Expr | None = attrs.field(default=None, kw_only=True)
    # `(mx, e) = scores(q, kc, g)`: the names on the left of a stage group's use with several
    # outputs (`name` is the first); empty for every other stage (dsl/compose.py)
    targets: tuple[Name, ...] = attrs.field(default=(), kw_only=True)


@attrs.frozen
class TileDim:
    name: str
    extent: Expr
    span: Span = _span()


@attrs.frozen
class Tile:
    """`tile (src: 4, dst: 4) lane dst + 4 * src, slot ..., per t`"""

    dims: tuple[TileDim, ...]
    lane: Expr
    slot: Expr | None
    per: str | None
    span: Span = _span()


@attrs.frozen
class PerWorkgroup:
    """`per workgroup head < E`, optionally `, group h = g / M` (`group`: the word, the group
    index and its expression)."""

    unit: str
    index: str
    op: str
    extent: Expr
    span: Span = _span()
    group: tuple[str, str, Expr] | None = attrs.field(default=None, kw_only=True)


@attrs.frozen
class Repeat:
    """`repeat N:` and an indented block of stages."""

    count: Expr
    stages: tuple[Stage, ...]
    span: Span = _span()


@attrs.frozen
class DtypeParam:
    """`Wt in f16, q8_0, q4_0` in `region R<...>`: a dtype parameter and its choices."""

    name: str
    choices: tuple[Name, ...]
    span: Span = _span()


@attrs.frozen
class ScheduleLaunch:
    """`workgroup 512, rows_per_subgroup 1` on a schedule line."""

    items: tuple[LaunchItem, ...]
    span: Span = _span()


@attrs.frozen
class ScheduleLayout:
    """`gate, up layout k -> lane x 32`: layout items for the stages named."""

    stages: tuple[Name, ...]
    items: tuple[LayoutItem, ...]
    span: Span = _span()


@attrs.frozen
class ScheduleStore:
    """`x in shared as q8_0` (an input staged into a stage of its own) or `xn as q8_0` (a
    stage's values stored rounded)."""

    name: Name
    placement: Name | None
    stored: Name
    span: Span = _span()


@attrs.frozen
class ScheduleConst:
    """`const N = 1024 in 1 .. 4096`: another default (and range) for a constant."""

    consts: tuple[Const, ...]
    span: Span = _span()


@attrs.frozen
class ScheduleIntDot:
    """`int8 dot`: every contraction over a weight of a dtype parameter takes integer dot
    products (a diagnostic where it cannot)."""

    span: Span = _span()


@attrs.frozen
class SchedulePack:
    """`Wg, Wu packed split`: the weights named are uploaded in that layout (dsl/packing.py)."""

    weights: tuple[Name, ...]
    packing: Name
    span: Span = _span()


ScheduleBody = Union[
    ScheduleLaunch, ScheduleLayout, ScheduleStore, ScheduleConst, ScheduleIntDot, SchedulePack
]


@attrs.frozen
class Schedule:
    """`schedule on T when Wt in a, b: body`: `target` and `when` (a dtype parameter and the
    dtypes it names) are None when not written."""

    target: Name | None
    when: tuple[Name, tuple[Name, ...]] | None
    body: ScheduleBody
    span: Span = _span()


@attrs.frozen
class Instance:
    """What made a region an instance of a generic one: the generic region's name, its dtype
    parameters' bindings in order, the target its `on` schedule lines were chosen for (None:
    every target)."""

    generic: str
    bindings: tuple[tuple[str, str], ...]
    target: str | None = None

    @property
    def display(self) -> str:
        """`rms_norm_mul_matvec<q4_0>`, as diagnostics and listings name it (`R on sm90` for
        the target variant of a region without dtype parameters)."""
        shown = self.generic
        if self.bindings:
            shown += "<" + ", ".join(d for _, d in self.bindings) + ">"
        return shown + (f" on {self.target}" if self.target else "")


@attrs.frozen
class InstanceDecl:
    """`instance NAME = R<q4_0> with K = 12288`: a named instance with other const defaults;
    with an indented block of schedule lines under it, those lines instead of the region's."""

    name: str
    generic: Name
    dtypes: tuple[Name, ...]
    consts: tuple[Const, ...]
    span: Span = _span()
    name_span: Span = attrs.field(eq=False, repr=False, kw_only=True)
    # None: the region's schedule lines; else the instance's own (README "Dtype-generic regions")
    schedules: tuple[Schedule, ...] | None = attrs.field(default=None, kw_only=True)


@attrs.frozen
class Region:
    name: str
    params: tuple[Param, ...]
    outputs: tuple[Param, ...]
    consts: tuple[Const, ...]
    launch: tuple[LaunchItem, ...]
    stages: tuple[Stage | Repeat, ...]
    span: Span = _span()
    name_span: Span = attrs.field(eq=False, repr=False, kw_only=True)
    budget: tuple[BudgetItem, ...] = attrs.field(default=(), kw_only=True)
    tile: Tile | None = attrs.field(default=None, kw_only=True)
    per: PerWorkgroup | None = attrs.field(default=None, kw_only=True)
    # `region R<Wt in f16, q4_0>`: dtype parameters (a generic region), and schedule lines
    dtype_params: tuple[DtypeParam, ...] = attrs.field(default=(), kw_only=True)
    schedules: tuple[Schedule, ...] = attrs.field(default=(), kw_only=True)
    # set on the regions dsl/instances.py expands a generic region into
    instance: Instance | None = attrs.field(default=None, kw_only=True)


@attrs.frozen
class StageGroup:
    """`stages name(params) -> outputs` and its body: stages written once, used in regions as
    `out = name(args)` and expanded there by dsl/compose.py."""

    name: str
    params: tuple[Param, ...]
    outputs: tuple[Param, ...]
    consts: tuple[Const, ...]
    stages: tuple[Stage | Repeat, ...]
    span: Span = _span()
    name_span: Span = attrs.field(eq=False, repr=False, kw_only=True)


@attrs.frozen
class Module:
    path: str
    regions: tuple[Region, ...]
    instances: tuple[InstanceDecl, ...] = attrs.field(default=(), kw_only=True)
    groups: tuple[StageGroup, ...] = attrs.field(default=(), kw_only=True)
    # after dsl/compose.py: each use of a group in a region, what it decided (compose.Expansion)
    expansions: tuple[Any, ...] = attrs.field(default=(), eq=False, repr=False, kw_only=True)
