"""Writing a build folder safely: fusec replaces only what it wrote, in one atomic step.

Input: a finished folder written beside its destination (a temporary sibling).  Output: the
folder at its destination, swapped in with one `renameat2(RENAME_EXCHANGE)` where the kernel and
file system have it (Linux 3.15+, see renameat2(2)), else two renames.

The rules (issue 13):
- a destination that exists must be a real directory (not a file, a device node, a FIFO or a
  symbolic link), and either empty or a fusec build folder: a `manifest.json` whose `format` is a
  fusec manifest, beside nothing but what such a build writes (`source.fuse`, the `.spv` files
  the manifest names, `glsl/<kernel>.comp`, and what `--persistent` writes: `persistent/`
  holding `index.json` and `<sha256>.spv`, or a `<sha256>.tmp` a killed build left).
  Anything else is refused in one sentence, before any compiling, and nothing is touched;
- the new folder gets the permissions of a folder made with `mkdir` under the current umask;
- temporaries left by a killed build (their process is gone) are removed.

What this does not check: the contents of the old build's files (it is being replaced).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import re
import shutil
import socket
import stat
import tempfile
from pathlib import Path
from typing import Any

from fusec.dsl.diagnostics import Diagnostic, DiagnosticError

MANIFEST_FORMAT_PREFIX = "fusec-manifest/"
# `fusec build --persistent`'s subfolder (runtime/persistent_aot.py PRODUCTS) and its files
PERSISTENT_FOLDER = "persistent"
_PERSISTENT_FILE = re.compile(r"(index\.json|[0-9a-f]{64}\.(spv|tmp))")
_TMP_MARK = ".fusec-tmp-"
_AT_FDCWD = -100
_RENAME_NOREPLACE = 1  # renameat2(2)
_RENAME_EXCHANGE = 2


def _fail(message: str, hint: str | None = None) -> DiagnosticError:
    return DiagnosticError([Diagnostic(None, message, hint)])


def _spv_names(node: Any) -> set[str]:
    """Every string under a key "spv" anywhere in a manifest (any format version)."""
    found: set[str] = set()
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, value in item.items():
                if key == "spv" and isinstance(value, str):
                    found.add(value)
                else:
                    stack.append(value)
        elif isinstance(item, list):
            stack.extend(item)
    return found


def foreign_entries(folder: Path) -> list[str] | None:
    """Entries of `folder` that a fusec build did not write, or None when it is no fusec build
    folder at all (no readable manifest with a fusec format).  An empty folder has none."""
    entries = sorted(os.listdir(folder))
    if not entries:
        return []
    manifest = folder / "manifest.json"
    try:
        if not stat.S_ISREG(manifest.lstat().st_mode):
            return None
        with open(manifest, "rb") as f:
            data = json.loads(f.read(64 << 20))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or not str(data.get("format", "")).startswith(
        MANIFEST_FORMAT_PREFIX
    ):
        return None
    spvs = {n for n in _spv_names(data) if "/" not in n and n.endswith(".spv")}
    owned_files = {"manifest.json", "source.fuse", *spvs}
    comps = {f"{n[: -len('.spv')]}.comp" for n in spvs}
    foreign = []
    for name in entries:
        mode = (folder / name).lstat().st_mode
        if name == "glsl" and stat.S_ISDIR(mode):
            for inner in sorted(os.listdir(folder / name)):
                if inner not in comps or not stat.S_ISREG((folder / name / inner).lstat().st_mode):
                    foreign.append(f"glsl/{inner}")
        elif name == PERSISTENT_FOLDER and stat.S_ISDIR(mode):
            for inner in sorted(os.listdir(folder / name)):
                regular = stat.S_ISREG((folder / name / inner).lstat().st_mode)
                if not (_PERSISTENT_FILE.fullmatch(inner) and regular):
                    foreign.append(f"{name}/{inner}")
        elif name not in owned_files or not stat.S_ISREG(mode):
            foreign.append(name)
    return foreign


def check_destination(out: Path) -> None:
    """Refuse, in one sentence, a destination fusec may not replace (module docstring)."""
    if out.name in ("", ".", ".."):
        raise _fail(
            f"output {out} must name a folder, not '.' or '..'", "give -o a folder name, e.g. build"
        )
    try:
        st = out.lstat()
    except FileNotFoundError:
        return
    except OSError as exc:
        raise _fail(f"cannot use {out} as the output folder: {exc.strerror}") from None
    hint = "give -o a new folder, or one that fusec build wrote"
    if stat.S_ISLNK(st.st_mode):
        raise _fail(f"output {out} is a symbolic link; fusec does not replace it", hint)
    if not stat.S_ISDIR(st.st_mode):
        raise _fail(f"output {out} exists and is not a folder; fusec does not replace it", hint)
    try:
        foreign = foreign_entries(out)
    except OSError as exc:
        raise _fail(f"cannot use {out} as the output folder: {exc.strerror}") from None
    if foreign is None:
        raise _fail(
            f"output folder {out} is not a fusec build folder (no fusec manifest.json); "
            "fusec does not replace it",
            hint,
        )
    if foreign:
        shown = ", ".join(foreign[:5]) + (
            f" and {len(foreign) - 5} more" if len(foreign) > 5 else ""
        )
        raise _fail(
            f"output folder {out} holds files fusec did not write ({shown}); "
            "fusec does not replace it",
            "move those files out, or give -o another folder",
        )


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _host() -> str:
    """This machine's name, in temporaries' names: a process id means nothing on another host
    sharing the folder (NFS, a bind mount)."""
    name = "".join(c if c.isalnum() else "_" for c in socket.gethostname())[:32]
    return name or "host"


def clean_stale(out: Path) -> None:
    """Remove temporaries of earlier builds of `out`, made on this host, whose process is
    gone."""
    prefix = f".{out.name}{_TMP_MARK}{_host()}-"
    with contextlib.suppress(OSError):
        for entry in os.scandir(out.parent):
            if not entry.name.startswith(prefix) or not entry.is_dir(follow_symlinks=False):
                continue
            pid_text = entry.name[len(prefix) :].split("-", 1)[0]
            if pid_text.isdigit() and not _alive(int(pid_text)):
                shutil.rmtree(entry.path, ignore_errors=True)


def make_temporary(out: Path) -> Path:
    """A new, empty sibling of `out` to write the build into, with mkdir's permissions."""
    out.parent.mkdir(parents=True, exist_ok=True)
    clean_stale(out)
    prefix = f".{out.name}{_TMP_MARK}{_host()}-{os.getpid()}-"
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=out.parent))
    os.chmod(tmp, 0o777 & ~_umask())
    return tmp


