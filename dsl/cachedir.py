"""Where fusec keeps what it can recompute: builds for `occupancy FILE` / `check FILE`, compiled
kernels (`objects/`), the parser tables of the grammar, which manifests passed the schema
(`validated/`, codegen/manifest.py) and whose SPIR-V modules passed their checks
(`validated-modules/`, runtime/prebuilt.py).

$FUSEC_CACHE_DIR, else $XDG_CACHE_HOME/fusec, else ~/.cache/fusec (the XDG base directory
specification).  Every folder in it is created private (0700) and is used only when it belongs to
this user and nobody else can write to it: the grammar's tables are loaded with pickle.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path


def cache_root() -> Path:
    if os.environ.get("FUSEC_CACHE_DIR"):
        return Path(os.environ["FUSEC_CACHE_DIR"])
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and Path(xdg).is_absolute():
        return Path(xdg) / "fusec"
    try:
        return Path.home() / ".cache" / "fusec"
    except RuntimeError:  # no HOME and no passwd entry
        return Path(tempfile.gettempdir()) / f"fusec-cache-{os.getuid()}"


def private_folder(name: str) -> Path:
    """cache_root()/name, created 0700 if missing.  Raises OSError with a sentence when it
    cannot be made, is no folder, belongs to someone else or others may write to it."""
    folder = cache_root() / name
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = folder.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise OSError(f"{folder} is not a folder of this user's")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise OSError(f"{folder} may be written by other users")
    return folder
