"""Register demand measured on the SPIR-V we emit: a divergence analysis and a liveness analysis
over the module's values, after the moves a GPU compiler makes before it allocates registers.

Input: SPIR-V bytes (shaderc's -O output: one function, most private variables already SSA
values).  Output: `Demand`: the peak number of 32-bit per-lane registers (VGPRs) live at one
point of the program, the words of private arrays a compiler may keep in scratch memory instead
of registers, and the peak the scheduler can raise the first to (rules 11-12).

Nothing here is fitted to a kernel; every rule is a fact about how the compiler that turns
SPIR-V into GPU code (Mesa's NIR, then ACO on RDNA) treats values, with its source:
1. *Uniform values live in scalar registers.*  A value is uniform when it is the same on every
   lane of a subgroup: constants and specialization constants (constants by the time the
   pipeline is compiled), the workgroup id and counts, subgroup id and size, subgroup
   reductions and broadcasts, and what is computed from uniform values only.  The invocation
   ids within a workgroup or subgroup, shuffles, scans, atomics, loads from divergent
   addresses and phis at the merge of a branch on a divergent condition are divergent (Mesa
   `nir_divergence_analysis.c`; SPIR-V 1.6 section 3.49.24 for the subgroup operations).
2. *A divergent boolean is a lane mask* in scalar registers (ACO's `s1`/`s2` lane masks; AMD
   RDNA ISA, "Vector Compare" writes VCC or an SGPR pair): no VGPR.
3. *Vectors are split into components* that die one by one (ACO `p_split_vector`; Mesa
   `nir_lower_alu_to_scalar`, `nir_lower_alu_width`): a 32-bit component costs one VGPR, a
   64-bit one two, a 16-bit one half (a lone 16-bit value one).
4. *An address is not a value*: an access chain is computed where the load or store uses it
   (Mesa `nir_lower_explicit_io`), so its indices are live up to that use.
5. *The invocation ids arrive in VGPRs at the start* (RDNA compute ABI: v0 holds the local
   invocation id), so they are live from the start to their last use.
6. *Loads of one address of a read-only buffer are one load* (Mesa `nir_opt_cse` on
   `load_ssbo` with ACCESS_CAN_REORDER, which `readonly` buffers get), when the first
   dominates the others.
7. *A private variable written once before all its reads is that value* (Mesa
   `nir_lower_vars_to_ssa`); one written several times is a register per word while it holds
   a value that is read later.
8. *Cheap instructions move to their uses*: copies (extracts, constructs, shuffles) and ALU
   operations whose non-constant sources are one value no wider per component than the result
   move down to just before their first use, into the latest block that dominates all uses but
   never into a loop (Mesa `nir_opt_sink` and `nir_opt_move` with `nir_move_copies |
   nir_move_alu`, run by RADV before ACO selects instructions).
8b. *A load of a read-only buffer moves to the block where its uses meet*, if that is another
   block of the same loop, to its start (after the phis), and never within its block (Mesa
   `nir_opt_sink` with `nir_move_load_ssbo`, for loads that may be reordered, which
   `readonly` buffers' are; RADV 25.0 gives `nir_opt_move` no loads).  A value-weighted sum
   whose second operand is a select between two loads (a branch per term) loads each row's
   word pair where its first term is summed, not at the top of the loop body: ACO's Pre-Sched
   21 VGPRs for `attention_rope_split` with 8 rows a subgroup, 28 without this rule (gfx1201;
   tests/codegen/test_estimate.py holds `attention_rope_split__sm90.unfused.9`).  The blocks
   of a selection whose arms have at most 8 rows are one block to this rule
   (`nir_opt_peephole_select`, limit 8 in RADV, runs before): without that, the quantized
   matvecs' loads sank past their alignment selects, 78 VGPRs where ACO has 60.
9. A private array still indexed by a variable may stay in registers or go to scratch memory;
   its size is reported (`private_words`) for the caller to judge conservatively.
10. *A buffer address used by several accesses is one register, from the first to the last.*
   A divergent index becomes a byte offset in a VGPR (Mesa `nir_lower_explicit_io`), and a
   buffer instruction adds a constant of at most 4095 bytes as an immediate (MUBUF's 12-bit
   OFFSET field, AMD RDNA3 ISA).  Accesses whose indices are one value plus such constants
   (`b_x[k]`, `b_g[k]` and the store `b_y[k]`; `v[i]` and `v[i + 32]`) share the offset of
   that value (Mesa `nir_opt_cse`, `nir_opt_offsets`); past the immediate, `base + constant`
   is the VGPR, and accesses whose index reduces to the same base and constant (say
   `m[t * 4096 + j + 32 * i]` loaded and `C[(t * 128 + i) * 32 + j]` stored) share it.
   The accesses read the address, not their index: the index arithmetic nothing else reads
   is gone (`_shared_addresses`).  A loop `for (i = gid; i < N; i += stride) y[i] = f(x[i])`
   holds `i`, its offset and the loaded value: 3 VGPRs, ACO's Pre-Sched on every target.

A second number, the demand ACO's scheduler can reach (`Demand.loads_up`): Mesa 25.0's ACO
schedules each block before it allocates registers, and its scheduler (`aco_scheduler.cpp`,
`schedule_VMEM`) moves every memory load up to hide its latency, past the instructions before it
that do not compute its operands, as long as the demand stays within the registers of the
occupancy it aims at (codegen/estimate.py `scheduler_aim`).  The loads' results then live longer,
and the kernel's registers rise toward that bound.  Measured here on the same rows:
11. *Small selections run both arms* (Mesa `nir_opt_peephole_select`, which RADV runs with loads
   allowed to be speculated): an `if` whose arms are single blocks of a few instructions without
   writes or barriers becomes a select, so header, arms and merge are one block to the
   scheduler (`_selects`).
12. *Each buffer load moves up with the instructions computing its address*, past everything it
   does not depend on, up to the last barrier or buffer write of its block (`_move_loads_up`).
   The peak of that order is `loads_up`; the target's aim caps it (codegen/estimate.py
   `estimate_waves`).  Then the work of the run's last block that does not wait on that
   block's loads moves above their first use (`_hoist_unrelated`; `schedule_VMEM`'s second
   half, which lengthens a load's latency window): the unpacking of quantized words read
   behind an alignment branch, four floats for each word, before the first FMA (2026-12-02).
   Not modelled: the scheduler's per-load limits on how many instructions
   it looks at and moves (a few hundred), which keep it short of the bound in large unrolled
   kernels (docs/ESTIMATOR.md).

A third, for targets without a mixed-signedness dot product (`Demand.unpacked_dot`):
13. *OpSUDot's signed operand is four bytes there.*  RDNA2 has dot products of two signed or
   two unsigned 4 x 8-bit vectors only (V_DOT4_I32_I8, V_DOT4_U32_U8; RDNA3 adds
   V_DOT4_I32_IU8), so Mesa lowers a mixed one to byte extracts and multiplies, and value
   numbering keeps the extracted bytes of an operand that several rows share (the activation
   of a quantized matvec) live from its first dot to its last: each word of such an operand
   costs four registers.  ACO on navi21: `gated__s11_61` of the corpus, 111 VGPRs by rules
   1-10, 130 by this one, Pre-Sched 134 (gfx1201: 113).

Applied before all of them:
14. *A branch on a condition the specialization constants decide goes one way.*  The
   driver compiles a pipeline with its constants' values (RADV substitutes them into NIR),
   then folds and removes the untaken code (Mesa `nir_opt_constant_folding`,
   `nir_opt_dead_cf`): `if (K % 2 == 0)` around a contraction's paired loads is its first arm
   alone when K is even, and neither the demand nor the scheduler's reach sees the other arm
   (`spirv_constants._constant_branches`, at the defaults the SPIR-V declares, which are the
   region's constants).  On the estimator corpus (seed 0, balanced, navi21 wave64) the
   untaken arms' loads had raised `loads_up` past ACO's registers for 9 of the 44 wave
   misses.

Not modelled, and measured where it matters (docs/ESTIMATOR.md): the compiler's algebraic
rewrites (e.g. a shift and a mask turned into one bitfield extract), loop unrolling by the
driver (our generator unrolls where it wants unrolling), vectorization of adjacent loads, and a
value computed inside a loop with a divergent exit and read after it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import attrs

from .liveness_addresses import _shared_addresses
from .liveness_moves import (
    _BARRIERS,
    _BUFFER_CLASSES,
    _BYTES_PER_WORD,
    _MIXED_DOTS,
    _SHIFT,
    _merge_loads,
    _movable,
    _move_loads_up,
    _readonly_var,
    _Row,
    _scalarized,
    _selects,
    _single_stores,
    _sink,
)
from .spirv_constants import _constant_branches
from .spirv_grammar import OPCODES
from .spirv_module import (
    _ATOMICS,
    _BARRIER,
    _CHAINS,
    _DIVERGENT_BUILTINS,
    _LOAD,
    _OP_EXTRACT,
    _OP_INSERT,
    _OP_LOAD,
    _OP_PHI,
    _OP_SHUFFLE,
    _OP_STORE,
    _OP_VARIABLE,
    _SC_FUNCTION,
    _WRITE,
    _Block,
    _components,
    _decode,
    _divergence,
    _dominates,
    _dominators,
    _Inst,
    _Module,
)


@attrs.frozen
class Demand:
    vgprs: int  # peak live divergent 32-bit registers per lane
    private_words: int  # 32-bit words of private arrays indexed dynamically (0: none)
    # the peak once the scheduler has moved every memory load up (`_move_loads_up`): what ACO's
    # scheduler may raise the demand to when its occupancy aim allows; at least `vgprs`
    loads_up: int
    # the peak where a mixed-signedness dot product is not an instruction (rule 13): its signed
    # operand unpacked to four bytes; equal to `vgprs` in a kernel without one
    unpacked_dot: int
    # with `sink_loads` only (codegen/nvidia.py rule 6): the most registers live across a
    # loop's back edge (the values its phis carry and those live through it); 0 otherwise
    carried: int = 0


def demand(spv: bytes, *, sink_loads: bool = False, reorder: _Reorder | None = None) -> Demand:
    """Peak register demand of the module's functions (module docstring).  With `sink_loads`,
    loads move to their first use like the cheap instructions of rule 8: the demand of a
    compiler that issues each load where its value is needed (codegen/nvidia.py).  With
    `reorder` (and `sink_loads`), `loads_up` is instead the peak of the rows of each block,
    small selections flattened (rule 11), in the order `reorder` gives them or as they are,
    whichever is lower (codegen/nvidia_schedule.py), and `unpacked_dot` is `vgprs`; `carried`
    is measured with `sink_loads` only."""
    m = _Module(spv)
    peak = up = mixed = 0.0
    private = 0
    carried: list[float] = []
    for blocks in m.functions:
        if blocks:
            v, u, x, p = _function_demand(
                m,
                blocks,
                sink_loads=sink_loads,
                reorder=reorder,
                carried=carried if sink_loads else None,
            )
            peak, up, mixed, private = max(peak, v), max(up, u), max(mixed, x), private + p
    return Demand(
        int(-(-peak // 1)),
        private,
        int(-(-up // 1)),
        int(-(-mixed // 1)),
        int(-(-max(carried, default=0.0) // 1)),
    )


# a block's rows, what lives at its end, each element's registers -> the rows in a new order
_Reorder = Callable[[list[_Row], set[int], dict[int, float]], list[_Row]]


def _function_demand(
    m: _Module,
    blocks: list[_Block],
    report: Breakdown | None = None,
    sink_loads: bool = False,
    reorder: _Reorder | None = None,
    carried: list[float] | None = None,
) -> tuple[float, float, float, int]:
    """(peak VGPRs, the peak with loads moved up (`_move_loads_up`), the peak with mixed
    dot products' signed operands unpacked (rule 13), words of private arrays).  Only divergent
    values are tracked: a uniform one costs no VGPR (rule 1), but still counts as a source that
    keeps an instruction in place (`_movable`).  With `carried`, the registers live at the end
    of each block that ends a loop's iteration (a back edge: the successor dominates it) are
    appended to it."""
    if not sink_loads:  # the NVIDIA count keeps the rules it was measured with (nvidia.py)
        blocks = _constant_branches(m, blocks)
    dom = _dominators(blocks)
    _merge_loads(m, blocks, dom[0])
    divergent = _divergence(m, blocks)
    chains: dict[int, tuple[int, ...]] = {}
    private = 0
    entry: set[int] = set()  # elements defined at the program's start
    vcost: dict[int, float] = {}  # divergent element -> VGPRs
    ncomp: dict[int, int] = {}
    component: dict[int, tuple[int, int]] = {}  # chain -> (private vector variable, component)
    root: dict[int, int] = {}  # chain -> the variable it points into
    for b in blocks:
        for inst in b.insts:
            r = inst.result
            if r is None or inst.rtype is None:
                continue
            if inst.opcode in _CHAINS:
                base = inst.ids[0]
                chains[r] = inst.ids[1:] if m.var_sc.get(base) != _SC_FUNCTION else inst.ids
                root[r] = root.get(base, base)
                if (
                    m.var_sc.get(base) == _SC_FUNCTION
                    and len(inst.ids) == 2
                    and inst.ids[1] in m.consts
                ):
                    component[r] = (base, m.consts[inst.ids[1]])
                continue
            if inst.opcode == _OP_VARIABLE:
                if inst.words[2] == _SC_FUNCTION and inst.rtype in m.pointee:
                    # a private variable: one register per word while it holds a value; an
                    # array the program indexes by a variable is uncertain (registers or scratch)
                    pointee = m.pointee[inst.rtype]
                    words = m.words_of(pointee)
                    if pointee in m.array_len:
                        private += words
                    vector = m.types.get(pointee)
                    if vector is not None and OPCODES[vector.opcode][0] == "OpTypeVector":
                        n, per = vector.words[2], m.size.get(vector.words[1], 1)
                    else:
                        n, per = 1, words
                    ncomp[r] = n
                    if r in divergent:
                        for c in range(n):
                            vcost[r << _SHIFT | c] = per
                continue
            n, per = _components(m, r)
            ncomp[r] = n
            if r not in divergent:
                continue
            if inst.rtype in m.is_bool:
                per = 0
            for c in range(n):
                vcost[r << _SHIFT | c] = per
            if inst.opcode == _OP_LOAD and m.builtin.get(inst.ids[0]) in _DIVERGENT_BUILTINS:
                entry.update(r << _SHIFT | c for c in range(n))

    forward = _single_stores(m, blocks, component, dom[0])
    addresses = _shared_addresses(m, blocks, divergent, dom[0], m.bound, near=not sink_loads)
    for elements_ in addresses.defined.values():
        for e in elements_:
            vcost[e] = 1

    # the elements of a divergent value read as it is (most reads)
    as_read = {
        r: tuple(r << _SHIFT | c for c in range(n))
        for r, n in ncomp.items()
        if r in divergent and r not in forward and r not in component and r not in chains
    }
    special = forward.keys() | component.keys() | chains.keys()

    def elements(ids: Iterable[int]) -> set[int]:
        """The divergent elements the ids stand for."""
        out: set[int] = set()
        stack = []
        for i in ids:
            if i in as_read:
                out.update(as_read[i])
            elif i in special:
                stack.append(i)
        while stack:
            i = stack.pop()
            if i in forward:
                value, c = forward[i]
                if c is None or ncomp.get(value, 1) == 1:
                    stack.append(value)
                elif c < ncomp.get(value, 0) and value in divergent:
                    out.add(value << _SHIFT | c)
            elif i in component:
                var, c = component[i]
                if c < ncomp.get(var, 0) and var in divergent:
                    out.add(var << _SHIFT | c)
            elif i in chains:
                stack.extend(chains[i])
            elif i in divergent and i in ncomp:
                out.update(i << _SHIFT | c for c in range(ncomp[i]))
        return out

    def uses(inst: _Inst) -> set[int]:
        op = inst.opcode
        w = inst.words
        if op == _OP_EXTRACT and len(w) >= 4 and ncomp.get(w[2], 1) > 1:
            if w[2] not in divergent:
                return set()
            return {w[2] << _SHIFT | w[3]} if w[3] < ncomp[w[2]] else elements([w[2]])
        if op == _OP_SHUFFLE and len(w) >= 4:
            n1 = ncomp.get(w[2], 1)
            out = set()
            for j in w[4:]:
                if j == 0xFFFFFFFF:
                    continue
                src, c = (w[2], j) if j < n1 else (w[3], j - n1)
                if src in ncomp and src in divergent:
                    out.add(src << _SHIFT | min(c, ncomp[src] - 1))
            return out
        if op == _OP_INSERT and len(w) >= 5 and w[3] in ncomp:
            return elements([w[2]]) | (elements([w[3]]) - {w[3] << _SHIFT | w[4]})
        return elements(inst.ids)

    # phi operands are used at the end of their predecessor; the entry's inputs are never
    # killed where they are loaded: they are live from the start to their last use
    phi_uses: dict[int, set[int]] = {b.label: set() for b in blocks}
    block_rows: list[list[_Row]] = []
    unpacked: set[int] = set()  # signed operands of mixed-signedness dot products (rule 13)
    for b in blocks:
        rows: list[_Row] = []
        for inst in b.insts:
            op = inst.opcode
            r = inst.result
            if id(inst) in addresses.defined:
                sources = elements(addresses.sources.get(id(inst), ()))
                rows.append(_Row(set(addresses.defined[id(inst)]), sources))
            if r is not None and r in addresses.dead:
                rows.append(_Row(set(), set()))  # an index only a shared address read
                continue
            defs = (
                {r << _SHIFT | c for c in range(ncomp[r])} - entry
                if r in ncomp and r in divergent
                else set()
            )
            if op == _OP_PHI:
                for value, pred in zip(inst.ids[0::2], inst.ids[1::2], strict=False):
                    if pred in phi_uses:
                        phi_uses[pred] |= elements([value])
                rows.append(_Row(defs, set(), line=inst.line, phi=True))
            elif (
                inst.opcode in _CHAINS
                or r in forward
                or (op == _OP_STORE and inst.ids and inst.ids[0] in forward.stored)
            ):
                rows.append(_Row(set(), set()))  # an address, or a variable that is gone
            elif op == _OP_STORE and inst.ids and m.var_sc.get(inst.ids[0]) == _SC_FUNCTION:
                # a whole private variable overwritten: its earlier value is dead here
                var = inst.ids[0]
                whole = (
                    {var << _SHIFT | c for c in range(ncomp.get(var, 1))}
                    if var in divergent
                    else set()
                )
                rows.append(_Row(whole, elements(inst.ids[1:]), line=inst.line))
            elif _movable(m, inst, ncomp) or (sink_loads and op == _OP_LOAD and r is not None):
                rows.extend(_scalarized(inst, ncomp, defs, uses(inst)))
            else:
                used = uses(inst)
                if id(inst) in addresses.used:
                    if id(inst) in addresses.dropped:
                        used -= elements([addresses.dropped[id(inst)]])
                    used |= addresses.used[id(inst)]
                memory = 0
                sinks = False
                if op in _BARRIERS:
                    memory = _BARRIER
                elif (
                    inst.ids and m.var_sc.get(root.get(inst.ids[0], inst.ids[0])) in _BUFFER_CLASSES
                ):
                    if op == _OP_LOAD:
                        memory = _LOAD
                        sinks = not sink_loads and _readonly_var(
                            m, root.get(inst.ids[0], inst.ids[0])
                        )
                    elif op == _OP_STORE or op in _ATOMICS:
                        memory = _WRITE
                rows.append(_Row(defs, used, line=inst.line, memory=memory, sinks=sinks))
                if op in _MIXED_DOTS and inst.ids:
                    unpacked |= elements(inst.ids[:1])
        block_rows.append(rows)
    # the blocks `nir_opt_peephole_select` makes one before `nir_opt_sink` runs (rule 8b)
    runs: dict[int, int] = {}
    _selects(blocks, block_rows, phi_uses, _PEEPHOLE_ROWS, runs)
    placed = _sink(blocks, block_rows, phi_uses, dom, runs)
    plain = [[(row.defs, row.uses, row.line) for row in rows] for rows in placed]

    # per block: what it reads before writing (gen) and everything it writes (kill)
    gen: list[set[int]] = []
    kill: list[set[int]] = []
    for block in plain:
        g: set[int] = set()
        k: set[int] = set()
        for defs, used, _ in reversed(block):
            g -= defs
            g |= used
            k |= defs
        gen.append(g)
        kill.append(k)
    live_in: dict[int, set[int]] = {b.label: set() for b in blocks}
    live_out: dict[int, set[int]] = {b.label: set() for b in blocks}
    changed = True
    while changed:
        changed = False
        for i in range(len(blocks) - 1, -1, -1):
            b = blocks[i]
            out = set(phi_uses[b.label])
            for succ in b.succs:
                out |= live_in.get(succ, set())
            if out != live_out[b.label]:
                live_out[b.label] = out
                live_in[b.label] = gen[i] | (out - kill[i])
                changed = True
            elif not live_in[b.label] and gen[i]:
                live_in[b.label] = set(gen[i])
                changed = True

    peak = 0.0
    for b, block in zip(blocks, plain, strict=True):
        peak = _peak(block, live_out[b.label], vcost, report, peak)
    if carried is not None:
        index = {b.label: i for i, b in enumerate(blocks)}
        for i, b in enumerate(blocks):
            if any(s in index and _dominates(dom[0], index[s], i) for s in b.succs):
                carried.append(sum(vcost.get(e, 0) for e in live_out[b.label]))
    if reorder is not None:
        least = 0.0
        for _, last, run in _selects(blocks, placed, phi_uses):
            end = live_out[blocks[last].label]
            as_is = _peak([(r.defs, r.uses, r.line) for r in run], end, vcost)
            order = [(r.defs, r.uses, r.line) for r in reorder(run, end, vcost)]
            least = max(least, min(as_is, _peak(order, end, vcost)))
        return peak, least, peak, private
    loads_up = peak
    for first, last, run in _selects(blocks, placed, phi_uses):
        moved = _move_loads_up(run)
        if moved is None and first == last:
            continue  # the block as it was: its peak is counted
        order = [(r.defs, r.uses, r.line) for r in (run if moved is None else moved)]
        loads_up = max(loads_up, _peak(order, live_out[blocks[last].label], vcost))
    # rule 13: without a mixed-signedness dot product, each such operand is four bytes
    mixed = peak
    if unpacked:
        wide = dict(vcost)
        for e in unpacked:
            wide[e] = _BYTES_PER_WORD * vcost.get(e, 0)
        mixed = 0.0
        for b, block in zip(blocks, plain, strict=True):
            mixed = _peak(block, live_out[b.label], wide, None, mixed)
    return peak, loads_up, mixed, private


# the instructions an arm may have for `nir_opt_peephole_select` to make it a select (RADV,
# Mesa 25.0 `radv_optimize_nir`: limit 8); a SPIR-V instruction is one NIR instruction or more
_PEEPHOLE_ROWS = 8

_Plain = list[tuple[set[int], set[int], int | None]]


def _peak(
    rows: _Plain,
    live_at_end: set[int],
    vcost: dict[int, float],
    report: Breakdown | None = None,
    peak: float = 0.0,
) -> float:
    """The most VGPRs live at one of a block's rows, or `peak` if more, walking the block back
    from what lives at its end (which an order of the rows within the block does not change)."""
    live = set(live_at_end)
    v = sum(vcost.get(e, 0) for e in live)
    for defs, used, line in reversed(rows):
        # at the instruction: what lives after it, and its results
        at = v
        new = defs - live
        if new:
            at = v + sum(vcost.get(e, 0) for e in new)
        for e in defs & live:
            live.discard(e)
            v -= vcost.get(e, 0)
        for e in used:
            if e not in live:
                live.add(e)
                v += vcost.get(e, 0)
        at = max(at, v)
        if report is not None:
            if line is not None:
                report.by_line[line] = max(report.by_line.get(line, 0), int(-(-at // 1)))
            if at > peak:
                report.peak_line = line
                report.peak_live = [e >> _SHIFT for e in live | new if vcost.get(e, 0)]
        peak = max(peak, at)
    return peak


@attrs.define
class Breakdown:
    """Where a kernel's demand comes from (for `fusec explain`): the most VGPRs live while the
    code of each source line runs (SPIR-V compiled with line information), the line of the
    peak, and the values live there (the names of the instructions that define them)."""

    demand: Demand = Demand(0, 0, 0, 0)
    by_line: dict[int, int] = attrs.field(factory=dict)
    peak_line: int | None = None
    peak_live: list[int] = attrs.field(factory=list)
    peak_values: list[str] = attrs.field(factory=list)


def breakdown(spv: bytes) -> Breakdown:
    m = _Module(spv)
    report = Breakdown()
    peak, up, mixed, private = 0.0, 0.0, 0.0, 0
    for blocks in m.functions:
        if blocks:
            v, u, x, p = _function_demand(m, blocks, report)
            peak, up, mixed, private = max(peak, v), max(up, u), max(mixed, x), private + p
    report.demand = Demand(int(-(-peak // 1)), private, int(-(-up // 1)), int(-(-mixed // 1)))
    names = {}
    for inst in _decode(spv):
        if inst.result is not None:
            name = OPCODES.get(inst.opcode, ("?", ""))[0].removeprefix("Op")
            if name == "ExtInst" and len(inst.words) > 3:
                name = f"ExtInst {inst.words[3]}"
            names[inst.result] = name
    report.peak_values = sorted(names.get(v, "?") for v in report.peak_live)
    return report
