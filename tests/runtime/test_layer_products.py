"""Every product of the tiny decode layer equals the numpy layer at lavapipe's subgroup sizes
4, 8 and 16 (issue 16): the attention products, the QKV epilogue, the grouped-query split, the
q8_0x chain, the unfused chain and every weight type, each in a child process per subgroup
size (tests/runtime/layer_products.py), two tokens at advancing pos from one recording."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runtime.layer_products import PRODUCTS

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.vulkan
@pytest.mark.shaderc
@pytest.mark.parametrize(("width", "subgroup"), [(128, 4), (256, 8), (512, 16)])
def test_every_layer_product_matches_numpy(kernels_folder: Path, width: int, subgroup: int) -> None:
    if "llvmpipe" not in (os.environ.get("FUSEC_DEVICE") or "llvmpipe"):
        pytest.skip("FUSEC_DEVICE selects a device other than lavapipe")
    env = {**os.environ, "LP_NATIVE_VECTOR_WIDTH": str(width), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests/runtime/layer_products.py"), str(kernels_folder)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=1200,
    )
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [r["product"] for r in rows] == list(PRODUCTS), proc.stdout + proc.stderr
    for r in rows:
        assert r["subgroup"] == subgroup, r
        assert r["ok"], r
    assert proc.returncode == 0, proc.stderr
    by_name = {r["product"]: {region for region, _ in r["paths"]} for r in rows}
    # the products are what their names say: each ran its own regions
    assert "attention_rope_split" in by_name["f16 rope (default)"]
    assert "attention_split_combine" in by_name["f16 fused attention"]
    assert "qkv_rope_kv" in by_name["f16 QKV epilogue"]
    assert "attention_split_gqa" in by_name["f16 grouped-query split"]
    assert any(n.startswith("matvec_add_q8in") for n in by_name["q4_0 q8_0x inputs"])
    assert "rope_kv_store_qk_v" in by_name["q4_k_m"]
