"""Kernel IR -> GLSL 450 compute shader text.

One expression printer (fully parenthesized), one op table, deterministic names:
`b_<buffer>` global buffers, `s_<stage>` shared arrays, `v_<stage>` per-lane locals,
`c_<const>` specialization constants, `i_<index>` index variables; a user name that a generated
name could equal is mangled (`buffer_id`).  Each phase is preceded by a `#line` that points at
its `.fuse` stage, so a shaderc error lands on the DSL line.

Not done here: choosing the subgroup size (the runtime, from the manifest) and any check that
needs a device.
"""

from __future__ import annotations

import contextvars
import math
import re

import attrs

from fusec.dsl import ir
from fusec.dsl.types import DType, Scope

from . import kir, manifest

_GLSL_TYPE = {
    DType.F32: "float",
    DType.F16: "float16_t",
    DType.U32: "uint",
    DType.I32: "int",
    DType.Q8_0: "uint",  # GGUF blocks, read as bytes of 32-bit words
    DType.Q4_0: "uint",
    DType.Q4_K: "uint",
    DType.Q6_K: "uint",
    DType.Q8_0X: "uint",
}

# Dequantization of one element `e` (flat index) of a GGUF-quantized buffer, as ggml defines it:
# blocks of 32 elements, an f16 scale d first; q8_0 value = int8 * d, q4_0 value = (nibble - 8) * d
# with elements 0..15 in the low nibbles and 16..31 in the high ones.  One f32 multiply, as
# gguf.quants.dequantize does, so the values agree bit for bit.
# Eight consecutive quants from e0 (a multiple of 8: one block, 8 bytes) with 2 or 3 word loads
# instead of 8 byte reads.  Blocks start at even byte offsets, so the 8 bytes begin at a word
# boundary or 2 bytes into one; the third word is read only in the second case, where it holds
# bytes of the same block.
_QUANT8_BYTES = """void bytes8_{n}(uint o, out uint lo, out uint hi) {{
    uint w = o >> 2u;
    if ((o & 3u) == 0u) {{
        lo = b_{n}[w];
        hi = b_{n}[w + 1u];
    }} else {{
        uint a = b_{n}[w], b = b_{n}[w + 1u], c = b_{n}[w + 2u];
        lo = (a >> 16u) | (b << 16u);
        hi = (b >> 16u) | (c << 16u);
    }}
}}"""
# Quants to floats without int->float conversions (a quarter-rate instruction on NVIDIA): a byte
# b or'ed into the mantissa of 2^23 is the float 2^23 + b exactly, so subtracting 2^23 + 8
# (q4_0) or 2^23 + 128 after flipping the sign bit (q8_0) gives the quant's value exactly.
_QUANT8 = {
    DType.Q8_0: """vec4 q8x4_{n}(uint w) {{
    uvec4 b = (uvec4(w) >> uvec4(0u, 8u, 16u, 24u)) & 0xffu;
    return uintBitsToFloat((b ^ 0x80u) | 0x4b000000u) - 8388736.0;
}}
void quant8_{n}(uint e0, out vec4 lo, out vec4 hi) {{
    uint a, b;
    bytes8_{n}((e0 >> 5u) * 34u + 2u + (e0 & 31u), a, b);
    lo = q8x4_{n}(a);
    hi = q8x4_{n}(b);
}}""",
    DType.Q4_0: """vec4 q4x4_{n}(uint w) {{
    uvec4 b = (uvec4(w) >> uvec4(0u, 8u, 16u, 24u)) & 0x0fu;
    return uintBitsToFloat(b | 0x4b000000u) - 8388616.0;
}}
void quant8_{n}(uint e0, out vec4 lo, out vec4 hi) {{
    uint j = e0 & 31u;
    uint a, b;
    bytes8_{n}((e0 >> 5u) * 18u + 2u + (j & 15u), a, b);
    uint sh = (j < 16u) ? 0u : 4u;
    lo = q4x4_{n}(a >> sh);
    hi = q4x4_{n}(b >> sh);
}}""",
    # q4_K: blocks of 144 bytes (a multiple of 4, so every 8 quants are two aligned words);
    # element j of a block is the low (j % 64 < 32) or high nibble of byte 16 + 32 (j / 64) +
    # j % 32
    DType.Q4_K: """vec4 q4x4_{n}(uint w) {{
    uvec4 b = (uvec4(w) >> uvec4(0u, 8u, 16u, 24u)) & 0x0fu;
    return uintBitsToFloat(b | 0x4b000000u) - 8388608.0;
}}
void quant8_{n}(uint e0, out vec4 lo, out vec4 hi) {{
    uint j = e0 & 255u;
    uint w = ((e0 >> 8u) * 144u + 16u + (j >> 6u) * 32u + (j & 31u)) >> 2u;
    uint sh = (j & 32u) >> 3u;
    lo = q4x4_{n}(b_{n}[w] >> sh);
    hi = q4x4_{n}(b_{n}[w + 1u] >> sh);
}}""",
    # q6_K: blocks of 210 bytes; with r = j % 128, element j's low 4 bits are the low (r < 64)
    # or high nibble of ql byte 64 (j / 128) + r % 64, its high 2 bits are bits 2 (r / 32) and
    # up of qh byte 128 + 32 (j / 128) + r % 32; the quant is those 6 bits - 32
    DType.Q6_K: """vec4 q6x4_{n}(uint w) {{
    uvec4 b = (uvec4(w) >> uvec4(0u, 8u, 16u, 24u)) & 0xffu;
    return uintBitsToFloat(b | 0x4b000000u) - 8388640.0;
}}
void quant8_{n}(uint e0, out vec4 lo, out vec4 hi) {{
    uint o = (e0 >> 8u) * 210u, j = e0 & 255u, r = j & 127u;
    uint l0, l1, h0, h1;
    bytes8_{n}(o + (j >> 7u) * 64u + (r & 63u), l0, l1);
    bytes8_{n}(o + 128u + (j >> 7u) * 32u + (r & 31u), h0, h1);
    uint ls = (r >> 6u) * 4u, hs = (r >> 5u) * 2u;
    lo = q6x4_{n}(((l0 >> ls) & 0x0f0f0f0fu) | (((h0 >> hs) & 0x03030303u) << 4u));
    hi = q6x4_{n}(((l1 >> ls) & 0x0f0f0f0fu) | (((h1 >> hs) & 0x03030303u) << 4u));
}}""",
}

# A q4_K sub-block of 32 read whole, for a lane that takes 32 elements a step (`lane x 32`):
# the super-block's first 16 bytes (d, dmin and the 12 bytes of packed scales and mins) and the
# sub-block's 32 bytes of quants in three 16-byte loads, where `scale_`, `min_` and `quant8_`
# take fourteen 4-byte ones (a 144-byte block keeps every super-block 16-byte aligned).  `qa`
# and `qb` hold the 32 quants, element i in the low nibble of byte i % 4 of word i / 4; the scale
# and min are the same products as scale_ and min_ give (H200, 6144 x 4096: docs/BENCHMARKS.md).
_SUB32_Q4K = """void sub32_{n}(uint e, out float d, out float m, out uvec4 qa, out uvec4 qb) {{
    uint sb = e >> 8u, s = (e >> 5u) & 7u, sh = (s & 3u) * 8u;
    uvec4 h = b_{n}_u4[sb * 9u];
    uint lo = (h.y >> sh) & 0xffu, mid = (h.z >> sh) & 0xffu, hi = (h.w >> sh) & 0xffu;
    uint sc = (s < 4u) ? (lo & 63u) : ((hi & 15u) | ((lo >> 6u) << 4u));
    uint mn = (s < 4u) ? (mid & 63u) : ((hi >> 4u) | ((mid >> 6u) << 4u));
    vec2 dm = unpackHalf2x16(h.x);
    d = dm.x * float(sc);
    m = dm.y * float(mn);
    uint q = sb * 9u + 1u + (s >> 1u) * 2u, nib = (s & 1u) * 4u;
    qa = b_{n}_u4[q] >> nib;
    qb = b_{n}_u4[q + 1u] >> nib;
}}"""

