"""Kernel IR -> text: a stable, readable printer for goldens (tests/golden/) and `fusec build
--dump kir`.

Input: a `kir.Kernel`.  Output: one block of lines per kernel: its header (workgroup, subgroup,
loop, flags), its bindings, shared arrays, grid and phases, with every expression fully
parenthesized.  Names are printed as written (no mangling, unlike the GLSL); `$name` is a
per-lane local, `shared.NAME[...]` a shared array element, `tile.NAME[...]` a tile value.

Each planned phase is followed by its scheduling plan (`plan.py`: loops by extent, wide loads,
unrolled steps, tails, integer dot product block reads), under the build's code profile unless
another plan is given, so a change of schedule shows in the goldens as `plan:` lines.

Not printed: spans (a golden must not change when a comment moves a line).  Not checked: the
kernel's invariants (`codegen/validate.py`).
"""

from __future__ import annotations

from typing import assert_never

from fusec.dsl import ir
from fusec.dsl.types import DType

from . import kir
from .plan import (
    ContractPlan,
    IntDotLoop,
    KernelPlan,
    PhasePlan,
    QuantizePlan,
    ReadPath,
    WideLoad,
    plan_kernel,
)


def format_kexpr(e: kir.KExpr) -> str:
    """A kernel-IR expression, fully parenthesized; integer literals carry their dtype (`4u`)
    so that `x / 4u` (integer division) and `x / 4.0` read differently."""
    match e:
        case kir.LocalRef(name, _):
            return f"${name}"
        case kir.SharedLoad(array, index):
            return f"shared.{array.name}[{format_kexpr(index)}]"
        case kir.WorkgroupIndex():
            return "workgroup_id"
        case kir.TileRef(var, indices):
            return f"tile.{var}[{', '.join(format_kexpr(i) for i in indices)}]"
        case kir.SliceBase(rows):
            return f"slice_base({rows})"
        case ir.Lit(value, dtype):
            if dtype == DType.F32:
                return repr(float(value))
            return f"{value}{'u' if dtype == DType.U32 else 'i' if dtype == DType.I32 else ''}"
        case ir.ConstRef(const):
            return f"param.{const.name}" if const.runtime else const.name
        case ir.IndexRef(var):
            return var.name
        case ir.Load(buffer, indices):
            return f"{buffer.name}[{', '.join(format_kexpr(i) for i in indices)}]"
        case ir.StageRef(stage, indices):
            # never in a lowered kernel (lowering resolves every stage reference); printed so
            # that a broken kernel can still be shown
            suffix = f"[{', '.join(format_kexpr(i) for i in indices)}]" if indices else ""
            return f"stage.{stage.name}{suffix}"
        case ir.Call(fn, args, dtype):
            typed = "" if dtype == DType.F32 else f":{dtype.value}"
            return f"{fn}{typed}({', '.join(format_kexpr(a) for a in args)})"
        case ir.BinOp(op, lhs, rhs, _):
            return f"({format_kexpr(lhs)} {op} {format_kexpr(rhs)})"
        case ir.Neg(value):
            return f"(-{format_kexpr(value)})"
        case ir.Reduce(op, var, body, scope, k=k):
            count = f"{format_kexpr(k)}, " if k is not None else ""
            return (
                f"{op}({count}{var.name} < {format_kexpr(var.extent)}: {format_kexpr(body)}) "
                f"@ {scope.value}"
            )
        case _:
            assert_never(e)


def _var(v: ir.IndexVar) -> str:
    return f"{v.name} < {format_kexpr(v.extent)}"


def _buffer(b: ir.Buffer, region: ir.Region) -> str:
    shape = ", ".join(format_kexpr(d) for d in b.shape)
    if b.is_output:
        kind = "output"
    elif b in region.inputs:
        kind = "input"
    elif b is region.params:
        kind = "parameters"
    else:
        kind = "intermediate"
    extras = " state" if b.state else ""
    if b.packing is not None:
        extras += f" packed {b.packing.value}"  # repacked at upload (dsl/packing.py)
    return f"{b.name}: {b.dtype.value}[{shape}] {kind}{extras}"


def _shared(a: kir.SharedArray) -> str:
    stored = f" as {a.stored.value}" if a.stored is not None else ""
    return (
        f"{a.name}: {a.dtype.value}[{format_kexpr(a.size)}]{stored}, {format_kexpr(a.words)} words"
    )


def _target(t: ir.Buffer | kir.SharedArray) -> str:
    return f"shared.{t.name}" if isinstance(t, kir.SharedArray) else t.name


def _tile_stmts(body: tuple[kir.TileStmt, ...], indent: str) -> list[str]:
    out: list[str] = []
    for st in body:
        match st:
            case kir.TileAssign(var, value):
                out.append(f"{indent}tile.{var} = {format_kexpr(value)}")
            case kir.TileRepeat(count, inner):
                out.append(f"{indent}repeat {format_kexpr(count)}:")
                out.extend(_tile_stmts(inner, indent + "  "))
            case kir.TileStore(buffer, indices, value):
                at = ", ".join(v.name for v in indices)
                out.append(f"{indent}store {buffer.name}[{at}] = {format_kexpr(value)}")
            case _:
                assert_never(st)
    return out


