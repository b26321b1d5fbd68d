"""Kernel IR: one compute kernel as phases over buffers, shared arrays and per-lane locals.

Produced by `lower.py` (fused and unfused lowerings), read by `glsl.py`, `manifest.py` and, later,
the resource estimator.  Expressions are region-IR expressions (`dsl.ir`) plus three leaves that
say where a value lives: a per-lane local, a shared array element, or a global buffer element
(`dsl.ir.Load`, whose buffer may be an unfused chain's intermediate).
"""

from __future__ import annotations

import enum
from typing import Union

import attrs

from fusec.dsl import ir
from fusec.dsl.span import Span
from fusec.dsl.types import Q8_SHARED_WORDS, QUANT_BLOCK, DType, Scope


@attrs.frozen
class LocalRef:
    """A per-lane scalar computed by an earlier `ScalarPhase`."""

    name: str
    dtype: DType = DType.F32


@attrs.frozen
class SharedLoad:
    array: SharedArray
    index: KExpr

    @property
    def dtype(self) -> DType:
        return self.array.dtype


@attrs.frozen
class WorkgroupIndex:
    """The value of a region's per-workgroup index: this workgroup's id."""

    @property
    def dtype(self) -> DType:
        return DType.U32


@attrs.frozen
class TileRef:
    """A tile value at the given tile coordinates, held by this lane (in the slot the
    coordinates of the slot indices name)."""

    var: str
    indices: tuple[KExpr, ...]

    @property
    def dtype(self) -> DType:
        return DType.F32


@attrs.frozen
class SliceBase:
    """The first row of this workgroup's slice: workgroup id x subgroups x rows per subgroup."""

    rows: int

    @property
    def dtype(self) -> DType:
        return DType.U32


KExpr = Union[ir.Expr, LocalRef, SharedLoad, WorkgroupIndex, TileRef, SliceBase]


# The shared array through which the subgroups of a workgroup argmax, argmin or topk pass the
# index of their best value (beside its value in the float scratch `s_reduce`).  Names of
# arrays fusec adds start with '#', which no stage name has.
INDEX_SCRATCH = "#reduce_i"


def block_count(extent: ir.Expr) -> ir.Expr:
    """32-element blocks covering `extent` elements (the last one possibly partial)."""
    return ir.BinOp(
        "/",
        ir.BinOp("+", extent, ir.Lit(QUANT_BLOCK - 1, DType.U32), DType.U32),
        ir.Lit(QUANT_BLOCK, DType.U32),
        DType.U32,
    )


@attrs.frozen(eq=False)
class SharedArray:
    name: str
    size: ir.Expr  # elements, in terms of constants
    # q8_0 (`in shared as q8_0`): per 32-element block, 8 words of int8 quants and 2 words
    # holding the f16-rounded scale (float bits) and the sum of the quants; None: one f32 per
    # element
    stored: DType | None = None
    # U32: indices (a topk's, the subgroups' argmax in a workgroup selection)
    dtype: DType = attrs.field(default=DType.F32, kw_only=True)

    @property
    def blocks(self) -> ir.Expr:
        return block_count(self.size)

    @property
    def words(self) -> ir.Expr:
        """Size in 32-bit words."""
        if self.stored is None:
            return self.size
        return ir.BinOp("*", self.blocks, ir.Lit(Q8_SHARED_WORDS, DType.U32), DType.U32)


@attrs.frozen(eq=False)
class Binding:
    """A global buffer bound to the kernel."""

    buffer: ir.Buffer
    binding: int
    reads: bool
    writes: bool


# --- phases: executed in order by every thread of the workgroup -----------------------------------
@attrs.frozen
class ScalarPhase:
    """Every lane computes `value` (reductions included) into local `name`."""

    name: str
    value: KExpr
    span: Span = attrs.field(eq=False, repr=False, kw_only=True)


