"""Kernel IR + code knobs -> the scheduling plan: every decision about how a contraction's loops
are written (loops by extent, wide loads and how they are read, unrolled steps, tails, integer
dot product terms and their block reads) and which values of a quantized stage are read wide.

`plan_kernel(kernel, knobs)` is the one place these are decided; the GLSL printer
(codegen/glsl*.py) renders a plan and decides none of it, and `fusec build --dump kir` prints it
(kir_print.format_plan).  The plan is passed alongside the kernel rather than stored on it: the
kernel IR is the same for every target (one kernel, estimates for many targets), and the plan
is a function of the kernel and a knob set (`targets.CodeKnobs`).  A build renders every kernel
with `targets.CODE_PROFILE` (one SPIR-V module serves every target); a per-target build calls
`plan_kernel(kernel, target.knobs)`.  Plans are memoized per kernel and knob set.

Input: a lowered `kir.Kernel` and a `CodeKnobs`.  Output: a `KernelPlan` (frozen records that
refer to the kernel's own reductions and loads by object).  Not done here: the form of a
contraction (rows per subgroup, vector width, rows -> lane/subgroup/workgroup: the layout,
chosen in the language and by `lower.py`), and any check that the plan is valid for the kernel
beyond what its construction asserts.
"""

from __future__ import annotations

import enum
import weakref
from typing import Union

import attrs

from fusec.dsl import ir
from fusec.dsl.types import DType, Scope

from . import kir
from .targets import CODE_PROFILE, CodeKnobs


class ReadPath(enum.Enum):
    """How a wide load fetches its elements."""

    WORDS = "words"  # f16/f32: uint-vector views of the buffer, `chunk_words` words a load
    QUANT8 = "quant8"  # a GGUF block's quants 8 at a time (quant8_W), scales per span
    QUANT = "quant"  # a GGUF block's quants one at a time (quant_W), scales per span
    SUB32 = "sub32"  # a whole q4_K sub-block of 32 (sub32_W through a uvec4 view)


class BlockRead(enum.Enum):
    """How an integer dot product step reads one weight block of 32 (the helper it calls)."""

    BLK = "blk"  # q8_0: blk_W, the scale and 8 quant words
    BLK_Q4_0 = "blk_q4_0"  # q4_0: blk_W, the scale and 4 words of nibbles
    SUB32_Q6_K = "sub32_q6_K"  # q6_K: sub32_W, a sub-block's quants and its two 16-scales
    SUB32_Q4_K = "sub32_q4_K"  # q4_K: sub32_W through a uvec4 view, scale and min


class ActSource(enum.Enum):
    """Where an integer dot product step reads its activation block of 32 (q8_0)."""

    # the workgroup's shared array, quantized by every workgroup before the loop (`in shared
    # as q8_0`): two 16-byte reads of the quants, one 8-byte read of scale and quant sum
    SHARED = "shared"
    # a global buffer of blocks in fusec's aligned layout (DType.Q8_0X: a region input
    # rounded by the kernel that produced it, or an unfused chain's intermediate): the lane
    # loads the blocks it multiplies, three 16-byte loads each; no staging, no barrier
    GLOBAL = "global"


# 32-bit words one block of 32 weights costs a lane on each block-read path (q4_K: the
# super-block's head and the sub-block's quants, three 16-byte loads; q6_K: 16 words of quants,
# 2-byte aligned, and the scales)
BLOCK_WORDS = {
    BlockRead.BLK: 9,
    BlockRead.BLK_Q4_0: 5,
    BlockRead.SUB32_Q6_K: 18,
    BlockRead.SUB32_Q4_K: 12,
}


@attrs.frozen
class WideLoad:
    """A global load read as `elements` consecutive elements at once (its last index is the
    step's index, a multiple of `elements`), feeding reduction `reduce`."""

    load: ir.Load
    reduce: ir.Reduce | None  # None in a quantized stage (no reduction: the stage's index)
    row_dependent: bool  # one load per row of the step (else one shared by every row)
    elements: int
    read: ReadPath
    chunk_words: int  # ReadPath.WORDS: 32-bit words per load instruction (1, 2 or 4); else 0


