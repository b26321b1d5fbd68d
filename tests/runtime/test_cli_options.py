"""Command-line values a second new-user probe found taken silently or refused late: a
constant given twice, digits of other scripts, the same file for --plot and --html, and u32
params printed as reals (runtime/cli.py)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.conftest import ROOT, fusec_cli

SCALE = ROOT / "tests" / "data" / "scale.fuse"


def test_a_const_given_twice_is_refused() -> None:
    a, b = random.sample(range(1, 900), 2)
    run = fusec_cli(
        ["check", str(SCALE), "--const", f"N={a}", "--const", f"N={b}"],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 1 and run.stdout == ""
    assert run.stderr == (
        "fusec: error: --const N is given twice\n  hint: give each constant one --const\n"
    )


@pytest.mark.parametrize("value", ["\uff11\uff10\uff10", "\u0661\u0660", "1\u00b2"])
def test_digits_of_other_scripts_are_no_value(value: str) -> None:
    run = fusec_cli(["check", str(SCALE), "--const", f"N={value}"], capture_output=True, text=True)
    assert run.returncode == 1 and run.stdout == ""
    assert run.stderr.startswith(f"fusec: error: --const takes NAME=VALUE, not 'N={value}'")


def test_plot_and_html_on_one_file_are_refused_before_writing(tmp_path: Path) -> None:
    same = tmp_path / "same.png"
    run = fusec_cli(
        ["occupancy", str(SCALE), "--plot", str(same), "--html", str(same)],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert run.stderr.startswith(f"fusec: error: --plot and --html name the same file {same}")
    assert not same.exists()


@pytest.mark.shaderc
@pytest.mark.vulkan
def test_u32_param_points_are_printed_as_integers(tmp_path: Path) -> None:
    src = tmp_path / "p.fuse"
    src.write_text(
        "region p(x: f32[N]) -> y: f32[N]\n"
        "    const N = 64 in 1 .. 256\n"
        "    param pos in 0 .. 4294967295\n"
        "    launch workgroup 64\n"
        "    y[n] = x[n] * 2.0 + float(pos % 7)\n"
    )
    run = fusec_cli(["check", str(src)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    first = run.stdout.splitlines()[1]
    assert first == (
        "p: run-time params checked at pos=0; pos=1; pos=2147483647; pos=4294967295; "
        "the worst follows"
    ), first
