"""codegen/validate.py: every kernel of kernels.fuse is valid, each broken copy (one mutation of
a real kernel) is reported with its problem, and the test process validates every lowering
(tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable

import attrs
import pytest

from fusec.codegen import kir
from fusec.codegen.build import build_source, check_source
from fusec.codegen.dump import lower_region
from fusec.codegen.glsl import emit_glsl
from fusec.codegen.lower import lower_fused, lower_unfused
from fusec.codegen.lower_tile import lower_tile_fused
from fusec.codegen.validate import synchronizes, validate, validate_kernels, validate_product
from fusec.dsl import ir
from fusec.dsl.types import DType, Scope
from tests.conftest import ROOT

PROGRAM = check_source((ROOT / "kernels.fuse").read_text(), "kernels.fuse")


def _fused(region: str) -> kir.Kernel:
    [k] = lower_fused(PROGRAM.region(region))
    return k


def _phase(k: kir.Kernel, kind: type) -> tuple[int, kir.Phase]:
    return next((i, p) for i, p in enumerate(k.phases) if isinstance(p, kind))


def _with_phases(k: kir.Kernel, phases: list[kir.Phase]) -> kir.Kernel:
    return attrs.evolve(k, phases=tuple(phases))


def _append_scalar(k: kir.Kernel, value: kir.KExpr) -> kir.Kernel:
    extra = kir.ScalarPhase("extra", value, span=k.phases[0].span)
    return _with_phases(k, [*k.phases, extra])


@pytest.mark.parametrize("region", [r.name for r in PROGRAM.regions])
def test_every_kernel_of_kernels_fuse_is_valid(region: str) -> None:
    r = PROGRAM.region(region)
    kernels = lower_region(r)
    assert kernels
    for product in (lower_fused(r), lower_unfused(r)):
        assert validate_product(product) == []
    assert all(validate(k) == [] for k in kernels)


def _barriers(program: ir.Program, regions: tuple[str, ...] = ()) -> dict[str, bool]:
    """Kernel name -> whether its GLSL has a barrier, checked against `synchronizes`."""
    out = {}
    for r in program.regions:
        if regions and r.name not in regions:
            continue
        for k in lower_region(r):
            out[k.name] = "barrier();" in emit_glsl(k, line_directives=False)
            assert out[k.name] == synchronizes(k), k.name
    return out


def test_barriers_only_where_the_ir_synchronizes() -> None:
    """The GLSL has a barrier exactly in the kernels whose phases make the workgroup meet."""
    met = _barriers(PROGRAM)
    assert met["rms_norm_mul_matvec"] and met["dsv4_hc_comb.shared"]
    assert not met["gated_ffn"] and not met["dsv4_hc_comb"]


def test_a_tile_reduced_over_slots_needs_no_barrier() -> None:
    """Its shared variant exchanges nothing across lanes, so it never meets."""
    path = ROOT / "tests" / "data" / "over_budget.fuse"
    met = _barriers(check_source(path.read_text(), str(path)), ("big_tile",))
    assert "big_tile.shared" in met and not any(met.values())


# --- mutations: each breaks one invariant of a real kernel ---------------------------------------
def _drop_binding(name: str) -> Callable[[kir.Kernel], kir.Kernel]:
    def mutate(k: kir.Kernel) -> kir.Kernel:
        kept = [b for b in k.bindings if b.buffer.name != name]
        renumbered = [attrs.evolve(b, binding=i) for i, b in enumerate(kept)]
        return attrs.evolve(k, bindings=tuple(renumbered))

    return mutate


def _renumber(k: kir.Kernel) -> kir.Kernel:
    first, second, *rest = k.bindings
    return attrs.evolve(k, bindings=(attrs.evolve(first, binding=1), second, *rest))


def _read_only(name: str) -> Callable[[kir.Kernel], kir.Kernel]:
    def mutate(k: kir.Kernel) -> kir.Kernel:
        bindings = [
            attrs.evolve(b, writes=False, reads=True) if b.buffer.name == name else b
            for b in k.bindings
        ]
        return attrs.evolve(k, bindings=tuple(bindings))

    return mutate


def _unused_binding(k: kir.Kernel) -> kir.Kernel:
    buf = ir.Buffer("spare", DType.F32, (ir.Lit(4, DType.U32),), False, span=k.region.span)
    return attrs.evolve(k, bindings=(*k.bindings, kir.Binding(buf, len(k.bindings), True, False)))


def _swap(i: int, j: int) -> Callable[[kir.Kernel], kir.Kernel]:
    def mutate(k: kir.Kernel) -> kir.Kernel:
        phases = list(k.phases)
        phases[i], phases[j] = phases[j], phases[i]
        return _with_phases(k, phases)

    return mutate


def _undeclared_shared(k: kir.Kernel) -> kir.Kernel:
    return attrs.evolve(k, shared=())


def _unwritten_shared(k: kir.Kernel) -> kir.Kernel:
    spare = kir.SharedArray("spare", ir.Lit(8, DType.U32))
    return attrs.evolve(k, shared=(*k.shared, spare))


def _fill_twice(k: kir.Kernel) -> kir.Kernel:
    i, fill = _phase(k, kir.FillShared)
    return _with_phases(k, [*k.phases[: i + 1], fill, *k.phases[i + 1 :]])


def _foreign_constant(k: kir.Kernel) -> kir.Kernel:
    c = ir.ConstDecl("Z", DType.U32, 4, 1, 8, 99, span=k.region.span)
    return _append_scalar(k, ir.BinOp("*", ir.ConstRef(c), ir.Lit(2, DType.U32), DType.U32))


def _foreign_constant_in_a_shape(k: kir.Kernel) -> kir.Kernel:
    c = ir.ConstDecl("Z", DType.U32, 4, 1, 8, 99, span=k.region.span)
    first = k.bindings[0]
    buf = attrs.evolve(first.buffer, shape=(ir.ConstRef(c),))
    # the same buffer object everywhere it is loaded: only its binding's record changes
    return attrs.evolve(k, bindings=(attrs.evolve(first, buffer=buf), *k.bindings[1:]))


def _unbound_index(k: kir.Kernel) -> kir.Kernel:
    q = ir.IndexVar("q", ir.Lit(4, DType.U32), span=k.region.span)
    x = next(b.buffer for b in k.bindings if b.buffer.name == "x")
    return _append_scalar(k, ir.Load(x, (ir.IndexRef(q),)))


def _too_few_indices(k: kir.Kernel) -> kir.Kernel:
    w = next(b.buffer for b in k.bindings if b.buffer.name == "W")
    return _append_scalar(k, ir.Load(w, (ir.Lit(0, DType.U32),)))


def _divergent_reduction(k: kir.Kernel) -> kir.Kernel:
    i, store = _phase(k, kir.StoreMap)
    assert isinstance(store, kir.StoreMap)
    j = ir.IndexVar("j", ir.Lit(4, DType.U32), span=k.region.span)
    value = ir.Reduce("sum", j, store.value, Scope.WORKGROUP)  # type: ignore[arg-type]
    phases = list(k.phases)
    phases[i] = attrs.evolve(store, value=value)
    return _with_phases(k, phases)


def _nested_reduction(k: kir.Kernel) -> kir.Kernel:
    i, scalar = _phase(k, kir.ScalarPhase)
    assert isinstance(scalar, kir.ScalarPhase) and isinstance(scalar.value, ir.Reduce)
    j = ir.IndexVar("j", ir.Lit(4, DType.U32), span=k.region.span)
    outer = ir.Reduce("sum", j, scalar.value, Scope.LANE)
    phases = list(k.phases)
    phases[i] = attrs.evolve(scalar, value=outer)
    return _with_phases(k, phases)


def _unresolved_stage(k: kir.Kernel) -> kir.Kernel:
    stage = PROGRAM.region("rms_norm_mul_matvec").all_stages()[0]
    return _append_scalar(k, ir.StageRef(stage, ()))


def _flag(**changes: object) -> Callable[[kir.Kernel], kir.Kernel]:
    def mutate(k: kir.Kernel) -> kir.Kernel:
        return attrs.evolve(k, **changes)  # type: ignore[misc]

    return mutate


def _no_grid(k: kir.Kernel) -> kir.Kernel:
    return attrs.evolve(k, grid=())


def _ambiguous_grid(k: kir.Kernel) -> kir.Kernel:
    g = k.grid[0]
    return attrs.evolve(k, grid=(attrs.evolve(g, per_workgroup=4, rows_per_subgroup=2),))


def _workgroup_index(k: kir.Kernel) -> kir.Kernel:
    return _append_scalar(k, kir.WorkgroupIndex())


def _slice_base(k: kir.Kernel) -> kir.Kernel:
    return _append_scalar(k, kir.SliceBase(2))


def _tile_value_before_assignment(k: kir.Kernel) -> kir.Kernel:
    i, tile = _phase(k, kir.TilePhase)
    assert isinstance(tile, kir.TilePhase)
    phases = list(k.phases)
    phases[i] = attrs.evolve(tile, body=tile.body[1:])  # drop `l = ...`, which `e` reads
    return _with_phases(k, phases)


def _sum_slice_first(k: kir.Kernel) -> kir.Kernel:
    i, split = _phase(k, kir.SplitK)
    return _with_phases(k, [split, *k.phases[:i], *k.phases[i + 1 :]])


CASES: dict[str, tuple[str, Callable[[kir.Kernel], kir.Kernel], str]] = {
    # name: (region whose fused kernel is mutated, mutation, the problem's words)
    "unbound load": (
        "rms_norm_mul_matvec",
        _drop_binding("g"),
        "loads 'g', which is not bound for reading",
    ),
    "binding numbers": ("rms_norm_mul_matvec", _renumber, "binding of 'x' is 1, not 0"),
    "store without write": (
        "rms_norm_mul_matvec",
        _read_only("y"),
        "stores to 'y', which is not bound for writing",
    ),
    "unused binding": (
        "rms_norm_mul_matvec",
        _unused_binding,
        "binding 'spare' is bound for reading but never loaded",
    ),
    "local before its phase": (
        "rms_norm_mul_matvec",
        _swap(0, 1),
        "phase 0: reads local 'ss' before a scalar phase computes it",
    ),
    "shared before its fill": (
        "rms_norm_mul_matvec",
        _swap(1, 2),
        "phase 1: reads shared array 'xn' before it is written",
    ),
    "undeclared shared": (
        "rms_norm_mul_matvec",
        _undeclared_shared,
        "reads shared array 'xn', which is not declared",
    ),
    "shared never written": (
        "rms_norm_mul_matvec",
        _unwritten_shared,
        "shared array 'spare' is declared but never written",
    ),
    "shared written twice": (
        "rms_norm_mul_matvec",
        _fill_twice,
        "writes shared array 'xn' twice",
    ),
    "undeclared constant": (
        "rms_norm_mul_matvec",
        _foreign_constant,
        "constant 'Z' is not declared by the region",
    ),
    "undeclared constant in a shape": (
        "rms_norm_mul_matvec",
        _foreign_constant_in_a_shape,
        "the shape of 'x' uses constant 'Z', not declared by the region",
    ),
    "unbound index": ("rms_norm_mul_matvec", _unbound_index, "index 'q' is not bound here"),
    "too few indices": (
        "rms_norm_mul_matvec",
        _too_few_indices,
        "loads 'W' with 1 indices, not 2",
    ),
    "barrier in divergent code": (
        "add_rms_norm",
        _divergent_reduction,
        "a workgroup reduction over 'j' where lanes do not run together",
    ),
    "nested reduction": (
        "rms_norm_mul_matvec",
        _nested_reduction,
        "a reduction nested in the reduction over 'j'",
    ),
    "unresolved stage": (
        "rms_norm_mul_matvec",
        _unresolved_stage,
        "reads stage 'ss', which lowering should have resolved",
    ),
    "reduction scratch off": (
        "rms_norm_mul_matvec",
        _flag(reduction_scratch=False),
        "reduction_scratch is False, but the phases do reduce across subgroups",
    ),
    "reduction scratch on": (
        "gated_ffn",
        _flag(reduction_scratch=True),
        "reduction_scratch is True, but the phases do not reduce across subgroups",
    ),
    "exchange scratch": (
        "dsv4_hc_comb",
        _flag(exchange_scratch=True),
        "exchange_scratch is True, but no tile program exchanges through shared memory",
    ),
    "zeroed outputs": (
        "gated_ffn_down_splitk",
        _flag(zero_outputs=()),
        "zero_outputs [] differ from the split-K outputs ['y']",
    ),
    "atomics": (
        "gated_ffn_down_splitk",
        _flag(atomics=False),
        "atomics is False with 1 split-K phase(s)",
    ),
    "loop without count": ("add_rms_norm", _flag(loop=3), "a loop id without a count"),
    "no grid": ("add_rms_norm", _no_grid, "no grid: the kernel would launch no workgroup"),
    "ambiguous grid": (
        "add_rms_norm",
        _ambiguous_grid,
        "a grid item needs exactly one of per_workgroup, rows_per_subgroup",
    ),
    "workgroup index": (
        "add_rms_norm",
        _workgroup_index,
        "reads the workgroup's index outside a per-workgroup region",
    ),
    "slice base": (
        "add_rms_norm",
        _slice_base,
        "reads a slice's first row without a sliced contraction",
    ),
    "tile value before assignment": (
        "dsv4_hc_comb",
        _tile_value_before_assignment,
        "reads tile value 'l' before it is assigned",
    ),
    "slice before its contraction": (
        "gated_ffn_down_splitk",
        _sum_slice_first,
        "sums slice 'hh' before it is written",
    ),
    "workgroup size": ("add_rms_norm", _flag(workgroup_size=96), "workgroup size 96"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_broken_kernel_is_reported(case: str) -> None:
    region, mutate, words = CASES[case]
    kernel = _fused(region)
    assert validate(kernel) == []
    problems = validate(mutate(kernel))
    assert any(words in p for p in problems), problems
    assert all(p.startswith(f"{kernel.name}: ") for p in problems)
    with pytest.raises(AssertionError, match="invalid kernel IR"):
        validate_kernels([mutate(kernel)])


def test_a_chain_reading_an_intermediate_before_it_is_written_is_reported() -> None:
    chain = lower_unfused(PROGRAM.region("rms_norm_mul_matvec"))
    assert validate_product(chain) == []
    reordered = [chain[1], chain[0], chain[2]]
    assert validate_product(reordered) == [
        "rms_norm_mul_matvec.unfused.1: reads 'ss' before any kernel writes it"
    ]


def test_the_shared_variant_of_a_tile_is_valid_and_checked() -> None:
    [shared] = lower_tile_fused(PROGRAM.region("dsv4_hc_comb"), "shared")
    assert validate(shared) == []
    assert validate(attrs.evolve(shared, exchange_scratch=False)) == [
        "dsv4_hc_comb.shared: exchange_scratch is False, but a tile program exchanges "
        "through shared memory"
    ]


def test_the_suite_validates_every_lowering(monkeypatch: pytest.MonkeyPatch) -> None:
    """A lowering that returned a broken kernel fails the build in the test process (the
    conftest wraps the lowering functions, build.py's names for them included)."""
    import fusec.codegen.lower as lower

    finish = lower._KernelBuilder.finish

    def broken(self: lower._KernelBuilder) -> kir.Kernel:
        k = finish(self)
        return attrs.evolve(k, bindings=tuple(reversed(k.bindings)))

    monkeypatch.setattr(lower._KernelBuilder, "finish", broken)
    text = (
        "region twice(x: f32[N]) -> y: f32[N]\n    const N = 8\n    launch workgroup 64\n"
        "    y[i] = x[i] * 2.0\n"
    )
    with pytest.raises(AssertionError, match=r"invalid kernel IR:\n  twice: binding of 'y'"):
        build_source(text, "twice.fuse")
