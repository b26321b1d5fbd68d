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
    # GGUF "K-quants", super-blocks of 256 elements (llama.cpp ggml/src/ggml-common.h, structs
    # block_q4_K and block_q6_K; names as ggml's type_name spells them):
    # q4_K, 144 bytes: f16 d, f16 dmin, 12 bytes of 6-bit scales and mins of 8 sub-blocks of
    # 32, 128 bytes of nibbles; value = d * scale * q - dmin * min
    Q4_K = "q4_K"
    # q6_K, 210 bytes: 128 bytes of low nibbles (ql), 64 bytes of high 2-bit pairs (qh), 16
    # int8 scales of sub-blocks of 16, f16 d last; value = d * scale * (q - 32)
    Q6_K = "q6_K"
    # q8_0 activations in fusec's own aligned layout: per 32-element block 8 words of int8
    # quants, the scale (f16-rounded) as f32, the quants' sum, 2 words of padding (48 bytes,
    # three 16-byte loads).  An unfused chain's `as q8_0` intermediate, or a region's vector
    # input or output declared `q8_0x[K]` (dsl/check_q8.py; host bytes: dsl/q8_0x.py)
    Q8_0X = "q8_0x"
    # a register stage computed in double precision (`in register as f64`); never a buffer's
    F64 = "f64"
    ERROR = "<error>"  # poison: a failed expression, so one mistake does not cascade

    @property
    def is_float(self) -> bool:
        return self in (DType.F32, DType.F16, DType.F64, DType.Q8_0X) or self.is_quantized

    @property
    def is_quantized(self) -> bool:
        """A GGUF block-quantized weight dtype."""
        return self in (DType.Q8_0, DType.Q4_0, DType.Q4_K, DType.Q6_K)

    @property
    def block(self) -> int:
        """Elements of one block of a block-quantized dtype: 32 (QUANT_BLOCK) for q8_0 and
        q4_0, a super-block of 256 for the K-quants."""
        return {
            DType.Q8_0: QUANT_BLOCK,
            DType.Q4_0: QUANT_BLOCK,
            DType.Q4_K: 256,
            DType.Q6_K: 256,
            DType.Q8_0X: QUANT_BLOCK,
        }[self]

    @property
    def block_bytes(self) -> int:
        """Bytes of one block (the layout llama.cpp's ggml uses)."""
        return {
            DType.Q8_0: 34,
            DType.Q4_0: 18,
            DType.Q4_K: 144,
            DType.Q6_K: 210,
            DType.Q8_0X: Q8_0X_BLOCK_BYTES,
        }[self]

    @property
    def scale_span(self) -> int:
        """Consecutive elements of a block that share one scale (a q6_K sub-block is 16)."""
        return 16 if self == DType.Q6_K else 32

    @property
    def has_int_dot(self) -> bool:
        """Weights the integer dot product path reads against q8_0 activations."""
        return self in (DType.Q8_0, DType.Q4_0, DType.Q4_K, DType.Q6_K)

    @property
    def is_int(self) -> bool:
        return self in (DType.U32, DType.I32)

    @property
    def bytes(self) -> int:
        return {DType.F32: 4, DType.F16: 2, DType.U32: 4, DType.I32: 4}[self]


# dtypes a region signature may name
BUFFER_DTYPES = {
    d.value: d
    for d in (
        DType.F32,
        DType.F16,
        DType.U32,
        DType.I32,
        DType.Q8_0,
        DType.Q4_0,
        DType.Q4_K,
        DType.Q6_K,
        DType.Q8_0X,
    )
}
# elements per GGUF q8_0 / q4_0 block: the block of a quantized activation (`as q8_0`); a
# weight's block is `DType.block`
QUANT_BLOCK = 32
# 32-bit words per block of a shared stage stored `as q8_0`: 8 of int8 quants, the scale, the
# quants' sum (codegen/glsl.py lays them out)
Q8_SHARED_WORDS = 10
# bytes of one block of DType.Q8_0X (12 words)
Q8_0X_BLOCK_BYTES = 48


class Placement(enum.Enum):
    """Where an intermediate lives in the fused kernel."""

    REGISTER = "register"  # per lane; an indexed register value is recomputed where it is used
    SHARED = "shared"  # materialized once per workgroup in shared memory (LDS)
    GLOBAL = "global"  # written to VRAM: the fused kernel is split at this stage
    # each workgroup keeps the slice of rows its subgroups computed, in shared memory; a
    # contraction over the index sums the slices of all workgroups with float atomics (split-K)
    SLICES = "slices"
    # written to a global scratch buffer, the grid spread over its rows as its own layout says;
    # the stages after it run in one workgroup, the last to finish its share (a device-scope
    # counter: one dispatch, no waiting)
    GRID = "grid"


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

REDUCERS = ("sum", "max", "min", "argmax", "argmin")
# reducers that give an index (u32) instead of a value: the first index of the largest
# (smallest) value, so ties go to the lowest index
INDEX_REDUCERS = ("argmax", "argmin", "argtopk")
# `topk(k, e: body)`: the k largest values of body over e, largest first; `argtopk` their
# indices.  Ties go to the lowest index.  A stage's whole value, indexed by rank (`t[j]`).
TOPK_REDUCERS = ("topk", "argtopk")
# the most values one topk keeps (each a round over the index)
TOPK_MAX = 16


def block_noun(dtype: str) -> str:
    """How messages name a buffer of blocks: `weight` for the GGUF dtypes, `vector` for q8_0x
    (activations in fusec's aligned layout, an input or an output; never a weight)."""
    return "vector" if dtype == DType.Q8_0X.value else "weight"
