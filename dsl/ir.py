"""Region IR: the checked program.  Produced by `check.py`, read by codegen and `reference.py`.

Names are resolved to objects (a `Stage`, a `Buffer`, a `ConstDecl`, an `IndexVar`), every
expression has a dtype, every index variable an extent.  Declarations compare by identity;
expressions compare structurally (spans excluded).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Union

import attrs

from .instances import find_instance
from .packing import Packing
from .span import Span
from .syntax import Instance
from .types import INDEX_REDUCERS, DType, Placement, Scope


def _span() -> Span:
    return attrs.field(eq=False, repr=False, kw_only=True)  # type: ignore[no-any-return]


def _expr_span() -> Span | None:
    """An expression's source text: set by the checker, None where a later stage built it."""
    return attrs.field(default=None, eq=False, repr=False, kw_only=True)  # type: ignore[no-any-return]


# The buffer that carries a region's run-time parameters (`param pos in ...`), one u32 each.
PARAMS_BUFFER = "fusec_params"


# --- declarations (identity equality) ----------------------------------------------------------
@attrs.frozen(eq=False)
class ConstDecl:
    """A constant with a default; becomes a specialization constant (`spec_id`)."""

    name: str
    dtype: DType  # U32 for integers, F32 for reals
    default: int | float
    lo: int | float | None
    hi: int | float | None
    spec_id: int  # a run-time parameter's slot in the parameter buffer
    span: Span = _span()
    runtime: bool = attrs.field(default=False, kw_only=True)  # `param pos in 0 .. N`


@attrs.frozen(eq=False)
class Buffer:
    """A region input or output (global memory)."""

    name: str
    dtype: DType
    shape: tuple[Expr, ...]
    is_output: bool
    span: Span = _span()
    state: bool = attrs.field(default=False, kw_only=True)  # kept between runs, written in part
    # `in LO .. HI` on an input: the values it is meant to hold, which checks draw from
    values: tuple[float, float] | None = attrs.field(default=None, kw_only=True)
    # `tol E` on an output: the relative error `fusec check` accepts (None: its dtypes' own)
    tolerance: float | None = attrs.field(default=None, kw_only=True)
    # `W packed split` on a GGUF weight input: the layout its bytes have on the device, which
    # every kernel reading it reads (dsl/packing.py); the reference reads the GGUF bytes
    packing: Packing | None = attrs.field(default=None, kw_only=True)


@attrs.frozen(eq=False)
class IndexVar:
    name: str
    extent: Expr
    span: Span = _span()


# --- expressions (structural equality) ------------------------------------------------------
@attrs.frozen
class Lit:
    value: int | float
    dtype: DType
    span: Span | None = _expr_span()


@attrs.frozen
class ConstRef:
    const: ConstDecl
    span: Span | None = _expr_span()

    @property
    def dtype(self) -> DType:
        return self.const.dtype


@attrs.frozen
class IndexRef:
    var: IndexVar
    span: Span | None = _expr_span()

    @property
    def dtype(self) -> DType:
        return DType.U32


@attrs.frozen
class Load:
    """An element of an input buffer."""

    buffer: Buffer
    indices: tuple[Expr, ...]
    span: Span | None = _expr_span()

    @property
    def dtype(self) -> DType:
        return DType.F32 if self.buffer.dtype.is_float else self.buffer.dtype


@attrs.frozen
class StageRef:
    """The value of an earlier stage (scalar: no indices)."""

    stage: Stage
    indices: tuple[Expr, ...]
    span: Span | None = _expr_span()

    @property
    def dtype(self) -> DType:
        return self.stage.dtype


@attrs.frozen
class Call:
    fn: str
    args: tuple[Expr, ...]
    dtype: DType
    span: Span | None = _expr_span()


@attrs.frozen
class BinOp:
    op: str  # + - * / % < <= > >= == !=
    lhs: Expr
    rhs: Expr
    dtype: DType
    span: Span | None = _expr_span()


@attrs.frozen
class Neg:
    value: Expr
    span: Span | None = _expr_span()

    @property
    def dtype(self) -> DType:
        return self.value.dtype


