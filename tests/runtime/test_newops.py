"""New fused ops written from the README alone (tests/data/newops.fuse: LayerNorm + matvec with
a bias, GELU and GeGLU FFNs with their down projections, per-head QK-norm, partial NORMAL RoPE,
a sampling head with temperature, argmax and top-k, a residual RMSNorm written as f32 and f16,
a quantized matvec with bias and SiLU, Gemma 2 soft-capping, a sigmoid MoE gate, a causal
convolution step, explicit lane exchanges on tiles, LayerNorm as a stage group before a
projection and after one, an LM head with top-k in one dispatch, an embedding row at a run-time
token, a state-space decode step): every region and instance builds, and runs
fused and unfused against the numpy reference on fresh random inputs on lavapipe at subgroup
sizes 4, 8 and 16."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from fusec.codegen.build import build_source, write_build
from tests.conftest import check_on_lavapipe

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
    regions = result.program.regions
    out = check_on_lavapipe([str(built)], width, subgroup)
    # every region and instance ran its fused kernels (no fallback), each output compared
    paths = dict(re.findall(r"^(\w+) \[[^\]]*\]: ([\w() ]+);", out, re.M))
    # a tile's group wider than the device's subgroup exchanges through shared memory
    lanes = {"tile_exchanges": 16, "slot_exchanges": 8}
    shared = {n for n, g in lanes.items() if subgroup < g}
    assert paths == {
        r.name: "fused(shared exchange)" if r.name in shared else "fused" for r in regions
    }
    assert out.count(" ok\n") == sum(len(r.outputs) for r in regions) == 37
    assert len(regions) == 24  # 18 regions, two of them with 2 instances, two with 3
