"""argmax, argmin, topk and argtopk on the Vulkan device, and the MoE router of kernels.fuse
(issue 15): on inputs full of ties, every index the fused kernel and the unfused chain write
equals the numpy reference's and a plain sort's (ties to the lowest index), at every scope, and
at lavapipe's subgroup sizes 4, 8 and 16."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fusec.dsl.check import check
from fusec.dsl.parse import parse, parse_file
from fusec.dsl.reference import run_reference
from tests.conftest import ROOT

pytestmark = [pytest.mark.vulkan, pytest.mark.shaderc]

K = 5  # values a topk keeps in SELECT
SELECT = f"""\
region sel(x: f32[N], y: f32[M, N]) -> (
        a: u32, b: u32, c: i32, f: f32, tv: f32[{K}], ti: u32[{K}], sv: f32[{K}],
        si: u32[{K}], lv: f32[{K}], li: u32[{K}], r: u32[M], q: f32[{K}], rs: u32[M],
        rn: i32[M])
    const N = 1000 in {K} .. 65536, M = 7 in 1 .. 4096
    launch workgroup 64, subgroup any
    ai    = argmax(n: x[n]) @ workgroup
    a     = ai
    b     = argmin(n: x[n]) @ subgroup
    c     = argmax(n: 0.0 - x[n]) @ lane
    f     = float(ai) * 0.5 + 1.0
    tk[j] = topk({K}, n: x[n]) @ workgroup
    ki[j] = argtopk({K}, n: x[n]) @ workgroup
    tv[j] = tk[j]
    ti[j] = ki[j]
    sv[j] = topk({K}, n: x[n] * 2.0) @ subgroup
    si[j] = argtopk({K}, n: x[n] * 2.0) @ subgroup
    lv[j] = topk({K}, n: 1.0 - x[n]) @ lane
    li[j] = argtopk({K}, n: 1.0 - x[n]) @ lane
    r[m]  = argmax(n: y[m, n]) @ lane
    rs[m] = argmax(n: y[m, n]) @ subgroup
    rn[m] = argmin(n: y[m, n]) @ subgroup
    q[j]  = tk[j] / tk[0] + float(ki[j])
"""
# few distinct values (never 0), so that every selection meets ties
LEVELS = np.array([-1.5, -0.25, 0.5, 2.0, 3.0], np.float32)


def _order(v: np.ndarray) -> list[int]:
    """Indices by value descending, equal values by index ascending: the tie rule, written
    without the reference's code."""
    return sorted(range(v.size), key=lambda i: (-float(v[i]), i))


def _run(
    dev: Any, text: str, name: str, inputs: dict[str, np.ndarray], consts: dict[str, int], tmp: Path
) -> list[Any]:
    """The fused and the unfused run of a region built from `text`."""
    from fusec.codegen.build import build_source, write_build
    from fusec.runtime.dispatch import Build, RegionRunner

    build = Build.load(write_build(build_source(text, f"{name}.fuse"), tmp / name))
    runner = RegionRunner(dev, build, name, consts)
    try:
        return [runner.run(inputs, fused=True), runner.run(inputs, fused=False)]
    finally:
        runner.close()


def _select_inputs(rng: np.random.Generator, n: int, m: int) -> dict[str, np.ndarray]:
    return {
        "x": rng.choice(LEVELS, n).astype(np.float32),
        "y": rng.choice(LEVELS, (m, n)).astype(np.float32),
    }


def check_select(dev: Any, tmp: Path, rng: np.random.Generator) -> int:
    """SELECT on tie-laden inputs at random sizes: every output of fused and unfused equals the
    reference exactly, and the reference equals a plain sort.  Returns the subgroup size."""
    n = int(rng.integers(K, 3000))
    m = int(rng.integers(1, 20))
    inputs = _select_inputs(rng, n, m)
    x, y = inputs["x"], inputs["y"]
    # a tie at the top by construction (drawn, a short x may hold its largest level once)
    x[rng.choice(n, 2, replace=False)] = x.max()
    consts = {"N": n, "M": m}
    ref = run_reference(check(parse(SELECT, "sel.fuse")).region("sel"), inputs, consts)
    order = _order(x)
    assert int(ref["a"]) == order[0] == int(np.flatnonzero(x == x.max())[0])
    assert int(ref["b"]) == _order(-x)[0]
    assert int(ref["c"]) == _order(-x)[0]
    assert ref["ti"].tolist() == order[:K] and ref["si"].tolist() == order[:K]
    assert ref["li"].tolist() == _order(1.0 - x.astype(np.float64))[:K]
    np.testing.assert_array_equal(ref["tv"], x[order[:K]])
    assert ref["r"].tolist() == [_order(row)[0] for row in y] == ref["rs"].tolist()
    assert ref["rn"].tolist() == [_order(-row)[0] for row in y]
    assert (x == x.max()).sum() > 1, "the inputs must tie at the top"
    runs = _run(dev, SELECT, "sel", inputs, consts, tmp)
    for run in runs:
        for name, want in ref.items():
            got = run.outputs[name]
            assert got.dtype == want.dtype, name
            if name in ("f", "q"):  # arithmetic on the selections: a division may round
                np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=name)
            else:  # indices, and values copied from the input
                np.testing.assert_array_equal(got, want, err_msg=name)
    assert runs[0].path == "fused" and runs[0].dispatches == 1
    return int(runs[0].subgroup_sizes[0])


