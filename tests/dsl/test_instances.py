"""dsl/instances.py and dsl/schedule.py: instances of generic regions, their names, the schedule
lines that hold for each (most specific first), and finding an instance by its buffers' dtypes."""

from __future__ import annotations

import pytest

from fusec.dsl.check import check
from fusec.dsl.diagnostics import DiagnosticError
from fusec.dsl.parse import parse

TWO = """\
region r<Wt in f16, q8_0; At in f32, f16>(x: At[K], W: Wt[N, K]) -> y: f32[N]
    const K = 64 in 1 .. 4096, N = 32 in 1 .. 4096
    launch workgroup 64, subgroup any, rows_per_subgroup 1
    y[n] = sum(k: W[n, k] * x[k])                       layout n -> subgroup, k -> lane x 4
    schedule: workgroup 128
    schedule when At = f16: workgroup 256
    schedule when Wt = q8_0: rows_per_subgroup 2
    schedule on gfx1201 when At = f16: workgroup 32
"""


def test_two_dtype_parameters_make_every_combination_under_the_naming_rule() -> None:
    program = check(parse(TWO, "two.fuse"), known_targets=("gfx1201", "sm90"))
    got = {
        r.name: (
            r.instance.display,
            r.inputs[0].dtype.value,
            r.inputs[1].dtype.value,
            r.launch.workgroup_size,
            r.launch.rows_per_subgroup,
        )
        for r in program.regions
    }
    assert got == {
        # the first choice of every parameter keeps the region's name
        "r": ("r<f16, f32>", "f32", "f16", 128, 1),
        "r_f16_f16": ("r<f16, f16>", "f16", "f16", 256, 1),
        "r_f16_f16__gfx1201": ("r<f16, f16> on gfx1201", "f16", "f16", 32, 1),
        "r_q8_0_f32": ("r<q8_0, f32>", "f32", "q8_0", 128, 2),
        "r_q8_0_f16": ("r<q8_0, f16>", "f16", "q8_0", 256, 2),
        "r_q8_0_f16__gfx1201": ("r<q8_0, f16> on gfx1201", "f16", "q8_0", 32, 2),
    }
    # the q8_0 block raises K's lower bound in the q8_0 instances only
    assert {r.name: r.const("K").lo for r in program.regions if r.name.startswith("r_q8")} == {
        "r_q8_0_f32": 32,
        "r_q8_0_f16": 32,
        "r_q8_0_f16__gfx1201": 32,
    }
    assert program.region("r").const("K").lo == 1
    found = program.instance("r", {"W": "q8_0", "x": "f16"})
    assert found is not None and found.name == "r_q8_0_f16"
    on = program.instance("r", {"W": "q8_0", "x": "f16"}, target="gfx1201")
    assert on is not None and on.name == "r_q8_0_f16__gfx1201"
    # a target with no variant of its own takes the instance for every target
    other = program.instance("r", {"W": "q8_0", "x": "f16"}, target="sm90")
    assert other is not None and other.name == "r_q8_0_f16"
    assert program.instance("r", {"W": "q4_0"}) is None


def test_a_problem_in_every_instance_is_one_diagnostic_naming_them_all() -> None:
    bad = TWO.replace("x[k])", "x[n])")
    with pytest.raises(DiagnosticError) as e:
        check(parse(bad, "two.fuse"), known_targets=("gfx1201",))
    (d,) = e.value.diagnostics
    assert d.message.startswith("shape mismatch")
    assert d.note == (
        "in instances r<f16, f32>, r<f16, f16>, r<f16, f16> on gfx1201, r<q8_0, f32>, "
        "r<q8_0, f16>, r<q8_0, f16> on gfx1201"
    )
    assert d.render().endswith("\n  note: " + d.note)


def test_a_region_without_dtype_parameters_takes_its_unqualified_schedule_lines() -> None:
    text = TWO.replace("<Wt in f16, q8_0; At in f32, f16>", "").replace("At[K]", "f32[K]")
    text = text.replace("Wt[N, K]", "f16[N, K]")
    text = "\n".join(line for line in text.splitlines() if "when" not in line) + "\n"
    text += "    schedule on sm90: workgroup 512\n"
    program = check(parse(text, "plain.fuse"))
    r, on = program.regions
    assert (r.name, r.instance, r.launch.workgroup_size) == ("r", None, 128)
    assert on.instance is not None
    assert (on.name, on.instance.display, on.launch.workgroup_size) == ("r__sm90", "r on sm90", 512)
