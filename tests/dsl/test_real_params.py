"""Real-valued run-time parameters (`param temp in 0.25 .. 2.0`): the checker gives such a
param the dtype f32 from its bounds (an integer range still gives u32), numbers it in the same
parameter-buffer slots as integer params, and `fusec fmt` keeps its bounds real.  Its misuses
(an index, an extent, a repeat count, mixed bounds) are diagnostics in tests/dsl/errors/."""

from __future__ import annotations

from fusec.dsl import ir
from fusec.dsl.check import check
from fusec.dsl.format import format_source
from fusec.dsl.parse import parse
from fusec.dsl.types import DType

SOURCE = """\
region r(x: f32[K]) -> y: f32[K]
    const K = 8, eps = 0.125
    param pos in 0 .. 7, cap in 5.0 .. 50.0, shift in -1.5 .. 2.5
    launch workgroup 64
    y[k] = cap * tanh(x[k] / cap) + shift * pos + eps
"""


def _consts() -> dict[str, ir.ConstDecl]:
    region = check(parse(SOURCE, "r.fuse")).regions[0]
    return {c.name: c for c in region.consts}


def test_a_real_range_makes_an_f32_param_in_the_next_slot() -> None:
    c = _consts()
    assert (c["cap"].dtype, c["cap"].runtime, c["cap"].spec_id) == (DType.F32, True, 1)
    assert (c["cap"].lo, c["cap"].hi, c["cap"].default) == (5.0, 50.0, 5.0)
    assert (c["shift"].dtype, c["shift"].spec_id, c["shift"].lo) == (DType.F32, 2, -1.5)
    # an integer range stays u32 in slot 0; a constant keeps its own numbering
    assert (c["pos"].dtype, c["pos"].runtime, c["pos"].spec_id) == (DType.U32, True, 0)
    assert (c["eps"].dtype, c["eps"].runtime, c["eps"].spec_id) == (DType.F32, False, 1)


def test_the_value_reads_a_real_param_as_f32() -> None:
    region = check(parse(SOURCE, "r.fuse")).regions[0]
    [stage] = region.stages
    refs = [x for x in ir.walk(stage.value) if isinstance(x, ir.ConstRef) and x.const.runtime]
    assert {(x.const.name, x.dtype) for x in refs} == {
        ("cap", DType.F32),
        ("shift", DType.F32),
        ("pos", DType.U32),
    }


def test_fmt_keeps_real_bounds_real() -> None:
    text = format_source(SOURCE, "r.fuse")
    assert "param pos in 0 .. 7, cap in 5.0 .. 50.0, shift in -1.5 .. 2.5" in text
    assert check(parse(text, "r.fuse")).regions[0].consts[3].dtype == DType.F32
