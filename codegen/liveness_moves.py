"""The moves a GPU compiler makes before it allocates registers, as codegen/liveness.py applies
them to the rows of a function: copies and single-source operations sunk to their first use
(rule 8), loads of one read-only address merged (rule 6), single-store private variables as
their values (rule 7), far buffer addresses (rule 10), small if/else arms flattened into selects
(rule 11) and loads moved up by the scheduler (rule 12).  Each rule and its source is in
liveness.py's docstring."""

from __future__ import annotations

import attrs

from .spirv_grammar import OPCODES
from .spirv_module import (
    _BARRIER,
    _CHAINS,
    _LOAD,
    _OP,
    _SC_FUNCTION,
    _SC_STORAGE_BUFFER,
    _WRITE,
    _Block,
    _dominates,
    _Inst,
    _lca,
    _Module,
)

_SHIFT = 6  # element key: value id << _SHIFT | component


_ALU = {12, *range(77, 85), *range(109, 206)}  # OpExtInst, composites, conversions..bit ops


@attrs.define(eq=False)  # rows are found by identity (`_move_loads_up`)
class _Row:
    """One instruction (or one component of a scalarized one) as liveness sees it."""

    defs: set[int]
    uses: set[int]
    movable: bool = False
    line: int | None = None
    memory: int = 0  # _LOAD, _WRITE or _BARRIER for what the scheduler may not move past
    arm_end: bool = False  # the end of a flattened selection's arm (`_selects`)
    # a load of a read-only buffer, which only moves to another block (`_sink`)
    sinks: bool = False
    phi: bool = False


# buffer memory: Uniform, StorageBuffer, PhysicalStorageBuffer (SPIR-V 3.7); Workgroup (LDS)
# accesses are not moved by this rule
_BUFFER_CLASSES = {2, _SC_STORAGE_BUFFER, 5349}
# dot products of a signed and an unsigned 4 x 8-bit vector (SPV_KHR_integer_dot_product)
_MIXED_DOTS = {_OP[n] for n in ("OpSUDot", "OpSUDotAccSat")}
_BYTES_PER_WORD = 4
_BARRIERS = {_OP["OpControlBarrier"], _OP["OpMemoryBarrier"]}


_COPIES = {
    _OP[n]
    for n in ("OpCompositeExtract", "OpCompositeConstruct", "OpCopyObject", "OpVectorShuffle")
}


def _movable(m: _Module, inst: _Inst, ncomp: dict[int, int]) -> bool:
    """An ALU instruction the compiler moves down to its first use (Mesa `nir_opt_sink` and
    `nir_opt_move` with `nir_move_copies | nir_move_alu`, which RADV runs before ACO selects
    instructions): a copy, or an operation whose non-constant sources are all one value no wider
    per component than its result (then moving it costs no register: "constants do not
    contribute to register pressure", Mesa `nir_opt_sink.c`)."""
    if inst.opcode not in _ALU or inst.result is None:
        return False
    sources = {i for i in inst.ids if i in ncomp}
    if inst.opcode in _COPIES:
        return True
    if len(sources) > 1:
        return False
    if not sources:
        return True
    (src,) = sources
    n = ncomp.get(inst.result, 1)
    src_bits = m.registers(src) * 32 / (n if ncomp.get(src, 1) == n else 1)
    dst_bits = m.registers(inst.result) * 32 / n
    return src_bits <= dst_bits


def _scalarized(inst: _Inst, ncomp: dict[int, int], defs: set[int], used: set[int]) -> list[_Row]:
    """A vector ALU instruction as one instruction per component (the compiler scalarizes ALU
    code; Mesa `nir_lower_alu_to_scalar`), each moved on its own."""
    r = inst.result
    n = ncomp.get(r, 1) if r is not None else 1
    if r is None or n == 1:
        return [_Row(defs, used, True, inst.line)]
    mask = (1 << _SHIFT) - 1
    rows = []
    for c in range(n):
        # component c of an elementwise operation reads component c of its vector sources
        u = {e for e in used if ncomp.get(e >> _SHIFT, 1) != n or e & mask == c}
        rows.append(_Row({r << _SHIFT | c} & defs, u, True, inst.line))
    return rows