def check_router(dev: Any, tmp: Path, rng: np.random.Generator) -> int:
    """kernels.fuse's moe_router at E = 128, H = 4096 with experts whose weights are equal (so
    are their logits and probabilities): indices exact, weights within 1e-4, one dispatch."""
    from fusec.codegen.build import build_source, write_build
    from fusec.runtime.dispatch import Build, RegionRunner

    e, h = 128, 4096
    x = rng.standard_normal(h).astype(np.float32)
    wr = rng.uniform(-0.05, 0.05, (e, h)).astype(np.float16)
    logits = wr.astype(np.float64) @ x.astype(np.float64)
    top = _order(logits)
    # the largest expert's weights copied to a random other expert, and the fourth's to the
    # tenth's: ties at the top and across the cut at 8, in both index orders
    twin = int(rng.choice([i for i in range(e) if i != top[0]]))
    wr[twin] = wr[top[0]]
    wr[top[9]] = wr[top[3]]
    inputs = {"x": x, "Wr": wr}
    consts = {"H": h, "E": e}
    program = check(parse_file(ROOT / "kernels.fuse"))
    ref = run_reference(program.region("moe_router"), inputs, consts)
    logits = wr.astype(np.float64) @ x.astype(np.float64)
    want = _order(logits)[:8]
    assert ref["idx"].tolist() == want
    assert min(twin, top[0]) in want and max(twin, top[0]) in want
    p = np.exp(logits - logits.max())
    np.testing.assert_allclose(ref["w"], p[want] / p[want].sum(), rtol=1e-6)
    text = (ROOT / "kernels.fuse").read_text()
    build = Build.load(
        write_build(build_source(text, "kernels.fuse", regions=("moe_router",)), tmp / "r")
    )
    runner = RegionRunner(dev, build, "moe_router", consts)
    try:
        runs = [runner.run(inputs, fused=True), runner.run(inputs, fused=False)]
    finally:
        runner.close()
    for run in runs:
        np.testing.assert_array_equal(run.outputs["idx"], ref["idx"])
        err = np.abs(run.outputs["w"] - ref["w"]).max() / np.abs(ref["w"]).max()
        assert err <= 1e-4, err
    assert runs[0].path == "fused" and runs[0].dispatches == 1
    assert runs[1].dispatches > 1
    return int(runs[0].subgroup_sizes[0])


def test_select_with_ties(dev: Any, tmp_path: Path) -> None:
    check_select(dev, tmp_path, np.random.default_rng())


def test_router_with_ties(dev: Any, tmp_path: Path) -> None:
    check_router(dev, tmp_path, np.random.default_rng())


def _child(tmp: str) -> None:
    """Run in a child process whose lavapipe has the subgroup size under test."""
    from fusec.runtime.device import Device

    rng = np.random.default_rng()
    with Device() as dev:
        sizes = [check_select(dev, Path(tmp), rng), check_router(dev, Path(tmp), rng)]
    print(json.dumps(sizes))


@pytest.mark.slow
@pytest.mark.parametrize(("width", "subgroup"), [(128, 4), (256, 8), (512, 16)])
def test_select_at_lavapipe_subgroup_sizes(tmp_path: Path, width: int, subgroup: int) -> None:
    """LP_NATIVE_VECTOR_WIDTH sets lavapipe's subgroup size (bits / 32)."""
    import subprocess

    if "llvmpipe" not in (os.environ.get("FUSEC_DEVICE") or "llvmpipe"):
        pytest.skip("FUSEC_DEVICE selects a device other than lavapipe")
    env = {**os.environ, "LP_NATIVE_VECTOR_WIDTH": str(width), "FUSEC_DEVICE": "llvmpipe"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    code = f"from tests.runtime.test_select import _child; _child({str(tmp_path)!r})"
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == [subgroup, subgroup]


@pytest.mark.parametrize("subgroup", [4, 8, 16, 32, 64])
def test_the_router_matvec_spreads_over_the_grid(build: Any, subgroup: int) -> None:
    """issue 15: at E = 128, H = 4096 the router's matvec runs in >= 32 workgroups (one per
    expert), the softmax and top-k in the last; one fused kernel, at every subgroup size."""
    from fusec.codegen.manifest import workgroups

    region = build.region("moe_router")
    (k,) = region.fused
    assert k.counters and "vulkan_memory_model" in k.features
    e = int(np.random.default_rng().integers(32, 1025))
    assert workgroups(k, {"H": 4096, "E": 128, "TK": 8}, subgroup) == 128
    assert workgroups(k, {"H": 4096, "E": e, "TK": 8}, subgroup) == e
