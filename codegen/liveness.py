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
9. A private array still indexed by a variable may stay in registers or go to scratch memory;
   its size is reported (`private_words`) for the caller to judge conservatively.
10. *A buffer address too far from its base is a register, shared by the accesses that use
   it.*  A buffer instruction holds a byte offset of at most 4095 as an immediate (MUBUF's
   12-bit OFFSET field, AMD RDNA3 ISA); past it the address `base + constant` is a VGPR, and
   accesses whose index reduces to the same base and constant (say `m[t * 4096 + j + 32 * i]`
   loaded and `C[(t * 128 + i) * 32 + j]` stored) use one such VGPR (Mesa `nir_opt_cse`,
   `nir_opt_offsets`), live from the first to the last (`_shared_far_addresses`).

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
   `estimate_waves`).  Not modelled: the scheduler's per-load limits on how many instructions
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

Not modelled, and measured where it matters (docs/ESTIMATOR.md): the compiler's algebraic
rewrites (e.g. a shift and a mask turned into one bitfield extract), loop unrolling by the
driver (our generator unrolls where it wants unrolling), vectorization of adjacent loads, and a
value computed inside a loop with a divergent exit and read after it.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable

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


def demand(spv: bytes, *, sink_loads: bool = False) -> Demand:
    """Peak register demand of the module's functions (module docstring).  With `sink_loads`,
    loads move to their first use like the cheap instructions of rule 8: the demand of a
    compiler that issues each load where its value is needed (codegen/nvidia.py)."""
    m = _Module(spv)
    peak = up = mixed = 0.0
    private = 0
    for blocks in m.functions:
        if blocks:
            v, u, x, p = _function_demand(m, blocks, sink_loads=sink_loads)
            peak, up, mixed, private = max(peak, v), max(up, u), max(mixed, x), private + p
    return Demand(int(-(-peak // 1)), private, int(-(-up // 1)), int(-(-mixed // 1)))


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


# what the scheduler's load moves see (`_move_loads_up`): a load from buffer memory, a store or
# atomic to it, a barrier
_LOAD, _WRITE, _BARRIER = 1, 2, 3
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


def _sink(
    blocks: list[_Block],
    block_rows: list[list[_Row]],
    phi_uses: dict[int, set[int]],
    dom: tuple[list[int], list[int]],
) -> list[list[_Row]]:
    """The rows after moving each movable one down to its uses: before its first user when
    that is in the block where its users meet (the latest block that dominates them all, never
    inside a loop the row was not in), else at the end of that block.  Latest first, so chains
    of such rows move together (Mesa `nir_opt_sink` and `nir_opt_move`, which RADV runs
    before ACO selects instructions)."""
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
    start = 0
    for bi, rs in enumerate(block_rows):
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
        if not row.movable or not row.defs or g == terminator[a]:
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


_LINEAR_PASS = {
    _OP[n] for n in ("OpBitcast", "OpUConvert", "OpSConvert", "OpCopyObject") if n in _OP
}
_OP_IADD, _OP_ISUB = _OP["OpIAdd"], _OP["OpISub"]
_OP_IMUL, _OP_SHL = _OP["OpIMul"], _OP["OpShiftLeftLogical"]

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


def _shared_far_addresses(
    m: _Module, blocks: list[_Block], divergent: set[int], idom: list[int], first_free: int
) -> tuple[dict[int, set[int]], dict[int, set[int]]]:
    """Buffer addresses too far from their base for the instruction's offset field, used by
    several accesses: the compiler computes such an address once (`base + constant` in a VGPR;
    Mesa `nir_opt_cse`, ACO's value numbering) and keeps it from the first access to the last.
    Nearer offsets are immediates of the instruction (MUBUF OFFSET, `_MAX_BUFFER_IMM_OFFSET`)
    and cost no register.  Returns (access instruction -> address elements it uses, first
    access -> address elements defined just before it), instructions keyed by `id()`."""
    defs = {i.result: i for b in blocks for i in b.insts if i.result is not None}
    form = _linear_form(m, defs)
    groups: dict[tuple[frozenset[tuple[int, int]], int], list[tuple[int, _Inst]]] = {}
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
            if 0 <= offset <= _MAX_BUFFER_IMM_OFFSET or not any(t in divergent for t in terms):
                continue
            key = (frozenset((t, c * stride) for t, c in terms.items()), offset)
            groups.setdefault(key, []).append((bi, inst))
    used: dict[int, set[int]] = {}
    defined: dict[int, set[int]] = {}
    for accesses in groups.values():
        if len(accesses) < 2:
            continue
        first_block, first = accesses[0]
        if not all(_dominates(idom, first_block, bi) for bi, _ in accesses[1:]):
            continue
        element = first_free << _SHIFT
        first_free += 1
        defined.setdefault(id(first), set()).add(element)
        for _, inst in accesses:
            used.setdefault(id(inst), set()).add(element)
    return used, defined


def _function_demand(
    m: _Module, blocks: list[_Block], report: Breakdown | None = None, sink_loads: bool = False
) -> tuple[float, float, float, int]:
    """(peak VGPRs, the peak with loads moved up (`_move_loads_up`), the peak with mixed
    dot products' signed operands unpacked (rule 13), words of private arrays).  Only divergent
    values are tracked: a uniform one costs no VGPR (rule 1), but still counts as a source that
    keeps an instruction in place (`_movable`)."""
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
    far_used, far_defined = _shared_far_addresses(m, blocks, divergent, dom[0], m.bound)
    for elements_ in far_defined.values():
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
            if far_defined and id(inst) in far_defined:
                rows.append(_Row(set(far_defined[id(inst)]), set()))
            defs = (
                {r << _SHIFT | c for c in range(ncomp[r])} - entry
                if r in ncomp and r in divergent
                else set()
            )
            if op == _OP_PHI:
                for value, pred in zip(inst.ids[0::2], inst.ids[1::2], strict=False):
                    if pred in phi_uses:
                        phi_uses[pred] |= elements([value])
                rows.append(_Row(defs, set(), line=inst.line))
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
                if far_used and id(inst) in far_used:
                    used |= far_used[id(inst)]
                memory = 0
                if op in _BARRIERS:
                    memory = _BARRIER
                elif (
                    inst.ids and m.var_sc.get(root.get(inst.ids[0], inst.ids[0])) in _BUFFER_CLASSES
                ):
                    if op == _OP_LOAD:
                        memory = _LOAD
                    elif op == _OP_STORE or op in _ATOMICS:
                        memory = _WRITE
                rows.append(_Row(defs, used, line=inst.line, memory=memory))
                if op in _MIXED_DOTS and inst.ids:
                    unpacked |= elements(inst.ids[:1])
        block_rows.append(rows)
    placed = _sink(blocks, block_rows, phi_uses, dom)
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


# The size of an arm `_selects` flattens, in rows.  RADV's limit counts NIR instructions, which
# our rows are not, so it was measured (estimator corpus, seed 0, waves exact on navi21 wave64):
# 8 rows 93.8%, 16 rows 95.5%, 32 rows 95.7%, the same as no limit.
_ARM_ROWS = 32


def _selects(
    blocks: list[_Block], placed: list[list[_Row]], phi_uses: dict[int, set[int]]
) -> list[tuple[int, int, list[_Row]]]:
    """Blocks with the small selections they branch to flattened into them: a selection whose
    arms are single blocks of at most _ARM_ROWS rows without writes or barriers runs both arms
    and selects the results (Mesa `nir_opt_peephole_select`, which RADV runs with loads allowed
    to be speculated), so the scheduler sees header, arms and merge as one block.  Each run is
    the indices of its first and last block (what lives at the last's end lives at the run's
    end) and its rows;
    an arm's values live to its end, where the select reads them."""
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
        return len(rows) <= _ARM_ROWS + 1 and not any(r.memory in (_WRITE, _BARRIER) for r in rows)

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
            rows.append(_Row(set(), set(phi_uses[t])))  # the arm's values, up to the select
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
            last = merged[-1]
        out.append((i, last, rows))
    return out


def _move_loads_up(rows: list[_Row]) -> list[_Row] | None:
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
