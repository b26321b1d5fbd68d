"""Per-workgroup regions (`per workgroup h < H`) writing outputs the grid-wide lowering handled
alone before: a contraction stored per workgroup, and a state output at a run-time index.
Both once stopped the build with an internal error; here they run fused and unfused on
lavapipe against the reference."""

from __future__ import annotations

import numpy as np
import pytest

from fusec.codegen.build import build_source, write_build
from fusec.dsl import ir
from fusec.runtime.device import Device
from fusec.runtime.dispatch import Build
from fusec.runtime.verify import check_region

pytestmark = [pytest.mark.shaderc, pytest.mark.vulkan]

TEXT = """
region head_matvec(x: f32[H, K], W: f32[H, N, K]) -> y: f32[H, N]
    const H = 4 in 1 .. 64, N = 24 in 1 .. 1024, K = 100 in 1 .. 4096
    launch workgroup 64, subgroup any, rows_per_subgroup 2
    per workgroup h < H
    xs[k]   = x[h, k] * 0.5                                in shared
    y[h, n] = sum(k: W[h, n, k] * xs[k])                   layout n -> subgroup, k -> lane x 4

region head_cache(x: f32[H, D]) -> (kc: state f32[H, C, D], vc: state f32[C, H, D])
    const H = 4 in 1 .. 64, D = 8 in 1 .. 256, C = 16 in 1 .. 1024
    param pos in 0 .. 1023
    launch workgroup 64
    per workgroup h < H
    kc[h, pos, d] = x[h, d] * 2.0
    vc[pos, h, d] = x[h, d] + 1.0
"""


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Build:
    out = tmp_path_factory.mktemp("per") / "b"
    write_build(build_source(TEXT, "per.fuse"), out)
    return Build.load(out)


def _region(name: str) -> ir.Region:
    program = build_source(TEXT, "per.fuse").program
    return next(r for r in program.regions if r.name == name)


@pytest.mark.parametrize(("h", "n", "k"), [(4, 24, 100), (3, 7, 33), (1, 1, 1)])
def test_contraction_stored_per_workgroup(
    dev: Device, build: Build, h: int, n: int, k: int
) -> None:
    rep = check_region(dev, build, _region("head_matvec"), {"H": h, "N": n, "K": k})
    assert rep.path == "fused" and rep.fused_dispatches == 1
    assert rep.ok, [(o.name, o.fused_error, o.unfused_error) for o in rep.outputs]


def test_state_output_written_per_workgroup(dev: Device, build: Build) -> None:
    pos = int(np.random.default_rng().integers(0, 16))
    rep = check_region(dev, build, _region("head_cache"), {"pos": pos})
    assert rep.path == "fused"
    # check compares the whole caches: the row at pos and every row kept from before
    assert {o.name for o in rep.outputs} == {"kc", "vc"}
    assert rep.ok, [(o.name, o.fused_error, o.unfused_error) for o in rep.outputs]
