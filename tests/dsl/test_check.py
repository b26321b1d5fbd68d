"""The checker's target limits: `check` applies the `Limits` it is given, and their defaults
(dsl/ on its own) are the values `codegen.build.check_source` derives from codegen/targets.py.
And the region IR it returns: every expression carries the span of its source text."""

from __future__ import annotations

from pathlib import Path

import pytest

from fusec.codegen.targets import TARGETS
from fusec.dsl import ir
from fusec.dsl.check import Limits, check
from fusec.dsl.diagnostics import DiagnosticError
from fusec.dsl.parse import parse

ROOT = Path(__file__).resolve().parent.parent.parent

SHARED = """\
region r(x: f32[N]) -> y: f32[N]
    const N = 4096
    launch workgroup 512, subgroup 64
    s[n] = x[n] * 2.0 in shared
    y[n] = s[n] + 1.0
"""

TILE = """\
region r(x: f32[T, 64]) -> y: f32[T, 16, 4]
    const T = 4
    launch workgroup 64, subgroup >= 2 else shared
    tile (i: 16, j: 4) lane j, slot i, per t
    a = x[t, j + 4 * i]
    b = a * 2.0
    s = sum(i: a * b)
    y[t, i, j] = b / s
"""

BUDGET = SHARED.replace("    s[n]", "    budget waves >= 12, vgprs <= 200\n    s[n]")


def _messages(text: str, limits: Limits) -> list[str]:
    with pytest.raises(DiagnosticError) as exc:
        check(parse(text, "r.fuse"), limits)
    return [d.message for d in exc.value.diagnostics]


def test_accepts_at_the_default_limits() -> None:
    for text in (SHARED, TILE, BUDGET):
        check(parse(text, "r.fuse"))


def test_defaults_are_the_known_targets_limits() -> None:
    known = TARGETS.values()
    assert Limits() == Limits(
        shared_bytes=min(t.max_shared_bytes for t in known),
        workgroup_size=max(t.max_workgroup_size for t in known),
        lane_registers=max(t.max_vgprs for t in known),
        waves_per_simd=max(t.max_waves_per_simd for t in known),
    )


def test_shared_bytes() -> None:
    assert _messages(SHARED, Limits(shared_bytes=8192)) == [
        "shared intermediate 's' [N] needs 16384 bytes at the default constants, more than the "
        "8192-byte shared-memory limit"
    ]


def test_workgroup_size() -> None:
    assert _messages(SHARED, Limits(workgroup_size=256)) == [
        "workgroup size must be a power of two from 1 to 256, not 512"
    ]


def test_subgroup_size() -> None:
    assert _messages(SHARED, Limits(max_subgroup_size=32)) == [
        "subgroup size must be a power of two up to 32, not 64"
    ]
    assert _messages(TILE, Limits(max_subgroup_size=2)) == [
        "a tile of 4 lanes is wider than any subgroup (2)"
    ]


def test_lane_registers() -> None:
    assert _messages(TILE, Limits(lane_registers=31)) == [
        "register tile too large: 2 value(s) read across 16 slots = 32 floats per lane, more "
        "than the 31 registers a lane has on any target"
    ]


def test_budget_ranges() -> None:
    assert _messages(BUDGET, Limits(waves_per_simd=8, lane_registers=128)) == [
        "impossible budget: waves >= 12",
        "impossible budget: vgprs <= 200",
    ]


def _text(e: ir.Expr) -> str:
    assert e.span is not None
    return e.span.source.text[e.span.start : e.span.end]


def test_expressions_carry_their_spans() -> None:
    text = (ROOT / "kernels.fuse").read_text()
    program = check(parse(text, "kernels.fuse"))
    for region in program.regions:
        for stage in region.all_stages():
            for e in ir.walk(stage.value):
                assert e.span is not None, (region.name, stage.name, e)


def test_a_subexpression_points_at_its_text() -> None:
    text = SHARED.replace("x[n] * 2.0", "-x[n] * (2.0 + N)")
    stage = check(parse(text, "r.fuse")).regions[0].stages[0]
    assert isinstance(stage, ir.Stage)
    assert [_text(e) for e in ir.walk(stage.value)] == [
        "-x[n] * (2.0 + N)",
        "-x[n]",
        "x[n]",
        "n",
        "2.0 + N",
        "2.0",
        "N",
    ]