_DEQUANT = {
    DType.Q8_0: """float scale_{n}(uint e) {{
    uint off = (e >> 5u) * 34u;
    return unpackHalf2x16(byte_{n}(off) | (byte_{n}(off + 1u) << 8u)).x;
}}
float quant_{n}(uint e) {{
    return float(int(byte_{n}((e >> 5u) * 34u + 2u + (e & 31u)) << 24u) >> 24);
}}""",
    DType.Q4_0: """float scale_{n}(uint e) {{
    uint off = (e >> 5u) * 18u;
    return unpackHalf2x16(byte_{n}(off) | (byte_{n}(off + 1u) << 8u)).x;
}}
float quant_{n}(uint e) {{
    uint j = e & 31u;
    uint b = byte_{n}((e >> 5u) * 18u + 2u + (j & 15u));
    return float(int((j < 16u) ? (b & 15u) : (b >> 4u)) - 8);
}}""",
    # q4_K: value = quant * scale - min, per sub-block of 32 (s = j / 32) the 6-bit scale and
    # min unpacked from the 12 bytes at offset 4 as ggml's get_scale_min_k4 does, times the
    # super-block's d (bytes 0-1) and dmin (bytes 2-3).  Each product is exact in f32 (11 + 6
    # + 4 bits), so the one rounding is the subtraction's, as in gguf.quants.dequantize.
    DType.Q4_K: """float scale_{n}(uint e) {{
    uint o = (e >> 8u) * 144u, s = (e >> 5u) & 7u;
    uint sc = (s < 4u) ? (byte_{n}(o + 4u + s) & 63u)
                       : ((byte_{n}(o + 8u + s) & 15u) | ((byte_{n}(o + s) >> 6u) << 4u));
    return unpackHalf2x16(b_{n}[o >> 2u]).x * float(sc);
}}
float min_{n}(uint e) {{
    uint o = (e >> 8u) * 144u, s = (e >> 5u) & 7u;
    uint m = (s < 4u) ? (byte_{n}(o + 8u + s) & 63u)
                      : ((byte_{n}(o + 8u + s) >> 4u) | ((byte_{n}(o + 4u + s) >> 6u) << 4u));
    return unpackHalf2x16(b_{n}[o >> 2u]).y * float(m);
}}
float quant_{n}(uint e) {{
    uint j = e & 255u;
    uint b = byte_{n}((e >> 8u) * 144u + 16u + (j >> 6u) * 32u + (j & 31u));
    return float(((j & 32u) != 0u) ? (b >> 4u) : (b & 15u));
}}""",
    # q6_K: value = quant * scale, the int8 scale of sub-block j / 16 (bytes 192..207) times d
    # (bytes 208-209); exact in f32 (11 + 7 + 5 bits)
    DType.Q6_K: """float scale_{n}(uint e) {{
    uint o = (e >> 8u) * 210u;
    float d = unpackHalf2x16(byte_{n}(o + 208u) | (byte_{n}(o + 209u) << 8u)).x;
    return d * float(int(byte_{n}(o + 192u + ((e & 255u) >> 4u)) << 24u) >> 24);
}}
float quant_{n}(uint e) {{
    uint o = (e >> 8u) * 210u, j = e & 255u, r = j & 127u;
    uint l = byte_{n}(o + (j >> 7u) * 64u + (r & 63u)) >> ((r >> 6u) * 4u);
    uint h = byte_{n}(o + 128u + (j >> 7u) * 32u + (r & 31u)) >> ((r >> 5u) * 2u);
    return float(int((l & 15u) | ((h & 3u) << 4u)) - 32);
}}""",
}
# A shared vector stored as q8_0 (`in shared as q8_0`): per 32-element block two ivec4 of int8
# quants (element j in byte j % 4 of word j / 4) and an ivec2 of the scale as stored (f16-
# rounded, float bits) and the sum of the quants (for q4_0's offset of 8).  `sq_` reads one
# element back as a float.
_SHARED_Q8 = """shared ivec4 s_{n}_q[{blocks} * 2u];
shared ivec2 s_{n}_d[{blocks}];
float sq_{n}(uint k) {{
    int w = s_{n}_q[k >> 4u][(k >> 2u) & 3u];
    return float(bitfieldExtract(w, int((k & 3u) * 8u), 8)) * intBitsToFloat(s_{n}_d[k >> 5u].x);
}}"""
# An unfused chain's q8_0 intermediate (DType.Q8_0X: 12 words per block) read one element at a
# time, as a float.
_ACT_BLOCKS = """float aq_{n}(uint k) {{
    uint o = (k >> 5u) * 12u;
    int w = int(b_{n}[o + ((k >> 2u) & 7u)]);
    return float(bitfieldExtract(w, int((k & 3u) * 8u), 8)) * uintBitsToFloat(b_{n}[o + 8u]);
}}"""
# Integer dot products of four packed 8-bit lanes (SPV_KHR_integer_dot_product, core in Vulkan
# 1.3), declared through GL_EXT_spirv_intrinsics: OpSDot (4450) signed x signed and OpSUDot
# (4452) signed x unsigned, capabilities DotProduct (6019) and DotProductInput4x8BitPacked
# (6018), packed format 0 (PackedVectorFormat4x8Bit).
_DOT_EXT = 'extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018]'
_INT_DOT = f"""spirv_instruction({_DOT_EXT}, id = 4450)
int dot_ss(int a, int b, spirv_literal int fmt);
spirv_instruction({_DOT_EXT}, id = 4452)
int dot_su(int a, int b, spirv_literal int fmt);"""
# One whole weight block for the integer dot products, from its block index: the scale and
# the quants as 32-bit words.  A q4_0 block (18 bytes) starts at an even byte offset: its
# quants begin at a word boundary (offset 2 mod 4) or 2 bytes into one; 5 word loads cover
# either case.  A q8_0 block (34 bytes) likewise takes 9.  `dot_` is the block's integer dot
# product with a q8_0 activation block (xa: elements 0..15, xb: 16..31); for q4_0 the quants
# are the unsigned nibbles, so the caller subtracts 8 x the activation block's quant sum.
_BLOCK_DOT = {
    DType.Q4_0: """void blk_{n}(uint bi, out float d, out uvec4 q) {{
    uint o = bi * 18u, w = o >> 2u;
    uint u0 = b_{n}[w], u1 = b_{n}[w + 1u], u2 = b_{n}[w + 2u], u3 = b_{n}[w + 3u],
         u4 = b_{n}[w + 4u];
    bool al = (o & 2u) != 0u;
    d = unpackHalf2x16(al ? (u0 >> 16u) : u0).x;
    q = al ? uvec4(u1, u2, u3, u4)
           : uvec4((u0 >> 16u) | (u1 << 16u), (u1 >> 16u) | (u2 << 16u),
                   (u2 >> 16u) | (u3 << 16u), (u3 >> 16u) | (u4 << 16u));
}}
int dot_{n}(uvec4 q, ivec4 xa, ivec4 xb) {{
    uvec4 lo = q & 0x0f0f0f0fu, hi = (q >> 4u) & 0x0f0f0f0fu;
    return dot_su(xa.x, int(lo.x), 0) + dot_su(xa.y, int(lo.y), 0)
         + dot_su(xa.z, int(lo.z), 0) + dot_su(xa.w, int(lo.w), 0)
         + dot_su(xb.x, int(hi.x), 0) + dot_su(xb.y, int(hi.y), 0)
         + dot_su(xb.z, int(hi.z), 0) + dot_su(xb.w, int(hi.w), 0);
}}""",
    # q4_K: a sub-block of 32 read whole (sub32_, its quants still shifted to their nibble);
    # value = quant * scale - min, so the caller takes scale x the dot product - min x the
    # activation block's quant sum
    DType.Q4_K: """int dot_{n}(uvec4 qa, uvec4 qb, ivec4 xa, ivec4 xb) {{
    qa &= 0x0f0f0f0fu;
    qb &= 0x0f0f0f0fu;
    return dot_su(xa.x, int(qa.x), 0) + dot_su(xa.y, int(qa.y), 0)
         + dot_su(xa.z, int(qa.z), 0) + dot_su(xa.w, int(qa.w), 0)
         + dot_su(xb.x, int(qb.x), 0) + dot_su(xb.y, int(qb.y), 0)
         + dot_su(xb.z, int(qb.z), 0) + dot_su(xb.w, int(qb.w), 0);
}}""",
    DType.Q8_0: """void blk_{n}(uint bi, out float d, out uvec4 qa, out uvec4 qb) {{
    uint o = bi * 34u, w = o >> 2u;
    uint u0 = b_{n}[w], u1 = b_{n}[w + 1u], u2 = b_{n}[w + 2u], u3 = b_{n}[w + 3u],
         u4 = b_{n}[w + 4u], u5 = b_{n}[w + 5u], u6 = b_{n}[w + 6u], u7 = b_{n}[w + 7u],
         u8 = b_{n}[w + 8u];
    bool al = (o & 2u) != 0u;
    d = unpackHalf2x16(al ? (u0 >> 16u) : u0).x;
    qa = al ? uvec4(u1, u2, u3, u4)
            : uvec4((u0 >> 16u) | (u1 << 16u), (u1 >> 16u) | (u2 << 16u),
                    (u2 >> 16u) | (u3 << 16u), (u3 >> 16u) | (u4 << 16u));
    qb = al ? uvec4(u5, u6, u7, u8)
            : uvec4((u4 >> 16u) | (u5 << 16u), (u5 >> 16u) | (u6 << 16u),
                    (u6 >> 16u) | (u7 << 16u), (u7 >> 16u) | (u8 << 16u));
}}
int dot_{n}(uvec4 qa, uvec4 qb, ivec4 xa, ivec4 xb) {{
    return dot_ss(xa.x, int(qa.x), 0) + dot_ss(xa.y, int(qa.y), 0)
         + dot_ss(xa.z, int(qa.z), 0) + dot_ss(xa.w, int(qa.w), 0)
         + dot_ss(xb.x, int(qb.x), 0) + dot_ss(xb.y, int(qb.y), 0)
         + dot_ss(xb.z, int(qb.z), 0) + dot_ss(xb.w, int(qb.w), 0);
}}""",
}
# q6_K against q8_0 activation blocks: a block of 32 is two sub-blocks of 16 with their own int8
# scales.  sub32_ gathers the 32 six-bit quants (unsigned, 0..63; element i in byte i % 4 of
# word i / 4: the low 4 bits from ql, the high 2 from qh, as quant8_ does) and the two scales;
# the caller takes per half scale x (the dot product - 32 x the half's activation quant sum).
# q16_ reads 16 bytes at a 2-byte aligned offset (210-byte blocks) without a branch: five words,
# shifted by a half word where the offset needs it.  Emitted after byte_, which it reads with.
_BLOCK_DOT_AFTER = {
    DType.Q6_K: """uvec4 q16_{n}(uint o) {{
    uint w = o >> 2u;
    uvec4 a = uvec4(b_{n}[w], b_{n}[w + 1u], b_{n}[w + 2u], b_{n}[w + 3u]);
    uvec4 b = uvec4(a.yzw, b_{n}[w + 4u]);
    return ((o & 2u) != 0u) ? ((a >> 16u) | (b << 16u)) : a;
}}
void sub32_{n}(uint e, out float d, out int sa, out int sb,
                 out uvec4 qa, out uvec4 qb) {{
    uint o = (e >> 8u) * 210u, b = (e >> 5u) & 7u;
    uint l_at = o + (b >> 2u) * 64u + (b & 1u) * 32u, h_at = o + 128u + (b >> 2u) * 32u;
    uint ls = ((b & 3u) >> 1u) * 4u, hs = (b & 3u) * 2u;
    qa = ((q16_{n}(l_at) >> ls) & 0x0f0f0f0fu) | (((q16_{n}(h_at) >> hs) & 0x03030303u) << 4u);
    qb = ((q16_{n}(l_at + 16u) >> ls) & 0x0f0f0f0fu)
       | (((q16_{n}(h_at + 16u) >> hs) & 0x03030303u) << 4u);
    uint sc = byte_{n}(o + 192u + 2u * b) | (byte_{n}(o + 193u + 2u * b) << 8u);
    sa = int(sc << 24u) >> 24;
    sb = int(sc << 16u) >> 24;
    d = unpackHalf2x16(byte_{n}(o + 208u) | (byte_{n}(o + 209u) << 8u)).x;
}}
int dot16_{n}(uvec4 q, ivec4 x) {{
    return dot_su(x.x, int(q.x), 0) + dot_su(x.y, int(q.y), 0)
         + dot_su(x.z, int(q.z), 0) + dot_su(x.w, int(q.w), 0);
}}
int sum16_{n}(ivec4 x) {{
    return dot_ss(x.x, 0x01010101, 0) + dot_ss(x.y, 0x01010101, 0)
         + dot_ss(x.z, 0x01010101, 0) + dot_ss(x.w, 0x01010101, 0);
}}""",
}
_INIT = {"sum": "0.0", "max": "uintBitsToFloat(0xff800000u)", "min": "uintBitsToFloat(0x7f800000u)"}
_SUBGROUP_OP = {"sum": "subgroupAdd", "max": "subgroupMax", "min": "subgroupMin"}
_UNARY_FN = {
    "exp": "exp({0})",
    "log": "log({0})",
    "sqrt": "sqrt({0})",
    "rsqrt": "inversesqrt({0})",
    "abs": "abs({0})",
    # GLSL's tanh is as precise as (e^x - e^-x) / (e^x + e^-x) (GLSL 4.60, 4.7.1), which loses
    # most of its digits near 0 to cancellation (lavapipe: tanh(1e-6) = 1.19e-6); below 0.01,
    # x - x^3 / 3 is exact to 2e-9 relative (docs/FUZZING.md)
    "tanh": "((abs({0}) < 0.01) ? (({0}) * (1.0 - ({0}) * ({0}) / 3.0)) : tanh({0}))",
    "sin": "sin({0})",
    "cos": "cos({0})",
    "sigmoid": "(1.0 / (1.0 + exp(-({0}))))",
    "silu": "(({0}) / (1.0 + exp(-({0}))))",
    "erf": "fn_erf({0})",
    "gelu": "fn_gelu({0})",
    "gelu_tanh": "fn_gelu_tanh({0})",
    "softplus": "fn_softplus({0})",
    "float": "({0})",
    "max": "max({0}, {1})",
    "min": "min({0}, {1})",
    "pow": "pow({0}, {1})",
    "select": "((({0}) != 0.0) ? ({1}) : ({2}))",
    # GLSL's clamp is undefined for lo > hi (GLSL 4.60, 8.3); min(max()) is what the reference does
    "clamp": "min(max({0}, {1}), {2})",
}
# Functions written once per kernel that calls them (before main, in this order: gelu calls
# erf).  GLSL has no erf: below |x| = 0.5 its Taylor series to x^11 (the next term is under
# 3e-8 of erf there), above it Abramowitz and Stegun, Handbook of Mathematical Functions
# (1964), 7.1.26, |error| <= 1.5e-7.  gelu and its tanh form: Hendrycks and Gimpel, "Gaussian
# Error Linear Units", arXiv:1606.08415, section 2; tanh's argument is clamped to +-10, where
# tanh is +-1 in f32, since GLSL's tanh of a large argument may divide infinities.  softplus
# as max(x, 0) + log(1 + exp(-|x|)), which neither overflows nor loses x for large x.
_FUNCTION_TEXT = {
    "erf": """float fn_erf(float x) {
    float a = abs(x);
    if (a < 0.5) {
        float s = x * x;
        return x * (1.1283791670955126 + s * (-0.37612638903183754 + s * (0.11283791670955126
            + s * (-0.026866170645131252 + s * (0.005223977625442188
            - s * 0.0008548327023450852)))));
    }
    float t = 1.0 / (1.0 + 0.3275911 * a);
    float p = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027
        + t * 1.061405429))));
    return (x < 0.0 ? -1.0 : 1.0) * (1.0 - p * exp(-a * a));
}""",
    "gelu": """float fn_gelu(float x) {
    return 0.5 * x * (1.0 + fn_erf(x * 0.7071067811865476));
}""",
    "gelu_tanh": """float fn_gelu_tanh(float x) {
    float u = clamp(0.7978845608028654 * (x + 0.044715 * x * x * x), -10.0, 10.0);
    return 0.5 * x * (1.0 + tanh(u));
}""",
    "softplus": """float fn_softplus(float x) { return max(x, 0.0) + log(1.0 + exp(-abs(x))); }""",
}


# Double precision (a stage `in register as f64`, dsl/check_precision.py): GLSL has double
# +, -, *, /, sqrt, frexp and ldexp but no exp, log or pow.  log: x = m 2^e with m in
# [sqrt(1/2), sqrt(2)), log m = 2 atanh(s), s = (m - 1) / (m + 1), |s| <= 0.1716, by its series
# to s^25 (the next term is under 1e-20); exp: x = k ln 2 + r, |r| <= ln(2) / 2, e^r by its
# Taylor series to r^14 / 14! (the next term is under 5e-18), times 2^k.  Both within a few
# ulp of double, far under what an f32 result needs.  fn_angle64 reduces an angle to
# [-pi, pi] in double before the f32 sin or cos: Vulkan's f32 sin and cos are specified only
# there (Vulkan 1.3 specification, "Precision and Operation of SPIR-V Instructions").
def _estrin(coefficients: list[float], var: str) -> tuple[str, str]:
    """(declarations of var^2, var^4, ..., the polynomial c0 + c1 var + ...) by Estrin's
    scheme: pairs c_2j + c_2j+1 var, then pairs of those times var^2, and so on.  Its chain of
    dependent operations is log2(n) multiply-adds long instead of Horner's n: a lane waits on
    the latency of each double operation (with Horner's rule the H200's RoPE kernel took 0.5
    to 0.75 us more than with f32 angles; docs/BENCHMARKS.md)."""
    terms = [f"{c!r}lf" for c in coefficients]
    powers, power, decls = [], var, []
    while len(terms) > 1:
        powers.append(power)
        terms = [
            f"({terms[i]} + {terms[i + 1]} * {power})" if i + 1 < len(terms) else terms[i]
            for i in range(0, len(terms), 2)
        ]
        nxt = f"{var}{2 ** len(powers) * 1}"
        decls.append(f"double {nxt} = {power} * {power};")
        power = nxt
    return "\n    ".join(decls[:-1]), terms[0]


