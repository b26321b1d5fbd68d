"""A source that is not a regular UTF-8 file of at most 256 KiB is refused in one sentence by
every command that reads one, before it is read whole: a FIFO (no writer: reading would block
for ever), `/dev/zero` (endless), a folder, a file past the limit, bytes that are not UTF-8
(dsl/source_file.py).  Found by a new-user probe: `fusec build /dev/zero` grew without limit
and `fusec build FIFO` hung."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from fusec.dsl.source_file import read_source
from fusec.dsl.syntax import MAX_SOURCE_BYTES
from tests.conftest import fusec_cli

COMMANDS = [["build", "{src}", "-o", "{out}"], ["fmt", "--check", "{src}"], ["check", "{src}"]]


def _sources(tmp_path: Path) -> list[tuple[Path, str]]:
    fifo = tmp_path / "pipe.fuse"
    os.mkfifo(fifo)
    big = tmp_path / "big.fuse"
    # a comment line repeated past the limit by a random amount
    line = "# " + "x" * random.randint(10, 200) + "\n"
    big.write_text(line * (MAX_SOURCE_BYTES // len(line) + random.randint(1, 50)))
    latin = tmp_path / "latin.fuse"
    offset = random.randint(0, 40)
    latin.write_bytes(b"#" * offset + b"\xe9\n")
    folder = tmp_path / "folder.fuse"
    folder.mkdir()
    return [
        (fifo, "not a regular file"),
        (Path("/dev/zero"), "not a regular file"),
        (big, f"at most {MAX_SOURCE_BYTES // 1024} KiB"),
        (latin, f"byte 0xe9 at offset {offset} is not UTF-8"),
        (folder, "it is a folder"),
    ]


def test_read_source_refuses_what_is_not_a_source(tmp_path: Path) -> None:
    from fusec.dsl.diagnostics import DiagnosticError

    for path, why in _sources(tmp_path):
        with pytest.raises(DiagnosticError) as info:
            read_source(path)
        assert why in str(info.value), (path, info.value)
    ok = tmp_path / "ok.fuse"
    ok.write_bytes(b"# a\r\n# b\r# c\n")
    assert read_source(ok) == "# a\n# b\n# c\n"
    assert read_source(ok, translate_newlines=False) == "# a\r\n# b\r# c\n"


@pytest.mark.slow
def test_commands_refuse_them_in_one_sentence_without_hanging(tmp_path: Path) -> None:
    for path, why in _sources(tmp_path):
        for command in COMMANDS:
            out = tmp_path / "out"
            args = [a.format(src=path, out=out) for a in command]
            proc = fusec_cli(args, capture_output=True, text=True, timeout=60)
            assert proc.returncode == 1, (args, proc.stderr)
            assert proc.stderr.startswith("fusec: error: "), (args, proc.stderr)
            # `check DIR` reads a folder as a build folder
            want = "no such file" if command[0] == "check" and path.is_dir() else why
            assert want in proc.stderr and "Traceback" not in proc.stderr, (args, proc.stderr)
            assert not out.exists(), args


SCALE = (Path(__file__).parents[1] / "data" / "scale.fuse").read_text()


@pytest.mark.shaderc
def test_a_byte_order_mark_is_no_character_of_the_source(tmp_path: Path) -> None:
    """Some editors write a UTF-8 byte order mark first; it was refused as an unexpected
    character at 1:1.  It is dropped when the source is read, columns of later errors are
    those of the text, and `fusec fmt` keeps it where the file has it (a new-user probe)."""
    bom = "\ufeff".encode()
    src = tmp_path / "bom.fuse"
    src.write_bytes(bom + SCALE.encode())
    assert read_source(src) == SCALE
    run = fusec_cli(
        ["build", str(src), "-o", str(tmp_path / "out")], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "out" / "manifest.json").is_file()
    # an error on line 1 (at the open bracket): columns count from the character after the mark
    pad = " " * random.randint(0, 8)
    bad = tmp_path / "bad.fuse"
    bad.write_bytes(bom + f"region{pad} scale(\n".encode())
    run = fusec_cli(["build", str(bad), "-o", str(tmp_path / "o2")], capture_output=True, text=True)
    assert run.returncode == 1
    assert run.stderr.startswith(f"{bad}:1:{len('region scale(') + len(pad)}: error: ")
    assert not (tmp_path / "o2").exists()
    # fmt: canonical text after the mark, the mark kept
    messy = tmp_path / "messy.fuse"
    messy.write_bytes(bom + SCALE.replace("x[n] * g[n]", "x[n]*g[n]").encode())
    run = fusec_cli(["fmt", "--write", str(messy)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert messy.read_bytes() == bom + SCALE.encode()
    run = fusec_cli(["fmt", "--check", str(messy)], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout == ""


@pytest.mark.parametrize("newline", ["\r\n", "\r"])
def test_fmt_keeps_the_line_ending_a_file_has(tmp_path: Path, newline: str) -> None:
    """A CR-only file was 'unexpected character' in fmt, which build read; a canonical CRLF
    file is canonical as it is, and `--write` keeps the file's ending (a new-user probe)."""
    messy = SCALE.replace("x[n] * g[n]", "x[n]*g[n]")
    src = tmp_path / "s.fuse"
    src.write_bytes(messy.replace("\n", newline).encode())
    run = fusec_cli(["fmt", "--check", str(src)], capture_output=True, text=True)
    assert run.returncode == 1 and "would reformat" in run.stdout
    run = fusec_cli(["fmt", "--write", str(src)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert src.read_bytes() == SCALE.replace("\n", newline).encode()
    run = fusec_cli(["fmt", "--check", str(src)], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout == ""
