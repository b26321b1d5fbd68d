"""The decode layer (examples/decode_layer) on the Vulkan device: the tiny preset, checked
against the independent numpy layer, fused against unfused, replay against re-recording, kill
switches per region, and `fusec bench --preset tiny --json`."""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from examples.decode_layer.run import TOLERANCE, decode
from fusec.runtime import decode_layer as layer
from tests.conftest import fusec_cli

pytestmark = [pytest.mark.vulkan, pytest.mark.shaderc, pytest.mark.slow]

TINY = layer.PRESETS["tiny"]


@pytest.mark.parametrize("wdtype", layer.WEIGHT_DTYPES)
def test_tiny_layer_matches_numpy_fused_and_unfused(dev: Any, build: Any, wdtype: str) -> None:
    positions = [5, 6, TINY.context - 1]  # pos is rewritten between replays of one recording
    fused = decode(dev, build, TINY, wdtype, positions, fused=True)
    unfused = decode(dev, build, TINY, wdtype, positions, fused=False)
    for res in (fused, unfused):
        assert [t.pos for t in res.tokens] == positions
        for t in res.tokens:
            assert set(t.errors) == {"out", "kc", "vt"}
            assert all(e <= TOLERANCE[wdtype] for e in t.errors.values()), (t.pos, t.errors)
    assert all(p == "fused" for _, p in fused.report.paths), fused.report.paths
    assert all(p == "unfused" for _, p in unfused.report.paths)
    # fusion deletes dispatches and barriers
    assert fused.report.dispatches < unfused.report.dispatches
    assert fused.report.barriers < unfused.report.barriers


@pytest.mark.parametrize("fused", [True, False])
def test_tiny_layer_with_the_qkv_epilogue_matches_numpy(
    dev: Any, build: Any, monkeypatch: pytest.MonkeyPatch, fused: bool
) -> None:
    """decode_layer.QKV_EPILOGUE: the QKV projection writes q and both caches (qkv_rope_kv),
    one dispatch instead of rms_norm_mul_matvec + rope_kv_store; replayed at advancing pos."""
    monkeypatch.setattr(layer, "QKV_EPILOGUE", True)
    monkeypatch.setenv("FUSEC_ATTENTION", "split")  # the two-region chain it replaces
    regions = [c.region for c in layer.calls(TINY, "f16")]
    assert regions[0] == "qkv_rope_kv" and "rope_kv_store" not in regions
    positions = [3, 4, TINY.context - 1]
    res = decode(dev, build, TINY, "f16", positions, fused=fused)
    for t in res.tokens:
        assert set(t.errors) == {"out", "kc", "vt"}
        assert all(e <= TOLERANCE["f16"] for e in t.errors.values()), (t.pos, t.errors)
    paths = dict(res.report.paths)
    assert paths["qkv_rope_kv"] == ("fused" if fused else "unfused")
    if fused:
        monkeypatch.setattr(layer, "QKV_EPILOGUE", False)
        two = decode(dev, build, TINY, "f16", positions[:1], fused=True)
        assert res.report.dispatches == two.report.dispatches - 1


@pytest.mark.parametrize("wdtype", ["f16", "q4_0"])
def test_tiny_layer_with_the_gqa_split_matches_numpy(
    dev: Any, build: Any, monkeypatch: pytest.MonkeyPatch, wdtype: str
) -> None:
    """decode_layer.GQA_SPLIT: attention_split_gqa (a workgroup per key/value head and run)
    in place of attention_split, fused and unfused, replayed at advancing pos."""
    monkeypatch.setattr(layer, "GQA_SPLIT", True)
    regions = [c.region for c in layer.calls(TINY, wdtype)]
    assert "attention_split_gqa" in regions and "attention_split" not in regions
    positions = [2, 9, TINY.context - 1]
    for fused in (True, False):
        res = decode(dev, build, TINY, wdtype, positions, fused=fused)
        for t in res.tokens:
            assert set(t.errors) == {"out", "kc", "vt"}
            assert all(e <= TOLERANCE[wdtype] for e in t.errors.values()), (t.pos, t.errors)
        assert dict(res.report.paths)["attention_split_gqa"] == ("fused" if fused else "unfused")


