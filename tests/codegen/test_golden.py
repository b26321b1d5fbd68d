"""Goldens: the kernel IR and the GLSL of every region of kernels.fuse, compared exactly with
tests/golden/<region>.kir and tests/golden/<region>.glsl.txt (what `fusec build kernels.fuse
--dump kir|glsl --region R` prints).  A change to lowering or to the GLSL printer shows up here
as a diff to review like code; `pytest --update-golden` rewrites the files.

Only regions with a golden file are compared; `test_every_region_has_a_golden` lists the regions
without one (a region just added asks for `--update-golden`) and golden files of regions that no
longer exist."""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

from fusec.codegen.build import check_source
from fusec.codegen.dump import DUMPS, dump_region
from fusec.dsl import ir
from tests.conftest import ROOT

GOLDEN = ROOT / "tests" / "golden"
SUFFIX = {"kir": ".kir", "glsl": ".glsl.txt"}
DIFF_LINES = 40  # of a failing comparison's unified diff


def _program() -> ir.Program:
    return check_source((ROOT / "kernels.fuse").read_text(), "kernels.fuse")


def golden_path(region: str, what: str) -> Path:
    return GOLDEN / f"{region}{SUFFIX[what]}"


def golden_regions() -> list[str]:
    """Regions with a golden file of either kind, sorted."""
    names = {p.name.removesuffix(s) for s in SUFFIX.values() for p in GOLDEN.glob(f"*{s}")}
    return sorted(names)


def write_goldens(program: ir.Program) -> None:
    """Every region's goldens from `program`; golden files of other regions are removed."""
    GOLDEN.mkdir(exist_ok=True)
    keep = set()
    for region in program.regions:
        for what in DUMPS:
            path = golden_path(region.name, what)
            path.write_text(dump_region(region, what))
            keep.add(path)
    for s in SUFFIX.values():
        for path in GOLDEN.glob(f"*{s}"):
            if path not in keep:
                path.unlink()


def compare(expected: str, actual: str, name: str) -> str | None:
    """None when equal, else a message: the first lines of a unified diff and how to update."""
    if expected == actual:
        return None
    diff = list(
        difflib.unified_diff(
            expected.splitlines(),
            actual.splitlines(),
            f"tests/golden/{name} (golden)",
            f"{name} (now)",
            lineterm="",
        )
    )
    shown = diff[:DIFF_LINES]
    more = len(diff) - len(shown)
    return "\n".join(
        [
            f"{name} differs from its golden:",
            *shown,
            *([f"... {more} more diff lines"] if more > 0 else []),
            "If the change is intended, run `.venv/bin/pytest tests/codegen/test_golden.py "
            "--update-golden` and review the golden diff like code.",
        ]
    )


@pytest.fixture(scope="module")
def program() -> ir.Program:
    return _program()


@pytest.mark.parametrize("what", DUMPS)
@pytest.mark.parametrize("region", golden_regions())
def test_golden(
    region: str, what: str, program: ir.Program, request: pytest.FixtureRequest
) -> None:
    path = golden_path(region, what)
    known = {r.name: r for r in program.regions}
    if region not in known:
        if request.config.getoption("--update-golden"):
            path.unlink(missing_ok=True)
            return
        pytest.fail(
            f"tests/golden/{path.name}: kernels.fuse has no region '{region}'; run "
            "`.venv/bin/pytest tests/codegen/test_golden.py --update-golden` to remove it",
            pytrace=False,
        )
    actual = dump_region(known[region], what)
    if request.config.getoption("--update-golden"):
        path.write_text(actual)
        return
    if not path.is_file():
        pytest.fail(
            f"tests/golden/{path.name} is missing; run `.venv/bin/pytest "
            "tests/codegen/test_golden.py --update-golden`",
            pytrace=False,
        )
    problem = compare(path.read_text(), actual, path.name)
    if problem is not None:
        pytest.fail(problem, pytrace=False)


def test_every_region_has_a_golden(program: ir.Program, request: pytest.FixtureRequest) -> None:
    if request.config.getoption("--update-golden"):
        write_goldens(program)
    have = set(golden_regions())
    missing = [r.name for r in program.regions if r.name not in have]
    if missing:
        pytest.fail(
            f"{len(missing)} region(s) of kernels.fuse have no golden in tests/golden/: "
            + ", ".join(missing)
            + "; run `.venv/bin/pytest tests/codegen/test_golden.py --update-golden` and "
            "review the new files",
            pytrace=False,
        )


def test_a_changed_kernel_fails_with_a_diff_and_the_update_command() -> None:
    lines = [f"line {i}" for i in range(200)]
    before = "\n".join(lines) + "\n"
    after = before.replace("line 7\n", "line seven\n").replace("line 150\n", "")
    message = compare(before, after, "r.kir")
    assert message is not None
    assert message.splitlines()[0] == "r.kir differs from its golden:"
    assert "-line 7" in message and "+line seven" in message
    assert "--update-golden" in message.splitlines()[-1]
    assert compare(before, before, "r.kir") is None
    # a long diff is cut after DIFF_LINES lines, saying how much is left
    long_after = "\n".join(f"other {i}" for i in range(200)) + "\n"
    cut = compare(before, long_after, "r.kir")
    assert cut is not None and "more diff lines" in cut
    assert len(cut.splitlines()) == DIFF_LINES + 3
