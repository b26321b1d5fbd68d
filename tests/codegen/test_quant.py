"""GGUF q8_0 / q4_0 / q4_K / q6_K weights: our kernels' dequantization against
gguf.quants.dequantize, bit for bit on the f32 values, on lavapipe."""

from __future__ import annotations

import numpy as np
import pytest

from fusec.codegen.build import build_source, write_build
from fusec.codegen.manifest import QUANT_SCALE_OFFSETS
from fusec.dsl.check import check
from fusec.dsl.parse import parse
from fusec.dsl.reference import dequantize, quantize, weight_blocks
from fusec.dsl.types import DType
from fusec.runtime.device import Device, RuntimeFailure
from fusec.runtime.dispatch import Build, RegionRunner
from fusec.runtime.verify import check_region

pytestmark = [pytest.mark.shaderc, pytest.mark.vulkan]

DTYPES = [DType.Q8_0, DType.Q4_0, DType.Q4_K, DType.Q6_K]
K_QUANTS = [DType.Q4_K, DType.Q6_K]
WIDTHS = [4, 8, 16, 32]  # elements per lane per contraction step (every wide-load shape)

# 1-D flat view: y[i] = W[i] for a weight of whole blocks (one element at a time), and row
# maxima and minima through a contraction with 8 elements per lane (the 8-quant block path):
# max and min round nothing, so both must equal gguf's values exactly.
FLAT = """
region deq_{t}(W: {t}[K]) -> y: f32[K]
    const K = 8192 in 32 .. 1048576
    launch workgroup 256
    y[i] = W[i]

region rowmax_{t}(W: {t}[N, K]) -> (hi: f32[N], lo: f32[N])
    const K = 4096 in 32 .. 65536, N = 64
    launch workgroup 256, subgroup any, rows_per_subgroup 2
    hi[n] = max(k: W[n, k])                      layout n -> subgroup, k -> lane x 8
    lo[n] = min(k: W[n, k])                      layout n -> subgroup, k -> lane x 8
"""
# Every element through a contraction's wide loads: row (n, j) sums W[n, k] times 1 at k = j
# and 0 elsewhere, so y[n, j] = W[n, j] exactly (the zero products add nothing, whatever the
# order), for each step width a lane may load.
PICK = """
region pick_{t}_x{v}(W: {t}[N, K]) -> y: f32[N, K]
    const K = 512 in 32 .. 4096, N = 3
    launch workgroup 64, subgroup any, rows_per_subgroup 2
    y[n, j] = sum(k: W[n, k] * select(k == j, 1.0, 0.0))    layout j -> subgroup, k -> lane x {v}
"""

# A K-quant weight meeting an activation rounded to q8_0 blocks, in the shape whose q4_0 form
# takes integer dot products: K-quants have no integer path, so both are dequantized to f32.
Q8_ACTS = """
region acts_{t}(x: f32[K], W: {t}[N, K]) -> y: f32[N]
    const K = 768 in 256 .. 4096, N = 33
    launch workgroup 64, subgroup any, rows_per_subgroup 1
    xq[k] = x[k]                                 in shared as q8_0
    y[n]  = sum(k: W[n, k] * xq[k])              layout n -> subgroup, k -> lane x 32
"""


def _source() -> str:
    text = "".join(FLAT.format(t=d.value) for d in DTYPES)
    text += "".join(PICK.format(t=d.value, v=v) for d in DTYPES for v in WIDTHS)
    return text + "".join(Q8_ACTS.format(t=d.value) for d in K_QUANTS)


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Build:
    text = _source()
    out = tmp_path_factory.mktemp("q") / "b"
    write_build(build_source(text, "quant.fuse"), out)
    return Build.load(out)


