"""One transformer decode layer (Qwen3-8B shapes by default) as a sequence of kernels.fuse regions.

    xn   = RMSNorm(x) * g_attn;  qkv = Wqkv . xn                      rms_norm_mul_matvec
    q, k = per-head RMSNorm (qn, kn), NEOX RoPE at pos; k, v -> caches  rope_kv_store
           (both as one kernel, qkv_rope_kv, with QKV_EPILOGUE and f16 weights)
    o    = softmax(q . K[0..pos] / sqrt(D)) . V[0..pos], grouped heads,  attention_split
           (attention_split_gqa, a workgroup per key/value head, with GQA_SPLIT)
           in NS runs of the cache, each with its own max and sum
    o    = the runs of each head combined                               attention_combine
           (FUSEC_ATTENTION=fused: both in one dispatch,                attention_split_combine
           the last workgroup of each head combining its runs)
           (FUSEC_ATTENTION=rope: RoPE + cache write folded in,        attention_rope_split,
           each split workgroup rotating its heads from qkv, the       attention_combine_store
           combine step writing the cache rows; one dispatch fewer)
    h1   = x + Wo . o                                                   matvec_add
    f    = silu(Wg . hn) * (Wu . hn),  hn = RMSNorm(h1) * g_ffn          rms_norm_gated_ffn
    out  = h1 + Wd . f                                                  matvec_add

`Q8_INPUTS` (fusec bench --q8-inputs): the FFN writes f as q8_0x blocks (rounded once, in its
epilogue: rms_norm_gated_ffn_q8out_*) and the down projection reads them from global memory
(matvec_add_q8in_*).

`reference` is an independent numpy float64 implementation of the same layer (it does not use
the .fuse reference interpreter), with q8_0 or q4_0 weights dequantized by the gguf package.
With quantized weights the regions round each projection's input to q8_0 blocks (`in shared as
q8_0`, for integer dot products, as llama.cpp does); the reference rounds the same inputs with
gguf.
"""

from __future__ import annotations

import functools
import itertools
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import attrs
import numpy as np

from fusec.dsl import ir
from fusec.dsl.check import check
from fusec.dsl.parse import parse
from fusec.dsl.reference import dequantize, weight_blocks
from fusec.dsl.types import DType
from fusec.runtime.device import RuntimeFailure, choice_switch
from fusec.runtime.layer_ties import (
    TIE_NEAREST,
    Answer,
    Ties,
    _q8_0,
)
from fusec.runtime.step import Call


@attrs.frozen
class Preset:
    name: str
    hidden: int
    n_q: int  # query heads
    n_kv: int  # key/value heads
    head_dim: int
    ffn: int
    context: int  # cache rows; the benchmark decodes the token at pos = context - 1
    splits: int  # runs of the cache that attention_split takes in parallel per head (NS)
    base: float = 1e6  # RoPE base (Qwen3)
    eps: float = 1e-6


