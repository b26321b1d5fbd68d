"""An `instance` line's own schedule block, and schedule lines naming a stage group's inner
stages (README "Dtype-generic regions and schedule lines", "Stage groups")."""

from __future__ import annotations

import attrs

from fusec.dsl import syntax as S
from fusec.dsl.check import check
from fusec.dsl.compose import expand_groups
from fusec.dsl.instances import expand_instances
from fusec.dsl.parse import parse

SOURCE = """\
stages swiglu(x: f32[H], Wg: Wt[F, H], Wu: Wt[F, H]) -> h: f32[F]
    gate[f] = sum(k: Wg[f, k] * x[k])  layout f -> subgroup, k -> lane x 8
    up[f]   = sum(k: Wu[f, k] * x[k])  layout f -> subgroup, k -> lane x 8
    h[f]    = silu(gate[f]) * up[f]

region ffn<Wt in f16, q4_0>(x: f32[H], Wg: Wt[F, H], Wu: Wt[F, H]) -> h: f32[F]
    const H = 96 in 1 .. 4096, F = 24 in 1 .. 4096
    launch workgroup 64, subgroup any, rows_per_subgroup 2
    h = swiglu(x, Wg, Wu)
    schedule when Wt = q4_0: x in shared as q8_0
    schedule when Wt = q4_0: gate, up layout k -> lane x 32
    schedule when Wt = q4_0: int8 dot

instance ffn_q4_0_dequant = ffn<q4_0> with F = 40
    schedule: gate, up layout k -> lane x 16
    schedule: rows_per_subgroup 4
"""


def _regions(text: str) -> dict[str, S.Region]:
    module = parse(text, "t.fuse")

    def expand(bound: tuple[S.Region, ...]) -> tuple[S.Region, ...]:
        return expand_groups(attrs.evolve(module, regions=bound)).regions

    regions, diags = expand_instances(module, None, expand)
    assert diags == []
    return {r.name: r for r in regions}


def _stage(r: S.Region, name: str) -> S.Stage:
    return next(s for s in r.stages if isinstance(s, S.Stage) and s.name == name)


def _vector(st: S.Stage, index: str) -> int | None:
    return next(it.vector for it in st.layout if it.index == index)


def test_an_instance_block_replaces_the_regions_schedule_lines() -> None:
    regions = _regions(SOURCE)
    assert list(regions) == ["ffn", "ffn_q4_0", "ffn_q4_0_dequant"]
    staged, own = regions["ffn_q4_0"], regions["ffn_q4_0_dequant"]
    # the region's lines: x staged as q8_0, 32 per lane, the launch line's 2 rows
    assert [s.name for s in staged.stages] == ["xq", "gate", "up", "h"]
    assert _vector(_stage(staged, "gate"), "k") == 32
    assert {it.key: it.values for it in staged.launch}["rows_per_subgroup"] == (2,)
    # the instance's own lines instead: no staging, 16 per lane, 4 rows, its constant default
    assert [s.name for s in own.stages] == ["gate", "up", "h"]
    assert _vector(_stage(own, "gate"), "k") == _vector(_stage(own, "up"), "k") == 16
    assert {it.key: it.values for it in own.launch}["rows_per_subgroup"] == (4,)
    assert {c.name: c.value.value for c in own.consts}["F"] == 40
    assert own.instance == S.Instance("ffn", (("Wt", "q4_0"),))
    # the f16 instance keeps the group's layout
    assert _vector(_stage(regions["ffn"], "gate"), "k") == 8
    # all three check, the group's Wt taking each instance's dtype
    program = check(parse(SOURCE, "t.fuse"))
    assert [r.name for r in program.regions] == list(regions)


def test_a_schedule_line_names_a_group_stage_by_its_name_after_expansion() -> None:
    # the region has a stage 'gate' of its own, so the group's becomes 'swiglu_gate'
    text = SOURCE.split("instance")[0].replace(
        "    h = swiglu(x, Wg, Wu)\n",
        "    gate[f] = x[f] * 2.0\n    hs = swiglu(gate, Wg, Wu)\n    h[f] = hs[f]\n",
    )
    text = text.replace("gate, up layout k -> lane x 32", "swiglu_gate, up layout k -> lane x 16")
    text = text.replace("    schedule when Wt = q4_0: x in shared as q8_0\n", "")
    text = text.replace("    schedule when Wt = q4_0: int8 dot\n", "")
    text = text.replace("const H = 96 in 1 .. 4096, F = 24", "const H = 96 in 1 .. 4096, F = 96")
    regions = _regions(text)
    q4 = regions["ffn_q4_0"]
    assert _vector(_stage(q4, "swiglu_gate"), "k") == _vector(_stage(q4, "up"), "k") == 16
    assert _vector(_stage(regions["ffn"], "swiglu_gate"), "k") == 8
