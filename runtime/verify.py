"""`check`: run fused, unfused and the numpy reference on fresh random inputs and compare.

Inputs are random normal values (never zeros); outputs are poisoned with NaN before each run;
every output is compared.  The error is normwise relative: max|got - ref| / max|ref| over the
finite places; the same infinity in both agrees, NaN against NaN only when non-finite inputs
are allowed (NaN is the poison), anything else non-finite is an infinite error.  The tolerance
is per dtype: the least precise dtype among the region's inputs and outputs picks it.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Mapping, Sequence

import attrs
import numpy as np

from fusec.codegen import manifest as mf
from fusec.codegen import manifest_records as mr
from fusec.dsl import ir
from fusec.dsl.bounds import overrun_at, write_problem_at
from fusec.dsl.diagnostics import DiagnosticError
from fusec.dsl.q8_0x import q8_0x_overflowed, q8_0x_values, quantize_q8_0x
from fusec.dsl.reference import run_reference, weight_blocks
from fusec.dsl.types import DType

from .device import Device, RuntimeFailure
from .dispatch import (
    NP_DTYPES,
    Build,
    RegionRunner,
    buffer_bytes,
    check_inputs,
    check_memory,
    check_runnable,
    const_values,
    format_bytes,
    region_at,
    shape_of,
)
from .gate import DriverCheck

# normwise relative error allowed, by the least precise dtype a region touches.  f32 kernels
# accumulate in f32 against a float64 reference (error ~ sqrt(K) * 2^-24); f16 storage rounds
# outputs to 2^-11.  Quantized weights: the reference dequantizes the same blocks with gguf (the
# values agree bit for bit, tests/codegen/test_quant.py), so only accumulation order differs; the
# f16 tolerance is kept for them as a margin.
TOLERANCE = {
    "f32": 1e-4,
    "f16": 2e-3,
    "q8_0": 2e-3,
    "q4_0": 2e-3,
    "q4_K": 2e-3,
    "q6_K": 2e-3,
    "u32": 1e-4,
    "i32": 1e-4,
    # a q8_0x input holds exact values (the reference reads the same blocks); see also
    # Q8_0X_OUTPUT_TOL
    "q8_0x": 1e-4,
}
_PRECISION_ORDER = ["q4_K", "q4_0", "q6_K", "q8_0", "f16", "f32", "q8_0x", "u32", "i32"]
# A q8_0x output is rounded from f32 values on the GPU and from float64 ones in the reference:
# where a value lies within f32 rounding of a quant boundary, the two round to neighbouring
# quants, one step = 1/127 of the block's largest value (compared, like every output,
# relative to the whole output's largest value).  Bit-exact rounding of given f32 values:
# tests/codegen/test_q8_0x.py.
Q8_0X_OUTPUT_TOL = 8e-3


def tolerance_for(region: mr.Region) -> tuple[str, float]:
    dtypes = {b.dtype for b in [*region.inputs, *region.outputs]}
    worst = next(d for d in _PRECISION_ORDER if d in dtypes)
    return worst, TOLERANCE[worst]


def tolerance_basis(b: mr.Buffer, precision: str) -> str:
    """What an output's tolerance comes from, as `fusec check` prints it beside the number:
    the output's own `tol`, a q8_0x output's one quant step, else the region's least precise
    dtype."""
    if b.tolerance is not None:
        return "declared"
    if b.dtype == DType.Q8_0X.value:
        return "q8_0x output"
    return precision


def output_tolerance(b: mr.Buffer, dtypes_tol: float) -> float:
    """The error an output may have: 0 for u32 and i32 (indices are exact), else its own
    `tol`, else that of the region's dtypes."""
    if b.dtype in ("u32", "i32"):
        return 0.0
    if b.tolerance is None and b.dtype == DType.Q8_0X.value:
        return max(dtypes_tol, Q8_0X_OUTPUT_TOL)
    return b.tolerance if b.tolerance is not None else dtypes_tol


