"""Limits of the language that generated inputs test better than catalogue files: expressions
nested thousands of levels deep, names of hundreds of characters, and user names that the GLSL
generator's own names could equal (they are mangled, never refused)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from fusec.codegen import glsl
from fusec.dsl import syntax
from fusec.dsl.check import check
from fusec.dsl.check_stages import MAX_INLINED_DEPTH
from fusec.dsl.diagnostics import DiagnosticError
from fusec.dsl.parse import parse, parse_file
from fusec.runtime.cli import main

T = TypeVar("T")
ROOT = Path(__file__).resolve().parent.parent.parent
HEAD = "region r(x: f32[N]) -> y: f32[N]\n    const N = 64\n    launch workgroup 64\n"


def _deep(kind: str, depth: int) -> str:
    """An expression nested `depth` levels deep, counting the innermost `x[n]` as two."""
    inner = depth - 2
    if kind == "sum":
        return " + ".join(["x[n]"] * (inner + 1))
    if kind == "neg":
        return "-" * inner + "x[n]"
    if kind == "call":
        return "exp(" * inner + "x[n]" + ")" * inner
    assert kind == "max"
    return "max(" * inner + "x[n]" + ", 0.5)" * inner


def _build(tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    path = tmp_path / "deep.fuse"
    path.write_text(text)
    rc = main(["build", str(path), "-o", str(tmp_path / "out")])
    return rc, capsys.readouterr().err


def _under_deep_caller(frames: int, fn: Callable[[], T]) -> T:
    """`fn()` called `frames` Python frames deeper than here: the limits leave that margin."""
    return fn() if frames == 0 else _under_deep_caller(frames - 1, fn)


@pytest.mark.parametrize("kind", ["sum", "neg", "call"])
@pytest.mark.parametrize("depth", [500, 1000, 10000])
def test_deep_expression_is_one_diagnostic(
    kind: str, depth: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, err = _build(tmp_path, HEAD + f"    y[n] = {_deep(kind, depth)}\n", capsys)
    assert rc == 1
    assert "Traceback" not in err and "internal error" not in err
    assert err.startswith(
        f"{tmp_path / 'deep.fuse'}:4:12: error: expression must be nested at most "
        f"{syntax.MAX_EXPR_DEPTH} levels deep, not {depth}\n"
    )
    assert err.count("error:") == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.shaderc
@pytest.mark.parametrize("kind", ["sum", "neg", "call", "max"])
def test_accepts_expression_at_the_depth_limit(kind: str) -> None:
    from fusec.codegen.build import build_source
    from fusec.dsl.reference import run_reference

    text = HEAD + f"    y[n] = {_deep(kind, syntax.MAX_EXPR_DEPTH)}\n"

    def build_and_run() -> None:
        result = build_source(text, "deep.fuse")
        run_reference(result.program.regions[0], {"x": [0.5] * 64})

    _under_deep_caller(300, build_and_run)


def test_one_level_past_the_limit_is_refused() -> None:
    text = HEAD + f"    y[n] = {_deep('sum', syntax.MAX_EXPR_DEPTH + 1)}\n"
    with pytest.raises(DiagnosticError) as exc:
        parse(text, "deep.fuse")
    assert exc.value.diagnostics[0].message == (
        f"expression must be nested at most {syntax.MAX_EXPR_DEPTH} levels deep, "
        f"not {syntax.MAX_EXPR_DEPTH + 1}"
    )


def _chain(stages: int) -> str:
    """Register stages each nested about 90 levels deep, each read by the next (lowering
    substitutes them: the last one is about `stages` x 90 deep)."""
    terms = " + ".join(["x[n]"] * 88)
    lines = [f"    a1[n] = {terms}"]
    lines += [f"    a{i}[n] = a{i - 1}[n] + {terms}" for i in range(2, stages + 1)]
    return HEAD + "\n".join(lines) + f"\n    y[n] = a{stages}[n]\n"


def test_register_stages_read_too_deep_is_one_diagnostic(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, err = _build(tmp_path, _chain(12), capsys)
    assert rc == 1
    assert "Traceback" not in err and "internal error" not in err
    assert err.startswith(
        f"{tmp_path / 'deep.fuse'}:6:5: error: 'a3' must be nested at most {MAX_INLINED_DEPTH} "
        "levels deep with the register stages it reads substituted, not 267\n"
    )
    assert err.count("error:") == 1


@pytest.mark.shaderc
def test_accepts_register_stages_within_the_inlined_limit() -> None:
    from fusec.codegen.build import build_source

    _under_deep_caller(300, lambda: build_source(_chain(2), "deep.fuse"))


def test_source_past_the_size_limit_is_one_sentence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 3.5 MB line once took 31 s to parse before its nesting error: a source past
    MAX_SOURCE_BYTES is refused before the parser reads it."""
    text = HEAD + "    y[n] = " + " + ".join(["x[n]"] * 500_000) + "\n"
    t0 = time.perf_counter()
    rc, err = _build(tmp_path, text, capsys)
    assert time.perf_counter() - t0 < 2.0
    assert rc == 1
    assert err == (
        f"fusec: error: source {tmp_path / 'deep.fuse'} must be at most 256 KiB (262144 bytes), "
        f"not {len(text)} bytes\n  hint: split its regions over several files\n"
    )
    assert syntax.MAX_SOURCE_BYTES == 256 * 1024  # the README states it