@attrs.frozen
class StepLoop:
    """One loop over a reduced extent, shared by the contraction's reductions `reduces` (their
    positions in `kir.reduces_in(value)`): each step takes `vector` elements per lane.

    With `wide` loads and `aligned` row lengths, the wide path runs only when every such
    length is a multiple of `vector`, behind a branch on specialization constants whose other
    side is the plain loop.  `unroll` > 1: that many steps in straight-line code first (wide
    path only).  `tail`: a last, guarded step for the elements past the last whole one.
    `whole_blocks`: every row-indexed wide load is a GGUF block row, so each row starts aligned
    and no tail remains; the wide loop runs alone."""

    extent: ir.Expr
    reduces: tuple[int, ...]
    vector: int
    wide: tuple[WideLoad, ...]
    aligned: tuple[ir.Expr, ...]
    whole_blocks: bool
    unroll: int
    tail: bool

    def __attrs_post_init__(self) -> None:
        assert self.unroll >= 1
        assert not (self.whole_blocks and (self.unroll > 1 or self.tail))


@attrs.frozen
class IntDotRead:
    """One integer dot product term and the path that reads its weight blocks."""

    term: kir.IntDotTerm
    read: BlockRead
    acts: ActSource


@attrs.frozen
class IntDotLoop:
    """One loop over a reduced extent whose reductions are all integer dot products: a whole
    block of 32 per lane per step, `unroll` steps (blocks) per iteration of the first loop
    (every load of them before the dot products), then one block at a time."""

    extent: ir.Expr
    reduces: tuple[int, ...]
    terms: tuple[IntDotRead, ...]  # in the order of `reduces`
    unroll: int

    def __attrs_post_init__(self) -> None:
        assert self.unroll >= 1
        assert len(self.terms) == len(self.reduces)


Loop = Union[StepLoop, IntDotLoop]


@attrs.frozen
class ContractPlan:
    """The loops of a contraction whose rows go to subgroups or workgroups (phase `phase` of the
    kernel), one per reduced extent in order of first use: reductions over equal extents (gate
    and up over K) share one."""

    phase: int
    loops: tuple[Loop, ...]


@attrs.frozen
class QuantizePlan:
    """A quantized stage (phase `phase`): the loads read as 4-element vectors, which need the
    stage's extent and the `aligned` row lengths to be multiples of 4 (else a plain path)."""

    phase: int
    wide: tuple[WideLoad, ...]
    aligned: tuple[ir.Expr, ...]


PhasePlan = Union[ContractPlan, QuantizePlan]


@attrs.frozen
class LaneLoop:
    """A loop of one lane over an index of this extent (a lane reduction, a tile's `repeat`):
    `unrolled` in the GLSL, or kept a loop (the driver is told not to unroll it)."""

    extent: ir.Expr
    unrolled: bool


@attrs.frozen
class ItemPlan:
    """The kernel as an item of a persistent product (codegen/persistent.py): its body becomes
    a function of its workgroup's index and count (`item_wg`, `item_count`) instead of `main`
    over the dispatch's builtins; its buffers take the product's binding numbers; its constants
    are the call's values, plain constants (the product is compiled for one call of each
    region); the buffers that another item of the product writes or reads are `coherent`
    (made available and visible at queue-family scope: they cross workgroups within the
    dispatch).  Names stay the kernel's own: the product gives each item's global names a
    prefix of its own."""

    bindings: tuple[tuple[str, int], ...]  # buffer name -> binding in the product
    consts: tuple[tuple[str, int | float], ...]  # every constant the region declares
    coherent: frozenset[str] = frozenset()

    def binding(self, buffer: str) -> int:
        return dict(self.bindings)[buffer]

    def const(self, name: str) -> int | float:
        return dict(self.consts)[name]


class RunKind(enum.Enum):
    """What the phases of a `PhaseRun` are."""

    # workgroup reductions (`x = sum(...) @ workgroup`): every one's subgroup result goes to
    # s_reduce at once, one barrier, every one combined, one barrier
    REDUCTIONS = "reductions"
    # fills of shared arrays: no barrier between them, one after the last
    FILLS = "fills"


# the most workgroup reductions one exchange through s_reduce holds: s_reduce has a word per
# lane, and a run of n takes n words per subgroup (n <= the smallest subgroup, 4 lanes:
# dsl/check_state.py min_subgroup_size)
MAX_JOINED_REDUCTIONS = 4


@attrs.frozen
class PhaseRun:
    """Consecutive phases that are independent of each other (none reads what an earlier one
    of the run computes, none writes what an earlier one reads), rendered as one: a barrier
    (fills) or a pair of barriers (reductions) for the whole run instead of one or two per
    phase, and their loads in flight together.  `loops`: the run's phases by the loop that
    renders them (fills over one extent share a loop, so that the compiler sees common
    subexpressions, e.g. a RoPE angle, once)."""

    kind: RunKind
    phases: tuple[int, ...]
    loops: tuple[tuple[int, ...], ...]


