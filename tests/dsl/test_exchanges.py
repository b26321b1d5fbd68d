"""Explicit lane exchanges (`shuffle_xor(v, m)`, `shuffle(v, k)`, `broadcast(v, k)`) in the numpy
reference, against numpy written from the README's meaning: the value at the partner lane of
the tile group (lane ^ m, or lane k), lane = sum of index * stride; a slot index stays.  The
fused kernels and the unfused chain are held to the reference on lavapipe by
tests/runtime/test_newops.py (regions tile_exchanges and slot_exchanges)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fusec.dsl.check import check
from fusec.dsl.parse import parse
from fusec.dsl.reference import run_reference

SOURCE = Path(__file__).parents[1] / "data" / "newops.fuse"


def _region(name: str) -> object:
    prog = check(parse(SOURCE.read_text(), str(SOURCE)))
    return prog.region(name)


def test_exchanges_on_a_4x4_tile() -> None:
    rng = np.random.default_rng(11)
    x = rng.standard_normal((5, 4, 4)).astype(np.float32)
    out = run_reference(_region("tile_exchanges"), {"x": x}, {"T": 5})  # type: ignore[arg-type]
    v = x.astype(np.float64)
    s, d = np.meshgrid(np.arange(4), np.arange(4), indexing="ij")
    # lane = dst + 4 * src: lane ^ 6 flips bit 1 of dst and bit 0 of src; lane 9 is (2, 1)
    w = v[:, s ^ 1, d ^ 2] - 0.5 * v[:, 2:3, 1:2] ** 2
    np.testing.assert_allclose(out["a"], w, rtol=1e-6)
    # lane 13 is (3, 1); the sum over dst of the dst ^ 1 partner times the element
    pairs = (v[:, :, [1, 0, 3, 2]] * v).sum(axis=2, keepdims=True)
    want = np.broadcast_to(w[:, 3:4, 1:2] + pairs, w.shape)
    np.testing.assert_allclose(out["b"], want, rtol=1e-6, atol=1e-6)


def test_exchanges_on_a_tile_with_slots() -> None:
    rng = np.random.default_rng(12)
    x = rng.standard_normal((3, 2, 8)).astype(np.float32)
    out = run_reference(_region("slot_exchanges"), {"x": x}, {"T": 3})  # type: ignore[arg-type]
    v = x.astype(np.float64)
    c = np.arange(8)
    # lane c, slot r: the partner lane c ^ 3 in the same slot; lane 5's register of the slot
    want = v[:, :, c ^ 3] * v.sum(axis=1, keepdims=True) + v[:, :, 5:6]
    np.testing.assert_allclose(out["y"], want, rtol=1e-6, atol=1e-6)
