"""A path the file system refuses by its length (ENAMETOOLONG) is one sentence and exit 1 on
every command, never an internal error (a new-user probe: `fusec check`, `occupancy`, `bench`
and `export` of a 300-character name crashed where Path.is_dir raised)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.conftest import ROOT, fusec_cli

SCALE = ROOT / "tests" / "data" / "scale.fuse"


@pytest.mark.parametrize(
    "argv",
    [
        ["check", "{long}"],
        ["occupancy", "{long}"],
        ["bench", "{long}"],
        ["explain", "{long}", "--region", "scale"],
        ["fmt", "{long}"],
        ["tune", "{long}", "--region", "scale"],
        ["export", "{long}", "--c-header", "{tmp}/h.h"],
        ["build", "{long}", "-o", "{tmp}/out"],
        ["build", str(SCALE), "-o", "{tmp}/{name}"],
        ["occupancy", str(SCALE), "--plot", "{tmp}/{name}.png"],
        ["export", "{tmp}/missing", "--c-header", "{tmp}/{name}.h"],
    ],
)
def test_a_name_too_long_is_one_sentence(argv: list[str], tmp_path: Path) -> None:
    name = "x" * random.randint(256, 400)  # NAME_MAX is 255 on Linux file systems
    args = [a.format(long=str(tmp_path / name / "r.fuse"), tmp=tmp_path, name=name) for a in argv]
    run = fusec_cli(args, capture_output=True, text=True)
    assert run.returncode == 1, (run.returncode, run.stderr[-300:])
    assert "Traceback" not in run.stderr and "internal error" not in run.stderr
    assert run.stderr.startswith("fusec: error: "), run.stderr[-300:]
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing written
