"""Tile regions: the shuffle lowering where the tile fits in a subgroup, the shared-memory
exchange where it does not, and the same results on lavapipe at 4, 8 and 16 lanes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from fusec.dsl.check import check
from fusec.dsl.parse import parse_file
from fusec.dsl.reference import run_reference
from tests.conftest import ROOT, fusec_cli

PROGRAM = check(parse_file(ROOT / "kernels.fuse"))
DSV4 = ["dsv4_hc_comb", "dsv4_hc_comb_slots", "dsv4_hc_pre", "dsv4_hc_post", "dsv4_hc_site"]


def _dis(path: Path) -> str:
    tool = shutil.which("spirv-dis")
    if tool is None:
        pytest.skip("spirv-dis not installed (spirv-tools)")
    return subprocess.run([tool, str(path)], capture_output=True, text=True, check=True).stdout


@pytest.mark.shaderc
def test_shuffle_and_shared_variants_of_the_sinkhorn(kernels_folder: Path) -> None:
    m = json.loads((kernels_folder / "manifest.json").read_text())
    comb = next(r for r in m["regions"] if r["name"] == "dsv4_hc_comb")
    [shuffle] = comb["fused"]
    [shared] = comb["fused_shared"]
    # the shuffle variant needs a subgroup holding the whole 16-lane tile; the other runs anywhere
    assert shuffle["exchange"] == "shuffle" and shuffle["subgroup"] == {
        "kind": "at_least",
        "sizes": [16],
    }
    assert shared["exchange"] == "shared" and shared["subgroup"]["kind"] == "any"
    wide = _dis(kernels_folder / shuffle["spv"])
    narrow = _dis(kernels_folder / shared["spv"])
    assert "OpGroupNonUniformShuffleXor" in wide
    assert "OpTypePointer Workgroup" not in wide, "no shared memory in the shuffle variant"
    assert "OpGroupNonUniformShuffleXor" not in narrow
    assert "OpTypePointer Workgroup" in narrow and "OpControlBarrier" in narrow


def test_reference_sinkhorn_matches_the_formula() -> None:
    """FACTS.md: softmax over dst + eps, columns normalized, then 19 rows/columns rounds."""
    rng = np.random.default_rng()
    t, eps = 5, 1e-6
    m = rng.standard_normal((t, 24)).astype(np.float32)
    s = rng.standard_normal(3).astype(np.float32)
    b = rng.standard_normal(24).astype(np.float32)
    got = run_reference(PROGRAM.region("dsv4_hc_comb"), {"m": m, "s": s, "b": b}, {"T": t})[
        "C"
    ].astype(np.float64)
    logits = (m[:, 8:24].astype(np.float64) * s[2] + b[8:24]).reshape(t, 4, 4)  # [t, src, dst]
    e = np.exp(logits - logits.max(axis=2, keepdims=True))
    c = e / e.sum(axis=2, keepdims=True) + eps
    c = c / (c.sum(axis=1, keepdims=True) + eps)
    for _ in range(19):
        c = c / (c.sum(axis=2, keepdims=True) + eps)
        c = c / (c.sum(axis=1, keepdims=True) + eps)
    np.testing.assert_allclose(got, c, rtol=1e-6, atol=1e-7)


@pytest.mark.slow
@pytest.mark.shaderc
@pytest.mark.vulkan
@pytest.mark.parametrize(
    ("width", "lanes", "exchange"),
    [(128, 4, "shared exchange"), (256, 8, "shared exchange"), (512, 16, None)],
)
@pytest.mark.parametrize("tokens", [1, 3, 64])
def test_dsv4_regions_on_lavapipe(
    root: Path, width: int, lanes: int, exchange: str | None, tokens: int
) -> None:
    if "llvmpipe" not in (os.environ.get("FUSEC_DEVICE") or "llvmpipe"):
        pytest.skip("FUSEC_DEVICE selects a device other than lavapipe")
    env = {**os.environ, "LP_NATIVE_VECTOR_WIDTH": str(width), "FUSEC_DEVICE": "llvmpipe"}
    args = [a for r in DSV4 for a in ("--region", r)]
    proc = fusec_cli(
        [
            "check",
            "kernels.fuse",
            *args,
            "--const",
            f"T={tokens}",
            "--const",
            "D=256",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=root,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"subgroup {lanes})" in proc.stdout
    comb = next(ln for ln in proc.stdout.splitlines() if ln.startswith("dsv4_hc_comb"))
    if exchange is None:
        assert ": fused; fused 1 dispatch" in comb
    else:
        assert f": fused({exchange}); fused 1 dispatch" in comb
    assert "unfused 62 dispatch(es)" in comb  # 4 + 19 x (2 + 1 copy) + the store
    # 4 lanes x 4 slots fits every subgroup: always the shuffle kernel
    slots = next(ln for ln in proc.stdout.splitlines() if ln.startswith("dsv4_hc_comb_slots"))
    assert ": fused; fused 1 dispatch" in slots
    outputs = sum(len(PROGRAM.region(r).outputs) for r in DSV4)
    assert proc.stdout.count(" ok\n") == outputs and "MISMATCH" not in proc.stdout