def _sink(
    blocks: list[_Block],
    block_rows: list[list[_Row]],
    phi_uses: dict[int, set[int]],
    dom: tuple[list[int], list[int]],
    runs: dict[int, int] | None = None,
) -> list[list[_Row]]:
    """The rows after moving each movable one down to its uses: before its first user when
    that is in the block where its users meet (the latest block that dominates them all, never
    inside a loop the row was not in), else at the end of that block.  Latest first, so chains
    of such rows move together (Mesa `nir_opt_sink` and `nir_opt_move`, which RADV runs
    before ACO selects instructions).  A load of a read-only buffer (`_Row.sinks`) moves only
    where its users meet in another block of the same loop, to that block's start after its
    phis: `nir_opt_sink` moves `load_ssbo` that may be reordered (`nir_move_load_ssbo`, never
    out of a loop) and inserts it after the phis of the block it picks, and `nir_opt_move`,
    which would move it within a block, is not given loads (RADV, Mesa 25.0
    `radv_postprocess_nir`)."""
    idom, loop_depth = dom
    tree_depth = [0] * len(blocks)
    for i in range(1, len(blocks)):
        d, x = 0, i
        while x != 0 and idom[x] not in (-1, x) and d <= len(blocks):
            x, d = idom[x], d + 1
        tree_depth[i] = d
    index = {b.label: i for i, b in enumerate(blocks)}
    rows = [row for rs in block_rows for row in rs]
    block_of: list[int] = []
    position: list[int] = []
    for bi, rs in enumerate(block_rows):
        block_of += [bi] * len(rs)
        position += list(range(len(rs)))
    terminator = {}
    starts = {}
    start = 0
    for bi, rs in enumerate(block_rows):
        starts[bi] = start
        start += len(rs)
        terminator[bi] = start - 1 if rs else -1
    users: dict[int, list[int]] = {}
    for g, row in enumerate(rows):
        for e in row.uses:
            users.setdefault(e, []).append(g)
    phi_blocks: dict[int, list[int]] = {}  # element -> predecessor blocks whose end uses it
    for label, elems in phi_uses.items():
        for e in elems:
            phi_blocks.setdefault(e, []).append(index[label])
    where = list(block_of)  # the block a row ends up in
    root = list(range(len(rows)))  # the unmoved row it is emitted before (or itself)
    before: dict[int, list[int]] = {}
    moved: set[int] = set()
    for g in range(len(rows) - 1, -1, -1):
        row = rows[g]
        a = block_of[g]
        if not (row.movable or row.sinks) or not row.defs or g == terminator[a]:
            continue
        found = [u for e in row.defs for u in users.get(e, ()) if u != g]
        ends = [b for e in row.defs for b in phi_blocks.get(e, ())]
        if not found and not ends:
            continue
        target = None
        for b in [where[u] for u in found] + ends:
            target = b if target is None else _lca(idom, tree_depth, target, b)
        assert target is not None
        while target != a and loop_depth[target] > loop_depth[a]:
            target = idom[target]
        if not _dominates(idom, a, target):
            target = a
        if row.sinks:
            if target == a or loop_depth[target] != loop_depth[a]:
                continue
            if runs is not None and runs.get(target, target) == runs.get(a, a):
                continue  # one block once its small selections are selects
            anchor = next(
                (h for h in range(starts[target], terminator[target] + 1) if not rows[h].phi),
                terminator[target],
            )
            if anchor < 0:
                continue
            before.setdefault(anchor, []).insert(0, g)
            root[g] = root[anchor]
            where[g] = target
            moved.add(g)
            continue
        here = [u for u in found if where[u] == target]
        if target == a:
            here = [u for u in here if position[root[u]] > position[g] or where[root[u]] != a]
        if here:
            anchor = min(here, key=lambda u: (position[root[u]], u))
        elif terminator[target] >= 0:
            anchor = terminator[target]
        else:
            continue
        if anchor == g + 1 and root[anchor] == anchor and target == a:
            continue  # already in place
        before.setdefault(anchor, []).insert(0, g)
        root[g] = root[anchor]
        where[g] = target
        moved.add(g)
    out: list[list[_Row]] = [[] for _ in blocks]

    def emit(g: int, bi: int) -> None:
        for h in before.get(g, ()):
            emit(h, bi)
        out[bi].append(rows[g])

    for g in range(len(rows)):
        if g not in moved:
            emit(g, block_of[g])
    return out