def _renameat2(src: Path, dst: Path, flags: int) -> bool:
    """True when renameat2 did it; False when this system lacks it (then the caller falls
    back).  Other failures raise OSError."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    rc = fn(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(dst))


def _keep_attributes(old: Path, new: Path) -> None:
    """The folder swapped in keeps the permissions, setgid bit and group of the one it replaces
    (a private `chmod 700` folder stayed private; a shared setgid folder stays shared): only
    its contents are fusec's.  Best effort: where the owner may not set them, mkdir's stay."""
    with contextlib.suppress(OSError):
        st = os.stat(old, follow_symlinks=False)
        if st.st_gid != os.stat(new).st_gid:
            os.chown(new, -1, st.st_gid)  # first: a chown may clear the setgid bit
        os.chmod(new, stat.S_IMODE(st.st_mode))


def swap_into_place(tmp: Path, out: Path) -> None:
    """Put the finished folder `tmp` at `out` in one step; the old `out` (checked by
    check_destination) is removed afterwards.  `tmp` is gone when this returns."""
    check_destination(out)  # again: the folder may have changed while we compiled
    if not out.exists():
        if not _renameat2(tmp, out, _RENAME_NOREPLACE):
            os.rename(tmp, out)
        return
    _keep_attributes(out, tmp)
    if _renameat2(tmp, out, _RENAME_EXCHANGE):
        # `tmp` now holds what was at `out`: delete it only if it is still the build we checked
        # (the folder may have been replaced between the check and the exchange)
        if not _is_our_build(tmp):
            _renameat2(tmp, out, _RENAME_EXCHANGE)
            shutil.rmtree(tmp, ignore_errors=True)
            raise _fail(f"output {out} changed while fusec was building; it was left as it is")
        shutil.rmtree(tmp, ignore_errors=True)
        return
    old = out.parent / f".{out.name}{_TMP_MARK}{_host()}-{os.getpid()}-old"
    os.rename(out, old)
    if not _is_our_build(old):
        os.rename(old, out)
        shutil.rmtree(tmp, ignore_errors=True)
        raise _fail(f"output {out} changed while fusec was building; it was left as it is")
    os.rename(tmp, out)
    shutil.rmtree(old, ignore_errors=True)


def _is_our_build(path: Path) -> bool:
    try:
        return stat.S_ISDIR(path.lstat().st_mode) and foreign_entries(path) == []
    except OSError:
        return False
