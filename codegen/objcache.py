"""The caches a build reads and fills: `SpvCache` (SPIR-V of an earlier build folder, reused for a
kernel whose GLSL is unchanged), `ObjectCache` (compiled kernels and their measured register
demand in the user's cache folder, keyed by GLSL, compiler and fusec's code) and `NvidiaMemo`
(codegen/nvidia.py's features of each module, beside the object cache).

Input: GLSL text, SPIR-V bytes, an earlier manifest.  Output: cached SPIR-V, demands and
features, or None.  Not done here: compiling or measuring (`build.py` passes the measuring
function in), and whether caching is on at all (`build.OBJECT_CACHE`)."""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from fusec.dsl import ir
from fusec.dsl.cachedir import private_folder

from . import manifest
from .liveness import Demand
from .nvidia import NvidiaFeatures
from .shaderc import compiler_id
from .spirv import header_problem

MAX_CACHED_SPV_BYTES = 64 << 20


_KERNEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]{0,199}")


def kernel_hashes(data: dict[str, Any]) -> dict[str, str]:
    """Kernel name -> sha256 of its SPIR-V, for every kernel a manifest lists (names that could
    leave the folder are skipped)."""
    hashes = {}
    for region in data.get("regions") or []:
        if not isinstance(region, dict):
            continue
        for product in ("fused", "unfused", "fused_shared"):
            for k in region.get(product) or []:
                if not isinstance(k, dict) or not isinstance(k.get("sha256"), str):
                    continue
                name = str(k.get("name"))
                if _KERNEL_NAME.fullmatch(name) and ".." not in name:
                    hashes[name] = k["sha256"]
    return hashes


class SpvCache:
    """SPIR-V from an earlier build folder, reused for a kernel whose GLSL is unchanged.  The old
    manifest is read once; a cached file is used only when the compiler and the manifest format
    are the same and its bytes still have the sha256 the old manifest recorded."""

    def __init__(self, folder_path: Path | None) -> None:
        self.path = folder_path
        self.hashes: dict[str, str] = {}
        if folder_path is None:
            return
        try:
            mpath = folder_path / "manifest.json"
            if not mpath.is_file() or mpath.is_symlink():
                return
            old = json.loads(mpath.read_text())
        except (OSError, ValueError, RecursionError):
            return
        if not isinstance(old, dict) or not manifest.is_sealed(old):
            return  # edited after its build: nothing in it is reused
        if old.get("compiler_id") != compiler_id() or old.get("format") != manifest.FORMAT:
            return
        self.hashes = kernel_hashes(old)

    def get(self, name: str, glsl: str) -> bytes | None:
        want = self.hashes.get(name)
        if want is None or self.path is None:
            return None
        try:
            if (self.path / "glsl" / f"{name}.comp").read_text() != glsl:
                return None
            with open(self.path / f"{name}.spv", "rb") as f:
                spv = f.read(MAX_CACHED_SPV_BYTES + 1)
        except (OSError, ValueError):
            return None
        return spv if hashlib.sha256(spv).hexdigest() == want else None


_IDENTIFIER = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)\b")  # captured: split keeps them
# GLSL words with a `_` that the generated code uses (the `gl_` and `GL_` ones aside)
_GLSL_WORDS = frozenset(
    ("local_size_x", "constant_id", "float16_t", "spirv_instruction", "spirv_literal")
)

OBJECT_ENTRIES = 4096  # kernels kept in the object cache; the least recently used go first
OBJECTS_TABLE = "kernels_v3"  # a new name for each new layout of an entry
NVIDIA_TABLE = "nvidia"  # NvidiaMemo's, in the same file


def _spirv_header_ok(spv: object) -> bool:
    """A SPIR-V header (codegen/spirv.py): what the object cache insists on before it keeps or
    returns a module."""
    return isinstance(spv, bytes) and header_problem(spv) is None


