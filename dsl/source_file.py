"""Reading a `.fuse` source file: a regular file of at most `MAX_SOURCE_BYTES` of UTF-8.

Opened without blocking and checked before it is read, so that a FIFO, a device
(`/dev/zero`), a folder or a file past the limit is refused in one sentence instead of
hanging or filling memory; no more than the limit and one byte is ever read.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import attrs

from .diagnostics import Diagnostic, DiagnosticError
from .syntax import MAX_SOURCE_BYTES

BOM = "\ufeff"  # the byte order mark, as UTF-8 EF BB BF


def _fail(message: str, hint: str | None = None) -> DiagnosticError:
    return DiagnosticError([Diagnostic(None, message, hint)])


def _too_large(path: str | Path, size: int | str) -> DiagnosticError:
    return _fail(
        f"source {path} must be at most {MAX_SOURCE_BYTES // 1024} KiB "
        f"({MAX_SOURCE_BYTES} bytes), not {size} bytes",
        "split its regions over several files",
    )


def read_source(path: str | Path, translate_newlines: bool = True) -> str:
    """The text of the source file at `path` (a symbolic link is followed).  With
    `translate_newlines` (what the compiler reads) CRLF and CR become LF, as Python's text
    files do, and a leading byte order mark is dropped; without it (`fusec fmt`) the text is as
    stored.  DiagnosticError of one sentence
    where it is missing, not a regular file, too large or not UTF-8."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise _fail(f"cannot read {path}: no such file") from None
    except IsADirectoryError:
        raise _fail(f"cannot read {path}: it is a folder", "give a .fuse file") from None
    except OSError as exc:
        raise _fail(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise _fail(f"cannot read {path}: it is a folder", "give a .fuse file")
        if not stat.S_ISREG(st.st_mode):
            raise _fail(
                f"cannot read {path}: it is not a regular file (a pipe or a device)",
                "give a .fuse file",
            )
        if st.st_size > MAX_SOURCE_BYTES:
            raise _too_large(path, st.st_size)
        chunks = []
        left = MAX_SOURCE_BYTES + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:
        raise _fail(f"cannot read {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > MAX_SOURCE_BYTES:  # it grew while it was read: its size is unknown
        raise _too_large(path, f"more than {MAX_SOURCE_BYTES}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _fail(
            f"cannot read {path}: byte 0x{data[exc.start]:02x} at offset {exc.start} is not "
            "UTF-8 text",
            "save the file as UTF-8",
        ) from None
    if translate_newlines:
        # a byte order mark (U+FEFF, which some editors write first) is no character of the
        # source
        text = text.removeprefix(BOM).replace("\r\n", "\n").replace("\r", "\n")
    return text


@attrs.frozen
class Stored:
    """How a source file stores its text beyond the text itself: a byte order mark, and its
    line ending (the first one in it: CRLF, CR or LF).  Tools that rewrite a file (`fusec fmt
    --write`, `fusec tune --write`) work on the text with LF endings and give the result back
    stored the same way."""

    bom: str
    newline: str

    @classmethod
    def of(cls, raw: str) -> tuple[str, Stored]:
        """(the text of `raw` without its mark, with LF line endings; how it was stored)."""
        text = raw.removeprefix(BOM)
        crlf, cr = text.find("\r\n"), text.find("\r")
        newline = "\r\n" if crlf != -1 and crlf == cr else "\r" if cr != -1 else "\n"
        stored = cls(BOM if raw.startswith(BOM) else "", newline)
        return text.replace("\r\n", "\n").replace("\r", "\n"), stored

    def restore(self, text: str) -> str:
        """`text` (LF line endings) stored as the file was."""
        return self.bom + text.replace("\n", self.newline)
