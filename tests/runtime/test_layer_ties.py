"""fusec.runtime.decode_layer's q8_0 rounding ties: how close a rounded input comes to a tie,
and the references' report of it (a test input that close to a tie has two right answers, and
examples/decode_layer/run.py draws it again)."""

from __future__ import annotations

import numpy as np

from fusec.runtime import decode_layer as layer


def _brute(v: np.ndarray) -> float:
    out = 0.5
    for block in v.astype(np.float64).reshape(-1, 32):
        d = np.abs(block).max() / 127.0
        if d > 0:
            steps = block / d
            out = min(out, float(np.abs(steps - np.floor(steps) - 0.5).min()))
    return out


def test_the_distance_to_a_tie_is_that_of_each_value_in_its_blocks_steps() -> None:
    rng = np.random.default_rng()
    for _ in range(20):
        v = (rng.standard_normal(32 * int(rng.integers(1, 9))) * rng.uniform(0.1, 10)).astype(
            np.float32
        )
        ties: list[float] = []
        rounded = layer._q8_0(v, ties)
        assert len(ties) == 1 and abs(ties[0] - _brute(v)) < 1e-9
        # half a step, and the scale stored as f16 (2^-11 of it, times up to 127)
        assert np.abs(rounded - v).max() <= np.abs(v).max() / 127 * 0.6
    # a value put on a tie: 10.5 steps of a block whose largest |value| is 4
    v = rng.uniform(-3.0, 3.0, 64).astype(np.float32)
    v[0], v[7] = 4.0, 4.0 * 10.5 / 127
    ties = []
    layer._q8_0(v, ties)
    assert ties[0] < 1e-5 and abs(ties[0] - _brute(v)) < 1e-9


def test_the_reference_reports_each_rounded_input_and_only_for_rounding_weights() -> None:
    p = layer.PRESETS["tiny"]
    rng = np.random.default_rng()
    for wdtype, rounded in (("q8_0", 4), ("q4_0", 4), ("f16", 0)):
        arrays = layer.random_state(p, wdtype, rng)
        weights = layer.weight_values(arrays, p, wdtype)
        ties: list[float] = []
        pos = int(rng.integers(1, p.context))
        ref = layer.reference(p, arrays, weights, pos, wdtype, ties)
        # QKV's, the output projection's, the FFN's and the down projection's inputs
        assert len(ties) == rounded and all(0 <= t <= 0.5 for t in ties), (wdtype, ties)
        again = layer.reference(p, arrays, weights, pos, wdtype)
        assert all(np.array_equal(ref[k], again[k]) for k in ref)
