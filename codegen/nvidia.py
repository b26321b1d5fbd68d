"""The register count NVIDIA's Vulkan driver gives a kernel on Hopper (sm90), predicted from the
SPIR-V we emit.

Input: SPIR-V bytes (shaderc's -O output).  Output: `NvidiaFeatures`, seven numbers measured on
the module, and `estimate_nvidia_registers`, the registers per lane the rules below give (what
the driver reports as `Register Count`).

NVIDIA's compiler does not allocate the liveness demand of the SPIR-V (codegen/liveness.py,
which models Mesa and ACO): it schedules loads for latency and picks its own count.  Measured on
the H200 (driver 580.159.04; docs/ESTIMATOR.md "The H200"; 749 kernels of kernels.fuse and the
generated corpus), a kernel's count follows from these numbers of its SPIR-V:

1. `sunk`: the demand when every load sits at its first use (`liveness.demand(sink_loads=True)`):
   the least a scheduler that may move loads needs.  NVIDIA documents that its compiler trades
   registers for instruction-level parallelism and reorders independent instructions ("CUDA C++
   Best Practices Guide", "Register Pressure"; the `-maxrregcount` and `__launch_bounds__`
   sections of the "CUDA C++ Programming Guide"), so the demand of our order is an upper
   bound it does not keep: 262 demanded, 168 used (`tile__s7_21`); quantized contractions
   whose demand is 64-90 run in 31-44.
2. `block_words`: the most 32-bit words that per-lane loads of storage buffers fetch in one
   block of straight-line code (the unrolled steps of a contraction).  The compiler issues them
   ahead of their uses to hide memory latency (the "Memory Instructions" and "latency hiding"
   discussion of the Best Practices Guide): a contraction whose `sunk` is 9-21 and whose step
   loads 32-96 words runs in 32-40 registers, a little more than half the words on top of
   `sunk`, up to a window (fitted: `window`).
3. `reuse_words`: words that a loop marked `Unroll` loads again after an earlier `Unroll` loop
   of the same trip count loaded them (the same read-only buffer at the same index of the
   induction variable).  Our GLSL marks such loops `[[unroll]]` but their trip count is a
   specialization constant, so shaderc cannot unroll them; the driver can, once the constants
   are known, and then the second loop's loads are the first's (CSE): they live across what lies
   between (a reduction and barriers).  An RMSNorm staged in shared memory reloads `x` this way:
   `norm_matvec__s7_52` (32 words) is 104 registers where its demand is 6.

4. `dots` and `least`: a kernel of integer dot products (SPV_KHR_integer_dot_product, PTX
   `dp4a`: four packed bytes per 32-bit word) is a quantized contraction; shaderc emits its
   unrolled steps as "every step's block reads, then every step's products", with the
   alignment branches of the block reads between them.  The driver if-converts those small
   branches (the CUDA C++ Programming Guide's "Branch Predication") and schedules each step's
   products after its reads: `least` is the demand of each block, small selections flattened,
   in the order of a register-minimizing list scheduler (codegen/nvidia_schedule.py).  Such
   kernels ran in 30-44 registers where rules 1-3 gave 48-66; measured on seed 31's kf + c0,
   the count is 32 up to a `least` of 28 and a quarter of each register above, never more
   than rules 1-3 give (fitted, docs/ESTIMATOR.md; measured only where `dots` > 0).
5. `lane_words`: a `DontUnroll` loop of a constant trip count of at most 128 inside a
   grid-stride loop is unrolled by the driver all the same (the CUDA Programming Guide's
   "#pragma unroll": small loops of a known trip count are unrolled by default), and then the
   loads it makes at addresses that do not change in the outer loop (a[j] of a lane loop
   `acc += a[j] * B[j * N + i]`) are loop-invariant there and hoisted out of it: trip count
   times their words live through the outer loop (128 iterations: 164-169 registers where
   `sunk` is 3).
6. `carried`: the most registers live across a loop's back edge (the values its phis carry and
   those live through it), loads sunk.  Where they are nearly all of `sunk` (a register tile:
   private arrays of one register per slot updated in an iteration loop), no reordering can
   lower them, and the driver issues the block's loads ahead of their uses on top of them, all
   of its words, not the window of rule 2: `tile__s23_36` carries 35 of its 37 and loads 32 words
   in a block, 72 registers where rules 1-5 gave 47.  The share (0.9) was chosen on seeds 7 and
   23 (docs/ESTIMATOR.md).

Rules (`NvidiaRules`; rules 1-3 measured on seed 7's kernels.fuse and corpus batch 0, rules 4-5
on seed 31's; docs/ESTIMATOR.md has the held-out figures):
    base  = sunk                                  if sunk <= knee
          = knee + excess * (sunk - knee)         above it (the scheduler's own reordering)
    count = base + offset + min(slope * block_words, window) + reuse * reuse_words
    count = min(count, dot_count + dot_slope * max(0, least - dot_knee))   with dots
    count = max(count, sunk + offset + lane_words)                         with lane words
    count = max(count, carried + offset + block_words)   where carried >= tile_share * sunk
    count = max(floor, count)
The floor of 16 is what the driver reports for the smallest kernels (no kernel of the 749
reported fewer).  Registers are allocated per warp in units of 256 (8 per lane), 255 at most
per lane, 65536 per SM ("CUDA C++ Programming Guide", "Compute Capabilities", Hopper);
codegen/targets.py `occupancy` applies those.

Not modelled: loads the driver moves above a barrier, register tiles whose state is not loop
carried (a tile computed once, `tile__s23_72`), specialization constants the driver folds into
the rows of a kernel; where the prediction misses, it misses by an occupancy step
(docs/ESTIMATOR.md lists them).
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable

import attrs

from .liveness import demand
from .nvidia_schedule import least_order
from .spirv_grammar import OPCODES
from .spirv_module import _OP, _Block, _divergence, _dominates, _dominators, _Inst, _Module

_NAME = {op: name for op, (name, _) in OPCODES.items()}
_SC_STORAGE_BUFFER = 12
_CHAINS = (_OP["OpAccessChain"], _OP["OpInBoundsAccessChain"])
_OP_LOAD = _OP["OpLoad"]
_OP_FUNCTION = _OP["OpFunction"]
_OP_SPEC_CONSTANT_OP = _OP["OpSpecConstantOp"]
_LOOP_CONTROL_UNROLL = 1  # SPIR-V 3.23 Loop Control
UNROLL_LIMIT = 32  # the most iterations of an `Unroll` loop counted as unrolled
_LOOP_CONTROL_DONT_UNROLL = 2
LANE_LOOP_LIMIT = 128  # the most iterations of a `DontUnroll` loop counted as unrolled (rule 5)
# integer dot products (SPV_KHR_integer_dot_product; PTX `dp4a`)
_DOTS = {
    _OP[n] for n in ("OpSDot", "OpUDot", "OpSUDot", "OpSDotAccSat", "OpUDotAccSat", "OpSUDotAccSat")
}

# OpSpecConstantOp arithmetic the trip counts use (SPIR-V 3.32.6)
_FOLD: dict[str, Callable[[int, int], int | None]] = {
    "OpIAdd": lambda a, b: a + b,
    "OpISub": lambda a, b: a - b,
    "OpIMul": lambda a, b: a * b,
    "OpUDiv": lambda a, b: a // b if b else None,
    "OpUMod": lambda a, b: a % b if b else None,
    "OpShiftLeftLogical": lambda a, b: a << b,
    "OpShiftRightLogical": lambda a, b: a >> b,
    "OpBitwiseAnd": lambda a, b: a & b,
}
# a loop's exit test: `i < bound`, `i <= bound` (or `i + c` against it)
_TESTS = {"OpULessThan": 0, "OpSLessThan": 0, "OpULessThanEqual": 1, "OpSLessThanEqual": 1}


@attrs.frozen
class NvidiaFeatures:
    sunk: int  # register demand with every load at its first use
    block_words: float  # most words per-lane storage-buffer loads fetch in one block
    reuse_words: float  # words an `Unroll` loop reloads after an earlier one (all iterations)
    dots: int = 0  # integer dot products (rule 4)
    least: int = 0  # demand in the order of a register-minimizing scheduler (rule 4; 0: no dots)
    lane_words: float = 0.0  # words a fully unrolled lane loop hoists out of its outer loop (5)
    carried: int = 0  # most registers live across a loop's back edge, loads sunk (rule 6)


@attrs.frozen
class NvidiaRules:
    """The rules' numbers (module docstring), measured on the H200 (docs/ESTIMATOR.md)."""

    floor: int = 16
    knee: int = 28
    excess: float = 0.5
    offset: int = -2
    slope: float = 0.5
    window: int = 24
    reuse: float = 2.0
    dot_count: int = 32  # rule 4: what a kernel of integer dot products takes ...
    dot_knee: int = 28  # ... up to this `least`,
    dot_slope: float = 0.25  # ... and this much of each register of `least` above it
    tile_share: float = 0.9  # rule 6: a register tile carries at least this share of `sunk`


