"""Copying a stage group's text into a use (dsl/compose.py): `Relocate` replaces parameters,
extents and stage names and marks every span with the use (`Span.via`); the helpers walk
stages and expressions.  Input and output: `syntax` nodes.  Nothing here reports a diagnostic.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import assert_never

import attrs

from . import syntax as S
from .span import Span


@attrs.frozen
class Relocate:
    """Copies group text into a use: names replaced, spans marked with the use."""

    use: Span
    subst: dict[str, S.Expr]  # parameters and extents
    renames: dict[str, str]  # stage names

    def span(self, s: Span) -> Span:
        return Span(s.source, s.start, s.end, via=(*s.via, self.use))

    def opt(self, s: Span | None) -> Span | None:
        return None if s is None else self.span(s)

    def name(self, n: str) -> str:
        if n in self.renames:
            return self.renames[n]
        value = self.subst.get(n)
        return value.id if isinstance(value, S.Name) else n

    def expr(self, e: S.Expr) -> S.Expr:
        match e:
            case S.Num():
                return attrs.evolve(e, span=self.span(e.span))
            case S.Name(id=n):
                if n in self.subst:
                    return self.subst[n]
                return S.Name(self.name(n), span=self.span(e.span))
            case S.Access():
                return S.Access(
                    self.name(e.name),
                    tuple(self.expr(i) for i in e.indices),
                    span=self.span(e.span),
                    name_span=self.span(e.name_span),
                )
            case S.Call():
                return S.Call(e.fn, tuple(self.expr(a) for a in e.args), span=self.span(e.span))
            case S.Reduce():
                return attrs.evolve(
                    e,
                    body=self.expr(e.body),
                    span=self.span(e.span),
                    index_span=self.span(e.index_span),
                    scope_span=self.opt(e.scope_span),
                    extent=None if e.extent is None else self.expr(e.extent),
                    k=None if e.k is None else self.expr(e.k),
                )
            case S.BinOp():
                return attrs.evolve(
                    e, lhs=self.expr(e.lhs), rhs=self.expr(e.rhs), span=self.span(e.span)
                )
            case S.Neg():
                return attrs.evolve(e, value=self.expr(e.value), span=self.span(e.span))
            case _:
                assert_never(e)

    def place(self, n: S.Name | None) -> S.Name | None:
        return None if n is None else S.Name(n.id, span=self.span(n.span))

    def stage(self, st: S.Stage, outputs: set[str], use: S.Stage) -> S.Stage:
        name = self.name(st.name)
        placement, stored, layout = self.place(st.placement), self.place(st.stored), st.layout
        layout = tuple(attrs.evolve(i, span=self.span(i.span)) for i in layout)
        if name in outputs and use.placement is not None:
            placement, stored = use.placement, use.stored
        if name in outputs and use.layout:
            layout = use.layout
        return attrs.evolve(
            st,
            name=name,
            indices=tuple(self.expr(i) for i in st.indices),
            value=self.expr(st.value),
            placement=placement,
            layout=layout,
            span=self.span(st.span),
            name_span=self.span(st.name_span),
            extents={k: self.expr(v) for k, v in st.extents.items()},
            stored=stored,
            mask=None if st.mask is None else self.expr(st.mask),
        )

    def item(self, item: S.Stage | S.Repeat, outputs: set[str], use: S.Stage) -> S.Stage | S.Repeat:
        match item:
            case S.Stage():
                return self.stage(item, outputs, use)
            case S.Repeat():
                return S.Repeat(
                    self.expr(item.count),
                    tuple(self.stage(st, outputs, use) for st in item.stages),
                    span=self.span(item.span),
                )
            case _:
                assert_never(item)

    def const(self, c: S.Const) -> S.Const:
        rng = None if c.range is None else (self.expr(c.range[0]), self.expr(c.range[1]))
        value = self.expr(c.value)
        assert isinstance(value, S.Num)
        lo_hi = None if rng is None else (_num(rng[0]), _num(rng[1]))
        return attrs.evolve(c, value=value, range=lo_hi, span=self.span(c.span))


def _num(e: S.Expr) -> S.Num:
    assert isinstance(e, S.Num)
    return e


def located(span: Span, use: Span) -> Span:
    """`span`, marked as reached through `use` (innermost uses first)."""
    return Span(span.source, span.start, span.end, via=(*span.via, use))


def text_of(e: S.Expr) -> str:
    """An expression as written (its source text)."""
    return " ".join(e.span.source.text[e.span.start : e.span.end].split())


def type_text(t: S.TypeRef) -> str:
    """A parameter's type as written: `f32[K]`, `u32`."""
    if not t.shape:
        return t.dtype
    return f"{t.dtype}[{', '.join(text_of(d) for d in t.shape)}]"


def free_name(name: str, group: str, taken: set[str]) -> str:
    """`name`, or the first of `group_name`, `group2_name`, ... that no one has taken."""
    if name not in taken:
        return name
    candidate = f"{group}_{name}"
    n = 2
    while candidate in taken:
        candidate = f"{group}{n}_{name}"
        n += 1
    return candidate


def flat_stages(items: Iterable[S.Stage | S.Repeat]) -> Iterator[S.Stage]:
    """The stages of a body, those of its `repeat` blocks in place."""
    for item in items:
        if isinstance(item, S.Repeat):
            yield from item.stages
        else:
            yield item


def stage_names(items: Iterable[S.Stage | S.Repeat]) -> list[str]:
    """The names a body's stages assign, each once, in order."""
    return list(dict.fromkeys(st.name for st in flat_stages(items)))


def exprs_of(st: S.Stage) -> Iterator[S.Expr]:
    """A stage's expressions: its left-side indices, value, mask and written extents."""
    yield from st.indices
    yield st.value
    if st.mask is not None:
        yield st.mask
    yield from st.extents.values()


def walk(e: S.Expr) -> Iterator[S.Expr]:
    """Every node of an expression, without recursion."""
    stack = [e]
    while stack:
        node = stack.pop()
        yield node
        match node:
            case S.Num() | S.Name():
                pass
            case S.Access():
                stack.extend(node.indices)
            case S.Call():
                stack.extend(node.args)
            case S.Reduce():
                stack.append(node.body)
                stack.extend(x for x in (node.extent, node.k) if x is not None)
            case S.BinOp():
                stack.extend((node.lhs, node.rhs))
            case S.Neg():
                stack.append(node.value)
            case _:
                assert_never(node)
