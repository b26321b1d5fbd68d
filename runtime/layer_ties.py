"""The decode layer's q8_0 rounding ties (runtime/decode_layer.py): how close the values a
reference rounds come to a tie, the roundings near one taken the other way, and a right answer
of the layer with a device's errors against it.  `decode_layer.Answers` makes the answers."""

from __future__ import annotations

import attrs
import numpy as np

from fusec.dsl.reference import dequantize, quantize
from fusec.dsl.types import DType

# q8_0 (gguf's quantization) rounds each value v of a block to q = round(v / d), d = the
# block's largest |v| / 127 in f32, and stores d rounded to f16.  Two correct f32
# implementations, the GPU and numpy, can round either way where v / d lies near a tie
# (k + 1/2) or d near an f16 tie: the GPU sums in another order, and its exp (silu, softmax)
# may be 3 + 2|x| ulp off (GLSL 4.60 specification, 4.7.1 "Range and Precision").  The layer
# then has more than one right answer.  Measured on lavapipe (tiny layer, q4_0 weights, 900
# tokens, no redraw): 8 tokens left numpy's answer by 2e-5 to 3.2e-3 in `out` (tolerance
# 5e-3; a CI run saw 5.1e-3); each was numpy's answer with one value rounded the other way
# (9e-7 steps from its tie) or one block's scale the other f16 neighbour (1.2e-4 and 6.1e-4
# f16 ulps from its tie), to 1e-7.  `Answers` tries the TIE_NEAREST roundings nearest a tie
# the other way too, those within the reach of a relative error TIE_REL of the device's f32
# values: 127 * 2 TIE_REL steps for a value (v and d each off), 2^11 TIE_REL f16 ulps for a
# scale.
TIE_REL = 4e-6
VALUE_MARGIN, SCALE_MARGIN = 254 * TIE_REL, 2048 * TIE_REL
# the roundings tried both ways: 2^TIE_NEAREST answers at most (the tiny layer, 1280 values
# in 40 blocks, has about 3 near a tie)
TIE_NEAREST = 8


@attrs.define
class Ties:
    """What a reference's q8_0 roundings came to: the closest any rounded value came to a tie
    (in steps of its block's scale, 0.5 at most), how many values and inputs it rounded, and
    `near`: (closeness, input, key) of each rounding near a tie (closeness: its distance over
    its margin, below 1; input: the ordinal of the rounded input in the reference; key: a
    value's index k, or -1 - b for block b's scale).  `flip`: the (input, key) rounded the other
    way where they still lie near their tie (an earlier flip moves later values)."""

    closest: float = 0.5
    values: int = 0
    inputs: int = 0
    near: list[tuple[float, int, int]] = attrs.Factory(list)
    flip: frozenset[tuple[int, int]] = frozenset()

    def round(self, f32: np.ndarray, rounded: np.ndarray) -> np.ndarray:
        """Record `f32`, which gguf rounded to `rounded` (f32); return it with the roundings of
        `flip` for this input taken the other way: a value one step of its block's scale
        toward its other neighbour, a block's values times the scale's other f16 neighbour."""
        blocks = f32.astype(np.float64).reshape(-1, 32)
        amax = np.abs(blocks).max(axis=1, keepdims=True)
        steps = np.divide(blocks * 127.0, amax, out=np.zeros_like(blocks), where=amax > 0)
        dist = np.abs(steps - np.floor(steps) - 0.5).reshape(-1)
        # the scale as gguf computes it (f32) and stores it (f16), and its other f16 neighbour
        d32 = (np.abs(f32.reshape(-1, 32)).max(axis=1) / np.float32(127)).astype(np.float32)
        with np.errstate(over="ignore"):
            d16 = d32.astype(np.float16)
            toward = np.nextafter(d16, np.where(d32 > d16, np.inf, -np.inf).astype(np.float16))
        finite = np.isfinite(toward) & np.isfinite(d16) & (d32 != d16)
        spacing = np.abs(toward.astype(np.float64) - d16.astype(np.float64))
        frac = np.divide(
            np.abs(d32.astype(np.float64) - d16.astype(np.float64)),
            spacing,
            out=np.zeros_like(spacing),
            where=finite,
        )
        scale_dist = np.where(finite, 0.5 - frac, 0.5)
        ordinal = self.inputs
        self.closest = min(self.closest, float(dist.min(initial=0.5)))
        self.values += f32.size
        self.inputs += 1
        usable = np.repeat(np.isfinite(d16) & (d16 != 0), 32)  # a scale a value can step by
        near_values = np.flatnonzero((dist < VALUE_MARGIN) & usable)
        near_scales = np.flatnonzero(scale_dist < SCALE_MARGIN)
        self.near += [(float(dist[k]) / VALUE_MARGIN, ordinal, int(k)) for k in near_values]
        self.near += [
            (float(scale_dist[b]) / SCALE_MARGIN, ordinal, -1 - int(b)) for b in near_scales
        ]
        near = {int(k) for k in near_values} | {-1 - int(b) for b in near_scales}
        flips = {k for (i, k) in self.flip if i == ordinal} & near
        if not flips:
            return rounded
        out = rounded.reshape(-1, 32).copy()
        for b in sorted({-1 - k if k < 0 else k // 32 for k in flips}):
            d = float(d16[b])  # finite and not 0 (`usable`, `finite`)
            quants = np.round(out[b].astype(np.float64) / d)
            for j in range(32):
                if 32 * b + j in flips:
                    quants[j] += 1.0 if steps[b, j] > quants[j] else -1.0
            scale = float(toward[b]) if -1 - b in flips else d
            out[b] = (quants * scale).astype(np.float32)
        return out.reshape(rounded.shape)


def _q8_0(v: np.ndarray, ties: Ties | None = None) -> np.ndarray:
    """`v` rounded to q8_0 blocks (as f32, then gguf's quantization), back in float64; `ties`
    records how close it came to rounding ties and rounds its `flip` the other way."""
    f32 = np.ascontiguousarray(v, np.float32)
    rounded = dequantize(quantize(f32, DType.Q8_0), DType.Q8_0).reshape(f32.shape)
    if ties is not None:
        rounded = ties.round(f32, rounded)
    return np.asarray(rounded, np.float64)


@attrs.frozen
class Answer:
    """A right answer of the layer (`ref`: out, kc, vt), a device's `errors` against it, and
    how many q8_0 values near a tie it rounds the other way than numpy (`flipped`)."""

    ref: dict[str, np.ndarray]
    errors: dict[str, float]
    flipped: int
