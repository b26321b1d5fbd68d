"""Dtype-generic regions and schedule lines: `syntax.Module` -> the concrete regions to check.

Input: the parsed module.  Output: every region the checker sees, in source order, with the
diagnostics found here.  A region `R<Wt in f16, q4_0>(..., W: Wt[N, K])` becomes one region per
choice of its dtype parameters (an *instance*, `Region.instance` says which), and every region's
`schedule` lines are applied to it: the lines that hold for the instance (`when Wt in ...`) and
target (`on T`), the most specific line winning where two set the same thing, as budget rules do
(a line with `on` beats one without; then one with `when` beats one without; the region's own
`launch` line and stage layouts come last).

Naming (README "Dtype-generic regions"): the instance of the first choice of every parameter
keeps the region's name; any other is `R_<dtype>` (with several parameters, `R_<d1>_<d2>`), its
display name `R<q4_0>`.  An `instance NAME = R<q4_0> with K = 12288` line adds one instance under
a name of its own with other constant defaults; with an indented block of schedule lines under
it, the instance takes those lines instead of the region's.  An instance with lines `on T` gets
a variant for that target, `R_<dtype>__T` (display `R<q4_0> on T`).

What a schedule line does to an instance:
- `workgroup 512, rows_per_subgroup 1`: the launch items of those keys;
- `gate, up layout k -> lane x 32`: the layout items of those indices, on those stages;
- `xn as q8_0` / `xn in shared as q8_0`: a stage's placement and stored dtype; on an input,
  `x in shared as q8_0` adds a stage `xq[k] = x[k]` first and every stage reads `xq` for `x`;
- `const N = 1024`: a constant's default (and range, when given);
- `int8 dot`: a requirement, checked here: every contraction over a weight whose dtype is a
  dtype parameter must take integer dot products (a quantized weight, an activation rounded to
  q8_0, a whole block per lane).
A quantized weight's block raises the lower bound of the constant that is its last dimension
(32 for q8_0 / q4_0, 256 for the K-quants), so the generic region states the f16 range.

Not checked here: anything the checker checks on each instance (check.py, which names the
instance in a note on each of its diagnostics).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Protocol, TypeVar

import attrs

from . import syntax as S
from .diagnostics import Diagnostic
from .packing import Packing
from .schedule import STAGED_SUFFIX, apply_schedule, bind_dtypes, flat_stages, holds
from .span import Span
from .types import BUFFER_DTYPES, DType


def instance_name(generic: str, bindings: Sequence[tuple[str, str]], first: bool) -> str:
    """The name of an instance: the generic name for the first choice of every parameter,
    else the generic name and each bound dtype joined by '_'."""
    if first:
        return generic
    return "_".join([generic, *(d for _, d in bindings)])


@attrs.frozen
class Candidate:
    """A region as `find_instance` sees it, from the region IR or from a manifest."""

    name: str
    generic: str  # the generic region's name; a region that is no instance: its own
    dtypes: Mapping[str, str]  # buffer name -> dtype
    defaults: Mapping[str, int | float]  # constant name -> default
    target: str | None  # the target its `on` lines were chosen for
    bindings: tuple[tuple[str, str], ...]


class InstanceLike(Protocol):
    """What made a region an instance, as the region IR (`syntax.Instance`) and a manifest
    (`manifest_records.Instance`) both record it."""

    @property
    def generic(self) -> str: ...
    @property
    def bindings(self) -> tuple[tuple[str, str], ...]: ...
    @property
    def target(self) -> str | None: ...


class _Named(Protocol):
    @property
    def name(self) -> str: ...


class _Buffer(_Named, Protocol):
    @property
    def dtype(self) -> DType | str: ...


class _Const(_Named, Protocol):
    @property
    def default(self) -> int | float: ...


class RegionLike(_Named, Protocol):
    """A region of the region IR or a manifest, as `find_instance` reads it."""

    @property
    def instance(self) -> InstanceLike | None: ...
    @property
    def inputs(self) -> Sequence[_Buffer]: ...
    @property
    def outputs(self) -> Sequence[_Buffer]: ...
    @property
    def consts(self) -> Sequence[_Const]: ...


R = TypeVar("R", bound=RegionLike)


def find_instance(
    regions: Sequence[R],
    generic: str,
    dtypes: Mapping[str, str],
    target: str | None = None,
    consts: Mapping[str, int | float] | None = None,
) -> R | None:
    """The instance of `generic` among `regions` whose buffers named in `dtypes` have those
    dtypes (`{"W": "q4_0"}`); None when there is none.  Of several: the variant for `target`
    before the one for every target; then the one whose constant defaults equal the most of
    `consts` (the values a call passes: `matvec_add_q4_0_long` for K = 12288); then the one
    named by the naming rule before one an `instance` line named.  `ir.Program` and
    `manifest_records.Manifest` both answer `instance(...)` through here."""
    seen = [(r, _candidate(r)) for r in regions]
    matches = [
        (r, c)
        for r, c in seen
        if c.generic == generic and all(c.dtypes.get(n) == d for n, d in dtypes.items())
    ]
    own = [m for m in matches if target is not None and m[1].target == target]
    pool = own or [m for m in matches if m[1].target is None]
    if not pool:
        return None
    given = consts or {}

    def score(m: tuple[R, Candidate]) -> tuple[int, bool]:
        c = m[1]
        same = sum(1 for n, v in given.items() if c.defaults.get(n) == v)
        rule = c.bindings == () or c.name == instance_name(
            c.generic, c.bindings, c.name == c.generic
        )
        return same, rule

    return max(pool, key=score)[0]


def _candidate(r: RegionLike) -> Candidate:
    inst = r.instance
    return Candidate(
        r.name,
        inst.generic if inst is not None else r.name,
        {
            b.name: b.dtype.value if isinstance(b.dtype, DType) else b.dtype
            for b in (*r.inputs, *r.outputs)
        },
        {c.name: c.default for c in r.consts},
        inst.target if inst is not None else None,
        inst.bindings if inst is not None else (),
    )


@attrs.frozen
class Pending:
    """One instance (or target variant) to make: the generic region as written, the name, the
    bindings and target, the constant defaults of an `instance` line and the schedule lines to
    apply (the region's, or the `instance` line's own block)."""

    generic: S.Region
    name: str
    bindings: tuple[tuple[str, str], ...]
    target: str | None
    consts: tuple[S.Const, ...]
    lines: tuple[S.Schedule, ...]
    name_span: Span | None = None

    def bound(self) -> S.Region:
        """The instance with its dtypes bound, before its stage groups expand."""
        r = self.generic
        inst = (
            S.Instance(r.name, self.bindings, self.target)
            if r.dtype_params or self.target
            else None
        )
        region = bind_dtypes(r, self.name, self.bindings, inst)
        if self.name_span is not None:
            region = attrs.evolve(region, name_span=self.name_span)
        return region

    def scheduled(self, expanded: S.Region, diags: list[Diagnostic]) -> S.Region | None:
        """`expanded` (this instance, its stage groups expanded) with the schedule applied."""
        return apply_schedule(
            self.generic, expanded, self.lines, self.bindings, self.target, self.consts, diags
        )


def expand_instances(
    module: S.Module,
    known_targets: Sequence[str] | None = None,
    expand: Callable[[tuple[S.Region, ...]], tuple[S.Region, ...]] | None = None,
    diags: list[Diagnostic] | None = None,
) -> tuple[tuple[S.Region, ...], list[Diagnostic]]:
    """Every concrete region of `module` (instances of the generic ones, schedule lines
    applied), and the diagnostics of the dtype parameters, schedule lines and instance lines.
    `expand` (check.py passes compose's stage-group expansion) runs on the instances after
    their dtypes are bound and before their schedules apply, so that a schedule line can name
    a group's inner stage.  The diagnostics go to `diags` (returned) as they are found, so
    that `expand` can report them with its own."""
    pending, planned = plan_instances(module, known_targets)
    diags = [] if diags is None else diags
    diags.extend(planned)
    bound = tuple(p.bound() for p in pending)
    expanded = expand(bound) if expand is not None else bound
    out = []
    for p, r in zip(pending, expanded, strict=True):
        region = p.scheduled(r, diags)
        if region is not None:
            out.append(region)
    return tuple(out), diags


def plan_instances(
    module: S.Module, known_targets: Sequence[str] | None = None
) -> tuple[list[Pending], list[Diagnostic]]:
    """The instances to make, in source order, and the diagnostics of the dtype parameters,
    schedule lines and instance lines."""
    diags: list[Diagnostic] = []
    by_name = {r.name: r for r in module.regions}
    declared: dict[str, list[S.InstanceDecl]] = {}
    for decl in module.instances:
        generic = by_name.get(decl.generic.id)
        if generic is None or not generic.dtype_params:
            generics = [r.name for r in module.regions if r.dtype_params]
            diags.append(
                Diagnostic(
                    decl.generic.span,
                    f"no generic region '{decl.generic.id}' to take an instance of",
                    "generic regions: "
                    + (", ".join(generics) or "none (write region R<Wt in ...>)"),
                )
            )
            continue
        declared.setdefault(generic.name, []).append(decl)
    groups = {g.name: g for g in module.groups}
    out: list[Pending] = []
    for r in module.regions:
        n_before = len(diags)
        _validate_region(r, known_targets, groups, diags)
        if len(diags) > n_before:
            continue
        choices = [tuple(c.id for c in p.choices) for p in r.dtype_params]
        for k, combo in enumerate(itertools.product(*choices)):
            bindings = tuple((p.name, d) for p, d in zip(r.dtype_params, combo, strict=True))
            name = instance_name(r.name, bindings, k == 0) if r.dtype_params else r.name
            out.extend(_instances(r, name, bindings, (), r.schedules))
        for decl in declared.get(r.name, ()):
            named = _declared_bindings(r, decl, diags)
            if named is None:
                continue
            lines = r.schedules
            if decl.schedules is not None:
                n_before = len(diags)
                own = attrs.evolve(r, schedules=decl.schedules)
                _validate_region(own, known_targets, groups, diags)
                if len(diags) > n_before:
                    continue
                lines = decl.schedules
            out.extend(_instances(r, decl.name, named, decl.consts, lines, decl.name_span))
    return out, diags


def _instances(
    r: S.Region,
    name: str,
    bindings: tuple[tuple[str, str], ...],
    consts: tuple[S.Const, ...],
    lines: tuple[S.Schedule, ...],
    name_span: Span | None = None,
) -> Iterator[Pending]:
    """The instance of `bindings` called `name`, then its variant per target its `on` lines
    name."""
    targets: list[str] = []
    for line in lines:
        if line.target is not None and holds(line, bindings) and line.target.id not in targets:
            targets.append(line.target.id)
    for target in (None, *targets):
        shown = f"{name}__{target}" if target else name
        yield Pending(r, shown, bindings, target, consts, lines, name_span)


def _inner_stages(r: S.Region, groups: Mapping[str, S.StageGroup]) -> set[str]:
    """The names the inner stages of the groups `r` uses may take once they expand (their own
    and the `GROUP_name` a clash gives; README "Stage groups")."""
    names: set[str] = set()
    todo = [s.value.fn for s in flat_stages(r) if isinstance(s.value, S.Call)]
    seen: set[str] = set()
    while todo:
        g = groups.get(todo.pop())
        if g is None or g.name in seen:
            continue
        seen.add(g.name)
        for st in g.stages:
            for s in st.stages if isinstance(st, S.Repeat) else (st,):
                names.update((s.name, f"{g.name}_{s.name}"))
                if isinstance(s.value, S.Call):
                    todo.append(s.value.fn)
    return names


def _validate_region(
    r: S.Region,
    known_targets: Sequence[str] | None,
    groups: Mapping[str, S.StageGroup],
    diags: list[Diagnostic],
) -> None:
    """The dtype parameters and schedule lines, once per region (not per instance)."""
    params: dict[str, S.DtypeParam] = {}
    for p in r.dtype_params:
        if p.name in params or p.name in BUFFER_DTYPES:
            diags.append(
                Diagnostic(
                    p.span,
                    f"dtype parameter '{p.name}' is "
                    + ("declared twice" if p.name in params else "the name of a dtype"),
                    "give each dtype parameter a name of its own (Wt, At)",
                )
            )
        params[p.name] = p
        seen: set[str] = set()
        for c in p.choices:
            if c.id in seen:
                # two instances of one dtype: a lookup by dtype would find either
                diags.append(
                    Diagnostic(
                        c.span,
                        f"dtype '{c.id}' is listed twice in dtype parameter '{p.name}'",
                        "list each dtype once",
                    )
                )
            seen.add(c.id)
            if c.id not in BUFFER_DTYPES:
                diags.append(
                    Diagnostic(
                        c.span,
                        f"unknown dtype '{c.id}' in dtype parameter '{p.name}'",
                        "dtypes: " + ", ".join(BUFFER_DTYPES),
                    )
                )
        used = any(x.type.dtype == p.name for x in (*r.params, *r.outputs))
        if not used:
            diags.append(
                Diagnostic(
                    p.span,
                    f"dtype parameter '{p.name}' is never used",
                    f"give a buffer its type (W: {p.name}[N, K]) or remove it",
                )
            )
    stages = {s.name for s in flat_stages(r)} | _inner_stages(r, groups)
    inputs = {p.name for p in r.params}
    consts = {c.name for c in r.consts if not c.runtime}  # a `param` has no default to set
    for line in r.schedules:
        if line.when is not None:
            param, dtypes = line.when
            found = params.get(param.id)
            if found is None:
                diags.append(
                    Diagnostic(
                        param.span,
                        f"unknown dtype parameter '{param.id}' in a schedule line's 'when'",
                        "dtype parameters: " + ", ".join(params)
                        if params
                        else f"region '{r.name}' has none: write region {r.name}<Wt in ...>(...)",
                    )
                )
            else:
                listed = {c.id for c in found.choices}
                for d in dtypes:
                    if d.id not in listed:
                        diags.append(
                            Diagnostic(
                                d.span,
                                f"'{d.id}' is not one of the dtypes of '{found.name}' "
                                f"({', '.join(c.id for c in found.choices)})",
                                f"add it to {r.name}<{found.name} in ...>, or remove it here",
                            )
                        )
        if (
            line.target is not None
            and known_targets is not None
            and line.target.id not in known_targets
        ):
            diags.append(
                Diagnostic(
                    line.target.span,
                    f"unknown target '{line.target.id}'",
                    "known targets: " + ", ".join(known_targets),
                )
            )
        body = line.body
        named: list[tuple[S.Name, set[str], str]] = []
        if isinstance(body, S.ScheduleLayout):
            named = [(s, stages, "stage") for s in body.stages]
        elif isinstance(body, S.ScheduleStore):
            named = [(body.name, stages | inputs, "stage or input")]
        elif isinstance(body, S.ScheduleConst):
            named = [(S.Name(c.name, span=c.span), consts, "constant") for c in body.consts]
        elif isinstance(body, S.SchedulePack):
            outputs = {o.name for o in r.outputs}
            for w in body.weights:
                if w.id in outputs:
                    diags.append(
                        Diagnostic(
                            w.span,
                            f"'{w.id}' is an output, and only a weight input is packed (the "
                            "runtime repacks it when it uploads it)",
                            "name the GGUF weight the region reads: schedule when Wt = q4_0: "
                            f"W packed {body.packing.id}",
                        )
                    )
            named = [(w, inputs, "input") for w in body.weights if w.id not in outputs]
            known_packings = [p.value for p in Packing]
            if body.packing.id not in known_packings:
                diags.append(
                    Diagnostic(
                        body.packing.span,
                        f"unknown packing '{body.packing.id}'",
                        "packings: "
                        + ", ".join(known_packings)
                        + " (quants apart from scales, 16-byte aligned)",
                    )
                )
        for n, known, what in named:
            if n.id not in known:
                diags.append(
                    Diagnostic(
                        n.span,
                        f"schedule line names unknown {what} '{n.id}'",
                        f"{what}s of {r.name}: " + (", ".join(sorted(known)) or "none"),
                    )
                )
        if isinstance(body, S.ScheduleStore) and body.name.id in inputs:
            staged = body.name.id + STAGED_SUFFIX
            if staged in stages | inputs | {c.name for c in r.consts} | {o.name for o in r.outputs}:
                diags.append(
                    Diagnostic(
                        body.name.span,
                        f"staging input '{body.name.id}' makes a stage '{staged}', a name "
                        f"region {r.name} already uses",
                        f"rename the region's '{staged}'",
                    )
                )


def _declared_bindings(
    r: S.Region, decl: S.InstanceDecl, diags: list[Diagnostic]
) -> tuple[tuple[str, str], ...] | None:
    """The bindings an `instance` line names, or None (a diagnostic) when they are wrong."""
    if len(decl.dtypes) != len(r.dtype_params):
        diags.append(
            Diagnostic(
                decl.span,
                f"region {r.name} takes {len(r.dtype_params)} dtype(s), not {len(decl.dtypes)}",
                "name one dtype per parameter: "
                + "; ".join(
                    f"{p.name} in {', '.join(c.id for c in p.choices)}" for p in r.dtype_params
                ),
            )
        )
        return None
    out = []
    for p, d in zip(r.dtype_params, decl.dtypes, strict=True):
        listed = [c.id for c in p.choices]
        if d.id not in listed:
            diags.append(
                Diagnostic(
                    d.span,
                    f"'{d.id}' is not one of the dtypes of '{p.name}' ({', '.join(listed)})",
                    f"use one of them, or add it to region {r.name}<{p.name} in ...>",
                )
            )
            return None
        out.append((p.name, d.id))
    consts = {c.name for c in r.consts if not c.runtime}
    for c in decl.consts:
        if c.name not in consts:
            diags.append(
                Diagnostic(
                    c.span,
                    f"instance line names unknown constant '{c.name}'",
                    f"constants of {r.name}: " + (", ".join(sorted(consts)) or "none"),
                )
            )
            return None
    return tuple(out)
