"""Specialization constants as the driver sees them: values folded at the defaults the module
declares, and the blocks that run once a branch they decide goes one way (codegen/liveness.py
rule 14)."""

from __future__ import annotations

from collections.abc import Callable

from .spirv_grammar import OPCODES
from .spirv_module import _Block, _Module

# Operations of OpSpecConstantOp (SPIR-V 3.32.6) that a branch condition is folded through:
# integer arithmetic and comparisons, and logic on their results.
_FOLDS: dict[str, Callable[[int, int], int | None]] = {
    "OpIAdd": lambda a, b: a + b,
    "OpISub": lambda a, b: a - b,
    "OpIMul": lambda a, b: a * b,
    "OpUDiv": lambda a, b: a // b if b else None,
    "OpUMod": lambda a, b: a % b if b else None,
    "OpShiftLeftLogical": lambda a, b: a << b if b < 32 else None,
    "OpShiftRightLogical": lambda a, b: a >> b if b < 32 else None,
    "OpBitwiseAnd": lambda a, b: a & b,
    "OpBitwiseOr": lambda a, b: a | b,
    "OpIEqual": lambda a, b: int(a == b),
    "OpINotEqual": lambda a, b: int(a != b),
    "OpULessThan": lambda a, b: int(a < b),
    "OpULessThanEqual": lambda a, b: int(a <= b),
    "OpUGreaterThan": lambda a, b: int(a > b),
    "OpUGreaterThanEqual": lambda a, b: int(a >= b),
    "OpLogicalAnd": lambda a, b: a & b,
    "OpLogicalOr": lambda a, b: a | b,
    "OpLogicalEqual": lambda a, b: int(a == b),
    "OpLogicalNotEqual": lambda a, b: int(a != b),
}


def constant_values(m: _Module) -> dict[int, int]:
    """Integer and boolean constants, specialization constants at their defaults (the values
    the pipeline is compiled with unless it overrides them) and OpSpecConstantOp folded on
    them, as unsigned 32-bit integers (booleans 1 or 0)."""
    values = {**m.consts, **m.bools}
    for result, words in m.spec_ops.items():  # in module order: operands come first
        name = OPCODES.get(words[0], ("?", ""))[0]
        args = [values.get(w) for w in words[1:]]
        if any(a is None for a in args):
            continue
        got: int | None = None
        if name == "OpLogicalNot" and len(args) == 1:
            got = 1 - (args[0] or 0)
        elif name == "OpSelect" and len(args) == 3:
            got = args[1] if args[0] else args[2]
        elif name in _FOLDS and len(args) == 2:
            got = _FOLDS[name](args[0] or 0, args[1] or 0)
        if got is not None:
            values[result] = got & 0xFFFFFFFF
    return values


def _constant_branches(m: _Module, blocks: list[_Block]) -> list[_Block]:
    """The blocks that run once the specialization constants have their values: a conditional
    branch on a condition that is then a constant goes one way, and what only the other way
    reached is gone (the driver compiles the pipeline with its constants: Mesa's
    `nir_opt_constant_folding` and `nir_opt_dead_cf`).  `if (K % 2 == 0)` of a contraction
    whose K is even keeps its first arm only."""
    values: dict[int, int] | None = None
    out: list[_Block] = []
    changed = False
    for b in blocks:
        term = b.insts[-1] if b.insts else None
        if (
            term is not None
            and OPCODES.get(term.opcode, ("?", ""))[0] == "OpBranchConditional"
            and len(term.words) >= 3
            and term.words[1] != term.words[2]
        ):
            if values is None:
                values = constant_values(m)
            cond = values.get(term.words[0])
            if cond is not None:
                b = _Block(b.label, b.insts, [term.words[1] if cond else term.words[2]], b.merge)
                changed = True
        out.append(b)
    if not changed:
        return blocks
    by_label = {b.label: b for b in out}
    seen = {out[0].label}
    work = [out[0].label]
    while work:
        for s in by_label[work.pop()].succs:
            if s in by_label and s not in seen:
                seen.add(s)
                work.append(s)
    return [
        b if b.merge is None or b.merge in seen else _Block(b.label, b.insts, b.succs, None)
        for b in out
        if b.label in seen
    ]
