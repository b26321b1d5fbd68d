"""Region IR -> kernel IR, two ways from one source.

`lower_fused(region)`: as few kernels as the placements allow.  Register values stay per lane
(an indexed register value is recomputed where it is used), shared values are materialized once
per workgroup, and a `global` intermediate splits the region into consecutive kernels (a later
kernel computes again the scalars, shared arrays and slices it reads from an earlier one).

`lower_unfused(region)`: one kernel per indexed stage and per reduction, whatever its
placement; intermediates become global buffers (`intermediate_buffer`), and the runtime puts a
barrier between dependent kernels.  This chain is the fallback and the oracle.

Not checked here: device limits and budgets (the runtime and the estimator).  Lowering failures
that a user can cause were already diagnosed by `dsl.check`; the rest are AssertionErrors.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from fusec.dsl import ir
from fusec.dsl.diagnostics import Diagnostic, DiagnosticError
from fusec.dsl.span import Span
from fusec.dsl.types import DType, Placement, Scope

from . import kir
from .grid_plan import counter_buffer, plan_grid
from .manifest import intermediate_buffer  # one definition: the manifest checks against it


@attrs.define
class _KernelBuilder:
    region: ir.Region
    name: str
    # where each stage's value lives inside this kernel
    locals: dict[ir.Stage, str] = attrs.Factory(dict)
    shared: dict[ir.Stage, kir.SharedArray] = attrs.Factory(dict)
    globals_: dict[ir.Stage, ir.Buffer] = attrs.Factory(dict)
    phases: list[kir.Phase] = attrs.Factory(list)
    grid: list[kir.GridItem] = attrs.Factory(list)
    reads: list[ir.Buffer] = attrs.Factory(list)
    writes: list[ir.Buffer] = attrs.Factory(list)
    stage_names: list[str] = attrs.Factory(list)
    per: ir.IndexVar | None = None  # a per-workgroup index: this workgroup's own value
    sliced: dict[ir.Stage, kir.SharedArray] = attrs.Factory(dict)  # `in slices` stages
    zero: list[str] = attrs.Factory(list)
    # after an arrival (kir.Arrive): one workgroup runs the rest, covering every index alone
    last: bool = False
    # the value of `per` where it is not this workgroup's id (a group's, after an arrival)
    per_value: kir.KExpr | None = None
    plan: tuple[kir.StagePlan, ...] = ()
    # a topk (rank None) -> its values and indices in shared memory
    topks: dict[ir.Reduce, tuple[kir.SharedArray, kir.SharedArray]] = attrs.Factory(dict)
    extra_shared: list[kir.SharedArray] = attrs.Factory(list)  # topk results

    # --- expressions: resolve stage references to where the value lives ---
    def resolve(self, e: kir.KExpr, subst: dict[ir.IndexVar, kir.KExpr] | None = None) -> kir.KExpr:
        subst = subst or {}
        match e:
            case ir.IndexRef(var) if var in subst:
                return subst[var]
            case ir.IndexRef(var) if var is self.per:
                return self.per_value or kir.WorkgroupIndex()
            case ir.ConstRef(c) if c.runtime:
                assert self.region.params is not None
                self.read(self.region.params)
                return e
            case (
                ir.Lit()
                | ir.ConstRef()
                | ir.IndexRef()
                | kir.LocalRef()
                | kir.WorkgroupIndex()
                | kir.SliceBase()
            ):
                return e
            case ir.Load(buf, idx):
                self.read(buf)
                return ir.Load(buf, tuple(self.resolve(i, subst) for i in idx))  # type: ignore[misc]
            case ir.StageRef(stage, idx):
                ridx = tuple(self.resolve(i, subst) for i in idx)
                if stage in self.locals:
                    return kir.LocalRef(self.locals[stage], stage.dtype)
                if stage in self.sliced:
                    # this workgroup's slice: rows base .. base + rows per workgroup
                    rows = self.region.launch.rows_per_subgroup
                    local = ir.BinOp("-", ridx[0], kir.SliceBase(rows), DType.U32)  # type: ignore[arg-type]
                    return kir.SharedLoad(self.sliced[stage], local)
                if stage in self.shared:
                    shape, idx_ = stage.shape, ridx
                    if self.per is not None and stage.indices[:1] == (self.per,):
                        shape, idx_ = shape[1:], ridx[1:]  # the workgroup holds its own slice
                    return kir.SharedLoad(self.shared[stage], flat_index(shape, idx_))
                if stage in self.globals_:
                    buf = self.globals_[stage]
                    self.read(buf)
                    return ir.Load(buf, ridx or (ir.Lit(0, DType.U32),))  # type: ignore[arg-type]
                if stage.placement != Placement.REGISTER or self.held(stage):
                    # a value an earlier kernel of the fused product held in registers or
                    # shared memory (a `global` stage split the product since): this kernel
                    # computes it again, as the unfused chain recomputes its scalars
                    self.recompute(stage)
                    return self.resolve(e, subst)
                # an indexed register value: recompute it here with its indices substituted
                assert stage.placement == Placement.REGISTER and not stage.is_scalar, stage.name
                inner = dict(zip(stage.indices, ridx, strict=True))
                return self.resolve(stage.value, inner)
            case ir.Call(fn, args, dt):
                return ir.Call(fn, tuple(self.resolve(a, subst) for a in args), dt)  # type: ignore[misc]
            case ir.BinOp(op, lhs, rhs, dt):
                return ir.BinOp(op, self.resolve(lhs, subst), self.resolve(rhs, subst), dt)  # type: ignore[arg-type]
            case ir.Neg(v):
                return ir.Neg(self.resolve(v, subst))  # type: ignore[arg-type]
            case ir.Reduce(_, _, body, rank=rank) if rank is not None:
                # topk, argtopk: computed once per kernel by every lane, read at the rank
                topk_body = self.resolve(body, subst)
                return self.topk(attrs.evolve(e, body=topk_body, rank=None), e, subst)  # type: ignore[arg-type]
            case ir.Reduce(_, _, body):
                return attrs.evolve(e, body=self.resolve(body, subst))  # type: ignore[arg-type]
            case kir.SharedLoad(arr, idx):
                return kir.SharedLoad(arr, self.resolve(idx, subst))
        raise AssertionError(e)

    def topk(self, red: ir.Reduce, at: ir.Reduce, subst: dict[ir.IndexVar, kir.KExpr]) -> kir.KExpr:
        """`at` (a topk or argtopk at its rank) read from the `TopKPhase` of `red` (the same
        without a rank), which this kernel computes once for both: equal bodies share it."""
        key = attrs.evolve(red, op="topk")
        if key not in self.topks:
            name = f"tk{len(self.topks)}"
            assert red.k is not None
            k = red.k
            values = kir.SharedArray(f"#{name}", k)
            indices = kir.SharedArray(f"#{name}_i", k, dtype=DType.U32)
            self.topks[key] = (values, indices)
            self.extra_shared += [values, indices]
            span = at.span or self.region.span
            self.phases.append(kir.TopKPhase(name, key, values, indices, span=span))
        assert at.rank is not None
        arr = self.topks[key][1 if at.op == "argtopk" else 0]
        return kir.SharedLoad(arr, self.resolve(at.rank, subst))

    def value(
        self, stage: ir.Stage, subst: dict[ir.IndexVar, kir.KExpr] | None = None
    ) -> kir.KExpr:
        """A stage's value where this kernel computes it: stage references resolved, and a
        reduction that several reads inlined computed once (kir.share_reductions)."""
        return kir.share_reductions(self.resolve(stage.value, subst))

    def held(self, stage: ir.Stage) -> bool:
        """Whether a register or shared stage lives in a local: a scalar, or per workgroup a
        value of the workgroup's own index (otherwise a shared array holds it, or, in registers,
        it is recomputed where it is read)."""
        return stage.is_scalar or (self.per is not None and stage.indices == (self.per,))

    def recompute(self, stage: ir.Stage) -> None:
        """Compute a register, shared or sliced stage into this kernel, as `lower_fused` does."""
        assert stage.placement != Placement.GLOBAL and stage.output is None, stage.name
        if stage.placement == Placement.SLICES:
            self.slice_stage(stage)
        elif self.held(stage):
            self.scalar(stage)
        else:
            self.fill_shared(stage)

    def visible(self, stage: ir.Stage) -> ir.Stage:
        """`stage` without the per-workgroup index (the workgroup's value is fixed)."""
        if self.per is not None and stage.indices[:1] == (self.per,):
            return attrs.evolve(stage, indices=stage.indices[1:])
        return stage

    def read(self, buf: ir.Buffer) -> None:
        if buf not in self.reads:
            self.reads.append(buf)

    def write(self, buf: ir.Buffer) -> None:
        if buf not in self.writes:
            self.writes.append(buf)

    # --- phases ---
    def scalar(self, stage: ir.Stage) -> None:
        value = self.value(stage)
        local = f"{stage.name}"
        self.phases.append(kir.ScalarPhase(local, value, span=stage.span))
        self.locals[stage] = local

    def fill_shared(self, stage: ir.Stage) -> None:
        var, subst = flatten(self.visible(stage))
        arr = kir.SharedArray(stage.name, var.extent, stage.stored)
        value = self.value(stage, subst)
        if stage.stored is not None:
            self.phases.append(kir.QuantizeBlocks(arr, var, value, span=stage.span))
        elif all(r.scope == Scope.LANE for r in kir.reduces_in(value)):
            self.phases.append(kir.FillShared(arr, var, value, span=stage.span))
        else:
            # a contraction whose every row the workgroup computes into shared memory
            rows = self.region.launch.rows_per_subgroup
            layout = resolve_layout(stage)
            self.phases.append(kir.Contract(arr, var, value, layout, rows, span=stage.span))
        self.shared[stage] = arr

    def slice_stage(self, stage: ir.Stage) -> None:
        """`in slices`: the rows this workgroup's subgroups own, kept in shared memory."""
        var, subst = flatten(stage)
        rows = self.region.launch.rows_per_subgroup
        arr = kir.SharedArray(
            stage.name, ir.Lit(rows * self.region.launch.workgroup_size, DType.U32)
        )
        value = self.value(stage, subst)
        layout = resolve_layout(stage)
        self.phases.append(kir.Contract(arr, var, value, layout, rows, span=stage.span, slice=True))
        self.grid.append(kir.GridItem(var.extent, None, rows))
        self.sliced[stage] = arr

    def split_k(self, stage: ir.Stage, buf: ir.Buffer) -> bool:
        """`y[n] = sum(f: W[n, f] * hh[f])` over a sliced `hh`: partial sums added with float
        atomics.  False when the stage is not of that form."""
        value = stage.value
        if not (isinstance(value, ir.Reduce) and value.op == "sum" and len(stage.indices) == 1):
            return False
        refs = [e for e in ir.walk(value.body) if isinstance(e, ir.StageRef)]
        sliced = [r for r in refs if r.stage.placement == Placement.SLICES]
        if not sliced:
            return False
        if sliced[0].stage not in self.sliced:
            self.recompute(sliced[0].stage)  # a kernel after a `global` stage
        arr = self.sliced[sliced[0].stage]
        body = self.resolve(value.body)
        self.write(buf)
        self.stage_names.append(stage.name)
        self.zero.append(buf.name)
        self.phases.append(kir.SplitK(buf, stage.indices[0], value.var, arr, body, span=stage.span))
        return True

    def store(self, stage: ir.Stage, buf: ir.Buffer) -> None:
        """Write `stage` to global `buf` (an output or an intermediate)."""
        var, subst = flatten(self.visible(stage))
        value = self.value(stage, subst)
        self.write(buf)
        self.stage_names.append(stage.name)
        wg = self.region.launch.workgroup_size
        if stage.out_index is not None:
            # part of a state output, at fixed positions (a cache row at `pos`); in a
            # per-workgroup region, each workgroup writes its own part
            assert all(r.scope == Scope.LANE for r in kir.reduces_in(value)), stage.name
            index = self.resolve(flat_index(buf.shape, stage.out_index), subst)
            local = self.last or (self.per is not None and stage.indices[:1] == (self.per,))
            mask = None if stage.mask is None else self.resolve(stage.mask, subst)
            self.phases.append(
                kir.StoreMap(buf, var, value, span=stage.span, index=index, local=local, mask=mask)
            )
            if not local:
                self.grid.append(kir.GridItem(var.extent, wg, None))
            return
        if self.last and self.per is None and stage.out_index is None and not stage.is_scalar:
            # the last workgroup alone: every row (a contraction's rows over its subgroups)
            at = ir.IndexRef(var)
            if all(r.scope == Scope.LANE for r in kir.reduces_in(value)):
                self.phases.append(
                    kir.StoreMap(buf, var, value, span=stage.span, local=True, index=at)
                )
            else:
                rows = self.region.launch.rows_per_subgroup
                self.phases.append(
                    kir.Contract(
                        buf, var, value, resolve_layout(stage), rows, span=stage.span, index=at
                    )
                )
            return
        if self.per is not None:
            # one workgroup per value of the per index: it stores its own slice
            assert stage.indices[:1] == (self.per,), stage.name
            index = self.resolve(
                flat_index(buf.shape, tuple(ir.IndexRef(v) for v in stage.indices)), subst
            )
            if any(r.scope != Scope.LANE for r in kir.reduces_in(value)):
                # a contraction: the workgroup's subgroups take every row of its slice
                rows = self.region.launch.rows_per_subgroup
                self.phases.append(
                    kir.Contract(
                        buf, var, value, resolve_layout(stage), rows, span=stage.span, index=index
                    )
                )
                return
            self.phases.append(
                kir.StoreMap(buf, var, value, span=stage.span, local=True, index=index)
            )
            return
        if stage.stored is not None and any(r.scope != Scope.LANE for r in kir.reduces_in(value)):
            # a contraction's output stored as q8_0 blocks (Q8_0X): rows -> subgroup, a chunk
            # of whole blocks per workgroup at a time, staged in shared memory and rounded there
            rows = self.region.launch.rows_per_subgroup
            layout = resolve_layout(stage)
            assert layout.row_unit == Scope.SUBGROUP, stage.name  # dsl/check_q8.py
            most = -(-rows * wg // 32) * 32
            staging = kir.SharedArray(f"{stage.name}_rows", ir.Lit(most, DType.U32))
            self.extra_shared.append(staging)
            self.phases.append(
                kir.Contract(buf, var, value, layout, rows, span=stage.span, staging=staging)
            )
            self.grid.append(kir.GridItem(var.extent, None, rows))
            return
        if stage.stored is not None:
            # an unfused chain's intermediate, or an output: q8_0 blocks in fusec's aligned
            # layout (Q8_0X)
            q = kir.QuantizeBlocks(buf, var, value, span=stage.span)
            self.phases.append(q)
            self.grid.append(kir.GridItem(kir.block_count(var.extent), wg // 4, None))
            return
        if stage.is_scalar:
            self.phases.append(kir.StoreScalar(buf, value, span=stage.span, local=self.last))
            if not self.last:
                self.grid.append(kir.GridItem(ir.Lit(1, DType.U32), 1, None))
            return
        if (
            isinstance(value, ir.Reduce)
            and value.op in ("argmax", "argmin")
            and value.scope == Scope.SUBGROUP
        ):
            # one row per subgroup at a time (dsl.check: the stage's whole value)
            self.phases.append(kir.SelectRows(buf, var, value, span=stage.span))
            self.grid.append(kir.GridItem(var.extent, None, 1))
            return
        if all(r.scope == Scope.LANE for r in kir.reduces_in(value)):
            # elementwise, or small reductions each lane does serially
            self.phases.append(kir.StoreMap(buf, var, value, span=stage.span))
            self.grid.append(kir.GridItem(var.extent, wg, None))
            return
        rows = self.region.launch.rows_per_subgroup
        layout = resolve_layout(stage)
        self.phases.append(kir.Contract(buf, var, value, layout, rows, span=stage.span))
        if layout.row_unit == Scope.WORKGROUP:
            self.grid.append(kir.GridItem(var.extent, rows, None))
        elif layout.row_unit == Scope.SUBGROUP:
            self.grid.append(kir.GridItem(var.extent, None, rows))
        else:
            self.grid.append(kir.GridItem(var.extent, wg, None))

    def arrive(self, scratch: list[ir.Buffer], span: Span) -> None:
        """The grid's part ends: the last workgroup to finish its share runs the rest."""
        counter = counter_buffer(self.region)
        self.read(counter)
        self.write(counter)
        group = self.region.group
        if group is None:
            self.phases.append(kir.Arrive(counter, tuple(scratch), span=span))
            self.per = None
        else:
            # the stages after run once per group, in its last workgroup, indexed by the group
            key = ir.BinOp("/", kir.WorkgroupIndex(), group.size, DType.U32)  # type: ignore[arg-type]
            self.phases.append(
                kir.Arrive(counter, tuple(scratch), span=span, group=key, group_size=group.size)
            )
            self.per, self.per_value = group.var, key
        self.last = True

    def finish(self) -> kir.Kernel:
        bindings: list[kir.Binding] = []
        for buf in [*self.reads, *[b for b in self.writes if b not in self.reads]]:
            bindings.append(kir.Binding(buf, len(bindings), buf in self.reads, buf in self.writes))
        # workgroup reductions of scalar phases combine subgroups through s_reduce (a
        # contraction's reductions are per subgroup whatever their scope)
        scratch = any(
            r.scope == Scope.WORKGROUP
            for p in self.phases
            if isinstance(p, kir.ScalarPhase | kir.StoreScalar | kir.TopKPhase)
            for r in kir.reduces_in(p.value)
        ) or any(
            isinstance(p, kir.Contract) and p.layout.row_unit == Scope.WORKGROUP
            for p in self.phases
        )
        wg = self.region.launch.workgroup_size
        selects = any(
            r.op in ("argmax", "argmin", "topk") and r.scope == Scope.WORKGROUP
            for p in self.phases
            if isinstance(p, kir.ScalarPhase | kir.StoreScalar | kir.TopKPhase)
            for r in kir.reduces_in(p.value)
        )
        index_scratch = (
            [kir.SharedArray(kir.INDEX_SCRATCH, ir.Lit(wg, DType.U32), dtype=DType.U32)]
            if selects
            else []
        )
        return kir.Kernel(
            self.name,
            self.region,
            self.region.launch.workgroup_size,
            self.region.launch.subgroup,
            tuple(bindings),
            (*self.shared.values(), *self.sliced.values(), *self.extra_shared, *index_scratch),
            scratch,
            tuple(self.phases),
            tuple(self.grid),
            tuple(self.stage_names),
            zero_outputs=tuple(self.zero),
            atomics=bool(self.zero),
            plan=self.plan,
        )


DEFAULT_LAYOUT = ir.Layout(Scope.SUBGROUP, 1)


def _mul(a: ir.Expr, b: ir.Expr) -> ir.Expr:
    return ir.BinOp("*", a, b, DType.U32)


def flat_index(shape: tuple[ir.Expr, ...], idx: tuple[kir.KExpr, ...]) -> kir.KExpr:
    """Row-major flat index of `idx` in an array of `shape` (0 for a scalar)."""
    if not idx:
        return ir.Lit(0, DType.U32)
    flat: kir.KExpr = idx[0]
    for dim, i in zip(shape[1:], idx[1:], strict=True):
        flat = ir.BinOp("+", _mul(flat, dim), i, DType.U32)  # type: ignore[arg-type]
    return flat


def flatten(stage: ir.Stage) -> tuple[ir.IndexVar, dict[ir.IndexVar, kir.KExpr]]:
    """One index over a multi-dimensional stage, row-major, with each original index written
    as (flat / stride) % extent; a one-dimensional stage keeps its own index."""
    if len(stage.indices) <= 1:
        return (
            stage.indices[0]
            if stage.indices
            else ir.IndexVar("i", ir.Lit(1, DType.U32), span=stage.span)
        ), {}
    extent: ir.Expr = stage.indices[0].extent
    for v in stage.indices[1:]:
        extent = _mul(extent, v.extent)
    flat = ir.IndexVar("_".join(v.name for v in stage.indices), extent, span=stage.span)
    subst: dict[ir.IndexVar, kir.KExpr] = {}
    stride: ir.Expr | None = None
    for v in reversed(stage.indices):
        quotient: ir.Expr = ir.IndexRef(flat)
        if stride is not None:
            quotient = ir.BinOp("/", quotient, stride, DType.U32)
        subst[v] = (
            quotient if v is stage.indices[0] else ir.BinOp("%", quotient, v.extent, DType.U32)
        )
        stride = v.extent if stride is None else _mul(stride, v.extent)
    return flat, subst


def resolve_layout(stage: ir.Stage) -> ir.Layout:
    """A contraction's layout: its own, else that of an indexed register stage it inlines (where
    the reduction was written), else rows -> subgroup with one element per lane."""
    if stage.layout is not None:
        return stage.layout
    for e in ir.walk(stage.value):
        if (
            isinstance(e, ir.StageRef)
            and e.stage.placement == Placement.REGISTER
            and not e.stage.is_scalar
        ):
            inner = resolve_layout(e.stage)
            if inner is not DEFAULT_LAYOUT:
                return inner
    return DEFAULT_LAYOUT


def _check_nesting(region: ir.Region, kernels: Sequence[kir.Kernel]) -> None:
    """Inlining register values may nest a reduction in another; v1 cannot lower that."""
    diags = []
    for k in kernels:
        for p in k.phases:
            for r in kir.reduces_in(p.value):
                if kir.reduces_in(r.body):
                    diags.append(
                        Diagnostic(
                            p.span,
                            "this stage reads an indexed register value "
                            "that contains a reduction, which would nest two "
                            "reductions",
                            "place the inner value in shared",
                        )
                    )
    if diags:
        raise DiagnosticError(diags)


def _deps(stage: ir.Stage) -> list[ir.Stage]:
    return [e.stage for e in ir.walk(stage.value) if isinstance(e, ir.StageRef)]


def lower_fused(region: ir.Region) -> list[kir.Kernel]:
    """The fused product: one kernel, or one per segment between `global` intermediates."""
    if region.tile is not None:
        from .lower_tile import lower_tile_fused

        return lower_tile_fused(region, "shuffle")
    kernels: list[kir.Kernel] = []
    builder = _KernelBuilder(region, region.name, per=region.per)
    if region.per is not None:
        builder.grid.append(kir.GridItem(region.per.extent, 1, None))
    produced_global: dict[ir.Stage, ir.Buffer] = {}
    plan = plan_grid(region)
    builder.plan = plan
    scratch: list[ir.Buffer] = []
    arrived_after = region.span
    last = {p.stage for p in plan if p.distribution == kir.Distribution.LAST}
    for stage in region.all_stages():  # no repeats outside tile regions (dsl.check)
        if stage.name in last and not builder.last:
            # after the last stage in grid (its line, for #line and `fusec explain`)
            builder.arrive(scratch, arrived_after)
        if stage.placement == Placement.GRID:
            buf = intermediate_buffer(stage)
            builder.store(stage, buf)
            builder.globals_[stage] = buf
            scratch.append(buf)
            arrived_after = stage.span
        elif stage.output is not None:
            if not builder.split_k(stage, stage.output):
                builder.store(stage, stage.output)
        elif stage.placement == Placement.SLICES:
            builder.slice_stage(stage)
        elif stage.placement == Placement.GLOBAL:
            buf = intermediate_buffer(stage)
            builder.store(stage, buf)
            produced_global[stage] = buf
        elif builder.held(stage):
            builder.scalar(stage)  # per workgroup, a value of the workgroup's own index
        elif stage.placement == Placement.SHARED:
            builder.fill_shared(stage)
        # indexed register stages are recomputed at their uses
        if stage.placement == Placement.GLOBAL and stage.output is None:
            kernels.append(builder.finish())
            # the next kernel runs as the region does: per workgroup, one for each value
            builder = _KernelBuilder(region, f"{region.name}.part{len(kernels)}", per=region.per)
            if region.per is not None:
                builder.grid.append(kir.GridItem(region.per.extent, 1, None))
            builder.globals_.update(produced_global)
    if builder.writes:
        kernels.append(builder.finish())
    _check_nesting(region, kernels)
    return kernels


def ir_reduces(e: ir.Expr) -> bool:
    return any(isinstance(x, ir.Reduce) for x in ir.walk(e))


def lower_unfused(region: ir.Region) -> list[kir.Kernel]:
    """The unfused chain, as an engine without fusion runs it: one kernel per indexed stage and
    per reduction, every intermediate in global memory.  Only scalar stages without a reduction
    (e.g. `r = rsqrt(ss / K + eps)`) and stages computed in f64 are recomputed inside the
    kernels that read them."""
    if region.tile is not None:
        from .lower_tile import lower_tile_unfused

        return lower_tile_unfused(region)
    kernels: list[kir.Kernel] = []
    materialized: dict[ir.Stage, ir.Buffer] = {}
    stages = region.all_stages()  # no repeats outside tile regions (dsl.check)
    for stage in stages:
        if stage.output is None and stage.is_scalar and not ir_reduces(stage.value):
            continue  # a cheap per-lane scalar: recomputed in each kernel that reads it
        if stage.output is None and stage.dtype == DType.F64:
            continue  # recomputed where read: an f32 intermediate would lose what f64 keeps
        builder = _KernelBuilder(region, f"{region.name}.unfused.{len(kernels)}")
        builder.globals_.update(materialized)
        # register scalars this stage needs, in program order, computed first
        needed: list[ir.Stage] = []

        def visit(s: ir.Stage, needed: list[ir.Stage] = needed) -> None:
            for d in _deps(s):
                if d in materialized or d in needed:
                    continue
                visit(d)
                if d.is_scalar:
                    needed.append(d)

        visit(stage)
        for d in sorted(needed, key=stages.index):
            builder.scalar(d)
        buf = stage.output if stage.output is not None else intermediate_buffer(stage)
        builder.store(stage, buf)
        kernels.append(builder.finish())
        if stage.output is None:
            materialized[stage] = buf
    _check_nesting(region, kernels)
    return kernels


def intermediates(kernels: Sequence[kir.Kernel]) -> list[ir.Buffer]:
    """Global buffers written by kernels of a product that are not region outputs."""
    out: list[ir.Buffer] = []
    for k in kernels:
        for b in k.bindings:
            if b.writes and not b.buffer.is_output and b.buffer not in out:
                out.append(b.buffer)
    return out
