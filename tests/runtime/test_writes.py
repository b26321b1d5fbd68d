"""Writes where they belong, run on lavapipe: stages that route rows to several outputs under
masks and write at computed indices (tests/data/writes.fuse), fused and unfused against the
numpy reference, at lavapipe's three subgroup sizes and at constants away from the defaults."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fusec.codegen.build import build_source, write_build
from fusec.dsl import ir
from fusec.runtime.device import Device
from fusec.runtime.dispatch import Build
from fusec.runtime.verify import check_region
from tests.conftest import check_on_lavapipe

pytestmark = [pytest.mark.shaderc, pytest.mark.vulkan]

SOURCE = Path(__file__).parent.parent / "data" / "writes.fuse"
REGIONS = ("head_route", "edges", "interleave_rows", "spread")


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Build:
    out = tmp_path_factory.mktemp("writes") / "b"
    write_build(build_source(SOURCE.read_text(), str(SOURCE)), out)
    return Build.load(out)


def _region(name: str) -> ir.Region:
    return build_source(SOURCE.read_text(), str(SOURCE)).program.region(name)


@pytest.mark.parametrize(
    ("name", "consts"),
    [
        ("head_route", {"NQ": 5, "NK": 3, "D": 24, "C": 9}),
        ("head_route", {"NQ": 1, "NK": 1, "D": 7, "C": 3}),
        ("edges", {"N": 50, "M": 4, "lo": 7}),
        ("edges", {"N": 16, "M": 1, "lo": 0}),
        ("interleave_rows", {"R": 5, "N": 13, "C": 11}),
        ("spread", {"N": 77}),
    ],
)
def test_routed_writes_match_the_reference(
    dev: Device, build: Build, name: str, consts: dict[str, int]
) -> None:
    rng = np.random.default_rng()
    params = {c.name: c for c in _region(name).consts if c.runtime}
    for p in params.values():
        limit = consts["C"] - 1  # a cache column or row inside C
        consts = {**consts, p.name: int(rng.integers(1, limit)) if limit > 1 else 0}
    rep = check_region(dev, build, _region(name), consts)
    assert rep.path == "fused" and rep.fused_dispatches == 1
    assert {o.name for o in rep.outputs} == {b.name for b in _region(name).outputs}
    assert rep.ok, [(o.name, o.fused_error, o.unfused_error) for o in rep.outputs]


@pytest.mark.slow
@pytest.mark.parametrize(("width", "subgroup"), [(128, 4), (256, 8), (512, 16)])
def test_writes_at_lavapipe_subgroup_sizes(root: Path, width: int, subgroup: int) -> None:
    """`fusec check` of every region (params at their low end, next, middle and high end)."""
    out = check_on_lavapipe([str(SOURCE.relative_to(root))], width, subgroup)
    assert out.count(" ok\n") == 3 + 2 + 2 + 1
    lines = out.splitlines()
    for name in REGIONS:
        (line,) = [ln for ln in lines if ln.startswith(f"{name} [")]
        assert ": fused;" in line


@pytest.mark.slow
@pytest.mark.parametrize(("width", "subgroup"), [(128, 4), (256, 8), (512, 16)])
def test_layer_regions_with_routed_writes_at_subgroup_sizes(
    root: Path, width: int, subgroup: int
) -> None:
    """kernels.fuse's qkv_rope_kv (q and both caches from the projection's epilogue) and
    attention_split_gqa (outputs at computed indices) at the tiny layer's constants."""
    tiny = ["H=256", "NQ=8", "NK=2", "G=4", "D=32", "C=64", "n_rot=32", "NS=4"]
    regions = ["kernels.fuse", "--region", "qkv_rope_kv", "--region", "attention_split_gqa"]
    out = check_on_lavapipe([*regions, *(a for c in tiny for a in ("--const", c))], width, subgroup)
    assert out.count(" ok\n") == 6 and out.count(": fused;") == 2
