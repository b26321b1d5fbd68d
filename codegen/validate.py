"""Kernel-IR validator: the invariants `lower.py` and `lower_tile.py` promise `glsl.py`.

Input: a `kir.Kernel` (or a product: the kernels one lowering returned, in launch order).
Output: a list of problems, one line each, empty for a valid kernel; `validate_kernels` turns a
non-empty list into an AssertionError.  A problem is always our bug, never a user's: the tests
run this after every lowering (tests/conftest.py), as Mesa runs nir_validate after each pass
(mirror/mesa `src/compiler/nir/nir_validate.c`).

What it checks:
- declarations: bindings numbered 0, 1, ... with one binding per buffer; every buffer a phase
  loads is bound for reading, every buffer a phase stores to is bound for writing, and every
  binding is used as it says; shared arrays declared once, each written by exactly one phase;
- names: every constant is one of the region's, every index variable is bound (by the phase's
  own index, an enclosing reduction or the tile), every local, shared array and tile value is
  written before it is read, in phase order; loads index every dimension of their buffer, and
  shapes, sizes and extents are built from constants and literals only;
- synchronization: a subgroup or workgroup reduction only in a phase every lane of the
  workgroup runs uniformly (scalar phases, single-element stores, contractions, tile programs),
  never in a grid-stride loop; `reduction_scratch`, `exchange_scratch`, `atomics` and
  `zero_outputs` agree with the phases that need them; no reduction nested in another;
- products (`validate_product`): a kernel reads an intermediate only after an earlier kernel
  (or itself, for an unfused repeat's carried value) wrote it.

What it does not check: that the kernel computes what the region says (the numpy reference and
the device tests do), resource limits (the estimator and the runtime), the GLSL text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import assert_never

from fusec.dsl import ir
from fusec.dsl.types import DType, Scope

from . import kir
from .kir_print import format_kexpr

_PhaseTarget = ir.Buffer | kir.SharedArray


def _shape_problems(e: ir.Expr, consts: set[ir.ConstDecl], what: str) -> list[str]:
    """A shape, size or extent: literals, the region's constants and arithmetic on them."""
    out = []
    for x in ir.walk(e):
        if isinstance(x, ir.ConstRef) and x.const not in consts:
            out.append(f"{what} uses constant '{x.const.name}', not declared by the region")
        elif not isinstance(x, ir.Lit | ir.ConstRef | ir.BinOp | ir.Neg):
            out.append(f"{what} is not built from constants: {format_kexpr(x)}")
    return out


