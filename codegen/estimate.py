"""Kernel IR -> resource estimate per target and wave size: register demand per lane, uniform
(SGPR-like) values, LDS bytes, predicted spills, waves per SIMD.

Static, on the kernel IR (never on GLSL), and fast.  The register demand is a liveness count over
the phases of a kernel, with per-phase costs calibrated against ACO's `Pre-Sched VGPRs` on the
RADV null device (Mesa 25.0.7, gfx1201, wave32 and wave64 give the same demand).  Measured for a
matvec contraction with R rows per subgroup and V elements per lane per step (W f32 / f16):

    R \\ V   1      2      4      8      16        (f32 | f16)
    1       6|6    8|8   12|10  14|11  14|11
    2       7|7   10|8   16|10  17|11  17|12
    4       9|9   14|10  24|12  25|13  25|14
    8      13|13  22|14  40|16  41|17  41|18
    16     21|21  38|22  72|24  73|25  73|26

(the step's loads issued one element at a time).  Since the generator issues wide loads (up to
16 bytes, `glsl.vector_loads`) for V >= 2, the step keeps V·bytes/4 words of each row's weights
live: per row one accumulator plus V·bytes/4 (3 for a q8_0/q4_0 block: index, scale, quant),
over an intercept of 3 + V words of the shared f32 operand (3 + min(V, 4) - 1 when it is read
from shared memory).  Measured on the same device for the wide path, f16: R=2 V=8 -> 21,
R=16 V=16 -> 163; f32: R=16 V=16 -> 291; q8_0: R=4 V=8 -> 28.  For the scalar path
(V = 1), the older table:  an intercept of
4 + Σ over row-independent operands of min(V, 4) (+1 once V >= 8), and per row one accumulator
per reduction plus min(V, 4) - 1 per 32-bit row-dependent load (16-bit loads are converted in
pairs and add nothing; GGUF q8_0/q4_0 blocks add 2: kernels.fuse's quantized regions measure
13-21 against 14-20 estimated).  `tests/codegen/test_estimate.py` holds the estimate against
ACO for every kernel of kernels.fuse.  Not modelled: instruction scheduling beyond that,
scalar-register pressure (SGPRs never limit occupancy on RDNA; FACTS.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from dsl import ir
from dsl.types import DType, Scope

from . import kir
from .glsl import block_words, int_dot_unroll, vector_loads
from .targets import Target, occupancy, spill_limit

TILE_BASE = 4


@attrs.frozen
class Estimate:
    target: str
    wave: int
    vgprs: int  # estimated demand per lane
    sgprs: int
    lds_bytes: int
    spills: int
    waves_per_simd: int

    def as_dict(self) -> dict[str, int | str]:
        return attrs.asdict(self)


def _loads(e: kir.KExpr) -> list[kir.KExpr]:
    seen: list[kir.KExpr] = []
    for x in kir.kwalk(e):
        if isinstance(x, ir.Load | kir.SharedLoad) and x not in seen:
            seen.append(x)
    return seen


def _operand_name(load: kir.KExpr) -> str:
    return load.buffer.name if isinstance(load, ir.Load) else load.array.name  # type: ignore[union-attr]


def _mentions(e: kir.KExpr, var: ir.IndexVar) -> bool:
    return any(isinstance(x, ir.IndexRef) and x.var is var for x in kir.kwalk(e))


def _row_extra(load: kir.KExpr, vector: int) -> int:
    """Registers a row-dependent load holds beyond the accumulator (ACO, measured): 32-bit
    elements keep min(V, 4) - 1 more, 16-bit ones are converted in pairs and add none, GGUF
    blocks (q8_0, q4_0) keep 2 (scale and packed quants)."""
    dtype = load.buffer.dtype if isinstance(load, ir.Load) else DType.F32
    if dtype == DType.F16:
        return 0
    if dtype.is_quantized:
        return 2 if vector > 1 else 0
    return min(vector, 4) - 1


def _wide_contract_demand(
    reds: list[ir.Reduce], wide: list[ir.Load], row: ir.IndexVar, v: int, rows: int
) -> int:
    """Demand of a contraction step whose global loads are issued as whole vectors (see
    `glsl.vector_loads`): the loaded words stay live until the step's FMAs consume them."""
    intercept, per_row = 3, len(reds)
    quantized = False
    seen: set[str] = set()
    for red in reds:
        for load in _loads(red.body):
            name = _operand_name(load)
            is_wide = any(load is w for w in wide)
            if _mentions(load, row):
                if not is_wide:
                    per_row += _row_extra(load, v)
                elif load.buffer.dtype.is_quantized:  # type: ignore[union-attr]
                    # index and scale, plus the 8-quant groups converted ahead of their FMAs
                    # (ACO: V = 8 -> 3, 16 -> 5, 32 -> 9 per row)
                    per_row += max(3, v // 4 + 1)
                    quantized = True
                else:
                    per_row += v * _bytes(load) // 4
            elif name not in seen:
                seen.add(name)
                intercept += v * _bytes(load) // 4 if is_wide else min(v, 4) - 1
    if quantized and v >= 16:
        intercept += 1
    return intercept + rows * per_row


QUANT_OVERHEAD = 7


def _int_dot_demand(terms: list[kir.IntDotTerm], rows: int) -> int:
    """Integer dot products: every block of an unrolled iteration is loaded before the dot
    products, so each holds its activation block (8 quant words, scale, sum) and, per row and
    reduction, the weight scale and the raw words of its block (5 for q4_0, 9 for q8_0); one
    accumulator per row and reduction.  ACO (gfx1201): 67-89 against 66-94 estimated."""
    unroll = int_dot_unroll(terms, rows)
    acts = {id(t.acts) for t in terms}
    per_block = 10 * len(acts) + rows * sum(1 + block_words(t.weight.buffer.dtype) for t in terms)
    return 4 + unroll * per_block + rows * len(terms)


def _bytes(load: kir.KExpr) -> int:
    return 2 if isinstance(load, ir.Load) and load.buffer.dtype == DType.F16 else 4


def _flat_tile(
    body: tuple[kir.TileStmt, ...], depth: int = 0
) -> list[tuple[kir.TileAssign | kir.TileStore, int]]:
    out: list[tuple[kir.TileAssign | kir.TileStore, int]] = []
    for st in body:
        if isinstance(st, kir.TileRepeat):
            out += _flat_tile(st.body, depth + 1)
        else:
            out.append((st, depth))
    return out


def _tile_demand(tile: ir.Tile, body: tuple[kir.TileStmt, ...]) -> int:
    """Peak registers of a tile program.  A value read across slots (by a reduction over a slot
    index) keeps all its slots live; one only read in its own slot is computed slot by slot, so
    the compiler holds one slot at a time (seen with ACO: 128 independent slots need 4 VGPRs)."""
    stmts = _flat_tile(body)
    slot_dims = {d.name for d in tile.dims if tile.on_slots(d)}
    across: set[str] = set()
    for st, _ in stmts:
        for x in kir.kwalk(st.value):
            if isinstance(x, ir.Reduce) and x.var.name in slot_dims:
                across |= {r.var for r in kir.kwalk(x.body) if isinstance(r, kir.TileRef)}
    reads = [{r.var for r in kir.kwalk(st.value) if isinstance(r, kir.TileRef)} for st, _ in stmts]
    peak = 0
    for i, (st, depth) in enumerate(stmts):
        defined = {s.var for s, _ in stmts[:i] if isinstance(s, kir.TileAssign)}
        later = set().union(*reads[i:]) if reads[i:] else set()
        if depth:  # inside a loop, what the loop reads stays live for its whole body
            later |= set().union(*(r for (s, d), r in zip(stmts, reads, strict=True) if d))
        live = defined & later
        regs = sum(tile.slots if v in across else 1 for v in live)
        new = tile.slots if isinstance(st, kir.TileAssign) and st.var in across else 1
        peak = max(peak, regs + new)
    return TILE_BASE + peak


def _phase_demand(p: kir.Phase) -> int:
    match p:
        case kir.TilePhase(tile, body, _):
            return _tile_demand(tile, body)
        case kir.SplitK(_, _, _, _, value):
            # a lane's row: the accumulator, the loaded weight and slice value, addresses
            return 4 + min(len(_loads(value)), 4)
        case kir.QuantizeBlocks():
            # a lane's 8 values of its block, 2 packed words, scale, sum, indices (ACO: 17)
            return 8 + 2 + QUANT_OVERHEAD
        case kir.Contract() if (terms := kir.int_dot_terms(p)) is not None:
            return _int_dot_demand(terms, p.rows)
        case kir.Contract(_, row, value, layout, rows):
            reds = kir.reduces_in(value)
            if layout.row_unit == Scope.LANE:
                return 2 + len(reds) + min(len(_loads(value)), 4)
            v = layout.vector
            wide = vector_loads(reds, list(range(len(reds))), v)
            if wide:
                return _wide_contract_demand(reds, wide, row, v, rows)
            intercept = 4 + (1 if v >= 8 else 0)
            per_row = len(reds)
            shared_operands: set[str] = set()  # x[k] read by gate and up is loaded once
            for red in reds:
                for load in _loads(red.body):
                    if _mentions(load, row):
                        per_row += _row_extra(load, v)
                    else:
                        shared_operands.add(_operand_name(load))
            intercept += min(v, 4) * len(shared_operands)
            return intercept + rows * per_row
        case kir.ScalarPhase(_, value) | kir.StoreScalar(_, value):
            return 2 + len(kir.reduces_in(value)) + min(len(_loads(value)), 4)
        case kir.FillShared(_, _, value) | kir.StoreMap(_, _, value):
            return 2 + len(kir.reduces_in(value)) + min(len(_loads(value)), 4)
    raise AssertionError(p)


def _locals_used(p: kir.Phase) -> set[str]:
    return {x.name for x in kir.kwalk(p.value) if isinstance(x, kir.LocalRef)}


def estimate_vgprs(kernel: kir.Kernel) -> int:
    """Peak live 32-bit values per lane: the costliest phase plus locals live across it."""
    peak = 0
    phases = kernel.phases
    for i, p in enumerate(phases):
        defined_before = {q.name for q in phases[:i] if isinstance(q, kir.ScalarPhase)}
        used_later: set[str] = set()
        for q in phases[i:]:
            used_later |= _locals_used(q)
        live = len(defined_before & used_later)
        peak = max(peak, _phase_demand(p) + live)
    return peak


def estimate_sgprs(kernel: kir.Kernel) -> int:
    """Uniform values: 2 per buffer address, workgroup id and sizes, spec constants, loop bounds."""
    return 2 * len(kernel.bindings) + 4 + len(kernel.region.consts) + len(kernel.phases)


def lds_bytes(kernel: kir.Kernel, consts: Mapping[str, int | float]) -> int:
    total = sum(4 * ir.evaluate_int(a.words, dict(consts)) for a in kernel.shared)
    if kernel.reduction_scratch:
        total += 4 * kernel.workgroup_size
    if kernel.exchange_scratch:
        total += 4 * kernel.workgroup_size
    return total


def estimate(
    kernel: kir.Kernel, target: Target, wave: int, consts: Mapping[str, int | float] | None = None
) -> Estimate:
    return estimates(kernel, [(target, wave)], consts)[0]


def estimates(
    kernel: kir.Kernel,
    where: Sequence[tuple[Target, int]],
    consts: Mapping[str, int | float] | None = None,
) -> list[Estimate]:
    """The estimate on each (target, wave): register demand and LDS are the kernel's own,
    measured once; spill limits, granules and occupancy are the target's."""
    values = {c.name: c.default for c in kernel.region.consts}
    values.update(consts or {})
    demand = estimate_vgprs(kernel)
    sgprs = estimate_sgprs(kernel)
    raw_lds = lds_bytes(kernel, values)
    out = []
    for target, wave in where:
        limit = spill_limit(target, wave, kernel.workgroup_size)
        lds = -(-raw_lds // target.lds_granule) * target.lds_granule
        spills = max(0, demand - limit)
        waves = occupancy(target, wave, min(demand, limit), lds, kernel.workgroup_size)
        out.append(Estimate(target.name, wave, demand, sgprs, lds, spills, waves))
    return out
