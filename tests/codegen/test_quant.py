"""GGUF q8_0 / q4_0 weights: our kernels' dequantization against gguf.quants.dequantize, bit for
bit on the f32 values, on lavapipe."""

from __future__ import annotations

import numpy as np
import pytest

from codegen.build import build_source, write_build
from dsl.reference import dequantize, quantize
from dsl.types import DType
from runtime.device import Device, RuntimeFailure
from runtime.dispatch import Build, RegionRunner

pytestmark = [pytest.mark.shaderc, pytest.mark.vulkan]

# 1-D flat view: y[i] = W[i] for a weight of 32*B elements (one element at a time), and row
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


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Build:
    text = FLAT.format(t="q8_0") + FLAT.format(t="q4_0")
    out = tmp_path_factory.mktemp("q") / "b"
    write_build(build_source(text, "quant.fuse"), out)
    return Build.load(out)


def _random_blocks(rng: np.random.Generator, dtype: DType, blocks: int) -> np.ndarray:
    """Arbitrary block bytes: every quant value, and finite f16 scales of both signs."""
    raw = rng.integers(0, 256, size=(blocks, dtype.block_bytes), dtype=np.uint8)
    scales = (rng.standard_normal(blocks) * 0.05).astype(np.float16)
    raw[:, :2] = scales.view(np.uint8).reshape(blocks, 2)
    return raw.reshape(-1)


@pytest.mark.parametrize("dtype", [DType.Q8_0, DType.Q4_0])
@pytest.mark.parametrize("source", ["arbitrary", "quantized"])
def test_dequantization_is_bit_exact(dev: Device, build: Build, dtype: DType, source: str) -> None:
    rng = np.random.default_rng()
    k = 32 * 257
    if source == "arbitrary":
        blocks = _random_blocks(rng, dtype, k // 32)
    else:
        blocks = quantize(rng.standard_normal(k).astype(np.float32) * 3.0, dtype)
    runner = RegionRunner(dev, build, f"deq_{dtype.value}", {"K": k})
    try:
        got = runner.run({"W": blocks}).outputs["y"]
    finally:
        runner.close()
    want = dequantize(blocks, dtype).reshape(-1)
    assert got.dtype == np.float32 and want.dtype == np.float32
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("dtype", [DType.Q8_0, DType.Q4_0])
def test_block_path_of_contractions_is_bit_exact(dev: Device, build: Build, dtype: DType) -> None:
    rng = np.random.default_rng()
    n, k = 64, 32 * 40
    blocks = _random_blocks(rng, dtype, n * k // 32).reshape(n, -1)
    runner = RegionRunner(dev, build, f"rowmax_{dtype.value}", {"K": k, "N": n})
    try:
        out = runner.run({"W": blocks}).outputs
    finally:
        runner.close()
    values = dequantize(blocks, dtype).reshape(n, k)
    assert np.array_equal(out["hi"].view(np.uint32), values.max(axis=1).view(np.uint32))
    assert np.array_equal(out["lo"].view(np.uint32), values.min(axis=1).view(np.uint32))


@pytest.mark.parametrize("dtype", [DType.Q8_0, DType.Q4_0])
def test_wrong_weight_bytes_are_refused_before_dispatch(
    dev: Device, build: Build, dtype: DType
) -> None:
    runner = RegionRunner(dev, build, f"deq_{dtype.value}", {"K": 64})
    try:
        short = np.zeros(2 * dtype.block_bytes - 1, np.uint8)
        with pytest.raises(RuntimeFailure) as e:
            runner.run({"W": short})
        want = 2 * dtype.block_bytes
        assert f"({want} bytes), not uint8 of shape ({want - 1},) ({want - 1} bytes)" in str(
            e.value
        )
        with pytest.raises(RuntimeFailure, match="not float32"):
            runner.run({"W": np.zeros(64, np.float32)})
    finally:
        runner.close()


def test_a_block_multiple_is_required_at_run_time(dev: Device, build: Build) -> None:
    with pytest.raises(RuntimeFailure, match="rows of 48 elements, not a multiple of 32"):
        RegionRunner(dev, build, "deq_q4_0", {"K": 48})
