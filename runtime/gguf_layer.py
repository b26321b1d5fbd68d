"""One layer of a GGUF model file as the decode layer's state (`fusec bench --gguf FILE
--layer N`): its shapes from the file's metadata, its weights from the file's tensors, read with
the `gguf` package's GGUFReader; the activation `x` and the caches stay random (a file holds no
activations).

Names, as llama.cpp writes them (gguf-py `constants.py`, MODEL_TENSOR and Keys):
- metadata `{arch}.embedding_length`, `.feed_forward_length`, `.attention.head_count`,
  `.attention.head_count_kv`, `.attention.key_length` (head size; hidden / heads when absent),
  `.rope.freq_base`, `.attention.layer_norm_rms_epsilon`, with `{arch}` the file's
  `general.architecture`;
- tensors `blk.N.attn_q|attn_k|attn_v|attn_output|ffn_gate|ffn_up|ffn_down.weight` and the norms
  `blk.N.attn_norm|ffn_norm|attn_q_norm|attn_k_norm.weight`.
GGUF lists a tensor's dimensions fastest first (`[K, N]` for an N x K matrix); its data, as the
reader maps it, is row-major N rows of K values or of K / 32 blocks.  Q, K and V are stacked
into the layer's one Q|K|V projection, rows of Q first, as `decode_layer.calls` binds `Wqkv`
(with the Q4_K_M mix, Q and K stack into `Wqk` and V, in q6_K, is `Wv`).

Every problem with the file (not GGUF, no such layer, a missing tensor or key, a weight type the
layer's regions do not take, shapes that disagree) is one sentence (LayerFileError).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import numpy as np

from .decode_layer import WEIGHT_DTYPES, Preset

# GGML type names (gguf.GGMLQuantizationType) -> the layer's weight dtype
_DTYPES = {"F16": "f16", "Q4_0": "q4_0", "Q8_0": "q8_0", "Q4_K": "q4_K", "Q6_K": "q6_K"}
_PROJECTIONS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
_NORMS = {
    "attn_norm": "attn_norm",
    "ffn_norm": "ffn_norm",
    "attn_q_norm": "q_norm",
    "attn_k_norm": "k_norm",
}


# the layer dtypes of one type for every projection
_ONE = frozenset(("f16", "q8_0", "q4_0", "q4_K"))


def _layer_dtype(types: dict[str, str]) -> str | None:
    """The decode layer's weight dtype for these GGML types of the projections: one type for
    all, or llama.cpp's Q4_K_M mix (q4_K, with q6_K for attn_v and ffn_down); None otherwise."""
    kinds = {_DTYPES.get(t) for t in types.values()}
    if len(kinds) == 1 and next(iter(kinds)) in _ONE:
        return next(iter(kinds))
    mix = {n: ("q6_K" if n in ("attn_v", "ffn_down") else "q4_K") for n in types}
    if {n: _DTYPES.get(t) for n, t in types.items()} == mix:
        return "q4_k_m"
    return None


class LayerFileError(ValueError):
    """A GGUF file that does not hold a decode layer fusec can run, in one sentence."""


@attrs.frozen
class FileLayer:
    preset: Preset
    wdtype: str
    weights: dict[str, np.ndarray]  # Wqkv (or Wqk, Wv), Wo, Wg, Wu, Wd: f16 or GGUF blocks
    norms: dict[str, np.ndarray]  # attn_norm, ffn_norm, q_norm, k_norm (f32)
    architecture: str

    def with_cache(self, context: int, splits: int) -> FileLayer:
        """The same layer with `context` cache rows in `splits` runs (a file does not say)."""
        return attrs.evolve(self, preset=attrs.evolve(self.preset, context=context, splits=splits))


def _field(reader: Any, key: str) -> Any:
    field = reader.fields.get(key)
    if field is None:
        return None
    value = field.parts[field.data[0]]
    return value.tolist()[0] if hasattr(value, "tolist") and len(value) == 1 else value