def format_phase(p: kir.Phase, indent: str = "    ") -> list[str]:
    """The lines of one phase (a tile program takes several)."""
    match p:
        case kir.ScalarPhase(name, value):
            return [f"{indent}scalar ${name} = {format_kexpr(value)}"]
        case kir.SelectRows(buffer, row, reduce):
            return [f"{indent}select rows {buffer.name}[{_var(row)}] = {format_kexpr(reduce)}"]
        case kir.TopKPhase(name, reduce, values, indices):
            return [
                f"{indent}select shared.{values.name}, shared.{indices.name} = "
                f"{format_kexpr(reduce)}",
                f"{indent}  then barrier",
            ]
        case kir.FillShared(array, var, value):
            return [
                f"{indent}fill shared.{array.name}[{_var(var)}] = {format_kexpr(value)}",
                f"{indent}  then barrier",
            ]
        case kir.StoreScalar(buffer, value, local=local):
            scope = " (this workgroup)" if local else ""
            return [f"{indent}store {buffer.name}[0]{scope} = {format_kexpr(value)}"]
        case kir.StoreMap(buffer, var, value, local=local, index=index, mask=mask):
            where = "" if index is None else f" at {format_kexpr(index)}"
            if mask is not None:
                where += f" where {format_kexpr(mask)}"
            scope = " (this workgroup)" if local else ""
            return [
                f"{indent}store {buffer.name}[{_var(var)}]{where}{scope} = {format_kexpr(value)}"
            ]
        case kir.Contract(target, row, value, layout, rows, slice=sliced, index=index):
            head = (
                f"{indent}contract {_target(target)}[{_var(row)}] rows {rows}, "
                f"{row.name} -> {layout.row_unit.value}, x {layout.vector}"
            )
            if sliced:
                head += ", this workgroup's slice"
            if index is not None:
                head += f", at {format_kexpr(index)}"
            if p.staging is not None:
                head += f", rounded to q8_0 blocks through shared '{p.staging.name}'"
            lines = [f"{head} = {format_kexpr(value)}"]
            terms = kir.int_dot_terms(p)
            if terms:
                lines.append(
                    f"{indent}  integer dot: "
                    + ", ".join(f"{t.weight.buffer.name} . {_target(t.acts)}" for t in terms)
                )
            if isinstance(target, kir.SharedArray):
                lines.append(f"{indent}  then barrier")
            return lines
        case kir.TilePhase(tile, body, exchange):
            dims = ", ".join(
                f"{d.name}: {tile.extent_of(d)} lane*{lane}"
                + (f" slot*{tile.slot_strides[i]}" if tile.slot_strides else "")
                for i, (d, lane) in enumerate(zip(tile.dims, tile.strides, strict=True))
            )
            return [
                f"{indent}tile ({dims}) per {_var(tile.per)}, {tile.lanes} lanes, "
                f"{tile.slots} slots, exchange {exchange}:",
                *_tile_stmts(body, indent + "  "),
            ]
        case kir.SplitK(buffer, row, var, slice_array, value):
            return [
                f"{indent}split_k {buffer.name}[{_var(row)}] += sum({_var(var)} in "
                f"shared.{slice_array.name}: {format_kexpr(value)}) (float atomics)"
            ]
        case kir.QuantizeBlocks(target, var, value):
            lines = [
                f"{indent}quantize {_target(target)}[{_var(var)}] as q8_0 = {format_kexpr(value)}"
            ]
            if isinstance(target, kir.SharedArray):
                lines.append(f"{indent}  then barrier")
            return lines
        case kir.Arrive(counter, scratch, group=group):
            who = "workgroup" if group is None else f"of each group {format_kexpr(group)}"
            return [
                f"{indent}arrive {counter.name} after {', '.join(b.name for b in scratch)}: "
                f"the last {who} goes on, the others end"
            ]
        case _:
            assert_never(p)


def _wide(w: WideLoad) -> str:
    how = f"{4 * w.chunk_words}-byte loads" if w.read == ReadPath.WORDS else w.read.value
    rows = ", per row" if w.row_dependent else ""
    return f"{format_kexpr(w.load)} ({how}{rows})"


def _aligned(lengths: tuple[ir.Expr, ...], vector: int) -> str:
    return " and ".join(f"{format_kexpr(e)} % {vector} == 0" for e in lengths)


