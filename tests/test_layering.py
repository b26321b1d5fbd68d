"""Imports point upstream only: dsl imports neither codegen nor runtime; codegen not runtime;
only runtime imports vulkan; only codegen/shaderc.py touches shaderc."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _top(name: str) -> str:
    """The package a module belongs to, `fusec.` left off: `fusec.codegen.ir` -> `codegen`."""
    parts = name.split(".")
    return parts[1] if parts[0] == "fusec" and len(parts) > 1 else parts[0]


def _imports(path: Path) -> set[str]:
    mods: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            mods |= {_top(a.name) for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module == "fusec" and node.level == 0:
            mods |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            mods.add(_top(node.module))
    return mods


def test_imports_point_upstream() -> None:
    for path in (ROOT / "dsl").glob("*.py"):
        assert not _imports(path) & {"codegen", "runtime", "vulkan"}, path
    for path in (ROOT / "codegen").glob("*.py"):
        assert not _imports(path) & {"runtime", "vulkan"}, path
        if path.name != "shaderc.py":
            assert "_shaderc" not in _imports(path), path
    for path in (ROOT / "runtime").glob("*.py"):
        assert "_shaderc" not in _imports(path), path
