"""Lowering of argmax, argmin, topk and argtopk (codegen/lower.py, codegen/glsl.py): a topk and
an argtopk of the same values are one select phase, integer values live in uint locals and
u32 intermediates, and a workgroup selection passes indices through shared memory."""

from __future__ import annotations

import pytest

from fusec.codegen import kir
from fusec.codegen.glsl import emit_glsl
from fusec.codegen.lower import lower_fused, lower_unfused
from fusec.codegen.validate import validate_kernels
from fusec.dsl import ir
from fusec.dsl.check import check
from fusec.dsl.parse import parse
from fusec.dsl.types import DType
from tests.runtime.test_select import SELECT


def test_topk_and_argtopk_of_the_same_values_share_one_phase() -> None:
    region = check(parse(SELECT, "sel.fuse")).region("sel")
    fused = lower_fused(region)
    validate_kernels(fused)
    assert len(fused) == 1
    selects = [p for p in fused[0].phases if isinstance(p, kir.TopKPhase)]
    # tk/ki (workgroup), sv/si (subgroup), lv/li (lane): three bodies, three phases
    assert sorted(p.reduce.scope.value for p in selects) == ["lane", "subgroup", "workgroup"]
    assert all(p.reduce.k == ir.Lit(5, DType.U32) and p.reduce.rank is None for p in selects)
    glsl = emit_glsl(fused[0], line_directives=False)
    assert "shared uint s_reduce_i[64u];" in glsl
    # each select phase keeps its values and indices in shared memory, not in lane arrays
    for n in range(3):
        assert f"shared float s_tk{n}[5u];" in glsl and f"shared uint s_tk{n}_i[5u];" in glsl
    assert "uint v_ai = " in glsl  # an integer scalar stage is a uint local
    assert "b_c[0] = int(" in glsl  # an i32 output stores int()


def test_unfused_integer_intermediates_are_u32() -> None:
    region = check(parse(SELECT, "sel.fuse")).region("sel")
    chain = lower_unfused(region)
    validate_kernels(chain)
    inter = {
        b.buffer.name: b.buffer.dtype
        for k in chain
        for b in k.bindings
        if b.writes and not b.buffer.is_output
    }
    assert inter["ki"] == DType.U32 and inter["ai"] == DType.U32
    assert inter["tk"] == DType.F32


def test_a_stage_named_like_an_added_array_is_mangled() -> None:
    text = """\
region r(x: f32[E]) -> (i: u32[4], a: u32)
    const E = 64 in 4 .. 4096
    launch workgroup 64
    reduce_i[e] = x[e] * 2.0                 in shared
    tk0[e]      = x[e] + 1.0                 in shared
    i[j]        = argtopk(4, e: reduce_i[e] + tk0[e]) @ workgroup
    a           = argmax(e: tk0[e]) @ workgroup
"""
    fused = lower_fused(check(parse(text, "r.fuse")).region("r"))
    validate_kernels(fused)
    glsl = emit_glsl(fused[0], line_directives=False)
    assert "shared float s_8reduce_i[c_E];" in glsl and "shared uint s_reduce_i[64u];" in glsl
    assert "shared float s_3tk0[c_E];" in glsl and "shared uint s_tk0_i[4u];" in glsl


def test_argmax_without_workgroup_selection_needs_no_index_scratch() -> None:
    text = SELECT.replace("@ workgroup", "@ subgroup")
    region = check(parse(text, "sel.fuse")).region("sel")
    glsl = emit_glsl(lower_fused(region)[0], line_directives=False)
    assert "s_reduce_i" not in glsl


@pytest.mark.shaderc
def test_manifest_intermediates_agree_with_the_source() -> None:
    """An integer intermediate is u32 in the manifest, and a build folder's manifest matches
    the source that made it (`fusec check DIR` refuses one that does not)."""
    from fusec.codegen.build import build_source
    from fusec.codegen.manifest import signature_mismatch

    result = build_source(SELECT, "sel.fuse")
    region = result.manifest.regions[0]
    dtypes = {b.name: b.dtype for b in region.intermediates}
    assert dtypes["ki"] == "u32" and dtypes["ai"] == "u32" and dtypes["tk"] == "f32"
    assert signature_mismatch(region, result.program.region("sel")) is None