class _Checker:
    def __init__(self, kernel: kir.Kernel) -> None:
        self.k = kernel
        self.problems: list[str] = []
        self.consts = set(kernel.region.consts)
        self.bound = {b.buffer: b for b in kernel.bindings}
        self.loaded: set[ir.Buffer] = set()
        self.stored: set[ir.Buffer] = set()
        self.locals: set[str] = set()
        self.filled: set[kir.SharedArray] = set()
        self.tile_values: set[str] = set()
        self.sliced = any(isinstance(p, kir.Contract) and p.slice for p in kernel.phases)
        self.where = ""

    def problem(self, text: str) -> None:
        self.problems.append(f"{self.k.name}: {self.where}{text}")

    # --- expressions -------------------------------------------------------------------------
    def expr(self, e: kir.KExpr, bound: frozenset[ir.IndexVar], uniform: bool) -> None:
        """Check `e` with index variables `bound` in scope; `uniform`: every lane of the
        workgroup evaluates it together (cross-lane reductions allowed)."""
        match e:
            case ir.Lit():
                pass
            case ir.ConstRef(const):
                if const not in self.consts:
                    self.problem(f"constant '{const.name}' is not declared by the region")
                if const.runtime and not self._reads(self.k.region.params):
                    self.problem(f"run-time parameter '{const.name}' without a parameter binding")
            case ir.IndexRef(var):
                if var not in bound:
                    self.problem(f"index '{var.name}' is not bound here")
            case ir.Load(buffer, indices):
                self.loaded.add(buffer)
                if not self._reads(buffer):
                    self.problem(f"loads '{buffer.name}', which is not bound for reading")
                if len(indices) != len(buffer.shape):
                    self.problem(
                        f"loads '{buffer.name}' with {len(indices)} indices, "
                        f"not {len(buffer.shape)}"
                    )
                for i in indices:
                    self.expr(i, bound, uniform)
            case ir.StageRef(stage, _):
                self.problem(f"reads stage '{stage.name}', which lowering should have resolved")
            case ir.Call(_, args, _):
                for a in args:
                    self.expr(a, bound, uniform)
            case ir.BinOp(_, lhs, rhs, _):
                self.expr(lhs, bound, uniform)
                self.expr(rhs, bound, uniform)
            case ir.Neg(value):
                self.expr(value, bound, uniform)
            case ir.Reduce(_, var, body, scope):
                if scope != Scope.LANE and not uniform:
                    self.problem(
                        f"a {scope.value} reduction over '{var.name}' where lanes do not run "
                        "together (it would synchronize in divergent control flow)"
                    )
                if kir.reduces_in(body):
                    self.problem(f"a reduction nested in the reduction over '{var.name}'")
                self.extent(var)
                self.expr(body, bound | {var}, uniform)
            case kir.LocalRef(name, _):
                if name not in self.locals:
                    self.problem(f"reads local '{name}' before a scalar phase computes it")
            case kir.SharedLoad(array, index):
                if not any(array is a for a in self.k.shared):
                    self.problem(f"reads shared array '{array.name}', which is not declared")
                elif array not in self.filled:
                    self.problem(f"reads shared array '{array.name}' before it is written")
                self.expr(index, bound, uniform)
            case kir.WorkgroupIndex():
                if self.k.region.per is None:
                    self.problem("reads the workgroup's index outside a per-workgroup region")
            case kir.SliceBase():
                if not self.sliced:
                    self.problem("reads a slice's first row without a sliced contraction")
            case kir.TileRef(var, indices):
                tile = self.k.region.tile
                if var not in self.tile_values:
                    self.problem(f"reads tile value '{var}' before it is assigned")
                if tile is not None and len(indices) != len(tile.dims) + 1:
                    self.problem(f"tile value '{var}' with {len(indices)} indices")
                for at in indices:
                    self.expr(at, bound, uniform)
            case _:
                assert_never(e)

    def extent(self, var: ir.IndexVar) -> None:
        for p in _shape_problems(var.extent, self.consts, f"the extent of '{var.name}'"):
            self.problem(p)

    def _reads(self, buffer: ir.Buffer | None) -> bool:
        b = self.bound.get(buffer) if buffer is not None else None
        return b is not None and b.reads

    def store(self, target: _PhaseTarget) -> None:
        if isinstance(target, kir.SharedArray):
            if not any(target is a for a in self.k.shared):
                self.problem(f"writes shared array '{target.name}', which is not declared")
            if target in self.filled:
                self.problem(f"writes shared array '{target.name}' twice")
            self.filled.add(target)
            return
        self.stored.add(target)
        b = self.bound.get(target)
        if b is None or not b.writes:
            self.problem(f"stores to '{target.name}', which is not bound for writing")

    # --- phases ------------------------------------------------------------------------------
    def phase(self, p: kir.Phase) -> None:
        none: frozenset[ir.IndexVar] = frozenset()
        match p:
            case kir.ScalarPhase(name, value):
                self.expr(value, none, uniform=True)
                if name in self.locals:
                    self.problem(f"computes local '{name}' twice")
                self.locals.add(name)
            case kir.SelectRows(buffer, row, reduce):
                # each subgroup takes a row: its lanes run the reduction together
                self.extent(row)
                self.expr(reduce, frozenset({row}), uniform=True)
                self.store(buffer)
            case kir.TopKPhase(_, reduce, values, indices):
                self.expr(reduce, none, uniform=True)
                self.store(values)
                self.store(indices)
            case kir.FillShared(array, var, value):
                # a grid-stride loop over the array: lanes leave it at different times
                self.extent(var)
                self.expr(value, frozenset({var}), uniform=False)
                self.store(array)
            case kir.StoreScalar(buffer, value):
                self.expr(value, none, uniform=True)
                self.store(buffer)
            case kir.StoreMap(buffer, var, value, local=local, index=index, mask=mask):
                self.extent(var)
                self.expr(value, frozenset({var}), uniform=False)
                if mask is not None:
                    self.expr(mask, frozenset({var}), uniform=False)
                if index is not None:
                    self.expr(index, frozenset({var}), uniform=False)
                elif local:
                    self.problem(f"stores '{buffer.name}' per workgroup without an index")
                self.store(buffer)
            case kir.Contract(target, row, value, layout, rows, slice=sliced, index=index):
                self.extent(row)
                # subgroups take whole rows: a row's lanes reduce together
                self.expr(value, frozenset({row}), uniform=True)
                if index is not None:
                    self.expr(index, frozenset({row}), uniform=True)
                    if isinstance(target, kir.SharedArray):
                        self.problem(f"stores shared array '{target.name}' at a global index")
                if sliced and not isinstance(target, kir.SharedArray):
                    self.problem(f"keeps a slice of '{target.name}' outside shared memory")
                if rows < 1 or layout.vector < 1:
                    self.problem(f"contraction with {rows} rows and vector {layout.vector}")
                staging = p.staging
                if staging is not None:  # a q8_0x output's chunks, rounded through shared
                    if not (isinstance(target, ir.Buffer) and target.dtype == DType.Q8_0X):
                        self.problem(f"stages rows of '{target.name}', which is not q8_0x")
                    if layout.row_unit != Scope.SUBGROUP:
                        self.problem(f"stages rows of '{target.name}' without rows -> subgroup")
                    self.filled.add(staging)
                self.store(target)
            case kir.TilePhase(tile, body, exchange):
                if exchange not in ("shuffle", "shared"):
                    self.problem(f"tile exchange '{exchange}' is neither shuffle nor shared")
                if self.k.region.tile is not tile:
                    self.problem("a tile program of another region's tile")
                self.extent(tile.per)
                self.tile_body(body, frozenset((tile.per, *tile.dims)))
            case kir.SplitK(buffer, row, var, slice_array, value):
                self.extent(row)
                self.extent(var)
                if slice_array not in self.filled:
                    self.problem(f"sums slice '{slice_array.name}' before it is written")
                self.expr(value, frozenset({row, var}), uniform=True)
                self.store(buffer)
            case kir.QuantizeBlocks(target, var, value):
                self.extent(var)
                self.expr(value, frozenset({var}), uniform=False)
                if isinstance(target, kir.SharedArray) and target.stored != DType.Q8_0:
                    self.problem(f"quantizes into '{target.name}', not stored as q8_0")
                if isinstance(target, ir.Buffer) and target.dtype != DType.Q8_0X:
                    self.problem(f"quantizes into '{target.name}' of {target.dtype.value}")
                self.store(target)
            case kir.Arrive(counter, scratch):
                b = self.bound.get(counter)
                if b is None or not (b.reads and b.writes) or counter.dtype != DType.U32:
                    self.problem(f"arrival counter '{counter.name}' is not a bound u32 read/write")
                for buf in scratch:
                    if buf not in self.stored:
                        self.problem(f"arrives before anything stores scratch '{buf.name}'")
                if sum(isinstance(q, kir.Arrive) for q in self.k.phases) > 1:
                    self.problem("arrives twice: the workgroups that left cannot come back")
                self.loaded.add(counter)
                self.stored.add(counter)
            case _:
                assert_never(p)

    def tile_body(self, body: tuple[kir.TileStmt, ...], bound: frozenset[ir.IndexVar]) -> None:
        for st in body:
            match st:
                case kir.TileAssign(var, value):
                    # every lane of a group holds one element; groups run together
                    self.expr(value, bound, uniform=True)
                    self.tile_values.add(var)
                case kir.TileRepeat(count, inner):
                    for p in _shape_problems(count, self.consts, "a repeat count"):
                        self.problem(p)
                    self.tile_body(inner, bound)
                case kir.TileStore(buffer, indices, value):
                    for v in indices:
                        if v not in bound:
                            self.problem(f"stores '{buffer.name}' at '{v.name}', not a tile index")
                    self.expr(value, bound, uniform=True)
                    self.store(buffer)
                case _:
                    assert_never(st)

    # --- the kernel --------------------------------------------------------------------------
    def kernel(self) -> list[str]:
        k = self.k
        for i, b in enumerate(k.bindings):
            if b.binding != i:
                self.problem(f"binding of '{b.buffer.name}' is {b.binding}, not {i}")
            if not (b.reads or b.writes):
                self.problem(f"binding '{b.buffer.name}' neither read nor written")
            for d in b.buffer.shape:
                for p in _shape_problems(d, self.consts, f"the shape of '{b.buffer.name}'"):
                    self.problem(p)
        names = [b.buffer.name for b in k.bindings]
        for n in sorted({n for n in names if names.count(n) > 1}):
            self.problem(f"buffer '{n}' is bound more than once")
        shared_names = [a.name for a in k.shared]
        for n in sorted({n for n in shared_names if shared_names.count(n) > 1}):
            self.problem(f"shared array '{n}' is declared more than once")
        for a in k.shared:
            for p in _shape_problems(a.size, self.consts, f"the size of shared '{a.name}'"):
                self.problem(p)
        for number, phase in enumerate(k.phases):
            self.where = f"phase {number}: "
            self.phase(phase)
        self.where = ""
        self.flags()
        for a in k.shared:
            # the index scratch is written by the workgroup selections' own reductions
            if a not in self.filled and a.name != kir.INDEX_SCRATCH:
                self.problem(f"shared array '{a.name}' is declared but never written")
        params = k.region.params
        for b in k.bindings:
            if b.reads and b.buffer not in self.loaded and b.buffer is not params:
                self.problem(f"binding '{b.buffer.name}' is bound for reading but never loaded")
            if b.writes and b.buffer not in self.stored:
                self.problem(f"binding '{b.buffer.name}' is bound for writing but never stored")
        if not k.grid:
            self.problem("no grid: the kernel would launch no workgroup")
        for g in k.grid:
            if (g.per_workgroup is None) == (g.rows_per_subgroup is None):
                self.problem("a grid item needs exactly one of per_workgroup, rows_per_subgroup")
            if any(n is not None and n < 1 for n in (g.per_workgroup, g.rows_per_subgroup)):
                self.problem("a grid item with no work per workgroup")
            for p in _shape_problems(g.extent, self.consts, "a grid extent"):
                self.problem(p)
        if (k.loop is None) != (k.loop_count is None):
            self.problem("a loop id without a count, or a count without a loop id")
        if k.workgroup_size < 1 or k.workgroup_size & (k.workgroup_size - 1):
            self.problem(f"workgroup size {k.workgroup_size} is not a power of two")
        return self.problems

    def flags(self) -> None:
        """The kernel's flags against the phases that need them."""
        k = self.k
        scratch = any(
            r.scope == Scope.WORKGROUP
            for p in k.phases
            if isinstance(p, kir.ScalarPhase | kir.StoreScalar | kir.TopKPhase)
            for r in kir.reduces_in(p.value)
        ) or any(
            isinstance(p, kir.Contract) and p.layout.row_unit == Scope.WORKGROUP for p in k.phases
        )
        if scratch != k.reduction_scratch:
            self.problem(
                f"reduction_scratch is {k.reduction_scratch}, but the phases "
                + ("do" if scratch else "do not")
                + " reduce across subgroups"
            )
        exchange = any(isinstance(p, kir.TilePhase) and p.exchange == "shared" for p in k.phases)
        if exchange != k.exchange_scratch:
            self.problem(
                f"exchange_scratch is {k.exchange_scratch}, but "
                + ("a" if exchange else "no")
                + " tile program exchanges through shared memory"
            )
        split = [p.buffer.name for p in k.phases if isinstance(p, kir.SplitK)]
        if sorted(split) != sorted(k.zero_outputs):
            self.problem(
                f"zero_outputs {list(k.zero_outputs)} differ from the split-K outputs {split}"
            )
        if bool(split) != k.atomics:
            self.problem(f"atomics is {k.atomics} with {len(split)} split-K phase(s)")