def load(path: str | Path, layer: int, context: int = 1, splits: int = 1) -> FileLayer:
    """Layer `layer` of the GGUF file at `path`, with `context` cache rows and `splits` runs of
    the cache for attention (the file says neither: FileLayer.with_cache sets them later)."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(path))
    except FileNotFoundError:
        raise LayerFileError(f"no such file: {path}") from None
    except (OSError, ValueError, IndexError, KeyError) as exc:
        raise LayerFileError(f"{path} is not a GGUF file gguf can read ({exc})") from None
    arch_raw = _field(reader, "general.architecture")
    arch = bytes(arch_raw).decode("utf-8", "replace") if arch_raw is not None else None
    if arch is None:
        raise LayerFileError(f"{path} has no general.architecture")

    def number(key: str, default: float | None = None) -> float:
        value = _field(reader, f"{arch}.{key}")
        if value is None:
            if default is None:
                raise LayerFileError(f"{path} ({arch}) has no {arch}.{key}")
            return default
        return float(value)

    hidden = int(number("embedding_length"))
    n_q = int(number("attention.head_count"))
    n_kv = int(number("attention.head_count_kv", n_q))
    head_dim = int(number("attention.key_length", hidden // max(n_q, 1)))
    ffn = int(number("feed_forward_length"))
    blocks = int(number("block_count", 0)) or None
    if not 0 <= layer < (blocks or layer + 1):
        raise LayerFileError(f"{path} has {blocks} layers: no layer {layer}")
    tensors = {t.name: t for t in reader.tensors}

    def tensor(name: str) -> Any:
        full = f"blk.{layer}.{name}.weight"
        if full not in tensors:
            raise LayerFileError(f"{path} has no tensor {full}")
        return tensors[full]

    types = {name: tensor(name).tensor_type.name for name in _PROJECTIONS}
    wdtype = _layer_dtype(types)
    if wdtype is None:
        shown = ", ".join(f"{n} {t}" for n, t in types.items())
        raise LayerFileError(
            f"layer {layer} of {path} has weights of types {shown}; the decode layer runs one "
            f"type for every projection, of {', '.join(t for t in WEIGHT_DTYPES if t in _ONE)}, "
            "or Q4_K with Q6_K for attn_v and ffn_down (Q4_K_M)"
        )
    want = {
        "attn_q": (n_q * head_dim, hidden),
        "attn_k": (n_kv * head_dim, hidden),
        "attn_v": (n_kv * head_dim, hidden),
        "attn_output": (hidden, n_q * head_dim),
        "ffn_gate": (ffn, hidden),
        "ffn_up": (ffn, hidden),
        "ffn_down": (hidden, ffn),
    }
    rows = {}
    for name, (n, k) in want.items():
        t = tensor(name)
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))  # GGUF: fastest first
        if shape != (n, k):
            raise LayerFileError(
                f"tensor blk.{layer}.{name}.weight of {path} is {shape[0]} x {shape[1]}, "
                f"where the metadata gives {n} x {k}"
            )
        data = np.asarray(t.data)
        rows[name] = data.reshape(n, -1)
    stacked = ["attn_q", "attn_k"] if wdtype == "q4_k_m" else ["attn_q", "attn_k", "attn_v"]
    qkv = np.ascontiguousarray(np.concatenate([rows[n] for n in stacked], axis=0))
    weights = {
        **(
            {"Wqk": qkv, "Wv": np.ascontiguousarray(rows["attn_v"])}
            if wdtype == "q4_k_m"
            else {"Wqkv": qkv}
        ),
        "Wo": np.ascontiguousarray(rows["attn_output"]),
        "Wg": np.ascontiguousarray(rows["ffn_gate"]),
        "Wu": np.ascontiguousarray(rows["ffn_up"]),
        "Wd": np.ascontiguousarray(rows["ffn_down"]),
    }
    if wdtype == "f16":
        weights = {k: v.astype(np.float16) for k, v in weights.items()}
    norms = {}
    for name, ours in _NORMS.items():
        t = tensor(name)
        size = hidden if name in ("attn_norm", "ffn_norm") else head_dim
        values = np.asarray(t.data, dtype=np.float32).reshape(-1)
        if values.size != size:
            raise LayerFileError(
                f"tensor blk.{layer}.{name}.weight of {path} has {values.size} values, not {size}"
            )
        norms[ours] = values
    preset = Preset(
        f"{Path(path).name}:{layer}",
        hidden=hidden,
        n_q=n_q,
        n_kv=n_kv,
        head_dim=head_dim,
        ffn=ffn,
        context=context,
        splits=splits,
        base=number("rope.freq_base", 10000.0),
        eps=number("attention.layer_norm_rms_epsilon", 1e-6),
    )
    return FileLayer(preset, wdtype, weights, norms, arch)


def state(file_layer: FileLayer, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The layer's state: the file's weights and norms, and a random input x and caches (as
    layer.random_state draws them)."""
    from .decode_layer import random_state

    p = file_layer.preset
    # random_state draws weights too: draw at the smallest cost the ones the file replaces
    arrays = random_state(p, "f16", rng, weights=False)
    arrays.update(file_layer.weights)
    arrays.update(file_layer.norms)
    return arrays