@attrs.frozen
class KernelPlan:
    """The plan of one kernel under one knob set: a record per planned phase, by position, one
    per extent of the kernel's lane loops, and the runs of phases rendered together."""

    knobs: CodeKnobs
    phases: tuple[PhasePlan, ...]
    lane_loops: tuple[LaneLoop, ...] = ()
    item: ItemPlan | None = None  # an item of a persistent product; None: a kernel of its own
    runs: tuple[PhaseRun, ...] = ()

    def run_at(self, phase: int) -> PhaseRun | None:
        """The run that phase `phase` belongs to, if any."""
        return next((r for r in self.runs if phase in r.phases), None)

    def lane_loop(self, extent: ir.Expr) -> LaneLoop:
        for x in self.lane_loops:
            if x.extent == extent:
                return x
        raise AssertionError(f"no lane loop over {extent} in the plan")

    def contract(self, phase: int) -> ContractPlan:
        found = next(p for p in self.phases if p.phase == phase)
        assert isinstance(found, ContractPlan)
        return found

    def quantize(self, phase: int) -> QuantizePlan:
        found = next(p for p in self.phases if p.phase == phase)
        assert isinstance(found, QuantizePlan)
        return found

    def of(self, phase: int) -> PhasePlan | None:
        return next((p for p in self.phases if p.phase == phase), None)


_PLANS: weakref.WeakKeyDictionary[kir.Kernel, dict[CodeKnobs, KernelPlan]] = (
    weakref.WeakKeyDictionary()
)


def plan_kernel(kernel: kir.Kernel, knobs: CodeKnobs = CODE_PROFILE) -> KernelPlan:
    """The plan of `kernel` under `knobs` (memoized per kernel and knob set)."""
    per_kernel = _PLANS.setdefault(kernel, {})
    if knobs not in per_kernel:
        per_kernel[knobs] = _plan(kernel, knobs)
    return per_kernel[knobs]


def _plan(kernel: kir.Kernel, knobs: CodeKnobs) -> KernelPlan:
    phases: list[PhasePlan] = []
    for i, p in enumerate(kernel.phases):
        if isinstance(p, kir.Contract) and p.layout.row_unit in (Scope.SUBGROUP, Scope.WORKGROUP):
            phases.append(plan_contract(i, p, knobs))
        elif isinstance(p, kir.QuantizeBlocks):
            phases.append(plan_quantize(i, p, knobs))
    return KernelPlan(knobs, tuple(phases), plan_lane_loops(kernel, knobs), runs=plan_runs(kernel))


def _joinable_reduction(p: kir.Phase) -> bool:
    """A float scalar phase whose reductions are all flat workgroup sums, maxima or minima."""
    if not isinstance(p, kir.ScalarPhase) or p.value.dtype.is_int:
        return False
    reds = kir.reduces_in(p.value)
    return bool(reds) and all(
        r.scope == Scope.WORKGROUP and r.op in ("sum", "max", "min") and not kir.reduces_in(r.body)
        for r in reds
    )


def _locals(e: kir.KExpr) -> set[str]:
    return {x.name for x in kir.kwalk(e) if isinstance(x, kir.LocalRef)}


def _shared_reads(e: kir.KExpr) -> set[str]:
    return {x.array.name for x in kir.kwalk(e) if isinstance(x, kir.SharedLoad)}


def plan_runs(kernel: kir.Kernel) -> tuple[PhaseRun, ...]:
    """Runs of two or more consecutive phases that need no barrier between them: workgroup
    reductions of which none reads another's result (at most MAX_JOINED_REDUCTIONS
    reductions), and fills of shared arrays of which none reads or writes an array another
    writes."""
    phases, runs, i = kernel.phases, [], 0
    while i < len(phases):
        j = i + 1
        p = phases[i]
        if _joinable_reduction(p):
            assert isinstance(p, kir.ScalarPhase)
            names, count = {p.name}, len(kir.reduces_in(p.value))
            while j < len(phases) and _joinable_reduction(q := phases[j]):
                assert isinstance(q, kir.ScalarPhase)
                n = len(kir.reduces_in(q.value))
                if _locals(q.value) & names or count + n > MAX_JOINED_REDUCTIONS:
                    break
                names.add(q.name)
                count += n
                j += 1
            if j - i > 1:
                at = tuple(range(i, j))
                runs.append(PhaseRun(RunKind.REDUCTIONS, at, tuple((k,) for k in at)))
        elif isinstance(p, kir.FillShared):
            written, read = {p.array.name}, _shared_reads(p.value)
            while j < len(phases) and isinstance(q := phases[j], kir.FillShared):
                reads = _shared_reads(q.value)
                if q.array.name in written | read or reads & written:
                    break
                written.add(q.array.name)
                read |= reads
                j += 1
            if j - i > 1:
                loops: list[list[int]] = []
                for k in range(i, j):
                    fill = phases[k]
                    assert isinstance(fill, kir.FillShared)
                    last = phases[loops[-1][0]] if loops else None
                    if isinstance(last, kir.FillShared) and last.var.extent == fill.var.extent:
                        loops[-1].append(k)
                    else:
                        loops.append([k])
                runs.append(PhaseRun(RunKind.FILLS, tuple(range(i, j)), tuple(map(tuple, loops))))
        i = j
    return tuple(runs)