_LOG_DECLS, _LOG_POLY = _estrin([1.0 / (2 * j + 1) for j in range(13)], "z")
_EXP_DECLS, _EXP_POLY = _estrin([1.0 / math.factorial(n) for n in range(15)], "r")
_FUNCTION_TEXT["log64"] = f"""double fn_log64(double x) {{
    int e;
    double m = frexp(x, e);
    if (m < 0.7071067811865476lf) {{ m = 2.0lf * m; e = e - 1; }}
    double s = (m - 1.0lf) / (m + 1.0lf);
    double z = s * s;
    {_LOG_DECLS}
    return 2.0lf * s * {_LOG_POLY} + double(e) * 0.6931471805599453lf;
}}"""
_FUNCTION_TEXT["exp64"] = f"""double fn_exp64(double x) {{
    double k = floor(x * 1.4426950408889634lf + 0.5lf);
    double r = (x - k * 0.6931471805599453lf) - k * 2.3190468138462996e-17lf;
    {_EXP_DECLS}
    return ldexp({_EXP_POLY}, int(k));
}}"""
_FUNCTION_TEXT["pow64"] = """double fn_pow64(double x, double y) {
    return fn_exp64(y * fn_log64(x));
}"""
_FUNCTION_TEXT["angle64"] = """float fn_angle64(double x) {
    double k = floor(x * 0.15915494309189535lf + 0.5lf);
    return float((x - k * 6.283185307179586lf) - k * 2.4492935982947064e-16lf);
}"""
_FUNCTION_NEEDS = {"gelu": ("erf",), "pow64": ("log64", "exp64")}
# the double form of a function called in an f64 stage ({0}, {1}, {2}: its arguments in double)
_F64_FN = {
    "exp": "fn_exp64({0})",
    "log": "fn_log64({0})",
    "pow": "fn_pow64({0}, {1})",
    "sqrt": "sqrt({0})",
    "abs": "abs({0})",
    "max": "max({0}, {1})",
    "min": "min({0}, {1})",
    "float": "({0})",
    "select": "((({0}) != 0.0lf) ? ({1}) : ({2}))",
    "clamp": "min(max({0}, {1}), {2})",
}
# the functions of _FUNCTION_TEXT that the kernel being emitted calls (None outside emit_kernel)
_CALLED: contextvars.ContextVar[set[str] | None] = contextvars.ContextVar(
    "fusec_called", default=None
)


# Workgroup-strided loops (a workgroup reduction, a shared fill) carry an unroll hint: their
# trip count is fixed by specialization constants, and unrolled they issue their loads together
# (H200: RMSNorm + matvec 15.8 -> 12.8 us, docs/BENCHMARKS.md).
LOOP_HINT = "[[unroll]] "
# A loop of one lane over an index (a lane reduction, a tile's `repeat`) is unrolled here when
# its trip count is a literal of at most SERIAL_UNROLL, and marked [[dont_unroll]] otherwise.
# The driver would otherwise decide from the specialized trip count: RADV unrolls up to 128
# iterations of a loop that loads (Mesa `nir_opt_loop_unroll.c`, `check_unrolling_restrictions`;
# RADV's `max_unroll_iterations_aggressive` 128), after which its value numbering and
# reassociation keep every iteration's load live (ACO, 131 VGPRs for two lane sums over 128
# rows, against 4 in a loop).  Stated here, the register demand is what codegen/liveness.py
# measures on our SPIR-V, for every value of the constants.
SERIAL_UNROLL = 8


def serial_loop_hint(extent: ir.Expr) -> str:
    if isinstance(extent, ir.Lit) and int(extent.value) <= SERIAL_UNROLL:
        return "[[unroll]] "
    return "[[dont_unroll]] "


# A contraction step of f16/f32 rows is unrolled until a lane has about 8 wide loads (128 bytes)
# in flight: one 4096-wide matvec keeps only 2 x 16 bytes per lane otherwise, half of what the
# H200's latency needs.  GGUF steps are not unrolled: their dequantization already holds many
# registers, and unrolled they ran 3x slower (register spills).
LOADS_IN_FLIGHT = 8
# Integer dot product steps (whole q8_0 / q4_0 blocks per lane) are unrolled until about this
# many 32-bit words of weights are loaded per lane before the dot products.
INT_DOT_WORDS = 40


# User names reach GLSL behind a prefix that says what they name (b_ buffer, s_ shared array,
# v_ local, c_ constant, i_ index; per quantized buffer quant_W, blk_W, ...), and some generated
# names extend a user name or share its prefix: b_W_u4 (buffer W read as uvec4), s_xn_q and
# s_xn_d (a q8_0 stage's blocks), s_reduce, s_exchange, dot_ss, dot_su, and i_t_src_dst (the
# flattened index of a stage over t, src and dst).  A user name that one of them could equal is
# mangled to its length followed by itself (`W_u4` -> b_4W_u4): after a prefix only a mangled
# name starts with a digit, and the length keeps the mangling one-to-one.  Every other name is
# printed as written, so kernels without such names read as they always did.
_BUFFER_SUFFIX = re.compile(r"_u[0-9]+$")  # b_<buffer>_u4: a wide view
_WEIGHT_WORDS = frozenset(("ss", "su"))  # dot_<quantized buffer> against dot_ss, dot_su
_SHARED_SUFFIX = re.compile(r"_[qd]$")  # s_<stage>_q, s_<stage>_d: q8_0 blocks
_SHARED_WORDS = frozenset(("reduce", "exchange"))  # s_reduce, s_exchange
_SHARED_ADDED = re.compile(r"^(reduce_i|tk[0-9]+(_i)?)$")  # s_reduce_i, s_tk0, s_tk0_i


def _mangled(name: str) -> str:
    return f"{len(name)}{name}"


def buffer_id(buf: ir.Buffer) -> str:
    """A buffer's name in GLSL identifiers (b_<id>, B_<id>, quant_<id>, ...)."""
    name = buf.name
    if _BUFFER_SUFFIX.search(name) or (buf.dtype.is_quantized and name in _WEIGHT_WORDS):
        return _mangled(name)
    return name


def shared_id(name: str) -> str:
    """A shared array's name in GLSL identifiers (s_<id>, sq_<id>, s_<id>_q, ...).  An array
    fusec adds (`#tk0`, `#reduce_i`) is printed without its '#'; a stage of that name is
    mangled."""
    if name.startswith("#"):
        return name[1:]
    if _SHARED_SUFFIX.search(name) or name in _SHARED_WORDS or _SHARED_ADDED.match(name):
        return _mangled(name)
    return name


def storage_id(x: ir.Buffer | kir.SharedArray) -> str:
    """`buffer_id` or `shared_id`, as `x` is."""
    return shared_id(x.name) if isinstance(x, kir.SharedArray) else buffer_id(x)


def user_index_vars(region: ir.Region) -> set[ir.IndexVar]:
    """The index variables a region's text declares (lowering adds flattened ones)."""
    out: set[ir.IndexVar] = set()
    if region.per is not None:
        out.add(region.per)
    if region.tile is not None:
        out.update((region.tile.per, *region.tile.dims))
    for stage in region.all_stages():
        out.update(stage.indices)
        out.update(x.var for x in ir.walk(stage.value) if isinstance(x, ir.Reduce))
    return out


def pr_with(pr: _Printer, r: ir.Reduce, name: str) -> _Printer:
    """`pr` printing the argmax `r` as the index local `name`_i."""
    return _Printer(pr.env, {**pr.reduce_names, id(r): f"{name}_i"})


def combine(op: str, acc: str, value: str) -> str:
    return f"{acc} + {value}" if op == "sum" else f"{op}({acc}, {value})"


def float_literal(v: float) -> str:
    text = repr(float(v))
    if text in ("inf", "-inf", "nan"):
        return {
            "inf": "uintBitsToFloat(0x7f800000u)",
            "-inf": "uintBitsToFloat(0xff800000u)",
            "nan": "uintBitsToFloat(0x7fc00000u)",
        }[text]
    return text


def double_literal(v: float) -> str:
    """A GLSL double literal (an f64 stage's constants are finite: they come from the source)."""
    text = repr(float(v))
    assert text not in ("inf", "-inf", "nan"), text
    return text + "lf"


_CONSTS_END = "// (derived constants)"  # where emit_kernel declares them
# Spec ids of derived constants start here (a region's own constants take 0 .. n-1).
DERIVED_SPEC_BASE = 1000


@attrs.define
class _Derived:
    """Integer expressions of constants alone that divide (`(C + NS - 1) / NS`, `h / (NQ /
    NK)`'s `NQ / NK`), each a specialization constant of its own: the runtime computes its
    value (manifest `derived`), and the driver sees a plain constant instead of a
    specialization-constant expression it may or may not fold.  On the H200 this changed no
    timing we measured (attention_split: 13.5 us either way); the decode layer's figures in
    docs/BENCHMARKS.md are with it."""

    names: dict[str, str] = attrs.Factory(dict)  # printed expression -> d_<i>
    exprs: list[ir.Expr] = attrs.Factory(list)

    def name(self, text: str, e: ir.Expr) -> str:
        if text not in self.names:
            self.names[text] = f"d_{len(self.exprs)}"
            self.exprs.append(e)
        return self.names[text]


# the derived constants of the kernel being emitted (None outside emit_kernel)
_DERIVED: contextvars.ContextVar[_Derived | None] = contextvars.ContextVar(
    "fusec_derived", default=None
)


def derivable(e: kir.KExpr) -> bool:
    """An integer expression of (compile-time) constants and literals with a division or a
    remainder in it."""
    nodes = kir.kwalk(e)
    return (
        all(
            isinstance(x, ir.Lit | ir.BinOp) or (isinstance(x, ir.ConstRef) and not x.const.runtime)
            for x in nodes
        )
        and all(x.dtype.is_int for x in nodes if isinstance(x, ir.BinOp))
        and any(isinstance(x, ir.ConstRef) for x in nodes)
        and any(isinstance(x, ir.BinOp) and x.op in ("/", "%") for x in nodes)
    )


def spec_constant_only(e: kir.KExpr) -> bool:
    """An expression of literals and specialization constants alone (with at least one of
    those): GLSL folds it into a specialization-constant expression."""
    nodes = kir.kwalk(e)
    return all(
        isinstance(x, ir.Lit | ir.BinOp | ir.Neg | ir.Call)
        or (isinstance(x, ir.ConstRef) and not x.const.runtime)
        for x in nodes
    ) and any(isinstance(x, ir.ConstRef) for x in nodes)


