"""Closed sets of the language: dtypes, placements, reduction scopes, functions."""

from __future__ import annotations

import enum


class DType(enum.Enum):
    F32 = "f32"
    F16 = "f16"
    U32 = "u32"
    I32 = "i32"
    Q8_0 = "q8_0"  # GGUF blocks of 32: f16 scale, 32 x int8 (34 bytes), value = q * d
    Q4_0 = "q4_0"  # GGUF blocks of 32: f16 scale, 16 bytes of nibbles (18 bytes), (q - 8) * d
    # an unfused chain's `as q8_0` intermediate, in fusec's own aligned layout: per 32-element
    # block 8 words of int8 quants, the scale (f16-rounded) as f32, the quants' sum, 2 words of
    # padding (48 bytes, three 16-byte loads); never declared by a user
    Q8_0X = "q8_0x"
    ERROR = "<error>"  # poison: a failed expression, so one mistake does not cascade

    @property
    def is_float(self) -> bool:
        return self in (DType.F32, DType.F16, DType.Q8_0, DType.Q4_0, DType.Q8_0X)

    @property
    def is_quantized(self) -> bool:
        return self in (DType.Q8_0, DType.Q4_0)

    @property
    def block_bytes(self) -> int:
        """Bytes of one 32-element block (the layout llama.cpp's ggml uses)."""
        return {DType.Q8_0: 34, DType.Q4_0: 18}[self]

    @property
    def is_int(self) -> bool:
        return self in (DType.U32, DType.I32)

    @property
    def bytes(self) -> int:
        return {DType.F32: 4, DType.F16: 2, DType.U32: 4, DType.I32: 4}[self]


# dtypes a region signature may name
BUFFER_DTYPES = {
    d.value: d for d in (DType.F32, DType.F16, DType.U32, DType.I32, DType.Q8_0, DType.Q4_0)
}
QUANT_BLOCK = 32  # elements per GGUF q8_0 / q4_0 block
# 32-bit words per block of a shared stage stored `as q8_0`: 8 of int8 quants, the scale, the
# quants' sum (codegen/glsl.py lays them out)
Q8_SHARED_WORDS = 10


class Placement(enum.Enum):
    """Where an intermediate lives in the fused kernel."""

    REGISTER = "register"  # per lane; an indexed register value is recomputed where it is used
    SHARED = "shared"  # materialized once per workgroup in shared memory (LDS)
    GLOBAL = "global"  # written to VRAM: the fused kernel is split at this stage
    # each workgroup keeps the slice of rows its subgroups computed, in shared memory; a
    # contraction over the index sums the slices of all workgroups with float atomics (split-K)
    SLICES = "slices"


class Scope(enum.Enum):
    """Which threads cooperate on one reduction."""

    LANE = "lane"  # one lane loops over the whole index
    SUBGROUP = "subgroup"  # the index is spread over the lanes of a subgroup
    WORKGROUP = "workgroup"  # the index is spread over the whole workgroup


# elementwise functions: name -> number of arguments
FUNCTIONS: dict[str, int] = {
    "exp": 1,
    "log": 1,
    "sqrt": 1,
    "rsqrt": 1,
    "abs": 1,
    "tanh": 1,
    "sin": 1,
    "cos": 1,
    "sigmoid": 1,
    "silu": 1,
    "erf": 1,
    "gelu": 1,  # x * Phi(x), Phi the normal distribution (with erf)
    "gelu_tanh": 1,  # the tanh approximation of gelu
    "softplus": 1,  # log(1 + exp(x))
    "float": 1,  # an integer (an index, a constant) as a real
    "max": 2,
    "min": 2,
    "pow": 2,
    "select": 3,
    "clamp": 3,  # clamp(x, lo, hi) = min(max(x, lo), hi)
    # subgroup exchange inside a tile (lanes are numbered within the tile's group)
    "shuffle_xor": 2,
    "shuffle": 2,
    "broadcast": 2,
}
EXCHANGE_FUNCTIONS = ("shuffle_xor", "shuffle", "broadcast")

REDUCERS = ("sum", "max", "min")
