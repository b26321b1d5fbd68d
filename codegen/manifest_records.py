"""The manifest as typed records: what `fusec build` writes to manifest.json and the runtime reads.

Input: a JSON object that meets the published schema (manifest.schema.json); `Manifest.from_json`
trusts that it does (runtime/prebuilt.py validates first) and builds frozen records from it.
Output: `to_json()` of any record gives back the JSON it came from, key for key and in the
writer's key order, so `to_json(from_json(d)) == d` for every manifest fusec writes.  The writer
(codegen/build.py) builds these records and serializes them with `to_json`, so writer and reader
share one description of the format.

Not checked here: the schema (`manifest.schema_error`) and the consistency of names, bindings
and ranges (`manifest.semantic_error`).  Pure data: no Vulkan, no shaderc.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Union

import attrs

Json = dict[str, Any]


# ---- size expressions: int | {"const": name} | {"op": "+", "lhs": ..., "rhs": ...} ----


@attrs.frozen
class ConstRef:
    """A region constant, by name (`{"const": "K"}`)."""

    name: str


@attrs.frozen
class BinOp:
    """`lhs op rhs` in unsigned integer arithmetic; `op` is one of + - * / %."""

    op: str
    lhs: Expr
    rhs: Expr


Expr = Union[int, ConstRef, BinOp]


def expr_from_json(e: Any) -> Expr:
    if isinstance(e, int):
        return e
    if "const" in e:
        return ConstRef(e["const"])
    return BinOp(e["op"], expr_from_json(e["lhs"]), expr_from_json(e["rhs"]))


def expr_to_json(e: Expr) -> Any:
    if isinstance(e, int):
        return e
    if isinstance(e, ConstRef):
        return {"const": e.name}
    return {"op": e.op, "lhs": expr_to_json(e.lhs), "rhs": expr_to_json(e.rhs)}


def _exprs(items: Any) -> tuple[Expr, ...]:
    return tuple(expr_from_json(e) for e in items)


# ---- buffers and constants ----


@attrs.frozen
class Buffer:
    """An input, output or intermediate buffer of a region.  `values` is the declared range of
    its elements, `tolerance` the relative error a check accepts on it; `state` marks an output
    whose contents before a run are an input too."""

    name: str
    dtype: str
    shape: tuple[Expr, ...]
    state: bool = False
    values: tuple[float, float] | None = None
    tolerance: float | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Buffer:
        values = d.get("values")
        return cls(
            d["name"],
            d["dtype"],
            _exprs(d["shape"]),
            d.get("state", False),
            (values[0], values[1]) if values is not None else None,
            d.get("tolerance"),
        )

    def to_json(self) -> Json:
        out: Json = {
            "name": self.name,
            "dtype": self.dtype,
            "shape": [expr_to_json(e) for e in self.shape],
        }
        if self.state:
            out["state"] = True
        if self.values is not None:
            out["values"] = list(self.values)
        if self.tolerance is not None:
            out["tolerance"] = self.tolerance
        return out


@attrs.frozen
class Const:
    """A region constant: a specialization constant (`spec_id` below 1000), or a run-time
    parameter (`runtime`: `spec_id` is its slot in the parameter buffer).  `lo` and `hi` are
    the declared range (JSON `min`, `max`)."""

    name: str
    dtype: str
    default: int | float
    lo: int | float | None
    hi: int | float | None
    spec_id: int
    runtime: bool

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Const:
        return cls(
            d["name"], d["dtype"], d["default"], d["min"], d["max"], d["spec_id"], d["runtime"]
        )

    def to_json(self) -> Json:
        return {
            "name": self.name,
            "dtype": self.dtype,
            "default": self.default,
            "min": self.lo,
            "max": self.hi,
            "spec_id": self.spec_id,
            "runtime": self.runtime,
        }


@attrs.frozen
class Subgroup:
    """A subgroup-size requirement: `any`, `at_least` sizes[0], or a `choice` of sizes."""

    kind: str
    sizes: tuple[int, ...]

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Subgroup:
        return cls(d["kind"], tuple(d["sizes"]))

    def to_json(self) -> Json:
        return {"kind": self.kind, "sizes": list(self.sizes)}

    def allows(self, size: int) -> bool:
        """Whether `size` meets the requirement (the rule of dsl.ir.SubgroupReq.allows)."""
        if self.kind == "any":
            return True
        if self.kind == "at_least":
            return size >= self.sizes[0]
        return size in self.sizes  # "choice"

    def wanted(self) -> str:
        """The requirement for a message: `any`, `>= 64`, `32 | 64`."""
        if self.kind == "any":
            return "any"
        if self.kind == "at_least":
            return f">= {self.sizes[0]}"
        return " | ".join(map(str, self.sizes))


# ---- kernels ----


@attrs.frozen
class Binding:
    """A storage buffer of descriptor set 0: its binding number and the region buffer bound."""

    binding: int
    buffer: str
    reads: bool
    writes: bool

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Binding:
        return cls(d["binding"], d["buffer"], d["reads"], d["writes"])

    def to_json(self) -> Json:
        return {
            "binding": self.binding,
            "buffer": self.buffer,
            "reads": self.reads,
            "writes": self.writes,
        }


@attrs.frozen
class GridItem:
    """One phase's work: `extent` items, either `per_workgroup` each or `rows_per_subgroup` per
    subgroup (exactly one of the two is set)."""

    extent: Expr
    per_workgroup: int | None
    rows_per_subgroup: int | None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> GridItem:
        return cls(expr_from_json(d["extent"]), d["per_workgroup"], d["rows_per_subgroup"])

    def to_json(self) -> Json:
        return {
            "extent": expr_to_json(self.extent),
            "per_workgroup": self.per_workgroup,
            "rows_per_subgroup": self.rows_per_subgroup,
        }


@attrs.frozen
class Derived:
    """A specialization constant (id 1000 and up) the runtime computes from the region's
    constants: integer divisions of constants (glsl._Derived)."""

    spec_id: int
    expr: Expr

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Derived:
        return cls(d["spec_id"], expr_from_json(d["expr"]))

    def to_json(self) -> Json:
        return {"spec_id": self.spec_id, "expr": expr_to_json(self.expr)}


@attrs.frozen
class Estimate:
    """The register and occupancy estimate of a kernel on one target at one wave size
    (codegen/estimate.py); `uncertain` says why it may be wrong, when it may; `loads_up` is the
    demand ACO's scheduler may raise `vgprs` to (codegen/liveness.py `_move_loads_up`)."""

    target: str
    wave: int
    vgprs: int
    sgprs: int
    lds_bytes: int
    spills: int
    waves_per_simd: int
    uncertain: str = ""
    loads_up: int = 0

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Estimate:
        return cls(
            d["target"],
            d["wave"],
            d["vgprs"],
            d["sgprs"],
            d["lds_bytes"],
            d["spills"],
            d["waves_per_simd"],
            d.get("uncertain", ""),
            d.get("loads_up", d["vgprs"]),
        )

    def to_json(self) -> Json:
        out: Json = {
            "target": self.target,
            "wave": self.wave,
            "vgprs": self.vgprs,
            "sgprs": self.sgprs,
            "lds_bytes": self.lds_bytes,
            "spills": self.spills,
            "waves_per_simd": self.waves_per_simd,
            "loads_up": self.loads_up,
        }
        if self.uncertain:
            out["uncertain"] = self.uncertain
        return out


