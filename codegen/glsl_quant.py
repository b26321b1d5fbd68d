"""Quantized stages (`kir.QuantizeBlocks`): a stage's values quantized to q8_0 blocks in shared
memory for the integer dot product path, with its wide loads.

Input: a `kir.QuantizeBlocks` phase and its plan.  Output: GLSL lines on the kernel writer.  Not
done here: the dot products that read the blocks (`glsl_contract.py`) and the choice of the loads
read wide (`plan.py`)."""

from __future__ import annotations

from . import kir
from .glsl_expr import LOOP_HINT, _Printer, storage_id
from .glsl_writer import KernelWriter
from .plan import QuantizePlan, WideLoad


class QuantEmitter(KernelWriter):
    """Emits quantize-blocks phases."""

    def quantize_blocks(self, p: kir.QuantizeBlocks, plan: QuantizePlan) -> None:
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
        wide = plan.wide
        if wide:
            cond = " && ".join(sorted({f"(({pr.expr(c)}) % 4u == 0u)" for c in plan.aligned}))
            self.out(f"if (({ext}) % 4u == 0u && {cond}) {{", 2)
            self.quant_values(p, ext, wide, 3)
            self.out("} else {", 2)
            self.quant_values(p, ext, (), 3)
            self.out("}", 2)
        else:
            self.quant_values(p, ext, (), 2)
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
        self, p: kir.QuantizeBlocks, ext: str, wide: tuple[WideLoad, ...], indent: int
    ) -> None:
        """qv[0..7]: the lane's two runs of 4 elements; zeros past the end (padding)."""
        var = self.ivar(p.var)
        for g in range(2):
            k = f"qk{g}"
            if wide:  # the run is whole or wholly past the end (extent % 4 == 0)
                self.out(f"if ({k} < {ext}) {{", indent)
                values = {}
                for n, w in enumerate(wide):
                    lp = _Printer({p.var: k})
                    flat = lp.flat(w.load.buffer.shape, w.load.indices)
                    values[id(w.load)] = self.wide_load(w, flat, f"qx{g}_{n}", indent + 1)
                for e in range(4):
                    self.out("{", indent + 1)
                    self.out(f"uint {var} = {k} + {e}u;", indent + 2)
                    ep = _Printer({p.var: var})
                    for w in wide:
                        ep.overrides[id(w.load)] = values[id(w.load)][e]
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