def test_accepts_a_source_at_the_size_limit() -> None:
    # comment lines after the region, up to exactly MAX_SOURCE_BYTES (in UTF-8: é is 2 bytes)
    body = HEAD + "    y[n] = x[n]\n"
    pad = syntax.MAX_SOURCE_BYTES - len(body.encode())
    line = "# " + "é" * 49 + "\n"  # 101 bytes
    text = body + line * (pad // 101) + "#" * (pad % 101 - 1) + "\n"
    assert len(text.encode()) == syntax.MAX_SOURCE_BYTES
    check(parse(text, "big.fuse"))
    with pytest.raises(DiagnosticError, match="must be at most 256 KiB"):
        parse(text + "\n", "big.fuse")


LONG_REGION = "r" * 300  # `<region>.unfused.0.spv` would be past 255 bytes: a file system error
LONG_INPUT = "x" * 1100  # past GLSL's 1024 characters


@pytest.mark.parametrize(
    ("text", "where", "length"),
    [
        (f"region {LONG_REGION}(x: f32[N]) -> y: f32[N]{HEAD[HEAD.index(chr(10)) :]}", "1:8", 300),
        (HEAD.replace("(x:", f"({LONG_INPUT}:"), "1:10", 1100),
    ],
)
def test_long_name_is_one_diagnostic(
    text: str, where: str, length: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    name = LONG_INPUT if length == 1100 else "x"
    rc, err = _build(tmp_path, f"{text}    y[n] = {name}[n]\n", capsys)
    assert rc == 1
    assert "Traceback" not in err and "internal error" not in err
    assert err.startswith(
        f"{tmp_path / 'deep.fuse'}:{where}: error: name must be at most "
        f"{syntax.MAX_NAME_CHARS} characters, not {length}"
    )
    assert err.count("error:") == 1  # once, at the first use


# --- user names against generated names -------------------------------------------------------
COLLISIONS = {
    # b_W_u4 is buffer W read as uvec4
    "wide_view": """
region r(x: f32[K], W: f16[N, K], W_u4: f16[N, K]) -> y: f32[N]
    const K = 256, N = 64
    launch workgroup 256, subgroup any, rows_per_subgroup 2
    y[n] = sum(k: W[n, k] * x[k] + W_u4[n, k]) @ subgroup      layout n -> subgroup, k -> lane x 8
""",
    # s_xn_q and s_xn_d hold the blocks of the q8_0 stage xn
    "q8_blocks": """
region r(x: f32[K], g: f32[K], W: q8_0[N, K]) -> y: f32[N]
    const K = 256, N = 64
    launch workgroup 256, subgroup any
    xn[k] = x[k]                                        in shared as q8_0
    xn_q[k] = g[k] + x[k]                               in shared
    xn_d[k] = g[k] * x[k]                               in shared
    y[n] = sum(k: W[n, k] * xn[k]) + xn_q[n % K] + xn_d[n % K]  layout n -> subgroup, k -> lane x 32
""",
    # s_reduce is the scratch of a workgroup reduction
    "reduce_scratch": """
region r(x: f32[K]) -> y: f32[K]
    const K = 256
    launch workgroup 256, subgroup any
    reduce[k] = x[k] * 2.0                       in shared
    ss = sum(k: reduce[k]) @ workgroup           in shared
    y[k] = reduce[k] / ss
""",
    # dot_ss and dot_su are the integer dot product instructions
    "int_dot": """
region r(x: f32[K], ss: q4_0[N, K], su: q8_0[N, K]) -> y: f32[N]
    const K = 256, N = 64
    launch workgroup 256, subgroup any
    xq[k] = x[k]                                        in shared as q8_0
    y[n] = sum(k: ss[n, k] * xq[k]) + sum(k: su[n, k] * xq[k])  layout n -> subgroup, k -> lane x 32
""",
}


@pytest.mark.shaderc
@pytest.mark.parametrize("case", sorted(COLLISIONS))
def test_accepts_names_that_generated_names_could_equal(case: str) -> None:
    from fusec.codegen.build import build_source

    result = build_source(COLLISIONS[case], f"{case}.fuse")
    for k in result.kernels:
        declared = re.findall(r"\b(?:buffer|shared \w+) (\w+)", k.glsl)
        declared += re.findall(r"^(?:int|uint|float|void|vec4) (\w+)\(", k.glsl, re.MULTILINE)
        assert len(declared) == len(set(declared)), (k.kernel.name, declared)


@pytest.mark.shaderc
def test_a_reduction_index_never_shadows_a_flattened_index() -> None:
    """A stage over (t, r) is filled by one loop over a flattened index `i_t_r`; a reduction
    over an index named `t_r` inside it must not reuse that name (the body would read the
    reduction's index where it means the stage's: wrong values, no error)."""
    from fusec.codegen.build import build_source

    text = """
region r(x: f32[T, R], z: f32[T, R, 4]) -> y: f32[T, R]
    const T = 8, R = 16
    launch workgroup 64
    q[a, b] = sum(t_r: z[a, b, t_r]) @ lane
    p[t, r] = x[t, r] + q[t, r]      in shared
    y[t, r] = p[t, r]
"""
    fused = build_source(text, "flat.fuse").kernels[0]
    assert "for (uint i_t_r = " in fused.glsl
    assert "for (uint i_3t_r = 0u; i_3t_r < 4u; ++i_3t_r)" in fused.glsl
    assert "b_z[(((i_t_r / c_R) * c_R + (i_t_r % c_R)) * 4u + i_3t_r)]" in fused.glsl


def test_kernels_fuse_names_are_printed_as_written() -> None:
    """Mangling touches only names a generated name could equal: kernels.fuse has none, so its
    kernels are byte for byte what they were before mangling existed."""
    program = check(parse_file(ROOT / "kernels.fuse"))
    for region in program.regions:
        for buf in (*region.inputs, *region.outputs):
            assert glsl.buffer_id(buf) == buf.name
        for stage in region.all_stages():
            assert glsl.shared_id(stage.name) == stage.name
        assert all("_" not in v.name for v in glsl.user_index_vars(region))