def _readonly_var(m: _Module, var: int) -> bool:
    if var in m.readonly:
        return True
    ptr = m.type_of.get(var)
    return ptr is not None and m.pointee.get(ptr) in m.readonly


def _merge_loads(m: _Module, blocks: list[_Block], idom: list[int]) -> None:
    """Loads of the same address of a read-only buffer are one load (the compiler's value
    numbering does this for `readonly` buffers; Mesa `nir_opt_cse` on `load_ssbo` with
    ACCESS_CAN_REORDER): later ones are dropped and their uses read the first, when the first
    dominates them."""
    alias: dict[int, int] = {}
    base: dict[int, int] = {}
    key_of: dict[int, tuple[int, ...]] = {}
    first: dict[tuple[int, ...], tuple[int, int]] = {}  # key -> (result, block index)
    for bi, b in enumerate(blocks):
        kept = []
        for inst in b.insts:
            if alias:
                inst.ids = tuple(alias.get(i, i) for i in inst.ids)
            r = inst.result
            if inst.opcode in _CHAINS and r is not None:
                root = base.get(inst.ids[0], inst.ids[0])
                base[r] = root
                key_of[r] = (inst.opcode, *key_of.get(inst.ids[0], (inst.ids[0],)), *inst.ids[1:])
            elif (
                inst.opcode == _OP["OpLoad"]
                and r is not None
                and inst.ids[0] in key_of
                and _readonly_var(m, base[inst.ids[0]])
            ):
                key = (inst.rtype or 0, *key_of[inst.ids[0]])
                seen = first.get(key)
                if seen is not None and _dominates(idom, seen[1], bi):
                    alias[r] = seen[0]
                    continue
                first.setdefault(key, (r, bi))
            kept.append(inst)
        b.insts = kept


class _Forward(dict[int, tuple[int, int | None]]):
    """Loads of private variables that read the one value ever stored there: load result ->
    (stored value, component or None)."""

    stored: set[int]


def _single_stores(
    m: _Module, blocks: list[_Block], component: dict[int, tuple[int, int]], idom: list[int]
) -> _Forward:
    """Private variables written once, as a whole, before every read: the compiler replaces
    their loads by the stored value (Mesa `nir_lower_vars_to_ssa`)."""
    stores: dict[int, list[tuple[int, int, int]]] = {}
    spoiled: set[int] = set()
    for bi, b in enumerate(blocks):
        for pos, inst in enumerate(b.insts):
            if inst.opcode == _OP["OpStore"] and len(inst.ids) >= 2:
                ptr = inst.ids[0]
                if m.var_sc.get(ptr) == _SC_FUNCTION:
                    stores.setdefault(ptr, []).append((bi, pos, inst.ids[1]))
                elif ptr in component:
                    spoiled.add(component[ptr][0])
            elif OPCODES.get(inst.opcode, ("?", ""))[0] == "OpVariable" and len(inst.words) > 3:
                spoiled.add(inst.result or 0)
    single = {v: s[0] for v, s in stores.items() if len(s) == 1 and v not in spoiled}
    out = _Forward()
    out.stored = set()
    for bi, b in enumerate(blocks):
        for pos, inst in enumerate(b.insts):
            if inst.opcode != _OP["OpLoad"] or inst.result is None:
                continue
            ptr = inst.ids[0]
            var, comp = (ptr, None) if ptr in single else component.get(ptr, (0, None))
            if var not in single:
                continue
            sb, spos, value = single[var]
            if (sb == bi and spos < pos) or (sb != bi and _dominates(idom, sb, bi)):
                out[inst.result] = (value, comp)
    # a variable whose every load is forwarded needs no store
    loads: dict[int, int] = {}
    for b in blocks:
        for inst in b.insts:
            if inst.opcode == _OP["OpLoad"] and inst.result is not None:
                ptr = inst.ids[0]
                var = ptr if ptr in single else component.get(ptr, (0, None))[0]
                if var in single and inst.result not in out:
                    loads[var] = loads.get(var, 0) + 1
    out.stored = {v for v in single if not loads.get(v)}
    return out


