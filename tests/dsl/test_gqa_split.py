"""attention_split_gqa (one workgroup per key/value head and run) computes what attention_split
(one per query head and run) computes, element for element, in the numpy reference."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fusec.dsl.check import check
from fusec.dsl.parse import parse
from fusec.dsl.reference import run_reference

KERNELS = Path(__file__).parents[2] / "kernels.fuse"


@pytest.mark.parametrize(
    ("nq", "g", "d", "c", "ns", "pos"),
    [(8, 4, 32, 64, 4, 37), (6, 3, 20, 37, 5, 3), (12, 2, 16, 50, 8, 49), (4, 1, 8, 9, 4, 8)],
)
def test_gqa_split_equals_attention_split(
    nq: int, g: int, d: int, c: int, ns: int, pos: int
) -> None:
    program = check(parse(KERNELS.read_text(), "kernels.fuse"))
    rng = np.random.default_rng()
    nk = nq // g
    inputs = {
        "q": rng.standard_normal((nq, d)).astype(np.float32),
        "kc": rng.standard_normal((nk, c, d)).astype(np.float32),
        "vt": rng.standard_normal((nk, d, c)).astype(np.float32),
    }
    want = run_reference(
        program.region("attention_split"),
        inputs,
        {"NQ": nq, "NK": nk, "D": d, "C": c, "NS": ns, "pos": pos},
    )
    got = run_reference(
        program.region("attention_split_gqa"),
        inputs,
        {"NQ": nq, "G": g, "D": d, "C": c, "NS": ns, "pos": pos},
    )
    for name in ("mp", "lp", "op"):
        assert not np.isnan(got[name]).any(), name
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-30, err_msg=name)
