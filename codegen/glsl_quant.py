"""Quantized stages (`kir.QuantizeBlocks`): a stage's values quantized to q8_0 blocks in shared
memory for the integer dot product path, with its wide loads.

Input: a `kir.QuantizeBlocks` phase and its plan.  Output: GLSL lines on the kernel writer.  Not
done here: the dot products that read the blocks (`glsl_contract.py`) and the choice of the loads
read wide (`plan.py`)."""

from __future__ import annotations

from . import kir
from .glsl_expr import _Printer, storage_id, workgroup_count, workgroup_id
from .glsl_q8 import Q8Rounding
from .plan import QuantizePlan, WideLoad


class QuantEmitter(Q8Rounding):
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
                f"for (uint qb0 = {workgroup_id()} * {per_wg}u; qb0 < {blocks}; "
                f"qb0 += {workgroup_count()} * {per_wg}u) {{"
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
        self.round_block(2)
        n = storage_id(p.target)
        self.out(f"if (qb < {blocks}) {{", 2)
        if shared:
            self.out(f"s_{n}_q[qb * 2u][qi] = qw0;", 3)
            self.out(f"s_{n}_q[qb * 2u + 1u][qi] = qw1;", 3)
            self.out(f"if (qi == 0u) {{ s_{n}_d[qb] = ivec2(floatBitsToInt(qs), qsum); }}", 3)
        else:  # DType.Q8_0X: quant words 0..7, scale, sum
            self.store_block(n, "qb", 3)
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
