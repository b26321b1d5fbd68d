"""dsl/packing.py: the packed layout of GGUF weights.  Packing then unpacking gives the GGUF
bytes back, and the packed bytes read by the layout's own rule (quants at b x q bytes, scales
after all quants) give the values gguf.quants.dequantize gives the GGUF bytes."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fusec.dsl.packing import Packing, pack_blocks, parts, unpack_blocks
from fusec.dsl.reference import dequantize, weight_blocks
from fusec.dsl.types import DType

PACKED = (DType.Q4_0, DType.Q8_0, DType.Q6_K, DType.Q4_K)


def _weights(dtype: DType, n: int, k_blocks: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    values = rng.uniform(-2.0, 2.0, (n, k_blocks * dtype.block)).astype(np.float32)
    return values, weight_blocks(values, dtype, rng)


def _read_split(dtype: DType, packed: np.ndarray, nb: int) -> np.ndarray:
    """Values of packed q4_0 / q8_0 bytes, by the layout's rule (not through unpack_blocks):
    quants of block b at q b, its f16 scale at q nb + 2 b."""
    q = {DType.Q4_0: 16, DType.Q8_0: 32}[dtype]
    quants = packed[: q * nb].reshape(nb, q)
    scales = packed[q * nb : q * nb + 2 * nb].view(np.float16).astype(np.float32)
    if dtype == DType.Q4_0:
        lo, hi = (quants & 15).astype(np.int32) - 8, (quants >> 4).astype(np.int32) - 8
        ints = np.concatenate([lo, hi], axis=1)
    else:
        ints = quants.view(np.int8).astype(np.int32)
    return (ints.astype(np.float32) * scales[:, None]).reshape(-1)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    st.sampled_from(PACKED),
    st.integers(1, 7),
    st.integers(1, 5),
    st.integers(0, 2**31),
)
def test_packing_round_trips_and_keeps_the_values(
    dtype: DType, n: int, k_blocks: int, seed: int
) -> None:
    _, raw = _weights(dtype, n, k_blocks, seed)
    packed = pack_blocks(dtype, Packing.SPLIT, raw)
    assert packed.nbytes == raw.nbytes  # a permutation: the GGUF size checks still hold
    if n * k_blocks > 1:
        assert not np.array_equal(packed, raw.reshape(-1))  # it did move bytes
    back = unpack_blocks(dtype, Packing.SPLIT, packed)
    assert np.array_equal(back, raw.reshape(-1))
    want = dequantize(raw, dtype).reshape(-1)
    got = dequantize(back.reshape(raw.shape), dtype).reshape(-1)
    assert np.array_equal(got, want)
    nb = n * k_blocks
    if dtype in (DType.Q4_0, DType.Q8_0):
        assert np.array_equal(_read_split(dtype, packed, nb), want)
    # every part starts 16-byte aligned after whole blocks of the parts before it
    sizes = [hi - lo for lo, hi in parts(dtype, Packing.SPLIT)]
    assert sizes[0] % 16 == 0 and sum(sizes) == dtype.block_bytes


def test_quants_come_first_aligned() -> None:
    """Block b's quants are bytes [16 b, 16 b + 16) of a packed q4_0 weight, its scale the two
    bytes at 16 nb + 2 b."""
    _, raw = _weights(DType.Q4_0, 3, 2, 7)
    blocks = raw.reshape(-1, 18)
    packed = pack_blocks(DType.Q4_0, Packing.SPLIT, raw)
    nb = blocks.shape[0]
    for b in range(nb):
        assert np.array_equal(packed[16 * b : 16 * b + 16], blocks[b, 2:])
        assert np.array_equal(packed[16 * nb + 2 * b : 16 * nb + 2 * b + 2], blocks[b, :2])


def test_packing_is_fast_for_large_weights() -> None:
    """A 6144 x 4096 q4_0 weight (14 MB): one strided copy per part, well under a second."""
    import time

    raw = np.random.default_rng(1).integers(0, 255, 6144 * 4096 // 32 * 18, np.uint8)
    start = time.perf_counter()
    packed = pack_blocks(DType.Q4_0, Packing.SPLIT, raw)
    took = time.perf_counter() - start
    assert packed[:16].tobytes() == raw[2:18].tobytes()
    assert took < 1.0, took
