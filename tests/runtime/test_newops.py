"""New fused ops written from the README alone (tests/data/newops.fuse: LayerNorm + matvec with
a bias, GELU and GeGLU FFNs with their down projections, per-head QK-norm, partial NORMAL RoPE,
a sampling head with temperature, argmax and top-k, a residual RMSNorm written as f32 and f16,
a quantized matvec with bias and SiLU, Gemma 2 soft-capping, a sigmoid MoE gate, a causal
convolution step, explicit lane exchanges on tiles, LayerNorm as a stage group before a
projection and after one, an LM head with top-k in one dispatch, an embedding row at a run-time
token, a state-space decode step): every region and instance builds, and runs
fused and unfused against the numpy reference on fresh random inputs on lavapipe at two of the
subgroup sizes 4, 8 and 16 (conftest.rotated_sizes: a quarter of them at 16, slow to compile)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from fusec.codegen.build import build_source, write_build
from tests.conftest import at_size, check_on_lavapipe, rotated_sizes

SOURCE = Path(__file__).parents[1] / "data" / "newops.fuse"


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    result = build_source(SOURCE.read_text(), str(SOURCE))
    return result, write_build(result, tmp_path_factory.mktemp("newops") / "build")


@pytest.mark.vulkan
@pytest.mark.shaderc
@pytest.mark.parametrize(("width", "subgroup"), [(128, 4), (256, 8), (512, 16)])
def test_every_new_op_verifies_at_lavapipe_subgroup_sizes(
    root: Path, folder: tuple[Any, Path], width: int, subgroup: int
) -> None:
    result, built = folder
    names = [r.name for r in result.program.regions]
    # tile_exchanges' group of 16 fits a subgroup only at 16 lanes: a kind of its own, so it
    # runs there (and at 4, through shared memory)
    rest = [n for n in names if n != "tile_exchanges"]
    sizes = rotated_sizes({"exchange16": ["tile_exchanges"], "rest": rest})
    regions = [r for r in result.program.regions if r.name in at_size(sizes, subgroup)]
    args = [a for r in regions for a in ("--region", r.name)]
    out = check_on_lavapipe([str(built), *args], width, subgroup)
    # every region and instance ran its fused kernels (no fallback), each output compared
    paths = dict(re.findall(r"^(\w+) \[[^\]]*\]: ([\w() ]+);", out, re.M))
    # a tile's group wider than the device's subgroup exchanges through shared memory
    lanes = {"tile_exchanges": 16, "slot_exchanges": 8}
    shared = {n for n, g in lanes.items() if subgroup < g}
    assert paths == {
        r.name: "fused(shared exchange)" if r.name in shared else "fused" for r in regions
    }
    assert out.count(" ok\n") == sum(len(r.outputs) for r in regions)
    assert sum(len(r.outputs) for r in result.program.regions) == 37
    # every region at 4 or 16 lanes, and at one more
    assert all(len(s) == 2 and s & {4, 16} for s in sizes.values()) and len(sizes) == 24
    assert sizes["tile_exchanges"] == {4, 16}
    # 18 regions, two of them with 2 instances, two with 3
    assert len(result.program.regions) == 24
