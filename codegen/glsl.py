"""Kernel IR -> GLSL 450 compute shader text.

One expression printer (fully parenthesized), one op table, deterministic names:
`b_<buffer>` global buffers, `s_<stage>` shared arrays, `v_<stage>` per-lane locals,
`c_<const>` specialization constants, `i_<index>` index variables; a user name that a generated
name could equal is mangled (`buffer_id`).  Each phase is preceded by a `#line` that points at
its `.fuse` stage, so a shaderc error lands on the DSL line.

This module holds the kernel emitter (`emit_glsl`, `emit_kernel`): the shader header and the
dispatch over phases.  The rest sits beside it, split along its seams: `glsl_templates` (the op
table and helper-function templates), `glsl_expr` (the expression printer, names, literals,
derived constants), `glsl_writer` (the emitter's base: lines, reductions, stores, wide loads) and
the phase mixins `glsl_quant` (quantized stages), `glsl_tiles` (tile phases and exchanges) and
`glsl_contract` (contractions, integer-dot loops, split-K).

Not done here: choosing the subgroup size (the runtime, from the manifest) and any check that
needs a device.
"""

from __future__ import annotations

from fusec.dsl import ir
from fusec.dsl.types import DType, Scope

from . import glsl_packed, kir, manifest
from .glsl_contract import ContractEmitter
from .glsl_expr import (
    _CONSTS_END,
    _DERIVED,
    _ITEM,
    DERIVED_SPEC_BASE,
    LOOP_HINT,
    _Derived,
    _Printer,
    buffer_id,
    float_literal,
    global_invocation,
    pr_with,
    shared_id,
    user_index_vars,
    workgroup_count,
    workgroup_id,
)
from .glsl_quant import QuantEmitter
from .glsl_templates import (
    _ACT_BLOCKS,
    _BLOCK_DOT,
    _BLOCK_DOT_AFTER,
    _CALLED,
    _DEQUANT,
    _FUNCTION_TEXT,
    _GLSL_TYPE,
    _INT_DOT,
    _QUANT8,
    _QUANT8_BYTES,
    _SHARED_Q8,
    _SUB32_Q4K,
)
from .glsl_tiles import TileEmitter
from .glsl_writer import _UVEC
from .plan import KernelPlan, PhaseRun, RunKind, plan_kernel

# the stage's entry points, and the names build.py and the tests read from here
__all__ = [
    "DERIVED_SPEC_BASE",
    "buffer_id",
    "emit_glsl",
    "emit_kernel",
    "shared_id",
    "user_index_vars",
]


