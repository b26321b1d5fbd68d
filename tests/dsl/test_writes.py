"""Writes where they belong (dsl/check_writes.py, the reference's scatter): computed left-side
indices and masked writes, checked against plain numpy on random inputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fusec.dsl import ir
from fusec.dsl.check import check
from fusec.dsl.diagnostics import DiagnosticError
from fusec.dsl.parse import parse
from fusec.dsl.reference import run_reference

SOURCE = Path(__file__).parent.parent / "data" / "writes.fuse"


def _program(text: str) -> ir.Program:
    return check(parse(text, "t.fuse"))


def test_reference_routes_rows_to_three_outputs() -> None:
    region = check(parse(SOURCE.read_text(), str(SOURCE))).region("head_route")
    rng = np.random.default_rng()
    nq, nk, d, c, pos = 5, 3, 12, 7, 4
    x = rng.standard_normal((nq + 2 * nk, d)).astype(np.float32)
    kc = rng.standard_normal((nk, c, d)).astype(np.float32)
    vt = rng.standard_normal((nk, d, c)).astype(np.float32)
    consts = {"NQ": nq, "NK": nk, "D": d, "C": c, "pos": pos}
    out = run_reference(region, {"x": x, "kc": kc, "vt": vt}, consts)
    xs = x.astype(np.float64) * 2.0
    want_kc, want_vt = kc.copy(), vt.copy()
    want_kc[:, pos, :] = xs[nq : nq + nk] + 1.0
    want_vt[:, :, pos] = xs[nq + nk :] - 1.0
    np.testing.assert_allclose(out["q"], xs[:nq], rtol=1e-6)
    np.testing.assert_allclose(out["kc"], want_kc, rtol=1e-6)
    np.testing.assert_allclose(out["vt"], want_vt, rtol=1e-6)


def test_reference_interleaves_and_masks() -> None:
    program = check(parse(SOURCE.read_text(), str(SOURCE)))
    rng = np.random.default_rng()
    n, m, lo = 23, 3, 6
    a, b = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
    out = run_reference(program.region("edges"), {"a": a, "b": b}, {"N": n, "M": m, "lo": lo})
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    want_y = np.where((np.arange(n) < lo) | (np.arange(n) >= n - lo), a64, b64 * a64)
    np.testing.assert_allclose(out["y"], want_y, rtol=1e-6)
    want_z = np.empty((m, 2 * n))
    want_z[:, 1::2] = b64[None, :] + np.arange(m)[:, None]
    want_z[:, 0::2] = a64[None, :] - np.arange(m)[:, None]
    np.testing.assert_allclose(out["z"], want_z, rtol=1e-6)


def test_stage_records_index_and_mask() -> None:
    region = _program(SOURCE.read_text()).region("head_route")
    kc = [s for s in region.all_stages() if s.output is not None and s.output.name == "kc"]
    assert len(kc) == 1 and kc[0].writes_part
    assert kc[0].out_index is not None
    assert ir.format_expr(kc[0].out_index[0]) == "(head - NQ)"
    assert kc[0].mask is not None and kc[0].indices[0] is region.per


def test_plain_state_write_is_not_partial() -> None:
    text = """
region store(x: f32[K, D]) -> kc: state f32[K, C, D]
    const K = 2, D = 4, C = 8
    param pos in 0 .. 7
    launch workgroup 64
    kc[k, pos, d] = x[k, d]
"""
    (stage,) = _program(text).regions[0].all_stages()
    assert not stage.writes_part and stage.mask is None


@pytest.mark.parametrize(
    ("m_range", "fragment"),
    [
        # a gap only at the low end of M's range: M = 1 leaves y[1] .. y[3]
        (
            "1 .. 4",
            "y[1] (and 2 more) is never written, with every constant at the low end of its "
            "range: M = 1, N = 8",
        ),
        # an overlap only at the high end: M = 6 writes y[4] twice
        (
            "4 .. 6",
            "element y[4] is written by this stage (at i = 4) and by the stage on line 5 (at "
            "i = 4), with every constant at the high end of its range: M = 6, N = 8",
        ),
    ],
)
def test_coverage_is_checked_at_every_setting(m_range: str, fragment: str) -> None:
    text = f"""
region split(a: f32[N]) -> y: f32[N]
    const N = 8, M = 4 in {m_range}
    launch workgroup 64
    y[i] = a[i] where i < M
    y[i] = a[i] * 2.0 where i >= 4
"""
    _program(text.replace(f"in {m_range}", "in 4 .. 4"))  # fine at M = 4 alone
    with pytest.raises(DiagnosticError) as err:
        _program(text)
    assert [fragment in d.message for d in err.value.diagnostics] == [True], [
        d.message for d in err.value.diagnostics
    ]


def test_accepts_disjoint_masks_over_a_param() -> None:
    text = """
region head(x: f32[N]) -> (y: state f32[N])
    const N = 16 in 1 .. 64
    param p in 0 .. 63
    launch workgroup 64
    y[i] = x[i] where i < p
    y[i] = x[i] * 2.0 where i > p
"""
    _program(text)


def test_a_mask_that_only_bounds_an_index_is_dropped() -> None:
    region = _program(SOURCE.read_text()).region("spread")
    (stage,) = region.all_stages()
    assert stage.mask is None and [v.name for v in stage.indices] == ["i", "j"]
    assert ir.format_expr(stage.indices[1].extent) == "4"
    x = np.random.default_rng().standard_normal(7).astype(np.float32)
    out = run_reference(region, {"x": x}, {"N": 7})
    want = (x.astype(np.float64)[:, None] * (1.0 + np.arange(4))[None, :]).reshape(-1)
    np.testing.assert_allclose(out["y"], want, rtol=1e-6)


@pytest.mark.parametrize(
    ("consts", "words"),
    [
        ({"NQ": 6, "G": 4}, "8 element(s) of 'mp' are never written"),  # G does not divide NQ
        ({"NQ": 8, "G": 4}, None),
    ],
)
def test_run_values_that_break_coverage_are_named(consts: dict[str, int], words: str) -> None:
    from fusec.dsl.bounds import overrun_at
    from fusec.dsl.reference import const_values

    kernels = Path(__file__).parents[2] / "kernels.fuse"
    region = check(parse(kernels.read_text(), "kernels.fuse")).region("attention_split_gqa")
    problem = overrun_at(region, const_values(region, {**consts, "C": 16, "D": 8, "NS": 4}))
    if words is None:
        assert problem is None
    else:
        assert problem is not None and problem.message.endswith(words), problem
        assert problem.span is not None and problem.span.path == "kernels.fuse"
