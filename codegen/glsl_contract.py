"""Contractions (`kir.Contract`, `kir.SplitK`): a row per lane or per subgroup, unrolled
contraction steps with wide loads, the integer dot product loops of quantized weights against
q8_0 activations, and split-K partial sums added atomically.

Input: contraction phases and their plans.  Output: GLSL lines on the kernel writer.  Not done
here: the choice of a contraction's form (`lower.py`) and of its loops, wide loads, unrolling
and block reads (`plan.py`): this module renders the plan."""

from __future__ import annotations

from typing import assert_never

from fusec.dsl import ir
from fusec.dsl.types import Scope

from . import kir
from .glsl_expr import (
    LOOP_HINT,
    _Printer,
    buffer_id,
    combine,
    global_invocation,
    shared_id,
    storage_id,
    workgroup_count,
    workgroup_id,
)
from .glsl_q8 import Q8Rounding
from .glsl_templates import _INIT, _SUBGROUP_OP
from .plan import ActSource, BlockRead, ContractPlan, IntDotLoop, StepLoop, WideLoad


class ContractEmitter(Q8Rounding):
    """Emits contraction and split-K phases."""

    def split_k(self, p: kir.SplitK) -> None:
        """Each workgroup adds, for every row, the dot product over its slice."""
        wg = self.k.workgroup_size
        rows = next(c.rows for c in self.k.phases if isinstance(c, kir.Contract) and c.slice)
        ext = _Printer({}).expr(p.var.extent)
        row_ext = _Printer({}).expr(p.row.extent)
        self.out(f"uint sb = {workgroup_id()} * gl_NumSubgroups * {rows}u;")
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

    def contract_lane(self, p: kir.Contract, grid_step: str) -> None:
        row = self.ivar(p.row)
        pr = _Printer({p.row: row})
        ext = pr.expr(p.row.extent)
        start, step = (
            (global_invocation(self.k.workgroup_size), grid_step)
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

    def contract_subgroup(self, p: kir.Contract, plan: ContractPlan) -> None:
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
        if p.staging is not None:  # a q8_0x output: chunks of whole blocks per workgroup
            self.out(f"uint qc = (gl_NumSubgroups * {rows}u + 31u) / 32u * 32u;  // rows a chunk")
            self.out(
                f"for (uint qbase = {workgroup_id()} * qc; qbase < {row_ext}; "
                f"qbase += {workgroup_count()} * qc) {{"
            )
            self.out(
                f"for (uint row0 = qbase + gl_SubgroupID * {rows}u; row0 < qbase + qc; "
                f"row0 += gl_NumSubgroups * {rows}u) {{"
            )
        elif p.slice:  # one block of rows per workgroup, kept in shared memory
            self.out(
                f"for (uint row0 = ({workgroup_id()} * gl_NumSubgroups + gl_SubgroupID) * "
                f"{rows}u; row0 < {row_ext} && row0 < ({workgroup_id()} + 1u) * "
                f"gl_NumSubgroups * {rows}u; row0 += {rows}u * gl_NumSubgroups * "
                f"{workgroup_count()}) {{"
            )
        elif p.to_shared or p.index is not None:  # this workgroup computes every row
            self.out(
                f"for (uint row0 = gl_SubgroupID * {rows}u; row0 < {row_ext}; "
                f"row0 += gl_NumSubgroups * {rows}u) {{"
            )
        elif whole:
            self.out(
                f"for (uint row0 = {workgroup_id()} * {rows}u; row0 < {row_ext}; "
                f"row0 += {workgroup_count()} * {rows}u) {{"
            )
        else:
            self.out(
                f"for (uint row0 = ({workgroup_id()} * gl_NumSubgroups + gl_SubgroupID) * "
                f"{rows}u; row0 < {row_ext}; row0 += {workgroup_count()} * gl_NumSubgroups * "
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
        for n, loop in enumerate(plan.loops):
            k = f"k{n}"
            ext = _Printer({}).expr(loop.extent)
            js = list(loop.reduces)
            if isinstance(loop, IntDotLoop):
                self.int_dot_loop(p, loop, names, k, rows, ext, lane, lanes)
                continue
            self.out(f"uint {k} = {lane} * {vec}u;", 2)
            head = f"for (; {k} + {vec}u <= {ext}; {k} += {lanes} * {vec}u) {{"
            wide = loop.wide
            if loop.whole_blocks:
                self.out(head, 2)
                self.contract_step(p, reds, js, names, k, rows, vec, 3, guard=None, wide=wide)
                self.out("}", 2)
                continue
            if wide:
                # the wide path's condition is on specialization constants, so the driver folds
                # the branch
                cond = " && ".join(
                    sorted({f"(({_Printer({}).expr(c)}) % {vec}u == 0u)" for c in loop.aligned})
                )
                self.out(f"if ({cond or 'true'}) {{", 2)
                self.unrolled(p, reds, loop, names, k, rows, 3, ext, lanes)
                self.out(head, 3)
                self.contract_step(p, reds, js, names, k, rows, vec, 4, guard=None, wide=wide)
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
            if loop.tail:
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
            if p.staging is not None:
                value, dst = pr.as_float(p.value), f"s_{shared_id(p.staging.name)}"
                self.out(
                    f"if (row0 + {r}u < {row_ext} && row0 + {r}u < qbase + qc) "
                    f"{{ {dst}[row0 + {r}u - qbase] = {value}; }}",
                    3,
                )
                continue
            if isinstance(p.buffer, kir.SharedArray) and p.slice:
                value, dst = pr.as_float(p.value), f"s_{shared_id(p.buffer.name)}"
                self.out(
                    f"if (row0 + {r}u < {row_ext}) {{ {dst}[row_{r} - "
                    f"{workgroup_id()} * gl_NumSubgroups * {rows}u] = {value}; }}",
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
        if p.staging is not None:
            self.round_staged(p, row_ext)
        if p.to_shared:
            self.out("barrier();")

    def round_staged(self, p: kir.Contract, row_ext: str) -> None:
        """The chunk's rows, staged in shared memory, rounded to q8_0 blocks by 4 lanes each
        (zeros past the last row: the last block's padding) and stored; then the next chunk."""
        assert p.staging is not None and isinstance(p.buffer, ir.Buffer)
        src, n = f"s_{shared_id(p.staging.name)}", buffer_id(p.buffer)
        self.out("barrier();")
        self.out(f"for (uint qb0 = 0u; qb0 < qc / 32u; qb0 += {self.k.workgroup_size // 4}u) {{")
        self.out(
            "uint qb = qb0 + gl_LocalInvocationIndex / 4u, qi = gl_LocalInvocationIndex & 3u;", 2
        )
        self.out("float qv[8];", 2)
        self.out(f"{LOOP_HINT}for (uint j = 0u; j < 8u; ++j) {{", 2)
        self.out("uint r = qb * 32u + qi * 4u + (j & 3u) + (j >> 2u) * 16u;", 3)
        self.out(f"qv[j] = (qb < qc / 32u && qbase + r < {row_ext}) ? {src}[r] : 0.0;", 3)
        self.out("}", 2)
        self.round_block(2)
        self.out(f"if (qb < qc / 32u && qbase + qb * 32u < {row_ext}) {{", 2)
        self.store_block(n, "(qbase / 32u + qb)", 3)
        self.out("}", 2)
        self.out("}")
        self.out("barrier();")
        self.out("}")

    def int_dot_loop(
        self,
        p: kir.Contract,
        loop: IntDotLoop,
        names: list[list[str]],
        kb: str,
        rows: int,
        ext: str,
        lane: str,
        lanes: str,
    ) -> None:
        """One whole block per lane per step (layout x 32) as integer dot products; the
        weights' extent is a whole number of blocks (dsl.check).  `loop.unroll` blocks per
        iteration first, then the plain loop takes the rest."""
        nb = f"(({ext}) / 32u)"
        unroll = loop.unroll
        self.out(f"uint {kb} = {lane};", 2)
        if unroll > 1:
            self.out(f"for (; {kb} + {unroll - 1}u * {lanes} < {nb}; ) {{", 2)
            blks = [f"({kb} + {u}u * {lanes})" if u else kb for u in range(unroll)]
            self.int_dot_blocks(p, loop, names, blks, rows, 3)
            self.out(f"{kb} += {unroll}u * {lanes};", 3)
            self.out("}", 2)
        self.out(f"for (; {kb} < {nb}; {kb} += {lanes}) {{", 2)
        self.int_dot_blocks(p, loop, names, [kb], rows, 3)
        self.out("}", 2)

    def int_dot_blocks(
        self,
        p: kir.Contract,
        loop: IntDotLoop,
        names: list[list[str]],
        blks: list[str],
        rows: int,
        indent: int,
    ) -> None:
        """The given blocks of every row: all activation and weight loads first (in flight
        together), then the dot products, each read as its term's plan says."""
        self.out("{", indent)
        ind = indent + 1
        terms = list(zip(loop.reduces, loop.terms, strict=True))
        acts = {id(t.term.acts): (t.term.acts, t.acts) for _, t in terms}
        for b, blk in enumerate(blks):
            for arr, source in acts.values():
                n = storage_id(arr)
                a = f"{n}_{b}"
                if source == ActSource.SHARED:
                    self.out(
                        f"ivec4 xa_{a} = s_{n}_q[{blk} * 2u], xb_{a} = s_{n}_q[{blk} * 2u + 1u];",
                        ind,
                    )
                    self.out(f"ivec2 xt_{a} = s_{n}_d[{blk}];", ind)
                    self.out(f"float xd_{a} = intBitsToFloat(xt_{a}.x);", ind)
                    self.out(f"int xs_{a} = xt_{a}.y;", ind)
                    continue
                assert isinstance(arr, ir.Buffer)  # ActSource.GLOBAL: DType.Q8_0X blocks
                self.views.add((arr.name, 4))  # three 16-byte loads
                self.out(f"ivec4 xa_{a} = ivec4(b_{n}_u4[{blk} * 3u]);", ind)
                self.out(f"ivec4 xb_{a} = ivec4(b_{n}_u4[{blk} * 3u + 1u]);", ind)
                self.out(f"uvec4 xt_{a} = b_{n}_u4[{blk} * 3u + 2u];", ind)
                self.out(f"float xd_{a} = uintBitsToFloat(xt_{a}.x);", ind)
                self.out(f"int xs_{a} = int(xt_{a}.y);", ind)
        for b, blk in enumerate(blks):
            for r in range(rows):
                for j, read in terms:
                    t = read.term
                    pr = _Printer({p.row: f"row_{r}", t.reduce.var: f"({blk} * 32u)"})
                    flat = pr.flat(t.weight.buffer.shape, t.weight.indices)
                    n, v = buffer_id(t.weight.buffer), f"{j}_{r}_{b}"
                    match read.read:
                        case BlockRead.BLK_Q4_0:
                            self.out(f"float wd{v}; uvec4 wq{v};", ind)
                            self.out(f"blk_{n}(({flat}) >> 5u, wd{v}, wq{v});", ind)
                        case BlockRead.SUB32_Q6_K:
                            self.out(f"float wd{v}; int ws{v}, wt{v}; uvec4 wq{v}, wr{v};", ind)
                            self.out(f"sub32_{n}({flat}, wd{v}, ws{v}, wt{v}, wq{v}, wr{v});", ind)
                        case BlockRead.SUB32_Q4_K:
                            self.views.add((t.weight.buffer.name, 4))
                            self.sub32.add(t.weight.buffer.name)
                            self.out(f"float wd{v}, wm{v}; uvec4 wq{v}, wr{v};", ind)
                            self.out(f"sub32_{n}({flat}, wd{v}, wm{v}, wq{v}, wr{v});", ind)
                        case BlockRead.BLK:
                            self.out(f"float wd{v}; uvec4 wq{v}, wr{v};", ind)
                            self.out(f"blk_{n}(({flat}) >> 5u, wd{v}, wq{v}, wr{v});", ind)
                        case _:
                            assert_never(read.read)
        for b in range(len(blks)):
            for r in range(rows):
                for j, read in terms:
                    t = read.term
                    n, v = buffer_id(t.weight.buffer), f"{j}_{r}_{b}"
                    a = f"{storage_id(t.acts)}_{b}"
                    acc = names[j][r]
                    match read.read:
                        case BlockRead.SUB32_Q6_K:
                            # per half of 16: scale x (dot - 32 x the half's activation quant sum)
                            self.out(f"int xh{v} = sum16_{n}(xa_{a});", ind)
                            lo = f"ws{v} * (dot16_{n}(wq{v}, xa_{a}) - 32 * xh{v})"
                            hi = f"wt{v} * (dot16_{n}(wr{v}, xb_{a}) - 32 * (xs_{a} - xh{v}))"
                            scaled = f"(wd{v} * xd_{a}) * float({lo} + {hi})"
                        case BlockRead.SUB32_Q4_K:
                            dot = f"float(dot_{n}(wq{v}, wr{v}, xa_{a}, xb_{a}))"
                            scaled = f"xd_{a} * (wd{v} * {dot} - wm{v} * float(xs_{a}))"
                        case BlockRead.BLK_Q4_0:
                            dot = f"float(dot_{n}(wq{v}, xa_{a}, xb_{a}) - 8 * xs_{a})"
                            scaled = f"(wd{v} * xd_{a}) * {dot}"
                        case BlockRead.BLK:
                            dot = f"float(dot_{n}(wq{v}, wr{v}, xa_{a}, xb_{a}))"
                            scaled = f"(wd{v} * xd_{a}) * {dot}"
                        case _:
                            assert_never(read.read)
                    self.out(f"{acc} = {acc} + {scaled};", ind)
        self.out("}", indent)

    def unrolled(
        self,
        p: kir.Contract,
        reds: list[ir.Reduce],
        loop: StepLoop,
        names: list[list[str]],
        k: str,
        rows: int,
        indent: int,
        ext: str,
        lanes: str,
    ) -> None:
        """`loop.unroll` steps per iteration in straight-line code, so that their wide loads
        are in flight together; the plain loop after it takes the remaining steps."""
        unroll, vec = loop.unroll, loop.vector
        if unroll <= 1:
            return
        step = f"{lanes} * {vec}u"
        js = list(loop.reduces)
        self.out(f"for (; {k} + {unroll - 1}u * {step} + {vec}u <= {ext}; ) {{", indent)
        for _ in range(unroll):
            self.out("{", indent + 1)
            self.contract_step(
                p, reds, js, names, k, rows, vec, indent + 2, guard=None, wide=loop.wide
            )
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
        wide: tuple[WideLoad, ...] = (),
    ) -> None:
        """One step of `vec` elements per lane.  With `wide`, those loads are issued first as
        whole vectors (as the plan reads them) and their elements reused."""
        values: dict[tuple[int, int], list[str]] = {}  # (id(load), row) -> element values
        for n, w in enumerate(wide):
            load, red = w.load, w.reduce
            assert red is not None
            for r in range(rows) if w.row_dependent else [-1]:
                pr = _Printer({p.row: f"row_{max(r, 0)}", red.var: k})
                flat = pr.flat(load.buffer.shape, load.indices)
                tmp = f"w{n}_{max(r, 0)}"
                values[(id(load), r)] = self.wide_load(w, flat, tmp, indent)
        for v in range(vec):
            idx = f"{k} + {v}u" if v else k
            if guard is not None:
                self.out(f"if ({idx} < {guard}) {{", indent)
            ind = indent + (1 if guard is not None else 0)
            for r in range(rows):
                for j in js:
                    red = reds[j]
                    pr = _Printer({p.row: f"row_{r}", red.var: f"({idx})"})
                    for w in wide:
                        got = values.get((id(w.load), r)) or values.get((id(w.load), -1))
                        if got is not None:
                            pr.overrides[id(w.load)] = got[v]
                    self.out(
                        f"{names[j][r]} = {combine(red.op, names[j][r], pr.as_float(red.body))};",
                        ind,
                    )
            if guard is not None:
                self.out("}", indent)
