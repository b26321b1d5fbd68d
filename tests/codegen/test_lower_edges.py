"""Lowering and GLSL at the edges the front-end fuzzer found (docs/FUZZING.md): values a
kernel after a `global` split reads from the kernel before it, f16 outputs of constants alone,
and derived constants beside a `+ 0`.  Each once stopped the build with an internal error; here
each builds, and `fusec check` runs it fused and unfused on lavapipe against the reference."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fusec.codegen import kir
from fusec.codegen import manifest as mf
from fusec.codegen import manifest_records as mr
from fusec.codegen.build import build_source
from fusec.codegen.lower import lower_fused
from fusec.dsl.check import check
from fusec.dsl.parse import parse
from tests.conftest import fusec_cli

# region -> what the kernel after the split reads that the kernel before it computed
SPLIT = """
region scalar_after_split(a: f32[N]) -> y: f32[N]
    const N = 40 in 1 .. 4096
    launch workgroup 64
    t = 2.0
    s = sum(k: a[k]) @ workgroup
    u[i] = a[i] in global
    y[i] = t * u[i] + s

region shared_after_split(x: f32[N]) -> y: f32[N]
    const N = 40 in 1 .. 1024
    launch workgroup 64
    s[i] = x[i] * 3.0                        in shared
    m = sum(k: x[k]) @ workgroup             in shared
    t[i] = x[i] * 2.0                        in global
    y[i] = t[i] + s[i] * m

region per_workgroup_after_split(x: f32[H, N]) -> y: f32[H, N]
    const H = 5 in 1 .. 64, N = 24 in 1 .. 1024
    launch workgroup 64
    per workgroup h < H
    s[i] = x[h, i] * 3.0                     in shared
    m = sum(k: s[k]) @ workgroup
    t[i] = x[h, i] * 2.0                     in global
    y[h, i] = t[i] + s[i] * m

region slices_after_split(x: f32[H], Wg: f32[F, H], Wd: f32[H, F]) -> y: f32[H]
    const H = 64 in 1 .. 1024, F = 96 in 1 .. 4096
    launch workgroup 64, subgroup any, rows_per_subgroup 2
    hh[f] = sum(k: Wg[f, k] * x[k])          in slices
    g[i] = x[i] * 2.0                        in global
    y[n] = sum(f: Wd[n, f] * hh[f])          layout n -> subgroup, f -> lane x 4
"""

# f16 outputs assigned values of specialization constants alone, and a derived constant (N / 2)
# beside a `+ 0`
CONSTANTS = """
region f16_constant(x: f32[N]) -> (y: f16[N], z: f16, w: f16[N])
    const N = 4 in 1 .. 1024, eps = 0.5
    launch workgroup 64
    y[i] = eps
    z = select(N < 2, eps, 2.0 * eps)
    w[i] = x[i] * eps

region f16_tile_constant(m: f32[T, 16]) -> C: f16[T, 4, 4]
    const T = 4 in 1 .. 256, eps = 0.25
    launch workgroup 64, subgroup >= 16 else shared
    tile (src: 4, dst: 4) lane dst + 4 * src, per t
    C[t, src, dst] = eps

region derived_plus_zero() -> y: f32
    const N = 16 in 2 .. 64
    launch workgroup 64
    y = 1.0 * (N / 2 + 0)
"""


def test_eval_u32_evaluates_only_the_operator_asked() -> None:
    """`a + 0` once also computed `a // 0` (a table of every operator's result)."""
    n = mr.ConstRef("N")
    assert mf.eval_u32(mr.BinOp("+", n, 0), {"N": 7}) == 7
    assert mf.eval_u32(mr.BinOp("-", n, 0), {"N": 7}) == 7
    assert mf.eval_u32(mr.BinOp("*", n, 0), {"N": 7}) == 0
    assert mf.eval_u32(mr.BinOp("-", 0, n), {"N": 1}) == 2**32 - 1
    with pytest.raises(ValueError, match="divides by zero"):
        mf.eval_u32(mr.BinOp("/", n, 0), {"N": 7})


def _computed(kernel: kir.Kernel) -> set[str]:
    """The scalars, shared arrays and slices a kernel computes for itself."""
    out = set()
    for p in kernel.phases:
        match p:
            case kir.ScalarPhase(name):
                out.add(name)
            case kir.FillShared(array):
                out.add(array.name)
            case kir.Contract(kir.SharedArray() as array) if p.slice:
                out.add(array.name)
    return out


@pytest.mark.parametrize(
    ("region", "again"),
    [
        ("scalar_after_split", {"t", "s"}),
        ("shared_after_split", {"s", "m"}),
        ("per_workgroup_after_split", {"s", "m"}),
        ("slices_after_split", {"hh"}),
    ],
)
def test_kernels_after_a_split_compute_what_they_read_again(region: str, again: set[str]) -> None:
    r = check(parse(SPLIT, "split.fuse")).region(region)
    first, second = lower_fused(r)
    assert second.name == f"{region}.part1"
    assert again <= _computed(first)
    assert _computed(second) == again
    if r.per is not None:
        # it runs as the region does: one workgroup per value of the per index
        assert second.grid[0] == kir.GridItem(r.per.extent, 1, None)


@pytest.mark.shaderc
def test_f16_store_of_constants_converts_at_run_time() -> None:
    """float16_t(c_eps) of a specialization constant would be an OpSpecConstantOp FConvert to
    a 16-bit type, which spirv-opt cannot form: the value goes through a variable."""
    result = build_source(CONSTANTS, "constants.fuse")
    glsl = next(b.glsl for b in result.kernels if b.kernel.name == "f16_constant")
    assert re.search(r"float (cv\d+) = c_eps;\n(#line.*\n)?\s*b_y\[i_i\] = float16_t\(\1\);", glsl)
    # a value that reads a buffer converts as before
    assert "b_w[i_i] = float16_t((b_x[i_i] * c_eps));" in glsl


@pytest.mark.slow
@pytest.mark.shaderc
@pytest.mark.vulkan
@pytest.mark.parametrize("text", [SPLIT, CONSTANTS], ids=["split", "constants"])
def test_checked_on_lavapipe(text: str, tmp_path: Path) -> None:
    source = tmp_path / "edges.fuse"
    source.write_text(text)
    proc = fusec_cli(["check", str(source)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    regions = re.findall(r"^(\w+) \[", proc.stdout, re.M)
    assert regions == re.findall(r"^region (\w+)", text, re.M)
    for line in proc.stdout.splitlines():
        if line.startswith(tuple(regions)):
            assert ": fused" in line, line
        if "max rel err" in line:
            assert line.endswith(" ok"), line
