"""The base of the kernel emitter: the lines being written, `#line` directives, index-variable
names, and the statements every phase kind shares (reductions, stores converted to the buffer's
type, wide loads).  `glsl.py`'s `_Emitter` is this class with the phase mixins of
`glsl_quant`, `glsl_tiles` and `glsl_contract`.

Input: a `kir.Kernel`.  Output: GLSL statement lines.  Not done here: the shader header and the
phase dispatch (`glsl.py`)."""

from __future__ import annotations

from fusec.dsl import ir
from fusec.dsl.types import DType, Scope

from . import kir
from .glsl_expr import (
    LOOP_HINT,
    SERIAL_HINT,
    _mangled,
    _Printer,
    buffer_id,
    combine,
    shared_id,
    spec_constant_only,
    user_index_vars,
)
from .glsl_templates import _INIT, _SUBGROUP_OP
from .plan import KernelPlan, ReadPath, WideLoad

_UVEC = {1: "uint", 2: "uvec2", 4: "uvec4"}


class KernelWriter:
    """GLSL lines of one kernel, written phase by phase."""

    def __init__(self, kernel: kir.Kernel, plan: KernelPlan, line_directives: bool) -> None:
        self.k = kernel
        self.plan = plan  # every scheduling decision (plan.py); this class renders it
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

    def serial_hint(self, extent: ir.Expr) -> str:
        """The unroll hint of a loop of one lane over `extent`, as the plan has it."""
        return SERIAL_HINT[self.plan.lane_loop(extent).unrolled]

    def out(self, text: str, indent: int = 1) -> None:
        if self.directive is not None:
            # before every line: a compiler error anywhere in the phase maps to its stage
            self.lines.append(self.directive)
        self.lines.append("    " * indent + text)

    def line(self, phase: kir.Phase) -> None:
        if self.line_directives:
            line, _ = phase.span.line_col()
            self.directive = f'#line {line} "{phase.span.path}"'

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
            if r.op in ("argmax", "argmin"):
                name = f"r{self.n_red}"
                self.n_red += 1
                var = self.ivar(r.var)
                body = _Printer({**printer.env, r.var: var}, printer.reduce_names).as_float(r.body)
                ext = printer.expr(r.var.extent)
                self.select_loop(name, r, var, body, ext, scope, indent, lane_start, lane_step)
                printer.reduce_names[id(r)] = f"{name}_i"
                continue
            name = self.reduction_loop(r, scope, printer, indent, lane_start, lane_step)
            if scope == Scope.WORKGROUP:
                self.exchange([(name, r.op)], indent)

    def joined_reductions(self, values: list[tuple[kir.KExpr, _Printer]], indent: int) -> None:
        """The workgroup reductions of several independent values (plan.PhaseRun), their
        subgroup results exchanged through s_reduce at once: one pair of barriers for all."""
        wg = f"{self.k.workgroup_size}u"
        names = [
            (self.reduction_loop(r, r.scope, pr, indent, "gl_LocalInvocationIndex", wg), r.op)
            for value, pr in values
            for r in kir.reduces_in(value)
        ]
        self.exchange(names, indent)

    def reduction_loop(
        self,
        r: ir.Reduce,
        scope: Scope,
        printer: _Printer,
        indent: int,
        lane_start: str,
        lane_step: str,
    ) -> str:
        """Reduction `r` (a sum, maximum or minimum) into a new local, over this lane's share
        of `scope`, then over its subgroup; the local's name (the printer reads it there)."""
        name = f"r{self.n_red}"
        self.n_red += 1
        var = self.ivar(r.var)
        body = _Printer({**printer.env, r.var: var}, printer.reduce_names).as_float(r.body)
        ext = printer.expr(r.var.extent)
        self.out(f"float {name} = {_INIT[r.op]};", indent)
        self.scope_loop(r.var, var, ext, scope, indent, lane_start, lane_step, LOOP_HINT)
        self.out(f"{name} = {combine(r.op, name, body)};", indent + 1)
        self.out("}", indent)
        if scope in (Scope.SUBGROUP, Scope.WORKGROUP):
            self.out(f"{name} = {_SUBGROUP_OP[r.op]}({name});", indent)
        printer.reduce_names[id(r)] = name
        return name

    def scope_loop(
        self,
        index: ir.IndexVar,
        var: str,
        ext: str,
        scope: Scope,
        indent: int,
        lane_start: str,
        lane_step: str,
        workgroup_hint: str = "",
    ) -> None:
        """The head of a loop of `var` below `ext` over this lane's share of `scope`: alone
        (its hint the plan's lane loop), over its subgroup's lanes, or from `lane_start` by
        `lane_step` (a workgroup's lanes or a given stride; `workgroup_hint` before it)."""
        if scope == Scope.LANE:
            hint = self.serial_hint(index.extent)
            self.out(f"{hint}for (uint {var} = 0u; {var} < {ext}; ++{var}) {{", indent)
        elif scope == Scope.SUBGROUP:
            self.out(
                f"for (uint {var} = gl_SubgroupInvocationID; {var} < {ext}; "
                f"{var} += gl_SubgroupSize) {{",
                indent,
            )
        else:
            self.out(
                f"{workgroup_hint}for (uint {var} = {lane_start}; {var} < {ext}; "
                f"{var} += {lane_step}) {{",
                indent,
            )

    def exchange(self, names: list[tuple[str, str]], indent: int) -> None:
        """Subgroup results `names` (local, op) combined over the workgroup through s_reduce:
        the n-th in words n * subgroups on (at most plan.MAX_JOINED_REDUCTIONS at once)."""
        if len(names) == 1:
            name, op = names[0]
            self.out(f"if (subgroupElect()) {{ s_reduce[gl_SubgroupID] = {name}; }}", indent)
            self.out("barrier();", indent)
            self.out(f"{name} = s_reduce[0];", indent)
            self.out("for (uint s = 1u; s < gl_NumSubgroups; ++s) {", indent)
            self.out(f"{name} = {combine(op, name, 's_reduce[s]')};", indent + 1)
            self.out("}", indent)
            self.out("barrier();  // s_reduce is reused by the next reduction", indent)
            return
        self.out("if (subgroupElect()) {", indent)
        for n, (name, _) in enumerate(names):
            self.out(f"s_reduce[{n}u * gl_NumSubgroups + gl_SubgroupID] = {name};", indent + 1)
        self.out("}", indent)
        self.out("barrier();", indent)
        for n, (name, op) in enumerate(names):
            self.out(f"{name} = s_reduce[{n}u * gl_NumSubgroups];", indent)
            self.out("for (uint s = 1u; s < gl_NumSubgroups; ++s) {", indent)
            acc = f"s_reduce[{n}u * gl_NumSubgroups + s]"
            self.out(f"{name} = {combine(op, name, acc)};", indent + 1)
            self.out("}", indent)
        self.out("barrier();  // s_reduce is reused by the next reduction", indent)

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
        self.scope_loop(r.var, var, ext, scope, indent, lane_start, lane_step)
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
        # no value compared better than the start (every one NaN): index 0, as numpy's argmax
        # of all-NaN values, never the start's 0xffffffff, which a read through it would
        # take past its buffer's end
        in_range = f"if ({name}_i == 0xffffffffu) {{ {name}_i = 0u; }}"
        if scope == Scope.LANE:
            self.out(in_range, indent)
            return
        # across lanes: the best value, then the lowest index among the lanes that hold it
        op = "subgroupMax" if big else "subgroupMin"
        self.out(f"{{ float {name}_m = {op}({name}_v);", indent)
        self.out(
            f"  {name}_i = subgroupMin({name}_v == {name}_m ? {name}_i : 0xffffffffu);", indent
        )
        self.out(f"  {name}_v = {name}_m; }}", indent)
        if scope != Scope.WORKGROUP:
            self.out(in_range, indent)
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
            self.out(in_range, indent)
            self.out("barrier();  // s_reduce is reused by the next reduction", indent)

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

    def wide_load(self, w: WideLoad, flat: str, tmp: str, indent: int) -> list[str]:
        """Load `w.elements` consecutive elements starting at `flat` (a multiple of them) as the
        plan reads them; returns the GLSL value of each element."""
        buf, vec = w.load.buffer, w.elements
        n = buffer_id(buf)
        if w.read == ReadPath.SUB32:  # a whole q4_K sub-block: _SUB32_Q4K
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
        if w.read in (ReadPath.QUANT, ReadPath.QUANT8):
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

            if w.read == ReadPath.QUANT:
                return [value(f"quant_{n}({tmp}_e + {j}u)", j) for j in range(vec)]
            values = []
            for c in range(vec // 8):
                self.out(f"vec4 {tmp}_l{c}, {tmp}_h{c};", indent)
                self.out(f"quant8_{n}({tmp}_e + {8 * c}u, {tmp}_l{c}, {tmp}_h{c});", indent)
                values += [value(f"{tmp}_l{c}.{'xyzw'[j]}", 8 * c + j) for j in range(4)]
                values += [value(f"{tmp}_h{c}.{'xyzw'[j]}", 8 * c + 4 + j) for j in range(4)]
            return values
        eb = buf.dtype.bytes
        words = w.chunk_words
        self.views.add((buf.name, words))
        per_chunk = 4 * words // eb
        out = []
        for c in range(vec // per_chunk):
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
