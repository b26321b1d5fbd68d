"""`check`: run fused, unfused and the numpy reference on fresh random inputs and compare.

Inputs are random normal values (never zeros); outputs are poisoned with NaN before each run;
every output is compared.  The error is normwise relative: max|got - ref| / max|ref|.  The
tolerance is per dtype: the least precise dtype among the region's inputs and outputs picks it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from codegen import manifest as mf
from dsl import ir
from dsl.reference import quantize, run_reference
from dsl.types import DType

from .device import Device
from .dispatch import NP_DTYPES, Build, RegionRunner, check_runnable, const_values, shape_of

# normwise relative error allowed, by the least precise dtype a region touches.  f32 kernels
# accumulate in f32 against a float64 reference (error ~ sqrt(K) * 2^-24); f16 storage rounds
# outputs to 2^-11.  Quantized weights: the reference dequantizes the same blocks with gguf (the
# values agree bit for bit, tests/codegen/test_quant.py), so only accumulation order differs; the
# f16 tolerance is kept for them as a margin.
TOLERANCE = {"f32": 1e-4, "f16": 2e-3, "q8_0": 2e-3, "q4_0": 2e-3, "u32": 1e-4, "i32": 1e-4}
_PRECISION_ORDER = ["q4_0", "q8_0", "f16", "f32", "u32", "i32"]


def tolerance_for(region: Mapping[str, Any]) -> tuple[str, float]:
    dtypes = {b["dtype"] for b in [*region["inputs"], *region["outputs"]]}
    worst = next(d for d in _PRECISION_ORDER if d in dtypes)
    return worst, TOLERANCE[worst]


def random_inputs(
    region: Mapping[str, Any], consts: Mapping[str, int | float], rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """Fresh random values for every input (and state output): standard normal, never zero;
    uniform over an input's declared range (`in LO .. HI`) where it has one."""
    out = {}
    for b in [*region["inputs"], *(o for o in region["outputs"] if o.get("state"))]:
        shape = shape_of(b, consts)
        dt = NP_DTYPES[b["dtype"]]
        values = b.get("values")
        if b["dtype"] in ("u32", "i32"):
            lo, hi = values if values is not None else (1, 99)
            ints = rng.integers(int(lo), int(hi), size=shape, endpoint=True)
            ints[ints == 0] = hi or lo  # never zeros (0 can be a bound)
            out[b["name"]] = ints.astype(dt)
            continue
        elems = tuple(mf.eval_json(d, consts) for d in b["shape"])
        if values is not None:
            a = rng.uniform(values[0], values[1], size=elems)
            a[a == 0] = (values[0] + values[1]) / 2 or values[1]  # never zeros (0 can be a bound)
        else:
            a = rng.standard_normal(size=elems)
            a[a == 0] = 0.5  # never zeros
        if b["dtype"] in ("q8_0", "q4_0"):
            out[b["name"]] = quantize(a.astype(np.float32), DType(b["dtype"]))
        else:
            out[b["name"]] = a.astype(dt)
    return out


def relative_error(got: np.ndarray, ref: np.ndarray) -> float:
    g, r = got.astype(np.float64), ref.astype(np.float64)
    scale = float(np.max(np.abs(r))) if r.size else 1.0
    err = float(np.max(np.abs(g - r))) if r.size else 0.0
    if not np.all(np.isfinite(g)):
        return float("inf")
    return err / max(scale, 1e-30)


@attrs.frozen
class OutputReport:
    name: str
    fused_error: float
    unfused_error: float
    tolerance: float

    @property
    def ok(self) -> bool:
        return self.fused_error <= self.tolerance and self.unfused_error <= self.tolerance


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

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outputs)


def worst_of(reports: Sequence[CheckReport]) -> CheckReport:
    """One report for several draws of inputs to the same region: each output with its largest
    fused and unfused errors (the first report's path, counters and constants)."""
    outputs = tuple(
        attrs.evolve(
            o,
            fused_error=max(r.outputs[i].fused_error for r in reports),
            unfused_error=max(r.outputs[i].unfused_error for r in reports),
        )
        for i, o in enumerate(reports[0].outputs)
    )
    return attrs.evolve(reports[0], outputs=outputs)


def check_region(
    dev: Device,
    build: Build,
    region_ir: ir.Region,
    consts: Mapping[str, int | float] | None = None,
    seed: int | None = None,
    target: str | None = None,
    min_waves: int | None = None,
) -> CheckReport:
    region = build.region(region_ir.name)
    values = const_values(region, consts)
    check_runnable(region, values)
    rng = np.random.default_rng(seed)
    inputs = random_inputs(region, values, rng)
    ref = run_reference(region_ir, inputs, values)
    runner = RegionRunner(dev, build, region_ir.name, values, target, min_waves)
    try:
        fused = runner.run(inputs, fused=True)
        unfused = runner.run(inputs, fused=False)
    finally:
        runner.close()
    precision, tol = tolerance_for(region)
    outs = tuple(
        OutputReport(
            b["name"],
            relative_error(fused.outputs[b["name"]], ref[b["name"]]),
            relative_error(unfused.outputs[b["name"]], ref[b["name"]]),
            tol,
        )
        for b in region["outputs"]
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
    )
