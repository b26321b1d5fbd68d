"""Buffer addresses as the compiler computes them (codegen/liveness.py rule 10): one register per
address that several accesses share, near (an index value plus constants the instruction's
immediate offset holds) or far (`base + constant` past it), and the index arithmetic that the
shared address makes dead."""

from __future__ import annotations

from collections.abc import Callable

import attrs

from .liveness_moves import _SHIFT
from .spirv_grammar import OPCODES
from .spirv_module import (
    _CHAINS,
    _MAX_BUFFER_IMM_OFFSET,
    _OP,
    _OP_IADD,
    _OP_IMUL,
    _OP_ISUB,
    _OP_LOAD,
    _OP_SHL,
    _OP_STORE,
    _SC_STORAGE_BUFFER,
    _Block,
    _dominates,
    _Inst,
    _Module,
)

_LINEAR_PASS = {
    _OP[n] for n in ("OpBitcast", "OpUConvert", "OpSConvert", "OpCopyObject") if n in _OP
}

_Linear = tuple[dict[int, int], int]  # (value id -> coefficient, constant)


def _linear_form(m: _Module, defs: dict[int, _Inst]) -> Callable[[int], _Linear]:
    """An integer value as a sum of coefficients times opaque values plus a constant, through
    additions, subtractions and multiplications or shifts by constants: the form the
    compiler's algebraic passes bring an address to before it splits off the constant part
    (Mesa `nir_opt_algebraic`, `nir_opt_offsets`)."""
    memo: dict[int, _Linear] = {}

    def form(v: int, depth: int = 0) -> _Linear:
        got = memo.get(v)
        if got is not None:
            return got
        out: _Linear = ({v: 1}, 0)
        if v in m.consts and v not in m.spec_consts:
            word = m.consts[v]
            out = ({}, word - (1 << 32) if word >= 1 << 31 else word)  # as a signed integer
        elif depth < 32 and v in defs:
            inst = defs[v]
            op, ids = inst.opcode, inst.ids
            if op in _LINEAR_PASS and len(ids) == 1:
                out = form(ids[0], depth + 1)
            elif op in (_OP_IADD, _OP_ISUB) and len(ids) == 2:
                (ta, ca), (tb, cb) = form(ids[0], depth + 1), form(ids[1], depth + 1)
                sign = 1 if op == _OP_IADD else -1
                terms = dict(ta)
                for t, c in tb.items():
                    terms[t] = terms.get(t, 0) + sign * c
                out = ({t: c for t, c in terms.items() if c}, ca + sign * cb)
            elif op in (_OP_IMUL, _OP_SHL) and len(ids) == 2:
                (ta, ca), (tb, cb) = form(ids[0], depth + 1), form(ids[1], depth + 1)
                if op == _OP_SHL:
                    if not tb and 0 <= cb < 32:
                        out = ({t: c << cb for t, c in ta.items()}, ca << cb)
                elif not tb:
                    out = ({t: c * cb for t, c in ta.items()}, ca * cb)
                elif not ta:
                    out = ({t: c * ca for t, c in tb.items()}, ca * cb)
        memo[v] = out
        return out

    return form


@attrs.define
class _Addresses:
    """Buffer addresses the compiler computes once for several accesses (rule 10), instructions
    keyed by `id()`: the address elements each access uses, those defined just before the
    first access of a group (with the values they are computed from), the index each access
    no longer reads (its address stands for it) and the index computations nothing else
    reads, which are gone."""

    used: dict[int, set[int]] = attrs.field(factory=dict)
    defined: dict[int, set[int]] = attrs.field(factory=dict)
    sources: dict[int, set[int]] = attrs.field(factory=dict)  # first access -> value ids
    dropped: dict[int, int] = attrs.field(factory=dict)  # access -> index value id
    dead: set[int] = attrs.field(factory=set)  # result ids of index computations now unused


