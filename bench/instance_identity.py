"""Compare a build of generic kernels.fuse with a build of the regions it replaced, instance by
instance: the SPIR-V of every kernel byte for byte, and the manifest's region record (buffers,
constants and ranges, launch, budget, kernels) but for the source line and the instance record.

    python bench/instance_identity.py BEFORE_DIR AFTER_DIR

BEFORE_DIR: `fusec build kernels.fuse -o BEFORE_DIR` at a commit before the rewrite (the regions
written once per dtype); AFTER_DIR: the same with the generic regions.  An instance is compared
with the old region of its own name (the naming rule keeps the old names: `R` for the first
dtype, `R_<dtype>` for the others, `instance` lines for the rest); the script fails when an
instance has no old region, or a kernel or record differs.  Prints one line per instance.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def _regions(folder: Path) -> dict[str, dict[str, Any]]:
    data = json.loads((folder / "manifest.json").read_text())
    return {r["name"]: r for r in data["regions"]}


def _comparable(r: dict[str, Any]) -> dict[str, Any]:
    """A region record without what may differ between the two sources."""
    return {k: v for k, v in r.items() if k not in ("line", "instance")}


def compare(before: Path, after: Path) -> list[str]:
    """The differences between the instances of `after` and their old regions in `before`."""
    old, new = _regions(before), _regions(after)
    problems = []
    for name, r in new.items():
        inst = r.get("instance")
        if inst is None:
            continue
        shown = f"{inst['of']}<{', '.join(inst['bindings'].values())}>"
        if name not in old:
            problems.append(f"{name} ({shown}): no region of that name before")
            continue
        kernels = [
            k["name"] for key in ("fused", "unfused", "fused_shared") for k in r.get(key, ())
        ]
        differ = [
            k
            for k in kernels
            if not (before / f"{k}.spv").is_file()
            or (before / f"{k}.spv").read_bytes() != (after / f"{k}.spv").read_bytes()
        ]
        if differ:
            problems.append(f"{name} ({shown}): SPIR-V differs: {', '.join(differ)}")
        elif _comparable(r) != _comparable(old[name]):
            keys = sorted(k for k in _comparable(r) if r[k] != old[name].get(k))
            problems.append(f"{name} ({shown}): manifest record differs in {', '.join(keys)}")
        else:
            print(f"{name:32} {shown:32} {len(kernels)} kernels identical")
    return problems


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    problems = compare(Path(argv[0]), Path(argv[1]))
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