class ObjectCache:
    """Compiled kernels in the user's cache folder (dsl/cachedir.py), like ccache: the SPIR-V
    and its measured register demand (`Demand`: the peak, the private words, the peak with
    loads moved up and the one with mixed dot products unpacked, each a column, so a warm build
    judges as a cold one), keyed by the sha256
    of the GLSL, the compiler (`compiler_id`) and fusec's own code, so that a change to any of
    them misses.  One SQLite file (`objects.sqlite`: one open, one transaction per build, safe
    between processes); an entry that does not read back as SPIR-V and a demand is ignored, and
    an unusable cache is no cache."""

    def __init__(self, enabled: bool = True) -> None:
        self.db: sqlite3.Connection | None = None
        self.salt = (compiler_id() + "\0" + code_digest()).encode()
        self.new: list[tuple[str, bytes, int, int, int, int, float]] = []
        if not enabled:
            return
        try:
            self.db = sqlite3.connect(private_folder("objects") / "objects.sqlite", timeout=10)
            # the table's name carries its columns' version: tables of an older layout
            # (`kernels`: no `loads_up`) are never read, and go; NvidiaMemo's table stays
            old = self.db.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT IN (?, ?)",
                (OBJECTS_TABLE, NVIDIA_TABLE),
            ).fetchall()
            for (name,) in old:
                self.db.execute(f'DROP TABLE "{name}"')
            self.db.execute(
                f"CREATE TABLE IF NOT EXISTS {OBJECTS_TABLE} (key TEXT PRIMARY KEY, spv BLOB, "
                "vgprs INTEGER, private INTEGER, loads_up INTEGER, unpacked_dot INTEGER, used REAL)"
            )
        except (OSError, sqlite3.Error):
            self.db = None

    def key(self, glsl: str, names: Iterable[str] = ()) -> str:
        """The GLSL's key, without its `// kernel` comment and `#line` directives, and with the
        region's own names (`names`: buffers, shared arrays, constants, stages) replaced by their
        order of first appearance wherever they end an identifier's `_`-separated part (`b_x`,
        `scale_W`, `B_x_u4`).  Comments, line directives and identifiers reach SPIR-V only as
        debug information, which a build does not ask for: kernels with the same key are the
        same program up to a consistent renaming (`#` stands in, which no identifier holds), and
        compile to the same bytes (tests/codegen/test_rebuild.py holds this for kernels.fuse)."""
        body = "\n".join(
            line for line in glsl.splitlines() if not line.startswith(("#line ", "// kernel "))
        )
        ours = sorted({n for n in names if n}, key=len, reverse=True)
        if ours:
            order: dict[str, str] = {}
            part = re.compile(r"(?<=_)(" + "|".join(map(re.escape, ours)) + r")(?=_|$)")

            def rename(word: str) -> str:
                if word in _GLSL_WORDS or word.startswith(("gl_", "GL_")):
                    return word  # GLSL's own (`local_size_x` for a buffer `x`)
                return part.sub(lambda p: order.setdefault(p.group(1), f"#{len(order)}"), word)

            # the text alternates between what lies between identifiers (even places) and the
            # identifiers (odd places); each distinct identifier is renamed once, in order of
            # first appearance, which numbers the names as a scan of the text would
            pieces = _IDENTIFIER.split(body)
            words = dict.fromkeys(pieces[1::2])
            renamed = {w: rename(w) for w in words}
            pieces[1::2] = [renamed[w] for w in pieces[1::2]]
            body = "".join(pieces)
        return hashlib.sha256(self.salt + body.encode("utf-8", "surrogateescape")).hexdigest()

    def get(self, key: str) -> tuple[bytes, Demand] | None:
        if self.db is None:
            return None
        try:
            row = self.db.execute(
                f"SELECT spv, vgprs, private, loads_up, unpacked_dot FROM {OBJECTS_TABLE} "
                "WHERE key = ?",
                (key,),
            ).fetchone()
        except sqlite3.Error:
            return None
        if row is None:
            return None
        spv, *numbers = row
        if not _spirv_header_ok(spv) or not all(isinstance(n, int) and n >= 0 for n in numbers):
            return None
        return spv, Demand(*numbers)

    def put(self, key: str, spv: bytes, found: Demand) -> None:
        if not _spirv_header_ok(spv):
            return
        self.new.append(
            (
                key,
                spv,
                found.vgprs,
                found.private_words,
                found.loads_up,
                found.unpacked_dot,
                time.time(),
            )
        )

    def close(self, used: list[str]) -> None:
        """Store the new kernels, mark `used` as recently used, keep the OBJECT_ENTRIES most
        recently used."""
        if self.db is None:
            return
        try:
            with self.db:
                self.db.executemany(
                    f"INSERT OR REPLACE INTO {OBJECTS_TABLE} VALUES (?,?,?,?,?,?,?)", self.new
                )
                now = time.time()
                self.db.executemany(
                    f"UPDATE {OBJECTS_TABLE} SET used = ? WHERE key = ?", [(now, k) for k in used]
                )
                self.db.execute(
                    f"DELETE FROM {OBJECTS_TABLE} WHERE key NOT IN "
                    f"(SELECT key FROM {OBJECTS_TABLE} ORDER BY used DESC LIMIT ?)",
                    (OBJECT_ENTRIES,),
                )
        except sqlite3.Error:
            pass
        finally:
            self.db.close()


