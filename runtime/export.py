"""`fusec export DIR --c-header FILE`: a build folder as one self-contained C99 header.

Input: a build folder that `fusec build` wrote, validated as `fusec check DIR` validates it
(runtime/prebuilt.py: the manifest's integrity digest, its schema and consistency, every
module's sha256 and declarations, spirv-val where installed; then the regions against the
folder's own source.fuse); a missing or damaged folder is one sentence, exit 1.
Output: FILE, the header of runtime/c_header.py, written atomically: a temporary file beside
FILE, renamed over it.  FILE must be new or a header fusec wrote (its first line is
`c_header.MARKER`): fusec never changes a file it did not create.  A FILE that already holds
the same bytes is left alone (its time stamp too).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from fusec.codegen import manifest_records as mr

from .owned import write_owned


def _mark() -> bytes:
    from .c_header import MARKER

    return (MARKER + "\n").encode()


def write_header(path: Path, text: str) -> bool:
    """Write `text` to `path` atomically (runtime/owned.py).  `path` must not exist, or hold a
    header fusec wrote; anything else is refused in one sentence and left as it was.  False
    when `path` already held exactly `text` (not rewritten)."""
    return write_owned(
        path, text.encode(), lambda start: start.startswith(_mark()), "a header fusec wrote"
    )


def load_folder(
    folder: str, regions: Sequence[str]
) -> tuple[mr.Manifest, dict[str, bytes], tuple[str, ...]]:
    """The manifest and the checked SPIR-V of a build folder, validated as `fusec check DIR`
    validates it, and the names of `regions` (display names resolved); RuntimeFailure (one
    sentence) for a missing or damaged folder, DiagnosticError for a name of no region."""
    from fusec.codegen.build import check_source
    from fusec.dsl.region_names import resolve_regions

    from .device import RuntimeFailure
    from .dispatch import Build

    path = Path(folder)
    try:
        path.exists()
    except OSError as exc:  # a name too long for the file system
        raise RuntimeFailure(f"cannot export {folder}: {exc.strerror}") from None
    if not path.exists():
        raise RuntimeFailure(
            f"cannot export {folder}: no such folder", "run fusec build FILE -o DIR first"
        )
    if not path.is_dir():
        raise RuntimeFailure(f"cannot export {folder}: it is not a build folder")
    build = Build.load(path)
    copy = build.path / build.manifest.source_copy
    try:
        text = copy.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise RuntimeFailure(
            f"build folder {folder} is damaged: cannot read {copy.name} ({exc})"
        ) from None
    # the source checked again with the options its build recorded, as `fusec check DIR` does
    targets = build.manifest.options.targets
    build.check_program(check_source(text, build.manifest.source, targets))
    # a region's name or an instance's display name (`mv<q4_0>`), as every command takes
    regions = resolve_regions(build.manifest.regions, regions, f"build folder {folder}")
    build.verify(list(regions) or None)  # spirv-val, where installed
    modules = {
        k.name: build.spv(k)
        for r in build.manifest.regions
        if not regions or r.name in regions
        for k in r.kernels()
    }
    return build.manifest, modules, regions


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("folder", help="a build folder made by fusec build")
    p.add_argument(
        "--c-header",
        required=True,
        metavar="FILE.h",
        help="write one self-contained C99 header: SPIR-V, bindings, constants, grids, barriers",
    )
    p.add_argument("--region", action="append", default=[], help="only this region (repeatable)")
    p.add_argument(
        "--prefix",
        default="fusec",
        help="begin the header's names with this (default fusec): headers of two builds, "
        "exported with two prefixes, can be included in one file",
    )


def cmd_export(args: argparse.Namespace) -> int:
    from .c_header import check_prefix, emit_header

    prefix = check_prefix(args.prefix)  # before the folder is read
    data, modules, regions = load_folder(args.folder, list(dict.fromkeys(args.region)))
    regions = tuple(dict.fromkeys(regions))
    text = emit_header(data, modules, list(regions) or None, prefix)
    out = Path(args.c_header)
    changed = write_header(out, text)
    n_regions = len(regions) if regions else len(data.regions)
    state = "wrote" if changed else "unchanged:"
    print(f"fusec: {state} {out} ({n_regions} region(s), {len(modules)} kernel(s))")
    return 0
