"""The fuzzer's seeds cut from kernels.fuse (frontend_mutate.split_regions) check on their own:
each region's piece carries the stage groups it uses and the instance lines after it, so a
mutation starts from a source the checker accepts, not from an unknown group."""

from __future__ import annotations

import re

from fusec.dsl.check import check
from fusec.dsl.parse import parse
from tests.fuzz.frontend_mutate import ROOT, split_regions


def test_every_region_piece_checks_on_its_own() -> None:
    text = (ROOT / "kernels.fuse").read_text()
    pieces = split_regions(text)
    regions = re.findall(r"^region (\w+)", text, flags=re.M)
    assert [re.search(r"^region (\w+)", p, flags=re.M).group(1) for p in pieces] == regions
    carried = 0
    for piece in pieces:
        module = parse(piece, "piece.fuse")
        program = check(module)  # raises DiagnosticError on an unknown or unused group
        assert [r.name for r in module.regions] == [re.search(r"^region (\w+)", piece, re.M)[1]]
        assert program.regions
        carried += len(module.groups)
    assert carried > 0  # kernels.fuse uses groups: some pieces carried them


def test_a_piece_carries_only_the_groups_it_uses_transitively() -> None:
    text = (
        "stages a(x: f32[K]) -> y: f32[K]\n    y[k] = x[k]\n\n"
        "stages b(x: f32[K]) -> y: f32[K]\n    t = a(x)\n    y[k] = t[k] * 2.0\n\n"
        "stages c(x: f32[K]) -> y: f32[K]\n    y[k] = x[k] + 1.0\n\n"
        "# r uses b\nregion r(x: f32[K]) -> y: f32[K]\n    const K = 8\n    y = b(x)\n\n"
        "region s(x: f32[K]) -> y: f32[K]\n    const K = 8\n    y = c(x)\n"
    )
    first, second = split_regions(text)
    assert re.findall(r"^stages (\w+)", first, re.M) == ["a", "b"]
    assert "# r uses b" in first and "region s" not in first
    assert re.findall(r"^stages (\w+)", second, re.M) == ["c"]
