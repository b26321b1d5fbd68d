"""A SPIR-V module as codegen/liveness.py reads it: the instructions decoded with the operand
layouts of the grammar (codegen/spirv_grammar.py), the functions' blocks, the divergence
analysis (which values differ between the lanes of a subgroup, rule 1 of liveness.py) and the
dominator tree of the blocks.  No register counting here."""

from __future__ import annotations

import struct
from collections.abc import Callable

import attrs

from .spirv import header_problem
from .spirv_grammar import OPCODES

# opcodes read by name
_OP = {name: op for op, (name, _) in OPCODES.items()}
_TERMINATORS = {
    _OP[n]
    for n in (
        "OpBranch",
        "OpBranchConditional",
        "OpSwitch",
        "OpReturn",
        "OpReturnValue",
        "OpKill",
        "OpUnreachable",
        "OpTerminateInvocation",
    )
    if n in _OP
}
_CHAINS = {_OP["OpAccessChain"], _OP["OpInBoundsAccessChain"], _OP["OpPtrAccessChain"]}
_OP_LINE, _OP_NO_LINE = _OP["OpLine"], _OP["OpNoLine"]
_OP_LOAD, _OP_STORE, _OP_PHI = _OP["OpLoad"], _OP["OpStore"], _OP["OpPhi"]
_OP_VARIABLE, _OP_EXTRACT = _OP["OpVariable"], _OP["OpCompositeExtract"]
_OP_SHUFFLE, _OP_INSERT = _OP["OpVectorShuffle"], _OP["OpCompositeInsert"]

# BuiltIn decoration values (SPIR-V spec, 3.21 "BuiltIn")
_ARRAY_STRIDE = 6
_BUILTIN = 11
_NON_WRITABLE = 24
# LocalInvocationId, GlobalInvocationId, LocalInvocationIndex, SubgroupLocalInvocationId: they
# differ per lane, and arrive in VGPRs at the start of the program
_DIVERGENT_BUILTINS = {27, 28, 29, 41}

# storage classes (SPIR-V spec, 3.7)
_SC_INPUT = 1
_SC_FUNCTION = 7
_SC_PRIVATE = 6
_SC_STORAGE_BUFFER = 12
# The largest byte offset a buffer instruction holds as an immediate: MUBUF's OFFSET field is 12
# bits (AMD "RDNA3 Instruction Set Architecture", MUBUF instruction fields; ACO keeps the same
# limit on gfx1201 with Mesa 25.0.7: `v_add_u32 0x3780, base` before `buffer_load_dword`).
_MAX_BUFFER_IMM_OFFSET = 4095

# subgroup operations (SPIR-V spec 3.49.24 "Non-Uniform Instructions"; the Vulkan subgroup
# tutorial for which results are the same on every lane of the subgroup)
_SUBGROUP_DIVERGENT = {
    "Elect",
    "Shuffle",
    "ShuffleXor",
    "ShuffleUp",
    "ShuffleDown",
    "QuadBroadcast",
    "QuadSwap",
    "InverseBallot",
    "BallotBitExtract",
}
_SUBGROUP_UNIFORM = {"All", "Any", "AllEqual", "Broadcast", "BroadcastFirst", "Ballot"}
_GROUP_REDUCE = 0  # GroupOperation (3.28): Reduce; scans and clustered reductions differ per lane


def _subgroup_kind(name: str) -> str:
    op = name.removeprefix("OpGroupNonUniform")
    if op in _SUBGROUP_DIVERGENT:
        return "divergent"
    return "uniform" if op in _SUBGROUP_UNIFORM else "by operation"


# opcode -> how a subgroup operation's result varies between lanes
_SUBGROUP = {
    op: _subgroup_kind(name)
    for op, (name, _) in OPCODES.items()
    if name.startswith("OpGroupNonUniform")
}
_ATOMICS = {op for op, (name, _) in OPCODES.items() if name.startswith("OpAtomic")}


