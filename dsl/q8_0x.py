"""q8_0 activations in fusec's aligned block layout (`DType.Q8_0X`) as host bytes.

A block of 32 elements is 12 little-endian 32-bit words (48 bytes): words 0..7 the 32 int8
quants in element order, word 8 the scale as an f32 holding an f16 value (the q8_0 scale gguf
stores), word 9 the sum of the 32 quants (int32), words 10..11 padding (left as they are: a
kernel does not write them, the reference writes zeros).  The values are those of the GGUF
q8_0 block with the same scale and quants, so the numpy reference reads them with gguf's
dequantization: `to_gguf` rebuilds the GGUF block (f16 scale, 32 int8) exactly.

Input: float values or aligned block bytes.  Output: aligned block bytes or float32 values.
Not done here: the kernels' rounding (codegen/glsl_quant.py), which these helpers reproduce
through `gguf.quants` and tests compare bit for bit.
"""

from __future__ import annotations

import numpy as np

from .types import Q8_0X_BLOCK_BYTES, QUANT_BLOCK

_GGUF_Q8_0_BYTES = 34  # f16 scale, 32 x int8


def quantize_q8_0x(values: np.ndarray) -> np.ndarray:
    """Float values (one vector) -> aligned block bytes (uint8, 48 per block of 32), rounded
    as gguf quantizes q8_0 (a block whose scale max / 127 reaches 65520 gets an infinite f16
    scale, its quants those of the f32 scale); a last partial block is padded with zeros."""
    from .reference import quantize
    from .types import DType

    v = np.asarray(values, np.float32).reshape(-1)
    padded = np.zeros(-(-v.size // QUANT_BLOCK) * QUANT_BLOCK, np.float32)
    padded[: v.size] = v
    with np.errstate(over="ignore"):  # a scale past f16's range is infinite, as in gguf
        return from_gguf(quantize(padded, DType.Q8_0))


def from_gguf(blocks: np.ndarray) -> np.ndarray:
    """GGUF q8_0 block bytes -> the aligned layout's bytes."""
    raw = np.asarray(blocks, np.uint8).reshape(-1, _GGUF_Q8_0_BYTES)
    n = raw.shape[0]
    out = np.zeros((n, Q8_0X_BLOCK_BYTES), np.uint8)
    out[:, 0:32] = raw[:, 2:34]
    scale = np.ascontiguousarray(raw[:, 0:2]).view(np.float16).astype(np.float32)
    out[:, 32:36] = scale.view(np.uint8).reshape(n, 4)
    sums = raw[:, 2:34].view(np.int8).astype(np.int32).sum(axis=1, dtype=np.int32)
    out[:, 36:40] = sums.reshape(n, 1).view(np.uint8)
    return out.reshape(-1)


def to_gguf(data: np.ndarray) -> np.ndarray:
    """Aligned block bytes -> GGUF q8_0 block bytes (the scale back to f16, exactly: a kernel
    stores an f16 value as f32)."""
    raw = np.asarray(data, np.uint8).reshape(-1, Q8_0X_BLOCK_BYTES)
    n = raw.shape[0]
    out = np.zeros((n, _GGUF_Q8_0_BYTES), np.uint8)
    with np.errstate(over="ignore"):  # a scale that is no f16 value becomes infinite
        scale = np.ascontiguousarray(raw[:, 32:36]).view(np.float32).astype(np.float16)
    out[:, 0:2] = scale.view(np.uint8).reshape(n, 2)
    out[:, 2:34] = raw[:, 0:32]
    return out.reshape(-1)


def q8_0x_values(data: np.ndarray, n: int) -> np.ndarray:
    """Aligned block bytes -> the first `n` float32 values, dequantized by gguf.  A block whose
    scale overflowed f16 (|values| past 65504 * 127: the scale is infinite, the quants 0) gives
    infinity times 0, NaN, as gguf computes it, without numpy's warning."""
    from .reference import dequantize
    from .types import DType

    with np.errstate(invalid="ignore"):
        return np.asarray(dequantize(to_gguf(data), DType.Q8_0)).reshape(-1)[:n]


def q8_0x_overflowed(data: np.ndarray, n: int) -> np.ndarray:
    """Per element of the first `n`: whether its block's scale is infinite (the block's values
    overflowed the f16 scale when they were rounded).  A scale that is NaN (a poisoned block
    no kernel wrote) is not an overflow."""
    words = np.asarray(data, np.uint8).reshape(-1, Q8_0X_BLOCK_BYTES)[:, 32:36]
    scales = np.ascontiguousarray(words).view(np.float32).reshape(-1)
    return np.repeat(np.isinf(scales), QUANT_BLOCK)[:n]


def q8_0x_words(data: np.ndarray) -> np.ndarray:
    """The words a kernel writes, per block: quants (0..7), scale (8) and quant sum (9), as
    uint32 (what a bit-exact comparison compares; the padding words are left out)."""
    words = np.asarray(data, np.uint8).reshape(-1, Q8_0X_BLOCK_BYTES).view(np.uint32)
    return np.ascontiguousarray(words[:, :10])