def random_inputs(
    region: mr.Region, consts: Mapping[str, int | float], rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """Fresh random values for every input (and state output): standard normal, never zero;
    uniform over an input's declared range (`in LO .. HI`) where it has one.  GGUF weights are
    those values quantized by gguf, or, for a dtype the installed gguf cannot quantize
    (q4_K, q6_K), random valid blocks of the same magnitude (dsl.reference.weight_blocks)."""
    out = {}
    for b in [*region.inputs, *region.state_inputs()]:
        shape = shape_of(b, consts)
        dt = NP_DTYPES[b.dtype]
        values = b.values
        if b.dtype in ("u32", "i32"):
            lo, hi = values if values is not None else (1, 99)
            ints = rng.integers(int(lo), int(hi), size=shape, endpoint=True)
            ints[ints == 0] = hi or lo  # never zeros (0 can be a bound)
            out[b.name] = ints.astype(dt)
            continue
        elems = tuple(mf.eval_expr(d, consts) for d in b.shape)
        a: np.ndarray
        if values is not None:
            a = rng.uniform(values[0], values[1], size=elems)
            a[a == 0] = (values[0] + values[1]) / 2 or values[1]  # never zeros (0 can be a bound)
        else:
            # drawn in float32, the widest dtype an input has (less time and half the memory
            # of float64 draws; 40 of kernels.fuse's checks: 13 -> 11 s drawing)
            a = rng.standard_normal(size=elems, dtype=np.float32)
            a[a == 0] = 0.5  # never zeros
        if DType(b.dtype).is_quantized:
            out[b.name] = weight_blocks(a.astype(np.float32), DType(b.dtype), rng)
        elif b.dtype == DType.Q8_0X.value:  # a vector rounded to q8_0 blocks (aligned layout)
            out[b.name] = quantize_q8_0x(a.astype(np.float32))
        else:
            out[b.name] = a.astype(dt)
    return out


def comparable(b: mr.Buffer, a: np.ndarray, consts: Mapping[str, int | float]) -> np.ndarray:
    """An output as values to compare: a q8_0x output's blocks dequantized (gguf), else
    itself.  A block whose f16 scale overflowed (values past 65504 * 127) reads as +infinity,
    so that a product and the reference that both overflowed there agree, as the same infinity
    does in an f16 or f32 output (`relative_error`); gguf would read it as NaN."""
    if b.dtype != DType.Q8_0X.value:
        return a
    n = mf.eval_expr(b.shape[0], consts)
    return np.where(q8_0x_overflowed(a, n), np.float32(np.inf), q8_0x_values(a, n))


def relative_error(got: np.ndarray, ref: np.ndarray, allow_nonfinite: bool = False) -> float:
    """max|got - ref| / max|ref| over the places where both are finite.  A place where either
    is not finite agrees only when both hold the same infinity, or, with `allow_nonfinite`,
    both hold NaN; any other makes the error infinite.  NaN vs NaN needs the allowance because
    NaN is also the poison of an output no kernel wrote, and from finite inputs a NaN in the
    reference (0 / 0, the root of a negative) is a problem of the region, not a result."""
    g, r = got.astype(np.float64), ref.astype(np.float64)
    finite = np.isfinite(g) & np.isfinite(r)
    agree = finite | (np.isinf(r) & (g == r))
    if allow_nonfinite:
        agree |= np.isnan(g) & np.isnan(r)
    if not np.all(agree):
        return float("inf")
    if not np.any(finite):
        return 0.0
    scale = float(np.max(np.abs(r[finite])))
    err = float(np.max(np.abs(g[finite] - r[finite])))
    return err / max(scale, 1e-30)


def _nan_count(a: np.ndarray) -> int:
    return int(np.count_nonzero(np.isnan(a))) if a.dtype.kind == "f" else 0


@attrs.frozen
class OutputReport:
    name: str
    fused_error: float
    unfused_error: float
    tolerance: float
    reference_nans: int = 0  # NaNs the reference itself computed (counted without the allowance)
    basis: str = ""  # what the tolerance comes from (`tolerance_basis`); "" : the region's dtypes

    @property
    def ok(self) -> bool:
        return self.fused_error <= self.tolerance and self.unfused_error <= self.tolerance

    @property
    def used(self) -> float:
        """How much of the tolerance the worse error takes (an exact output, tolerance 0:
        none, or infinitely much)."""
        worst = max(self.fused_error, self.unfused_error)
        if self.tolerance == 0:
            return 0.0 if worst == 0 else math.inf
        return worst / self.tolerance


@attrs.frozen
class CheckReport:
    region: str
    device: str
    consts: dict[str, int | float]
    path: str
    fused_dispatches: int
    fused_barriers: int
    unfused_dispatches: int
    unfused_barriers: int
    subgroup_sizes: tuple[int, ...]
    precision: str
    outputs: tuple[OutputReport, ...]
    # the gate's confirmation of the fused kernels: estimate and driver numbers, where the
    # device reports pipeline statistics (runtime/gate.py DriverCheck)
    driver: tuple[DriverCheck, ...] = ()

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outputs)