@attrs.frozen
class Kernel:
    """One compute kernel: its SPIR-V file and sha256, its launch shape, bindings, shared
    memory (`shared_floats`: 32-bit words of each shared array), grid, the Vulkan features it
    needs, the outputs zeroed before it runs (split-K adds into them), its arrival counters,
    derived specialization
    constants, estimates per target and wave, and, in an unfused repeat, its `loop` id and
    `loop_count`."""

    name: str
    spv: str
    sha256: str
    stages: tuple[str, ...]
    workgroup_size: int
    subgroup: Subgroup
    bindings: tuple[Binding, ...]
    shared_floats: tuple[Expr, ...]
    reduction_scratch: bool
    exchange_scratch: bool
    grid: tuple[GridItem, ...]
    features: tuple[str, ...]
    zero_outputs: tuple[str, ...]
    derived: tuple[Derived, ...]
    estimates: tuple[Estimate, ...]
    loop: int | None
    loop_count: Expr | None
    exchange: str | None
    # arrival counters (u32 intermediates): zeroed once when allocated, left at zero by every
    # dispatch (the last workgroup resets them); written only when there are some
    counters: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Kernel:
        count = d["loop_count"]
        return cls(
            d["name"],
            d["spv"],
            d["sha256"],
            tuple(d["stages"]),
            d["workgroup_size"],
            Subgroup.from_json(d["subgroup"]),
            tuple(Binding.from_json(b) for b in d["bindings"]),
            _exprs(d["shared_floats"]),
            d["reduction_scratch"],
            d["exchange_scratch"],
            tuple(GridItem.from_json(g) for g in d["grid"]),
            tuple(d["features"]),
            tuple(d["zero_outputs"]),
            tuple(Derived.from_json(x) for x in d["derived"]),
            tuple(Estimate.from_json(e) for e in d["estimates"]),
            d["loop"],
            expr_from_json(count) if count is not None else None,
            d["exchange"],
            tuple(d.get("counters", ())),
        )

    def to_json(self) -> Json:
        out: Json = {
            "name": self.name,
            "spv": self.spv,
            "sha256": self.sha256,
            "stages": list(self.stages),
            "workgroup_size": self.workgroup_size,
            "subgroup": self.subgroup.to_json(),
            "bindings": [b.to_json() for b in self.bindings],
            "shared_floats": [expr_to_json(e) for e in self.shared_floats],
            "reduction_scratch": self.reduction_scratch,
            "exchange_scratch": self.exchange_scratch,
            "grid": [g.to_json() for g in self.grid],
            "features": list(self.features),
            "zero_outputs": list(self.zero_outputs),
            "derived": [x.to_json() for x in self.derived],
            "estimates": [e.to_json() for e in self.estimates],
            "loop": self.loop,
            "loop_count": expr_to_json(self.loop_count) if self.loop_count is not None else None,
            "exchange": self.exchange,
        }
        if self.counters:
            out["counters"] = list(self.counters)
        return out

    def estimate(self, target: str, wave: int) -> Estimate | None:
        """The estimate on `target` at subgroup size `wave`, if the manifest has one."""
        return next((e for e in self.estimates if e.target == target and e.wave == wave), None)


