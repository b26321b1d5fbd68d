"""q8_0x region inputs and outputs (issue 17): activations rounded to q8_0 blocks once, by the
kernel that produces them.  On lavapipe: an output stored as q8_0x against gguf's q8_0
quantization word for word (blocks of very different magnitudes, a block whose largest value
is negative, an all-zero block), elementwise and in a contraction's epilogue; contractions of
q8_0 / q4_0 / q4_K / q6_K weights with a q8_0x input (integer dot products, the blocks read
from global memory) against the numpy reference and against the same contraction rounding its
input in shared memory, fused and unfused; the same at lavapipe's subgroup sizes 4, 8, 16
(which contractions at which size: _dot_regions)."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from fusec.codegen import manifest_kernel as mr
from fusec.codegen import plan
from fusec.codegen.build import build_source, check_source, write_build
from fusec.codegen.lower import lower_fused
from fusec.dsl import ir
from fusec.dsl.q8_0x import from_gguf, q8_0x_values, q8_0x_words, quantize_q8_0x, to_gguf
from fusec.dsl.reference import dequantize, quantize, run_reference, weight_blocks
from fusec.dsl.types import DType
from fusec.runtime.device import Device
from fusec.runtime.dispatch import Build, RegionRunner
from fusec.runtime.verify import check_region, comparable, relative_error

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.shaderc, pytest.mark.vulkan]

ROUND = """
region round_q8(x: f32[K], g: f32[K]) -> (y: q8_0x[K], s: f32[K])
    const K = 4096 in 32 .. 8192
    launch workgroup 64, subgroup any
    y[k] = x[k] * g[k]
    s[k] = x[k] + g[k]
"""
# the contraction with its activation in global q8_0x blocks, and the same rounding it in shared
# memory; two reductions over one activation, operands in either order, 3 rows per subgroup
DOT = """
region dot_global_{t}(a: q8_0x[K], W: {t}[N, K], b: f32[N]) -> (y: f32[N], z: f32[N])
    const K = {k} in {b} .. 8192, N = 64 in 1 .. 4096
    launch workgroup 128, subgroup any, rows_per_subgroup 3
    y[n] = sum(k: W[n, k] * a[k]) + b[n]              layout n -> subgroup, k -> lane x 32
    z[n] = sum(k: a[k] * W[n, k])                     layout n -> subgroup, k -> lane x 32

region dot_shared_{t}(x: f32[K], W: {t}[N, K], b: f32[N]) -> (y: f32[N], z: f32[N])
    const K = {k} in {b} .. 8192, N = 64 in 1 .. 4096
    launch workgroup 128, subgroup any, rows_per_subgroup 3
    xq[k] = x[k]                                      in shared as q8_0
    y[n]  = sum(k: W[n, k] * xq[k]) + b[n]            layout n -> subgroup, k -> lane x 32
    z[n]  = sum(k: xq[k] * W[n, k])                   layout n -> subgroup, k -> lane x 32
"""
# a contraction's output stored as q8_0x (rounded in its epilogue through shared memory), and
# the same stored as f32: 3 rows per subgroup, so a workgroup's subgroups' rows (24 at
# subgroups of 8, 48 at 4, 12 at 16) are rounded up to whole blocks
EPILOGUE = """
region mv_{o}(x: f32[K], W: q4_0[N, K], b: f32[N]) -> y: {o}[N]
    const K = 256 in 32 .. 8192, N = 224 in 32 .. 4096
    launch workgroup 64, subgroup any, rows_per_subgroup 3
    xq[k] = x[k]                                      in shared as q8_0
    y[n]  = sum(k: W[n, k] * xq[k]) + b[n]            layout n -> subgroup, k -> lane x 32