PRESETS = {
    # every row a multiple of 256 (K-quant super-blocks), the output projection's too
    "tiny": Preset("tiny", hidden=256, n_q=8, n_kv=2, head_dim=32, ffn=512, context=64, splits=4),
    # 8 runs: H200 (2026-12-03, a399359), f16 layer 125.0 us against 129.25 at 16 runs,
    # 129.0 at 4, 127.0-127.75 at 6, 10 and 12; q4_0 68.25-68.5 against 70.5-72.75
    # (docs/BENCHMARKS.md, "Half the heads")
    "qwen3-8b": Preset(
        "qwen3-8b",
        hidden=4096,
        n_q=32,
        n_kv=8,
        head_dim=128,
        ffn=12288,
        context=1024,
        splits=8,
    ),
}
# one dtype for every projection, or `q4_k_m`: llama.cpp's Q4_K_M mix as most GGUF models ship
# it, q4_K rows but q6_K for V and the FFN down projection (in part of the layers; the others
# are all q4_K).  With q4_k_m, Q|K and V are two projections (`Wqk`, `Wv`).
WEIGHT_DTYPES = ("f16", "q8_0", "q4_0", "q4_K", "q4_k_m")
_MIXES = {"q4_k_m": {"Wv": "q6_K", "Wd": "q6_K"}}  # weights that differ from q4_K
# Normwise relative error allowed against `reference`.  f16: storage rounds weights to 2^-11,
# accumulations run in f32 (as fusec check).  q4_0: the projections' inputs are rounded to q8_0
# blocks, which turns f32-level differences into whole quant steps (1/127 of a block's largest
# value) wherever a value lies that close to a rounding boundary.  Measured at qwen3-8b shapes:
# perturbing the reference's own activations by 1e-6 (relative) before rounding moves `out` by
# 2.4e-3, by 1e-5 moves it by 3.4e-3; the H200 layer differs by 2.2e-3.  The tiny preset stays
# near 1e-7 (few values, few boundary cases).
# K-quant projections round their inputs as q4_0's do.
TOLERANCE = {"f16": 2e-3, "q8_0": 5e-3, "q4_0": 5e-3, "q4_K": 5e-3, "q4_k_m": 5e-3}
# a device's layer this close to numpy's is taken as numpy's answer; farther, the right answer
# nearest it is sought (`Answers`: q8_0 rounding ties).  The layer's f32 noise is far below:
# 5e-8 to 2e-7 on lavapipe (tiny) and the H200 (qwen3-8b); a tie rounded the other way moved
# the tiny layer's `out` by 2e-5 to 5.1e-3
AGREE = {w: t / 10 for w, t in TOLERANCE.items()}
# every weight name a layer may bind (which of them, by weight dtype: weight_shapes)
WEIGHTS = ("Wqkv", "Wqk", "Wv", "Wo", "Wg", "Wu", "Wd")
# weight dtypes whose projections round their input to q8_0 blocks (`in shared as q8_0`,
# integer dot products)
_ROUNDED = frozenset(("q8_0", "q4_0", "q4_K", "q6_K"))

# the generic regions of kernels.fuse the projections run (`region R<Wt in ...>`): the instance
# of each is the one whose weight has the layer's dtype for it (`instance`); no table of names
NORM_MATVEC, MATVEC_ADD, NORM_FFN = "rms_norm_mul_matvec", "matvec_add", "rms_norm_gated_ffn"
KERNELS_FUSE = Path(__file__).resolve().parents[1] / "kernels.fuse"


class Instances(Protocol):
    """Where a layer finds the instance of a generic region: a build's manifest
    (`codegen.manifest_records.Manifest`) or a checked source (`dsl.ir.Program`)."""

    def instance(
        self,
        generic: str,
        dtypes: Mapping[str, str],
        target: str | None = None,
        consts: Mapping[str, int | float] | None = None,
    ) -> Any: ...


@functools.cache
def _source_instances() -> ir.Program:
    """kernels.fuse, checked (the instances a build of it has), for a layer asked for without a
    build."""
    return check(parse(KERNELS_FUSE.read_text(), str(KERNELS_FUSE)))


def instance(
    regions: Instances,
    generic: str,
    dtypes: Mapping[str, str],
    target: str | None = None,
    consts: Mapping[str, int | float] | None = None,
) -> str:
    """The name of the instance of `generic` with weights of `dtypes` ({"W": "q4_0"}), for
    `target` where it has its own; of several, the one whose constant defaults are `consts`
    (what the call passes: the K = 12288 of matvec_add_q4_0_long, the FFN down projection)."""
    found = regions.instance(generic, dtypes, target, consts)
    if found is None and not dtypes:
        raise RuntimeFailure(
            f"the build has no region {generic}, which the decode layer runs",
            "build kernels.fuse (or a file that keeps the layer's regions) and try again",
        )
    if found is None:
        shown = ", ".join(f"{n}: {d}" for n, d in dtypes.items())
        raise RuntimeFailure(
            f"the build has no instance of {generic} for {shown}",
            f"add the dtype to region {generic}<Wt in ...> in kernels.fuse and rebuild",
        )
    return str(found.name)


