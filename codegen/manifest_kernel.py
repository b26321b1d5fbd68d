"""The manifest's kernel-level records (codegen/manifest_records.py holds the region and the
manifest around them): size expressions, buffers, constants, the subgroup request, bindings, the
grid, derived constants, register and occupancy estimates, and the kernel record.

Input: parts of a manifest JSON that meets the schema.  Output: frozen records whose `to_json()`
gives the same JSON back.  Not checked here: the schema and the consistency of names
(`manifest.schema_error`, `manifest.semantic_error`)."""

from __future__ import annotations

from collections.abc import Mapping
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
class Packed:
    """How a GGUF weight input is laid out on the device (dsl/packing.py): the runtime makes
    `layout` from the GGUF bytes at upload.  `version` is the layout's (dsl.packing
    PACKING_VERSION); the schema accepts only the one this fusec writes."""

    layout: str
    version: int

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Packed:
        return cls(d["layout"], d["version"])

    def to_json(self) -> Json:
        return {"layout": self.layout, "version": self.version}


@attrs.frozen
class Buffer:
    """An input, output or intermediate buffer of a region.  `values` is the declared range of
    its elements, `tolerance` the relative error a check accepts on it; `state` marks an output
    whose contents before a run are an input too; `packing`, a weight input the runtime
    repacks at upload (every kernel of the region reads that layout)."""

    name: str
    dtype: str
    shape: tuple[Expr, ...]
    state: bool = False
    values: tuple[float, float] | None = None
    tolerance: float | None = None
    packing: Packed | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Buffer:
        values = d.get("values")
        packing = d.get("packing")
        return cls(
            d["name"],
            d["dtype"],
            _exprs(d["shape"]),
            d.get("state", False),
            (values[0], values[1]) if values is not None else None,
            d.get("tolerance"),
            Packed.from_json(packing) if packing is not None else None,
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
        if self.packing is not None:
            out["packing"] = self.packing.to_json()
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
    constants: integer divisions of constants (glsl_expr._Derived)."""

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
    demand ACO's scheduler may raise `vgprs` to (codegen/liveness_moves.py `_move_loads_up`)."""

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
