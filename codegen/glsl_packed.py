"""GLSL helpers of a packed GGUF weight (`W packed split`, dsl/packing.py): the same functions,
with the same signatures, as glsl_templates' GGUF readers (scale_, min_, quant_, quant8_, blk_,
sub32_), reading the packed layout instead.  Every kernel that reads the weight (fused and
unfused: they share the buffer) calls them, so the printer renders a packed weight as it renders
a GGUF one and picks only the text.

`{n}` is the buffer's name part, `{nb}` the GLSL expression of its number of blocks (part `i`
of the layout starts at `nb` x the bytes of parts 0 .. i-1).  Quants are 16-byte aligned, read
through the buffer's uvec4 view `b_{n}_u4` (declared with the buffer); a scale is one aligned
word load and a shift.

Input: a dtype and a packing.  Output: template text.  Not done here: choosing the packing (the
schedule line, dsl/schedule.py) or which helpers a kernel needs (glsl.py)."""

from __future__ import annotations

from fusec.dsl.packing import Packing
from fusec.dsl.types import DType

from .glsl_templates import _BLOCK_DOT, _BLOCK_DOT_AFTER, _QUANT8, _SUB32_Q4K


def _from(text: str, start: str) -> str:
    """`text` from the definition that begins with `start` (the parts a packing keeps)."""
    return text[text.index(start) :]


def _replaced(text: str, *pairs: tuple[str, str]) -> str:
    """`text` with each `old` replaced by its `new`; every `old` must be there (a template that
    changes under a packing fails here, not in the GLSL compiler)."""
    for old, new in pairs:
        assert old in text, old
        text = text.replace(old, new)
    return text


def _upto(text: str, end: str) -> str:
    return text[: text.index(end)]


# an f16 at byte offset o (even): one word load and a shift
_HALF = "unpackHalf2x16(b_{n}[({o}) >> 2u] >> ((({o}) & 2u) * 8u)).x"


def _half(o: str) -> str:
    return _HALF.replace("{o}", o)


_SPLIT_DEQUANT = {
    # quants of block b at 16 b, scales at 16 nb + 2 b
    DType.Q4_0: f"""float scale_{{n}}(uint e) {{{{
    uint o = {{nb}} * 16u + (e >> 5u) * 2u;
    return {_half("o")};
}}}}
float quant_{{n}}(uint e) {{{{
    uint j = e & 31u;
    uint b = byte_{{n}}((e >> 5u) * 16u + (j & 15u));
    return float(int((j < 16u) ? (b & 15u) : (b >> 4u)) - 8);
}}}}""",
    # quants of block b at 32 b (so element e's quant is byte e), scales at 32 nb + 2 b
    DType.Q8_0: f"""float scale_{{n}}(uint e) {{{{
    uint o = {{nb}} * 32u + (e >> 5u) * 2u;
    return {_half("o")};
}}}}
float quant_{{n}}(uint e) {{{{
    return float(int(byte_{{n}}(e) << 24u) >> 24);
}}}}""",
    # ql and qh of super-block s at 192 s, its int8 scales at 192 nb + 16 s, d at 208 nb + 2 s
    DType.Q6_K: f"""float scale_{{n}}(uint e) {{{{
    uint s = e >> 8u, o = {{nb}} * 208u + s * 2u;
    float d = {_half("o")};
    return d * float(int(byte_{{n}}({{nb}} * 192u + s * 16u + ((e & 255u) >> 4u)) << 24u) >> 24);
}}}}
float quant_{{n}}(uint e) {{{{
    uint o = (e >> 8u) * 192u, j = e & 255u, r = j & 127u;
    uint l = byte_{{n}}(o + (j >> 7u) * 64u + (r & 63u)) >> ((r >> 6u) * 4u);
    uint h = byte_{{n}}(o + 128u + (j >> 7u) * 32u + (r & 31u)) >> ((r >> 5u) * 2u);
    return float(int((l & 15u) | ((h & 3u) << 4u)) - 32);
}}}}""",
    # quants of super-block s at 128 s, its 16 bytes of d, dmin, scales and mins at 128 nb + 16 s
    DType.Q4_K: """float scale_{n}(uint e) {{
    uint o = {nb} * 128u + (e >> 8u) * 16u, s = (e >> 5u) & 7u;
    uint sc = (s < 4u) ? (byte_{n}(o + 4u + s) & 63u)
                       : ((byte_{n}(o + 8u + s) & 15u) | ((byte_{n}(o + s) >> 6u) << 4u));
    return unpackHalf2x16(b_{n}[o >> 2u]).x * float(sc);
}}
float min_{n}(uint e) {{
    uint o = {nb} * 128u + (e >> 8u) * 16u, s = (e >> 5u) & 7u;
    uint m = (s < 4u) ? (byte_{n}(o + 8u + s) & 63u)
                      : ((byte_{n}(o + 8u + s) >> 4u) | ((byte_{n}(o + 4u + s) >> 6u) << 4u));
    return unpackHalf2x16(b_{n}[o >> 2u]).y * float(m);
}}
float quant_{n}(uint e) {{
    uint j = e & 255u;
    uint b = byte_{n}((e >> 8u) * 128u + (j >> 6u) * 32u + (j & 31u));
    return float(((j & 32u) != 0u) ? (b >> 4u) : (b & 15u));
}}""",
}

