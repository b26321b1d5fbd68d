"""Weight layouts chosen at upload (`schedule ...: W packed split`): how the runtime rearranges a
GGUF weight's block bytes before a kernel reads them.

A packing is a permutation of the weight's bytes, so the packed buffer has the GGUF size and
every check of the GGUF bytes (size, non-finite scales) still applies before the repack.  The
`split` packing cuts every block into the same byte ranges (its *parts*) and stores part 0 of
every block, then part 1 of every block, and so on: the quants of block `b` at `b * q` bytes
(`q` a multiple of 16, so one 16-byte load reads 16 of them), the scales after all quants.
Part `i` of a weight of `nb` blocks starts at `nb * (sum of the sizes of parts 0 .. i-1)`.

  q4_0 (18 bytes): quants [2, 18) 16 bytes, then the f16 scales [0, 2)
  q8_0 (34 bytes): quants [2, 34) 32 bytes, then the f16 scales [0, 2)
  q6_K (210 bytes): ql and qh [0, 192), then the int8 scales [192, 208), then d [208, 210)
  q4_K (144 bytes): quants [16, 144), then d, dmin and the packed scales [0, 16)

The numpy reference and `gguf.quants` read the GGUF bytes; only the kernels (fused and unfused:
they read the same buffer) and the runtime's upload see the packed ones.

Input: a dtype, a packing and block bytes.  Output: the bytes rearranged (`pack_blocks`) or
back (`unpack_blocks`).  Not checked here: that the weight's size is whole blocks (the runtime's
input check runs first)."""

from __future__ import annotations

import enum

import numpy as np

from .types import DType


class Packing(enum.Enum):
    """A weight layout the runtime makes from the GGUF bytes at upload."""

    SPLIT = "split"  # each block's parts stored apart: all quants (16-byte aligned), then scales


# the manifest's version of a packing's byte layout: a folder written for another version is
# refused, never read with the wrong offsets
PACKING_VERSION = 1

# the parts of a block, as byte ranges of the GGUF block, in the order the packed buffer holds
# them (see the module docstring)
SPLIT_PARTS: dict[DType, tuple[tuple[int, int], ...]] = {
    DType.Q4_0: ((2, 18), (0, 2)),
    DType.Q8_0: ((2, 34), (0, 2)),
    DType.Q6_K: ((0, 192), (192, 208), (208, 210)),
    DType.Q4_K: ((16, 144), (0, 16)),
}


def parts(dtype: DType, packing: Packing) -> tuple[tuple[int, int], ...]:
    """The byte ranges of a block of `dtype`, in the order `packing` stores them."""
    match packing:
        case Packing.SPLIT:
            return SPLIT_PARTS[dtype]


def can_pack(dtype: DType) -> bool:
    """Whether a weight of `dtype` can be packed (the GGUF block dtypes)."""
    return dtype in SPLIT_PARTS


def pack_blocks(dtype: DType, packing: Packing, raw: np.ndarray) -> np.ndarray:
    """The packed bytes (uint8, flat) of GGUF block bytes `raw` (any shape, whole blocks): one
    strided copy per part, so 100 MB take about as long as a memcpy of them."""
    flat = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    blocks = flat.reshape(-1, dtype.block_bytes)
    out = np.empty(flat.size, np.uint8)
    at = 0
    for lo, hi in parts(dtype, packing):
        n = blocks.shape[0] * (hi - lo)
        out[at : at + n].reshape(blocks.shape[0], hi - lo)[...] = blocks[:, lo:hi]
        at += n
    return out


def unpack_blocks(dtype: DType, packing: Packing, packed: np.ndarray) -> np.ndarray:
    """The GGUF block bytes (uint8, flat) of packed bytes: the inverse of `pack_blocks`."""
    flat = np.ascontiguousarray(packed).reshape(-1).view(np.uint8)
    nb = flat.size // dtype.block_bytes
    blocks = np.empty((nb, dtype.block_bytes), np.uint8)
    at = 0
    for lo, hi in parts(dtype, packing):
        n = nb * (hi - lo)
        blocks[:, lo:hi] = flat[at : at + n].reshape(nb, hi - lo)
        at += n
    return blocks.reshape(-1)