@pytest.mark.parametrize("wdtype", ["q4_0", "q4_K", "q4_k_m"])
def test_tiny_layer_with_q8_inputs_matches_numpy(
    dev: Any, build: Any, monkeypatch: pytest.MonkeyPatch, wdtype: str
) -> None:
    """decode_layer.Q8_INPUTS (issue 17): the FFN writes its output as q8_0x blocks (rounded in
    its epilogue) and the down projection reads them from global memory, fused and unfused,
    replayed at advancing pos; as many dispatches as the default chain."""
    monkeypatch.setattr(layer, "Q8_INPUTS", True)
    regions = [c.region for c in layer.calls(TINY, wdtype)]
    ffn, down = regions[-2:]
    assert ffn.startswith(layer.NORM_FFN_Q8OUT) and down.startswith(layer.MATVEC_ADD_Q8IN)
    positions = [4, 7, TINY.context - 1]
    dispatches = {}
    for fused in (True, False):
        res = decode(dev, build, TINY, wdtype, positions, fused=fused)
        for t in res.tokens:
            assert set(t.errors) == {"out", "kc", "vt"}
            assert all(e <= TOLERANCE[wdtype] for e in t.errors.values()), (t.pos, t.errors)
        paths = dict(res.report.paths)
        assert paths[ffn] == paths[down] == ("fused" if fused else "unfused")
        dispatches[fused] = res.report.dispatches
    monkeypatch.setattr(layer, "Q8_INPUTS", False)
    default = decode(dev, build, TINY, wdtype, positions[:1], fused=True)
    assert dispatches[True] == default.report.dispatches


def test_replay_gives_the_same_outputs_as_re_recording(dev: Any, build: Any) -> None:
    positions = [10, 11, 12, 40]
    seed = int(np.random.default_rng().integers(1 << 31))
    replayed = decode(dev, build, TINY, "f16", positions, replay=True, seed=seed)
    recorded = decode(dev, build, TINY, "f16", positions, replay=False, seed=seed)
    assert replayed.report.dispatches == recorded.report.dispatches
    assert replayed.report.barriers == recorded.report.barriers
    for a, b in zip(replayed.outputs, recorded.outputs, strict=True):
        for name in ("out", "kc", "vt"):
            assert np.array_equal(a[name], b[name]), name
    # and each token moved the cache: the rows at the decoded positions differ from before
    first, last = replayed.outputs[0]["kc"], replayed.outputs[-1]["kc"]
    assert not np.array_equal(first[:, 40, :], last[:, 40, :])
    assert np.array_equal(first[:, 10, :], last[:, 10, :])


