"""`fusec bench --gguf MODEL.gguf --layer N` (issue 17): a layer's shapes and weights read from a
GGUF file, here one the test writes with gguf.GGUFWriter (Qwen3 names and keys, two layers, f16
or q4_0 weights, small shapes), run fused and unfused on the Vulkan device and checked against
the numpy layer before timing; and a file that does not hold such a layer refused in one
sentence."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fusec.dsl.reference import weight_blocks
from fusec.dsl.types import DType
from tests.conftest import ROOT, fusec_cli

HIDDEN, N_Q, N_KV, HEAD, FFN = 256, 8, 2, 32, 512  # rows of 256: K-quant super-blocks


_GGML = {"q4_0": "Q4_0", "q4_K": "Q4_K"}
# llama.cpp's Q4_K_M: Q4_K but Q6_K for attn_v and ffn_down
_Q4_K_M = {
    n: "Q6_K" if n in ("attn_v", "ffn_down") else "Q4_K"
    for n in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
}


def write_model(path: Path, wtype: str, rng: np.random.Generator, skip: str = "") -> dict:
    """A two-layer Qwen3-shaped GGUF file; returns layer 1's arrays as written."""
    import gguf

    w = gguf.GGUFWriter(str(path), "qwen3")
    w.add_block_count(2)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(N_Q)
    w.add_head_count_kv(N_KV)
    w.add_key_length(HEAD)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    shapes = {
        "attn_q": (N_Q * HEAD, HIDDEN),
        "attn_k": (N_KV * HEAD, HIDDEN),
        "attn_v": (N_KV * HEAD, HIDDEN),
        "attn_output": (HIDDEN, N_Q * HEAD),
        "ffn_gate": (FFN, HIDDEN),
        "ffn_up": (FFN, HIDDEN),
        "ffn_down": (HIDDEN, FFN),
    }
    written = {}
    for layer in range(2):
        for name, (n, k) in shapes.items():
            if name == skip and layer == 1:
                continue
            values = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
            values[values == 0] = 0.01
            key = f"blk.{layer}.{name}.weight"
            if wtype == "f16":
                data = values.astype(np.float16)
                w.add_tensor(key, data)
            else:
                ggml = _GGML[wtype] if wtype != "q4_k_m" else _Q4_K_M[name]
                data = weight_blocks(values, DType(ggml.lower().replace("_k", "_K")), rng)
                w.add_tensor(key, data, raw_dtype=gguf.GGMLQuantizationType[ggml])
            written[key] = data  # f16 values, or block bytes (rows of blocks)
        for name, size in (
            ("attn_norm", HIDDEN),
            ("ffn_norm", HIDDEN),
            ("attn_q_norm", HEAD),
            ("attn_k_norm", HEAD),
        ):
            norm = (1.0 + 0.1 * rng.standard_normal(size)).astype(np.float32)
            w.add_tensor(f"blk.{layer}.{name}.weight", norm)
            written[f"blk.{layer}.{name}.weight"] = norm
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return written