# Attention's products, chosen by one switch (FUSEC_ATTENTION, or `calls(attention=...)`):
# `split`, attention_split then attention_combine (two dispatches, a barrier between); `fused`,
# attention_split_combine (one dispatch: the runs' partial results go to scratch buffers and the
# last workgroup of each head to finish combines the head's runs, kernels.fuse); `rope`,
# attention_rope_split then attention_combine_store in place of rope_kv_store, attention_split
# and attention_combine (one dependent step fewer: every split workgroup normalizes and rotates
# its query head and its key/value head's new key from qkv itself, and the combine step stores
# the new key and value rows into the caches, after every read of them).  `rope` needs the
# layer's Q|K|V as one projection (not q4_k_m, not the QKV epilogue).
ATTENTION = ("split", "fused", "rope")
ATTENTION_SWITCH = "FUSEC_ATTENTION"
# the default: `rope` where the layer has one Q|K|V projection and no QKV epilogue, `split`
# elsewhere.  On the H200 (2026-12-02, one lease, alternating, twice each) `rope` took the f16
# layer from 126.75 / 126.5 to 124.5 / 124.5 us and the q4_0 layer from 70.0 / 70.25 to
# 68.5 / 68.25: the split step grows by 3.75 us and the combine by 1.5, the rope_kv_store
# dispatch (8.25) goes (docs/BENCHMARKS.md).
DEFAULT_ATTENTION = "rope"


def attention_product(value: str | None = None) -> str:
    """The attention product: `value`, else FUSEC_ATTENTION, else the default; any other
    value is refused in one sentence (as the kill switches are, strictly)."""
    return choice_switch(
        ATTENTION_SWITCH, value, ATTENTION, DEFAULT_ATTENTION, "an attention product"
    )


# THE SWITCH: True runs the attention block's input as one kernel, `qkv_rope_kv` (the RMSNorm,
# the Q|K|V projection, the per-head norms and RoPE, with q and both caches written from its
# epilogue by masked writes), instead of rms_norm_mul_matvec + rope_kv_store (two dispatches and
# a qkv buffer between them).  f16 weights only: a per-workgroup region cannot round its input
# to q8_0 blocks, so the quantized layers keep the two regions.  The default stays False until
# the H200 measures the one kernel faster in the layer; `fusec bench --qkv-epilogue` (or
# `calls(..., qkv_epilogue=True)`) times it without changing this.
QKV_EPILOGUE = False
QKV_EPILOGUE_REGIONS = {"f16": "qkv_rope_kv"}
# THE SWITCH for attention: True runs attention_split_gqa, one workgroup per key/value head and
# run of the cache, whose G = NQ / NK query heads share every key and value row it loads, in
# place of attention_split (one workgroup per query head and run, each row loaded G times).
# Same outputs, so attention_combine follows unchanged.  Its ranges: G <= 8, C <= 4096.  The
# default stays False until the H200 measures it faster; `fusec bench --gqa-split` times it.
GQA_SPLIT = False
# THE SWITCH for quantized layers (issue 17): True has the FFN write its output as q8_0 blocks
# (rms_norm_gated_ffn_q8out_*: rounded once, in the epilogue of the kernel that computes it)
# and the down projection read those blocks straight from global memory (matvec_add_q8in_*: no
# per-workgroup rounding of its 12288-element input, no barrier before the weights stream), in
# place of rms_norm_gated_ffn_* + matvec_add_*.  The same dispatches and the same rounding, so
# the numpy layer is unchanged.  The other projections still round their inputs themselves
# (the attention combine and the RMSNorms in front of QKV and the FFN do not write q8_0x in
# this chain).  `fusec bench --q8-inputs` times it.  It stays off: on the H200 (2026-12-02, one
# lease, alternating) the q4_0 layer took 74.75 / 74.5 us with it against 70.5 / 70.75 without,
# q4_K 82.0 against 74.5, q4_k_m 90.75 against 84.5: the FFN's rounding epilogue (a barrier
# and a shared chunk per 32 rows) costs 5.5-7.5 us, the down projection saves about 1
# (docs/BENCHMARKS.md).
Q8_INPUTS = False
# the weight dtypes that chain has instances for
Q8_INPUT_REGIONS = ("q4_0", "q4_K", "q4_k_m")
# the generic regions of that chain: the FFN writing q8_0x, the down projection reading it
NORM_FFN_Q8OUT, MATVEC_ADD_Q8IN = "rms_norm_gated_ffn_q8out", "matvec_add_q8in"


def weight_dtype(name: str, wdtype: str) -> str:
    """The dtype of weight `name` in a layer of `wdtype` (WEIGHT_DTYPES)."""
    if wdtype in _MIXES:
        return _MIXES[wdtype].get(name, "q4_K")
    return wdtype