def test_kill_switches_change_the_path_per_region(
    dev: Any, build: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FUSEC_DISABLE", "matvec_add,attention_rope_split")
    res = decode(dev, build, TINY, "f16", [7], fused=True)
    paths = dict(res.report.paths)
    assert paths["matvec_add"].startswith("fallback(") and "FUSEC_DISABLE" in paths["matvec_add"]
    assert paths["attention_rope_split"].startswith("fallback(")
    assert paths["rms_norm_gated_ffn"] == "fused"
    assert all(e <= TOLERANCE["f16"] for e in res.tokens[0].errors.values())
    monkeypatch.delenv("FUSEC_DISABLE")
    monkeypatch.setenv("FUSEC_DISABLE_FUSION", "1")
    res = decode(dev, build, TINY, "f16", [7], fused=True)
    assert all(p.startswith("fallback(") for _, p in res.report.paths)


@pytest.mark.parametrize("switch", ["FUSEC_DISABLE_FUSION", "FUSEC_SPEC_CONSTANTS"])
def test_bad_kill_switch_value_is_refused(root: Path, tmp_path: Path, switch: str) -> None:
    env = {**os.environ, switch: "yes"}
    run = fusec_cli(
        ["bench", "kernels.fuse", "--preset", "tiny", "--copy-bytes", "65536", "--reps", "1"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert run.returncode == 1
    assert "Traceback" not in run.stderr
    assert f"error: {switch}" in run.stderr and "'yes'" in run.stderr, run.stderr


def test_bench_preset_tiny_json(root: Path) -> None:
    run = fusec_cli(
        [
            "bench",
            "kernels.fuse",
            "--preset",
            "tiny",
            "--json",
            "--reps",
            "2",
            "--copy-bytes",
            "1048576",
            "--splits",
            "8",
        ],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    x = json.loads(run.stdout)
    assert x["preset"] == "tiny" and x["device"]
    assert x["splits"] == 8 != TINY.splits  # the attention over 8 runs, not the preset's
    assert x["spec_constants"] == os.environ.get("FUSEC_SPEC_CONSTANTS", "pass")
    for label in ("fused", "unfused"):
        assert x[label]["median_us"] > 0
        assert x[label]["dispatches"] > 0
    assert x["fused"]["dispatches"] < x["unfused"]["dispatches"]
    assert x["fused"]["barriers"] < x["unfused"]["barriers"]
    wb = sum(int(np.prod(s)) * 2 for s in layer.weight_shapes(TINY).values())
    assert x["weight_bytes"] == wb
    assert x["floor_us"] == pytest.approx(wb / (x["copy_gbs"] * 1e3), rel=0.01)
    assert x["speedup"] == pytest.approx(
        x["unfused"]["median_us"] / x["fused"]["median_us"], rel=0.01
    )
    assert all(e <= 2e-3 for v in x["errors"].values() for e in v.values())


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--splits", "0"], "--splits 0: the runs of the cache must number 1 to its 64 rows"),
        (["--splits", "65"], "--splits 65: the runs of the cache must number 1 to its 64 rows"),
        (["--splits", "8", "--region", "rope_kv_store"], "leave out --region/--all-regions"),
    ],
)
def test_bench_refuses_bad_splits(root: Path, extra: list[str], words: str) -> None:
    run = fusec_cli(
        ["bench", "kernels.fuse", "--preset", "tiny", "--copy-bytes", "65536", *extra],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert words in run.stderr, run.stderr


def test_position_past_the_cache_is_refused(root: Path) -> None:
    run = fusec_cli(
        [
            "check",
            "kernels.fuse",
            "--region",
            "rope_kv_store",
            "--const",
            "C=16",
            "--const",
            "pos=16",
        ],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 1
    assert "Traceback" not in run.stderr
    assert "'pos' = 16 is past the end of 'kc'" in run.stderr


@functools.cache
def _kernels_program() -> Any:
    """kernels.fuse checked once for the tests of this file (about a second a check)."""
    from fusec.codegen.build import check_source

    return check_source((Path(__file__).parents[2] / "kernels.fuse").read_text(), "kernels.fuse")


@pytest.mark.parametrize(
    ("region", "consts"),
    [
        ("matvec_add", {"K": 1000, "N": 77}),  # rows -> workgroup with a tail past the vectors
        ("matvec_add_q4_0", {"K": 32 * 7, "N": 33}),
        ("rope_kv_store", {"C": 50, "pos": None}),  # pos drawn below
        ("softmax_rows", {"C": 300, "pos": None}),
        ("attention_scores", {"NQ": 6, "NK": 3, "D": 40, "C": 37}),
        ("attention_values", {"NQ": 6, "NK": 3, "D": 40, "C": 37}),
        ("attention_head", {"NQ": 6, "NK": 3, "D": 40, "C": 37, "pos": None}),
        ("attention_head", {"C": 1024, "pos": None}),  # a contraction stored per workgroup
        ("matvec_add_q4_0_long", {"K": 32 * 9, "N": 35}),
        ("matvec_add_q8_0", {"K": 32 * 5, "N": 37}),
        ("rms_norm_gated_ffn_q8_0", {"H": 32 * 6, "F": 45}),
        # every run of the cache unmasked (a masked run's max is -1e30, which would swamp a
        # normwise error; test_attention_split_combine_matches_softmax covers masked runs)
        ("attention_split", {"NQ": 6, "NK": 3, "D": 40, "C": 37, "NS": 5, "pos": 36}),
        ("attention_combine", {"NQ": 6, "D": 40, "NS": 5}),
    ],
)
def test_layer_regions_at_odd_shapes(
    dev: Any, build: Any, region: str, consts: dict[str, Any]
) -> None:
    from fusec.runtime.verify import check_region

    rng = np.random.default_rng()
    if "pos" in consts:
        consts = {**consts, "pos": int(rng.integers(1, consts["C"]))}
    rep = check_region(dev, build, _kernels_program().region(region), consts)
    assert rep.path == "fused"
    assert rep.ok, [(o.name, o.fused_error, o.unfused_error) for o in rep.outputs]


@pytest.mark.parametrize(
    ("consts", "pos"),
    [
        ({"NQ": 6, "NK": 3, "D": 40, "C": 37, "NS": 5}, 3),  # runs 1.. wholly past pos
        ({"NQ": 6, "NK": 3, "D": 40, "C": 37, "NS": 5}, 20),  # pos inside a run
        ({"NQ": 4, "NK": 4, "D": 32, "C": 64, "NS": 16}, 63),  # runs of 4 rows, all live
    ],
)
def test_attention_split_combine_matches_softmax(
    dev: Any, build: Any, consts: dict[str, int], pos: int
) -> None:
    """attention_split then attention_combine equal softmax(q . K / sqrt(D)) . V over rows
    0 .. pos (numpy, float64), fused and unfused."""
    from fusec.runtime.dispatch import RegionRunner

    rng = np.random.default_rng()
    nq, nk, d, c, ns = (consts[k] for k in ("NQ", "NK", "D", "C", "NS"))
    q = rng.standard_normal((nq, d)).astype(np.float32)
    kc = rng.standard_normal((nk, c, d)).astype(np.float32)
    vt = rng.standard_normal((nk, d, c)).astype(np.float32)
    heads = np.arange(nq) // (nq // nk)
    s = np.einsum("hd,htd->ht", q, kc[heads, : pos + 1].astype(np.float64)) / np.sqrt(d)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    want = np.einsum("ht,hdt->hd", p, vt[heads, :, : pos + 1].astype(np.float64))
    for fused in (True, False):
        split = RegionRunner(dev, build, "attention_split", {**consts, "pos": pos})
        combine = RegionRunner(dev, build, "attention_combine", {"NQ": nq, "D": d, "NS": ns})
        try:
            parts = split.run({"q": q, "kc": kc, "vt": vt}, fused=fused).outputs
            o = combine.run(
                {
                    "mp": parts["mp"].reshape(nq, ns),
                    "lp": parts["lp"].reshape(nq, ns),
                    "op": parts["op"].reshape(nq, ns, d),
                },
                fused=fused,
            ).outputs["o"]
        finally:
            split.close()
            combine.close()
        err = np.linalg.norm(o - want) / np.linalg.norm(want)
        assert err < 1e-5, (fused, err)


def test_bench_checks_the_recordings_it_timed(
    root: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`fusec bench` checks each product's timed recording against numpy after the timing, not
    only a run before it: a recording made for the timing that dispatches half the workgroups
    it needs (as one did once, on the H200: RegionRunner.set_params put constants back at
    their defaults, and the split's grid was sized at them) is refused with its times, though
    the check before the timing passed."""
    from fusec.codegen import manifest as mf
    from fusec.runtime import cli
    from fusec.runtime import step as step_module

    args = ["bench", "kernels.fuse", "--preset", "tiny", "--reps", "2"]
    args += ["--copy-bytes", "65536", "--json"]
    assert cli.main(args) == 0
    assert json.loads(capsys.readouterr().out)["errors"]
    real_time_steps, real_workgroups = step_module.time_steps, mf.workgroups
    timing = []

    def timed(*a: Any, **k: Any) -> Any:
        timing.append(True)
        return real_time_steps(*a, **k)

    def halved(*a: Any, **k: Any) -> int:
        n = real_workgroups(*a, **k)
        return max(1, n // 2) if timing else n

    monkeypatch.setattr(step_module, "time_steps", timed)
    monkeypatch.setattr(mf, "workgroups", halved)
    assert cli.main(args) == 1
    err = capsys.readouterr().err
    assert timing and "checked against numpy; timing" in err
    assert "does not match the numpy layer in its timed recording; times discarded" in err, err