def worst_of(reports: Sequence[CheckReport]) -> CheckReport:
    """One report for several draws of inputs (and settings of run-time params) of the same
    region: each output with its largest fused and unfused errors, and the path, counters and
    constants of the report that came nearest its tolerance (or went furthest past it)."""

    def used(r: CheckReport) -> float:
        return max((o.used for o in r.outputs), default=0)

    worst = max(reports, key=used)
    outputs = tuple(
        attrs.evolve(
            o,
            fused_error=max(r.outputs[i].fused_error for r in reports),
            unfused_error=max(r.outputs[i].unfused_error for r in reports),
        )
        for i, o in enumerate(worst.outputs)
    )
    return attrs.evolve(worst, outputs=outputs)


# numpy seeds are unsigned integers; `fusec check --seed` takes the same range
SEED_MAX = 2**64 - 1


def check_seed(seed: int | None) -> None:
    """Refuse a seed numpy would not take (it raises on a negative one) in one sentence."""
    if seed is None:
        return
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise RuntimeFailure(f"the seed must be an integer, not {seed!r}")
    if not 0 <= seed <= SEED_MAX:
        raise RuntimeFailure(f"the seed must be from 0 to {SEED_MAX}, not {seed}")


def host_memory_bytes() -> int | None:
    """This machine's physical memory (None where the OS does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return None


def check_host_memory(region: mr.Region, consts: Mapping[str, int | float]) -> None:
    """Refuse a check whose numpy reference cannot fit in this machine's memory: it holds
    every input and output as float64 or int64, 8 bytes an element, whatever their dtype."""
    elements = sum(
        math.prod(mf.eval_expr(d, consts) for d in b.shape)
        for b in [*region.inputs, *region.outputs]
    )
    have = host_memory_bytes()
    if have is not None and 8 * elements > have:
        raise RuntimeFailure(
            f"the numpy reference of {region_at(region, consts)} would need at least "
            f"{format_bytes(8 * elements)} of host memory, more than the "
            f"{format_bytes(have)} of this machine",
            "choose smaller constants",
        )


def select_consts(
    build: Build,
    regions: Sequence[ir.Region],
    consts: Mapping[str, int | float],
    dev: Device | None = None,
) -> dict[str, dict[str, int | float]]:
    """The overrides each selected region takes (`fusec check --const`: a name may belong to
    some of the regions only), refused in one sentence before anything runs when a name belongs
    to none of them or a value does not fit a region that takes it (or, given `dev`, makes
    buffers that the device or the reference cannot hold)."""
    known = list(dict.fromkeys(c.name for r in regions for c in r.consts))
    for name in consts:
        if name not in known:
            raise RuntimeFailure(
                f"no selected region has a constant '{name}' "
                f"(constants: {', '.join(known) or 'none'})"
            )
    out = {}
    for r in regions:
        mine = {k: v for k, v in consts.items() if any(c.name == k for c in r.consts)}
        region = build.region(r.name)
        values = const_values(region, mine)
        check_runnable(region, values)
        overrun = overrun_at(r, values)
        if overrun is not None:
            raise DiagnosticError([overrun])
        if dev is not None:
            check_memory(dev, buffer_bytes(region, values), region_at(region, values))
            check_host_memory(region, values)
        out[r.name] = mine
    return out


def param_points(
    build: Build, region_ir: ir.Region, values: Mapping[str, int | float]
) -> list[dict[str, int | float]]:
    """The values `fusec check` runs a region's run-time params at, when `values` does not set
    them: the low end of the declared range, the next integer (not for an f32 param), the middle
    and the high end
    (issue 15: an error that appears only late in a range, such as RoPE's angles, is found).
    A value at which an index of the region would leave its dimension at these constants (a
    cache row `pos` past `C`) is replaced by the largest one below it that stays inside, found by
    bisection (an index grows with its param).  A point at which masked writes leave an output
    unwritten or write it twice is not moved: DiagnosticError at the stage, as `--const` gives.
    One dict per point, every param in it; [{}] for a region without params."""
    params = [c for c in region_ir.consts if c.runtime and c.name not in values]
    if not params:
        return [{}]
    region = build.region(region_ir.name)

    def fits(point: Mapping[str, int | float]) -> bool:
        try:
            at = const_values(region, {**values, **point})
        except RuntimeFailure:
            return False
        # an index past its dimension moves the point; writes that leave an output unwritten
        # or write it twice there do not: the run is refused at that point, and says why (it
        # moved off such a value and reported ok; a new-user probe)
        return overrun_at(region_ir, at, coverage=False) is None

    base = {c.name: c.lo if c.lo is not None else c.default for c in params}
    points: list[dict[str, int | float]] = []
    for step in range(4):
        point = dict(base)
        for c in params:
            lo = c.lo if c.lo is not None else c.default
            hi = c.hi if c.hi is not None else c.default
            if c.dtype.is_int:
                v: int | float = int(min(max((lo, lo + 1, (lo + hi) / 2, hi)[step], lo), hi))
            else:  # a real: its low end, middle and high end, as the f32 the kernels read
                v = f32_inside((lo, lo, (lo + hi) / 2, hi)[step], lo, hi)
            if not fits({**point, c.name: v}):
                low, high = lo, v  # lo fits (or nothing does); v does not
                while c.dtype.is_int and high - low > 1:
                    mid = (int(low) + int(high)) // 2
                    low, high = (mid, high) if fits({**point, c.name: mid}) else (low, mid)
                v = low
            point[c.name] = v
        if point not in points:
            points.append(point)
    for point in points:
        # writes that do not cover an output exactly once at a point of the params' ranges:
        # refused as `--const` refuses them, at the stage, before any dispatch
        problem = write_problem_at(region_ir, const_values(region, {**values, **point}))
        if problem is not None:
            raise DiagnosticError([problem])
    return points


def f32_inside(v: float, lo: float, hi: float) -> float:
    """`v` rounded to the f32 nearest it that lies in `lo .. hi` (an f32 param's value is the
    f32 the kernels read, so the reference computes with that very value)."""
    x = np.float32(v)
    # compared as doubles: numpy would round `hi` to f32 first (NEP 50) and see no difference
    if float(x) > hi:
        x = np.nextafter(x, np.float32(-np.inf))
    if float(x) < lo:
        x = np.nextafter(x, np.float32(np.inf))
    return float(x)


def _out_of_memory(region: mr.Region, values: Mapping[str, int | float]) -> RuntimeFailure:
    return RuntimeFailure(
        f"this machine ran out of memory drawing inputs for {region_at(region, values)} "
        "or computing its numpy reference",
        "choose smaller constants",
    )


def check_region(
    dev: Device,
    build: Build,
    region_ir: ir.Region,
    consts: Mapping[str, int | float] | None = None,
    seed: int | None = None,
    target: str | None = None,
    min_waves: int | None = None,
    allow_nonfinite: bool = False,
) -> CheckReport:
    """Fused, unfused and the numpy reference on one draw of random inputs, every output
    compared.  Constants, seed and sizes are checked before anything is drawn or allocated.
    `allow_nonfinite`: run on inputs holding NaN or infinity (drawn from a value range beyond
    their dtype) instead of refusing them, and count NaN where the reference has NaN as equal."""
    dev.check_open()
    check_seed(seed)
    region = build.region(region_ir.name)
    values = const_values(region, consts)
    check_runnable(region, values)
    check_memory(dev, buffer_bytes(region, values), region_at(region, values))
    check_host_memory(region, values)
    try:
        # a value range beyond its dtype overflows to infinity, and the reference's f32 outputs
        # may too: check_inputs and relative_error judge them; numpy need not warn
        with np.errstate(all="ignore"):
            inputs = random_inputs(region, values, np.random.default_rng(seed))
            check_inputs(region, inputs, values, allow_nonfinite)
    except MemoryError:
        raise _out_of_memory(region, values) from None
    runner = RegionRunner(dev, build, region_ir.name, values, target, min_waves)
    try:
        fused = runner.run(inputs, fused=True, allow_nonfinite=allow_nonfinite, checked=True)
        unfused = runner.run(inputs, fused=False, allow_nonfinite=allow_nonfinite, checked=True)
        # stages stored as q8_0: the chain's rounding settles the reference's values that lie
        # within f32 error of a rounding boundary (dsl.reference.round_to_blocks)
        rounded = {
            s.name: v
            for s in region_ir.all_stages()
            if s.stored == DType.Q8_0 and (v := runner.intermediate_values(s.name)) is not None
        }
    finally:
        runner.close()
    try:
        with np.errstate(all="ignore"):  # as for the inputs above
            ref = run_reference(region_ir, inputs, values, device_rounded=rounded)
    except MemoryError:
        raise _out_of_memory(region, values) from None
    precision, tol = tolerance_for(region)
    outs = tuple(
        OutputReport(
            b.name,
            relative_error(
                comparable(b, fused.outputs[b.name], values),
                comparable(b, ref[b.name], values),
                allow_nonfinite,
            ),
            relative_error(
                comparable(b, unfused.outputs[b.name], values),
                comparable(b, ref[b.name], values),
                allow_nonfinite,
            ),
            output_tolerance(b, tol),
            0 if allow_nonfinite else _nan_count(comparable(b, ref[b.name], values)),
            tolerance_basis(b, precision),
        )
        for b in region.outputs
    )
    return CheckReport(
        region_ir.name,
        dev.info.name,
        values,
        fused.path,
        fused.dispatches,
        fused.barriers,
        unfused.dispatches,
        unfused.barriers,
        fused.subgroup_sizes,
        precision,
        outs,
        fused.driver,
    )
