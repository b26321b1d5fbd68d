"""Specialization constants written into the SPIR-V itself before a pipeline is created
(`FUSEC_SPEC_CONSTANTS`), for drivers that compile a module differently depending on what its
defaults say (docs/BENCHMARKS.md, "A driver effect"):

- `pass` (the default): the module as built; the values travel in VkSpecializationInfo only;
- `defaults`: every `OpSpecConstant` whose SpecId has a run-time value gets it as its default
  too (the values still travel in VkSpecializationInfo: the same pipeline, other defaults);
- `freeze`: those constants become plain `OpConstant`s (SPIR-V 1.6, 3.52.7 and 2.13: a
  specialization constant's SpecId decoration goes with it), so the driver sees numbers where
  the module had parameters, as if it had been built for these shapes.

No compiler is needed: the module's words are rewritten in place (a constant keeps its
length; the SpecId decorations removed shrink the module)."""

from __future__ import annotations

import struct
from collections.abc import Sequence

from .device import choice_switch

SWITCH = "FUSEC_SPEC_CONSTANTS"
MODES = ("pass", "defaults", "freeze")

# SPIR-V 1.6, 3.52 (opcodes) and 3.20 (decorations)
_OP_DECORATE = 71
_SPEC_ID = 1
_OP_SPEC_TRUE, _OP_SPEC_FALSE, _OP_SPEC = 48, 49, 50
_OP_TRUE, _OP_FALSE, _OP_CONST = 41, 42, 43


def spec_mode(value: str | None = None) -> str:
    """`FUSEC_SPEC_CONSTANTS`, strictly parsed."""
    return choice_switch(SWITCH, value, MODES, "pass", "a way of passing specialization constants")


def specialize(spv: bytes, spec: Sequence[tuple[int, str, int | float]], mode: str) -> bytes:
    """`spv` with the run-time values `spec` ((SpecId, dtype, value)) written in as `mode`
    says (module docstring); `pass` returns it unchanged."""
    if mode == "pass" or not spec:
        return spv
    words = list(struct.unpack(f"<{len(spv) // 4}I", spv))
    values = {cid: _word(dt, v) for cid, dt, v in spec}
    # SpecId decorations: result id -> SpecId, and where each decoration lies
    spec_of: dict[int, int] = {}
    decorations: dict[int, tuple[int, int]] = {}
    i = 5
    while i < len(words):
        count, op = words[i] >> 16, words[i] & 0xFFFF
        if count == 0:
            return spv  # malformed: the driver's validation says so, not this rewrite
        if op == _OP_DECORATE and count == 4 and words[i + 2] == _SPEC_ID:
            spec_of[words[i + 1]] = words[i + 3]
            decorations[words[i + 1]] = (i, count)
        i += count
    frozen: set[int] = set()
    i = 5
    while i < len(words):
        count, op = words[i] >> 16, words[i] & 0xFFFF
        if op in (_OP_SPEC, _OP_SPEC_TRUE, _OP_SPEC_FALSE):
            result = words[i + 2]
            cid = spec_of.get(result)
            if cid is not None and cid in values:
                if op == _OP_SPEC:
                    if count == 4:  # a 32-bit scalar; wider ones keep their default
                        words[i + 3] = values[cid]
                        if mode == "freeze":
                            words[i] = (count << 16) | _OP_CONST
                            frozen.add(result)
                elif mode == "freeze":
                    words[i] = (count << 16) | (_OP_TRUE if values[cid] else _OP_FALSE)
                    frozen.add(result)
                else:
                    words[i] = (count << 16) | (_OP_SPEC_TRUE if values[cid] else _OP_SPEC_FALSE)
        i += count
    drop = sorted(decorations[r] for r in frozen)
    for start, count in reversed(drop):
        del words[start : start + count]
    return struct.pack(f"<{len(words)}I", *words)


def _word(dtype: str, value: int | float) -> int:
    if dtype in ("u32", "i32"):
        return int(value) & 0xFFFFFFFF
    (word,) = struct.unpack("<I", struct.pack("<f", float(value)))
    return int(word)
