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

from fusec.dsl.reference import quantize
from fusec.dsl.types import DType
from tests.conftest import ROOT, fusec_cli

HIDDEN, N_Q, N_KV, HEAD, FFN = 256, 4, 2, 32, 512


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
                w.add_tensor(key, values.astype(np.float16))
            else:
                blocks = quantize(values, DType.Q4_0)
                w.add_tensor(key, blocks, raw_dtype=gguf.GGMLQuantizationType.Q4_0)
            written[key] = values
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


@pytest.mark.parametrize("wtype", ["f16", "q4_0"])
def test_loader_reads_shapes_and_stacks_qkv(tmp_path: Path, wtype: str) -> None:
    from fusec.runtime import gguf_layer

    rng = np.random.default_rng()
    written = write_model(tmp_path / "m.gguf", wtype, rng)
    fl = gguf_layer.load(tmp_path / "m.gguf", 1, context=48, splits=4)
    p = fl.preset
    assert (p.hidden, p.n_q, p.n_kv, p.head_dim, p.ffn, p.context) == (HIDDEN, 4, 2, 32, 512, 48)
    assert fl.wdtype == wtype and fl.architecture == "qwen3" and p.base == 1e6
    qkv = fl.weights["Wqkv"]
    assert qkv.shape[0] == (N_Q + 2 * N_KV) * HEAD
    q_rows = N_Q * HEAD
    if wtype == "f16":
        np.testing.assert_array_equal(
            qkv[q_rows : q_rows + N_KV * HEAD],
            written["blk.1.attn_k.weight"].astype(np.float16),
        )
    else:
        from fusec.dsl.reference import dequantize

        values = dequantize(qkv, DType.Q4_0).reshape(qkv.shape[0], HIDDEN)
        want = dequantize(quantize(written["blk.1.attn_v.weight"], DType.Q4_0), DType.Q4_0)
        np.testing.assert_array_equal(values[q_rows + N_KV * HEAD :], want.reshape(-1, HIDDEN))
    np.testing.assert_array_equal(fl.norms["k_norm"], written["blk.1.attn_k_norm.weight"])


@pytest.mark.slow
@pytest.mark.shaderc
@pytest.mark.vulkan
@pytest.mark.parametrize("wtype", ["f16", "q4_0"])
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
