"""Rounding to q8_0 blocks in GLSL, shared by the quantized stages (`glsl_quant`) and by a
contraction whose output is stored as q8_0 blocks (`glsl_contract`, `kir.Contract.staging`).

Input: eight values per lane in `qv`, four neighbouring lanes per block of 32.  Output: GLSL
lines on the kernel writer.  Not done here: where the values come from, and the loops over
blocks (the callers)."""

from __future__ import annotations

from .glsl_expr import LOOP_HINT
from .glsl_writer import KernelWriter


class Q8Rounding(KernelWriter):
    """Rounds a block held by 4 lanes and stores it in fusec's aligned layout."""

    def round_block(self, indent: int) -> None:
        """qv[0..7] (this lane's two runs of 4 of a block; 4 neighbouring lanes per block) ->
        qs (the scale as stored), qw0 / qw1 (the lane's quant words) and qsum (the block's
        quant sum), as gguf's q8_0 quantization computes them: d = max |v| / 127 (a maximum
        over the 4 lanes), q = v * (1 / d) rounded half away from zero, the stored scale d
        rounded to f16.  In uniform control flow (shuffles over the 4 lanes)."""
        self.out("float amax = 0.0;", indent)
        self.out(
            f"{LOOP_HINT}for (uint j = 0u; j < 8u; ++j) {{ amax = max(amax, abs(qv[j])); }}",
            indent,
        )
        self.out("amax = max(amax, subgroupShuffleXor(amax, 1u));", indent)
        self.out("amax = max(amax, subgroupShuffleXor(amax, 2u));", indent)
        # gguf's d = max / 127 and id = 1 / d, each correctly rounded in f32.  Compilers rewrite
        # both (lavapipe: x / 127.0 as x * (1 / 127), off in the last bit for 4% of values, and
        # v * (1 / (a / 127)) as v * 127 / a), and at a near-tie the quant then differs from
        # gguf's (v / d = 91.4999982: gguf 91, the kernel 92; about one draw in 300 of
        # test_activation_quant.py at K = 4096).  `qz` is 0 at run time but no constant to the
        # compiler, so each division stays a division of its own
        self.out("uint qz = gl_LocalInvocationID.x >> 31u;", indent)
        self.out("float qd = amax / uintBitsToFloat(0x42fe0000u | qz);", indent)
        self.out(
            "float qid = (qd != 0.0) ? uintBitsToFloat(floatBitsToUint(1.0 / qd) | qz) : 0.0;",
            indent,
        )
        # the scale as stored, rounded to f16 (nearest even) with integer operations: compilers
        # fold unpackHalf2x16(packHalf2x16(d)) into d (seen on lavapipe)
        self.out("uint qu = floatBitsToUint(qd);", indent)
        self.out(
            "float qs = (qd < 6.103515625e-05) ? roundEven(qd * 16777216.0) / 16777216.0"
            " : uintBitsToFloat((qu + 0xfffu + ((qu >> 13u) & 1u)) & 0xffffe000u);",
            indent,
        )
        # past the largest f16 (65504, and halfway to the next power of two: 65520) the f16
        # scale is infinite, as gguf's cast gives it (IEEE 754 round to nearest); the quants
        # stay those of the f32 scale, as in gguf
        self.out("qs = (qd >= 65520.0) ? uintBitsToFloat(0x7f800000u) : qs;", indent)
        self.out("int qw0 = 0, qw1 = 0, qsum = 0;", indent)
        for j in range(8):
            self.out("{", indent)
            self.out(f"float t = qv[{j}] * qid, a = abs(t), f = floor(a);", indent + 1)
            self.out("int q = int(sign(t) * (f + floor(2.0 * (a - f))));", indent + 1)
            self.out("qsum += q;", indent + 1)
            self.out(f"qw{j // 4} |= (q & 0xff) << {8 * (j % 4)};", indent + 1)
            self.out("}", indent)
        self.out("qsum += subgroupShuffleXor(qsum, 1u);", indent)
        self.out("qsum += subgroupShuffleXor(qsum, 2u);", indent)

    def store_block(self, n: str, qb: str, indent: int) -> None:
        """This lane's part of block `qb` of the DType.Q8_0X buffer b_`n`: quant words qi and
        4 + qi; lane 0 of the 4 the scale and the quant sum (words 8, 9)."""
        self.out(f"b_{n}[{qb} * 12u + qi] = uint(qw0);", indent)
        self.out(f"b_{n}[{qb} * 12u + 4u + qi] = uint(qw1);", indent)
        self.out("if (qi == 0u) {", indent)
        self.out(f"b_{n}[{qb} * 12u + 8u] = floatBitsToUint(qs);", indent + 1)
        self.out(f"b_{n}[{qb} * 12u + 9u] = uint(qsum);", indent + 1)
        self.out("}", indent)