def validate(kernel: kir.Kernel) -> list[str]:
    """The problems of one kernel (empty: valid)."""
    return _Checker(kernel).kernel()


def validate_product(kernels: Sequence[kir.Kernel]) -> list[str]:
    """The problems of each kernel, and of the product: an intermediate (a global buffer that
    is no region input) read before a kernel at or before the reader writes it."""
    problems: list[str] = []
    written: set[ir.Buffer] = set()
    for k in kernels:
        problems.extend(validate(k))
        region = k.region
        inputs = {*region.inputs, *([region.params] if region.params is not None else [])}
        writes = {b.buffer for b in k.bindings if b.writes}
        # after an arrival the last workgroup reads what every workgroup stored before it; a
        # counter starts at zero when allocated (kir.Arrive)
        arrived = {
            b for p in k.phases if isinstance(p, kir.Arrive) for b in (p.counter, *p.scratch)
        }
        for b in k.bindings:
            buf = b.buffer
            # a state output keeps its values between runs; an unfused repeat's kernel may read
            # the carried value the same loop's copy kernel writes (later, for the next round)
            if not b.reads or buf in inputs or buf in written or buf.state or buf in arrived:
                continue
            later = [j for j in kernels if j.loop is not None and j.loop == k.loop]
            if any(
                j is not k and b2.buffer is buf and b2.writes for j in later for b2 in j.bindings
            ):
                continue
            problems.append(f"{k.name}: reads '{buf.name}' before any kernel writes it")
        written |= writes
    return problems