RULES = NvidiaRules()


def estimate_nvidia_registers(f: NvidiaFeatures, rules: NvidiaRules = RULES) -> int:
    """Registers per lane the NVIDIA driver gives a kernel with these features (module
    docstring); more than 255 means it spills."""
    base = f.sunk if f.sunk <= rules.knee else rules.knee + rules.excess * (f.sunk - rules.knee)
    hoisted = min(rules.slope * f.block_words, rules.window)
    count = base + rules.offset + hoisted + rules.reuse * f.reuse_words
    if f.dots:
        dots = rules.dot_count + rules.dot_slope * max(0, f.least - rules.dot_knee)
        count = min(count, dots)
    if f.lane_words:
        count = max(count, f.sunk + rules.offset + f.lane_words)
    if f.carried and f.carried >= rules.tile_share * f.sunk:
        count = max(count, f.carried + rules.offset + f.block_words)
    return max(rules.floor, int(-(-count // 1)))


@functools.lru_cache(maxsize=512)
def analyze_nvidia(spv: bytes) -> NvidiaFeatures:
    """The numbers of the module docstring, measured on one module (memoized: kernels of one
    build often share their SPIR-V)."""
    m = _Module(spv)
    consts = _constants(spv, m)
    words = 0.0
    reuse = 0.0
    lane = 0.0
    dots = 0
    for blocks in m.functions:
        if blocks:
            divergent = _divergence(m, blocks)
            words = max(words, _block_words(m, blocks, divergent))
            reuse += _reuse_words(m, blocks, consts)
            lane += _lane_words(m, blocks, consts)
            dots += sum(1 for b in blocks for i in b.insts if i.opcode in _DOTS)
    # the scheduler's order is measured where rule 4 reads it only (it costs a little)
    sunk = demand(spv, sink_loads=True, reorder=least_order if dots else None)
    least = sunk.loads_up if dots else 0
    return NvidiaFeatures(sunk.vgprs, words, reuse, dots, least, lane, sunk.carried)


def _base_variable(blocks: list[_Block]) -> dict[int, int]:
    """Access chain -> the variable it indexes."""
    chain_base: dict[int, int] = {}
    for b in blocks:
        for inst in b.insts:
            if inst.opcode in _CHAINS and inst.result is not None:
                chain_base[inst.result] = inst.ids[0]
    out = {}
    for c in chain_base:
        v = c
        while v in chain_base:
            v = chain_base[v]
        out[c] = v
    return out


def _block_words(m: _Module, blocks: list[_Block], divergent: set[int]) -> float:
    base = _base_variable(blocks)
    most = 0.0
    for b in blocks:
        words = 0.0
        for inst in b.insts:
            if inst.opcode != _OP_LOAD or inst.result is None or inst.result not in divergent:
                continue
            var = base.get(inst.ids[0], inst.ids[0])
            if m.var_sc.get(var) == _SC_STORAGE_BUFFER:
                words += m.registers(inst.result)
        most = max(most, words)
    return most


def _constants(spv: bytes, m: _Module) -> dict[int, int]:
    """Integer constants, specialization constants at their defaults (what the driver compiles
    with unless the pipeline overrides them), and OpSpecConstantOp arithmetic on them."""
    values = dict(m.consts)
    words = struct.unpack_from(f"<{len(spv) // 4}I", spv)
    i = 5  # past the header (SPIR-V 2.3)
    while i < len(words):
        count, opcode = words[i] >> 16, words[i] & 0xFFFF
        if count == 0:
            break
        if opcode == _OP_FUNCTION:
            break  # constants are declared before the first function
        if opcode == _OP_SPEC_CONSTANT_OP and count >= 6:
            result, op, a, b = words[i + 2], words[i + 3], words[i + 4], words[i + 5]
            fold = _FOLD.get(_NAME.get(op, ""))
            x, y = values.get(a), values.get(b)
            if fold is not None and x is not None and y is not None:
                r = fold(x, y)
                if r is not None:
                    values[result] = r & 0xFFFFFFFF
        i += count
    return values


def _loops(blocks: list[_Block]) -> dict[int, set[int]]:
    """Natural loops: header index -> the indices of its blocks (back edges to a dominator)."""
    idom, _ = _dominators(blocks)
    index = {b.label: i for i, b in enumerate(blocks)}
    preds: list[list[int]] = [[] for _ in blocks]
    for i, b in enumerate(blocks):
        for s in b.succs:
            if s in index:
                preds[index[s]].append(i)
    loops: dict[int, set[int]] = {}
    for src, b in enumerate(blocks):
        for s in b.succs:
            h = index.get(s)
            if h is None or not _dominates(idom, h, src):
                continue
            body, work = loops.setdefault(h, {h}), [src]
            while work:
                x = work.pop()
                if x not in body:
                    body.add(x)
                    work.extend(preds[x])
    return loops


def _trip_count(
    blocks: list[_Block], h: int, body: set[int], defs: dict[int, _Inst], consts: dict[int, int]
) -> int | None:
    """Iterations of the loop headed by block `h` when its bound and step are constants once
    the pipeline's constants are known (a start that is not a constant counts from 0: the most
    iterations a lane runs); None when they are not."""
    index = {b.label: i for i, b in enumerate(blocks)}
    block = blocks[h]
    term = block.insts[-1] if block.insts else None
    if term is not None and _NAME.get(term.opcode) == "OpBranch":
        after = index.get(term.words[0])
        if after is None or after not in body:
            return None
        block = blocks[after]
        term = block.insts[-1] if block.insts else None
    if term is None or _NAME.get(term.opcode) != "OpBranchConditional":
        return None
    test = defs.get(term.words[0])
    name = _NAME.get(test.opcode, "") if test is not None else ""
    if test is None or name not in _TESTS:
        return None
    inclusive = _TESTS[name]
    lhs, rhs = test.ids[0], test.ids[1]
    bound = consts.get(rhs)
    if bound is None:
        return None
    iv, offset = lhs, 0
    add = defs.get(lhs)
    if add is not None and _NAME.get(add.opcode) == "OpIAdd":
        a, b = add.ids
        if b in consts:
            iv, offset = a, consts[b]
        elif a in consts:
            iv, offset = b, consts[a]
    phi = defs.get(iv)
    if phi is None or _NAME.get(phi.opcode) != "OpPhi":
        return None
    start, step = 0, None
    for value, pred in zip(phi.ids[0::2], phi.ids[1::2], strict=False):
        if index.get(pred) in body:
            step_add = defs.get(value)
            if step_add is None or _NAME.get(step_add.opcode) != "OpIAdd":
                return None
            a, b = step_add.ids
            s = consts.get(b) if a == iv else consts.get(a) if b == iv else None
            if not s:
                return None
            step = s
        else:
            start = consts.get(value, 0)
    if step is None:
        return None
    end = bound - offset + inclusive
    return max(0, -(-(end - start) // step))


def _reuse_words(m: _Module, blocks: list[_Block], consts: dict[int, int]) -> float:
    """Words loaded by an `Unroll` loop of at most UNROLL_LIMIT iterations that an earlier such
    loop of the same trip count loaded: the same read-only buffer, indexed by the induction
    variable (from the same start) in the same place (module docstring, rule 3)."""
    index = {b.label: i for i, b in enumerate(blocks)}
    defs: dict[int, _Inst] = {
        inst.result: inst for b in blocks for inst in b.insts if inst.result is not None
    }
    loops = _loops(blocks)
    seen: set[tuple[object, ...]] = set()
    total = 0.0
    for h in sorted(loops):
        body = loops[h]
        merge = [i for i in blocks[h].insts if _NAME.get(i.opcode) == "OpLoopMerge"]
        if not merge or len(merge[0].words) < 3 or not merge[0].words[2] & _LOOP_CONTROL_UNROLL:
            continue
        trips = _trip_count(blocks, h, body, defs, consts)
        if trips is None or trips > UNROLL_LIMIT:
            continue
        starts = {
            i.result: tuple(
                v
                for v, p in zip(i.ids[0::2], i.ids[1::2], strict=False)
                if index.get(p) not in body
            )
            for i in blocks[h].insts
            if _NAME.get(i.opcode) == "OpPhi"
        }
        keys: dict[tuple[object, ...], float] = {}
        for x in body:
            for inst in blocks[x].insts:
                if inst.opcode != _OP_LOAD or inst.result is None:
                    continue
                chain = defs.get(inst.ids[0])
                if chain is None or chain.opcode not in _CHAINS:
                    continue
                var, *indices = chain.ids
                if not _read_only(m, var):
                    continue
                key = (var, trips, *(("iv", starts[i]) if i in starts else i for i in indices))
                keys[key] = m.registers(inst.result)
        total += trips * sum(w for k, w in keys.items() if k in seen)
        seen.update(keys)
    return total


def _lane_words(m: _Module, blocks: list[_Block], consts: dict[int, int]) -> float:
    """Rule 5: for each innermost `DontUnroll` loop of at most LANE_LOOP_LIMIT iterations (a
    constant trip count) inside another loop, its iterations times the words it loads from
    read-only buffers at an address that does not change in the outer loop (it depends on the
    inner loop's induction variable and on values from outside the outer loop only)."""
    defs: dict[int, _Inst] = {}
    where: dict[int, int] = {}
    for x, b in enumerate(blocks):
        for inst in b.insts:
            if inst.result is not None:
                defs[inst.result] = inst
                where[inst.result] = x
    loops = _loops(blocks)
    total = 0.0
    for h, body in loops.items():
        if any(o != h and o in body for o in loops):
            continue  # not innermost
        merge = [i for i in blocks[h].insts if _NAME.get(i.opcode) == "OpLoopMerge"]
        if not merge or len(merge[0].words) < 3:
            continue
        if not merge[0].words[2] & _LOOP_CONTROL_DONT_UNROLL:
            continue
        trips = _trip_count(blocks, h, body, defs, consts)
        outer = [o for o in loops if o != h and h in loops[o]]
        if trips is None or not 2 <= trips <= LANE_LOOP_LIMIT or not outer:
            continue
        around = loops[min(outer, key=lambda o: len(loops[o]))]
        induction = {i.result for i in blocks[h].insts if _NAME.get(i.opcode) == "OpPhi"}
        known: dict[int, bool] = {}
        same = functools.partial(_invariant, induction, around, where, defs, known)

        words = 0.0
        for x in body:
            for inst in blocks[x].insts:
                if inst.opcode != _OP_LOAD or inst.result is None:
                    continue
                chain = defs.get(inst.ids[0])
                if chain is None or chain.opcode not in _CHAINS:
                    continue
                var, *indices = chain.ids
                if m.var_sc.get(var) != _SC_STORAGE_BUFFER or not _read_only(m, var):
                    continue
                if all(same(i) for i in indices):
                    words += m.registers(inst.result)
        total += trips * words
    return total


def _invariant(
    induction: set[int | None],
    around: set[int],
    where: dict[int, int],
    defs: dict[int, _Inst],
    known: dict[int, bool],
    v: int,
) -> bool:
    """Whether value `v` is the same on every iteration of the loop whose blocks are `around`,
    given the inner loop's induction variables: defined outside it, or computed there from such
    values by instructions other than loads and phis (`known` memoizes)."""
    if v in induction or where.get(v) not in around:
        return True
    if v in known:
        return known[v]
    d = defs[v]
    known[v] = False  # a cycle through a phi is not invariant
    if d.opcode != _OP_LOAD and _NAME.get(d.opcode) != "OpPhi":
        known[v] = all(_invariant(induction, around, where, defs, known, a) for a in d.ids)
    return known[v]


def _read_only(m: _Module, var: int) -> bool:
    """A buffer variable decorated NonWritable, or whose block type is."""
    if var in m.readonly:
        return True
    pointer = m.type_of.get(var)
    return pointer is not None and m.pointee.get(pointer) in m.readonly