# The size of an arm `_selects` flattens, in rows.  RADV's limit counts NIR instructions, which
# our rows are not, so it was measured (estimator corpus, seed 0, waves exact on navi21 wave64):
# 8 rows 93.8%, 16 rows 95.5%, 32 rows 95.7%, the same as no limit.
_ARM_ROWS = 32


def _selects(
    blocks: list[_Block],
    placed: list[list[_Row]],
    phi_uses: dict[int, set[int]],
    arm_limit: int = _ARM_ROWS,
    members: dict[int, int] | None = None,
) -> list[tuple[int, int, list[_Row]]]:
    """Blocks with the small selections they branch to flattened into them: a selection whose
    arms are single blocks of at most _ARM_ROWS rows without writes or barriers runs both arms
    and selects the results (Mesa `nir_opt_peephole_select`, which RADV runs with loads allowed
    to be speculated), so the scheduler sees header, arms and merge as one block.  Each run is
    the indices of its first and last block (what lives at the last's end lives at the run's
    end) and its rows;
    an arm's values live to its end, where the select reads them.  `arm_limit`: the most rows
    an arm may have; `members` gets each block's run (the index of its first block)."""
    index = {b.label: i for i, b in enumerate(blocks)}
    preds: dict[int, int] = {}
    for b in blocks:
        for t in b.succs:
            preds[t] = preds.get(t, 0) + 1

    def arm_ok(label: int, merge: int) -> bool:
        i = index.get(label)
        if i is None or blocks[i].succs != [merge] or preds.get(label) != 1:
            return False
        rows = placed[i]
        return len(rows) <= arm_limit + 1 and not any(r.memory in (_WRITE, _BARRIER) for r in rows)

    def flat(i: int) -> tuple[list[int], list[_Row]] | None:
        """(the arms' and merge's blocks, the arms' rows) of the selection block i heads."""
        b = blocks[i]
        if b.merge is None or len(b.succs) != 2 or b.merge not in index:
            return None
        arms = [t for t in b.succs if t != b.merge]
        if not all(arm_ok(t, b.merge) for t in arms):
            return None
        rows: list[_Row] = []
        for t in arms:
            rows += placed[index[t]]
            rows.append(_Row(set(), set(phi_uses[t]), arm_end=True))  # its values, to the select
        return [index[t] for t in arms] + [index[b.merge]], rows

    out: list[tuple[int, int, list[_Row]]] = []
    taken: set[int] = set()
    for i in range(len(blocks)):
        if i in taken:
            continue
        rows = list(placed[i])
        last = i
        while (f := flat(last)) is not None and not set(f[0]) & taken:
            merged, arm_rows = f
            rows += arm_rows + placed[merged[-1]]
            taken.update(merged)
            if members is not None:
                members.update((j, i) for j in merged)
            last = merged[-1]
        if members is not None:
            members.setdefault(i, i)
        out.append((i, last, rows))
    return out


def _move_loads_up(rows: list[_Row]) -> list[_Row] | None:
    """The order ACO's scheduler can reach in a run of rows: its loads moved up
    (`_move_up`), then the work that does not wait on the last block's loads moved above
    their first use (`_hoist_unrelated`).  None when nothing moves."""
    moved = _move_up(rows)
    hoisted = _hoist_unrelated(rows, rows if moved is None else moved)
    return moved if hoisted is None else hoisted


