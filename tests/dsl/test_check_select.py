"""argmax, argmin, topk and argtopk in the checker (dsl/check_select.py) and the numpy reference:
integer dtypes, the rank of a topk, and the tie rule (the lowest index first) held against a
plain sort on inputs full of ties."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fusec.dsl import ir
from fusec.dsl.check import check
from fusec.dsl.format import format_source
from fusec.dsl.parse import parse
from fusec.dsl.reference import run_reference
from fusec.dsl.types import DType, Scope

TOPK = """\
region sel(x: f32[N]) -> (v: f32[4], i: u32[4], a: u32, b: i32, f: f32)
    const N = 40 in 4 .. 4096
    launch workgroup 64
    t[j] = topk(4, n: x[n]) @ subgroup
    k[j] = argtopk(4, n: x[n]) @ subgroup
    v[j] = t[j]
    i[j] = k[j]
    m    = argmax(n: x[n])
    a    = m
    b    = argmin(n: x[n]) @ lane
    f    = float(m + k[3]) * 0.25
"""


def _order(v: np.ndarray) -> list[int]:
    return sorted(range(v.size), key=lambda i: (-float(v[i]), i))


def test_accepts_topk_and_integer_outputs() -> None:
    region = check(parse(TOPK, "sel.fuse")).region("sel")
    stages = {s.name: s for s in region.all_stages()}
    assert stages["t"].dtype == DType.F32 and stages["k"].dtype == DType.U32
    assert stages["m"].dtype == DType.U32 and stages["f"].dtype == DType.F32
    t, k = stages["t"].value, stages["k"].value
    assert isinstance(t, ir.Reduce) and isinstance(k, ir.Reduce)
    assert (t.op, t.k, t.scope) == ("topk", ir.Lit(4, DType.U32), Scope.SUBGROUP)
    # the rank is the stage's own index, of extent k
    assert isinstance(t.rank, ir.IndexRef) and t.rank.var is stages["t"].indices[0]
    assert ir.evaluate_int(stages["t"].indices[0].extent, {}) == 4
    # a topk and an argtopk of the same values reduce over one index: lowering shares them
    assert t.var is k.var
    m = stages["m"].value
    assert isinstance(m, ir.Reduce) and m.scope == Scope.WORKGROUP  # a scalar's default
    assert [b.dtype for b in region.outputs] == [
        DType.F32,
        DType.U32,
        DType.U32,
        DType.I32,
        DType.F32,
    ]


@settings(max_examples=40, deadline=None)
@given(
    values=st.lists(st.sampled_from([-2.0, -0.5, 0.25, 1.0, 3.0]), min_size=4, max_size=60),
)
def test_reference_breaks_ties_by_the_lowest_index(values: list[float]) -> None:
    x = np.array(values, np.float32)
    region = check(parse(TOPK, "sel.fuse")).region("sel")
    out = run_reference(region, {"x": x}, {"N": x.size})
    order = _order(x)
    assert out["i"].tolist() == order[:4]
    np.testing.assert_array_equal(out["v"], x[order[:4]])
    assert int(out["a"]) == order[0]
    assert int(out["b"]) == _order(-x)[0]
    assert out["i"].dtype == np.uint32 and out["b"].dtype == np.int32
    assert float(out["f"]) == (order[0] + order[3]) * 0.25


def test_fmt_keeps_topk_glued_to_its_bracket() -> None:
    text = TOPK.replace("topk(4, n:", "topk (4,n:").replace("argmax(n:", "argmax (n:")
    out = format_source(text, "sel.fuse")
    assert "t[j] = topk(4, n: x[n]) @ subgroup" in out
    assert "m    = argmax(n: x[n])" in out
    assert format_source(out, "sel.fuse") == out


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("argmax(n: x[n])", "argmax(n: x[n]) @ wave", "unknown reduction scope 'wave'"),
        ("f    = float(m + k[3]) * 0.25", "f    = m", "output 'f' is f32 but the value is u32"),
        ("i[j] = k[j]", "i[j] = t[j]", "output 'i' is u32 but the value is f32"),
        ("topk(4, n: x[n])", "topk(0, n: x[n])", "topk keeps 1 to 16 values, not 0"),
        ("topk(4, n: x[n])", "topk(4, n: x[n] + float(j))", "cannot read its rank 'j'"),
    ],
)
def test_misuse_is_one_diagnostic(old: str, new: str, message: str) -> None:
    from fusec.dsl.diagnostics import DiagnosticError

    assert old in TOPK
    with pytest.raises(DiagnosticError) as err:
        check(parse(TOPK.replace(old, new, 1), "m.fuse"))
    rendered = err.value.render()
    assert message in rendered and rendered.startswith("m.fuse:"), rendered


GATHER = """\
region g(x: f32[E], z: f32[F]) -> y: f32
    const E = 8 in 8 .. 1024, F = 8 in 8 .. 1024
    launch workgroup 64
    i = argmax(e: x[e]) @ workgroup
    j = i + 1
    y = z[i] + z[j - 1]
"""


def test_an_index_of_a_selection_is_checked_as_an_index_variable() -> None:
    from fusec.dsl.bounds import overrun_at

    region = check(parse(GATHER, "g.fuse")).region("g")
    assert overrun_at(region, {"E": 8, "F": 8}) is None
    assert overrun_at(region, {"E": 1024, "F": 1024}) is None
    # constants that move apart, which no range states: refused before a run
    msg = overrun_at(region, {"E": 64, "F": 8})
    assert msg is not None and "index 'i' of 'z' reaches 63" in msg.message, msg
    from fusec.dsl.diagnostics import DiagnosticError

    with pytest.raises(DiagnosticError) as err:
        check(parse(GATHER.replace("y = z[i] + z[j - 1]", "y = z[j]"), "g.fuse"))
    assert "index 'j' of 'z' must be below" in err.value.render()


def test_a_constant_count_past_the_extent_is_refused_before_a_run() -> None:
    from fusec.dsl.bounds import overrun_at

    text = """\
region r(x: f32[E]) -> (v: f32[TK], i: u32[TK])
    const E = 64 in 2 .. 1024, TK = 2 in 1 .. 8
    launch workgroup 64
    v[j] = topk(TK, e: x[e]) @ workgroup
    i[j] = argtopk(TK, e: x[e]) @ workgroup
"""
    region = check(parse(text, "r.fuse")).region("r")
    assert region.all_stages()[0].indices[0].extent == ir.ConstRef(region.const("TK"))
    assert overrun_at(region, {"E": 8, "TK": 8}) is None
    msg = overrun_at(region, {"E": 3, "TK": 8})
    assert msg is not None and "topk keeps 8 values but 'e' has only 3" in msg.message, msg
    assert msg.span is not None and msg.span.line_col()[0] == 4  # at the topk
    rng = np.random.default_rng()
    x = rng.choice(np.array([-1.0, 0.5, 2.0], np.float32), 50)
    out = run_reference(region, {"x": x}, {"E": 50, "TK": 7})
    assert out["i"].tolist() == _order(x)[:7]
    np.testing.assert_array_equal(out["v"], x[_order(x)[:7]])