@attrs.frozen
class Reduce:
    """`op(var: body) @ scope`.  argmax and argmin give the first index of the largest
    (smallest) value.  `topk(k, var: body)` keeps the k largest values, largest first, ties to
    the lowest index; `rank` says which of them this node is (`argtopk`: its index)."""

    op: str  # sum | max | min | argmax | argmin | topk | argtopk
    var: IndexVar
    body: Expr
    scope: Scope
    span: Span | None = _expr_span()
    k: Expr | None = attrs.field(default=None, kw_only=True)  # topk, argtopk: how many
    rank: Expr | None = attrs.field(default=None, kw_only=True)  # topk, argtopk: which

    @property
    def dtype(self) -> DType:
        return DType.U32 if self.op in INDEX_REDUCERS else self.body.dtype


Expr = Union[Lit, ConstRef, IndexRef, Load, StageRef, Call, BinOp, Neg, Reduce]


# --- region --------------------------------------------------------------------------------------
@attrs.frozen
class Layout:
    """How a contraction stage maps onto threads: rows to `row_unit`, the reduced index to lanes."""

    row_unit: Scope  # SUBGROUP: rows spread over subgroups; LANE: one row per lane
    vector: int  # consecutive elements of the reduced index per lane per step


@attrs.frozen(eq=False)
class Stage:
    """One assignment.  `name` is unique in the region (a tile value assigned again gets
    `c.1`, `c.2`, ...); `var` is the name as written, shared by all its versions."""

    name: str
    indices: tuple[IndexVar, ...]
    value: Expr
    dtype: DType
    placement: Placement
    layout: Layout | None  # None: not given in the source
    output: Buffer | None  # the output buffer this stage writes, if any
    span: Span = _span()
    var: str = attrs.field(default="", kw_only=True)
    # an output's index per dimension where it is not the stage's own indices in order: fixed
    # for a state output (`kc[k, pos, d]`), or computed (`kc[h - NQ, pos, d]`); None: the
    # stage's own indices
    out_index: tuple[Expr, ...] | None = attrs.field(default=None, kw_only=True)
    # `... where h >= NQ`: the elements written are those whose indices make it nonzero (a
    # condition of indices, constants and params); None: every element
    mask: Expr | None = attrs.field(default=None, kw_only=True)
    # `in shared as q8_0`: values rounded to q8_0 blocks along the stage's index; None: f32
    stored: DType | None = attrs.field(default=None, kw_only=True)

    @property
    def is_scalar(self) -> bool:
        return not self.indices

    @property
    def writes_part(self) -> bool:
        """An output stage that writes under a mask or at computed indices (dsl/check_writes.py):
        several such stages may share an output."""
        return self.mask is not None or any(
            not isinstance(i, IndexRef | ConstRef) for i in self.out_index or ()
        )

    @property
    def shape(self) -> tuple[Expr, ...]:
        return tuple(v.extent for v in self.indices)


@attrs.frozen(eq=False)
class Group:
    """Groups of `size` consecutive workgroups of a per-workgroup region, one per value of
    `var` (`per workgroup g < G, group h = g / size`)."""

    var: IndexVar
    size: Expr


@attrs.frozen(eq=False)
class Repeat:
    """`repeat count:` over `stages`.  `carried` pairs, per variable assigned in the body, the
    version read at the top of each iteration (assigned before the loop) with the body's last
    version, whose value the next iteration reads."""

    count: Expr
    stages: tuple[Stage, ...]
    carried: tuple[tuple[Stage, Stage], ...]
    span: Span = _span()


@attrs.frozen(eq=False)
class Tile:
    """Tile indices held across the lanes of a group, one group per value of `per`.
    lane = Σ index · stride, strides powers of two (checked)."""

    dims: tuple[IndexVar, ...]
    strides: tuple[int, ...]  # lane stride per index (0: the index is on slots)
    per: IndexVar
    shared_fallback: bool  # `subgroup >= G else shared`
    span: Span = _span()
    slot_strides: tuple[int, ...] = attrs.field(default=(), kw_only=True)  # 0: on lanes

    @property
    def lanes(self) -> int:
        n = 1
        for d, st in zip(self.dims, self.strides, strict=True):
            if st:
                n *= self.extent_of(d)
        return n

    @property
    def slots(self) -> int:
        n = 1
        for d, st in zip(self.dims, self.slot_strides or (0,) * len(self.dims), strict=True):
            if st:
                n *= self.extent_of(d)
        return n

    def on_slots(self, var: IndexVar) -> bool:
        i = [d.name for d in self.dims].index(var.name)
        return bool(self.slot_strides) and self.slot_strides[i] != 0

    def extent_of(self, var: IndexVar) -> int:
        assert isinstance(var.extent, Lit)
        return int(var.extent.value)