# the memo's table; named anew when the features change (a file of an older fusec keeps its
# old table, which this one does not read)
NVIDIA_TABLE = "nvidia_v3"


class NvidiaMemo:
    """codegen/nvidia.py's features of each SPIR-V module, kept beside the object cache (its
    SQLite file, a table of its own keyed by the sha256 of the module and the object cache's
    salt), so that a warm build reads them rather than measuring again.  An entry that does not
    read back as seven non-negative numbers is ignored; an unusable file is no memo."""

    def __init__(
        self, salt: bytes, analyze: Callable[[bytes], NvidiaFeatures], enabled: bool = True
    ) -> None:
        self.db: sqlite3.Connection | None = None
        self.salt = salt
        self.analyze = analyze
        self.new: list[tuple[str, int, float, float, int, int, float, int, float]] = []
        self.used: list[str] = []
        if not enabled:
            return
        try:
            self.db = sqlite3.connect(private_folder("objects") / "objects.sqlite", timeout=10)
            self.db.execute(
                f"CREATE TABLE IF NOT EXISTS {NVIDIA_TABLE} (key TEXT PRIMARY KEY, sunk INTEGER, "
                "words REAL, reuse REAL, dots INTEGER, least INTEGER, lane REAL, carried INTEGER, "
                "used REAL)"
            )
        except (OSError, sqlite3.Error):
            self.db = None

    def features(self, spv: bytes) -> NvidiaFeatures:
        """The module's features: from the memo, else measured (and kept at `close`)."""
        key = hashlib.sha256(self.salt + spv).hexdigest()
        if self.db is not None:
            try:
                row = self.db.execute(
                    f"SELECT sunk, words, reuse, dots, least, lane, carried FROM {NVIDIA_TABLE} "
                    "WHERE key = ?",
                    (key,),
                ).fetchone()
            except sqlite3.Error:
                row = None
            if (
                row is not None
                and all(isinstance(n, int | float) and n >= 0 for n in row)
                and all(isinstance(row[i], int) for i in (0, 3, 4, 6))
            ):
                self.used.append(key)
                return NvidiaFeatures(
                    row[0], float(row[1]), float(row[2]), row[3], row[4], float(row[5]), row[6]
                )
        f = self.analyze(spv)
        self.new.append(
            (
                key,
                f.sunk,
                f.block_words,
                f.reuse_words,
                f.dots,
                f.least,
                f.lane_words,
                f.carried,
                time.time(),
            )
        )
        return f

    def close(self) -> None:
        if self.db is None:
            return
        try:
            with self.db:
                self.db.executemany(
                    f"INSERT OR REPLACE INTO {NVIDIA_TABLE} VALUES (?,?,?,?,?,?,?,?,?)", self.new
                )
                now = time.time()
                self.db.executemany(
                    f"UPDATE {NVIDIA_TABLE} SET used = ? WHERE key = ?",
                    [(now, k) for k in self.used],
                )
                self.db.execute(
                    f"DELETE FROM {NVIDIA_TABLE} WHERE key NOT IN "
                    f"(SELECT key FROM {NVIDIA_TABLE} ORDER BY used DESC LIMIT ?)",
                    (OBJECT_ENTRIES,),
                )
        except sqlite3.Error:
            pass
        finally:
            self.db.close()


def code_digest() -> str:
    """A hash of the compiler's own code: a cached build from another fusec is never reused."""
    h = hashlib.sha256()
    for package in (Path(__file__).parent, Path(ir.__file__).parent):
        for f in sorted([*package.glob("*.py"), *package.glob("*.lark")]):
            h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()