def plan_lane_loops(kernel: kir.Kernel, knobs: CodeKnobs) -> tuple[LaneLoop, ...]:
    """A loop of one lane is unrolled when its trip count is a literal of at most
    `serial_unroll`; else it stays a loop (knobs.serial_unroll says why).  One record per
    extent of a lane reduction (one of lane scope, or any reduction of a contraction whose
    rows go to lanes) or of a tile's `repeat`."""
    extents: list[ir.Expr] = []
    for p in kernel.phases:
        lane_rows = isinstance(p, kir.Contract) and p.layout.row_unit == Scope.LANE
        for x in kir.attrs_nodes(p):
            if isinstance(x, kir.TileRepeat):
                extents.append(x.count)
            elif isinstance(x, ir.Reduce) and (lane_rows or x.scope == Scope.LANE):
                extents.append(x.var.extent)
    out: list[LaneLoop] = []
    for e in extents:
        if all(x.extent != e for x in out):
            unrolled = isinstance(e, ir.Lit) and int(e.value) <= knobs.serial_unroll
            out.append(LaneLoop(e, unrolled))
    return tuple(out)


def plan_contract(phase: int, p: kir.Contract, knobs: CodeKnobs) -> ContractPlan:
    """The loops of a rows -> subgroup/workgroup contraction (ContractPlan)."""
    reds = kir.reduces_in(p.value)
    groups: list[tuple[ir.Expr, list[int]]] = []  # one loop per extent, in order of first use
    for j, red in enumerate(reds):
        at = next((g for g in groups if g[0] == red.var.extent), None)
        if at is None:
            groups.append((red.var.extent, [j]))
        else:
            at[1].append(j)
    terms = kir.int_dot_terms(p)
    loops: list[Loop] = []
    for extent, js in groups:
        if terms is not None:
            loops.append(_int_dot_loop(extent, [terms[j] for j in js], js, p.rows, knobs))
        else:
            loops.append(_step_loop(extent, p, reds, js, knobs))
    return ContractPlan(phase, tuple(loops))


def block_read(dtype: DType) -> BlockRead:
    """The path that reads a weight block of 32 of `dtype` for integer dot products."""
    return {
        DType.Q4_0: BlockRead.BLK_Q4_0,
        DType.Q6_K: BlockRead.SUB32_Q6_K,
        DType.Q4_K: BlockRead.SUB32_Q4_K,
    }.get(dtype, BlockRead.BLK)


def act_source(acts: kir.SharedArray | ir.Buffer) -> ActSource:
    """Where an integer dot product term reads its activation blocks."""
    if isinstance(acts, kir.SharedArray):
        assert acts.stored == DType.Q8_0
        return ActSource.SHARED
    assert acts.dtype == DType.Q8_0X
    return ActSource.GLOBAL


