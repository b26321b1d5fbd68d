"""GLSL text tables of the kernel printer (`glsl.py`): element types, reduction
initial values and subgroup operations, the op -> template table, and the helper functions a
kernel may call (erf, gelu, softplus; double exp, log, pow and angle reduction; GGUF
dequantization and quant-byte readers; integer dot products of q8_0 activations against quantized
weights).

Input: nothing (data).  Output: format strings keyed by dtype or function name.  Not done here:
choosing which of them a kernel needs (`glsl_expr._Printer.call`, `glsl.emit_kernel`)."""

from __future__ import annotations

import contextvars
import math

from fusec.dsl.types import DType

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