region ffn_{o}(x: f32[H], Wg: q4_K[F, H], Wu: q4_K[F, H]) -> h: {o}[F]
    const H = 256 in 256 .. 8192, F = 320 in 32 .. 4096
    launch workgroup 128, subgroup any, rows_per_subgroup 2
    xq[k]   = x[k]                                    in shared as q8_0
    gate[f] = sum(k: Wg[f, k] * xq[k])                layout f -> subgroup, k -> lane x 32
    up[f]   = sum(k: Wu[f, k] * xq[k])                layout f -> subgroup, k -> lane x 32
    h[f]    = silu(gate[f]) * up[f]
"""
WEIGHTS = {"q8_0": 32, "q4_0": 32, "q4_K": 256, "q6_K": 256}
TEXT = (
    ROUND
    + "".join(DOT.format(t=t, k=8 * b, b=b) for t, b in WEIGHTS.items())
    + EPILOGUE.format(o="f32")
    + EPILOGUE.format(o="q8_0x")
)


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Build:
    out = tmp_path_factory.mktemp("q8x") / "b"
    write_build(build_source(TEXT, "q8x.fuse"), out)
    return Build.load(out)


@functools.cache
def _program() -> ir.Program:
    """TEXT checked, once per process (its regions for the reference and check_region)."""
    return check_source(TEXT, "q8x.fuse")


def _region(name: str) -> object:
    return _program().region(name)


def _activations(rng: np.random.Generator, k: int, overflow: bool = False) -> np.ndarray:
    """Blocks of very different magnitudes (tiny ones give scales below f16's normal range),
    one whose largest magnitude is negative, and, when there are 3 or more, one of zeros (its
    scale is 0; the inputs are otherwise never zero).  `overflow`, with 6 or more blocks: block
    3's scale (max / 127) drawn across f16's overflow (65504 .. 65536: from 65520 on it rounds
    to infinity), block 4's far past it."""
    blocks = -(-k // 32)
    scale = np.repeat(10.0 ** rng.uniform(-5, 2, size=blocks), 32)[:k]
    x = (rng.standard_normal(k) * scale).astype(np.float32)
    x[x == 0] = 1e-3
    x[min(5, k - 1)] = -4.0 * np.abs(x[:32]).max()  # block 0: a negative maximum
    if blocks >= 3:
        x[32:64] = 0.0
    if overflow and blocks >= 6:
        b3 = x[96:128] / np.abs(x[96:128]).max()  # largest magnitude 1
        x[96:128] = b3 * np.float32(127.0 * rng.uniform(65504.0, 65536.0))
        x[128:160] = x[128:160] / np.abs(x[128:160]).max() * np.float32(1e9)
    return x


def test_host_layout_round_trips_gguf_blocks() -> None:
    rng = np.random.default_rng()
    k = 32 * int(rng.integers(1, 40))
    with np.errstate(over="ignore"):
        gg = quantize(_activations(rng, k, overflow=True), DType.Q8_0)
    aligned = from_gguf(gg)
    assert aligned.size == k // 32 * 48
    assert np.array_equal(to_gguf(aligned), gg.reshape(-1))
    with np.errstate(invalid="ignore"):
        want = np.asarray(dequantize(gg, DType.Q8_0)).reshape(-1)
    # an overflowed block dequantizes to infinity times its quants (NaN where a quant is 0)
    assert np.array_equal(q8_0x_values(aligned, k), want, equal_nan=True)
    words = q8_0x_words(aligned)
    quants = gg.reshape(-1, 34)[:, 2:].view(np.int8).astype(np.int64)
    assert np.array_equal(words[:, 9].view(np.int32), quants.sum(axis=1))


@pytest.mark.parametrize("k", [4096, 96, 32, 8192])
def test_output_rounding_matches_gguf_word_for_word(dev: Device, build: Build, k: int) -> None:
    rng = np.random.default_rng()
    x = _activations(rng, k, overflow=True)
    g = (1.0 + 0.1 * rng.standard_normal(k)).astype(np.float32)
    g[96:128] = 1.0  # block 3 stays across f16's overflow
    with np.errstate(over="ignore"):  # gguf's cast of an overflowing scale to f16
        want = q8_0x_words(from_gguf(quantize(x * g, DType.Q8_0)))
    assert np.array_equal(q8_0x_words(quantize_q8_0x(x * g)), want)
    runner = RegionRunner(dev, build, "round_q8", {"K": k})
    try:
        for fused in (True, False):
            out = runner.run({"x": x, "g": g}, fused=fused).outputs  # outputs poisoned first
            got = q8_0x_words(out["y"])
            bad = np.argwhere(got != want)
            assert not bad.size, (fused, bad[:4], got[bad[0][0]], want[bad[0][0]])
            assert np.array_equal(out["s"], x + g)
    finally:
        runner.close()


def test_overflowed_blocks_compare_as_the_same_infinity() -> None:
    """A block whose f16 scale overflowed reads as +infinity in a product and in the
    reference alike (they agree, as the same infinity does in an f32 output); a block no
    kernel wrote (poison, a NaN scale) does not."""
    rng = np.random.default_rng()
    k = 32 * int(rng.integers(6, 40))
    with np.errstate(over="ignore"):
        ref = quantize_q8_0x(_activations(rng, k, overflow=True))
    out = mr.Buffer("y", "q8_0x", (k,))
    values = comparable(out, ref, {})
    assert np.isinf(values[128:160]).all() and np.isfinite(values[:96]).all()
    assert relative_error(comparable(out, ref.copy(), {}), values) == 0.0
    got = ref.copy()
    got[4 * 48 + 32 : 4 * 48 + 36] = 0xFF  # block 4's scale: NaN, as poison leaves it
    assert relative_error(comparable(out, got, {}), values) == float("inf")
    finite = ref.copy()
    finite[4 * 48 + 32 : 4 * 48 + 36] = np.frombuffer(np.float32(1e6).tobytes(), np.uint8)
    assert relative_error(comparable(out, finite, {}), values) == float("inf")


def test_output_through_check_region(dev: Device, build: Build) -> None:
    rng = np.random.default_rng()
    k = 32 * int(rng.integers(2, 200))
    rep = check_region(dev, build, _region("round_q8"), {"K": k})  # type: ignore[arg-type]
    assert rep.ok and rep.path == "fused", rep.outputs
    assert [o.name for o in rep.outputs] == ["y", "s"]


def _epilogue_case(
    rng: np.random.Generator, region: str, small: bool = False
) -> tuple[dict[str, int], dict]:
    """Random constants and inputs for an epilogue region; `small`: at most a quarter of the
    rows and a third of the length (the subgroup-size children, which run every region at
    three widths)."""
    if region == "mv":
        k = 32 * int(rng.integers(1, 24 if small else 64))
        n = 32 * int(rng.integers(1, 10 if small else 40))
        w = quantize(rng.standard_normal((n, k)).astype(np.float32), DType.Q4_0)
        ins = {"x": _activations(rng, k), "W": w, "b": rng.standard_normal(n).astype(np.float32)}
        return {"K": k, "N": n}, ins
    h = 256 * int(rng.integers(1, 3 if small else 5))
    f = 32 * int(rng.integers(1, 10 if small else 40))
    wg, wu = (
        weight_blocks(rng.standard_normal((f, h)).astype(np.float32), DType.Q4_K, rng)
        for _ in range(2)
    )
    return {"H": h, "F": f}, {"x": _activations(rng, h), "Wg": wg, "Wu": wu}


@pytest.mark.parametrize("region", ["mv", "ffn"])
def test_contraction_output_rounding_matches_gguf_word_for_word(
    dev: Device, build: Build, region: str
) -> None:
    """A contraction's q8_0x output is gguf's rounding of the f32 values the same contraction
    stores when its output is f32 (the same accumulation), word for word; and the reference."""
    rng = np.random.default_rng()
    consts, ins = _epilogue_case(rng, region)
    out = "y" if region == "mv" else "h"
    f32 = RegionRunner(dev, build, f"{region}_f32", consts)
    q8 = RegionRunner(dev, build, f"{region}_q8_0x", consts)
    ref = run_reference(_region(f"{region}_q8_0x"), ins, consts)  # type: ignore[arg-type]
    try:
        for fused in (True, False):
            values = f32.run(ins, fused=fused).outputs[out]
            got = q8.run(ins, fused=fused)
            assert got.path == ("fused" if fused else "unfused")
            want = q8_0x_words(quantize_q8_0x(values))
            bad = np.argwhere(q8_0x_words(got.outputs[out]) != want)
            assert not bad.size, (fused, consts, bad[:4])
            n = values.size
            err = relative_error(q8_0x_values(got.outputs[out], n), q8_0x_values(ref[out], n))
            assert err <= 8e-3, (fused, err)
    finally:
        f32.close()
        q8.close()


def _dot_case(
    rng: np.random.Generator, dtype: str, small: bool = False
) -> tuple[int, int, dict[str, np.ndarray]]:
    """A random length (whole blocks), row count and inputs; `small` as in _epilogue_case."""
    block = WEIGHTS[dtype]
    k = block * int(rng.integers(1, (1536 if small else 4096) // block))
    n = int(rng.integers(1, 24 if small else 70))
    x = _activations(rng, k)
    w = weight_blocks(rng.standard_normal((n, k)).astype(np.float32), DType(dtype), rng)
    b = rng.standard_normal(n).astype(np.float32)
    return k, n, {"x": x, "W": w, "b": b}


@pytest.mark.parametrize("dtype", list(WEIGHTS))
def test_global_activations_match_reference_and_shared_path(
    dev: Device, build: Build, dtype: str
) -> None:
    """The same blocks, read from global memory or rounded into shared memory: the same integer
    dot products in the same order, so the same f32 results, and the numpy reference."""
    rng = np.random.default_rng()
    k, n, ins = _dot_case(rng, dtype)
    a = quantize_q8_0x(ins["x"])
    glob = {"a": a, "W": ins["W"], "b": ins["b"]}
    ref = run_reference(_region(f"dot_global_{dtype}"), glob, {"K": k, "N": n})  # type: ignore[arg-type]
    g = RegionRunner(dev, build, f"dot_global_{dtype}", {"K": k, "N": n})
    s = RegionRunner(dev, build, f"dot_shared_{dtype}", {"K": k, "N": n})
    try:
        for fused in (True, False):
            got = g.run(glob, fused=fused)
            assert got.path == ("fused" if fused else "unfused")
            shared = s.run(ins, fused=fused).outputs
            for name in ("y", "z"):
                err = relative_error(got.outputs[name], ref[name])
                assert err < 1e-5, (name, fused, k, n, err)
                assert np.array_equal(got.outputs[name], shared[name]), (name, fused, k, n)
    finally:
        g.close()
        s.close()


def test_plan_reads_global_blocks_without_staging() -> None:
    """The plan's decision (ActSource), and what the kernel does not do: no shared array, no
    quantization phase, no barrier."""
    from fusec.codegen.glsl import emit_glsl

    for dtype in WEIGHTS:
        (kernel,) = lower_fused(_region(f"dot_global_{dtype}"))  # type: ignore[arg-type]
        loops = [lp for p in plan.plan_kernel(kernel).phases for lp in getattr(p, "loops", ())]
        sources = {t.acts for lp in loops for t in lp.terms}
        assert sources == {plan.ActSource.GLOBAL}, dtype
        assert not kernel.shared
        glsl = emit_glsl(kernel)
        assert "barrier()" not in glsl and "shared" not in glsl.split("void main")[1]
        (shared,) = lower_fused(_region(f"dot_shared_{dtype}"))  # type: ignore[arg-type]
        loops = [lp for p in plan.plan_kernel(shared).phases for lp in getattr(p, "loops", ())]
        assert {t.acts for lp in loops for t in lp.terms} == {plan.ActSource.SHARED}


def _dot_regions(subgroup: int, rng: np.random.Generator) -> list[tuple[str, str]]:
    """(weight type, "global" or "shared") of the contractions the child at `subgroup` lanes
    checks.  At 4 lanes all eight.  At 8 lanes, lavapipe's default on AVX2, where
    test_global_activations_match_reference_and_shared_path runs all eight: one per weight
    type, global and shared by turns in the order of a stable hash (CRC-32) of the type, so
    two of each, the same in every run.  At 16 lanes, where lavapipe spends 10-45 s compiling
    each of these kernels: two of the four weight types, drawn per run, each reading its
    activations from global or from shared memory, one of the two drawn."""
    if subgroup == 4:
        return [(t, how) for t in WEIGHTS for how in ("global", "shared")]
    if subgroup == 8:
        turns = sorted(WEIGHTS, key=lambda t: zlib.crc32(t.encode()))
        return [(t, ("global", "shared")[turns.index(t) % 2]) for t in WEIGHTS]
    dtypes = [str(d) for d in rng.permutation(list(WEIGHTS))[:2]]
    return [(t, str(rng.choice(["global", "shared"]))) for t in dtypes]


def _child(tmp: str, subgroup: int) -> None:
    """Run in a child process with LP_NATIVE_VECTOR_WIDTH set: the rounding and both epilogue
    regions, and the contractions of _dot_regions, each at one random shape, fused and unfused
    against the reference; prints the subgroup sizes seen."""
    out = Path(tmp) / "b"
    write_build(build_source(TEXT, "q8x.fuse"), out)
    b = Build.load(out)
    rng = np.random.default_rng()
    sizes = []
    with Device() as dev:
        k = 32 * int(rng.integers(2, 100))
        rep = check_region(dev, b, _region("round_q8"), {"K": k})  # type: ignore[arg-type]
        assert rep.ok, rep.outputs
        sizes.extend(rep.subgroup_sizes)
        for region in ("mv", "ffn"):
            consts, _ = _epilogue_case(rng, region, small=True)
            rep = check_region(dev, b, _region(f"{region}_q8_0x"), consts)  # type: ignore[arg-type]
            assert rep.ok and rep.path == "fused", (region, rep.outputs)
            sizes.extend(rep.subgroup_sizes)
        for dtype, how in _dot_regions(subgroup, rng):
            k, n, _ = _dot_case(rng, dtype, small=True)
            region = _region(f"dot_{how}_{dtype}")
            rep = check_region(dev, b, region, {"K": k, "N": n})  # type: ignore[arg-type]
            assert rep.ok and rep.path == "fused", (dtype, how, rep.outputs)
            sizes.extend(rep.subgroup_sizes)
    print(json.dumps(sorted(set(sizes))))


@pytest.mark.slow
@pytest.mark.parametrize(("width", "subgroup"), [(128, 4), (256, 8), (512, 16)])
def test_at_lavapipe_subgroup_sizes(tmp_path: Path, width: int, subgroup: int) -> None:
    """LP_NATIVE_VECTOR_WIDTH sets lavapipe's subgroup size (bits / 32): every contraction at
    4 lanes, half of them at 8 (two global, two shared, one per weight type), two drawn at 16
    (_dot_regions); the rounding and epilogue regions at every size."""
    assert sorted(how for _, how in _dot_regions(8, np.random.default_rng())) == [
        "global",
        "global",
        "shared",
        "shared",
    ]
    if "llvmpipe" not in (os.environ.get("FUSEC_DEVICE") or "llvmpipe"):
        pytest.skip("FUSEC_DEVICE selects a device other than lavapipe")
    env = {**os.environ, "LP_NATIVE_VECTOR_WIDTH": str(width), "FUSEC_DEVICE": "llvmpipe"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    code = f"from tests.codegen.test_q8_0x import _child; _child({str(tmp_path)!r}, {subgroup})"
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == [subgroup]
