"""dsl/compose.py: stage groups expand into the stages one would have written by hand (the same
region IR), inner names keep theirs or take a deterministic prefix, constants default to the
group's, placements at a use replace the group's, spans record the uses, `fusec fmt` lays the
syntax out, and a group used twice with two placements runs on lavapipe at subgroups 4, 8, 16.
The diagnostics are in the catalogue (tests/dsl/errors/stages_*)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fusec.dsl import syntax as S
from fusec.dsl.check import check
from fusec.dsl.compose import expand_groups
from fusec.dsl.format import format_source
from fusec.dsl.parse import parse, parse_file
from tests.conftest import ROOT, check_on_lavapipe
from tests.dsl.test_format import dump_ir

GROUPS = ROOT / "tests" / "data" / "stage_groups.fuse"


def _stages(region: S.Region) -> list[S.Stage]:
    return [
        x
        for item in region.stages
        for x in (item.stages if isinstance(item, S.Repeat) else (item,))
    ]


def test_two_uses_rename_the_second_and_keep_their_placements() -> None:
    module = expand_groups(parse_file(GROUPS))
    (region,) = module.regions
    stages = {st.name: st for st in _stages(region)}
    assert [st.name for st in _stages(region)] == ["ss", "a", "rms_norm_ss", "b", "p", "q", "y"]
    # the group's reads of x and g became the arguments, its K the region's
    a_value, b_value = repr(stages["a"].value), repr(stages["b"].value)
    assert "Access(name='g1'" in a_value and "Name(id='K')" in a_value
    assert "Access(name='g2'" in b_value and "Name(id='rms_norm_ss')" in b_value
    assert "g1" not in b_value and "Name(id='ss')" not in b_value
    a, b = stages["a"], stages["b"]
    assert a.placement is not None and a.placement.id == "shared" and a.stored is None
    assert b.placement is not None and b.placement.id == "shared"
    assert b.stored is not None and b.stored.id == "q8_0"
    # the region's eps (1e-5) replaces the group's (1e-6), which is not added again
    eps = [c for c in region.consts if c.name == "eps"]
    assert len(eps) == 1 and eps[0].value.value == 1e-5
    # every expanded span names its use, the region's own stages none
    assert a.span.via and str(a.span.via[0]).endswith(":16:5")
    assert b.span.via and str(b.span.via[0]).endswith(":17:5")
    assert stages["p"].span.via == ()


def test_a_group_constant_the_region_lacks_is_added() -> None:
    src = GROUPS.read_text().replace(", eps = 1e-5", "")
    (region,) = expand_groups(parse(src, "t.fuse")).regions
    eps = [c for c in region.consts if c.name == "eps"]
    assert len(eps) == 1 and eps[0].value.value == 1e-6
    assert region.consts[-1].name == "eps"  # after the region's own


def test_a_third_use_takes_the_next_prefix() -> None:
    src = GROUPS.read_text().replace(
        "    p[n] = ", "    c    = rms_norm(x, g1)  in shared\n    p[n] = "
    )
    (region,) = expand_groups(parse(src, "t.fuse")).regions
    names = [st.name for st in _stages(region)]
    assert names[:6] == ["ss", "a", "rms_norm_ss", "b", "rms_norm2_ss", "c"]


def test_nested_uses_record_every_use_innermost_first() -> None:
    module = expand_groups(parse_file(ROOT / "kernels.fuse"))
    region = next(r for r in module.regions if r.name == "qkv_rope")
    ss = next(st for st in _stages(region) if st.name == "ss")
    lines = [s.line_col()[0] for s in (ss.span, *ss.span.via)]
    text = (ROOT / "kernels.fuse").read_text().splitlines()
    assert text[lines[0] - 1].lstrip().startswith("ss ")  # in rms_norm
    assert "rms_norm(x, g)" in text[lines[1] - 1]  # in head_rows
    assert "head_rows(x, g, W, head)" in text[lines[2] - 1]  # in head_rows_sumsq
    assert "head_rows_sumsq(x, g, W, head)" in text[lines[3] - 1]  # in qkv_rope


# The regions of kernels.fuse as written before stage groups (main at 7631142): a use expands
# into the same region IR, so the same kernels (the build compared every .spv byte for byte).
WRITTEN_OUT = Path(__file__).parent / "compose_written.fuse"


@pytest.mark.parametrize(
    "name", ["rope_kv_store_qk_v", "dsv4_hc_comb_slots", "attention_split_combine"]
)
def test_a_use_checks_to_the_region_written_out(name: str) -> None:
    written = next(r for r in check(parse_file(WRITTEN_OUT)).regions if r.name == name)
    used = next(r for r in check(parse_file(ROOT / "kernels.fuse")).regions if r.name == name)
    assert dump_ir(used) == dump_ir(written)


MESSY = """stages  pair( x : f32[K] )->( a:f32[K] , b:f32[K] )
  a[k]=2.0*x[k]
  b[k] = a[k]+x[k]   in shared

region r(x: f32[K]) -> y: f32[K]
  const K = 8
  launch workgroup 64
  (u,v)=pair(x)   in shared
  y[k]=u[k]+v[k]
"""


def test_fmt_lays_out_groups_and_uses() -> None:
    formatted = format_source(MESSY, "m.fuse")
    assert formatted.splitlines() == [
        "stages pair(x: f32[K]) -> (a: f32[K], b: f32[K])",
        "    a[k] = 2.0 * x[k]",
        "    b[k] = a[k] + x[k]                                  in shared",
        "",
        "region r(x: f32[K]) -> y: f32[K]",
        "    const K = 8",
        "    launch workgroup 64",
        "    (u, v) = pair(x)                                    in shared",
        "    y[k]   = u[k] + v[k]",
    ]
    assert format_source(formatted, "m.fuse") == formatted
    assert parse(formatted, "m.fuse") == parse(MESSY, "m.fuse")


@pytest.mark.vulkan
@pytest.mark.slow
@pytest.mark.parametrize(("width", "subgroup"), [(128, 4), (256, 8), (512, 16)])
def test_two_uses_on_lavapipe(root: Path, width: int, subgroup: int) -> None:
    """LP_NATIVE_VECTOR_WIDTH sets lavapipe's subgroup size (bits / 32); K and N away from
    the defaults and from multiples of the workgroup."""
    out = check_on_lavapipe(
        ["tests/data/stage_groups.fuse", "--const", "K=480", "--const", "N=37"], width, subgroup
    )
    assert "two_norms [K=480, N=37, eps=1e-05]: fused;" in out
    assert re.search(r"\n  y: max rel err fused \S+, unfused \S+ \(tol [^)]*\) ok\n", out)


def test_the_decisions_are_recorded_per_use() -> None:
    module = expand_groups(parse_file(GROUPS))
    first, second = module.expansions
    assert (first.group, first.into, second.group, second.into) == (
        "rms_norm",
        "two_norms",
        "rms_norm",
        "two_norms",
    )
    assert dict(first.renames) == {"xn": "a", "ss": "ss"}
    assert dict(second.renames) == {"xn": "b", "ss": "rms_norm_ss"}
    args = {k: v.id for k, v in second.arguments if isinstance(v, S.Name)}
    assert args == {"x": "x", "g": "g2", "K": "K"}
    assert first.added_consts == second.added_consts == ()