@attrs.frozen
class TopKPhase:
    """Every lane finds the `reduce.k` largest values of `reduce.body` over `reduce.var` and
    their indices, largest first, ties to the lowest index: k rounds of an argmax over the
    values after the previous round's (value, index), so no lane keeps a set of the chosen
    ones.  One lane writes them to the shared arrays `values` and `indices` (a per-lane array
    read at a lane's own rank would be indexed dynamically, which drivers put in scratch
    memory), then a barrier.  `reduce.rank` is None; a `SharedLoad` reads the result."""

    name: str
    reduce: ir.Reduce
    values: SharedArray  # k floats, then a barrier
    indices: SharedArray  # k u32
    span: Span = attrs.field(eq=False, repr=False, kw_only=True)

    @property
    def value(self) -> KExpr:
        """The phase's expression (for passes that scan a phase's reductions)."""
        return self.reduce


@attrs.frozen
class SelectRows:
    """`buffer[row] = reduce` for every `row`, `reduce` an argmax or argmin over the lanes of
    a subgroup: each subgroup of the grid takes one row at a time, its lanes stride over the
    reduced index, and one lane stores the index."""

    buffer: ir.Buffer
    row: ir.IndexVar
    reduce: ir.Reduce
    span: Span = attrs.field(eq=False, repr=False, kw_only=True)

    @property
    def value(self) -> KExpr:
        """The phase's expression (for passes that scan a phase's reductions)."""
        return self.reduce


@attrs.frozen
class FillShared:
    """The workgroup fills `array[var]` for every `var` in its extent, then a barrier."""

    array: SharedArray
    var: ir.IndexVar
    value: KExpr
    span: Span = attrs.field(eq=False, repr=False, kw_only=True)


@attrs.frozen
class StoreScalar:
    """One lane of the grid writes element 0 of `buffer` (`local`: the first lane of this
    workgroup, which alone runs the phase: the last workgroup after an `Arrive`)."""

    buffer: ir.Buffer
    value: KExpr
    span: Span = attrs.field(eq=False, repr=False, kw_only=True)
    local: bool = attrs.field(default=False, kw_only=True)


@attrs.frozen
class StoreMap:
    """Grid-stride elementwise store: `buffer[var] = value` for every `var`.  `local`: the
    workgroup alone covers `var` (a per-workgroup region), storing at `index`."""

    buffer: ir.Buffer
    var: ir.IndexVar
    value: KExpr
    span: Span = attrs.field(eq=False, repr=False, kw_only=True)
    local: bool = attrs.field(default=False, kw_only=True)
    index: KExpr | None = attrs.field(default=None, kw_only=True)
    # `... where COND`: only the elements where it is nonzero are stored (None: every one)
    mask: KExpr | None = attrs.field(default=None, kw_only=True)


@attrs.frozen
class Contract:
    """`buffer[row] = value`, where `value` holds reductions over an index spread by `layout`.

    With rows -> subgroup, each subgroup owns `rows` consecutive rows at a time and its lanes
    stride over the reduced index, `layout.vector` elements per step; with rows -> lane, each
    lane owns a row and reduces serially.
    """

    buffer: ir.Buffer | SharedArray  # a shared array: the workgroup computes every row itself
    row: ir.IndexVar
    value: KExpr
    layout: ir.Layout
    rows: int
    span: Span = attrs.field(eq=False, repr=False, kw_only=True)

    slice: bool = attrs.field(default=False, kw_only=True)  # one row block per workgroup
    # in a per-workgroup region: the workgroup takes every row of its own slice and stores row
    # `row` at this flat index of `buffer`
    index: KExpr | None = attrs.field(default=None, kw_only=True)
    # a DType.Q8_0X output (rows -> subgroup, grid region): the workgroup takes chunks of rows
    # that are whole blocks (its subgroups' rows rounded up to a multiple of 32), keeps a
    # chunk's values here, and rounds them to blocks after a barrier (glsl_contract)
    staging: SharedArray | None = attrs.field(default=None, kw_only=True)

    @property
    def to_shared(self) -> bool:
        return isinstance(self.buffer, SharedArray)


