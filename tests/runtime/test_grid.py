"""Stages in grid (`in grid`): a wide contraction spread over the grid, the rest in the last
workgroup to arrive, in one dispatch.  The grid the kernel gets, the plan it carries, and runs
on lavapipe at subgroup sizes 4, 8 and 16 and with 1 and 4 threads, repeated on one runner and
replayed from one command buffer (the arrival counter must come back to 0 each time)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fusec.codegen import kir
from fusec.codegen.build import build_source, write_build
from fusec.codegen.glsl import emit_glsl
from fusec.codegen.lower import lower_fused
from fusec.codegen.manifest import workgroups
from fusec.dsl.check import check
from fusec.dsl.parse import parse
from fusec.dsl.reference import run_reference
from fusec.runtime.dispatch import Build

GRID = Path(__file__).resolve().parents[1] / "data" / "grid.fuse"


def _region(name: str) -> Any:
    prog = check(parse(GRID.read_text(), str(GRID)))
    return next(r for r in prog.regions if r.name == name)


def test_matvec_takes_the_grid_and_softmax_the_last_workgroup() -> None:
    (k,) = lower_fused(_region("matvec_softmax"))
    assert [(p.stage, p.distribution) for p in k.plan] == [
        ("y", kir.Distribution.GRID),
        ("m", kir.Distribution.LAST),
        ("l", kir.Distribution.LAST),
        ("p", kir.Distribution.LAST),
    ]
    kinds = [type(p).__name__ for p in k.phases]
    assert kinds == ["Contract", "Arrive", "ScalarPhase", "ScalarPhase", "StoreMap"]
    arrive = k.phases[1]
    assert isinstance(arrive, kir.Arrive)
    assert [b.name for b in arrive.scratch] == ["y"]
    assert [c.name for c in k.counters] == ["arrivals"]
    # the grid follows the matvec (128 rows, one per workgroup), not the softmax's 128 values
    # on one workgroup of 64 lanes
    assert len(k.grid) == 1 and k.grid[0].per_workgroup == 1


def test_release_acquire_in_the_glsl() -> None:
    (k,) = lower_fused(_region("matvec_softmax"))
    text = emit_glsl(k, line_directives=False)
    assert "#pragma use_vulkan_memory_model" in text
    assert "coherent buffer B_y" in text
    add = "atomicAdd(b_arrivals[0], 1u, gl_ScopeQueueFamily, gl_StorageSemanticsBuffer, "
    assert add + "gl_SemanticsAcquireRelease)" in text
    assert "atomicStore(b_arrivals[0], 0u" in text  # the last workgroup resets the counter
    body = text[text.index("void main()") :]
    before, after = body.split("if (s_last == 0u) {")
    assert "b_y[row_0] = acc0_0" in before and "b_p[" in after and "b_p[" not in before


@pytest.fixture(scope="module")
def grid_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    result = build_source(GRID.read_text(), "tests/data/grid.fuse")
    return write_build(result, tmp_path_factory.mktemp("grid") / "build")


@pytest.mark.shaderc
@pytest.mark.parametrize("subgroup", [4, 8, 16, 32, 64])
def test_matvec_uses_at_least_32_workgroups(grid_folder: Path, subgroup: int) -> None:
    """The manifest's grid (what the runtime dispatches) at every subgroup size: 128 rows,
    one per workgroup, whatever the subgroup size; the fused product is one kernel."""
    region = Build.load(grid_folder).region("matvec_softmax")
    (k,) = region.fused
    assert k.counters == ("arrivals",) and "vulkan_memory_model" in k.features
    assert workgroups(k, {"K": 4096, "N": 128}, subgroup) == 128
    assert workgroups(k, {"K": 4096, "N": 40}, subgroup) == 40


def _runs(folder: Path, region: str, env: dict[str, str], *consts: str) -> str:
    root = Path(__file__).resolve().parents[2]
    script = str(Path(__file__).parent / "grid_runs.py")
    proc = subprocess.run(
        [sys.executable, script, str(folder), region, "3", *consts],
        capture_output=True,
        text=True,
        env={**os.environ, **env, "PYTHONPATH": str(root), "FUSEC_DEVICE": "llvmpipe"},
        timeout=300,  # a wrong arrival hangs rather than fails
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.mark.vulkan
@pytest.mark.shaderc
@pytest.mark.parametrize(
    ("width", "subgroup", "threads"),
    [(128, 4, "4"), (256, 8, "4"), (512, 16, "4"), (256, 8, "1"), (128, 4, "1")],
)
def test_runs_repeated_on_lavapipe(
    grid_folder: Path, width: int, subgroup: int, threads: str
) -> None:
    if "llvmpipe" not in (os.environ.get("FUSEC_DEVICE") or "llvmpipe"):
        pytest.skip("FUSEC_DEVICE selects a device other than lavapipe")
    env = {"LP_NATIVE_VECTOR_WIDTH": str(width), "LP_NUM_THREADS": threads}
    for consts in ([], ["K=1000", "N=77"]):
        out = _runs(grid_folder, "matvec_softmax", env, *consts)
        lines = out.splitlines()
        assert len(lines) == 5 and all(line.endswith("ok") for line in lines), out
        assert f"subgroup ({subgroup},)" in lines[0] and "1 dispatch(es)" in lines[0]
        assert "counters after [0]" in lines[2]


def test_attention_split_combine_plan(kernels_build: Any) -> None:
    """kernels.fuse's fused attention: the split per workgroup (g < NQ * NS), its partial
    results in grid, each head combined by the last of its workgroups; one kernel."""
    (k,) = [b.kernel for b in kernels_build.kernels if b.kernel.name == "attention_split_combine"]
    dist = {p.stage: p.distribution for p in k.plan}
    assert [s for s, d in dist.items() if d == kir.Distribution.GRID] == ["mp", "lp", "op"]
    assert [s for s, d in dist.items() if d == kir.Distribution.LAST] == ["mm", "o"]
    assert k.grid[0].per_workgroup == 1  # NQ * NS workgroups, one per run of a head
    (arrive,) = [p for p in k.phases if isinstance(p, kir.Arrive)]
    assert [b.name for b in arrive.scratch] == ["mp", "lp", "op"]
    # one counter per head: the last of the head's NS workgroups combines its runs
    assert arrive.group is not None and arrive.group_size is not None
    (counter,) = k.counters
    group = k.region.group
    assert group is not None and counter.shape == (group.var.extent,)  # NQ counters


@pytest.mark.vulkan
@pytest.mark.shaderc
@pytest.mark.parametrize(
    ("width", "subgroup", "threads"), [(128, 4, "4"), (256, 8, "1"), (512, 16, "4")]
)
def test_attention_split_combine_on_lavapipe(
    kernels_folder: Path, width: int, subgroup: int, threads: str
) -> None:
    if "llvmpipe" not in (os.environ.get("FUSEC_DEVICE") or "llvmpipe"):
        pytest.skip("FUSEC_DEVICE selects a device other than lavapipe")
    env = {"LP_NATIVE_VECTOR_WIDTH": str(width), "LP_NUM_THREADS": threads}
    # C not a multiple of NS (the last run wraps), pos inside the cache and past some runs
    consts = ["NQ=4", "NK=2", "D=32", "C=100", "NS=4", "pos=61"]
    out = _runs(kernels_folder, "attention_split_combine", env, *consts)
    lines = out.splitlines()
    assert len(lines) == 5 and all(line.endswith("ok") for line in lines), out
    assert f"subgroup ({subgroup},)" in lines[0] and "1 dispatch(es)" in lines[0]


# the attention products other than the default split, the first of their regions, and the
# regions of the default they replace
_PRODUCTS = {
    "fused": ("attention_split_combine", ("attention_split", "attention_combine")),
    "rope": ("attention_rope_split", ("rope_kv_store", "attention_split", "attention_combine")),
}


@pytest.mark.vulkan
@pytest.mark.shaderc
@pytest.mark.parametrize("wdtype", ["f16", "q4_0"])
@pytest.mark.parametrize("product", sorted(_PRODUCTS))
def test_decode_layer_with_fused_attention(dev: Any, build: Any, wdtype: str, product: str) -> None:
    """The tiny layer with attention in one dispatch fewer (`fused`: split and combine in one;
    `rope`: RoPE and the cache write folded into the split and combine steps): every token of
    a replayed recording (advancing pos, counters and caches reused) matches the numpy layer,
    as the default split attention does."""
    from examples.decode_layer.run import TOLERANCE, decode
    from fusec.runtime import decode_layer as layer

    tiny = layer.PRESETS["tiny"]
    positions = [3, 4, 17, tiny.context - 1]
    seed = int(np.random.default_rng().integers(1 << 31))
    fused = decode(dev, build, tiny, wdtype, positions, seed=seed, attention=product)
    split = decode(dev, build, tiny, wdtype, positions, seed=seed, attention="split")
    for res in (fused, split):
        for t in res.tokens:
            assert all(e <= TOLERANCE[wdtype] for e in t.errors.values()), (t.pos, t.errors)
    first, replaced = _PRODUCTS[product]
    paths = dict(fused.report.paths)
    assert paths[first] == "fused"
    assert not set(replaced) & set(paths)
    assert fused.report.dispatches == split.report.dispatches - 1
    assert fused.report.barriers == split.report.barriers - 1
    # the same layer: the attention products agree with each other to f32 rounding
    for a, b in zip(fused.outputs, split.outputs, strict=True):
        for name in ("out", "kc", "vt"):
            want = b[name]
            assert np.allclose(a[name], want, rtol=1e-5, atol=1e-5 * np.abs(want).max()), name


def test_attention_switch_is_strict(monkeypatch: pytest.MonkeyPatch) -> None:
    from fusec.runtime import decode_layer as layer
    from fusec.runtime.device import RuntimeFailure

    tiny = layer.PRESETS["tiny"]
    monkeypatch.setenv("FUSEC_ATTENTION", "fused")
    names = [c.region for c in layer.calls(tiny, "f16")]
    assert "attention_split_combine" in names and "attention_split" not in names
    monkeypatch.setenv("FUSEC_ATTENTION", "split")
    names = [c.region for c in layer.calls(tiny, "f16")]
    assert names.count("attention_split") == 1 and "attention_combine" in names
    monkeypatch.setenv("FUSEC_ATTENTION", "rope")
    names = [c.region for c in layer.calls(tiny, "q4_0")]
    assert names.count("attention_rope_split") == 1 and "rope_kv_store" not in names
    with pytest.raises(RuntimeFailure, match=r"needs the layer.s Q\|K\|V as one projection"):
        layer.calls(tiny, "q4_k_m")
    for value in ("1", ""):  # a set but empty switch is refused too, never taken as unset
        monkeypatch.setenv("FUSEC_ATTENTION", value)
        with pytest.raises(RuntimeFailure, match=f"FUSEC_ATTENTION={value!r} is not an attention"):
            layer.calls(tiny, "f16")


@pytest.mark.slow
@pytest.mark.vulkan
@pytest.mark.shaderc
@pytest.mark.parametrize("family", ["gfx1201", "navi31"])
def test_estimator_counts_the_new_kernels_like_aco(tmp_path: Path, family: str) -> None:
    """The estimator measures SPIR-V, so kernels with an arrival are counted like any other:
    the fused kernels of grid.fuse and attention_split_combine against ACO (RADV's null
    device), within the suite's margin (tests/codegen/test_estimate.py)."""
    from fusec.codegen.build import build_file
    from tests.codegen.test_estimate import _compare

    kernels = (Path(__file__).resolve().parents[2] / "kernels.fuse").read_text()
    start = kernels.index("region attention_split_combine(")
    end = kernels.index("\n# ", start)
    # the stage groups the region uses: split_softmax and run_softmax, the one before it
    group = kernels.index("stages run_softmax(")
    group_end = kernels.index("\n# ", kernels.index("stages split_softmax("))
    src = tmp_path / "both.fuse"
    both = [GRID.read_text(), kernels[group:group_end], kernels[start:end]]
    src.write_text("\n".join(both) + "\n")
    result = build_file(src, tmp_path / "b", (family,))
    rows = [r for r in _compare(tmp_path / "b", result.manifest, family) if "." not in r["kernel"]]
    assert {r["kernel"] for r in rows} == {"matvec_softmax", "attention_split_combine"}
    assert len(rows) == 4  # two fused kernels, wave32 and wave64
    for r in rows:
        assert abs(r["est"] - r["presched"]) <= max(4, 0.10 * r["presched"]), r
        assert r["est_spills"] == r["aco_spills"] and r["est_lds"] == r["aco_lds"], r