def _hoist_unrelated(rows: list[_Row], order: list[_Row]) -> list[_Row] | None:
    """`order` (the run `rows` after `_move_up`) with the rows that do not depend on the loads
    of the run's last block moved above the first row that does, keeping their order.

    ACO schedules block by block, and a selection Mesa does not flatten (the alignment
    branch of a quantized block's byte reads keeps its loads in the arms) ends a block: the
    words it loads reach the merge block as phis.  There, `schedule_VMEM` (Mesa 25.0
    `aco_scheduler.cpp`) first moves each load up, then moves the instructions after the
    load's first use that do not depend on it up above that use, to lengthen the load's
    latency window, as long as the register bound of the aim allows (codegen/estimate.py caps
    the peak at that bound).  Unpacking those words (bytes to floats, times the block's scale)
    is such work: one live word becomes up to four live floats before the first FMA.  Rows of
    the run before its last arm's end are of earlier blocks to ACO; the moved rows are the last
    block's; rows moved up above it by `_move_up` go on counting.  None when nothing moves."""
    last = max((i for i, r in enumerate(rows) if r.arm_end), default=-1)
    loads = {id(r) for r in rows[last + 1 :] if r.memory == _LOAD}
    if not loads:
        return None
    start = next(j for j, r in enumerate(order) if id(r) in loads)
    waits: set[int] = set()
    first: int | None = None
    moved: list[_Row] = []
    for j in range(start, len(order)):
        r = order[j]
        if r.memory in (_WRITE, _BARRIER):
            break
        if id(r) in loads or r.uses & waits:
            waits |= r.defs
            if first is None and id(r) not in loads:
                first = j
        elif first is not None:
            moved.append(r)
    if first is None or not moved:
        return None
    ids = {id(r) for r in moved}
    return order[:first] + moved + [r for r in order[first:] if id(r) not in ids]


def _move_up(rows: list[_Row]) -> list[_Row] | None:
    """A block's rows after every buffer load has moved up as far as its operands let it, with
    the instructions that compute its address: past anything it does not depend on, up to the
    last barrier or buffer write before it, in program order (loads keep their order).  This is
    what ACO's scheduler does when the occupancy it aims at leaves it registers (Mesa 25.0
    `aco_scheduler.cpp`, `schedule_VMEM`: each memory load is tried against the instructions
    before it, which move below it while they do not define its operands, cross no barrier and
    keep the register demand within the aim's bound).  The bound is the target's
    (codegen/estimate.py); the peak of this order is the most the scheduler can reach.  None
    when no load moves."""
    if not any(r.memory == _LOAD for r in rows):
        return None
    out: list[_Row] = []
    top = 0  # where the last barrier or write ends the region loads may move through
    # within that region: the row defining each element, and the rows using each one
    made_by: dict[int, _Row] = {}
    used_by: dict[int, list[_Row]] = {}

    def enter(r: _Row) -> None:
        for e in r.defs:
            made_by[e] = r
        for e in r.uses:
            used_by.setdefault(e, []).append(r)

    for row in rows:
        if row.memory != _LOAD:
            out.append(row)
            if row.memory:
                top = len(out)
                made_by.clear()
                used_by.clear()
            else:
                enter(row)
            continue
        # the rows computing its operands (not loads: those stay where they are)
        cone: list[_Row] = []
        need = list(row.uses)
        seen: set[int] = set()
        while need:
            e = need.pop()
            r = made_by.get(e)
            if r is None or r.memory == _LOAD or id(r) in seen:
                continue
            seen.add(id(r))
            cone.append(r)
            need.extend(r.uses)
        if cone:
            places = sorted(out.index(r, top) for r in cone)
            cone = [out[k] for k in places]
            for k in reversed(places):
                del out[k]
        cone.append(row)
        made = set().union(*(c.defs for c in cone))
        # below the last row that defines what the cone reads or reads what it defines
        after = {made_by.get(e) for c in cone for e in c.uses} | {
            u for e in made for u in used_by.get(e, ())
        }
        after -= {None, *cone}
        at = max((out.index(r, top) + 1 for r in after if r is not None), default=top)
        out[at:at] = cone
        for c in cone:
            enter(c)
    if all(a is b for a, b in zip(out, rows, strict=True)):
        return None
    return out