def _subgroup_divergent(opcode: int, words: tuple[int, ...]) -> bool | None:
    """Whether a subgroup operation's result may differ between lanes (None: not one)."""
    kind = _SUBGROUP.get(opcode)
    if kind is None:
        return None
    if kind != "by operation":
        return kind == "divergent"
    # arithmetic and bit counts: result type, result, scope, GroupOperation, value
    return len(words) < 4 or words[3] != _GROUP_REDUCE


@attrs.define
class _Inst:
    opcode: int
    words: tuple[int, ...]  # operands, without the opcode word
    result: int | None = None
    rtype: int | None = None
    ids: tuple[int, ...] = ()  # ids the instruction reads
    line: int | None = None  # the source line an OpLine gave it (SPIR-V with debug info)


_Plan = tuple[int | None, int | None, tuple[tuple[int, int | None], ...]]


def _plan(code: str) -> _Plan | None:
    """Where an instruction keeps its result type, result and ids, as word positions and
    slices, when the layout allows (None: read it letter by letter)."""
    rtype = result = None
    slices: list[tuple[int, int | None]] = []
    letters = [(c, code[j + 1 : j + 2] == "*") for j, c in enumerate(code) if c != "*"]
    pos = 0
    for c, repeat in letters:
        if c in "TR" and not repeat:
            rtype, result = (pos, result) if c == "T" else (rtype, pos)
            pos += 1
        elif c in "IP":
            slices.append((pos, None if repeat else pos + 1))
            if repeat:
                break
            pos += 1
        elif c == "L" and not repeat:
            pos += 1
        elif c == "Z" or (c == "L" and repeat):
            break
        else:
            return None
    return rtype, result, tuple(slices)


_PLANS = {op: _plan(code) for op, (_, code) in OPCODES.items()}


def _decode(spv: bytes) -> list[_Inst]:
    problem = header_problem(spv)
    if problem is not None:
        raise ValueError(f"the module {problem}")
    words = struct.unpack(f"<{len(spv) // 4}I", spv)
    out: list[_Inst] = []
    append = out.append
    plans = _PLANS
    n_words = len(words)
    i = 5
    line = None  # an OpLine holds until the next OpLine, an OpNoLine or the block's end
    while i < n_words:
        count, opcode = words[i] >> 16, words[i] & 0xFFFF
        if count == 0 or i + count > n_words:
            raise ValueError("truncated SPIR-V instruction")
        ops = words[i + 1 : i + count]
        if opcode == _OP_LINE and len(ops) >= 2:
            line = ops[1]
        elif opcode == _OP_NO_LINE or opcode in _TERMINATORS:
            line = None
        plan = plans.get(opcode)
        if plan is None:
            inst = _Inst(opcode, ops, line=line)
            _operands(inst, OPCODES.get(opcode, ("", "Z"))[1])
        else:
            rt, res, slices = plan
            n = len(ops)
            if len(slices) == 1:
                ids = ops[slices[0][0] : slices[0][1]]
            elif slices:
                ids = tuple(i for a, b in slices for i in ops[a:b])
            else:
                ids = ()
            inst = _Inst(
                opcode,
                ops,
                ops[res] if res is not None and res < n else None,
                ops[rt] if rt is not None and rt < n else None,
                ids,
                line,
            )
        append(inst)
        i += count
    return out


def _operands(inst: _Inst, code: str) -> None:
    ops, ids = inst.words, []
    pos = 0
    letters = [(c, code[j + 1 : j + 2] == "*") for j, c in enumerate(code) if c != "*"]
    for c, repeat in letters:
        while pos < len(ops):
            if c == "T":
                inst.rtype = ops[pos]
                pos += 1
            elif c == "R":
                inst.result = ops[pos]
                pos += 1
            elif c == "I":
                ids.append(ops[pos])
                pos += 1
            elif c == "L":
                pos += 1
            elif c == "P":
                ids.extend(ops[pos : pos + 2])
                pos += 2
            elif c == "Q":
                ids.append(ops[pos + 1]) if pos + 1 < len(ops) else None
                pos += 2
            elif c == "S":
                ids.append(ops[pos])
                pos += 2
            else:  # Z: nothing after it is read
                inst.ids = tuple(ids)
                return
            if not repeat:
                break
    inst.ids = tuple(ids)