# eight quants from e0 (a multiple of 8): two aligned words in every packed layout
_SPLIT_QUANT8 = {
    DType.Q4_0: _upto(_QUANT8[DType.Q4_0], "void quant8_")
    + """void quant8_{n}(uint e0, out vec4 lo, out vec4 hi) {{
    uint j = e0 & 31u;
    uint w = (e0 >> 5u) * 4u + ((j & 15u) >> 2u);
    uint sh = (j < 16u) ? 0u : 4u;
    lo = q4x4_{n}(b_{n}[w] >> sh);
    hi = q4x4_{n}(b_{n}[w + 1u] >> sh);
}}""",
    DType.Q8_0: _upto(_QUANT8[DType.Q8_0], "void quant8_")
    + """void quant8_{n}(uint e0, out vec4 lo, out vec4 hi) {{
    lo = q8x4_{n}(b_{n}[e0 >> 2u]);
    hi = q8x4_{n}(b_{n}[(e0 >> 2u) + 1u]);
}}""",
    DType.Q6_K: _upto(_QUANT8[DType.Q6_K], "void quant8_")
    + """void quant8_{n}(uint e0, out vec4 lo, out vec4 hi) {{
    uint o = (e0 >> 8u) * 192u, j = e0 & 255u, r = j & 127u;
    uint l = (o + (j >> 7u) * 64u + (r & 63u)) >> 2u;
    uint h = (o + 128u + (j >> 7u) * 32u + (r & 31u)) >> 2u;
    uint ls = (r >> 6u) * 4u, hs = (r >> 5u) * 2u;
    lo = q6x4_{n}(((b_{n}[l] >> ls) & 0x0f0f0f0fu) | (((b_{n}[h] >> hs) & 0x03030303u) << 4u));
    hi = q6x4_{n}(((b_{n}[l + 1u] >> ls) & 0x0f0f0f0fu)
                  | (((b_{n}[h + 1u] >> hs) & 0x03030303u) << 4u));
}}""",
    DType.Q4_K: _upto(_QUANT8[DType.Q4_K], "void quant8_")
    + """void quant8_{n}(uint e0, out vec4 lo, out vec4 hi) {{
    uint j = e0 & 255u;
    uint w = ((e0 >> 8u) * 128u + (j >> 6u) * 32u + (j & 31u)) >> 2u;
    uint sh = (j & 32u) >> 3u;
    lo = q4x4_{n}(b_{n}[w] >> sh);
    hi = q4x4_{n}(b_{n}[w + 1u] >> sh);
}}""",
}