@attrs.frozen
class TileAssign:
    """Each lane computes its element of tile value `var` (reductions over tile indices and
    exchanges included)."""

    var: str
    value: KExpr
    span: Span = attrs.field(eq=False, repr=False, kw_only=True)


@attrs.frozen
class TileRepeat:
    count: ir.Expr
    body: tuple[TileStmt, ...]
    span: Span = attrs.field(eq=False, repr=False, kw_only=True)


@attrs.frozen
class TileStore:
    """Lanes of live groups store their element: `buffer[indices] = value`."""

    buffer: ir.Buffer
    indices: tuple[ir.IndexVar, ...]
    value: KExpr
    span: Span = attrs.field(eq=False, repr=False, kw_only=True)


TileStmt = Union[TileAssign, TileRepeat, TileStore]


@attrs.frozen
class TilePhase:
    """A tile program: lane l of group g holds element (per = g, dims decoded from l).
    `exchange` says how values cross lanes: "shuffle" (the group lies in one subgroup) or
    "shared" (through shared memory, for subgroups narrower than the group)."""

    tile: ir.Tile
    body: tuple[TileStmt, ...]
    exchange: str
    span: Span = attrs.field(eq=False, repr=False, kw_only=True)

    @property
    def value(self) -> KExpr:
        """All values of the program (for passes that scan a phase's expression)."""
        values: list[KExpr] = []

        def visit(stmts: tuple[TileStmt, ...]) -> None:
            for st in stmts:
                if isinstance(st, TileRepeat):
                    visit(st.body)
                else:
                    values.append(st.value)

        visit(self.body)
        expr: KExpr = ir.Lit(0, DType.F32)
        for v in values:
            expr = ir.BinOp("+", expr, v, DType.F32)  # type: ignore[arg-type]
        return expr


@attrs.frozen
class SplitK:
    """`buffer[row] += Σ over this workgroup's slice of `var` of value`, with float atomics:
    every workgroup adds its partial sums; the runtime zeroes `buffer` before the kernel."""

    buffer: ir.Buffer
    row: ir.IndexVar
    var: ir.IndexVar  # the reduced index, whose slice this workgroup holds
    slice_array: SharedArray
    value: KExpr  # the body of the reduction (the sliced value read from the shared array)
    span: Span = attrs.field(eq=False, repr=False, kw_only=True)


@attrs.frozen
class QuantizeBlocks:
    """`target[var] = value` rounded to q8_0 blocks: four lanes per 32-element block compute
    its values, its scale (absolute maximum / 127, rounded to f16 as stored) and its quants
    (rounded half away from zero, as gguf and ggml do).  Into a shared array (`stored` q8_0,
    then a barrier) every workgroup quantizes the whole index; into a global Q8_0X buffer (an
    unfused chain) the grid covers the blocks once."""

    target: SharedArray | ir.Buffer
    var: ir.IndexVar
    value: KExpr
    span: Span = attrs.field(eq=False, repr=False, kw_only=True)


@attrs.frozen
class Arrive:
    """The end of the grid's part of the kernel (or of its group's): every workgroup has stored
    its share of the `scratch` buffers (the stages in grid).  Its lanes meet at a barrier that
    releases their stores; one lane adds 1 to `counter` (acquire and release, queue-family
    scope); the workgroup that reads back the grid's (or group's) size minus 1 arrived last: it
    resets the counter to 0 for the next dispatch and runs the phases after this one, every
    other workgroup ends here.
    Nothing waits, so the kernel finishes whatever the number of resident workgroups."""

    counter: ir.Buffer
    scratch: tuple[ir.Buffer, ...]
    span: Span = attrs.field(eq=False, repr=False, kw_only=True)
    # `group h = g / size`: this workgroup's group (`WorkgroupIndex / size`) and the workgroups
    # of a group; each group has a counter of its own (`counter[group]`), and the last of the
    # group to arrive goes on.  None: one group, the whole grid.
    group: KExpr | None = attrs.field(default=None, kw_only=True)
    group_size: ir.Expr | None = attrs.field(default=None, kw_only=True)

    @property
    def value(self) -> KExpr:
        """No value (for passes that scan a phase's expression)."""
        return ir.Lit(0, DType.F32)