@attrs.define
class _Block:
    label: int
    insts: list[_Inst] = attrs.field(factory=list)
    succs: list[int] = attrs.field(factory=list)
    merge: int | None = None  # the merge block of a selection or loop headed here


class _Module:
    def __init__(self, spv: bytes) -> None:
        insts = _decode(spv)
        self.bound = struct.unpack_from("<I", spv, 12)[0]  # every id is below it
        self.size: dict[int, float] = {}  # type id -> registers
        self.is_bool: set[int] = set()
        self.pointee: dict[int, int] = {}
        self.array_len: dict[int, int] = {}
        self.types: dict[int, _Inst] = {}
        self.consts: dict[int, int] = {}  # constant id -> value (integers)
        self.spec_consts: set[int] = set()  # those of `consts` the pipeline may specialize
        self.spec_ops: dict[int, tuple[int, ...]] = {}  # OpSpecConstantOp: (opcode, operands)
        self.bools: dict[int, int] = {}  # boolean constants (1 or 0)
        self.array_stride: dict[int, int] = {}  # array type -> bytes between elements
        self.builtin: dict[int, int] = {}
        self.readonly: set[int] = set()  # variables and block types decorated NonWritable
        self.var_sc: dict[int, int] = {}
        self.type_of: dict[int, int] = {}
        self.functions: list[list[_Block]] = []
        block: _Block | None = None
        blocks: list[_Block] = []
        for inst in insts:
            name = OPCODES.get(inst.opcode, ("?", ""))[0]
            if inst.rtype is not None and inst.result is not None:
                self.type_of[inst.result] = inst.rtype
            if name == "OpDecorate" and len(inst.words) >= 3 and inst.words[1] == _BUILTIN:
                self.builtin[inst.words[0]] = inst.words[2]
            elif name == "OpDecorate" and len(inst.words) >= 3 and inst.words[1] == _ARRAY_STRIDE:
                self.array_stride[inst.words[0]] = inst.words[2]
            elif name == "OpDecorate" and len(inst.words) >= 2 and inst.words[1] == _NON_WRITABLE:
                self.readonly.add(inst.words[0])
            elif (
                name == "OpMemberDecorate"
                and len(inst.words) >= 3
                and inst.words[2] == _NON_WRITABLE
            ):
                self.readonly.add(inst.words[0])  # the block's struct type
            elif name.startswith("OpType"):
                self._type(name, inst)
            elif name == "OpSpecConstantOp" and inst.result is not None and len(inst.words) >= 3:
                self.spec_ops[inst.result] = inst.words[2:]
            elif name in ("OpConstantTrue", "OpSpecConstantTrue") and inst.result is not None:
                self.bools[inst.result] = 1
            elif name in ("OpConstantFalse", "OpSpecConstantFalse") and inst.result is not None:
                self.bools[inst.result] = 0
            elif name in ("OpConstant", "OpSpecConstant") and inst.result is not None:
                self.consts[inst.result] = inst.words[2] if len(inst.words) > 2 else 0
                if name == "OpSpecConstant":
                    self.spec_consts.add(inst.result)
            elif name == "OpVariable" and inst.result is not None:
                self.var_sc[inst.result] = inst.words[2]
                if block is not None:
                    block.insts.append(inst)
            elif name == "OpFunction":
                blocks = []
            elif name == "OpFunctionEnd":
                self.functions.append(blocks)
                block = None
            elif name == "OpLabel":
                block = _Block(inst.result or 0)
                blocks.append(block)
            elif block is not None:
                if name in ("OpLoopMerge", "OpSelectionMerge"):
                    block.merge = inst.words[0]
                elif inst.opcode in _TERMINATORS:
                    if name == "OpBranch":
                        block.succs = [inst.words[0]]
                    elif name == "OpBranchConditional":
                        block.succs = list(inst.words[1:3])
                    elif name == "OpSwitch":
                        block.succs = [inst.words[1], *inst.words[3::2]]
                    block.insts.append(inst)
                    block = None
                    continue
                block.insts.append(inst)

    def _type(self, name: str, inst: _Inst) -> None:
        r, w = inst.result, inst.words
        if r is None:
            return
        self.types[r] = inst
        if name == "OpTypeBool":
            self.size[r] = 0
            self.is_bool.add(r)
        elif name in ("OpTypeInt", "OpTypeFloat"):
            self.size[r] = 2 if w[1] > 32 else (0.5 if w[1] <= 16 else 1)
        elif name == "OpTypeVector":
            comp = self.size.get(w[1], 1)
            self.size[r] = comp * w[2]
            if w[1] in self.is_bool:
                self.is_bool.add(r)
        elif name == "OpTypeArray":
            self.array_len[r] = w[2]
            self.size[r] = self.size.get(w[1], 1)  # per element: words_of() has the length
        elif name == "OpTypeStruct":
            self.size[r] = sum(self.size.get(m, 1) for m in w[1:])
        elif name == "OpTypePointer":
            self.pointee[r] = w[2]
            self.size[r] = 0

    def registers(self, value: int) -> float:
        t = self.type_of.get(value)
        if t is None:
            return 0
        s = self.size.get(t, 1)
        return 1 if s == 0.5 else s  # a 16-bit scalar takes a register of its own

    def words_of(self, type_id: int) -> int:
        """32-bit words of a variable's type (arrays by their constant length)."""
        inst = self.types.get(type_id)
        if inst is None:
            return 1
        name = OPCODES[inst.opcode][0]
        if name == "OpTypeArray":
            return self.consts.get(inst.words[2], 1) * self.words_of(inst.words[1])
        if name == "OpTypeStruct":
            return sum(self.words_of(m) for m in inst.words[1:])
        return max(1, round(self.size.get(type_id, 1)))


