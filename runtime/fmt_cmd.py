"""`fusec fmt FILE [--check | --write]`: a `.fuse` file in its canonical layout (dsl/format.py).

- `fusec fmt FILE` prints the formatted text to stdout;
- `--check` prints nothing and exits 0 when FILE is canonical; otherwise it prints
  `FILE: would reformat` and a unified diff to stdout and exits 1;
- `--write` rewrites FILE in place when that changes it: the text goes to a temporary file in
  FILE's folder, with FILE's permissions, which replaces FILE in one `os.replace` (a symbolic
  link is followed: its target is rewritten; a read-only FILE is refused).  A canonical FILE
  is not touched (its mtime stays).

A syntax error is the parser's diagnostic (`FILE:LINE:COL: error: ...`), exit 1, with FILE
untouched.  Not checked here: the program's meaning (`fusec check` does that); fmt formats a
file that parses even when the checker would refuse it.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import os
import sys
import tempfile
from collections.abc import Sequence

from fusec.dsl.diagnostics import Diagnostic, DiagnosticError


def _fail(message: str, hint: str | None = None) -> DiagnosticError:
    return DiagnosticError([Diagnostic(None, message, hint)])


def _read(path: str) -> str:
    """The file's text as stored: line endings are not translated, so that a file with CRLF
    endings is not canonical."""
    from fusec.dsl.source_file import read_source

    return read_source(path, translate_newlines=False)


def _write_atomically(path: str, text: str) -> None:
    """Replace the file at `path` (a link's target) with `text` in one rename, keeping its
    permission bits; on any failure the file is as it was and the temporary file is gone."""
    real = os.path.realpath(path)
    if not os.access(real, os.W_OK):  # a rename could replace it: respect the permission
        raise _fail(f"cannot write {path}: it is read-only", "make it writable, or drop --write")
    mode = os.stat(real).st_mode & 0o7777
    folder, name = os.path.split(real)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".fmt", dir=folder)
    except OSError as exc:
        raise _fail(f"cannot write {path}: {exc}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, real)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise _fail(f"cannot write {path}: {exc}") from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def cmd_fmt(args: argparse.Namespace) -> int:
    """`fusec fmt`: print, check or rewrite one file (see the module docstring)."""
    if args.check and args.write:
        raise _fail(
            "fmt takes --check or --write, not both",
            "--check reports a file that is not canonical; --write rewrites it",
        )
    text = _read(args.file)
    from fusec.dsl.format import format_source  # the parser: not for every command
    from fusec.dsl.source_file import Stored

    # formatted as LF text; a byte order mark and the file's line ending are kept
    plain, stored = Stored.of(text)
    formatted = stored.restore(format_source(plain, args.file))
    if args.check:
        if formatted == text:
            return 0
        print(f"{args.file}: would reformat")
        diff = difflib.unified_diff(
            text.splitlines(keepends=True),
            formatted.splitlines(keepends=True),
            fromfile=args.file,
            tofile=f"{args.file} (formatted)",
        )
        for line in diff:
            sys.stdout.write(line if line.endswith("\n") else line + "\n")
        return 1
    if args.write:
        if formatted != text:
            _write_atomically(args.file, formatted)
        return 0
    sys.stdout.write(formatted)
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of `fusec fmt` (also this module's own command line)."""
    p.add_argument("file", help="a .fuse file")
    p.add_argument(
        "--check", action="store_true", help="exit 1 with a diff when FILE is not canonical"
    )
    p.add_argument(
        "--write", action="store_true", help="rewrite FILE in place (only when it changes)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m fusec.runtime.fmt_cmd FILE [--check | --write]`, as `fusec fmt`."""
    p = argparse.ArgumentParser(
        prog="fusec fmt", description="print a .fuse file in its canonical layout"
    )
    add_arguments(p)
    args = p.parse_args(argv)
    try:
        return cmd_fmt(args)
    except DiagnosticError as exc:
        print(exc.render(), file=sys.stderr)
        return 1
    except BrokenPipeError:  # `... --check | head`: the reader left
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