def _random_blocks(rng: np.random.Generator, dtype: DType, blocks: int) -> np.ndarray:
    """Arbitrary block bytes: every quant value and every sub-block scale (and min) value, and
    finite f16 super-block scales of both signs."""
    raw = rng.integers(0, 256, size=(blocks, dtype.block_bytes), dtype=np.uint8)
    for at in QUANT_SCALE_OFFSETS[dtype.value]:
        scales = (rng.standard_normal(blocks) * 0.05).astype(np.float16)
        raw[:, at : at + 2] = scales.view(np.uint8).reshape(blocks, 2)
    return raw.reshape(-1)


def _k_quant_fields(blocks: np.ndarray, dtype: DType) -> dict[str, np.ndarray]:
    """The fields of K-quant blocks, decoded here from the bytes (llama.cpp ggml-common.h
    block_q4_K, block_q6_K), to show that test data reaches every path of the kernels'
    dequantization."""
    b = blocks.reshape(-1, dtype.block_bytes)
    if dtype == DType.Q4_K:
        s = b[:, 4:16].astype(np.int64)
        return {
            # sub-blocks 4..7 take their scale's and min's top 2 bits from bytes 0..7
            "scale_hi": np.concatenate([s[:, 0:4] >> 6, s[:, 4:8] >> 6], axis=1),
            "scale_lo": s[:, 0:8] & 63,
            "nibbles": np.stack([b[:, 16:] & 15, b[:, 16:] >> 4], axis=1),
        }
    return {
        "ql": np.stack([b[:, :128] & 15, b[:, :128] >> 4], axis=1),
        # the 4 two-bit positions of each qh byte
        "qh": np.stack([(b[:, 128:192] >> (2 * i)) & 3 for i in range(4)], axis=1),
        "scales": b[:, 192:208].view(np.int8),
    }


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("source", ["arbitrary", "quantized"])
def test_dequantization_is_bit_exact(dev: Device, build: Build, dtype: DType, source: str) -> None:
    rng = np.random.default_rng()
    k = dtype.block * (257 if dtype.block == 32 else 33)
    if source == "arbitrary":
        blocks = _random_blocks(rng, dtype, k // dtype.block)
    else:
        # gguf quantizes q8_0 / q4_0; K-quants get random blocks sized like the values
        blocks = weight_blocks(rng.standard_normal(k).astype(np.float32) * 3.0, dtype, rng)
    runner = RegionRunner(dev, build, f"deq_{dtype.value}", {"K": k})
    try:
        got = runner.run({"W": blocks}).outputs["y"]
    finally:
        runner.close()
    want = dequantize(blocks, dtype).reshape(-1)
    assert got.dtype == np.float32 and want.dtype == np.float32
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_k_quant_test_data_reaches_every_path() -> None:
    """The random blocks of the tests above and below cover each packing case: q4_K's 8
    sub-blocks with scales and mins past 15 (j >= 4 takes 2 bits from another byte) and both
    nibbles; q6_K's low and high ql nibbles, all four 2-bit qh positions with every value, and
    scales of both signs."""
    rng = np.random.default_rng()
    q4 = _k_quant_fields(_random_blocks(rng, DType.Q4_K, 33), DType.Q4_K)
    assert np.all(q4["scale_hi"].max(axis=0) == 3) and np.all(q4["scale_hi"].min(axis=0) == 0)
    assert np.all(q4["scale_lo"].max(axis=0) > 32)
    assert (
        set(np.unique(q4["nibbles"][:, 0])) == set(np.unique(q4["nibbles"][:, 1])) == set(range(16))
    )
    q6 = _k_quant_fields(_random_blocks(rng, DType.Q6_K, 33), DType.Q6_K)
    for half in (0, 1):
        assert set(np.unique(q6["ql"][:, half])) == set(range(16))
    for pos in range(4):
        assert set(np.unique(q6["qh"][:, pos])) == {0, 1, 2, 3}
    assert q6["scales"].min() < 0 < q6["scales"].max()


def test_k_quant_reference_tells_sub_blocks_apart() -> None:
    """gguf's values of a block change when one sub-block's scale byte changes, in exactly
    that sub-block: the bit-exact comparisons above would see a kernel reading the wrong one."""
    rng = np.random.default_rng()
    for dtype, first, count, span in ((DType.Q4_K, 4, 4, 32), (DType.Q6_K, 192, 16, 16)):
        blocks = _random_blocks(rng, dtype, 1).reshape(1, -1)
        base = dequantize(blocks, dtype).reshape(-1)
        for i in range(count):
            changed = blocks.copy()
            changed[0, first + i] ^= 0x01  # the lowest bit of sub-block i's scale
            moved = np.flatnonzero(dequantize(changed, dtype).reshape(-1) != base)
            assert moved.size and set(moved // span) == {i}, (dtype, i)


@pytest.mark.parametrize("dtype", DTYPES)
def test_block_path_of_contractions_is_bit_exact(dev: Device, build: Build, dtype: DType) -> None:
    rng = np.random.default_rng()
    n, k = 64, dtype.block * (40 if dtype.block == 32 else 5)
    blocks = _random_blocks(rng, dtype, n * k // dtype.block).reshape(n, -1)
    runner = RegionRunner(dev, build, f"rowmax_{dtype.value}", {"K": k, "N": n})
    try:
        out = runner.run({"W": blocks}).outputs
    finally:
        runner.close()
    values = dequantize(blocks, dtype).reshape(n, k)
    assert np.array_equal(out["hi"].view(np.uint32), values.max(axis=1).view(np.uint32))
    assert np.array_equal(out["lo"].view(np.uint32), values.min(axis=1).view(np.uint32))


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_element_of_a_wide_contraction_step(
    dev: Device, build: Build, dtype: DType, width: int
) -> None:
    """Each element read by a contraction's wide loads (4 to 32 per lane and step: one scale
    per step, or two for a q6_K step of 32) equals gguf's value."""
    rng = np.random.default_rng()
    n, k = 3, 512
    blocks = _random_blocks(rng, dtype, n * k // dtype.block).reshape(n, -1)
    runner = RegionRunner(dev, build, f"pick_{dtype.value}_x{width}", {"K": k, "N": n})
    try:
        got = runner.run({"W": blocks}).outputs["y"]
    finally:
        runner.close()
    want = dequantize(blocks, dtype).reshape(n, k)
    # == on floats: a zero product may turn a weight of -0.0 into +0.0
    assert np.array_equal(got, want)
    assert np.count_nonzero(want) > n * k // 2


def test_q4_K_steps_of_32_read_whole_sub_blocks(build: Build) -> None:
    """A q4_K contraction with 32 elements per lane and step reads each sub-block with three
    16-byte loads (`sub32_`), not 8-quant pieces: the test above checks its every element on
    this path, the one kernels.fuse's q4_K regions take."""
    for product in ("pick_q4_K_x32", "pick_q4_K_x8"):
        glsl = (build.path / "glsl" / f"{product}.comp").read_text()
        main = glsl[glsl.index("void main()") :]
        wide = product.endswith("x32")
        assert ("sub32_W(" in main) == wide, product
        assert ("quant8_W(" in main) != wide, product
        assert ("b_W_u4[" in glsl) == wide, product


@pytest.mark.parametrize("dtype", DTYPES)
def test_wrong_weight_bytes_are_refused_before_dispatch(
    dev: Device, build: Build, dtype: DType
) -> None:
    runner = RegionRunner(dev, build, f"deq_{dtype.value}", {"K": 2 * dtype.block})
    try:
        for wrong in (-1, 1, -dtype.block_bytes):
            bad = np.full(2 * dtype.block_bytes + wrong, 0x3C, np.uint8)
            with pytest.raises(RuntimeFailure) as e:
                runner.run({"W": bad})
            want, got = 2 * dtype.block_bytes, bad.size
            (diag,) = e.value.diagnostics  # one diagnostic: one sentence and its hint
            assert diag.message == (
                f"{dtype.value} weight 'W' must be uint8 blocks of shape ({want},) "
                f"({want} bytes), not uint8 of shape ({got},) ({got} bytes)"
            )
        with pytest.raises(RuntimeFailure, match="not float32"):
            runner.run({"W": np.zeros(2 * dtype.block, np.float32)})
        # the right size runs
        good = _random_blocks(np.random.default_rng(), dtype, 2)
        assert runner.run({"W": good}).outputs["y"].shape == (2 * dtype.block,)
    finally:
        runner.close()


@pytest.mark.parametrize("dtype", K_QUANTS)
def test_non_finite_super_block_scales_are_refused(dev: Device, build: Build, dtype: DType) -> None:
    """Each f16 super-block scale of a K-quant block (q4_K's d and dmin, q6_K's d at the
    block's end) is checked for NaN and infinity before dispatch."""
    runner = RegionRunner(dev, build, f"deq_{dtype.value}", {"K": 2 * dtype.block})
    try:
        for at in QUANT_SCALE_OFFSETS[dtype.value]:
            blocks = _random_blocks(np.random.default_rng(), dtype, 2)
            blocks[dtype.block_bytes + at : dtype.block_bytes + at + 2] = np.array(
                [np.inf], np.float16
            ).view(np.uint8)
            with pytest.raises(RuntimeFailure, match="holds 1 non-finite block scale "):
                runner.run({"W": blocks})
    finally:
        runner.close()


@pytest.mark.parametrize(("dtype", "k", "block"), [("q4_0", 48, 32), ("q4_K", 544, 256)])
def test_a_block_multiple_is_required_at_run_time(
    dev: Device, build: Build, dtype: str, k: int, block: int
) -> None:
    with pytest.raises(RuntimeFailure) as e:
        RegionRunner(dev, build, f"deq_{dtype}", {"K": k})
    assert e.value.diagnostics[0].message.endswith(
        f"rows of {k} elements, not a multiple of {block}"
    )


def test_gguf_quantizes_what_it_can() -> None:
    """weight_blocks uses gguf's quantization where the installed gguf has one (q8_0, q4_0),
    and random valid blocks of the values' magnitude where it has none (K-quants in gguf
    0.19)."""
    rng = np.random.default_rng()
    values = rng.standard_normal((4, 512)).astype(np.float32)
    q4 = weight_blocks(values, DType.Q4_0, rng)
    assert np.array_equal(q4, quantize(values, DType.Q4_0))
    for dtype in K_QUANTS:
        blocks = weight_blocks(values, dtype, rng)
        assert blocks.shape == (4, 2 * dtype.block_bytes) and blocks.dtype == np.uint8
        got = dequantize(blocks, dtype).reshape(values.shape)
        assert np.all(np.isfinite(got)) and np.count_nonzero(got) > got.size // 2
        top = np.abs(values.reshape(-1, dtype.block)).max(axis=1)
        assert np.all(np.abs(got.reshape(-1, dtype.block)).max(axis=1) <= top)


@pytest.mark.parametrize("dtype", K_QUANTS)
def test_k_quants_meet_q8_0_activations(dev: Device, build: Build, dtype: DType) -> None:
    """Fused and unfused (the activation a q8_0x intermediate) against the reference, which
    rounds xq to q8_0 the same way.  Both take integer dot products (q4_K: scale x the
    sub-block's dot product - min x the activation block's quant sum; q6_K: per half of 16,
    scale x (dot product - 32 x the half's quant sum)); only the final f32 steps round, so the
    result stays near f32 accuracy."""
    name = f"acts_{dtype.value}"
    region = check(parse(_source(), "quant.fuse")).region(name)
    k, n = int(np.random.default_rng().choice([256, 512, 768, 1280])), 33
    rep = check_region(dev, build, region, {"K": k, "N": n})
    assert rep.path == "fused" and [o.name for o in rep.outputs] == ["y"]
    for o in rep.outputs:
        assert o.fused_error <= 1e-5 and o.unfused_error <= 1e-5, o
    products = build.region(name)
    contractions = [products.fused[-1], products.unfused[-1]]
    assert all("integer_dot_product" in c.features for c in contractions)