@attrs.frozen
class SubgroupReq:
    """Subgroup sizes a region allows: any, at least N, or a set of sizes."""

    kind: str  # "any" | "at_least" | "choice"
    sizes: tuple[int, ...]
    fallback: str | None = None  # "shared": narrower subgroups exchange through shared memory

    def allows(self, size: int) -> bool:
        if self.kind == "any":
            return True
        if self.kind == "at_least":
            return size >= self.sizes[0]
        return size in self.sizes


@attrs.frozen
class BudgetRule:
    """One limit of a region's budget: `waves` (minimum), `vgprs` or `spills` (maximum)."""

    key: str
    limit: int
    target: str | None  # None: every target
    span: Span = _span()


@attrs.frozen
class Launch:
    workgroup_size: int
    subgroup: SubgroupReq
    rows_per_subgroup: int


@attrs.frozen(eq=False)
class Region:
    name: str
    inputs: tuple[Buffer, ...]
    outputs: tuple[Buffer, ...]
    consts: tuple[ConstDecl, ...]
    launch: Launch
    stages: tuple[Stage | Repeat, ...]
    span: Span = _span()
    budget: tuple[BudgetRule, ...] = attrs.field(default=(), kw_only=True)
    tile: Tile | None = attrs.field(default=None, kw_only=True)
    per: IndexVar | None = attrs.field(default=None, kw_only=True)  # one workgroup per value
    # `per workgroup g < G, group h = g / M`: after the stages in grid, the stages run once per
    # group of M workgroups (h < (G + M - 1) / M), in the last of the group to arrive
    group: Group | None = attrs.field(default=None, kw_only=True)
    # the run-time parameters' buffer (one u32 per `param`), None when there are none
    params: Buffer | None = attrs.field(default=None, kw_only=True)
    # the generic region and dtype bindings this region is an instance of (dsl/instances.py)
    instance: Instance | None = attrs.field(default=None, kw_only=True)

    def all_stages(self) -> list[Stage]:
        """Every stage, repeat bodies included, in program order."""
        out: list[Stage] = []
        for s in self.stages:
            out.extend(s.stages if isinstance(s, Repeat) else (s,))
        return out

    def const(self, name: str) -> ConstDecl:
        return next(c for c in self.consts if c.name == name)


@attrs.frozen
class Program:
    path: str
    regions: tuple[Region, ...]

    def region(self, name: str) -> Region:
        return next(r for r in self.regions if r.name == name)

    def instance(
        self,
        generic: str,
        dtypes: Mapping[str, str],
        target: str | None = None,
        consts: Mapping[str, int | float] | None = None,
    ) -> Region | None:
        """The instance of region `generic` whose buffers named in `dtypes` have those dtypes
        (`{"W": "q4_0"}`), as `instances.find_instance` chooses; None when there is none."""
        return find_instance(self.regions, generic, dtypes, target, consts)


# --- helpers -------------------------------------------------------------------------------------
def children(e: Expr) -> tuple[Expr, ...]:
    match e:
        case Lit() | ConstRef() | IndexRef():
            return ()
        case Load(_, idx) | StageRef(_, idx):
            return idx
        case Call(_, args, _):
            return args
        case BinOp(_, lhs, rhs, _):
            return (lhs, rhs)
        case Neg(v):
            return (v,)
        case Reduce(_, _, body, _, rank=rank):
            return (body,) if rank is None else (body, rank)
    raise AssertionError(e)


def walk(e: Expr) -> list[Expr]:
    """All sub-expressions, parents before children."""
    out = [e]
    for c in children(e):
        out.extend(walk(c))
    return out