def _divergence(m: _Module, blocks: list[_Block]) -> set[int]:
    """Values (and private variables) that may differ between the lanes of a subgroup: a
    fixpoint over the function (module docstring for the rules).  Not modelled: a value
    computed inside a loop whose exit is divergent and read after it (rare in our kernels)."""
    divergent: set[int] = set()
    chain_base: dict[int, int] = {}
    divergent_merges: set[int] = set()  # merge blocks of branches on a divergent condition

    def base_of(ptr: int) -> int:
        while ptr in chain_base:
            ptr = chain_base[ptr]
        return ptr

    changed = True
    while changed:
        changed = False
        for b in blocks:
            term = b.insts[-1] if b.insts else None
            if (
                b.merge is not None
                and term is not None
                and OPCODES[term.opcode][0] in ("OpBranchConditional", "OpSwitch")
                and term.words[0] in divergent
                and b.merge not in divergent_merges
            ):
                divergent_merges.add(b.merge)
                changed = True
            for inst in b.insts:
                r = inst.result
                if inst.opcode == _OP["OpStore"] and len(inst.ids) >= 2:
                    # a private variable holds a divergent value once one is stored in it
                    var = base_of(inst.ids[0])
                    if (
                        m.var_sc.get(var) in (_SC_FUNCTION, _SC_PRIVATE)
                        and var not in divergent
                        and (inst.ids[1] in divergent or inst.ids[0] in divergent)
                    ):
                        divergent.add(var)
                        changed = True
                if r is None or r in divergent:
                    continue
                if _is_divergent(m, b, inst, divergent, divergent_merges, chain_base, base_of):
                    divergent.add(r)
                    changed = True
    return divergent


