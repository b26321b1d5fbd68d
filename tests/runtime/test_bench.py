"""`fusec bench` on lavapipe: it checks results first, times both products side by side and
reports counts and the floor.  (Figures come from a GPU; nothing here asserts on time.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import fusec_cli

pytestmark = [pytest.mark.shaderc, pytest.mark.vulkan, pytest.mark.slow]


def test_bench_json_fields_and_counts(root: Path) -> None:
    proc = fusec_cli(
        [
            "bench",
            "kernels.fuse",
            "--region",
            "gated_ffn",
            "--region",
            "add_rms_norm",
            "--const",
            "H=256",
            "--const",
            "F=64",
            "--const",
            "K=256",
            "--reps",
            "3",
            "--copy-bytes",
            "1048576",
            "--per-dispatch",
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=root,
    )
    assert proc.returncode == 0, proc.stderr
    rows = {r["region"]: r for r in json.loads(proc.stdout)}
    ffn = rows["gated_ffn"]
    assert ffn["weight_bytes"] == 2 * 64 * 256 * 2  # Wg and Wu, f16
    assert (ffn["fused"]["dispatches"], ffn["unfused"]["dispatches"]) == (1, 3)
    assert (ffn["fused"]["barriers"], ffn["unfused"]["barriers"]) == (0, 1)
    assert ffn["fused"]["median_us"] > 0 and ffn["unfused"]["median_us"] > 0
    assert ffn["copies"] >= 2, "small weights rotate among copies to defeat the L2"
    for product in ("fused", "unfused"):  # a median per weight copy, to spot a slow copy
        per_copy = ffn[product]["per_copy_us"]
        assert len(per_copy) == min(ffn["copies"], 3) and all(u > 0 for u in per_copy)
    assert [d["kernel"] for d in ffn["per_dispatch"]["unfused"]] == [
        f"gated_ffn.unfused.{i}" for i in range(3)
    ]
    norm = rows["add_rms_norm"]
    assert (norm["fused"]["dispatches"], norm["unfused"]["dispatches"]) == (1, 4)
    assert norm["weight_bytes"] == 0 and norm["fused_over_floor"] is None


def test_bench_table_shows_no_floor_for_a_region_without_weights(root: Path) -> None:
    # add_rms_norm streams no weight matrix: the table said floor 0.0 us and fused/floor 0.00x
    proc = fusec_cli(
        ["bench", "kernels.fuse", "--region", "add_rms_norm", "--const", "K=256", "--reps", "2"],
        capture_output=True,
        text=True,
        cwd=root,
    )
    assert proc.returncode == 0, proc.stderr
    (row,) = [line for line in proc.stdout.splitlines() if "add_rms_norm " in line]
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    assert cells[0] == "add_rms_norm" and cells[1] == "fused"
    assert cells[-2:] == ["-", "-"] and "0.00x" not in row