# ---- regions ----


@attrs.frozen
class StateWrite:
    """A state output written at a run-time index: dimension `axis` of `buffer` at constant
    `at` (the index must lie inside the dimension)."""

    buffer: str
    axis: int
    at: str

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> StateWrite:
        return cls(d["buffer"], d["axis"], d["at"])

    def to_json(self) -> Json:
        return {"buffer": self.buffer, "axis": self.axis, "at": self.at}


@attrs.frozen
class Launch:
    """The region's launch shape as its source declares it."""

    workgroup: int
    subgroup: Subgroup
    rows_per_subgroup: int

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Launch:
        return cls(d["workgroup"], Subgroup.from_json(d["subgroup"]), d["rows_per_subgroup"])

    def to_json(self) -> Json:
        return {
            "workgroup": self.workgroup,
            "subgroup": self.subgroup.to_json(),
            "rows_per_subgroup": self.rows_per_subgroup,
        }


@attrs.frozen
class BudgetRule:
    """`budget waves >= N [on T]`, `budget vgprs <= N [on T]`, `budget spills <= N [on T]`:
    `key`, `limit` and the target it is for (None: every target)."""

    key: str
    limit: int
    target: str | None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> BudgetRule:
        return cls(d["key"], d["limit"], d["target"])

    def to_json(self) -> Json:
        return {"key": self.key, "limit": self.limit, "target": self.target}


@attrs.frozen
class Verdict:
    """The budget gate's verdict on the fused product for one target at one wave size, made at
    build time on the estimates (JSON: `verdicts[target][str(wave)]`)."""

    target: str
    wave: int
    accepted: bool
    reason: str