def _is_divergent(
    m: _Module,
    b: _Block,
    inst: _Inst,
    divergent: set[int],
    divergent_merges: set[int],
    chain_base: dict[int, int],
    base_of: Callable[[int], int],
) -> bool:
    op = inst.opcode
    if op in _CHAINS:
        chain_base[inst.result or 0] = inst.ids[0]
        return any(i in divergent for i in inst.ids)
    if op == _OP_LOAD:
        ptr = inst.ids[0]
        var = base_of(ptr)
        if m.var_sc.get(var) == _SC_INPUT:
            return m.builtin.get(var) in _DIVERGENT_BUILTINS or ptr in divergent
        return ptr in divergent or var in divergent
    if op == _OP_PHI:
        return b.label in divergent_merges or any(i in divergent for i in inst.ids[0::2])
    if op in _ATOMICS:
        return True
    if op == _OP_VARIABLE:
        return False
    subgroup = _subgroup_divergent(op, inst.words)
    if subgroup is not None:
        return subgroup
    return any(i in divergent for i in inst.ids)


def _components(m: _Module, value: int) -> tuple[int, float]:
    """(components, registers per component) of a value: a vector's components are separate
    registers that die one by one (the compiler splits vectors into scalars)."""
    t = m.type_of.get(value)
    inst = m.types.get(t) if t is not None else None
    if inst is not None and OPCODES[inst.opcode][0] == "OpTypeVector":
        comp = m.size.get(inst.words[1], 1)
        return inst.words[2], comp
    return 1, m.registers(value)


# what the scheduler's load moves see (`_move_loads_up`): a load from buffer memory, a store or
# atomic to it, a barrier
_LOAD, _WRITE, _BARRIER = 1, 2, 3


def _dominators(blocks: list[_Block]) -> tuple[list[int], list[int]]:
    """Immediate dominator and loop depth of each block (by index; the entry is 0).  Cooper,
    Harvey and Kennedy, "A Simple, Fast Dominance Algorithm" (2001); natural loops from back
    edges (an edge to a block that dominates its source)."""
    index = {b.label: i for i, b in enumerate(blocks)}
    succs = [[index[s] for s in b.succs if s in index] for b in blocks]
    preds: list[list[int]] = [[] for _ in blocks]
    for i, ss in enumerate(succs):
        for j in ss:
            preds[j].append(i)
    order: list[int] = []  # reverse postorder
    seen = {0}
    stack = [(0, iter(succs[0]))]
    while stack:
        node, it = stack[-1]
        nxt = next(it, None)
        if nxt is None:
            order.append(node)
            stack.pop()
        elif nxt not in seen:
            seen.add(nxt)
            stack.append((nxt, iter(succs[nxt])))
    order.reverse()
    rpo = {n: i for i, n in enumerate(order)}
    idom = [-1] * len(blocks)
    idom[0] = 0

    def intersect(a: int, b: int) -> int:
        while a != b:
            while rpo[a] > rpo[b]:
                a = idom[a]
            while rpo[b] > rpo[a]:
                b = idom[b]
        return a

    changed = True
    while changed:
        changed = False
        for n in order[1:]:
            done = [p for p in preds[n] if idom[p] != -1 and p in rpo]
            if not done:
                continue
            new = done[0]
            for p in done[1:]:
                new = intersect(p, new)
            if idom[n] != new:
                idom[n], changed = new, True
    depth = [0] * len(blocks)
    for src, ss in enumerate(succs):
        for h in ss:
            if src not in rpo or not _dominates(idom, h, src):
                continue
            body, work = {h}, [src]
            while work:
                x = work.pop()
                if x not in body:
                    body.add(x)
                    work.extend(preds[x])
            for x in body:
                depth[x] += 1
    return idom, depth


def _dominates(idom: list[int], a: int, b: int) -> bool:
    while b != a:
        if b == 0 or idom[b] in (-1, b):
            return False
        b = idom[b]
    return True


def _lca(idom: list[int], depth_in_tree: list[int], a: int, b: int) -> int:
    while a != b:
        if depth_in_tree[a] >= depth_in_tree[b]:
            a = idom[a]
        else:
            b = idom[b]
    return a


_OP_IADD, _OP_ISUB = _OP["OpIAdd"], _OP["OpISub"]
_OP_IMUL, _OP_SHL = _OP["OpIMul"], _OP["OpShiftLeftLogical"]