@pytest.mark.parametrize("wtype", ["f16", "q4_0", "q4_K", "q4_k_m"])
def test_loader_reads_shapes_and_stacks_qkv(tmp_path: Path, wtype: str) -> None:
    """Shapes from the metadata; Q, K and V stacked as the layer binds them (Q4_K_M: Q and K
    stacked, V apart), each row's bytes as the file holds them."""
    from fusec.runtime import gguf_layer

    rng = np.random.default_rng()
    written = write_model(tmp_path / "m.gguf", wtype, rng)
    fl = gguf_layer.load(tmp_path / "m.gguf", 1, context=48, splits=4)
    p = fl.preset
    assert (p.hidden, p.n_q, p.n_kv, p.head_dim, p.ffn, p.context) == (HIDDEN, 8, 2, 32, 512, 48)
    assert fl.wdtype == wtype and fl.architecture == "qwen3" and p.base == 1e6
    rows = {n: written[f"blk.1.{n}.weight"] for n in ("attn_q", "attn_k", "attn_v")}
    if wtype == "q4_k_m":
        assert set(fl.weights) == {"Wqk", "Wv", "Wo", "Wg", "Wu", "Wd"}
        want_qk = np.concatenate([rows["attn_q"], rows["attn_k"]])
        np.testing.assert_array_equal(fl.weights["Wqk"], want_qk)
        np.testing.assert_array_equal(fl.weights["Wv"], rows["attn_v"])
        assert fl.weights["Wv"].shape[1] == HIDDEN // 256 * DType.Q6_K.block_bytes
    else:
        assert set(fl.weights) == {"Wqkv", "Wo", "Wg", "Wu", "Wd"}
        want = np.concatenate([rows["attn_q"], rows["attn_k"], rows["attn_v"]])
        np.testing.assert_array_equal(fl.weights["Wqkv"], want)
        assert fl.weights["Wqkv"].shape[0] == (N_Q + 2 * N_KV) * HEAD
    np.testing.assert_array_equal(fl.weights["Wd"], written["blk.1.ffn_down.weight"])
    np.testing.assert_array_equal(fl.norms["k_norm"], written["blk.1.attn_k_norm.weight"])


def test_a_mix_other_than_q4_k_m_is_one_sentence(tmp_path: Path) -> None:
    """Q4_K with Q6_K anywhere but attn_v and ffn_down is not a layer the regions run."""
    from fusec.runtime import gguf_layer

    path = tmp_path / "m.gguf"
    _Q4_K_M["attn_q"] = "Q6_K"
    try:
        write_model(path, "q4_k_m", np.random.default_rng())
    finally:
        _Q4_K_M["attn_q"] = "Q4_K"
    with pytest.raises(gguf_layer.LayerFileError) as e:
        gguf_layer.load(path, 1)
    assert "attn_q Q6_K" in str(e.value) and "Q4_K_M" in str(e.value)


@pytest.mark.slow
@pytest.mark.shaderc
@pytest.mark.vulkan
@pytest.mark.parametrize("wtype", ["f16", "q4_0", "q4_k_m"])
def test_bench_runs_a_layer_of_the_file(tmp_path: Path, wtype: str) -> None:
    write_model(tmp_path / "m.gguf", wtype, np.random.default_rng())
    proc = fusec_cli(
        [
            "bench",
            str(ROOT / "kernels.fuse"),
            "--gguf",
            str(tmp_path / "m.gguf"),
            "--layer",
            "1",
            "--preset",
            "tiny",
            "--reps",
            "2",
            "--json",
            "--seed",
            "3",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["weights"] == wtype and result["preset"] == "m.gguf:1"
    assert "checked against numpy" in proc.stderr
    assert result["fused"]["dispatches"] < result["unfused"]["dispatches"]


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("missing", "has no tensor blk.1.ffn_up.weight"),
        ("layer", "has 2 layers: no layer 5"),
        ("not_gguf", "is not a GGUF file"),
    ],
)
def test_a_file_without_the_layer_is_one_sentence(tmp_path: Path, case: str, message: str) -> None:
    path = tmp_path / "m.gguf"
    if case == "not_gguf":
        path.write_bytes(b"GGML" + bytes(range(200)))
    else:
        write_model(
            path, "f16", np.random.default_rng(), skip="ffn_up" if case == "missing" else ""
        )
    layer = "5" if case == "layer" else "1"
    proc = fusec_cli(
        ["bench", str(ROOT / "kernels.fuse"), "--gguf", str(path), "--layer", layer],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_bench_offers_every_layer_weight_dtype() -> None:
    """`fusec bench --weights` lists what the decode layer runs (the CLI does not import the
    layer, so that `fusec --help` stays fast)."""
    from fusec.runtime import decode_layer
    from fusec.runtime.cli import parser

    sub = next(a for a in parser()._actions if a.dest == "command")
    bench = sub.choices["bench"]
    weights = next(a for a in bench._actions if a.dest == "weights")
    assert tuple(weights.choices) == decode_layer.WEIGHT_DTYPES