def _verdicts_from_json(d: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> tuple[Verdict, ...]:
    return tuple(
        Verdict(target, int(wave), v["accepted"], v["reason"])
        for target, by_wave in d.items()
        for wave, v in by_wave.items()
    )


def _verdicts_to_json(verdicts: tuple[Verdict, ...]) -> Json:
    out: Json = {}
    for v in verdicts:
        out.setdefault(v.target, {})[str(v.wave)] = {"accepted": v.accepted, "reason": v.reason}
    return out


@attrs.frozen
class Region:
    """One region of the source and its products: the `fused` kernels, the `unfused` chain
    (the fallback), and, for a tile whose lane group may be wider than a device's subgroup,
    `fused_shared`, the fused kernels exchanging through shared memory (empty when there is
    none).  `line` is where the source declares it."""

    name: str
    line: int
    inputs: tuple[Buffer, ...]
    outputs: tuple[Buffer, ...]
    consts: tuple[Const, ...]
    state_writes: tuple[StateWrite, ...]
    launch: Launch
    budget: tuple[BudgetRule, ...]
    verdicts: tuple[Verdict, ...]
    fused: tuple[Kernel, ...]
    unfused: tuple[Kernel, ...]
    intermediates: tuple[Buffer, ...]
    fused_shared: tuple[Kernel, ...] = ()

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Region:
        return cls(
            d["name"],
            d["line"],
            tuple(Buffer.from_json(b) for b in d["inputs"]),
            tuple(Buffer.from_json(b) for b in d["outputs"]),
            tuple(Const.from_json(c) for c in d["consts"]),
            tuple(StateWrite.from_json(w) for w in d["state_writes"]),
            Launch.from_json(d["launch"]),
            tuple(BudgetRule.from_json(r) for r in d["budget"]),
            _verdicts_from_json(d["verdicts"]),
            tuple(Kernel.from_json(k) for k in d["fused"]),
            tuple(Kernel.from_json(k) for k in d["unfused"]),
            tuple(Buffer.from_json(b) for b in d["intermediates"]),
            tuple(Kernel.from_json(k) for k in d.get("fused_shared", ())),
        )

    def to_json(self) -> Json:
        out: Json = {
            "name": self.name,
            "line": self.line,
            "inputs": [b.to_json() for b in self.inputs],
            "outputs": [b.to_json() for b in self.outputs],
            "consts": [c.to_json() for c in self.consts],
            "state_writes": [w.to_json() for w in self.state_writes],
            "launch": self.launch.to_json(),
            "budget": [r.to_json() for r in self.budget],
            "verdicts": _verdicts_to_json(self.verdicts),
            "fused": [k.to_json() for k in self.fused],
            "unfused": [k.to_json() for k in self.unfused],
            "intermediates": [b.to_json() for b in self.intermediates],
        }
        if self.fused_shared:
            out["fused_shared"] = [k.to_json() for k in self.fused_shared]
        return out

    def kernels(self) -> Iterator[Kernel]:
        """Every kernel: fused, unfused, and the shared-exchange alternative."""
        yield from self.fused
        yield from self.unfused
        yield from self.fused_shared

    def counters(self) -> frozenset[str]:
        """The intermediates that are arrival counters: zero when allocated, never poisoned."""
        return frozenset(c for k in self.kernels() for c in k.counters)

    def buffers(self) -> tuple[Buffer, ...]:
        """Inputs, outputs and intermediates, in that order."""
        return (*self.inputs, *self.outputs, *self.intermediates)

    def buffer(self, name: str) -> Buffer | None:
        """The buffer called `name`, if the region has one."""
        return next((b for b in self.buffers() if b.name == name), None)

    def const(self, name: str) -> Const | None:
        """The constant called `name`, if the region has one."""
        return next((c for c in self.consts if c.name == name), None)

    def params(self) -> tuple[Const, ...]:
        """The run-time parameters, in buffer-slot order."""
        return tuple(sorted((c for c in self.consts if c.runtime), key=lambda c: c.spec_id))

    def state_inputs(self) -> tuple[Buffer, ...]:
        """State outputs: their contents before the run are inputs too."""
        return tuple(b for b in self.outputs if b.state)

    def verdict(self, target: str, wave: int) -> Verdict | None:
        """The build's verdict on `target` at `wave`, if the manifest has one."""
        return next((v for v in self.verdicts if v.target == target and v.wave == wave), None)


# ---- the whole manifest ----


@attrs.frozen
class BuildOptions:
    """What the build was asked for: the targets whose limits the source was checked against
    (empty: every known target) and the regions built (empty: all of the source's)."""

    targets: tuple[str, ...] = ()
    regions: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> BuildOptions:
        return cls(tuple(d["targets"]), tuple(d["regions"]))

    def to_json(self) -> Json:
        return {"targets": list(self.targets), "regions": list(self.regions)}


@attrs.frozen
class Manifest:
    """A build folder's manifest.json.  `integrity` is the sha256 of the rest (`manifest.seal`);
    `build_key` and `glsl_sha256` make a rebuild of an intact folder a no-op; the three are
    optional in the format (None or absent: an older or hand-made manifest)."""

    format: str
    integrity: str
    source: str
    source_copy: str
    compiler: str
    compiler_id: str
    regions: tuple[Region, ...]
    build_key: str | None = None
    glsl_sha256: str | None = None
    build_options: BuildOptions | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Manifest:
        options = d.get("build_options")
        return cls(
            d["format"],
            d["integrity"],
            d["source"],
            d["source_copy"],
            d["compiler"],
            d["compiler_id"],
            tuple(Region.from_json(r) for r in d["regions"]),
            d.get("build_key"),
            d.get("glsl_sha256"),
            BuildOptions.from_json(options) if options is not None else None,
        )

    def to_json(self) -> Json:
        out: Json = {
            "format": self.format,
            "integrity": self.integrity,
            "source": self.source,
            "source_copy": self.source_copy,
            "compiler": self.compiler,
            "compiler_id": self.compiler_id,
        }
        if self.build_key is not None:
            out["build_key"] = self.build_key
        if self.glsl_sha256 is not None:
            out["glsl_sha256"] = self.glsl_sha256
        if self.build_options is not None:
            out["build_options"] = self.build_options.to_json()
        out["regions"] = [r.to_json() for r in self.regions]
        return out

    @property
    def options(self) -> BuildOptions:
        """`build_options`, or the defaults (every target, every region) when absent."""
        return self.build_options if self.build_options is not None else BuildOptions()

    def region(self, name: str) -> Region | None:
        """The region called `name`, if the manifest has one."""
        return next((r for r in self.regions if r.name == name), None)