def calls(
    p: Preset,
    wdtype: str,
    attention: str | None = None,
    qkv_epilogue: bool | None = None,
    gqa_split: bool | None = None,
    regions: Instances | None = None,
    target: str | None = None,
    q8_inputs: bool | None = None,
) -> list[Call]:
    """The layer as regions of kernels.fuse, with their constants and buffer bindings.
    `attention` picks attention's product (`attention_product`).  `qkv_epilogue`: run the QKV
    projection with RoPE and the cache writes in its epilogue (QKV_EPILOGUE_REGIONS) where
    `wdtype` has such a region; None: QKV_EPILOGUE.  `gqa_split`: attention_split_gqa in place
    of attention_split; None: GQA_SPLIT (not with the fused attention product).  `regions`:
    where the projections' instances are found (the build's manifest; None: kernels.fuse as
    checked), for `target` (the device's, `codegen.targets.target_for_device`; None: every
    target's).  `q8_inputs`: the FFN writing its output as q8_0x blocks and the down
    projection reading them (Q8_INPUT_REGIONS) where `wdtype` has such regions; None:
    Q8_INPUTS."""
    found = regions if regions is not None else _source_instances()

    def pick(generic: str, weight: str, consts: Mapping[str, int | float]) -> str:
        """The instance of `generic` for the dtype of the layer's weight `weight` (bound to
        the region's `W`, or to `Wg` and `Wu` of the FFN)."""
        dtype = weight_dtype(weight, wdtype)
        names = ("Wg", "Wu") if generic in (NORM_FFN, NORM_FFN_Q8OUT) else ("W",)
        name = instance(found, generic, dict.fromkeys(names, dtype), target, consts)
        picked.add(name)
        return name

    picked: set[str] = set()

    heads = {"NQ": p.n_q, "NK": p.n_kv, "D": p.head_dim, "C": p.context}
    rope = {**heads, "n_rot": p.head_dim, "base": p.base, "eps": p.eps}
    norms = {"qn": "q_norm", "kn": "k_norm", "q": "q", "kc": "kc", "vt": "vt"}
    epilogue = QKV_EPILOGUE if qkv_epilogue is None else qkv_epilogue
    gqa = GQA_SPLIT if gqa_split is None else gqa_split
    asked = attention if attention is not None else os.environ.get(ATTENTION_SWITCH)
    product = attention_product(asked)
    if product == "rope" and (wdtype in _MIXES or (epilogue and wdtype in QKV_EPILOGUE_REGIONS)):
        if asked is not None:
            raise RuntimeFailure(
                f"{ATTENTION_SWITCH}=rope needs the layer's Q|K|V as one projection",
                "use it without --qkv-epilogue and with weights other than q4_k_m",
            )
        product = "split"  # the default where rope does not apply
    if product == "rope" and gqa and asked is None:
        product = "split"  # the grouped-query split asked for: the default gives way
    if epilogue and wdtype in QKV_EPILOGUE_REGIONS:
        attention_in = [
            Call(
                QKV_EPILOGUE_REGIONS[wdtype],
                {"x": "x", "g": "attn_norm", "W": "Wqkv", **norms},
                {**rope, "H": p.hidden},
            )
        ]
    elif wdtype in _MIXES:  # Q|K and V apart, each in its own weight dtype
        qk = {"K": p.hidden, "N": (p.n_q + p.n_kv) * p.head_dim, "eps": p.eps}
        v = {"K": p.hidden, "N": p.n_kv * p.head_dim, "eps": p.eps}
        attention_in = [
            Call(
                pick(NORM_MATVEC, "Wqk", qk),
                {"x": "x", "g": "attn_norm", "W": "Wqk", "y": "qk"},
                qk,
            ),
            Call(pick(NORM_MATVEC, "Wv", v), {"x": "x", "g": "attn_norm", "W": "Wv", "y": "v"}, v),
            Call("rope_kv_store_qk_v", {"qk": "qk", "v": "v", **norms}, rope),
        ]
    else:
        qkv = {"K": p.hidden, "N": (p.n_q + 2 * p.n_kv) * p.head_dim, "eps": p.eps}
        attention_in = [
            Call(
                pick(NORM_MATVEC, "Wqkv", qkv),
                {"x": "x", "g": "attn_norm", "W": "Wqkv", "y": "qkv"},
                qkv,
            ),
        ]
        if product != "rope":
            attention_in.append(Call("rope_kv_store", {"qkv": "qkv", **norms}, rope))
    if gqa and product != "split":
        raise RuntimeFailure(
            f"attention product {product!r} has no grouped-query form",
            f"use {ATTENTION_SWITCH}={product} or the grouped-query split, not both",
        )
    if product == "rope":
        attend = [
            Call(
                "attention_rope_split",
                {
                    "qkv": "qkv",
                    "qn": "q_norm",
                    "kn": "k_norm",
                    "kc": "kc",
                    "vt": "vt",
                    "mp": "att_max",
                    "lp": "att_sum",
                    "op": "att_out",
                    "kw": "k_rot",
                },
                {**rope, "NS": p.splits},
            ),
            Call(
                "attention_combine_store",
                {
                    "mp": "att_max",
                    "lp": "att_sum",
                    "op": "att_out",
                    "kw": "k_rot",
                    "qkv": "qkv",
                    "o": "attn",
                    "kc": "kc",
                    "vt": "vt",
                },
                {**heads, "NS": p.splits},
            ),
        ]
    elif product == "fused":
        attend = [
            Call(
                "attention_split_combine",
                {"q": "q", "kc": "kc", "vt": "vt", "o": "attn"},
                {**heads, "NS": p.splits},
            )
        ]
    else:
        split_bindings = {
            "q": "q",
            "kc": "kc",
            "vt": "vt",
            "mp": "att_max",
            "lp": "att_sum",
            "op": "att_out",
        }
        if gqa:
            group = {"NQ": p.n_q, "G": p.n_q // p.n_kv, "D": p.head_dim, "C": p.context}
            split = Call("attention_split_gqa", split_bindings, {**group, "NS": p.splits})
        else:
            split = Call("attention_split", split_bindings, {**heads, "NS": p.splits})
        attend = [
            split,
            Call(
                "attention_combine",
                {"mp": "att_max", "lp": "att_sum", "op": "att_out", "o": "attn"},
                {"NQ": p.n_q, "D": p.head_dim, "NS": p.splits},
            ),
        ]
    wo = {"K": p.n_q * p.head_dim, "N": p.hidden}
    ffn = {"H": p.hidden, "F": p.ffn, "eps": p.eps}
    wd = {"K": p.ffn, "N": p.hidden}
    wo_region = pick(MATVEC_ADD, "Wo", wo)  # asked for in the order the layer runs them
    if (Q8_INPUTS if q8_inputs is None else q8_inputs) and wdtype in Q8_INPUT_REGIONS:
        ffn_region, ffn_out = pick(NORM_FFN_Q8OUT, "Wg", ffn), "ffn_hq"
        down_region = pick(MATVEC_ADD_Q8IN, "Wd", wd)
    else:
        ffn_region, ffn_out = pick(NORM_FFN, "Wg", ffn), "ffn_h"
        down_region = pick(MATVEC_ADD, "Wd", wd)
    # the attention regions are named, not generic: each takes its variant for `target` where
    # a schedule line gave it one (attention_combine_store__sm90)
    named = [
        c
        if c.region in picked
        else attrs.evolve(c, region=instance(found, c.region, {}, target, c.consts))
        for c in (*attention_in, *attend)
    ]
    return [
        *named,
        Call(wo_region, {"r": "x", "a": "attn", "W": "Wo", "y": "h1"}, wo),
        Call(
            ffn_region,
            {"x": "h1", "g": "ffn_norm", "Wg": "Wg", "Wu": "Wu", "h": ffn_out},
            ffn,
        ),
        Call(down_region, {"r": "h1", "a": ffn_out, "W": "Wd", "y": "out"}, wd),
    ]


def weight_shapes(p: Preset, wdtype: str = "f16") -> dict[str, tuple[int, int]]:
    """The weights a layer of `wdtype` binds, rows x columns."""
    attention: dict[str, tuple[int, int]] = (
        {
            "Wqk": ((p.n_q + p.n_kv) * p.head_dim, p.hidden),
            "Wv": (p.n_kv * p.head_dim, p.hidden),
        }
        if wdtype in _MIXES
        else {"Wqkv": ((p.n_q + 2 * p.n_kv) * p.head_dim, p.hidden)}
    )
    return {
        **attention,
        "Wo": (p.hidden, p.n_q * p.head_dim),
        "Wg": (p.ffn, p.hidden),
        "Wu": (p.ffn, p.hidden),
        "Wd": (p.hidden, p.ffn),
    }


def random_state(
    p: Preset, wdtype: str, rng: np.random.Generator, weights: bool = True
) -> dict[str, np.ndarray]:
    """Weights (f16, or GGUF blocks quantized with gguf, random valid K-quant blocks where gguf
    has no quantizer: `weight_blocks`; none when not `weights`), norms, an
    input x and caches whose rows hold earlier tokens' keys and values; random normal values,
    never zeros."""

    def normal(*shape: int, scale: float = 1.0) -> np.ndarray:
        a = rng.standard_normal(size=shape) * scale
        a[a == 0] = 0.5
        return a.astype(np.float32)

    arrays: dict[str, np.ndarray] = {}
    for name, (n, k) in weight_shapes(p, wdtype).items() if weights else ():
        w = normal(n, k, scale=1.0 / np.sqrt(k))
        dtype = weight_dtype(name, wdtype)
        arrays[name] = (
            w.astype(np.float16) if dtype == "f16" else weight_blocks(w, DType(dtype), rng)
        )
    arrays["attn_norm"] = 1.0 + normal(p.hidden, scale=0.1)
    arrays["ffn_norm"] = 1.0 + normal(p.hidden, scale=0.1)
    arrays["q_norm"] = 1.0 + normal(p.head_dim, scale=0.1)
    arrays["k_norm"] = 1.0 + normal(p.head_dim, scale=0.1)
    arrays["x"] = normal(p.hidden)
    arrays["kc"] = normal(p.n_kv, p.context, p.head_dim)
    arrays["vt"] = normal(p.n_kv, p.head_dim, p.context)
    return arrays


def weight_values(
    arrays: Mapping[str, np.ndarray], p: Preset, wdtype: str
) -> dict[str, np.ndarray]:
    """The weights as float64 matrices (GGUF blocks dequantized by gguf)."""
    out = {}
    for name, shape in weight_shapes(p, wdtype).items():
        w, dtype = arrays[name], weight_dtype(name, wdtype)
        out[name] = (
            w.astype(np.float64)
            if dtype == "f16"
            else dequantize(w, DType(dtype)).reshape(shape).astype(np.float64)
        )
    return out


def _rms_norm(x: np.ndarray, g: np.ndarray, eps: float) -> np.ndarray:
    out: np.ndarray = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * g
    return out


def _rope_neox(x: np.ndarray, pos: int, base: float) -> np.ndarray:
    d = x.shape[-1]
    half = d // 2
    theta = pos * base ** (-2.0 * np.arange(half) / d)
    cos, sin = np.cos(theta), np.sin(theta)
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


class Answers:
    """The right answers of the layer for one token (`reference`'s arguments): numpy's, then,
    made on demand, those with the TIE_NEAREST q8_0 roundings nearest a tie (`Ties.near`)
    taken the other way, one rounding, then two, ... (2^TIE_NEAREST answers at most).  Each is kept
    once made, so checking several runs of the token makes them once."""

    def __init__(
        self,
        p: Preset,
        arrays: Mapping[str, np.ndarray],
        weights: Mapping[str, np.ndarray],
        pos: int,
        wdtype: str,
    ) -> None:
        self._args = (p, dict(arrays), weights, pos, wdtype)
        self.ties = Ties()
        self.numpy = reference(p, arrays, weights, pos, wdtype, self.ties)
        nearest = sorted(self.ties.near)[:TIE_NEAREST]
        self._flips = [
            frozenset(c)
            for n in range(1, len(nearest) + 1)
            for c in itertools.combinations([(i, j) for _, i, j in nearest], n)
        ]
        self._made: list[tuple[frozenset[tuple[int, int]], dict[str, np.ndarray]]] = [
            (frozenset(), self.numpy)
        ]

    def __len__(self) -> int:
        return 1 + len(self._flips)

    def _answer(self, k: int) -> tuple[frozenset[tuple[int, int]], dict[str, np.ndarray]]:
        while len(self._made) <= k:
            flip = self._flips[len(self._made) - 1]
            self._made.append((flip, reference(*self._args, Ties(flip=flip))))
        return self._made[k]

    def nearest(self, got: Mapping[str, np.ndarray], within: float) -> Answer:
        """The first answer (numpy's first) whose every output is within `within` of `got`'s,
        relatively (verify.relative_error); where none is, the nearest of them all.  Where
        `got` lies farther from numpy's than twice the single flips' moves together, no
        combination is tried (a wrong result costs 1 + TIE_NEAREST references, not 2^8)."""
        from .verify import relative_error

        best: Answer | None = None
        singles = sum(len(f) == 1 for f in self._flips)
        reach = 0.0  # how far the single flips move numpy's answer, together
        for k in range(len(self)):
            flip, ref = self._answer(k)
            errors = {n: relative_error(got[n], ref[n]) for n in ref}
            if best is None or max(errors.values()) < max(best.errors.values()):
                best = Answer(ref, errors, len(flip))
            if max(errors.values()) <= within:
                break
            if 1 <= k <= singles:
                reach += max(relative_error(ref[n], self.numpy[n]) for n in ref)
            if k == singles and max(best.errors.values()) > within + 2 * reach:
                break  # no combination of them comes near `got`: a wrong result, not a tie
        assert best is not None
        return best


def reference(
    p: Preset,
    arrays: Mapping[str, np.ndarray],
    weights: Mapping[str, np.ndarray],
    pos: int,
    wdtype: str = "f16",
    ties: Ties | None = None,
) -> dict[str, np.ndarray]:
    """The layer for the token at `pos`: `out` and the updated caches `kc`, `vt`.  `ties` gets
    each input the layer rounds to q8_0 blocks and its roundings near a tie (`Ties.near`),
    and rounds those of its `flip` the other way (`Answers`)."""
    f = {k: np.asarray(v, np.float64) for k, v in arrays.items() if k not in WEIGHTS}
    nq, nk, d = p.n_q, p.n_kv, p.head_dim

    def act(v: np.ndarray, weight: str) -> np.ndarray:  # an input, as `weight`'s region rounds it
        return _q8_0(v, ties) if weight_dtype(weight, wdtype) in _ROUNDED else v

    x = f["x"]
    xn = _rms_norm(x, f["attn_norm"], p.eps)
    if "Wqkv" in weights:
        qkv = weights["Wqkv"] @ act(xn, "Wqkv")
    else:
        qkv = np.concatenate([weights["Wqk"] @ act(xn, "Wqk"), weights["Wv"] @ act(xn, "Wv")])
    q = qkv[: nq * d].reshape(nq, d)
    k = qkv[nq * d : (nq + nk) * d].reshape(nk, d)
    v = qkv[(nq + nk) * d :].reshape(nk, d)
    q = _rope_neox(_rms_norm(q, f["q_norm"], p.eps), pos, p.base)
    k = _rope_neox(_rms_norm(k, f["k_norm"], p.eps), pos, p.base)
    kc, vt = f["kc"].copy(), f["vt"].copy()
    kc[:, pos, :] = k
    vt[:, :, pos] = v
    group = nq // nk
    keys = kc[np.arange(nq) // group, : pos + 1, :]  # [nq, pos + 1, d]
    values = vt[np.arange(nq) // group, :, : pos + 1]  # [nq, d, pos + 1]
    scores = np.einsum("hd,htd->ht", q, keys) / np.sqrt(d)
    prob = np.exp(scores - scores.max(axis=1, keepdims=True))
    prob /= prob.sum(axis=1, keepdims=True)
    o = np.einsum("ht,hdt->hd", prob, values).reshape(-1)
    h1 = x + weights["Wo"] @ act(o, "Wo")
    hn = act(_rms_norm(h1, f["ffn_norm"], p.eps), "Wg")
    gate, up = weights["Wg"] @ hn, weights["Wu"] @ hn
    out: np.ndarray = h1 + weights["Wd"] @ act(gate / (1.0 + np.exp(-gate)) * up, "Wd")
    return {"out": out, "kc": kc, "vt": vt}
