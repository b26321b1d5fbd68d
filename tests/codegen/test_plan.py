"""codegen/plan.py: the scheduling plan is the one source of the GLSL printer's loop decisions.
A knob set other than the build's code profile changes the plan, the GLSL renders that plan
(unroll counts and load widths visible in the text), the kernel-IR dump prints the same plan,
and the code so changed still computes what the numpy reference does (lavapipe)."""

from __future__ import annotations

import re
from pathlib import Path

import attrs
import pytest

from fusec.codegen import glsl, glsl_writer, plan
from fusec.codegen.build import build_source, check_source, write_build
from fusec.codegen.dump import dump_region, lower_region
from fusec.codegen.kir_print import format_kernel, format_kexpr
from fusec.codegen.lower import lower_fused
from fusec.codegen.targets import CODE_PROFILE, TARGETS, CodeKnobs
from fusec.dsl import ir
from fusec.dsl.check import check
from fusec.dsl.parse import parse
from fusec.runtime.device import Device
from fusec.runtime.dispatch import Build
from fusec.runtime.verify import check_region
from tests.conftest import ROOT

TEXT = """
region mv(x: f32[K], W: f16[N, K]) -> y: f32[N]
    const K = 4096 in 1 .. 12288, N = 64 in 1 .. 4096
    launch workgroup 64, subgroup any, rows_per_subgroup 2
    y[n] = sum(k: W[n, k] * x[k]) @ subgroup            layout n -> subgroup, k -> lane x 8

region ffn_q4_0(x: f32[H], Wg: q4_0[F, H], Wu: q4_0[F, H]) -> h: f32[F]
    const H = 1024 in 32 .. 16384, F = 40 in 1 .. 4096
    launch workgroup 64, subgroup any, rows_per_subgroup 1
    xq[k]   = x[k]                                      in shared as q8_0
    gate[f] = sum(k: Wg[f, k] * xq[k])                  layout f -> subgroup, k -> lane x 32
    up[f]   = sum(k: Wu[f, k] * xq[k])                  layout f -> subgroup, k -> lane x 32
    h[f]    = silu(gate[f]) * up[f]

region rowsum(x: f32[N, 6]) -> y: f32[N]
    const N = 64 in 1 .. 4096
    launch workgroup 64
    y[n] = sum(j: x[n, j]) * 0.5                        layout n -> lane
"""


def _region(name: str) -> ir.Region:
    return next(r for r in check(parse(TEXT, "plan.fuse")).regions if r.name == name)


def _knobs(**changes: int) -> CodeKnobs:
    return attrs.evolve(CODE_PROFILE, **changes)


def _unrolled_steps(text: str) -> int:
    """Steps of the mv kernel's unrolled loop in its GLSL (1: no unrolled loop)."""
    heads = re.findall(r"for \(; k0 \+ (\d+)u \* gl_SubgroupSize \* 8u \+ 8u <= c_K; \)", text)
    if not heads:
        assert "k0 += gl_SubgroupSize * 8u;" not in text
        return 1
    (head,) = heads
    assert text.count("k0 += gl_SubgroupSize * 8u;") == int(head) + 1
    return int(head) + 1


def _unrolled_blocks(text: str) -> int:
    """Blocks of the ffn kernel's unrolled integer dot product loop in its GLSL."""
    heads = re.findall(r"for \(; k0 \+ (\d+)u \* gl_SubgroupSize < \(\(c_H\) / 32u\); \)", text)
    if not heads:
        assert not re.search(r"k0 \+= \d+u \* gl_SubgroupSize;", text)
        return 1
    (head,) = heads
    assert f"k0 += {int(head) + 1}u * gl_SubgroupSize;" in text
    return int(head) + 1


def test_the_build_renders_the_code_profile_and_targets_carry_knobs() -> None:
    (k,) = lower_fused(_region("mv"))
    assert glsl.emit_glsl(k) == glsl.emit_glsl(k, plan=plan.plan_kernel(k, CODE_PROFILE))
    assert plan.plan_kernel(k) is plan.plan_kernel(k, CODE_PROFILE)  # planned once
    assert TARGETS["sm90"].knobs == CODE_PROFILE  # the profile was tuned on the H200
    other = plan.plan_kernel(k, _knobs(loads_in_flight=2))
    assert other != plan.plan_kernel(k) and other.knobs.loads_in_flight == 2