@attrs.define
class _Printer:
    """Prints expressions; `env` maps index variables to GLSL uint expressions."""

    env: dict[ir.IndexVar, str]
    reduce_names: dict[int, str] = attrs.Factory(dict)  # id(Reduce node) -> local holding it
    overrides: dict[int, str] = attrs.Factory(dict)  # id(Load node) -> an already loaded value
    tile: ir.Tile | None = None
    slot_values: dict[str, int] = attrs.Factory(dict)  # slot index name -> its value here

    def expr(self, e: kir.KExpr) -> str:
        """Print `e` in its own dtype (uint for integers, float otherwise)."""
        if id(e) in self.overrides:
            return self.overrides[id(e)]
        match e:
            case ir.Lit(v, DType.F64):
                return double_literal(float(v))
            case ir.Lit(v, dtype):
                return f"{int(v)}u" if dtype.is_int else float_literal(float(v))
            case ir.ConstRef(c):
                return f"c_{c.name}"
            case ir.IndexRef(var):
                return self.env[var]
            case ir.Load(buf, idx) if buf.dtype == DType.Q8_0X:
                return f"aq_{buffer_id(buf)}({self.flat(buf.shape, idx)})"
            case ir.Load(buf, idx) if buf.dtype.is_quantized:
                flat = self.flat(buf.shape, idx)
                n = buffer_id(buf)
                if buf.dtype == DType.Q4_K:
                    return f"(quant_{n}({flat}) * scale_{n}({flat}) - min_{n}({flat}))"
                return f"(quant_{n}({flat}) * scale_{n}({flat}))"
            case ir.Load(buf, idx):
                text = f"b_{buffer_id(buf)}[{self.flat(buf.shape, idx)}]"
                if buf.dtype == DType.F16:
                    return f"float({text})"
                if buf.dtype == DType.I32:
                    return f"uint({text})"
                return text
            case kir.SharedLoad(arr, idx) if arr.stored is not None:
                return f"sq_{shared_id(arr.name)}({self.expr(idx)})"
            case kir.SharedLoad(arr, idx):
                return f"s_{shared_id(arr.name)}[{self.expr(idx)}]"
            case kir.LocalRef(name):
                return f"v_{name}"
            case kir.WorkgroupIndex():
                return "gl_WorkGroupID.x"
            case kir.SliceBase(rows):
                return f"(gl_WorkGroupID.x * gl_NumSubgroups * {rows}u)"
            case kir.TileRef(var, _):
                return f"v_{var}[{self.slot_of(e)}]"
            case ir.Call(fn, args, DType.F64):
                form = _F64_FN[fn]
                if form.startswith("fn_"):
                    self.call(form[3 : form.index("(")])
                return form.format(*(self.as_double(a) for a in args))
            case ir.Call(fn, (arg,), _) if fn in ("sin", "cos") and arg.dtype == DType.F64:
                self.call("angle64")
                return f"{fn}(fn_angle64({self.expr(arg)}))"
            case ir.Call(fn, args, _):
                if fn in _FUNCTION_TEXT:
                    self.call(fn)
                return _UNARY_FN[fn].format(*(self.as_float(a) for a in args))
            case ir.BinOp(op, lhs, rhs, DType.F64):
                a, b = self.as_double(lhs), self.as_double(rhs)
                if op in ("<", "<=", ">", ">=", "==", "!="):
                    return f"((({a}) {op} ({b})) ? 1.0lf : 0.0lf)"
                return f"({a} {op} {b})"
            case ir.BinOp(op, lhs, rhs, dtype):
                if op in ("<", "<=", ">", ">=", "==", "!="):
                    both_int = lhs.dtype.is_int and rhs.dtype.is_int
                    a = self.expr(lhs) if both_int else self.as_float(lhs)
                    b = self.expr(rhs) if both_int else self.as_float(rhs)
                    return f"((({a}) {op} ({b})) ? 1.0 : 0.0)"
                if dtype.is_int:
                    text = f"({self.expr(lhs)} {op} {self.expr(rhs)})"
                    derived = _DERIVED.get()
                    if derived is not None and derivable(e):
                        return derived.name(text, e)
                    return text
                return f"({self.as_float(lhs)} {op} {self.as_float(rhs)})"
            case ir.Neg(v):
                return f"(-{self.expr(v)})"
            case ir.Reduce():
                return self.reduce_names[id(e)]
        raise AssertionError(e)

    def slot_of(self, ref: kir.TileRef) -> int:
        """The slot holding a tile value at `ref`'s coordinates (0 without slot indices)."""
        tile = self.tile
        if tile is None or not tile.slot_strides:
            return 0
        slot = 0
        for dim, stride in zip(tile.dims, tile.slot_strides, strict=True):
            if stride:
                slot += self.slot_values[dim.name] * stride
        return slot

    def call(self, fn: str) -> None:
        """Note that the kernel calls the generator-written function `fn` (and those it calls)."""
        called = _CALLED.get()
        if called is not None:
            called.update((fn, *_FUNCTION_NEEDS.get(fn, ())))

    def as_double(self, e: kir.KExpr) -> str:
        """`e` as a GLSL double (exact for integers, f32 and f16 values)."""
        text = self.expr(e)
        if e.dtype == DType.F64:
            return text
        if isinstance(e, ir.Lit):
            return double_literal(float(e.value))
        if e.dtype == DType.I32:
            return f"double(int({text}))"
        return f"double({text})"

    def as_float(self, e: kir.KExpr) -> str:
        text = self.expr(e)
        if e.dtype == DType.F64:
            return f"float({text})"
        if e.dtype.is_int:
            if isinstance(e, ir.Lit):
                return float_literal(float(e.value))
            if e.dtype == DType.I32:  # an i32 element, read as uint: int() gives back its sign
                return f"float(int({text}))"
            return f"float({text})"
        return text

    def flat(self, shape: tuple[ir.Expr, ...], idx: tuple[kir.KExpr, ...]) -> str:
        """Row-major flat index."""
        text = self.expr(idx[0])
        for dim, i in zip(shape[1:], idx[1:], strict=True):
            text = f"({text} * {self.expr(dim)} + {self.expr(i)})"
        return text


