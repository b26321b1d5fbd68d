"""Stage groups: a `syntax.Module` with `stages` blocks and their uses -> the same module whose
regions hold only ordinary stages (`expand_groups`, run by `check.check` before anything else).

A stage group is a sequence of stages written once at the top level of a file,

    stages rms_norm(x: f32[K], g: f32[K]) -> xn: f32[K]
        const eps = 1e-6
        ss    = sum(k: x[k] * x[k]) @ workgroup   in shared
        xn[k] = x[k] * rsqrt(ss / K + eps) * g[k]

and used in a region (or another group) as a stage whose value calls it, `xn = rms_norm(x, g)
in shared as q8_0`, or for several outputs `(mx, e) = scores(q, kc, g)`.  A use expands in place
into the group's stages, with
- each parameter replaced by its argument (a name of an input, output or stage of the using
  region; a parameter without a shape, `head: u32`, takes any expression);
- each extent of the parameters' shapes (`K`) replaced by the argument's (`H`): the shapes of
  the arguments that have one (inputs, outputs, stages with written extents) must agree;
- each output renamed to the name written on the left of the use; a placement or layout at
  the use replaces the ones the group wrote for its outputs;
- every other stage of the group keeping its name, unless the using region already has that
  name (or an earlier use took it): then `GROUP_name`, or `GROUPn_name` for n = 2, 3, ...;
- the group's `const` and `param` declarations as defaults: a constant of the same name in
  the region is the one used (the region sets its value and range); one the region lacks is
  added to the region's constants;
- any other name (an index of the region's `per workgroup` or `tile`, ...) read as it is.
Every span of the expanded text (copied by compose_text.Relocate) keeps its place in the group
and records the uses it came through (`Span.via`), so a diagnostic about it points at the
group's line and names the use.

Checked here: unknown groups, arity, the dtype and rank of arguments with a declared type,
agreeing extents, outputs the group never assigns, names the user must change (a use's output
or a group's constant colliding with an input, a constant or each other), recursion, groups
never used, groups used inside an expression or a `repeat`.  Not checked here: anything about
the expanded stages themselves; the checker (check.py) sees them as if written in the region.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import assert_never

import attrs

from . import syntax as S
from .compose_text import (
    Relocate,
    exprs_of,
    flat_stages,
    free_name,
    located,
    stage_names,
    text_of,
    type_text,
    walk,
)
from .diagnostics import Diagnostic, DiagnosticError
from .span import Span
from .types import BUFFER_DTYPES, EXCHANGE_FUNCTIONS, FUNCTIONS, REDUCERS, TOPK_REDUCERS

_BUILTINS = frozenset((*FUNCTIONS, *EXCHANGE_FUNCTIONS, *REDUCERS, *TOPK_REDUCERS))


@attrs.frozen
class Expansion:
    """What one use of a stage group decided: the names the group's stages took in the region
    or group it expanded into (outputs and inner stages), what replaced the parameters and
    extents, and the constants it added.  `expand_groups` returns them on the module."""

    group: str
    into: str  # the region's or group's name
    use: Span
    renames: tuple[tuple[str, str], ...]  # a stage's name in the group -> in the use
    arguments: tuple[tuple[str, S.Expr], ...]  # a parameter or extent -> its replacement
    added_consts: tuple[str, ...]


@attrs.frozen
class _Flat:
    """A group with the uses in its body expanded: its constants (its own, then those of the
    groups it uses) and stages, and every group it uses, directly or not."""

    group: S.StageGroup
    consts: tuple[S.Const, ...]
    stages: tuple[S.Stage | S.Repeat, ...]
    uses: frozenset[str]


@attrs.frozen
class _Scope:
    """The names of the region (or group) a use expands into."""

    name: str  # the region's or group's, for messages
    typed: dict[str, S.TypeRef]  # inputs and outputs (a group's parameters and outputs)
    kinds: dict[str, str]  # name -> "input" | "output" | "constant" | "stage"
    stages: dict[str, S.Stage]  # the last stage of each name
    taken: set[str]  # every name in use, growing as uses expand
    consts: list[S.Const]  # the constants, growing as uses add their groups'


class _Expander:
    def __init__(self, module: S.Module) -> None:
        self.diags: list[Diagnostic] = []
        self.groups: dict[str, S.StageGroup] = {}
        self.flat: dict[str, _Flat | None] = {}
        self.cyclic: set[str] = set()  # the groups of a cycle of uses (reported once)
        self.has_groups = bool(module.groups)
        self.expansions: list[Expansion] = []
        for g in module.groups:
            if g.name in self.groups:
                line = self.groups[g.name].name_span.line_col()[0]
                self.err(
                    g.name_span,
                    f"stage group '{g.name}' is already defined on line {line}",
                    "give each stage group a unique name",
                )
                continue
            if g.name in _BUILTINS:
                self.err(
                    g.name_span,
                    f"stage group '{g.name}' must not be named like a function or reducer",
                    f"rename it, e.g. '{g.name}_stages'",
                )
                continue
            self.groups[g.name] = g

    def err(self, span: Span, message: str, hint: str | None = None) -> None:
        self.diags.append(Diagnostic(span, message, hint))

    # --- groups -----------------------------------------------------------------------------
    def flatten(self, name: str, stack: tuple[str, ...]) -> _Flat | None:
        """The group with its uses expanded (once; None after a diagnostic)."""
        if name in self.flat:
            return self.flat[name]
        g = self.groups[name]
        scope = _scope_of_group(g)
        uses: set[str] = set()
        stages = self.expand_items(g.stages, scope, (*stack, name), uses)
        flat: _Flat | None = _Flat(g, tuple(scope.consts), tuple(stages), frozenset(uses))
        assigned = {st.name for st in flat_stages(stages)}
        for out in g.outputs:
            if out.name not in assigned and name not in self.cyclic:
                # (a group in a cycle lost the stages of the use that closed it: that
                # diagnostic says what is wrong)
                self.err(
                    out.span,
                    f"stage group '{name}' never assigns its output '{out.name}'",
                    f"add a stage '{out.name}[...] = ...' to the group's body",
                )
                flat = None
        self.flat[name] = flat
        return flat

    # --- bodies -----------------------------------------------------------------------------
    def expand_items(
        self,
        items: Iterable[S.Stage | S.Repeat],
        scope: _Scope,
        stack: tuple[str, ...],
        uses: set[str],
    ) -> list[S.Stage | S.Repeat]:
        out: list[S.Stage | S.Repeat] = []
        for item in items:
            match item:
                case S.Repeat():
                    for st in item.stages:
                        group = self.use_of(st)
                        if group is not None:
                            uses.add(group)
                            self.err(
                                st.value.span,
                                "a stage group cannot be used inside 'repeat'",
                                "write the group's stages in the repeat block",
                            )
                        else:
                            self.no_nested_call(st)
                    out.append(item)
                case S.Stage():
                    group = self.use_of(item)
                    if group is None:
                        self.no_nested_call(item)
                        out.append(item)
                        continue
                    if group in stack:
                        cycle = " -> ".join((*stack[stack.index(group) :], group))
                        self.cyclic.update(stack[stack.index(group) :])
                        self.err(
                            item.value.span,
                            f"stage group '{group}' uses itself ({cycle})",
                            "a group cannot use itself, directly or through others; write "
                            "the stages out",
                        )
                        continue
                    flat = self.flatten(group, stack)
                    uses.add(group)
                    if flat is None:
                        continue
                    uses.update(flat.uses)
                    out.extend(self.expand_use(item, flat, scope))
                case _:
                    assert_never(item)
        return out

    def use_of(self, st: S.Stage) -> str | None:
        """The group a stage uses, or None for an ordinary stage; reports an unknown group."""
        if not isinstance(st.value, S.Call):
            return None  # the grammar gives several names on the left a call only
        fn = st.value.fn
        if fn in self.groups:
            return fn
        if st.targets or (self.has_groups and fn not in _BUILTINS):
            known = ", ".join(sorted(self.groups)) or "none"
            what = "stage group" if st.targets else "function or stage group"
            functions = "" if st.targets else "; functions: " + ", ".join(sorted(FUNCTIONS))
            self.err(
                st.value.span,
                f"unknown {what} '{fn}'",
                f"stage groups in this file: {known}{functions}",
            )
        return None

    def use_of_quiet(self, st: S.Stage) -> str | None:
        """The group a stage uses, or None; reports nothing."""
        is_use = isinstance(st.value, S.Call) and st.value.fn in self.groups
        return st.value.fn if isinstance(st.value, S.Call) and is_use else None

    def no_nested_call(self, st: S.Stage) -> None:
        for e in exprs_of(st):
            for node in walk(e):
                if isinstance(node, S.Call) and node.fn in self.groups:
                    self.err(
                        node.span,
                        f"stage group '{node.fn}' used inside an expression",
                        f"use it as a whole stage, 'name = {node.fn}(...)', then read name",
                    )

    # --- one use ----------------------------------------------------------------------------
    def expand_use(self, use: S.Stage, flat: _Flat, scope: _Scope) -> list[S.Stage | S.Repeat]:
        g = flat.group
        call = use.value
        assert isinstance(call, S.Call)
        n_before = len(self.diags)
        targets = use.targets or (S.Name(use.name, span=use.name_span),)
        if use.indices or use.mask is not None:
            self.err(
                use.name_span,
                f"the output of stage group '{g.name}' takes the group's indices",
                f"write '{use.name} = {g.name}(...)' with no indices or 'where'",
            )
        if len(targets) != len(g.outputs):
            outs = ", ".join(o.name for o in g.outputs)
            self.err(
                use.span,
                f"stage group '{g.name}' gives {len(g.outputs)} output(s) ({outs}), "
                f"not {len(targets)}",
                "write one name per output: "
                + (f"({outs}) = " if len(g.outputs) > 1 else f"{outs} = ")
                + f"{g.name}(...)",
            )
        if len(call.args) != len(g.params):
            params = ", ".join(p.name for p in g.params)
            self.err(
                call.span,
                f"stage group '{g.name}' takes {len(g.params)} argument(s) ({params}), "
                f"not {len(call.args)}",
                f"write {g.name}({params})",
            )
        if len(self.diags) > n_before:
            return []
        subst = self.bind(g, flat, call, scope)
        self.check_targets(g, targets, scope)
        if len(self.diags) > n_before or subst is None:
            return []
        # renames: outputs to the use's names, inner stages kept unless taken
        renames: dict[str, str] = {o.name: t.id for o, t in zip(g.outputs, targets, strict=True)}
        for name in stage_names(flat.stages):
            if name in renames or name in subst:
                continue
            renames[name] = free_name(name, g.name, scope.taken)
            scope.taken.add(renames[name])
        scope.taken.update(t.id for t in targets)
        added: list[str] = []
        for c in flat.consts:
            if c.name in scope.kinds:
                if scope.kinds[c.name] != "constant":
                    self.err(
                        located(c.span, use.span),
                        f"stage group '{g.name}' needs constant '{c.name}', but "
                        f"'{scope.name}' has {_an(scope.kinds[c.name])} named '{c.name}'",
                        f"rename the {scope.kinds[c.name]} '{c.name}' of '{scope.name}'",
                    )
                continue
            scope.kinds[c.name] = "constant"
            scope.taken.add(c.name)
            scope.consts.append(Relocate(use.span, {}, {}).const(c))
            added.append(c.name)
        if len(self.diags) > n_before:
            return []
        self.expansions.append(
            Expansion(
                g.name,
                scope.name,
                use.span,
                tuple(renames.items()),
                tuple(subst.items()),
                tuple(added),
            )
        )
        sub = Relocate(use.span, subst, renames)
        outputs = {t.id for t in targets}
        stages = [sub.item(item, outputs, use) for item in flat.stages]
        for st in flat_stages(stages):
            scope.stages[st.name] = st
            scope.kinds.setdefault(st.name, "stage")
        return stages

    def bind(
        self, g: S.StageGroup, flat: _Flat, call: S.Call, scope: _Scope
    ) -> dict[str, S.Expr] | None:
        """Parameter and extent names -> the expressions that replace them; None on an error."""
        consts = {c.name for c in flat.consts}
        subst: dict[str, S.Expr] = {}
        ok = True
        extents = [
            d.id
            for p in g.params
            for d in p.type.shape
            if isinstance(d, S.Name) and d.id not in consts
        ]
        unknown: dict[str, S.Expr] = {}  # an extent -> the argument that could not tell it
        dtype_vars: dict[str, str] = {}  # a dtype variable of the group -> its dtype here
        for p, arg in zip(g.params, call.args, strict=True):
            if p.type.shape and not isinstance(arg, S.Name):
                self.err(
                    arg.span,
                    f"argument '{p.name}' of stage group '{g.name}' must be a name, not an "
                    "expression",
                    "the group indexes it: name the expression in a stage first and pass "
                    "that stage",
                )
                ok = False
                continue
            subst[p.name] = arg
            if not p.type.shape:
                continue
            assert isinstance(arg, S.Name)
            shape = self.shape_of(arg.id, scope)
            if shape is None:
                for d in p.type.shape:
                    if isinstance(d, S.Name) and d.id in extents and d.id not in subst:
                        unknown.setdefault(d.id, arg)
                continue
            declared = scope.typed.get(arg.id)
            dtype = p.type.dtype
            if dtype not in BUFFER_DTYPES and declared is not None:
                # a dtype variable (`W: Wt[F, H]`): the first argument of that type names it
                dtype = dtype_vars.setdefault(dtype, declared.dtype)
            if declared is not None and declared.dtype != dtype:
                self.err(
                    arg.span,
                    f"argument '{p.name}' of stage group '{g.name}' must be "
                    f"{type_text(attrs.evolve(p.type, dtype=dtype))}, not "
                    f"{type_text(declared)} ('{arg.id}')",
                    f"pass a {dtype} buffer, or write the group for {declared.dtype}"
                    if dtype == p.type.dtype
                    else f"'{p.type.dtype}' is {dtype} here (the first argument of that type "
                    "says so): pass arguments of one dtype",
                )
                ok = False
                continue
            if len(shape) != len(p.type.shape):
                self.err(
                    arg.span,
                    f"argument '{p.name}' of stage group '{g.name}' must have "
                    f"{len(p.type.shape)} index(es), not {len(shape)} ('{arg.id}')",
                    f"pass a buffer or stage of shape {type_text(p.type)}",
                )
                ok = False
                continue
            for dim, have in zip(p.type.shape, shape, strict=True):
                if isinstance(dim, S.Name) and dim.id in extents and dim.id not in subst:
                    subst[dim.id] = have
                    unknown.pop(dim.id, None)
                    continue
                want = Relocate(call.span, subst, {}).expr(dim)
                if want != have:
                    self.err(
                        arg.span,
                        f"extent mismatch: '{text_of(dim)}' of stage group '{g.name}' is "
                        f"{text_of(want)}, but '{arg.id}' has {text_of(have)}",
                        "pass arguments whose shapes agree as the group's parameters say",
                    )
                    ok = False
                    break
        for extent, arg in unknown.items():
            self.err(
                arg.span,
                f"cannot tell extent '{extent}' of stage group '{g.name}' from '{text_of(arg)}'",
                "pass an input or output, or a stage with written extents (`s[i: N] = ...`)",
            )
            ok = False
        return subst if ok else None

    def shape_of(self, name: str, scope: _Scope) -> tuple[S.Expr, ...] | None:
        if name in scope.typed:
            return scope.typed[name].shape
        st = scope.stages.get(name)
        if st is None:
            return None
        dims: list[S.Expr] = []
        for ix in st.indices:
            if not isinstance(ix, S.Name) or ix.id not in st.extents:
                return None
            dims.append(st.extents[ix.id])
        return tuple(dims)

    def check_targets(self, g: S.StageGroup, targets: tuple[S.Name, ...], scope: _Scope) -> None:
        seen: set[str] = set()
        for t in targets:
            kind = scope.kinds.get(t.id)
            if t.id in seen:
                self.err(
                    t.span,
                    f"name '{t.id}' is given to two outputs of stage group '{g.name}'",
                    "name each output differently",
                )
            elif kind in ("input", "constant"):
                self.err(
                    t.span,
                    f"output of stage group '{g.name}' must not be named like the {kind} "
                    f"'{t.id}' of '{scope.name}'",
                    "choose another name on the left of the use",
                )
            seen.add(t.id)


def _an(kind: str) -> str:
    return ("an " if kind[0] in "aeiou" else "a ") + kind


def _kinds(
    params: Iterable[S.Param], outputs: Iterable[S.Param], consts: Iterable[S.Const]
) -> dict[str, str]:
    kinds = {p.name: "input" for p in params}
    kinds.update({o.name: "output" for o in outputs})
    kinds.update({c.name: "constant" for c in consts})
    return kinds


def _scope_of_group(g: S.StageGroup) -> _Scope:
    kinds = _kinds(g.params, g.outputs, g.consts)
    taken = set(kinds)
    for st in flat_stages(g.stages):
        taken.update(t.id for t in st.targets or (S.Name(st.name, span=st.name_span),))
    typed = {p.name: p.type for p in (*g.params, *g.outputs)}
    return _Scope(g.name, typed, kinds, {}, taken, list(g.consts))


def _scope_of_region(r: S.Region) -> _Scope:
    kinds = _kinds(r.params, r.outputs, r.consts)
    taken = set(kinds)
    if r.per is not None:
        taken.add(r.per.index)
        if r.per.group is not None:
            taken.add(r.per.group[1])
    if r.tile is not None:
        taken.update(d.name for d in r.tile.dims)
    for st in flat_stages(r.stages):
        taken.update(t.id for t in st.targets or (S.Name(st.name, span=st.name_span),))
    typed = {p.name: p.type for p in (*r.params, *r.outputs)}
    return _Scope(r.name, typed, kinds, {}, taken, list(r.consts))


def expand_groups(module: S.Module) -> S.Module:
    """Every use of a stage group replaced by the group's stages (see the module docstring).
    Returns `module` itself when it has no groups and no uses.  Raises DiagnosticError."""
    uses = any(st.targets for r in module.regions for st in flat_stages(r.stages))
    if not module.groups and not uses:
        return module
    ex = _Expander(module)
    used: set[str] = set()
    regions: list[S.Region] = []
    for r in module.regions:
        scope = _scope_of_region(r)
        stages: list[S.Stage | S.Repeat] = []
        for item in r.stages:
            # a region's own stages are known to the uses after them (their extents)
            for st in flat_stages((item,)):
                if ex.use_of_quiet(st) is None:
                    scope.stages[st.name] = st
            stages.extend(ex.expand_items((item,), scope, (), used))
        regions.append(attrs.evolve(r, stages=tuple(stages), consts=tuple(scope.consts)))
    for name in ex.groups:
        ex.flatten(name, ())
    for name, g in ex.groups.items():
        if name not in used and name not in ex.cyclic:  # a cycle is reported as one
            ex.err(
                g.name_span,
                f"stage group '{name}' is never used",
                f"use it in a region ('y = {name}(...)') or remove it",
            )
    if ex.diags:
        diags = sorted(
            dict.fromkeys(ex.diags),
            key=lambda d: (d.span.start, d.span.end) if d.span is not None else (0, 0),
        )
        raise DiagnosticError(diags)
    expansions = tuple(e for e in ex.expansions if e.into in {r.name for r in module.regions})
    return attrs.evolve(module, regions=tuple(regions), expansions=expansions)