@pytest.mark.parametrize(
    ("changes", "steps"),
    [
        ({}, 4),  # 8 loads in flight over 2 rows of W: 4 steps
        ({"loads_in_flight": 4}, 2),
        ({"loads_in_flight": 2}, 1),
        ({"loads_in_flight": 16, "max_unroll": 3}, 3),
    ],
)
def test_loads_in_flight_set_the_unroll_the_glsl_and_dump_show(
    changes: dict[str, int], steps: int
) -> None:
    (k,) = lower_fused(_region("mv"))
    p = plan.plan_kernel(k, _knobs(**changes))
    (contract,) = p.phases
    assert isinstance(contract, plan.ContractPlan)
    (loop,) = contract.loops
    assert isinstance(loop, plan.StepLoop)
    assert loop.unroll == steps and loop.tail and not loop.whole_blocks
    assert [w.load.buffer.name for w in loop.wide] == ["W", "x"]
    assert _unrolled_steps(glsl.emit_glsl(k, line_directives=False, plan=p)) == steps
    assert f"wide path if K % 8 == 0: unroll {steps} steps" in format_kernel(k, p)
    # the dump of the region prints the same plan under the same knobs
    # the dumps of the region (fused kernel first, then the unfused chain's) under the same knobs
    kir_dump = dump_region(_region("mv"), "kir", _knobs(**changes))
    assert kir_dump.split("\n\nkernel ")[0] == format_kernel(k, p).rstrip("\n")
    glsl_dump = dump_region(_region("mv"), "glsl", _knobs(**changes))
    assert _unrolled_steps(glsl_dump.split("// ---- mv.unfused")[0]) == steps


@pytest.mark.parametrize(
    ("words", "blocks"),
    [(40, 4), (20, 2), (10, 1), (30, 3)],  # gate + up of q4_0: 2 x 5 words a block
)
def test_int_dot_words_set_the_blocks_unrolled(words: int, blocks: int) -> None:
    (k,) = lower_fused(_region("ffn_q4_0"))
    p = plan.plan_kernel(k, _knobs(int_dot_words=words))
    loop = next(c for c in p.phases if isinstance(c, plan.ContractPlan)).loops[0]
    assert isinstance(loop, plan.IntDotLoop)
    assert loop.unroll == blocks
    assert [t.read for t in loop.terms] == [plan.BlockRead.BLK_Q4_0] * 2
    assert _unrolled_blocks(glsl.emit_glsl(k, line_directives=False, plan=p)) == blocks
    assert f"unroll {blocks} blocks" in format_kernel(k, p)