def validate_kernels(kernels: Sequence[kir.Kernel]) -> None:
    """Raise AssertionError listing every problem of the product `kernels` (our bug)."""
    problems = validate_product(kernels)
    if problems:
        raise AssertionError("invalid kernel IR:\n  " + "\n  ".join(problems))


def synchronizes(kernel: kir.Kernel) -> bool:
    """Whether the workgroup must meet at a barrier somewhere in `kernel`: a phase writes shared
    memory that other lanes read (a fill, a contraction or a quantization into a shared array),
    a reduction combines subgroups through shared scratch, or a tile program reduces across lanes
    through shared memory.  The GLSL has a `barrier()` exactly when this holds (tests/codegen)."""
    for p in kernel.phases:
        match p:
            case kir.FillShared():
                return True
            case (
                kir.Contract(buffer=kir.SharedArray())
                | kir.QuantizeBlocks(target=kir.SharedArray())
            ):
                return True
            case kir.TilePhase(tile, exchange="shared"):
                # only a reduction over an index on lanes crosses lanes (one on slots stays in
                # the lane)
                lanes = {d.name for d, st in zip(tile.dims, tile.strides, strict=True) if st}
                if any(r.var.name in lanes for r in kir.reduces_in(p.value)):
                    return True
    return kernel.reduction_scratch
