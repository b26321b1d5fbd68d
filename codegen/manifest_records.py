"""The manifest as typed records: what `fusec build` writes to manifest.json and the runtime reads.

Input: a JSON object that meets the published schema (manifest.schema.json); `Manifest.from_json`
trusts that it does (runtime/prebuilt.py validates first) and builds frozen records from it.
Output: `to_json()` of any record gives back the JSON it came from, key for key and in the
writer's key order, so `to_json(from_json(d)) == d` for every manifest fusec writes.  The writer
(codegen/build.py) builds these records and serializes them with `to_json`, so writer and reader
share one description of the format.

The kernel-level records (expressions, buffers, constants, bindings, estimates, `Kernel`) are in
`manifest_kernel.py`, and re-exported here: readers import every record from this module.

Not checked here: the schema (`manifest.schema_error`) and the consistency of names, bindings
and ranges (`manifest.semantic_error`).  Pure data: no Vulkan, no shaderc.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import attrs

from fusec.dsl.instances import find_instance

from .manifest_kernel import (
    Binding,
    BinOp,
    Buffer,
    Const,
    ConstRef,
    Derived,
    Estimate,
    Expr,
    GridItem,
    Json,
    Kernel,
    Subgroup,
    expr_from_json,
    expr_to_json,
)

# the kernel-level records live in manifest_kernel.py; readers import every record from here
__all__ = [
    "BinOp",
    "Binding",
    "BudgetRule",
    "Buffer",
    "BuildOptions",
    "Const",
    "ConstRef",
    "Derived",
    "Estimate",
    "Expr",
    "GridItem",
    "Instance",
    "Json",
    "Kernel",
    "Launch",
    "Manifest",
    "Region",
    "StateWrite",
    "Subgroup",
    "Verdict",
    "expr_from_json",
    "expr_to_json",
]


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
class Instance:
    """What a region is an instance of (a dtype-generic region, dsl/instances.py): the generic
    region's name, its dtype parameters' bindings, the target whose `on` schedule lines it
    follows (None: every target)."""

    of: str
    bindings: tuple[tuple[str, str], ...]
    target: str | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Instance:
        return cls(d["of"], tuple(d["bindings"].items()), d["target"])

    def to_json(self) -> Json:
        return {"of": self.of, "bindings": dict(self.bindings), "target": self.target}

    @property
    def generic(self) -> str:
        """`of`, under the region IR's name for it (dsl.instances.InstanceLike)."""
        return self.of


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
    instance: Instance | None = None  # absent: a region of its own

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Region:
        instance = d.get("instance")
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
            Instance.from_json(instance) if instance is not None else None,
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
        if self.instance is not None:
            out["instance"] = self.instance.to_json()
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

    def instance(
        self,
        generic: str,
        dtypes: Mapping[str, str],
        target: str | None = None,
        consts: Mapping[str, int | float] | None = None,
    ) -> Region | None:
        """The instance of region `generic` whose buffers named in `dtypes` have those dtypes
        (`{"W": "q4_0"}`): the variant for `target` where there is one, the one whose defaults
        match `consts` best (dsl.instances.find_instance); a region that is no instance
        answers for itself.  None when there is none."""
        return find_instance(self.regions, generic, dtypes, target, consts)