def _int_dot_loop(
    extent: ir.Expr, terms: list[kir.IntDotTerm], js: list[int], rows: int, knobs: CodeKnobs
) -> IntDotLoop:
    """Blocks are unrolled until about `int_dot_words` words of weights are loaded per lane
    before the dot products (at most `max_unroll`)."""
    reads = tuple(
        IntDotRead(t, block_read(t.weight.buffer.dtype), act_source(t.acts)) for t in terms
    )
    words = rows * sum(BLOCK_WORDS[r.read] for r in reads)
    unroll = max(1, min(knobs.max_unroll, knobs.int_dot_words // max(words, 1)))
    return IntDotLoop(extent, tuple(js), reads, unroll)


def _step_loop(
    extent: ir.Expr, p: kir.Contract, reds: list[ir.Reduce], js: list[int], knobs: CodeKnobs
) -> StepLoop:
    vec = p.layout.vector
    loads = vector_loads(reds, js, vec)
    wide = tuple(_wide(ld, _feeds(ld, reds, js), p.row, vec, knobs) for ld in loads)
    rows_2d = [ld for ld in loads if len(ld.buffer.shape) > 1]
    if rows_2d and all(ld.buffer.dtype.is_quantized for ld in rows_2d):
        # GGUF rows are whole blocks (32 or 256 elements) and vec divides 32 (vector_loads):
        # every row starts aligned and no element is left for a tail loop.  Not unrolled:
        # their dequantization already holds many registers (docs/BENCHMARKS.md: 3-4x slower)
        return StepLoop(extent, tuple(js), vec, wide, (), True, 1, False)
    aligned: list[ir.Expr] = []
    for ld in rows_2d:
        if all(ld.buffer.shape[-1] != a for a in aligned):
            aligned.append(ld.buffer.shape[-1])
    unroll = 1
    if wide:
        # steps unrolled until their wide row loads are about `loads_in_flight`
        row_loads = p.rows * len(rows_2d)
        unroll = max(1, min(knobs.max_unroll, knobs.loads_in_flight // max(row_loads, 1)))
    return StepLoop(extent, tuple(js), vec, wide, tuple(aligned), False, unroll, vec > 1)


def _feeds(load: ir.Load, reds: list[ir.Reduce], js: list[int]) -> ir.Reduce:
    """The first of the loop's reductions that reads `load`."""
    return next(reds[j] for j in js if any(x is load for x in kir.kwalk(reds[j].body)))


def _wide(
    load: ir.Load, red: ir.Reduce | None, row: ir.IndexVar | None, vec: int, knobs: CodeKnobs
) -> WideLoad:
    row_dep = row is not None and any(
        isinstance(x, ir.IndexRef) and x.var is row for x in kir.kwalk(load)
    )
    dtype = load.buffer.dtype
    if dtype == DType.Q4_K and vec == 32:
        return WideLoad(load, red, row_dep, vec, ReadPath.SUB32, 0)
    if dtype.is_quantized:
        return WideLoad(load, red, row_dep, vec, ReadPath.QUANT if vec % 8 else ReadPath.QUANT8, 0)
    chunk = min(knobs.max_load_bytes, vec * dtype.bytes)
    return WideLoad(load, red, row_dep, vec, ReadPath.WORDS, chunk // 4)


def vector_loads(reds: list[ir.Reduce], js: list[int], vec: int) -> list[ir.Load]:
    """Global loads of a contraction step that can be issued as one wide load per step: their
    last index is the reduced variable itself and no other index mentions it; f16, f32, or a
    GGUF block row when `vec` divides its block of 32."""
    if vec < 2:
        return []
    found: list[ir.Load] = []
    for j in js:
        red = reds[j]
        for x in kir.kwalk(red.body):
            if not isinstance(x, ir.Load) or any(x is f for f in found):
                continue
            last = x.indices[-1]
            if not (isinstance(last, ir.IndexRef) and last.var is red.var):
                continue
            if any(_mentions(o, red.var) for o in x.indices[:-1]):
                continue
            if x.buffer.dtype.is_quantized and 32 % vec:
                continue
            if x.buffer.dtype in (DType.F16, DType.F32) or x.buffer.dtype.is_quantized:
                found.append(x)
    return found


def _mentions(e: kir.KExpr, var: ir.IndexVar) -> bool:
    return any(isinstance(y, ir.IndexRef) and y.var is var for y in kir.kwalk(e))


def plan_quantize(phase: int, p: kir.QuantizeBlocks, knobs: CodeKnobs) -> QuantizePlan:
    """f32/f16 loads of a quantized stage's value read as 4-element vectors (each lane's two
    runs of 4 consecutive elements, glsl_quant): their last index is the stage's index and no
    other index mentions it."""
    found: list[ir.Load] = []
    for x in kir.kwalk(p.value):
        if not isinstance(x, ir.Load) or any(x is f for f in found):
            continue
        if x.buffer.dtype not in (DType.F32, DType.F16):
            continue
        last = x.indices[-1]
        if not (isinstance(last, ir.IndexRef) and last.var is p.var):
            continue
        if any(_mentions(o, p.var) for o in x.indices[:-1]):
            continue
        found.append(x)
    wide = tuple(_wide(ld, None, None, 4, knobs) for ld in found)
    aligned: list[ir.Expr] = []
    for ld in found:
        if all(ld.buffer.shape[-1] != a for a in aligned):
            aligned.append(ld.buffer.shape[-1])
    return QuantizePlan(phase, wide, tuple(aligned))