def format_plan(p: kir.Phase, planned: PhasePlan, indent: str = "      ") -> list[str]:
    """The lines of one phase's plan."""
    match planned:
        case ContractPlan(_, loops):
            assert isinstance(p, kir.Contract)
            reds = kir.reduces_in(p.value)
            out = []
            for n, loop in enumerate(loops):
                var = reds[loop.reduces[0]].var
                head = (
                    f"{indent}plan: loop k{n} over {_var(var)}, reductions "
                    f"{', '.join(map(str, loop.reduces))}"
                )
                if isinstance(loop, IntDotLoop):
                    reads = ", ".join(
                        f"{t.term.weight.buffer.name} {t.read.value}" for t in loop.terms
                    )
                    out.append(f"{head}: integer dot, a block of 32 a step ({reads})")
                    out.append(f"{indent}  unroll {loop.unroll} blocks, then one at a time")
                    continue
                out.append(f"{head}: x {loop.vector} a step")
                if loop.wide:
                    out.append(f"{indent}  wide {', '.join(_wide(w) for w in loop.wide)}")
                if loop.whole_blocks:
                    out.append(f"{indent}  whole blocks: always aligned, no tail")
                    continue
                if loop.wide:
                    cond = _aligned(loop.aligned, loop.vector) or "always"
                    out.append(
                        f"{indent}  wide path if {cond}: unroll {loop.unroll} steps, then one "
                        "at a time; else plain steps"
                    )
                if loop.tail:
                    out.append(f"{indent}  tail: a guarded last step")
            return out
        case QuantizePlan(_, wide, aligned):
            assert isinstance(p, kir.QuantizeBlocks)
            if not wide:
                return []
            cond = _aligned((p.var.extent, *(e for e in aligned if e != p.var.extent)), 4)
            return [f"{indent}plan: wide {', '.join(_wide(w) for w in wide)} if {cond}"]
        case _:
            assert_never(planned)


def format_kernel(k: kir.Kernel, plan: KernelPlan | None = None) -> str:
    """One kernel as text with its plan (by default the build's code profile), ending with a
    newline."""
    if plan is None:
        plan = plan_kernel(k)
    sg = k.subgroup
    subgroup = sg.kind + (f" {','.join(map(str, sg.sizes))}" if sg.sizes else "")
    if sg.fallback:
        subgroup += f" else {sg.fallback}"
    lines = [
        f"kernel {k.name}",
        f"  region {k.region.name}, stages {', '.join(k.stages) or '-'}",
        f"  workgroup {k.workgroup_size}, subgroup {subgroup}",
    ]
    if k.loop is not None:
        count = format_kexpr(k.loop_count) if k.loop_count is not None else "?"
        lines.append(f"  loop {k.loop} x {count}")
    flags = [
        name
        for name, on in (
            ("reduction_scratch", k.reduction_scratch),
            ("exchange_scratch", k.exchange_scratch),
            ("float_atomics", k.atomics),
            ("f16_storage", k.uses_f16),
            ("integer_dot", k.uses_int_dot),
            ("vulkan_memory_model", bool(k.counters)),
        )
        if on
    ]
    if flags:
        lines.append(f"  needs {', '.join(flags)}")
    if k.zero_outputs:
        lines.append(f"  zeroed before: {', '.join(k.zero_outputs)}")
    lines.append("  bindings:")
    for b in k.bindings:
        access = "/".join(a for a, on in (("read", b.reads), ("write", b.writes)) if on)
        lines.append(f"    {b.binding}: {_buffer(b.buffer, k.region)}, {access or 'unused'}")
    if k.shared:
        lines.append("  shared:")
        lines.extend(f"    {_shared(a)}" for a in k.shared)
    lines.append("  grid:")
    for g in k.grid:
        if g.rows_per_subgroup is not None:
            per = f"{g.rows_per_subgroup} per subgroup"
        else:
            per = f"{g.per_workgroup} per workgroup"
        lines.append(f"    {format_kexpr(g.extent)} items, {per}")
    if k.plan:
        lines.append("  plan:")
        lines.extend(f"    {sp.stage}: {sp.distribution.value}" for sp in k.plan)
    if plan.lane_loops:
        unrolled = [format_kexpr(x.extent) for x in plan.lane_loops if x.unrolled]
        kept = [format_kexpr(x.extent) for x in plan.lane_loops if not x.unrolled]
        lines.append(
            "  plan: lane loops"
            + (f", unrolled over {', '.join(unrolled)}" if unrolled else "")
            + (f", kept loops over {', '.join(kept)}" if kept else "")
        )
    lines.append("  phases:")
    for at, p in enumerate(k.phases):
        phase = format_phase(p)
        planned = plan.of(at)
        if planned is not None:
            # the plan's loops come before the barrier that ends the phase
            end = len(phase) - 1 if phase[-1].endswith("then barrier") else len(phase)
            phase[end:end] = format_plan(p, planned)
        run = plan.run_at(at)
        if run is not None and at != run.phases[-1]:
            # rendered with the next phase of its run (plan.PhaseRun): no barrier between them
            if phase[-1].endswith("then barrier"):
                phase[-1] = phase[-1].replace("then barrier", "then the next fill, no barrier")
            else:
                phase.append("      joined with the next: one exchange through s_reduce")
        lines.extend(phase)
    return "\n".join(lines) + "\n"


def format_kernels(kernels: list[kir.Kernel]) -> str:
    """Kernels one after another, separated by a blank line."""
    return "\n".join(format_kernel(k) for k in kernels)