Phase = Union[
    ScalarPhase,
    FillShared,
    StoreScalar,
    StoreMap,
    Contract,
    TilePhase,
    SplitK,
    QuantizeBlocks,
    Arrive,
    TopKPhase,
    SelectRows,
]


class Distribution(enum.Enum):
    """Which workgroups compute a stage of a region with stages in grid."""

    EACH = "every workgroup"  # scalars and shared arrays each workgroup needs for its share
    GRID = "grid"  # spread over the grid, each workgroup its rows
    LAST = "last workgroup"  # after the arrival: the last workgroup to finish its share


@attrs.frozen
class StagePlan:
    """One stage's distribution over the workgroups (codegen/grid_plan.py decides)."""

    stage: str
    distribution: Distribution


@attrs.frozen
class IntDotTerm:
    """One reduction of a contraction done with integer dot products: `sum(k: W[row, k] *
    xq[k])`, W in GGUF blocks (q8_0, q4_0, q4_K, q6_K), xq a shared array stored as q8_0
    (fused) or a Q8_0X intermediate (unfused)."""

    reduce: ir.Reduce
    weight: ir.Load
    acts: SharedArray | ir.Buffer  # a Q8_0X buffer in an unfused chain


def int_dot_terms(p: Contract) -> list[IntDotTerm] | None:
    """The reductions of `p` as integer dot products, when every one has that form (a GGUF
    weight) and a lane takes one whole block of 32 per step (x 32); None otherwise (the
    contraction dequantizes to f32)."""
    if p.layout.row_unit not in (Scope.SUBGROUP, Scope.WORKGROUP) or p.layout.vector != 32:
        return None
    terms = []
    for red in reduces_in(p.value):
        body = red.body
        if red.op != "sum" or not (isinstance(body, ir.BinOp) and body.op == "*"):
            return None
        pair = (body.lhs, body.rhs)
        load = next(
            (x for x in pair if isinstance(x, ir.Load) and x.buffer.dtype.is_quantized), None
        )
        act = next((x for x in pair if x is not load), None)

        def is_k(e: KExpr, var: ir.IndexVar = red.var) -> bool:
            return isinstance(e, ir.IndexRef) and e.var is var

        acts: SharedArray | ir.Buffer
        if isinstance(act, SharedLoad) and act.array.stored == DType.Q8_0 and is_k(act.index):
            acts = act.array
        elif (
            isinstance(act, ir.Load)
            and act.buffer.dtype == DType.Q8_0X
            and len(act.indices) == 1
            and is_k(act.indices[0])
        ):
            acts = act.buffer
        else:
            return None
        if load is None or len(load.indices) < 2 or not is_k(load.indices[-1]):
            return None
        if not load.buffer.dtype.has_int_dot:
            return None
        if any(is_k(x) for i in load.indices[:-1] for x in kwalk(i)):
            return None
        terms.append(IntDotTerm(red, load, acts))
    return terms or None


@attrs.frozen
class GridItem:
    """Work a phase spreads over the grid: `extent` items, `per_workgroup` per workgroup, or
    `rows_per_subgroup` per subgroup (then the runtime multiplies by subgroups per workgroup)."""

    extent: ir.Expr
    per_workgroup: int | None
    rows_per_subgroup: int | None