# a whole block for the integer dot products: one 16-byte load of q4_0's quants, two of q8_0's
# (where the GGUF layout takes 5 and 9 word loads and half-word shifts), one word for the scale
_SPLIT_BLOCK_DOT = {
    DType.Q4_0: f"""void blk_{{n}}(uint bi, out float d, out uvec4 q) {{{{
    uint o = {{nb}} * 16u + bi * 2u;
    d = {_half("o")};
    q = b_{{n}}_u4[bi];
}}}}
"""
    + _from(_BLOCK_DOT[DType.Q4_0], "int dot_"),
    DType.Q8_0: f"""void blk_{{n}}(uint bi, out float d, out uvec4 qa, out uvec4 qb) {{{{
    uint o = {{nb}} * 32u + bi * 2u;
    d = {_half("o")};
    qa = b_{{n}}_u4[bi * 2u];
    qb = b_{{n}}_u4[bi * 2u + 1u];
}}}}
"""
    + _from(_BLOCK_DOT[DType.Q8_0], "int dot_"),
    DType.Q4_K: _BLOCK_DOT[DType.Q4_K],
}
# q6_K's sub-block of 32: four 16-byte loads of quants (ql at 192 s + 64 (b / 4) + 32 (b % 2),
# qh at 192 s + 128 + 32 (b / 4): 16-byte aligned), a word for the two int8 scales, one for d
_SPLIT_BLOCK_DOT_AFTER = {
    DType.Q6_K: f"""void sub32_{{n}}(uint e, out float d, out int sa, out int sb,
                 out uvec4 qa, out uvec4 qb) {{{{
    uint s = e >> 8u, o = s * 192u, b = (e >> 5u) & 7u;
    uint l_at = (o + (b >> 2u) * 64u + (b & 1u) * 32u) >> 4u;
    uint h_at = (o + 128u + (b >> 2u) * 32u) >> 4u;
    uint ls = ((b & 3u) >> 1u) * 4u, hs = (b & 3u) * 2u;
    qa = ((b_{{n}}_u4[l_at] >> ls) & 0x0f0f0f0fu)
       | (((b_{{n}}_u4[h_at] >> hs) & 0x03030303u) << 4u);
    qb = ((b_{{n}}_u4[l_at + 1u] >> ls) & 0x0f0f0f0fu)
       | (((b_{{n}}_u4[h_at + 1u] >> hs) & 0x03030303u) << 4u);
    uint so = {{nb}} * 192u + s * 16u + 2u * b;
    uint sc = b_{{n}}[so >> 2u] >> ((so & 2u) * 8u);
    sa = int(sc << 24u) >> 24;
    sb = int(sc << 16u) >> 24;
    uint dofs = {{nb}} * 208u + s * 2u;
    d = {_half("dofs")};
}}}}
"""
    + _from(_BLOCK_DOT_AFTER[DType.Q6_K], "int dot16_"),
}
# q4_K's sub-block of 32 (glsl_templates._SUB32_Q4K): the head at 128 nb + 16 s, the quants at
# 128 s + 32 (b / 2)
_SPLIT_SUB32_Q4K = _replaced(
    _SUB32_Q4K,
    ("b_{n}_u4[sb * 9u]", "b_{n}_u4[{nb} * 8u + sb]"),
    ("uint q = sb * 9u + 1u + ", "uint q = sb * 8u + "),
)


def dequant(dtype: DType, packing: Packing) -> str:
    """scale_, quant_ (and q4_K's min_) of a packed weight."""
    match packing:
        case Packing.SPLIT:
            return _SPLIT_DEQUANT[dtype]


def quant8(dtype: DType, packing: Packing) -> str:
    """quant8_ (and its qNx4_) of a packed weight."""
    match packing:
        case Packing.SPLIT:
            return _SPLIT_QUANT8[dtype]


def block_dot(dtype: DType, packing: Packing) -> str | None:
    """blk_ and dot_ of a packed weight (None: the dtype has none)."""
    match packing:
        case Packing.SPLIT:
            return _SPLIT_BLOCK_DOT.get(dtype)


def block_dot_after(dtype: DType, packing: Packing) -> str | None:
    """Helpers emitted after byte_ (q6_K's sub32_, dot16_ and sum16_), or None."""
    match packing:
        case Packing.SPLIT:
            return _SPLIT_BLOCK_DOT_AFTER.get(dtype)


def sub32_q4k(packing: Packing) -> str:
    """q4_K's sub32_ of a packed weight."""
    match packing:
        case Packing.SPLIT:
            return _SPLIT_SUB32_Q4K
