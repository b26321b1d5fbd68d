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
        ties = layer.Ties()
        rounded = layer._q8_0(v, ties)
        assert ties.inputs == 1 and ties.values == v.size
        assert abs(ties.closest - _brute(v)) < 1e-9
        # half a step, and the scale stored as f16 (2^-11 of it, times up to 127)
        assert np.abs(rounded - v).max() <= np.abs(v).max() / 127 * 0.6
    # a value put on a tie: 10.5 steps of a block whose largest |value| is 4
    v = rng.uniform(-3.0, 3.0, 64).astype(np.float32)
    v[0], v[7] = 4.0, 4.0 * 10.5 / 127
    ties = layer.Ties()
    layer._q8_0(v, ties)
    assert ties.closest < 1e-5 and abs(ties.closest - _brute(v)) < 1e-9 and not ties.clean


def test_the_reference_reports_each_rounded_input_and_only_for_rounding_weights() -> None:
    p = layer.PRESETS["tiny"]
    rng = np.random.default_rng()
    for wdtype, rounded in (("q8_0", 4), ("q4_0", 4), ("f16", 0)):
        arrays = layer.random_state(p, wdtype, rng)
        weights = layer.weight_values(arrays, p, wdtype)
        ties = layer.Ties()
        pos = int(rng.integers(1, p.context))
        ref = layer.reference(p, arrays, weights, pos, wdtype, ties)
        # QKV's, the output projection's, the FFN's and the down projection's inputs
        assert ties.inputs == rounded and 0 <= ties.closest <= 0.5, (wdtype, ties)
        sizes = (p.hidden, p.n_q * p.head_dim, p.hidden, p.ffn)
        assert ties.values == (sum(sizes) if rounded else 0), (wdtype, ties)
        again = layer.reference(p, arrays, weights, pos, wdtype)
        assert all(np.array_equal(ref[k], again[k]) for k in ref)


def test_a_fresh_draw_is_judged_likely_clean_only_where_few_values_are_rounded() -> None:
    """The chance of a clean draw falls with the values rounded: the tiny layer's draws are
    worth redrawing, a qwen3-8b layer's (tens of thousands of rounded values) are not."""
    p = layer.PRESETS["tiny"]
    tiny = layer.Ties(values=p.hidden * 2 + p.n_q * p.head_dim + p.ffn)
    assert 0.5 < tiny.clean_chance < 1.0
    big = layer.PRESETS["qwen3-8b"]
    large = layer.Ties(values=big.hidden * 2 + big.n_q * big.head_dim + big.ffn)
    assert large.clean_chance < 0.05
    # measured: the share of the tiny layer's q8_0 draws that are clean, near the chance
    rng = np.random.default_rng()
    arrays = layer.random_state(p, "q8_0", rng)
    weights = layer.weight_values(arrays, p, "q8_0")
    clean = 0
    for _ in range(200):
        arrays["x"] = rng.standard_normal(p.hidden).astype(np.float32)
        ties = layer.Ties()
        layer.reference(p, arrays, weights, 3, "q8_0", ties)
        assert ties.values == tiny.values
        clean += ties.clean
    assert abs(clean / 200 - tiny.clean_chance) < 0.15, (clean, tiny.clean_chance)