def evaluate_int(e: Expr, values: dict[str, int | float]) -> int:
    """Evaluate a shape expression given constant values (integer arithmetic)."""
    match e:
        case Lit(v, _):
            return int(v)
        case ConstRef(c):
            return int(values[c.name])
        case BinOp(op, lhs, rhs, _):
            a, b = evaluate_int(lhs, values), evaluate_int(rhs, values)
            return {"+": a + b, "-": a - b, "*": a * b, "/": a // max(b, 1), "%": a % max(b, 1)}[op]
        case Neg(v):
            return -evaluate_int(v, values)
    raise AssertionError(f"not a shape expression: {e}")


def interval_op(op: str, a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    """The smallest and largest value of `x op y` for x in `a` and y in `b` (integer `+ - * /
    %`, exact; a division or remainder by a range that may hold 0 or less: no tighter than the
    operands)."""
    (lo1, hi1), (lo2, hi2) = a, b
    if op == "+":
        return lo1 + lo2, hi1 + hi2
    if op == "-":
        return lo1 - hi2, hi1 - lo2
    if op == "*":
        products = (lo1 * lo2, lo1 * hi2, hi1 * lo2, hi1 * hi2)
        return min(products), max(products)
    if op == "/" and lo2 >= 1:
        # floor division by a positive divisor is monotone in each operand
        quotients = (lo1 // hi2, lo1 // lo2, hi1 // hi2, hi1 // lo2)
        return min(quotients), max(quotients)
    if op == "/":
        return min(lo1, 0), max(hi1, 0)  # a divisor that may be 0 or less: no tighter
    if op == "%" and lo1 >= 0 and hi1 < lo2:
        return lo1, hi1  # below the divisor: unchanged
    if op == "%":
        return 0, max(0, hi2 - 1)
    raise AssertionError(f"not an integer operator: {op}")


def bounds_int(
    e: Expr,
    ranges: dict[str, tuple[int, int]],
    index_ranges: dict[IndexVar, tuple[int, int]] | None = None,
) -> tuple[int, int]:
    """Smallest and largest value of an integer shape expression over the constants' ranges
    (interval arithmetic: `(C + NS - 1) / NS` is largest at the largest C and the smallest NS,
    which evaluating every constant at its maximum would miss).  With `index_ranges`, also of an
    index expression over its index variables' values (dsl/bounds.py).  Exact arithmetic: a
    bound below 0 means the unsigned value the GPU computes may wrap around."""
    match e:
        case Lit(v, _):
            return int(v), int(v)
        case ConstRef(decl):
            return ranges[decl.name]
        case IndexRef(var) if index_ranges is not None:
            return index_ranges[var]
        case BinOp(op, lhs, rhs, _):
            a = bounds_int(lhs, ranges, index_ranges)
            b = bounds_int(rhs, ranges, index_ranges)
            return interval_op(op, a, b)
        case Neg(v):
            lo, hi = bounds_int(v, ranges, index_ranges)
            return -hi, -lo
    raise AssertionError(f"not a shape expression: {e}")


def format_expr(e: Expr) -> str:
    """A stable, fully parenthesized printer (for dumps and messages)."""
    match e:
        case Lit(v, _):
            return repr(v)
        case ConstRef(c):
            return c.name
        case IndexRef(v):
            return v.name
        case Load(b, idx):
            return f"{b.name}[{', '.join(format_expr(i) for i in idx)}]"
        case StageRef(s, idx):
            return s.name + (f"[{', '.join(format_expr(i) for i in idx)}]" if idx else "")
        case Call(fn, args, _):
            return f"{fn}({', '.join(format_expr(a) for a in args)})"
        case BinOp(op, lhs, rhs, _):
            return f"({format_expr(lhs)} {op} {format_expr(rhs)})"
        case Neg(v):
            return f"(-{format_expr(v)})"
        case Reduce(op, var, body, scope, k=k, rank=rank):
            head = f"{op}({format_expr(k)}, " if k is not None else f"{op}("
            at = f"[{format_expr(rank)}]" if rank is not None else ""
            return f"{head}{var.name}: {format_expr(body)}) @ {scope.value}{at}"
    raise AssertionError(e)