@attrs.frozen(eq=False)
class Kernel:
    name: str  # file stem: region, region.unfused.0, ...
    region: ir.Region
    workgroup_size: int
    subgroup: ir.SubgroupReq
    bindings: tuple[Binding, ...]
    shared: tuple[SharedArray, ...]
    reduction_scratch: bool  # a workgroup reduction needs workgroup_size floats of shared
    phases: tuple[Phase, ...]
    grid: tuple[GridItem, ...]
    stages: tuple[str, ...]  # the region stages this kernel computes (for reports)
    # consecutive kernels with the same `loop` id run `loop_count` times (an unfused repeat)
    loop: int | None = attrs.field(default=None, kw_only=True)
    loop_count: ir.Expr | None = attrs.field(default=None, kw_only=True)
    exchange_scratch: bool = attrs.field(default=False, kw_only=True)
    zero_outputs: tuple[str, ...] = attrs.field(default=(), kw_only=True)  # zeroed before
    atomics: bool = attrs.field(default=False, kw_only=True)  # needs float atomic add
    # per stage, which workgroups compute it; empty for a region without stages in grid
    plan: tuple[StagePlan, ...] = attrs.field(default=(), kw_only=True)

    @property
    def uses_f16(self) -> bool:
        return any(b.buffer.dtype == DType.F16 for b in self.bindings)

    @property
    def uses_f64(self) -> bool:
        """Some value is computed in double precision (a stage `as f64`)."""
        return any(getattr(x, "dtype", None) == DType.F64 for x in attrs_nodes(self.phases))

    @property
    def counters(self) -> tuple[ir.Buffer, ...]:
        """Arrival counters: zero when allocated, left at zero by every dispatch."""
        return tuple(p.counter for p in self.phases if isinstance(p, Arrive))

    @property
    def uses_int_dot(self) -> bool:
        """Needs shaderIntegerDotProduct (SPV_KHR_integer_dot_product)."""
        return any(isinstance(p, Contract) and int_dot_terms(p) for p in self.phases)


def attrs_nodes(root: object) -> list[object]:
    """Every attrs instance reachable from `root` through fields, tuples and lists."""
    seen: set[int] = set()
    out: list[object] = []
    todo = [root]
    while todo:
        x = todo.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, tuple | list):
            todo.extend(x)
        elif attrs.has(type(x)):
            out.append(x)
            todo.extend(getattr(x, f.name) for f in attrs.fields(type(x)))  # type: ignore[arg-type]
    return out


def kexpr_children(e: KExpr) -> tuple[KExpr, ...]:
    match e:
        case LocalRef() | WorkgroupIndex() | SliceBase():
            return ()
        case SharedLoad(_, index):
            return (index,)
        case TileRef(_, indices):
            return indices
        case _:
            return ir.children(e)


def kwalk(e: KExpr) -> list[KExpr]:
    out: list[KExpr] = [e]
    for c in kexpr_children(e):
        out.extend(kwalk(c))
    return out


def reduces_in(e: KExpr) -> list[ir.Reduce]:
    """The reductions of `e`, each node once (share_reductions makes equal ones one node)."""
    return list({id(x): x for x in kwalk(e) if isinstance(x, ir.Reduce)}.values())


def share_reductions(e: KExpr) -> KExpr:
    """`e` with equal reductions as one node.  A register stage read several times (`gate[f]`
    in a hand-written gelu) is inlined at every read; each copy would get an accumulator, loads
    and dot products of its own, where one node is computed once and read by every use (the
    GLSL printer names a reduction's result by its node)."""
    seen: dict[ir.Reduce, ir.Reduce] = {}

    def share(x: KExpr) -> KExpr:
        match x:
            case ir.Reduce(_, _, body):
                r = attrs.evolve(x, body=share(body))  # type: ignore[arg-type]
                return seen.setdefault(r, r)

            case ir.Call(fn, args, dtype):
                return ir.Call(fn, tuple(share(a) for a in args), dtype)  # type: ignore[misc]
            case ir.BinOp(op, lhs, rhs, dtype):
                return ir.BinOp(op, share(lhs), share(rhs), dtype)  # type: ignore[arg-type]
            case ir.Neg(v):
                return ir.Neg(share(v))  # type: ignore[arg-type]
        return x

    return share(e)


def tile_vars(body: tuple[TileStmt, ...]) -> set[str]:
    """The tile values a tile program assigns (repeat bodies included)."""
    out: set[str] = set()
    for st in body:
        if isinstance(st, TileRepeat):
            out |= tile_vars(st.body)
        elif isinstance(st, TileAssign):
            out.add(st.var)
    return out