@pytest.mark.parametrize(("load_bytes", "view"), [(16, "u4"), (8, "u2"), (4, "u1")])
def test_widest_load_sets_the_views(load_bytes: int, view: str) -> None:
    (k,) = lower_fused(_region("mv"))
    p = plan.plan_kernel(k, _knobs(max_load_bytes=load_bytes))
    text = glsl.emit_glsl(k, line_directives=False, plan=p)
    views = set(re.findall(r"b_(?:W|x)_u\d", text))
    assert views == {f"b_W_{view}", f"b_x_{view}"}
    # a step reads 8 f16 of each of 2 rows of W (16 bytes a row) and 8 f32 of x (32 bytes);
    # wide steps: the 4 unrolled and the loop's own
    assert text.count(f" = b_W_{view}[") == 5 * 2 * (16 // load_bytes)
    assert text.count(f" = b_x_{view}[") == 5 * (32 // load_bytes)
    assert f"W[n, k] ({load_bytes}-byte loads, per row)" in format_kernel(k, p)


@pytest.mark.parametrize(("limit", "unrolled"), [(8, True), (6, True), (5, False)])
def test_serial_unroll_sets_the_lane_loop_hint(limit: int, unrolled: bool) -> None:
    (k,) = lower_fused(_region("rowsum"))
    p = plan.plan_kernel(k, _knobs(serial_unroll=limit))
    (loop,) = p.lane_loops
    assert loop.unrolled == unrolled and loop.extent == ir.Lit(6, loop.extent.dtype)
    text = glsl.emit_glsl(k, line_directives=False, plan=p)
    hint = "[[unroll]]" if unrolled else "[[dont_unroll]]"
    assert text.count(f"{hint} for (uint i_j = 0u; i_j < 6u; ++i_j)") == 1
    assert text.count("for (uint i_j") == 1
    dumped = format_kernel(k, p)
    assert f"plan: lane loops, {'unrolled' if unrolled else 'kept loops'} over 6u" in dumped


def test_the_printer_decides_nothing() -> None:
    """No knob, unroll rule or load choice left in the GLSL printer's modules: they render
    `plan.KernelPlan` and read no target."""
    for path in sorted((ROOT / "codegen").glob("glsl*.py")):
        text = path.read_text()
        for word in (
            "LOADS_IN_FLIGHT",
            "INT_DOT_WORDS",
            "min(4,",
            "SERIAL_UNROLL",
            "serial_loop_hint",
            "int_dot_terms",
            "vector_loads",
            "block_words",
            "targets",
            "CODE_PROFILE",
        ):
            assert word not in text, (path.name, word)


@pytest.mark.shaderc
@pytest.mark.vulkan
@pytest.mark.parametrize(
    ("region", "changes", "consts"),
    [
        ("mv", {"loads_in_flight": 4}, {"K": 2048, "N": 37}),  # the wide, unrolled path
        ("mv", {"loads_in_flight": 16, "max_unroll": 3}, {"K": 1000, "N": 21}),  # plain + tail
        ("mv", {"max_load_bytes": 8}, {"K": 1496, "N": 64}),
        ("ffn_q4_0", {"int_dot_words": 30}, {"H": 32 * 37, "F": 19}),
        ("ffn_q4_0", {"int_dot_words": 10}, {"H": 32 * 21, "F": 40}),
        ("rowsum", {"serial_unroll": 2}, {"N": 77}),
    ],
)
def test_a_changed_plan_still_matches_the_reference(
    dev: Device,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    region: str,
    changes: dict[str, int],
    consts: dict[str, int],
) -> None:
    """A build rendered with other knobs (the build renders the code profile: this test swaps
    the printer's plan for its own) runs on lavapipe and matches the numpy reference."""
    knobs = _knobs(**changes)
    monkeypatch.setattr(glsl, "plan_kernel", lambda k: plan.plan_kernel(k, knobs))
    result = build_source(TEXT, "plan.fuse")
    fused = next(b for b in result.kernels if b.kernel.name == region)
    planned = plan.plan_kernel(fused.kernel, knobs)
    # the build rendered this plan
    if region == "rowsum":
        assert "[[dont_unroll]] for (uint i_j" in fused.glsl and "[[unroll]]" not in fused.glsl
    else:
        contract = next(p for p in planned.phases if isinstance(p, plan.ContractPlan))
        unrolled = _unrolled_steps if region == "mv" else _unrolled_blocks
        assert unrolled(fused.glsl) == contract.loops[0].unroll
    out = write_build(result, tmp_path / "b")
    rep = check_region(dev, Build.load(out), result.program.region(region), consts)
    assert rep.path == "fused"
    assert rep.ok, [(o.name, o.fused_error, o.unfused_error) for o in rep.outputs]


def test_every_planned_lane_loop_is_rendered(monkeypatch: pytest.MonkeyPatch) -> None:
    """The dump's `plan: lane loops` line lists what the GLSL has: over every kernel of
    kernels.fuse, the extents the printer asks the plan about are the plan's lane loops."""
    asked: list[ir.Expr] = []
    original = glsl_writer.KernelWriter.serial_hint

    def serial_hint(self: glsl_writer.KernelWriter, extent: ir.Expr) -> str:
        asked.append(extent)
        return original(self, extent)

    monkeypatch.setattr(glsl_writer.KernelWriter, "serial_hint", serial_hint)
    program = check_source((ROOT / "kernels.fuse").read_text(), "kernels.fuse")
    planned = 0
    for region in program.regions:
        for k in lower_region(region):
            asked.clear()
            p = plan.plan_kernel(k)
            glsl.emit_glsl(k, line_directives=False, plan=p)
            assert {format_kexpr(e) for e in asked} == {
                format_kexpr(x.extent) for x in p.lane_loops
            }, k.name
            planned += len(p.lane_loops)
    assert planned >= 20  # kernels.fuse has lane loops over literals and over constants
