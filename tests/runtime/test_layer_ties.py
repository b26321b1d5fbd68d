"""fusec.runtime.decode_layer's q8_0 rounding ties: how close a rounded input comes to a tie,
the roundings near one taken the other way, and `Answers`, the layer's right answers, of which
a device's outputs are checked against the nearest (examples/decode_layer/run.py, fusec bench)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

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
    assert ties.closest < 1e-5 and abs(ties.closest - _brute(v)) < 1e-9
    assert (0, 7) in {(i, k) for _, i, k in ties.near}


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


def _tied_blocks(seed: int, blocks: int) -> np.ndarray:
    """Random blocks (standard normal, f32, each block at a scale of its own), each with a
    largest value and a value within 1e-4 steps of the tie 10.5; the odd blocks' scales on an
    f16 tie."""
    rng = np.random.default_rng(seed)
    v = rng.standard_normal((blocks, 32)) * rng.uniform(0.01, 100.0, (blocks, 1))
    big = np.abs(v).max(axis=1) * 1.25
    # the odd blocks' scale (largest / 127) put on the midpoint of two f16 neighbours
    low = (big / 127).astype(np.float16)
    mid = (low.astype(np.float64) + np.nextafter(low, np.float16(np.inf)).astype(np.float64)) / 2
    big[1::2] = (mid * 127)[1::2]
    v[:, 0] = big
    v[:, 5] = big * (10.5 + rng.uniform(-1e-4, 1e-4, blocks)) / 127
    return v.astype(np.float32).reshape(-1)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 6), st.data())
def test_a_rounding_taken_the_other_way_moves_one_step_or_one_f16_neighbour(
    seed: int, blocks: int, data: st.DataObject
) -> None:
    v = _tied_blocks(seed, blocks)
    ties = layer.Ties()
    plain = layer._q8_0(v, ties)
    assert ties.near, "each block has a value 1e-4 steps or less from a tie"
    assert all(0 <= c < 1 for c, _, _ in ties.near)
    keys = {k for _, _, k in ties.near}
    assert {32 * b + 5 for b in range(blocks)} <= keys
    assert {-1 - b for b in range(1, blocks, 2)} <= keys
    chosen = data.draw(st.sets(st.sampled_from(sorted(keys)), min_size=1))
    flipped = layer._q8_0(v, layer.Ties(flip=frozenset((0, k) for k in chosen)))
    scales = np.abs(v.reshape(-1, 32)).max(axis=1) / 127
    for b in range(blocks):
        d16 = float(np.float16(np.float32(scales[b])))
        was, now = plain[32 * b : 32 * b + 32], flipped[32 * b : 32 * b + 32]
        quants = np.round(was / d16)
        if -1 - b in chosen:  # the block's values times the scale's other f16 neighbour
            d32 = np.float32(scales[b])
            toward = np.float16(np.inf if d32 > d16 else -np.inf)
            step = float(np.nextafter(np.float16(d16), toward))
            assert now[0] == np.float32(quants[0] * step)
        else:
            step = d16
        moved = np.round(now / step) - quants
        for j in range(32):
            want = 0.0
            if 32 * b + j in chosen:  # one step toward the value's other neighbour
                want = 1.0 if v[32 * b + j] / scales[b] > quants[j] else -1.0
            assert moved[j] == want, (b, j, moved[j], want)
    # a key that is not near a tie, or another input's, changes nothing
    far = next(k for k in range(32 * blocks) if k not in keys)
    assert np.array_equal(layer._q8_0(v, layer.Ties(flip=frozenset({(0, far), (1, 5)}))), plain)


def test_answers_find_the_right_answer_a_device_took() -> None:
    """A device's outputs equal to one of the layer's right answers (numpy's with roundings
    near a tie taken the other way) are matched to that answer, not judged off numpy's."""
    p = layer.PRESETS["tiny"]
    rng = np.random.default_rng()
    found = 0
    for _ in range(40):
        arrays = layer.random_state(p, "q4_0", rng)
        weights = layer.weight_values(arrays, p, "q4_0")
        pos = int(rng.integers(1, p.context))
        answers = layer.Answers(p, arrays, weights, pos, "q4_0")
        same = answers.nearest(answers.numpy, 0.0)
        assert same.flipped == 0 and max(same.errors.values()) == 0.0
        if len(answers) == 1:
            continue
        k = int(rng.integers(1, len(answers)))
        flip, other = answers._answer(k)
        got = {n: a.astype(np.float32) for n, a in other.items()}  # as a device holds it
        answer = answers.nearest(got, 1e-6)
        off = {n: float(np.abs(other[n] - answers.numpy[n]).max()) for n in other}
        assert answer.flipped >= 1 and max(answer.errors.values()) <= 1e-6, (flip, answer)
        found += max(off.values()) > 0
        # a wrong result (out off by a tenth of its largest value) is judged off numpy's
        # without trying every combination of flips
        fresh = layer.Answers(p, arrays, weights, pos, "q4_0")
        wrong = dict(got, out=got["out"] + 0.1 * np.abs(got["out"]).max())
        judged = fresh.nearest(wrong, 1e-6)
        assert judged.errors["out"] > 0.05 and len(fresh._made) <= 1 + layer.TIE_NEAREST
    assert found >= 5, "answers that differ from numpy's were made and matched"
