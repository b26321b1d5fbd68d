"""Output safety (codegen/folder.py, issue 13): `fusec build -o X` replaces only a folder that a
fusec build wrote, in one step, with the umask's permissions; anything else at X is refused in
one sentence and left exactly as it was."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from fusec.codegen import folder
from fusec.runtime.cli import main
from tests.conftest import ROOT

pytestmark = pytest.mark.shaderc

SOURCE = (ROOT / "tests" / "data" / "scale.fuse").read_text()  # a small region


@pytest.fixture
def src(tmp_path: Path) -> Path:
    p = tmp_path / "r.fuse"
    p.write_text(SOURCE)
    return p


def _refused(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    rc = main(args)
    err = capsys.readouterr().err
    assert rc == 1, err
    assert err.startswith("fusec: error: ") and "Traceback" not in err
    assert "does not replace it" in err
    return err


def test_a_folder_with_other_files_is_refused_and_kept(
    src: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mine = tmp_path / "mysrc"
    mine.mkdir()
    (mine / "notes.txt").write_text("notes")
    err = _refused(["build", str(src), "-o", str(mine)], capsys)
    assert "not a fusec build folder" in err
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    assert (mine / "notes.txt").read_text() == "notes"


def test_a_build_folder_with_a_file_added_is_refused(
    src: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main(["build", str(src), "-o", str(out)]) == 0
    (out / "glsl" / "mine.txt").write_text("keep")
    (out / "notes.md").write_text("keep")
    err = _refused(["build", str(src), "-o", str(out)], capsys)
    assert "glsl/mine.txt" in err and "notes.md" in err
    assert (out / "notes.md").read_text() == "keep"


@pytest.mark.parametrize("kind", ["file", "fifo", "symlink_dir", "symlink_file", "device"])
def test_a_non_folder_is_never_touched(
    kind: str, src: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "x"
    if kind == "file":
        target.write_text("data")
    elif kind == "fifo":
        os.mkfifo(target)
    elif kind == "symlink_dir":
        (tmp_path / "real").mkdir()
        target.symlink_to(tmp_path / "real")
    elif kind == "symlink_file":
        target.symlink_to(src)
    else:
        if os.geteuid() != 0:
            pytest.skip("making a device node needs root")
        os.mknod(target, 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # like /dev/null
    before = target.lstat()
    _refused(["build", str(src), "-o", str(target)], capsys)
    after = target.lstat()
    assert (before.st_mode, before.st_ino, before.st_mtime_ns) == (
        after.st_mode,
        after.st_ino,
        after.st_mtime_ns,
    )
    assert src.read_text() == SOURCE


def test_the_source_itself_is_refused(src: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _refused(["build", str(src), "-o", str(src)], capsys)
    assert src.read_text() == SOURCE


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002])
def test_the_folder_keeps_the_umask(src: Path, tmp_path: Path, mask: int) -> None:
    old = os.umask(mask)
    try:
        assert main(["build", str(src), "-o", str(tmp_path / "out")]) == 0
    finally:
        os.umask(old)
    mode = stat.S_IMODE((tmp_path / "out").stat().st_mode)
    assert mode == 0o777 & ~mask
    fmode = stat.S_IMODE((tmp_path / "out" / "manifest.json").stat().st_mode)
    assert fmode == 0o666 & ~mask


def test_stale_temporaries_are_cleaned(src: Path, tmp_path: Path) -> None:
    host = folder._host()
    dead = tmp_path / f".out.fusec-tmp-{host}-999999999-abc"  # no such process
    dead.mkdir()
    (dead / "manifest.json").write_text("{}")
    live = tmp_path / f".out.fusec-tmp-{host}-{os.getpid()}-xyz"  # a build still running
    remote = tmp_path / ".out.fusec-tmp-otherhost-999999999-abc"  # another host's: not ours
    remote.mkdir()
    live.mkdir()
    other = tmp_path / ".out.mine"  # not ours
    other.mkdir()
    assert main(["build", str(src), "-o", str(tmp_path / "out")]) == 0
    assert not dead.exists() and live.exists() and other.exists() and remote.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [live.name, other.name, remote.name, "out", "r.fuse"]
    )


@pytest.mark.parametrize("name", [".", ".."])
def test_dot_outputs_are_refused(
    name: str,
    src: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.chdir(empty)
    assert main(["build", str(src), "-o", name]) == 1
    assert "must name a folder" in capsys.readouterr().err
    assert list(empty.iterdir()) == []


def test_rebuild_swaps_in_one_step(src: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert main(["build", str(src), "-o", str(out)]) == 0
    src.write_text(SOURCE.replace("x[n] * g[n]", "x[n] + g[n]"))
    assert main(["build", str(src), "-o", str(out)]) == 0
    assert "x[n] + g[n]" in (out / "source.fuse").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "r.fuse"]
    assert folder.foreign_entries(out) == []


def test_a_corrupt_cached_module_is_compiled_again(src: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert main(["build", str(src), "-o", str(out)]) == 0
    good = (out / "scale.spv").read_bytes()
    (out / "scale.spv").write_bytes(good[:-4])  # same GLSL, damaged module
    assert main(["build", str(src), "-o", str(out)]) == 0
    assert (out / "scale.spv").read_bytes() == good
    m = json.loads((out / "manifest.json").read_text())
    import hashlib

    assert m["regions"][0]["fused"][0]["sha256"] == hashlib.sha256(good).hexdigest()


def test_what_persistent_writes_is_fusec_s(src: Path, tmp_path: Path) -> None:
    """`fusec build --persistent`'s subfolder (index.json, <sha256>.spv, a killed build's
    <sha256>.tmp) belongs to the build: a rebuild replaces the folder; anything else there, or
    a link, is foreign."""
    out = tmp_path / "out"
    assert main(["build", str(src), "-o", str(out)]) == 0
    products = out / folder.PERSISTENT_FOLDER
    products.mkdir()
    key = "0123456789abcdef" * 4
    for name in ("index.json", f"{key}.spv", f"{key}.tmp"):
        (products / name).write_text("{}")
    assert folder.foreign_entries(out) == []
    assert main(["build", str(src), "-o", str(out), "--force"]) == 0
    assert not products.exists()  # the rebuild dropped it
    products.mkdir()
    (products / "notes.md").write_text("keep")
    os.symlink(out / "manifest.json", products / f"{key}.spv")
    (products / f"{key[:-1]}.spv").write_text("")  # 63 hex digits: no product's name
    assert folder.foreign_entries(out) == [
        f"persistent/{key[:-1]}.spv",
        f"persistent/{key}.spv",
        "persistent/notes.md",
    ]


@pytest.mark.parametrize("mode", [0o700, 0o750, 0o2770, 0o711])
def test_a_folder_keeps_its_permissions_when_built_into(
    src: Path, tmp_path: Path, mode: int
) -> None:
    """`-o DIR` into an empty folder of the user's, then a rebuild into it: the folder swapped
    in keeps DIR's permissions and setgid bit (a private folder came back 755, world-readable;
    a setgid folder lost the bit; found by a new-user probe)."""
    out = tmp_path / "out"
    out.mkdir()
    os.chmod(out, mode)
    for extra in ([], ["--force"]):
        assert main(["build", str(src), "-o", str(out), *extra]) == 0
        assert stat.S_IMODE(out.stat().st_mode) == mode, oct(out.stat().st_mode)
        assert (out / "manifest.json").is_file()
