"""The diagnostics catalogue: every malformed input in tests/dsl/errors/ gives exit 1, the exact
expected stderr (FILE:LINE:COL, the line, a caret, a hint) and no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from fusec.runtime.cli import main
from tests.conftest import fusec_cli

ERRORS = Path(__file__).parent / "errors"
CASES = sorted(p.stem for p in ERRORS.glob("*.fuse"))


def test_catalogue_is_large_enough() -> None:
    assert len(CASES) >= 25
    assert all((ERRORS / f"{c}.err").exists() for c in CASES)


@pytest.mark.parametrize("case", CASES)
def test_malformed_input(
    case: str, root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rel = f"tests/dsl/errors/{case}.fuse"
    rc = main(["build", rel, "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 1
    assert "Traceback" not in err
    assert err == (ERRORS / f"{case}.err").read_text()
    assert not (tmp_path / "out").exists(), "nothing may be written on a diagnostic"
    if case != "no_region":
        assert err.startswith(f"{rel}:")


def test_no_traceback_from_the_console_command(root: Path, tmp_path: Path) -> None:
    proc = fusec_cli(
        [
            "build",
            "tests/dsl/errors/shape_mismatch.fuse",
            "-o",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
        cwd=root,
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith(
        "tests/dsl/errors/shape_mismatch.fuse:4:31: error: shape mismatch"
    )


def test_missing_file_is_one_sentence(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc = main(["build", str(tmp_path / "nope.fuse")])
    err = capsys.readouterr().err
    assert rc == 1
    assert err.startswith("fusec: error: cannot read") and "Traceback" not in err