@pytest.mark.slow
@pytest.mark.vulkan
@pytest.mark.shaderc
def test_the_c_engine_runs_a_kernel_with_an_arrival(grid_folder: Path, tmp_path: Path) -> None:
    """`fusec export` carries the counters (zeroed once, never poisoned) and the memory-model
    feature: examples/engine_c runs matvec_softmax in one dispatch and matches the reference."""
    from fusec.runtime.dispatch import const_values
    from fusec.runtime.verify import random_inputs, relative_error, tolerance_for
    from tests.runtime.test_export import compile_engine, export, run_engine

    header = tmp_path / "fusec_kernels.h"
    proc = export(grid_folder, header, "matvec_softmax")
    assert proc.returncode == 0, proc.stderr
    text = header.read_text()
    assert "FUSEC_FEATURE_VULKAN_MEMORY_MODEL" in text and "fusec_counters_" in text
    exe = compile_engine(tmp_path, tmp_path / "engine_c", "matvec_softmax")
    region = Build.load(grid_folder).region("matvec_softmax")
    values = const_values(region, {})
    inputs = random_inputs(region, values, np.random.default_rng())
    ref = run_reference(_region("matvec_softmax"), inputs, values)["p"]
    _, tol = tolerance_for(region)
    for options, want in (([], "fused; 1 dispatch(es)"), (["--unfused"], "unfused; 4")):
        out, outs = run_engine(exe, region, inputs, tmp_path, *options)
        assert want in out, out
        assert relative_error(outs["p"], ref) <= tol


@pytest.mark.shaderc
def test_every_target_runs_the_arrival_fused() -> None:
    """The targets offer the Vulkan memory model (codegen/targets.py), so the gate keeps the
    fused product: within budget on every target and wave."""
    from fusec.codegen.targets import TARGETS

    result = build_source(GRID.read_text(), "tests/data/grid.fuse", tuple(TARGETS))
    (region,) = result.manifest.regions
    assert {v.target for v in region.verdicts} == set(TARGETS)
    assert all(v.accepted and v.reason == "within budget" for v in region.verdicts), [
        v for v in region.verdicts if not v.accepted
    ]