class _Emitter(QuantEmitter, TileEmitter, ContractEmitter):
    """The whole kernel: the header and the phases in order, each phase kind written by its
    mixin (glsl_quant, glsl_tiles, glsl_contract) on the shared base (glsl_writer)."""

    # --- header ---
    def blocks_text(self, buf: ir.Buffer) -> str:
        """The number of blocks of a quantized buffer, in GLSL (a packed layout's part i
        starts at that times the bytes of parts 0 .. i-1)."""
        printer = _Printer({})
        count = " * ".join(f"({printer.expr(d)})" for d in buf.shape)
        return f"(({count}) / {buf.dtype.block}u)"

    def packed_helpers(self, b: kir.Binding, int_dot: bool) -> None:
        """A packed weight's uvec4 view and readers (glsl_packed), in place of the GGUF ones."""
        buf = b.buffer
        assert buf.packing is not None
        n = buffer_id(buf)
        self.lines.append(
            f"layout(set = 0, binding = {self.binding(b)}, std430) readonly buffer "
            f"B_{n}_u4 {{ uvec4 b_{n}_u4[]; }};"
        )
        fmt = {"n": n, "nb": self.blocks_text(buf)}
        blk = glsl_packed.block_dot(buf.dtype, buf.packing)
        if int_dot and blk is not None:
            self.lines.append(blk.format(**fmt))
        self.lines.append(
            f"uint byte_{n}(uint o) {{ return (b_{n}[o >> 2u] >> ((o & 3u) * 8u)) & 0xffu; }}"
        )
        self.lines.append(glsl_packed.dequant(buf.dtype, buf.packing).format(**fmt))
        self.lines.append(glsl_packed.quant8(buf.dtype, buf.packing).format(**fmt))
        after = glsl_packed.block_dot_after(buf.dtype, buf.packing)
        if int_dot and after is not None:
            self.lines.append(after.format(**fmt))

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
        item = self.plan.item
        if item is None:
            self.lines.append(f"layout(local_size_x = {k.workgroup_size}) in;")
        for c in k.region.consts:
            if c.runtime:
                continue  # read from the parameter buffer, below
            if item is not None:  # the call's value, a plain constant
                value = item.const(c.name)
                text = f"{int(value)}u" if c.dtype.is_int else float_literal(float(value))
                kind = "uint" if c.dtype.is_int else "float"
                self.lines.append(f"const {kind} c_{c.name} = {text};")
            elif c.dtype.is_int:
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
            if b.buffer in scratch or (item is not None and b.buffer.name in item.coherent):
                # read by the last workgroup (kir.Arrive), or by another item of a product
                qual = "coherent " + qual
            n = buffer_id(b.buffer)
            self.lines.append(
                f"layout(set = 0, binding = {self.binding(b)}, std430) {qual}buffer B_{n} "
                f"{{ {_GLSL_TYPE[b.buffer.dtype]} b_{n}[]; }};"
            )
        if any(b.buffer.name == ir.PARAMS_BUFFER for b in k.bindings):
            for c in k.region.consts:
                if c.runtime and c.dtype.is_int:
                    self.lines.append(f"#define c_{c.name} b_{ir.PARAMS_BUFFER}[{c.spec_id}]")
                elif c.runtime:  # an f32 param: its bits in the slot's u32 word
                    self.lines.append(
                        f"#define c_{c.name} uintBitsToFloat(b_{ir.PARAMS_BUFFER}[{c.spec_id}])"
                    )
        if k.uses_int_dot:
            self.lines.append(_INT_DOT)
        for b in k.bindings:
            if b.buffer.dtype == DType.Q8_0X and b.reads:
                self.lines.append(_ACT_BLOCKS.format(n=buffer_id(b.buffer)))
            if b.buffer.dtype.is_quantized and b.buffer.packing is not None:
                self.packed_helpers(b, k.uses_int_dot)
            elif b.buffer.dtype.is_quantized:
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

    def binding(self, b: kir.Binding) -> int:
        """The binding number of `b`: the kernel's own, or the product's (plan.ItemPlan)."""
        item = self.plan.item
        return b.binding if item is None else item.binding(b.buffer.name)

    def select_rows(self, buf: ir.Buffer, row: ir.IndexVar, r: ir.Reduce) -> None:
        """Subgroup s of workgroup w takes rows w * subgroups + s, then a grid's worth of
        subgroups further; its lanes find the row's argmax together, and one stores it."""
        rv = self.ivar(row)
        pr = _Printer({row: rv})
        var = self.ivar(r.var)
        body = _Printer({row: rv, r.var: var}).as_float(r.body)
        self.out(
            f"for (uint {rv} = {workgroup_id()} * gl_NumSubgroups + gl_SubgroupID; "
            f"{rv} < {pr.expr(row.extent)}; {rv} += {workgroup_count()} * gl_NumSubgroups) {{"
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
    def phase_run(self, run: PhaseRun) -> None:
        """Independent phases rendered together (plan.PhaseRun): fills with one barrier after
        the last, fills over one extent in one loop; workgroup reductions through one
        exchange of s_reduce."""
        wg = self.k.workgroup_size
        phases = [self.k.phases[at] for at in run.phases]
        if run.kind == RunKind.REDUCTIONS:
            printers = [_Printer({}) for _ in phases]
            for p in phases:
                self.line(p)
            self.joined_reductions(
                [(p.value, pr) for p, pr in zip(phases, printers, strict=True)], 1
            )
            for p, pr in zip(phases, printers, strict=True):
                assert isinstance(p, kir.ScalarPhase)
                self.out(f"float v_{p.name} = {pr.as_float(p.value)};")
            return
        for loop in run.loops:
            first = self.k.phases[loop[0]]
            assert isinstance(first, kir.FillShared)
            iv = self.ivar(first.var)
            ext = _Printer({first.var: iv}).expr(first.var.extent)
            self.line(first)
            self.out(
                f"{LOOP_HINT}for (uint {iv} = gl_LocalInvocationIndex; "
                f"{iv} < {ext}; {iv} += {wg}u) {{"
            )
            for at in loop:
                fill = self.k.phases[at]
                assert isinstance(fill, kir.FillShared)
                self.line(fill)
                pr = _Printer({fill.var: iv})
                self.reductions(fill.value, pr, 2, "", "")
                self.out(f"s_{shared_id(fill.array.name)}[{iv}] = {pr.as_float(fill.value)};", 2)
            self.out("}")
        self.out("barrier();")

    def phase(self, at: int, p: kir.Phase) -> None:
        """Phase `at` of the kernel (its plan, if any, is the plan's record of that index)."""
        wg = self.k.workgroup_size
        grid_step = f"{workgroup_count()} * {wg}u"
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
                first = "gl_LocalInvocationIndex" if p.local else global_invocation(wg)
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
                    else (global_invocation(wg), grid_step)
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
                self.quantize_blocks(p, self.plan.quantize(at))
            case kir.TilePhase():
                self.tile_phase(p)
            case kir.SplitK():
                self.split_k(p)
            case kir.Contract():
                if p.layout.row_unit in (Scope.SUBGROUP, Scope.WORKGROUP):
                    self.contract_subgroup(p, self.plan.contract(at))
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
        slot, members = "0", workgroup_count()
        if p.group is not None:
            assert p.group_size is not None
            pr = _Printer({})
            size = pr.expr(p.group_size)
            # groups of `size` consecutive workgroups; the last group may be shorter
            self.out(f"uint group = {pr.expr(p.group)};", 2)
            slot, members = "group", f"min({size}, {workgroup_count()} - group * {size})"
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


def emit_glsl(
    kernel: kir.Kernel, line_directives: bool = True, plan: KernelPlan | None = None
) -> str:
    """The GLSL text of one kernel."""
    return emit_kernel(kernel, line_directives, plan)[0]


def emit_kernel(
    kernel: kir.Kernel, line_directives: bool = True, plan: KernelPlan | None = None
) -> tuple[str, tuple[ir.Expr, ...]]:
    """The GLSL text of one kernel rendered from `plan` (by default the build's code profile,
    `plan_kernel(kernel)`), and its derived constants (spec id DERIVED_SPEC_BASE + i holds the
    value of the i-th expression)."""
    if plan is None:
        plan = plan_kernel(kernel)
    derived = _Derived()
    token = _DERIVED.set(derived)
    item_token = _ITEM.set(plan.item is not None)
    called: set[str] = set()
    called_token = _CALLED.set(called)
    try:
        em = _Emitter(kernel, plan, line_directives)
        em.lines.append(
            "void main() {" if plan.item is None else "void item(uint item_wg, uint item_count) {"
        )
        for i, p in enumerate(kernel.phases):
            run = plan.run_at(i)
            if run is None:
                em.phase(i, p)
            elif run.phases[0] == i:
                em.phase_run(run)
        em.lines.append("}")
        body = em.lines
        em.lines = []
        em.directive = None
        em.header()
        # wide views alias a buffer's binding with uint vectors (same descriptor, other type)
        for name, words in sorted(em.views):
            b = next(b for b in kernel.bindings if b.buffer.name == name)
            if words == 4 and b.buffer.packing is not None:
                continue  # declared with the buffer (packed_helpers)
            n = buffer_id(b.buffer)
            coherent = plan.item is not None and name in plan.item.coherent
            em.lines.append(
                f"layout(set = 0, binding = {em.binding(b)}, std430) "
                f"{'coherent ' if coherent else ''}readonly buffer "
                f"B_{n}_u{words} {{ {_UVEC[words]} b_{n}_u{words}[]; }};"
            )
        for name in sorted(em.sub32):  # after the views they read
            b = next(b for b in kernel.bindings if b.buffer.name == name)
            if b.buffer.packing is not None:
                em.lines.append(
                    glsl_packed.sub32_q4k(b.buffer.packing).format(
                        n=buffer_id(b.buffer), nb=em.blocks_text(b.buffer)
                    )
                )
                continue
            em.lines.append(_SUB32_Q4K.format(n=buffer_id(b.buffer)))
        em.lines += [text for fn, text in _FUNCTION_TEXT.items() if fn in called]
    finally:
        _DERIVED.reset(token)
        _CALLED.reset(called_token)
        _ITEM.reset(item_token)
    defaults = {c.name: c.default for c in kernel.region.consts}
    if plan.item is not None:
        defaults = dict(plan.item.consts)

    def default(e: ir.Expr) -> int:
        # the runtime always sets it; a default that divides by zero is refused when run
        try:
            return manifest.eval_u32(manifest.expr_record(e), defaults)
        except ValueError:
            return 0

    # an item's are plain constants, like its region's (plan.ItemPlan)
    layout = [
        "" if plan.item is not None else f"layout(constant_id = {DERIVED_SPEC_BASE + i}) "
        for i in range(len(derived.exprs))
    ]
    decls = [
        f"{layout[i]}const uint d_{i} = {default(e)}u;  // {_Printer({}).expr(e)}"
        for i, e in enumerate(derived.exprs)
    ]
    # after the region's own constants, before anything that may use them
    at = em.lines.index(_CONSTS_END)
    lines = em.lines[:at] + decls + em.lines[at + 1 :]
    return "\n".join(lines + body) + "\n", tuple(derived.exprs)