class _Emitter:
    def __init__(self, kernel: kir.Kernel, line_directives: bool) -> None:
        self.k = kernel
        self.lines: list[str] = []
        self.line_directives = line_directives
        self.directive: str | None = None
        self.n_red = 0
        self.views: set[tuple[str, int]] = set()  # (buffer, 32-bit words) aliased wide views
        self.sub32: set[str] = set()  # q4_K buffers read a sub-block of 32 at a time
        self.tile_coords: dict[str, str] = {}
        self.user_vars = user_index_vars(kernel.region)

    def ivar(self, var: ir.IndexVar) -> str:
        """An index variable's GLSL name, `i_<name>`: a user's index with a `_` in its name is
        mangled, as a flattened index (`i_t_src_dst`) could equal it."""
        if var in self.user_vars and "_" in var.name:
            return f"i_{_mangled(var.name)}"
        return f"i_{var.name}"

    def out(self, text: str, indent: int = 1) -> None:
        if self.directive is not None:
            # before every line: a compiler error anywhere in the phase maps to its stage
            self.lines.append(self.directive)
        self.lines.append("    " * indent + text)

    def line(self, phase: kir.Phase) -> None:
        if self.line_directives:
            line, _ = phase.span.line_col()
            self.directive = f'#line {line} "{phase.span.path}"'

    # --- header ---
    def header(self) -> None:
        k = self.k
        self.lines += [
            "#version 450",
            "#extension GL_KHR_shader_subgroup_basic : require",
            "#extension GL_KHR_shader_subgroup_arithmetic : require",
            "#extension GL_KHR_shader_subgroup_shuffle : require",
            "#extension GL_GOOGLE_cpp_style_line_directive : require",
        ]
        self.lines.append("#extension GL_EXT_control_flow_attributes : require")
        if k.counters:
            # the arrival's release and acquire (kir.Arrive) are written in the Vulkan memory
            # model: explicit scopes and semantics (GL_KHR_memory_scope_semantics)
            self.lines.append("#extension GL_KHR_memory_scope_semantics : require")
            self.lines.append("#pragma use_vulkan_memory_model")
        if k.atomics:
            self.lines.append("#extension GL_EXT_shader_atomic_float : require")
        if k.uses_f16:
            self.lines += [
                "#extension GL_EXT_shader_16bit_storage : require",
                "#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require",
            ]
        if k.uses_int_dot:
            self.lines.append("#extension GL_EXT_spirv_intrinsics : require")
        self.lines.append(f"// kernel {k.name}: stages {', '.join(k.stages)}")
        self.lines.append(f"layout(local_size_x = {k.workgroup_size}) in;")
        for c in k.region.consts:
            if c.runtime:
                continue  # read from the parameter buffer, below
            if c.dtype.is_int:
                self.lines.append(
                    f"layout(constant_id = {c.spec_id}) const uint c_{c.name} = {int(c.default)}u;"
                )
            else:
                self.lines.append(
                    f"layout(constant_id = {c.spec_id}) const float c_{c.name} = "
                    f"{float_literal(float(c.default))};"
                )
        self.lines.append(_CONSTS_END)
        scratch = {b for p in k.phases if isinstance(p, kir.Arrive) for b in p.scratch}
        for b in k.bindings:
            qual = "" if b.reads and b.writes else ("readonly " if b.reads else "writeonly ")
            if b.buffer in scratch:
                qual = "coherent " + qual  # read by the last workgroup (kir.Arrive)
            n = buffer_id(b.buffer)
            self.lines.append(
                f"layout(set = 0, binding = {b.binding}, std430) {qual}buffer B_{n} "
                f"{{ {_GLSL_TYPE[b.buffer.dtype]} b_{n}[]; }};"
            )
        if any(b.buffer.name == ir.PARAMS_BUFFER for b in k.bindings):
            for c in k.region.consts:
                if c.runtime:
                    self.lines.append(f"#define c_{c.name} b_{ir.PARAMS_BUFFER}[{c.spec_id}]")
        if k.uses_int_dot:
            self.lines.append(_INT_DOT)
        for b in k.bindings:
            if b.buffer.dtype == DType.Q8_0X and b.reads:
                self.lines.append(_ACT_BLOCKS.format(n=buffer_id(b.buffer)))
            if b.buffer.dtype.is_quantized:
                n = buffer_id(b.buffer)
                if k.uses_int_dot and b.buffer.dtype in _BLOCK_DOT:
                    self.lines.append(_BLOCK_DOT[b.buffer.dtype].format(n=n))
                self.lines.append(
                    f"uint byte_{n}(uint o) {{ return (b_{n}[o >> 2u] >> "
                    "((o & 3u) * 8u)) & 0xffu; }"
                )
                self.lines.append(_DEQUANT[b.buffer.dtype].format(n=n))
                self.lines.append(_QUANT8_BYTES.format(n=n))
                self.lines.append(_QUANT8[b.buffer.dtype].format(n=n))
                if k.uses_int_dot and b.buffer.dtype in _BLOCK_DOT_AFTER:
                    self.lines.append(_BLOCK_DOT_AFTER[b.buffer.dtype].format(n=n))
        printer = _Printer({})
        for arr in k.shared:
            if arr.stored is None:
                size = printer.expr(arr.size)
                self.lines.append(
                    f"shared {_GLSL_TYPE[arr.dtype]} s_{shared_id(arr.name)}[{size}];"
                )
                continue
            blocks = printer.expr(arr.blocks)
            self.lines.append(_SHARED_Q8.format(n=shared_id(arr.name), blocks=blocks))
        if k.reduction_scratch:
            self.lines.append(f"shared float s_reduce[{k.workgroup_size}];")
        if k.exchange_scratch:
            self.lines.append(f"shared float s_exchange[{k.workgroup_size}];")
        if k.counters:
            self.lines.append("shared uint s_last;  // this workgroup arrived last (kir.Arrive)")

    # --- reductions inside a phase: computed into locals before the phase's expression ---
    def reductions(
        self,
        value: kir.KExpr,
        printer: _Printer,
        indent: int,
        lane_start: str,
        lane_step: str,
        serial: bool = False,
    ) -> None:
        """Each reduction of `value` into a local; `serial`: every one as a loop of this lane
        alone, whatever its scope (the lanes hold different rows)."""
        for r in kir.reduces_in(value):
            scope = Scope.LANE if serial else r.scope
            name = f"r{self.n_red}"
            self.n_red += 1
            var = self.ivar(r.var)
            body_printer = _Printer({**printer.env, r.var: var}, printer.reduce_names)
            body = body_printer.as_float(r.body)
            ext = printer.expr(r.var.extent)
            if r.op in ("argmax", "argmin"):
                self.select_loop(name, r, var, body, ext, scope, indent, lane_start, lane_step)
                printer.reduce_names[id(r)] = f"{name}_i"
                continue
            self.out(f"float {name} = {_INIT[r.op]};", indent)
            if scope == Scope.LANE:
                hint = serial_loop_hint(r.var.extent)
                self.out(f"{hint}for (uint {var} = 0u; {var} < {ext}; ++{var}) {{", indent)
            elif scope == Scope.SUBGROUP:
                self.out(
                    f"for (uint {var} = gl_SubgroupInvocationID; {var} < {ext}; "
                    f"{var} += gl_SubgroupSize) {{",
                    indent,
                )
            else:
                self.out(
                    f"{LOOP_HINT}for (uint {var} = {lane_start}; {var} < {ext}; "
                    f"{var} += {lane_step}) {{",
                    indent,
                )
            self.out(f"{name} = {combine(r.op, name, body)};", indent + 1)
            self.out("}", indent)
            if scope in (Scope.SUBGROUP, Scope.WORKGROUP):
                self.out(f"{name} = {_SUBGROUP_OP[r.op]}({name});", indent)
            if scope == Scope.WORKGROUP:
                self.out(f"if (subgroupElect()) {{ s_reduce[gl_SubgroupID] = {name}; }}", indent)
                self.out("barrier();", indent)
                self.out(f"{name} = s_reduce[0];", indent)
                self.out("for (uint s = 1u; s < gl_NumSubgroups; ++s) {", indent)
                self.out(f"{name} = {combine(r.op, name, 's_reduce[s]')};", indent + 1)
                self.out("}", indent)
                self.out("barrier();  // s_reduce is reused by the next reduction", indent)
            printer.reduce_names[id(r)] = name

    def select_loop(
        self,
        name: str,
        r: ir.Reduce,
        var: str,
        body: str,
        ext: str,
        scope: Scope,
        indent: int,
        lane_start: str,
        lane_step: str,
        after: str | None = None,
    ) -> None:
        """`name_v`, `name_i`: the best value of `body` over `var` and its index, for argmax
        (the largest; `argmin` the smallest, `topk` the largest), ties to the lowest index.
        `after`: a topk round, which takes only values after the previous round's
        (`after`_v, `after`_i) in that order.  Every lane of the scope ends with the same."""
        big = r.op != "argmin"
        better = ">" if big else "<"
        init = "uintBitsToFloat(0xff800000u)" if big else "uintBitsToFloat(0x7f800000u)"
        self.out(f"float {name}_v = {init};", indent)
        self.out(f"uint {name}_i = 0xffffffffu;", indent)
        if scope == Scope.LANE:
            hint = serial_loop_hint(r.var.extent)
            self.out(f"{hint}for (uint {var} = 0u; {var} < {ext}; ++{var}) {{", indent)
        elif scope == Scope.SUBGROUP:
            self.out(
                f"for (uint {var} = gl_SubgroupInvocationID; {var} < {ext}; "
                f"{var} += gl_SubgroupSize) {{",
                indent,
            )
        else:
            self.out(
                f"for (uint {var} = {lane_start}; {var} < {ext}; {var} += {lane_step}) {{",
                indent,
            )
        self.out(f"float {name}_x = {body};", indent + 1)
        # a lane's indices grow along its loop: the first of equal values is kept
        cond = f"{name}_x {better} {name}_v || ({name}_x == {name}_v && {var} < {name}_i)"
        if after is not None:
            eligible = (
                f"{after}_first || {name}_x < {after}_v || "
                f"({name}_x == {after}_v && {var} > {after}_i)"
            )
            cond = f"({eligible}) && ({cond})"
        self.out(f"if ({cond}) {{ {name}_v = {name}_x; {name}_i = {var}; }}", indent + 1)
        self.out("}", indent)
        if scope == Scope.LANE:
            return
        # across lanes: the best value, then the lowest index among the lanes that hold it
        op = "subgroupMax" if big else "subgroupMin"
        self.out(f"{{ float {name}_m = {op}({name}_v);", indent)
        self.out(
            f"  {name}_i = subgroupMin({name}_v == {name}_m ? {name}_i : 0xffffffffu);", indent
        )
        self.out(f"  {name}_v = {name}_m; }}", indent)
        if scope == Scope.WORKGROUP:
            scratch = f"s_{shared_id(kir.INDEX_SCRATCH)}"
            self.out("if (subgroupElect()) {", indent)
            self.out(f"s_reduce[gl_SubgroupID] = {name}_v;", indent + 1)
            self.out(f"{scratch}[gl_SubgroupID] = {name}_i;", indent + 1)
            self.out("}", indent)
            self.out("barrier();", indent)
            self.out("for (uint s = 0u; s < gl_NumSubgroups; ++s) {", indent)
            self.out(
                f"if (s_reduce[s] {better} {name}_v || (s_reduce[s] == {name}_v && "
                f"{scratch}[s] < {name}_i)) {{ {name}_v = s_reduce[s]; "
                f"{name}_i = {scratch}[s]; }}",
                indent + 1,
            )
            self.out("}", indent)
            self.out("barrier();  // s_reduce is reused by the next reduction", indent)

    def select_rows(self, buf: ir.Buffer, row: ir.IndexVar, r: ir.Reduce) -> None:
        """Subgroup s of workgroup w takes rows w * subgroups + s, then a grid's worth of
        subgroups further; its lanes find the row's argmax together, and one stores it."""
        rv = self.ivar(row)
        pr = _Printer({row: rv})
        var = self.ivar(r.var)
        body = _Printer({row: rv, r.var: var}).as_float(r.body)
        self.out(
            f"for (uint {rv} = gl_WorkGroupID.x * gl_NumSubgroups + gl_SubgroupID; "
            f"{rv} < {pr.expr(row.extent)}; {rv} += gl_NumWorkGroups.x * gl_NumSubgroups) {{"
        )
        name = f"r{self.n_red}"
        self.n_red += 1
        self.select_loop(name, r, var, body, pr.expr(r.var.extent), Scope.SUBGROUP, 2, "", "")
        self.out("if (subgroupElect()) {", 2)
        self.out(f"b_{buffer_id(buf)}[{rv}] = {self.convert(buf, r, pr_with(pr, r, name), 3)};", 3)
        self.out("}", 2)
        self.out("}")

    def topk_phase(self, p: kir.TopKPhase) -> None:
        """k rounds of an argmax, each over the values after the previous round's pick in
        (value descending, index ascending) order: the k largest, ties to the lowest index."""
        r = p.reduce
        wg = self.k.workgroup_size
        n = p.name
        var = self.ivar(r.var)
        pr = _Printer({})
        body = _Printer({r.var: var}).as_float(r.body)
        ext = pr.expr(r.var.extent)
        self.out(f"float {n}_p_v = 0.0;")
        self.out(f"uint {n}_p_i = 0u;")
        assert r.k is not None
        self.out(f"for (uint {n}_r = 0u; {n}_r < {pr.expr(r.k)}; ++{n}_r) {{")
        after = f"{n}_p"
        # the first round takes every value
        self.out(f"bool {n}_p_first = {n}_r == 0u;", 2)
        self.select_loop(
            f"{n}_b", r, var, body, ext, r.scope, 2, "gl_LocalInvocationIndex", f"{wg}u", after
        )
        self.out("if (gl_LocalInvocationIndex == 0u) {", 2)
        self.out(f"s_{shared_id(p.values.name)}[{n}_r] = {n}_b_v;", 3)
        self.out(f"s_{shared_id(p.indices.name)}[{n}_r] = {n}_b_i;", 3)
        self.out("}", 2)
        self.out(f"{n}_p_v = {n}_b_v;", 2)
        self.out(f"{n}_p_i = {n}_b_i;", 2)
        self.out("}")
        self.out("barrier();")

    # --- phases ---
    def phase(self, p: kir.Phase) -> None:
        wg = self.k.workgroup_size
        grid_step = f"gl_NumWorkGroups.x * {wg}u"
        self.line(p)
        match p:
            case kir.ScalarPhase(name, value) if value.dtype.is_int:
                pr = _Printer({})
                self.reductions(value, pr, 1, "gl_LocalInvocationIndex", f"{wg}u")
                self.out(f"uint v_{name} = {pr.expr(value)};")
            case kir.ScalarPhase(name, value):
                pr = _Printer({})
                self.reductions(value, pr, 1, "gl_LocalInvocationIndex", f"{wg}u")
                self.out(f"float v_{name} = {pr.as_float(value)};")
            case kir.TopKPhase():
                self.topk_phase(p)
            case kir.SelectRows(buf, row, red):
                self.select_rows(buf, row, red)
            case kir.FillShared(arr, var, value):
                iv = self.ivar(var)
                pr = _Printer({var: iv})
                ext = pr.expr(var.extent)
                self.out(
                    f"{LOOP_HINT}for (uint {iv} = gl_LocalInvocationIndex; "
                    f"{iv} < {ext}; {iv} += {wg}u) {{"
                )
                self.reductions(value, pr, 2, "", "")
                self.out(f"s_{shared_id(arr.name)}[{iv}] = {pr.as_float(value)};", 2)
                self.out("}")
                self.out("barrier();")
            case kir.StoreScalar(buf, value):
                pr = _Printer({})
                self.reductions(value, pr, 1, "gl_LocalInvocationIndex", f"{wg}u")
                first = "gl_LocalInvocationIndex" if p.local else "gl_GlobalInvocationID.x"
                self.out(f"if ({first} == 0u) {{")
                self.out(f"b_{buffer_id(buf)}[0] = {self.convert(buf, value, pr, 2)};", 2)
                self.out("}")
            case kir.StoreMap(buf, var, value):
                iv = self.ivar(var)
                pr = _Printer({var: iv})
                ext = pr.expr(var.extent)
                start, step = (
                    ("gl_LocalInvocationIndex", f"{wg}u")
                    if p.local
                    else ("gl_GlobalInvocationID.x", grid_step)
                )
                self.out(f"for (uint {iv} = {start}; {iv} < {ext}; {iv} += {step}) {{")
                self.reductions(value, pr, 2, "", "")
                index = pr.expr(p.index) if p.index is not None else iv
                if p.mask is not None:
                    # a masked write: the lanes the mask rejects store nothing
                    self.out(f"if ({pr.as_float(p.mask)} != 0.0) {{", 2)
                self.out(
                    f"b_{buffer_id(buf)}[{index}] = {self.convert(buf, value, pr, 2)};",
                    2 if p.mask is None else 3,
                )
                if p.mask is not None:
                    self.out("}", 2)
                self.out("}")
            case kir.QuantizeBlocks():
                self.quantize_blocks(p)
            case kir.TilePhase():
                self.tile_phase(p)
            case kir.SplitK():
                self.split_k(p)
            case kir.Contract():
                if p.layout.row_unit in (Scope.SUBGROUP, Scope.WORKGROUP):
                    self.contract_subgroup(p)
                else:
                    self.contract_lane(p, grid_step)
            case kir.Arrive():
                self.arrive(p)

    def arrive(self, p: kir.Arrive) -> None:
        """The last workgroup to arrive goes on; the others end.  In the Vulkan memory model
        (Vulkan spec, appendix "Memory Model"): the scratch buffers are `coherent` (their
        accesses non-private, made available and visible at queue-family scope); the control
        barrier's release orders every lane's scratch stores before lane 0's counter add, whose
        release the last workgroup's acquiring add synchronizes with (the adds form one release
        sequence), and the second barrier carries that acquire to the last workgroup's lanes.
        The last workgroup sets the counter back to 0; the next dispatch comes after a pipeline
        barrier (the counter is written), so it starts from 0."""
        c = f"b_{buffer_id(p.counter)}"
        sem = "gl_StorageSemanticsBuffer | gl_StorageSemanticsShared, gl_SemanticsAcquireRelease"
        names = ", ".join(b.name for b in p.scratch)
        who = "of its group " if p.group is not None else ""
        self.out(f"// every workgroup has stored its share of {names}: the last {who}goes on")
        self.out(f"controlBarrier(gl_ScopeWorkgroup, gl_ScopeQueueFamily, {sem});")
        self.out("if (gl_LocalInvocationIndex == 0u) {")
        slot, members = "0", "gl_NumWorkGroups.x"
        if p.group is not None:
            assert p.group_size is not None
            pr = _Printer({})
            size = pr.expr(p.group_size)
            # groups of `size` consecutive workgroups; the last group may be shorter
            self.out(f"uint group = {pr.expr(p.group)};", 2)
            slot, members = "group", f"min({size}, gl_NumWorkGroups.x - group * {size})"
        self.out(
            f"uint arrived = atomicAdd({c}[{slot}], 1u, gl_ScopeQueueFamily, "
            "gl_StorageSemanticsBuffer, gl_SemanticsAcquireRelease);",
            2,
        )
        self.out(f"s_last = arrived == {members} - 1u ? 1u : 0u;", 2)
        self.out("if (s_last == 1u) {", 2)
        self.out(
            f"atomicStore({c}[{slot}], 0u, gl_ScopeQueueFamily, gl_StorageSemanticsBuffer, "
            "gl_SemanticsRelaxed);",
            3,
        )
        self.out("}", 2)
        self.out("}")
        self.out(f"controlBarrier(gl_ScopeWorkgroup, gl_ScopeQueueFamily, {sem});")
        self.out("if (s_last == 0u) {")
        self.out("return;", 2)
        self.out("}")

    def quantize_blocks(self, p: kir.QuantizeBlocks) -> None:
        """Four lanes per block, each with two runs of 4 consecutive elements (quant words i and
        4 + i), so the loads are 16-byte vectors and the lanes of a subgroup read neighbouring
        blocks.  As gguf's q8_0 quantization computes it: d = max |v| / 127 (a maximum over the
        4 lanes), q = v * (1 / d) rounded half away from zero; the stored scale is d rounded to
        f16.  Shared: every workgroup quantizes the whole index; global (an unfused chain): the
        grid covers the blocks and writes the dequantized values."""
        wg = self.k.workgroup_size
        pr = _Printer({})
        ext = pr.expr(p.var.extent)
        blocks = pr.expr(kir.block_count(p.var.extent))
        shared = isinstance(p.target, kir.SharedArray)
        per_wg = wg // 4
        if shared:
            self.out(f"for (uint qb0 = 0u; qb0 < {blocks}; qb0 += {per_wg}u) {{")
        else:
            self.out(
                f"for (uint qb0 = gl_WorkGroupID.x * {per_wg}u; qb0 < {blocks}; "
                f"qb0 += gl_NumWorkGroups.x * {per_wg}u) {{"
            )
        self.out(
            "uint qb = qb0 + gl_LocalInvocationIndex / 4u, qi = gl_LocalInvocationIndex & 3u;", 2
        )
        self.out("uint qk0 = qb * 32u + qi * 4u, qk1 = qk0 + 16u;  // this lane's two runs", 2)
        self.out("float qv[8];", 2)
        wide = quant_wide_loads(p)
        if wide:
            cond = " && ".join(
                sorted({f"(({pr.expr(ld.buffer.shape[-1])}) % 4u == 0u)" for ld in wide})
            )
            self.out(f"if (({ext}) % 4u == 0u && {cond}) {{", 2)
            self.quant_values(p, ext, wide, 3)
            self.out("} else {", 2)
            self.quant_values(p, ext, [], 3)
            self.out("}", 2)
        else:
            self.quant_values(p, ext, [], 2)
        self.out("float amax = 0.0;", 2)
        self.out(
            f"{LOOP_HINT}for (uint j = 0u; j < 8u; ++j) {{ amax = max(amax, abs(qv[j])); }}", 2
        )
        self.out("amax = max(amax, subgroupShuffleXor(amax, 1u));", 2)
        self.out("amax = max(amax, subgroupShuffleXor(amax, 2u));", 2)
        self.out("float qd = amax / 127.0;", 2)
        self.out("float qid = (qd != 0.0) ? 1.0 / qd : 0.0;", 2)
        # the scale as stored, rounded to f16 (nearest even) with integer operations: compilers
        # fold unpackHalf2x16(packHalf2x16(d)) into d (seen on lavapipe)
        self.out("uint qu = floatBitsToUint(qd);", 2)
        self.out(
            "float qs = (qd < 6.103515625e-05) ? roundEven(qd * 16777216.0) / 16777216.0"
            " : uintBitsToFloat((qu + 0xfffu + ((qu >> 13u) & 1u)) & 0xffffe000u);",
            2,
        )
        self.out("int qw0 = 0, qw1 = 0, qsum = 0;", 2)
        for j in range(8):
            self.out("{", 2)
            self.out(f"float t = qv[{j}] * qid, a = abs(t), f = floor(a);", 3)
            self.out("int q = int(sign(t) * (f + floor(2.0 * (a - f))));", 3)
            self.out("qsum += q;", 3)
            self.out(f"qw{j // 4} |= (q & 0xff) << {8 * (j % 4)};", 3)
            self.out("}", 2)
        n = storage_id(p.target)
        self.out("qsum += subgroupShuffleXor(qsum, 1u);", 2)
        self.out("qsum += subgroupShuffleXor(qsum, 2u);", 2)
        self.out(f"if (qb < {blocks}) {{", 2)
        if shared:
            self.out(f"s_{n}_q[qb * 2u][qi] = qw0;", 3)
            self.out(f"s_{n}_q[qb * 2u + 1u][qi] = qw1;", 3)
            self.out(f"if (qi == 0u) {{ s_{n}_d[qb] = ivec2(floatBitsToInt(qs), qsum); }}", 3)
        else:  # DType.Q8_0X: quant words 0..7, scale, sum
            self.out(f"b_{n}[qb * 12u + qi] = uint(qw0);", 3)
            self.out(f"b_{n}[qb * 12u + 4u + qi] = uint(qw1);", 3)
            self.out("if (qi == 0u) {", 3)
            self.out(f"b_{n}[qb * 12u + 8u] = floatBitsToUint(qs);", 4)
            self.out(f"b_{n}[qb * 12u + 9u] = uint(qsum);", 4)
            self.out("}", 3)
        self.out("}", 2)
        self.out("}")
        if shared:
            self.out("barrier();")

    def quant_values(
        self, p: kir.QuantizeBlocks, ext: str, wide: list[ir.Load], indent: int
    ) -> None:
        """qv[0..7]: the lane's two runs of 4 elements; zeros past the end (padding)."""
        var = self.ivar(p.var)
        for g in range(2):
            k = f"qk{g}"
            if wide:  # the run is whole or wholly past the end (extent % 4 == 0)
                self.out(f"if ({k} < {ext}) {{", indent)
                values = {}
                for n, load in enumerate(wide):
                    lp = _Printer({p.var: k})
                    flat = lp.flat(load.buffer.shape, load.indices)
                    values[id(load)] = self.wide_load(
                        load.buffer, flat, f"qx{g}_{n}", 4, indent + 1
                    )
                for e in range(4):
                    self.out("{", indent + 1)
                    self.out(f"uint {var} = {k} + {e}u;", indent + 2)
                    ep = _Printer({p.var: var})
                    for load in wide:
                        ep.overrides[id(load)] = values[id(load)][e]
                    self.reductions(p.value, ep, indent + 2, "", "")
                    self.out(f"qv[{4 * g + e}] = {ep.as_float(p.value)};", indent + 2)
                    self.out("}", indent + 1)
                self.out("} else {", indent)
                for e in range(4):
                    self.out(f"qv[{4 * g + e}] = 0.0;", indent + 1)
                self.out("}", indent)
                continue
            for e in range(4):
                self.out("{", indent)
                self.out(f"uint {var} = {k} + {e}u;", indent + 1)
                self.out(f"qv[{4 * g + e}] = 0.0;", indent + 1)
                self.out(f"if ({var} < {ext}) {{", indent + 1)
                ep = _Printer({p.var: var})
                self.reductions(p.value, ep, indent + 2, "", "")
                self.out(f"qv[{4 * g + e}] = {ep.as_float(p.value)};", indent + 2)
                self.out("}", indent + 1)
                self.out("}", indent)

    # --- tiles ---
    def tile_phase(self, p: kir.TilePhase) -> None:
        tile, g = p.tile, p.tile.lanes
        per = _Printer({}).expr(tile.per.extent)
        self.out("uint li = gl_LocalInvocationIndex;")
        self.out(f"uint lane = li % {g}u;  // lane within the tile's group")
        self.out(f"uint grp = gl_GlobalInvocationID.x / {g}u;")
        self.out(
            f"bool live = grp < {per};  // every lane joins every exchange; only live groups store"
        )
        self.out(f"uint tt = min(grp, {per} - 1u);")
        coords = {tile.per.name: "tt"}
        for v, stride in zip(tile.dims, tile.strides, strict=True):
            if stride:
                self.out(f"uint {self.ivar(v)} = (lane / {stride}u) % {tile.extent_of(v)}u;")
                coords[v.name] = self.ivar(v)
        self.tile_coords = coords
        for var in sorted(kir.tile_vars(p.body)):
            self.out(f"float v_{var}[{tile.slots}];  // one register per slot")
        self.tile_body(p, p.body, 1)

    def slot_coords(self, tile: ir.Tile, slot: int) -> dict[str, int]:
        """Values of the slot indices held in `slot`."""
        out = {}
        for v, stride in zip(tile.dims, tile.slot_strides or (0,) * len(tile.dims), strict=True):
            if stride:
                out[v.name] = (slot // stride) % tile.extent_of(v)
        return out

    def tile_printer(self, tile: ir.Tile, value: kir.KExpr, slot: int) -> _Printer:
        slot_values = self.slot_coords(tile, slot)
        env: dict[ir.IndexVar, str] = {}
        for x in kir.kwalk(value):
            var = x.var if isinstance(x, ir.IndexRef | ir.Reduce) else None
            if var is None:
                continue
            if var.name in slot_values:
                env[var] = f"{slot_values[var.name]}u"
            elif var.name in self.tile_coords:
                env[var] = self.tile_coords[var.name]
        return _Printer(env, tile=tile, slot_values=slot_values)

    def tile_body(self, p: kir.TilePhase, body: tuple[kir.TileStmt, ...], indent: int) -> None:
        tile = p.tile
        for st in body:
            match st:
                case kir.TileRepeat(count, inner):
                    n = self.n_red
                    self.n_red += 1
                    cnt = _Printer({}).expr(count)
                    hint = serial_loop_hint(count)
                    self.out(f"{hint}for (uint it{n} = 0u; it{n} < {cnt}; ++it{n}) {{", indent)
                    self.tile_body(p, inner, indent + 1)
                    self.out("}", indent)
                case kir.TileAssign(var, value):
                    # every slot first, from the values before this statement
                    results = []
                    for slot in range(tile.slots):
                        pr = self.tile_printer(tile, value, slot)
                        self.tile_exchanges(p, value, pr, indent)
                        name = f"n{self.n_red}"
                        self.n_red += 1
                        self.out(f"float {name} = {pr.as_float(value)};", indent)
                        results.append(name)
                    for slot, name in enumerate(results):
                        self.out(f"v_{var}[{slot}] = {name};", indent)
                case kir.TileStore(buf, indices, value):
                    for slot in range(tile.slots):
                        pr = self.tile_printer(tile, value, slot)
                        self.tile_exchanges(p, value, pr, indent)
                        for v in indices:
                            pr.env[v] = (
                                f"{pr.slot_values[v.name]}u"
                                if v.name in pr.slot_values
                                else self.tile_coords[v.name]
                            )
                        flat = pr.flat(buf.shape, tuple(ir.IndexRef(v) for v in indices))
                        self.out(
                            f"if (live) {{ b_{buffer_id(buf)}[{flat}] = "
                            f"{self.convert(buf, value, pr, indent)}; }}",
                            indent,
                        )

    def tile_exchanges(self, p: kir.TilePhase, value: kir.KExpr, pr: _Printer, indent: int) -> None:
        """Reductions over tile indices and explicit shuffles, into locals first: over a lane
        index by exchange between lanes, over a slot index serially within the lane."""
        tile, g = p.tile, p.tile.lanes
        for x in reversed(kir.kwalk(value)):  # innermost first
            if isinstance(x, ir.Reduce) and x.var.name in pr.slot_values:
                name = f"r{self.n_red}"
                self.n_red += 1
                dim = next(v for v in tile.dims if v.name == x.var.name)
                terms = []
                for d in range(tile.extent_of(dim)):
                    sub = _Printer(
                        {**pr.env, x.var: f"{d}u"},
                        pr.reduce_names,
                        pr.overrides,
                        tile,
                        {**pr.slot_values, dim.name: d},
                    )
                    terms.append(sub.as_float(x.body))
                self.out(f"float {name} = {terms[0]};", indent)
                for t in terms[1:]:
                    self.out(f"{name} = {combine(x.op, name, t)};", indent)
                pr.reduce_names[id(x)] = name
            elif isinstance(x, ir.Reduce) and x.var.name in self.tile_coords:
                dim = next(v for v in tile.dims if v.name == x.var.name)
                stride = tile.strides[tile.dims.index(dim)]
                n = tile.extent_of(dim)
                name = f"r{self.n_red}"
                self.n_red += 1
                body = pr.as_float(x.body)
                if p.exchange == "shuffle":
                    self.out(f"float {name} = {body};", indent)
                    m = stride
                    while m < stride * n:
                        other = f"subgroupShuffleXor({name}, {m}u)"
                        self.out(f"{name} = {combine(x.op, name, other)};", indent)
                        m *= 2
                else:
                    self.out(f"s_exchange[li] = {body};", indent)
                    self.out("barrier();", indent)
                    self.out(f"uint {name}_b = li - {self.ivar(dim)} * {stride}u;", indent)
                    self.out(f"float {name} = s_exchange[{name}_b];", indent)
                    for d in range(1, n):
                        other = f"s_exchange[{name}_b + {d * stride}u]"
                        self.out(f"{name} = {combine(x.op, name, other)};", indent)
                    self.out("barrier();", indent)
                pr.reduce_names[id(x)] = name
            elif isinstance(x, ir.Call) and x.fn in ("shuffle_xor", "shuffle", "broadcast"):
                name = f"x{self.n_red}"
                self.n_red += 1
                v = pr.as_float(x.args[0])
                arg = x.args[1]
                assert isinstance(arg, ir.Lit)
                k = int(arg.value)
                if p.exchange == "shuffle":
                    if x.fn == "shuffle_xor":
                        got = f"subgroupShuffleXor({v}, {k}u)"
                    else:
                        got = f"subgroupShuffle({v}, (gl_SubgroupInvocationID & ~{g - 1}u) | {k}u)"
                    self.out(f"float {name} = {got};", indent)
                else:
                    src = f"li ^ {k}u" if x.fn == "shuffle_xor" else f"(li & ~{g - 1}u) | {k}u"
                    self.out(f"s_exchange[li] = {v};", indent)
                    self.out("barrier();", indent)
                    self.out(f"float {name} = s_exchange[{src}];", indent)
                    self.out("barrier();", indent)
                pr.overrides[id(x)] = name

    def split_k(self, p: kir.SplitK) -> None:
        """Each workgroup adds, for every row, the dot product over its slice."""
        wg = self.k.workgroup_size
        rows = next(c.rows for c in self.k.phases if isinstance(c, kir.Contract) and c.slice)
        ext = _Printer({}).expr(p.var.extent)
        row_ext = _Printer({}).expr(p.row.extent)
        self.out(f"uint sb = gl_WorkGroupID.x * gl_NumSubgroups * {rows}u;")
        self.out(f"uint sn = min(gl_NumSubgroups * {rows}u, {ext} - min(sb, {ext}));")
        row = self.ivar(p.row)
        self.out(
            f"for (uint {row} = gl_LocalInvocationIndex; {row} < {row_ext}; {row} += {wg}u) {{"
        )
        self.out("float acc = 0.0;", 2)
        self.out("for (uint j = 0u; j < sn; ++j) {", 2)
        pr = _Printer({p.row: row, p.var: "(sb + j)"})
        self.out(f"acc = acc + {pr.as_float(p.value)};", 3)
        self.out("}", 2)
        self.out(f"atomicAdd(b_{buffer_id(p.buffer)}[{row}], acc);", 2)
        self.out("}")

    def convert(
        self, buf: ir.Buffer | kir.SharedArray, value: kir.KExpr, pr: _Printer, indent: int
    ) -> str:
        """`value` printed for a store into `buf`: converted to float16_t for an f16 buffer.  A
        value of specialization constants alone is converted from a variable, at run time: as a
        constant expression the conversion would be a specialization-constant FConvert to a
        16-bit type, which spirv-opt cannot form ("Cannot form constants of 8- or 16-bit
        types")."""
        if isinstance(buf, ir.Buffer) and buf.dtype.is_int:
            # an index or integer arithmetic (dsl.check): stored as computed, in uint
            text = pr.expr(value)
            return f"int({text})" if buf.dtype == DType.I32 else text
        text = pr.as_float(value)
        if isinstance(buf, kir.SharedArray) or buf.dtype != DType.F16:
            return text
        if spec_constant_only(value):
            name = f"cv{self.n_red}"
            self.n_red += 1
            self.out(f"float {name} = {text};", indent)
            text = name
        return f"float16_t({text})"

    def contract_lane(self, p: kir.Contract, grid_step: str) -> None:
        row = self.ivar(p.row)
        pr = _Printer({p.row: row})
        ext = pr.expr(p.row.extent)
        start, step = (
            ("gl_GlobalInvocationID.x", grid_step)
            if p.index is None
            else ("gl_LocalInvocationIndex", f"{self.k.workgroup_size}u")  # this workgroup alone
        )
        self.out(f"for (uint {row} = {start}; {row} < {ext}; {row} += {step}) {{")
        # rows -> lane: each lane owns its row, so a reduction over the row's index is its own
        # loop; a subgroup operation would combine the lanes' different rows (docs/FUZZING.md)
        self.reductions(p.value, pr, 2, "", "", serial=True)
        value = self.convert(p.buffer, p.value, pr, 2)
        at = pr.expr(p.index) if p.index is not None else row
        self.out(f"b_{storage_id(p.buffer)}[{at}] = {value};", 2)
        self.out("}")

    def contract_subgroup(self, p: kir.Contract) -> None:
        """Rows -> subgroups, `rows` at a time; the reduced index -> lanes x vector.  Rows ->
        workgroup: every lane of the workgroup strides over the same `rows` rows, and the
        subgroups' sums meet in shared memory."""
        rows, vec = p.rows, p.layout.vector
        whole = p.layout.row_unit == Scope.WORKGROUP
        lane, lanes = (
            ("gl_LocalInvocationIndex", f"{self.k.workgroup_size}u")
            if whole
            else ("gl_SubgroupInvocationID", "gl_SubgroupSize")
        )
        row_ext = _Printer({}).expr(p.row.extent)
        reds = kir.reduces_in(p.value)
        if p.slice:  # one block of rows per workgroup, kept in shared memory
            self.out(
                f"for (uint row0 = (gl_WorkGroupID.x * gl_NumSubgroups + gl_SubgroupID) * "
                f"{rows}u; row0 < {row_ext} && row0 < (gl_WorkGroupID.x + 1u) * "
                f"gl_NumSubgroups * {rows}u; row0 += {rows}u * gl_NumSubgroups * "
                "gl_NumWorkGroups.x) {"
            )
        elif p.to_shared or p.index is not None:  # this workgroup computes every row
            self.out(
                f"for (uint row0 = gl_SubgroupID * {rows}u; row0 < {row_ext}; "
                f"row0 += gl_NumSubgroups * {rows}u) {{"
            )
        elif whole:
            self.out(
                f"for (uint row0 = gl_WorkGroupID.x * {rows}u; row0 < {row_ext}; "
                f"row0 += gl_NumWorkGroups.x * {rows}u) {{"
            )
        else:
            self.out(
                f"for (uint row0 = (gl_WorkGroupID.x * gl_NumSubgroups + gl_SubgroupID) * "
                f"{rows}u; row0 < {row_ext}; row0 += gl_NumWorkGroups.x * gl_NumSubgroups * "
                f"{rows}u) {{"
            )
        for r in range(rows):
            # rows past the end compute on a clamped row (no divergence) and are not written
            self.out(f"uint row_{r} = min(row0 + {r}u, {row_ext} - 1u);", 2)
        names: list[list[str]] = []
        for j, red in enumerate(reds):
            names.append([f"acc{j}_{r}" for r in range(rows)])
            for r in range(rows):
                self.out(f"float acc{j}_{r} = {_INIT[red.op]};", 2)
        # one loop per reduced variable; reductions over the same variable share it
        # one loop per extent: reductions over equal extents (gate and up over K) share it
        by_extent: dict[str, list[int]] = {}
        for j, red in enumerate(reds):
            by_extent.setdefault(_Printer({}).expr(red.var.extent), []).append(j)
        terms = kir.int_dot_terms(p)
        for loop, (ext, js) in enumerate(by_extent.items()):
            k = f"k{loop}"
            if terms is not None:
                self.int_dot_loop(p, terms, js, names, k, rows, ext, lane, lanes)
                continue
            self.out(f"uint {k} = {lane} * {vec}u;", 2)
            head = f"for (; {k} + {vec}u <= {ext}; {k} += {lanes} * {vec}u) {{"
            loads = vector_loads(reds, js, vec)
            rows_2d = [ld for ld in loads if len(ld.buffer.shape) > 1]
            if rows_2d and all(ld.buffer.dtype.is_quantized for ld in rows_2d):
                # GGUF rows are whole blocks (32 or 256 elements) and vec divides 32
                # (vector_loads): every row starts aligned and no element is left for a tail loop
                self.out(head, 2)
                self.contract_step(p, reds, js, names, k, rows, vec, 3, guard=None, wide=loads)
                self.out("}", 2)
                continue
            if loads:
                # wide loads need every row to start on a multiple of the vector width; the
                # condition is on specialization constants, so the driver folds the branch
                cond = " && ".join(
                    sorted(
                        {
                            f"(({c}) % {vec}u == 0u)"
                            for c in (
                                _Printer({}).expr(ld.buffer.shape[-1])
                                for ld in loads
                                if len(ld.buffer.shape) > 1
                            )
                        }
                    )
                )
                self.out(f"if ({cond or 'true'}) {{", 2)
                self.unrolled(p, reds, js, names, k, rows, vec, 3, ext, loads, lanes)
                self.out(head, 3)
                self.contract_step(p, reds, js, names, k, rows, vec, 4, guard=None, wide=loads)
                self.out("}", 3)
                self.out("} else {", 2)
                self.out(head, 3)
                self.contract_step(p, reds, js, names, k, rows, vec, 4, guard=None)
                self.out("}", 3)
                self.out("}", 2)
            else:
                self.out(head, 2)
                self.contract_step(p, reds, js, names, k, rows, vec, 3, guard=None)
                self.out("}", 2)
            if vec > 1:
                self.out(f"if ({k} < {ext}) {{", 2)
                self.contract_step(p, reds, js, names, k, rows, vec, 3, guard=ext)
                self.out("}", 2)
        for j, red in enumerate(reds):
            for r in range(rows):
                self.out(f"{names[j][r]} = {_SUBGROUP_OP[red.op]}({names[j][r]});", 2)
        if whole:
            # one reduction at a time through s_reduce: subgroup sums, then lane 0 combines
            for j, red in enumerate(reds):
                self.out("if (subgroupElect()) {", 2)
                for r in range(rows):
                    self.out(
                        f"s_reduce[{r}u * gl_NumSubgroups + gl_SubgroupID] = {names[j][r]};", 3
                    )
                self.out("}", 2)
                self.out("barrier();", 2)
                for r in range(rows):
                    self.out(f"{names[j][r]} = s_reduce[{r}u * gl_NumSubgroups];", 2)
                    self.out("for (uint s = 1u; s < gl_NumSubgroups; ++s) {", 2)
                    acc = f"s_reduce[{r}u * gl_NumSubgroups + s]"
                    self.out(f"{names[j][r]} = {combine(red.op, names[j][r], acc)};", 3)
                    self.out("}", 2)
                self.out("barrier();", 2)
        self.out(f"if ({'gl_LocalInvocationIndex == 0u' if whole else 'subgroupElect()'}) {{", 2)
        for r in range(rows):
            pr = _Printer({p.row: f"row_{r}"})
            for j, red in enumerate(reds):
                pr.reduce_names[id(red)] = names[j][r]
            if isinstance(p.buffer, kir.SharedArray) and p.slice:
                value, dst = pr.as_float(p.value), f"s_{shared_id(p.buffer.name)}"
                self.out(
                    f"if (row0 + {r}u < {row_ext}) {{ {dst}[row_{r} - "
                    f"gl_WorkGroupID.x * gl_NumSubgroups * {rows}u] = {value}; }}",
                    3,
                )
                continue
            if isinstance(p.buffer, kir.SharedArray):
                value, dst = pr.as_float(p.value), f"s_{shared_id(p.buffer.name)}"
            else:
                value = self.convert(p.buffer, p.value, pr, 3)
                dst = f"b_{buffer_id(p.buffer)}"
            at = pr.expr(p.index) if p.index is not None else f"row_{r}"
            self.out(f"if (row0 + {r}u < {row_ext}) {{ {dst}[{at}] = {value}; }}", 3)
        self.out("}", 2)
        self.out("}")
        if p.to_shared:
            self.out("barrier();")

    def int_dot_loop(
        self,
        p: kir.Contract,
        terms: list[kir.IntDotTerm],
        js: list[int],
        names: list[list[str]],
        kb: str,
        rows: int,
        ext: str,
        lane: str,
        lanes: str,
    ) -> None:
        """One whole block per lane per step (layout x 32) as integer dot products; the
        weights' extent is a whole number of blocks (dsl.check).  Steps are unrolled until about
        INT_DOT_WORDS words of weights are in flight per lane; the plain loop takes the rest."""
        nb = f"(({ext}) / 32u)"
        unroll = int_dot_unroll([terms[j] for j in js], rows)
        self.out(f"uint {kb} = {lane};", 2)
        if unroll > 1:
            self.out(f"for (; {kb} + {unroll - 1}u * {lanes} < {nb}; ) {{", 2)
            blks = [f"({kb} + {u}u * {lanes})" if u else kb for u in range(unroll)]
            self.int_dot_blocks(p, terms, js, names, blks, rows, 3)
            self.out(f"{kb} += {unroll}u * {lanes};", 3)
            self.out("}", 2)
        self.out(f"for (; {kb} < {nb}; {kb} += {lanes}) {{", 2)
        self.int_dot_blocks(p, terms, js, names, [kb], rows, 3)
        self.out("}", 2)

    def int_dot_blocks(
        self,
        p: kir.Contract,
        terms: list[kir.IntDotTerm],
        js: list[int],
        names: list[list[str]],
        blks: list[str],
        rows: int,
        indent: int,
    ) -> None:
        """The given blocks of every row: all activation and weight loads first (in flight
        together), then the dot products."""
        self.out("{", indent)
        ind = indent + 1
        acts = {id(terms[j].acts): terms[j].acts for j in js}
        for b, blk in enumerate(blks):
            for arr in acts.values():
                n = storage_id(arr)
                a = f"{n}_{b}"
                if isinstance(arr, kir.SharedArray):
                    self.out(
                        f"ivec4 xa_{a} = s_{n}_q[{blk} * 2u], xb_{a} = s_{n}_q[{blk} * 2u + 1u];",
                        ind,
                    )
                    self.out(f"ivec2 xt_{a} = s_{n}_d[{blk}];", ind)
                    self.out(f"float xd_{a} = intBitsToFloat(xt_{a}.x);", ind)
                    self.out(f"int xs_{a} = xt_{a}.y;", ind)
                    continue
                self.views.add((arr.name, 4))  # DType.Q8_0X blocks: three 16-byte loads
                self.out(f"ivec4 xa_{a} = ivec4(b_{n}_u4[{blk} * 3u]);", ind)
                self.out(f"ivec4 xb_{a} = ivec4(b_{n}_u4[{blk} * 3u + 1u]);", ind)
                self.out(f"uvec4 xt_{a} = b_{n}_u4[{blk} * 3u + 2u];", ind)
                self.out(f"float xd_{a} = uintBitsToFloat(xt_{a}.x);", ind)
                self.out(f"int xs_{a} = int(xt_{a}.y);", ind)
        for b, blk in enumerate(blks):
            for r in range(rows):
                for j in js:
                    t = terms[j]
                    pr = _Printer({p.row: f"row_{r}", t.reduce.var: f"({blk} * 32u)"})
                    flat = pr.flat(t.weight.buffer.shape, t.weight.indices)
                    n, v = buffer_id(t.weight.buffer), f"{j}_{r}_{b}"
                    if t.weight.buffer.dtype == DType.Q4_0:
                        self.out(f"float wd{v}; uvec4 wq{v};", ind)
                        self.out(f"blk_{n}(({flat}) >> 5u, wd{v}, wq{v});", ind)
                    elif t.weight.buffer.dtype == DType.Q6_K:
                        self.out(f"float wd{v}; int ws{v}, wt{v}; uvec4 wq{v}, wr{v};", ind)
                        self.out(f"sub32_{n}({flat}, wd{v}, ws{v}, wt{v}, wq{v}, wr{v});", ind)
                    elif t.weight.buffer.dtype == DType.Q4_K:
                        self.views.add((t.weight.buffer.name, 4))
                        self.sub32.add(t.weight.buffer.name)
                        self.out(f"float wd{v}, wm{v}; uvec4 wq{v}, wr{v};", ind)
                        self.out(f"sub32_{n}({flat}, wd{v}, wm{v}, wq{v}, wr{v});", ind)
                    else:
                        self.out(f"float wd{v}; uvec4 wq{v}, wr{v};", ind)
                        self.out(f"blk_{n}(({flat}) >> 5u, wd{v}, wq{v}, wr{v});", ind)
        for b in range(len(blks)):
            for r in range(rows):
                for j in js:
                    t = terms[j]
                    n, v = buffer_id(t.weight.buffer), f"{j}_{r}_{b}"
                    a = f"{storage_id(t.acts)}_{b}"
                    acc = names[j][r]
                    if t.weight.buffer.dtype == DType.Q6_K:
                        # per half of 16: scale x (dot - 32 x the half's activation quant sum)
                        self.out(f"int xh{v} = sum16_{n}(xa_{a});", ind)
                        lo = f"ws{v} * (dot16_{n}(wq{v}, xa_{a}) - 32 * xh{v})"
                        hi = f"wt{v} * (dot16_{n}(wr{v}, xb_{a}) - 32 * (xs_{a} - xh{v}))"
                        self.out(f"{acc} = {acc} + (wd{v} * xd_{a}) * float({lo} + {hi});", ind)
                        continue
                    if t.weight.buffer.dtype == DType.Q4_K:
                        dot = f"float(dot_{n}(wq{v}, wr{v}, xa_{a}, xb_{a}))"
                        scaled = f"(wd{v} * {dot} - wm{v} * float(xs_{a}))"
                        self.out(f"{acc} = {acc} + xd_{a} * {scaled};", ind)
                        continue
                    if t.weight.buffer.dtype == DType.Q4_0:
                        dot = f"float(dot_{n}(wq{v}, xa_{a}, xb_{a}) - 8 * xs_{a})"
                    else:
                        dot = f"float(dot_{n}(wq{v}, wr{v}, xa_{a}, xb_{a}))"
                    self.out(f"{acc} = {acc} + (wd{v} * xd_{a}) * {dot};", ind)
        self.out("}", indent)

    def unrolled(
        self,
        p: kir.Contract,
        reds: list[ir.Reduce],
        js: list[int],
        names: list[list[str]],
        k: str,
        rows: int,
        vec: int,
        indent: int,
        ext: str,
        loads: list[ir.Load],
        lanes: str,
    ) -> None:
        """Several steps per iteration in straight-line code, so that their wide loads are in
        flight together (LOADS_IN_FLIGHT); the plain loop after it takes the remaining steps."""
        row_loads = sum(rows if len(ld.buffer.shape) > 1 else 0 for ld in loads)
        unroll = min(4, LOADS_IN_FLIGHT // max(row_loads, 1))
        if unroll <= 1:
            return
        step = f"{lanes} * {vec}u"
        self.out(f"for (; {k} + {unroll - 1}u * {step} + {vec}u <= {ext}; ) {{", indent)
        for _ in range(unroll):
            self.out("{", indent + 1)
            self.contract_step(p, reds, js, names, k, rows, vec, indent + 2, guard=None, wide=loads)
            self.out(f"{k} += {step};", indent + 2)
            self.out("}", indent + 1)
        self.out("}", indent)

    def contract_step(
        self,
        p: kir.Contract,
        reds: list[ir.Reduce],
        js: list[int],
        names: list[list[str]],
        k: str,
        rows: int,
        vec: int,
        indent: int,
        guard: str | None,
        wide: list[ir.Load] | None = None,
    ) -> None:
        """One step of `vec` elements per lane.  With `wide`, those loads are issued first as
        whole vectors (16 bytes at most per load) and their elements reused."""
        values: dict[tuple[int, int], list[str]] = {}  # (id(load), row) -> element values
        for n, load in enumerate(wide or []):
            red = next(reds[j] for j in js if any(x is load for x in kir.kwalk(reds[j].body)))
            row_dep = any(isinstance(x, ir.IndexRef) and x.var is p.row for x in kir.kwalk(load))
            for r in range(rows) if row_dep else [-1]:
                pr = _Printer({p.row: f"row_{max(r, 0)}", red.var: k})
                flat = pr.flat(load.buffer.shape, load.indices)
                tmp = f"w{n}_{max(r, 0)}"
                values[(id(load), r)] = self.wide_load(load.buffer, flat, tmp, vec, indent)
        for v in range(vec):
            idx = f"{k} + {v}u" if v else k
            if guard is not None:
                self.out(f"if ({idx} < {guard}) {{", indent)
            ind = indent + (1 if guard is not None else 0)
            for r in range(rows):
                for j in js:
                    red = reds[j]
                    pr = _Printer({p.row: f"row_{r}", red.var: f"({idx})"})
                    for load in wide or []:
                        got = values.get((id(load), r)) or values.get((id(load), -1))
                        if got is not None:
                            pr.overrides[id(load)] = got[v]
                    self.out(
                        f"{names[j][r]} = {combine(red.op, names[j][r], pr.as_float(red.body))};",
                        ind,
                    )
            if guard is not None:
                self.out("}", indent)

    def wide_load(self, buf: ir.Buffer, flat: str, tmp: str, vec: int, indent: int) -> list[str]:
        """Load `vec` consecutive elements starting at `flat` (a multiple of `vec`); returns
        the GLSL value of each element."""
        n = buffer_id(buf)
        if buf.dtype == DType.Q4_K and vec == 32:  # a whole sub-block: _SUB32_Q4K
            self.views.add((buf.name, 4))
            self.sub32.add(buf.name)
            self.out(f"float {tmp}_d, {tmp}_dm; uvec4 {tmp}_a, {tmp}_b;", indent)
            self.out(f"sub32_{n}({flat}, {tmp}_d, {tmp}_dm, {tmp}_a, {tmp}_b);", indent)
            values = []
            for c in range(8):
                word = f"{tmp}_{'ab'[c // 4]}.{'xyzw'[c % 4]}"
                self.out(f"vec4 {tmp}_v{c} = q4x4_{n}({word});", indent)
                values += [f"({tmp}_v{c}.{'xyzw'[j]} * {tmp}_d - {tmp}_dm)" for j in range(4)]
            return values
        if buf.dtype.is_quantized:
            # vec divides 32 and `flat` is a multiple of it: one block; one scale per
            # `span` elements (one for q8_0, q4_0 and q4_K, two for a q6_K step of 32)
            self.out(f"uint {tmp}_e = {flat};", indent)
            span = min(vec, buf.dtype.scale_span)
            scales: list[tuple[str, str | None]] = []  # per span: scale, min (q4_K)
            for g in range(vec // span):
                d = f"{tmp}_d" if vec == span else f"{tmp}_d{g}"
                at = f"{tmp}_e + {g * span}u" if g else f"{tmp}_e"
                self.out(f"float {d} = scale_{n}({at});", indent)
                m = None
                if buf.dtype == DType.Q4_K:  # value = quant * scale - min
                    m = f"{d}m"
                    self.out(f"float {m} = min_{n}({at});", indent)
                scales.append((d, m))

            def value(q: str, i: int) -> str:
                d, m = scales[i // span]
                return f"({q} * {d})" if m is None else f"({q} * {d} - {m})"

            if vec % 8:
                return [value(f"quant_{n}({tmp}_e + {j}u)", j) for j in range(vec)]
            values = []
            for c in range(vec // 8):
                self.out(f"vec4 {tmp}_l{c}, {tmp}_h{c};", indent)
                self.out(f"quant8_{n}({tmp}_e + {8 * c}u, {tmp}_l{c}, {tmp}_h{c});", indent)
                values += [value(f"{tmp}_l{c}.{'xyzw'[j]}", 8 * c + j) for j in range(4)]
                values += [value(f"{tmp}_h{c}.{'xyzw'[j]}", 8 * c + 4 + j) for j in range(4)]
            return values
        eb = 2 if buf.dtype == DType.F16 else 4
        chunk = min(16, vec * eb)
        words = chunk // 4
        self.views.add((buf.name, words))
        per_chunk = chunk // eb
        out = []
        for c in range(vec * eb // chunk):
            self.out(
                f"{_UVEC[words]} {tmp}_{c} = b_{n}_u{words}[({flat}) / {per_chunk}u + {c}u];",
                indent,
            )
            for e in range(per_chunk):
                word = f"{tmp}_{c}" if words == 1 else f"{tmp}_{c}.{'xyzw'[(e * eb) // 4]}"
                if eb == 2:
                    out.append(f"unpackHalf2x16({word}).{'xy'[e % 2]}")
                else:
                    out.append(f"uintBitsToFloat({word})")
        return out


_UVEC = {1: "uint", 2: "uvec2", 4: "uvec4"}


def vector_loads(reds: list[ir.Reduce], js: list[int], vec: int) -> list[ir.Load]:
    """Global loads of a contraction step that can be issued as one wide load per step: their
    last index is the reduced variable itself and no other index mentions it."""
    if vec < 2:
        return []
    found: list[ir.Load] = []
    for j in js:
        red = reds[j]
        for x in kir.kwalk(red.body):
            if not isinstance(x, ir.Load) or any(x is f for f in found):
                continue
            last = x.indices[-1]
            others = x.indices[:-1]
            if not (isinstance(last, ir.IndexRef) and last.var is red.var):
                continue
            if any(
                isinstance(y, ir.IndexRef) and y.var is red.var
                for o in others
                for y in kir.kwalk(o)
            ):
                continue
            if x.buffer.dtype.is_quantized and 32 % vec:
                continue
            if x.buffer.dtype in (DType.F16, DType.F32) or x.buffer.dtype.is_quantized:
                if x.buffer.dtype == DType.F16 and vec < 2:
                    continue
                found.append(x)
    return found


def block_words(dtype: DType) -> int:
    """32-bit words loaded per weight block of 32 by the integer dot product path (q4_K: the
    super-block's head and the sub-block's quants, three 16-byte loads; q6_K: 16 words of
    quants, 2-byte aligned, and the scales)."""
    return {DType.Q4_0: 5, DType.Q4_K: 12, DType.Q6_K: 18}.get(dtype, 9)


def int_dot_unroll(terms: list[kir.IntDotTerm], rows: int) -> int:
    """Steps of an integer dot product loop issued together (INT_DOT_WORDS)."""
    words = rows * sum(block_words(t.weight.buffer.dtype) for t in terms)
    return max(1, min(4, INT_DOT_WORDS // max(words, 1)))


def quant_wide_loads(p: kir.QuantizeBlocks) -> list[ir.Load]:
    """f32/f16 loads of a quantized stage's value read as 4-element vectors: their last index
    is the stage's index and no other index mentions it."""
    found: list[ir.Load] = []
    for x in kir.kwalk(p.value):
        if not isinstance(x, ir.Load) or any(x is f for f in found):
            continue
        if x.buffer.dtype not in (DType.F32, DType.F16):
            continue
        last = x.indices[-1]
        if not (isinstance(last, ir.IndexRef) and last.var is p.var):
            continue
        if any(
            isinstance(y, ir.IndexRef) and y.var is p.var
            for o in x.indices[:-1]
            for y in kir.kwalk(o)
        ):
            continue
        found.append(x)
    return found


def emit_glsl(kernel: kir.Kernel, line_directives: bool = True) -> str:
    """The GLSL text of one kernel."""
    return emit_kernel(kernel, line_directives)[0]


def emit_kernel(
    kernel: kir.Kernel, line_directives: bool = True
) -> tuple[str, tuple[ir.Expr, ...]]:
    """The GLSL text of one kernel, and its derived constants (spec id DERIVED_SPEC_BASE + i
    holds the value of the i-th expression)."""
    derived = _Derived()
    token = _DERIVED.set(derived)
    called: set[str] = set()
    called_token = _CALLED.set(called)
    try:
        em = _Emitter(kernel, line_directives)
        em.lines.append("void main() {")
        for p in kernel.phases:
            em.phase(p)
        em.lines.append("}")
        body = em.lines
        em.lines = []
        em.directive = None
        em.header()
        # wide views alias a buffer's binding with uint vectors (same descriptor, other type)
        for name, words in sorted(em.views):
            b = next(b for b in kernel.bindings if b.buffer.name == name)
            n = buffer_id(b.buffer)
            em.lines.append(
                f"layout(set = 0, binding = {b.binding}, std430) readonly buffer "
                f"B_{n}_u{words} {{ {_UVEC[words]} b_{n}_u{words}[]; }};"
            )
        for name in sorted(em.sub32):  # after the views they read
            b = next(b for b in kernel.bindings if b.buffer.name == name)
            em.lines.append(_SUB32_Q4K.format(n=buffer_id(b.buffer)))
        em.lines += [text for fn, text in _FUNCTION_TEXT.items() if fn in called]
    finally:
        _DERIVED.reset(token)
        _CALLED.reset(called_token)
    defaults = {c.name: c.default for c in kernel.region.consts}

    def default(e: ir.Expr) -> int:
        # the runtime always sets it; a default that divides by zero is refused when run
        try:
            return manifest.eval_u32(manifest.expr_record(e), defaults)
        except ValueError:
            return 0

    decls = [
        f"layout(constant_id = {DERIVED_SPEC_BASE + i}) const uint d_{i} = "
        f"{default(e)}u;  // {_Printer({}).expr(e)}"
        for i, e in enumerate(derived.exprs)
    ]
    # after the region's own constants, before anything that may use them
    at = em.lines.index(_CONSTS_END)
    lines = em.lines[:at] + decls + em.lines[at + 1 :]
    return "\n".join(lines + body) + "\n", tuple(derived.exprs)
