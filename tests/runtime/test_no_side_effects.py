"""`fusec build -o X`, `occupancy` and `check` change nothing outside the folder they build
(issue 13): whatever is at X (nothing, an empty folder, a file, a FIFO, a symbolic link, a
foreign folder, an earlier build), and whatever lies beside it (a CMake `build/` folder)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from fusec.runtime.cli import main
from tests.conftest import ROOT, vulkan_device_name

pytestmark = pytest.mark.shaderc

SOURCE = (ROOT / "tests" / "data" / "scale.fuse").read_text()  # a small region


def _snapshot(root: Path) -> dict[str, tuple[int, bytes | str | None, int]]:
    """Every entry under root: (file type, contents or link target, mtime)."""
    out: dict[str, tuple[int, bytes | str | None, int]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            kind = stat.S_IFMT(st.st_mode)
            content: bytes | str | None = None
            if stat.S_ISREG(st.st_mode):
                content = p.read_bytes()
            elif stat.S_ISLNK(st.st_mode):
                content = os.readlink(p)
            out[str(p.relative_to(root))] = (kind, content, st.st_mtime_ns)
    return out


def _make(kind: str, x: Path, project: Path) -> None:
    if kind == "absent":
        return
    if kind == "empty":
        x.mkdir()
    elif kind == "file":
        x.write_text("data")
    elif kind == "fifo":
        os.mkfifo(x)
    elif kind == "symlink":
        x.symlink_to(project / "cmake-build")
    elif kind == "dangling":
        x.symlink_to(project / "nowhere")
    elif kind == "foreign":
        x.mkdir()
        (x / "notes.txt").write_text("mine")
    elif kind == "earlier_build":
        assert main(["build", str(project / "r.fuse"), "-o", str(x)]) == 0
    else:
        raise AssertionError(kind)


KINDS = ["absent", "empty", "file", "fifo", "symlink", "dangling", "foreign", "earlier_build"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("command", ["build", "occupancy", "check"])
def test_nothing_outside_the_output_changes(
    kind: str,
    command: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if command == "check" and vulkan_device_name() is None:
        pytest.skip("no Vulkan device (install lavapipe)")
    project = tmp_path / "project"
    project.mkdir()
    (project / "r.fuse").write_text(SOURCE)
    cmake = project / "cmake-build"  # what a project already has: never ours
    cmake.mkdir()
    (cmake / "CMakeCache.txt").write_text("cache")
    (project / "build").mkdir()  # a CMake build folder where `-o build` once pointed
    (project / "build" / "Makefile").write_text("all:")
    x = project / "x"
    _make(kind, x, project)
    cache = tmp_path / "cache"
    monkeypatch.setenv("FUSEC_CACHE_DIR", str(cache))
    monkeypatch.chdir(project)
    before = _snapshot(project)
    args = {
        "build": ["build", "r.fuse", "-o", "x"],
        "occupancy": ["occupancy", "r.fuse", "--target", "gfx1201", "--json"],
        "check": ["check", "r.fuse", "--seed", "3"],
    }[command]
    rc = main(args)
    err = capsys.readouterr().err
    assert "Traceback" not in err and "internal error" not in err
    after = _snapshot(project)
    writes_x = command == "build" and kind in ("absent", "empty", "earlier_build")
    assert rc == (0 if command != "build" or writes_x else 1), err
    outside = {k: v for k, v in before.items() if not (writes_x and k.split("/")[0] == "x")}
    now = {k: v for k, v in after.items() if not (writes_x and k.split("/")[0] == "x")}
    assert now == outside, "something outside the output folder changed"
    if writes_x:
        assert (x / "manifest.json").is_file()
    if command != "build":
        assert (cache / "builds").is_dir(), "occupancy and check build into the cache"
