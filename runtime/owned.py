"""Files fusec writes beside the user's own (`fusec export --c-header FILE`, `fusec occupancy
--plot FILE --html FILE`): written atomically (a temporary file beside FILE, renamed over
it), and only where FILE is new or a file fusec wrote, which each writer recognises by a mark
in its first bytes.  fusec never changes a file it did not create: anything else (a file of
the user's, a folder, a symbolic link, a device) is refused in one sentence and left as it was.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

from fusec.dsl.diagnostics import Diagnostic, DiagnosticError

# how much of an existing file's start its writer's mark is looked for in
HEAD_BYTES = 4096


def fail(message: str, hint: str | None = None) -> DiagnosticError:
    return DiagnosticError([Diagnostic(None, message, hint)])


def head(path: Path, size: int = HEAD_BYTES) -> bytes | None:
    """The first `size` bytes of a regular file (not followed through a link, never blocking
    on a FIFO), or None for anything else."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, size)
    finally:
        os.close(fd)


def write_owned(path: Path, data: bytes, ours: Callable[[bytes], bool], kind: str) -> bool:
    """Write `data` to `path` atomically.  `path` must not exist, or be a regular file whose
    first bytes `ours` recognises; else a DiagnosticError of one sentence (`kind` names what
    fusec writes there, e.g. "a header fusec wrote").  False when `path` already held exactly
    `data` (not rewritten, its time stamp kept)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise fail(f"cannot write {path}: {exc.strerror}") from None
    mode = None
    if st is not None:
        start = head(path) if stat.S_ISREG(st.st_mode) else None
        if start is None or not ours(start):
            what = f"not {kind}"
            if stat.S_ISDIR(st.st_mode):
                what = "a folder"
            elif stat.S_ISLNK(st.st_mode):
                what = "a symbolic link"
            elif not stat.S_ISREG(st.st_mode):
                what = "not a regular file"
            raise fail(
                f"refusing to overwrite {path}: it is {what}",
                "choose another file name, or remove it if it is yours to lose",
            )
        if st.st_size == len(data) and path.read_bytes() == data:
            return False
        mode = st.st_mode & 0o7777
    folder = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise fail(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if mode is None:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise fail(f"cannot write {path}: {exc.strerror or exc}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return True