def _shared_addresses(
    m: _Module,
    blocks: list[_Block],
    divergent: set[int],
    idom: list[int],
    first_free: int,
    near: bool = True,
) -> _Addresses:
    """Buffer addresses used by several accesses: the compiler computes such an address once
    (Mesa `nir_lower_explicit_io` turns an index into a byte offset, `nir_opt_cse` and ACO's
    value numbering share it) and keeps it from the first access to the last.  An offset of at
    most 4095 bytes past a shared per-lane part is an immediate of the instruction (MUBUF
    OFFSET, `_MAX_BUFFER_IMM_OFFSET`), so accesses whose indices differ by such a constant share
    one register, the per-lane part scaled by the element size; past it, `base + constant` is
    the register.  The accesses then read the address, not their index: the index computations
    that nothing else reads are gone, and the values the address is computed from are read
    where it is computed, before the first access.  Without `near` (the count the NVIDIA rules
    were measured with, codegen/nvidia.py), only far addresses, and the accesses keep their
    indices."""
    defs = {i.result: i for b in blocks for i in b.insts if i.result is not None}
    form = _linear_form(m, defs)
    groups: dict[tuple[frozenset[tuple[int, int]], int], list[tuple[int, _Inst]]] = {}
    terms_of: dict[tuple[frozenset[tuple[int, int]], int], set[int]] = {}
    for bi, b in enumerate(blocks):
        for inst in b.insts:
            if inst.opcode not in (_OP_LOAD, _OP_STORE) or not inst.ids:
                continue
            chain = defs.get(inst.ids[0])
            if chain is None or chain.opcode not in _CHAINS or len(chain.ids) != 3:
                continue
            var, member = chain.ids[0], chain.ids[1]
            if m.var_sc.get(var) != _SC_STORAGE_BUFFER or m.consts.get(member, 1) != 0:
                continue
            block = m.types.get(m.pointee.get(m.type_of.get(var, 0), 0))
            if block is None or OPCODES[block.opcode][0] != "OpTypeStruct" or len(block.words) < 2:
                continue
            stride = m.array_stride.get(block.words[1], 0)  # the block's first member, an array
            if not stride:
                continue
            terms, const = form(chain.ids[2])
            offset = const * stride
            if not any(t in divergent for t in terms):
                continue
            close = 0 <= offset <= _MAX_BUFFER_IMM_OFFSET
            if close and not near:
                continue
            if close:  # value numbering finds one address where the indices differ by constants
                base, const = _plus_constant(m, defs, chain.ids[2])
                if not 0 <= const * stride <= _MAX_BUFFER_IMM_OFFSET:
                    continue
                terms = {base: 1}
            key = (frozenset((t, c * stride) for t, c in terms.items()), -1 if close else offset)
            groups.setdefault(key, []).append((bi, inst))
            terms_of[key] = {t for t in terms if t in divergent}
    out = _Addresses()
    for key, accesses in groups.items():
        if len(accesses) < 2:
            continue
        first_block, first = accesses[0]
        if not all(_dominates(idom, first_block, bi) for bi, _ in accesses[1:]):
            continue
        element = first_free << _SHIFT
        first_free += 1
        out.defined.setdefault(id(first), set()).add(element)
        for _, inst in accesses:
            out.used.setdefault(id(inst), set()).add(element)
        if near:
            out.sources.setdefault(id(first), set()).update(terms_of[key])
            for _, inst in accesses:
                out.dropped[id(inst)] = defs[inst.ids[0]].ids[2]
    if out.dropped:
        out.dead = _dead_indices(m, blocks, defs, out.dropped, terms_of)
    return out


def _plus_constant(m: _Module, defs: dict[int, _Inst], v: int) -> tuple[int, int]:
    """An index as a value plus a constant, through additions and subtractions of constants
    only: the form two accesses must share for value numbering to find one address."""
    const = 0
    for _ in range(32):
        inst = defs.get(v)
        if inst is None or inst.opcode not in (_OP_IADD, _OP_ISUB) or len(inst.ids) != 2:
            break
        a, b = inst.ids
        if b in m.consts and b not in m.spec_consts:
            word = m.consts[b]
            c = word - (1 << 32) if word >= 1 << 31 else word
            const += c if inst.opcode == _OP_IADD else -c
            v = a
        elif a in m.consts and a not in m.spec_consts and inst.opcode == _OP_IADD:
            word = m.consts[a]
            const += word - (1 << 32) if word >= 1 << 31 else word
            v = b
        else:
            break
    return v, const


def _dead_indices(
    m: _Module,
    blocks: list[_Block],
    defs: dict[int, _Inst],
    dropped: dict[int, int],
    terms_of: dict[tuple[frozenset[tuple[int, int]], int], set[int]],
) -> set[int]:
    """The index computations (the additions, multiplications and shifts `_linear_form` sees
    through) that only the dropped indices of shared addresses read."""
    keep = {t for ts in terms_of.values() for t in ts}
    readers: dict[int, list[_Inst]] = {}
    for b in blocks:
        for inst in b.insts:
            for i in inst.ids:
                readers.setdefault(i, []).append(inst)
    chains_ok = {  # chains every reader of which is an access whose index is dropped
        inst.result
        for b in blocks
        for inst in b.insts
        if inst.opcode in _CHAINS
        and inst.result is not None
        and all(id(r) in dropped for r in readers.get(inst.result, ()))
    }
    linear = {_OP_IADD, _OP_ISUB, _OP_IMUL, _OP_SHL, *_LINEAR_PASS}
    candidates = {
        v for v in dropped.values() if v in defs and defs[v].opcode in linear and v not in keep
    }
    dead: set[int] = set()
    while candidates:
        v = candidates.pop()
        if v in dead:
            continue
        if all(
            (r.opcode in _CHAINS and r.result in chains_ok) or r.result in dead
            for r in readers.get(v, ())
        ):
            dead.add(v)
            for src in defs[v].ids:
                if src in defs and defs[src].opcode in linear and src not in keep:
                    candidates.add(src)
    return dead
