"""`.fuse` text -> `syntax.Module`.

Lark (LALR, with an indenter for region bodies) builds a parse tree with positions; a Transformer
turns it into the typed AST.  Lark's errors become Diagnostics, and so do the lexical limits
below (source size, name length, expression depth, numbers outside u32 / f32) and a keyword run
into the word after it.  Nothing here resolves names.
"""

from __future__ import annotations

import functools
import math
import re
import struct
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import lark
from lark import Lark, Token, Transformer, Tree, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken
from lark.indenter import DedentError, Indenter
from lark.tree import Meta

from . import syntax as S
from .cachedir import private_folder
from .diagnostics import Diagnostic, DiagnosticError
from .span import Source, Span

# the rules of expression nodes, whose nesting S.MAX_EXPR_DEPTH limits
_EXPR_RULES = frozenset(
    (
        "binop",
        "compare",
        "neg",
        "call",
        "access",
        "reduce",
        "topk",
        "int_lit",
        "float_lit",
        "name",
    )
)
U32_MAX = 2**32 - 1


class _Misindented(Exception):
    """A line whose indentation matches no enclosing block (Lark's DedentError, located)."""

    def __init__(self, pos: int, indent: int, levels: list[int]) -> None:
        super().__init__(pos)
        self.pos = pos
        self.indent = indent
        self.levels = levels


class _GluedKeyword(Exception):
    """A keyword run together with the name or number after it (`regionr(`, `inshared`)."""

    def __init__(self, keyword: Token, after: Token) -> None:
        super().__init__(str(keyword))
        self.keyword = keyword
        self.after = after


@functools.cache
def _keyword_types() -> frozenset[str]:
    """The terminals of the grammar's keywords (`region`, `in`, `state`, ...)."""
    return frozenset(
        t.name
        for t in _parser().terminals
        if type(t.pattern).__name__ == "PatternStr" and t.pattern.value.isidentifier()
    )


_WORD_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")


class _FuseIndenter(Indenter):
    NL_type = "_NL"
    OPEN_PAREN_types = ["LPAR", "LSQB"]
    CLOSE_PAREN_types = ["RPAR", "RSQB"]
    INDENT_type = "_INDENT"
    DEDENT_type = "_DEDENT"
    tab_len = 4

    def handle_NL(self, token: Token) -> Iterator[Token]:
        # Lark's DedentError carries no position: the offending line starts after the token's
        # last line break, its text after the indentation
        levels = list(self.indent_level)
        try:
            yield from super().handle_NL(token)
        except DedentError:
            indent_str = token.rsplit("\n", 1)[1]
            indent = indent_str.count(" ") + indent_str.count("\t") * self.tab_len
            end = token.end_pos if token.end_pos is not None else 0
            raise _Misindented(end, indent, levels) from None

    def process(self, stream: Iterator[Token]) -> Iterator[Token]:
        tokens: Iterator[Token] = super().process(self._separated(stream))  # type: ignore[no-untyped-call]
        return tokens

    @staticmethod
    def _separated(stream: Iterator[Token]) -> Iterator[Token]:
        """The tokens, checking that a keyword ends where a word does: where the parser
        accepts a keyword but no name, Lark's contextual lexer takes the keyword's letters
        from the front of a longer word (`regionr(` would read as `region r(`)."""
        keywords = _keyword_types()
        prev: Token | None = None
        for tok in stream:
            if (
                prev is not None
                and prev.type in keywords
                and tok.start_pos == prev.end_pos
                and tok[:1] in _WORD_CHARS
            ):
                raise _GluedKeyword(prev, tok)
            prev = tok
            yield tok


def _grammar_cache() -> str | bool:
    """A file for Lark's parser tables (Lark checks the grammar's and options' sha256 stored in
    it before use), in fusec's private cache folder; no cache when that folder is unusable."""
    try:
        folder = private_folder("grammar")
    except OSError:
        return False
    py = "".join(map(str, sys.version_info[:2]))
    return str(folder / f"fuse-lark{lark.__version__}-py{py}.tables")


@functools.cache
def _parser() -> Lark:
    grammar = (Path(__file__).parent / "fuse.lark").read_text()
    return Lark(
        grammar,
        parser="lalr",
        postlex=_FuseIndenter(),
        propagate_positions=True,
        maybe_placeholders=False,
        cache=_grammar_cache(),
    )


_TOKEN_WORDS = {
    "_NL": "end of line",
    "_INDENT": "indented block",
    "_DEDENT": "end of block",
    "$END": "end of file",
    "NAME": "name",
    "INT": "integer",
    "FLOAT": "number",
    "LPAR": "'('",
    "RPAR": "')'",
    "LSQB": "'['",
    "RSQB": "']'",
    "COLON": "':'",
    "COMMA": "','",
    "EQUAL": "'='",
    "MULOP": "'*', '/' or '%'",
    "ADDOP": "'+' or '-'",
    "COMPOP": "a comparison ('<', '<=', '==', ...)",
    "REDUCER": "reducer",
    "TOPK": "reducer",  # topk, argtopk
}


def _describe(token_type: str) -> str:
    if token_type in _TOKEN_WORDS:
        return _TOKEN_WORDS[token_type]
    try:
        pattern = _parser().get_terminal(token_type).pattern
    except KeyError:
        return token_type.lower()
    if type(pattern).__name__ == "PatternStr":
        return f"'{pattern.value}'"
    return token_type.lower()


class _ToAst(Transformer[Token, Any]):
    def __init__(self, source: Source) -> None:
        super().__init__()
        self.source = source
        self.diags: list[Diagnostic] = []

    def _span(self, meta: Meta) -> Span:
        if getattr(meta, "empty", True):
            return Span(self.source, 0, 0)
        return Span(self.source, meta.start_pos, meta.end_pos)

    def _tok(self, tok: Token) -> Span:
        start = tok.start_pos or 0
        return Span(self.source, start, tok.end_pos if tok.end_pos is not None else start)

    # --- expressions ---
    @v_args(meta=True)
    def int_lit(self, meta: Meta, c: list[Token]) -> S.Num:
        value = int(c[0])
        if value > U32_MAX:
            self.diags.append(
                Diagnostic(
                    self._span(meta),
                    f"integer must be at most {U32_MAX} (u32), not {value}",
                    "integers are unsigned 32-bit; write a real (e.g. 5e9) where a float is meant",
                )
            )
        return S.Num(value, True, span=self._span(meta))

    @v_args(meta=True)
    def float_lit(self, meta: Meta, c: list[Token]) -> S.Num:
        value = float(c[0])
        message = _f32_problem(str(c[0]), value)
        if message is not None:
            self.diags.append(
                Diagnostic(
                    self._span(meta),
                    message,
                    "reals are f32: magnitudes from about 1.4e-45 to 3.4e38, or 0",
                )
            )
        return S.Num(value, False, span=self._span(meta))

    @v_args(meta=True)
    def name(self, meta: Meta, c: list[Token]) -> S.Name:
        return S.Name(str(c[0]), span=self._span(meta))

    @v_args(meta=True)
    def access(self, meta: Meta, c: list[Any]) -> S.Access:
        return S.Access(str(c[0]), tuple(c[1:]), span=self._span(meta), name_span=self._tok(c[0]))

    @v_args(meta=True)
    def call(self, meta: Meta, c: list[Any]) -> S.Call:
        args = tuple(a for a in c[1:] if a is not None)
        return S.Call(str(c[0]), args, span=self._span(meta))

    @v_args(meta=True)
    def reduce(self, meta: Meta, c: list[Any]) -> S.Reduce:
        extent = None
        extent_op = None
        if len(c) > 2 and isinstance(c[2], Token) and c[2].type == "COMPOP":
            extent_op, extent = c[2], c[3]
            c = [c[0], c[1], *c[4:]]
        scope = c[3] if len(c) > 3 else None
        return S.Reduce(
            str(c[0]),
            str(c[1]),
            c[2],
            scope[0] if scope else None,
            span=self._span(meta),
            index_span=self._tok(c[1]),
            scope_span=scope[1] if scope else None,
            extent=extent,
            extent_op=str(extent_op) if extent_op is not None else None,
        )

    @v_args(meta=True)
    def topk(self, meta: Meta, c: list[Any]) -> S.Reduce:
        """`topk(k, e: body) @ scope`: a reduction that also carries its count k."""
        red = self.reduce(meta, [c[0], *c[2:]])
        topk: S.Reduce = attrs.evolve(red, k=c[1])
        return topk

    @v_args(meta=True)
    def scope(self, meta: Meta, c: list[Token]) -> tuple[str, Span]:
        return str(c[0]), self._tok(c[0])

    @v_args(meta=True)
    def binop(self, meta: Meta, c: list[Any]) -> S.BinOp:
        return S.BinOp(str(c[1]), c[0], c[2], span=self._span(meta))

    @v_args(meta=True)
    def compare(self, meta: Meta, c: list[Any]) -> S.BinOp:
        return S.BinOp(str(c[1]), c[0], c[2], span=self._span(meta))

    @v_args(meta=True)
    def neg(self, meta: Meta, c: list[Any]) -> S.Neg:
        return S.Neg(c[0], span=self._span(meta))

    @v_args(meta=True)
    def logic(self, meta: Meta, c: list[Any]) -> S.BinOp:
        return S.BinOp(str(c[1]), c[0], c[2], span=self._span(meta))

    @v_args(meta=True)
    def logic_not(self, meta: Meta, c: list[Any]) -> S.BinOp:
        """`!e` is `e == 0`."""
        span = self._span(meta)
        return S.BinOp("==", c[1], S.Num(0, True, span=self._tok(c[0])), span=span)

    # --- declarations ---
    @v_args(meta=True)
    def type(self, meta: Meta, c: list[Any]) -> S.TypeRef:
        return S.TypeRef(str(c[0]), tuple(c[1:]), span=self._span(meta))

    @v_args(meta=True)
    def param(self, meta: Meta, c: list[Any]) -> S.Param:
        tolerance = c.pop() if isinstance(c[-1], S.Num) else None
        values = c.pop() if isinstance(c[-1], tuple) else None
        return S.Param(
            str(c[0]),
            c[-1],
            span=self._span(meta),
            state=len(c) == 3,
            values=values,
            tolerance=tolerance,
        )

    def tolerance(self, c: list[S.Num]) -> S.Num:
        return c[0]

    def value_range(self, c: list[S.Num]) -> tuple[S.Num, S.Num]:
        return (c[0], c[1])

    def value_bound(self, c: list[S.Num]) -> S.Num:
        return c[0]

    @v_args(meta=True)
    def negative(self, meta: Meta, c: list[S.Num]) -> S.Num:
        return S.Num(-c[0].value, c[0].is_int, span=self._span(meta))

    def params(self, c: list[S.Param]) -> tuple[S.Param, ...]:
        return tuple(c)

    def outputs(self, c: list[S.Param]) -> tuple[S.Param, ...]:
        return tuple(c)

    @v_args(meta=True)
    def const_item(self, meta: Meta, c: list[Any]) -> S.Const:
        rng = c[2] if len(c) > 2 else None
        return S.Const(str(c[0]), c[1], rng, span=self._span(meta))

    def const_range(self, c: list[S.Num]) -> tuple[S.Num, S.Num]:
        return (c[0], c[1])

    def const_decl(self, c: list[S.Const]) -> tuple[str, list[S.Const]]:
        return ("const", c)

    @v_args(meta=True)
    def runtime_item(self, meta: Meta, c: list[Any]) -> S.Const:
        lo: S.Num = c[1][0]
        return S.Const(str(c[0]), lo, c[1], span=self._span(meta), runtime=True)

    def runtime_decl(self, c: list[S.Const]) -> tuple[str, list[S.Const]]:
        return ("const", c)

    def launch_int(self, c: list[Token]) -> tuple[str, tuple[int, ...]]:
        return ("int", (int(c[0]),))

    def launch_any(self, c: list[Token]) -> tuple[str, tuple[int, ...]]:
        return ("any", ())

    def launch_at_least(self, c: list[Token]) -> tuple[str, tuple[int, ...], str | None]:
        return ("at_least", (int(c[0]),), str(c[1]) if len(c) > 1 else None)

    def launch_choice(self, c: list[Token]) -> tuple[str, tuple[int, ...]]:
        return ("choice", tuple(int(t) for t in c))

    @v_args(meta=True)
    def launch_item(self, meta: Meta, c: list[Any]) -> S.LaunchItem:
        kind, values, *rest = c[1]
        fallback = rest[0] if rest else None
        return S.LaunchItem(str(c[0]), kind, values, span=self._span(meta), fallback=fallback)

    @v_args(meta=True)
    def tile_dim(self, meta: Meta, c: list[Any]) -> S.TileDim:
        return S.TileDim(str(c[0]), c[1], span=self._span(meta))

    @v_args(meta=True)
    def tile_decl(self, meta: Meta, c: list[Any]) -> tuple[str, S.Tile]:
        dims = tuple(x for x in c if isinstance(x, S.TileDim))
        rest = [x for x in c if not isinstance(x, S.TileDim)]
        lane = rest[0]
        slot = None
        per = None
        for x in rest[1:]:
            if isinstance(x, Token):
                per = str(x)
            else:
                slot = x
        return ("tile", S.Tile(dims, lane, slot, per, span=self._span(meta)))

    @v_args(meta=True)
    def per_decl(self, meta: Meta, c: list[Any]) -> tuple[str, S.PerWorkgroup]:
        group = (str(c[4]), str(c[5]), c[6]) if len(c) > 4 else None
        per = S.PerWorkgroup(
            str(c[0]), str(c[1]), str(c[2]), c[3], span=self._span(meta), group=group
        )
        return ("per", per)

    @v_args(meta=True)
    def repeat_block(self, meta: Meta, c: list[Any]) -> tuple[str, S.Repeat]:
        stages = tuple(st for _, st in c[1:])
        return ("repeat", S.Repeat(c[0], stages, span=self._span(meta)))

    def launch_decl(self, c: list[S.LaunchItem]) -> tuple[str, list[S.LaunchItem]]:
        return ("launch", c)

    @v_args(meta=True)
    def budget_item(self, meta: Meta, c: list[Any]) -> S.BudgetItem:
        target = c[3] if len(c) > 3 else None
        return S.BudgetItem(
            str(c[0]),
            str(c[1]),
            c[2],
            str(target) if target is not None else None,
            span=self._span(meta),
            target_span=self._tok(target) if target is not None else None,
        )

    def budget_decl(self, c: list[S.BudgetItem]) -> tuple[str, list[S.BudgetItem]]:
        return ("budget", c)

    @v_args(meta=True)
    def layout_item(self, meta: Meta, c: list[Token]) -> S.LayoutItem:
        vector = int(c[2]) if len(c) > 2 else 1
        return S.LayoutItem(str(c[0]), str(c[1]), vector, span=self._span(meta))

    def layout(self, c: list[S.LayoutItem]) -> tuple[str, tuple[S.LayoutItem, ...]]:
        return ("layout", tuple(c))

    @v_args(meta=True)
    def placement(self, meta: Meta, c: list[Token]) -> tuple[str, tuple[S.Name, S.Name | None]]:
        stored = S.Name(str(c[1]), span=self._tok(c[1])) if len(c) > 1 else None
        return ("placement", (S.Name(str(c[0]), span=self._tok(c[0])), stored))

    @v_args(meta=True)
    def target(self, meta: Meta, c: list[Any]) -> tuple[Token, tuple[S.Expr, ...], dict[str, Any]]:
        names = tuple(n for n, _ in c[1:])
        extents = {n.id: e for n, e in c[1:] if e is not None}
        return c[0], names, extents

    def tindex_extent(self, c: list[Any]) -> tuple[S.Name, Any]:
        return S.Name(str(c[0]), span=self._tok(c[0])), c[1]

    def tindex(self, c: list[Any]) -> tuple[S.Expr, None]:
        return c[0], None

    def mask(self, c: list[Any]) -> tuple[str, S.Expr]:
        return ("mask", c[0])

    @v_args(meta=True)
    def stage(self, meta: Meta, c: list[Any]) -> tuple[str, S.Stage]:
        (name_tok, indices, extents), value = c[0], c[1]
        placement: S.Name | None = None
        stored: S.Name | None = None
        layout: tuple[S.LayoutItem, ...] = ()
        mask: S.Expr | None = None
        for kind, item in c[2:]:
            if kind == "placement":
                placement, stored = item
            elif kind == "mask":
                mask = item
            else:
                layout = item
        span = Span(self.source, self._tok(name_tok).start, (mask or value).span.end)
        stage = S.Stage(
            str(name_tok),
            indices,
            value,
            placement,
            layout,
            span=span,
            name_span=self._tok(name_tok),
            extents=extents,
            stored=stored,
            mask=mask,
        )
        return ("stage", stage)

    # --- dtype parameters, schedules, instances ---
    @v_args(meta=True)
    def dtype_param(self, meta: Meta, c: list[Token]) -> S.DtypeParam:
        choices = tuple(S.Name(str(t), span=self._tok(t)) for t in c[1:])
        return S.DtypeParam(str(c[0]), choices, span=self._span(meta))

    def dtype_params(self, c: list[S.DtypeParam]) -> tuple[S.DtypeParam, ...]:
        return tuple(c)

    def schedule_on(self, c: list[Token]) -> tuple[str, S.Name]:
        return ("on", S.Name(str(c[0]), span=self._tok(c[0])))

    def schedule_when(self, c: list[Token]) -> tuple[str, tuple[S.Name, tuple[S.Name, ...]]]:
        names = [S.Name(str(t), span=self._tok(t)) for t in c]
        return ("when", (names[0], tuple(names[1:])))

    @v_args(meta=True)
    def schedule_launch(self, meta: Meta, c: list[S.LaunchItem]) -> S.ScheduleLaunch:
        return S.ScheduleLaunch(tuple(c), span=self._span(meta))

    @v_args(meta=True)
    def schedule_layout(self, meta: Meta, c: list[Any]) -> S.ScheduleLayout:
        stages = tuple(S.Name(str(t), span=self._tok(t)) for t in c if isinstance(t, Token))
        items = tuple(x for x in c if isinstance(x, S.LayoutItem))
        return S.ScheduleLayout(stages, items, span=self._span(meta))

    @v_args(meta=True)
    def schedule_store(self, meta: Meta, c: list[Token]) -> S.ScheduleStore:
        names = [S.Name(str(t), span=self._tok(t)) for t in c]
        placement = names[1] if len(names) == 3 else None
        return S.ScheduleStore(names[0], placement, names[-1], span=self._span(meta))

    @v_args(meta=True)
    def schedule_const(self, meta: Meta, c: list[S.Const]) -> S.ScheduleConst:
        return S.ScheduleConst(tuple(c), span=self._span(meta))

    @v_args(meta=True)
    def schedule_int8_dot(self, meta: Meta, c: list[Any]) -> S.ScheduleIntDot:
        return S.ScheduleIntDot(span=self._span(meta))

    @v_args(meta=True)
    def schedule_pack(self, meta: Meta, c: list[Token]) -> S.SchedulePack:
        names = [S.Name(str(t), span=self._tok(t)) for t in c]
        return S.SchedulePack(tuple(names[:-1]), names[-1], span=self._span(meta))

    @v_args(meta=True)
    def schedule_decl(self, meta: Meta, c: list[Any]) -> tuple[str, S.Schedule]:
        target = None
        when = None
        for x in c[:-1]:
            if x[0] == "on":
                target = x[1]
            else:
                when = x[1]
        body = c[-1]
        span = Span(self.source, self._span(meta).start, body.span.end)
        return ("schedule", S.Schedule(target, when, body, span=span))

    @v_args(meta=True)
    def instance_decl(self, meta: Meta, c: list[Any]) -> S.InstanceDecl:
        tokens = [t for t in c if isinstance(t, Token)]
        consts = tuple(x for x in c if isinstance(x, S.Const))
        schedules = tuple(x[1] for x in c if isinstance(x, tuple) and x[0] == "schedule")
        return S.InstanceDecl(
            str(tokens[0]),
            S.Name(str(tokens[1]), span=self._tok(tokens[1])),
            tuple(S.Name(str(t), span=self._tok(t)) for t in tokens[2:]),
            consts,
            span=self._span(meta),
            name_span=self._tok(tokens[0]),
            schedules=schedules or None,
        )

    def region_name(self, c: list[Any]) -> tuple[Token, tuple[S.DtypeParam, ...]]:
        return c[0], (c[1] if len(c) > 1 else ())

    @v_args(meta=True)
    def region(self, meta: Meta, c: list[Any]) -> S.Region:
        name_tok, dtype_params = c[0]
        params: tuple[S.Param, ...] = c[1]
        outputs: tuple[S.Param, ...] = c[2]
        rest = c[2:]
        schedules: list[S.Schedule] = []
        consts: list[S.Const] = []
        launch: list[S.LaunchItem] = []
        stages: list[S.Stage | S.Repeat] = []
        budget: list[S.BudgetItem] = []
        tile: S.Tile | None = None
        per: S.PerWorkgroup | None = None
        for kind, item in rest[1:]:
            if kind == "const":
                consts.extend(item)
            elif kind == "launch":
                launch.extend(item)
            elif kind == "budget":
                budget.extend(item)
            elif kind == "tile":
                tile = item
            elif kind == "per":
                per = item
            elif kind == "schedule":
                schedules.append(item)
            else:
                stages.append(item)
        return S.Region(
            str(name_tok),
            params,
            outputs,
            tuple(consts),
            tuple(launch),
            tuple(stages),
            span=self._span(meta),
            name_span=self._tok(name_tok),
            budget=tuple(budget),
            tile=tile,
            per=per,
            dtype_params=dtype_params,
            schedules=tuple(schedules),
        )

    # --- stage groups (dsl/compose.py) ---
    @v_args(meta=True)
    def use_stage(self, meta: Meta, c: list[Any]) -> tuple[str, S.Stage]:
        names = [x for x in c if isinstance(x, Token)]
        *targets, fn = names
        args = tuple(x for x in c if x is not None and not isinstance(x, (Token, tuple)))
        clauses = [x for x in c if isinstance(x, tuple)]
        after = max([self._tok(fn).end, *(a.span.end for a in args)])
        call_end = self.source.text.index(")", after) + 1
        call = S.Call(str(fn), args, span=Span(self.source, self._tok(fn).start, call_end))
        placement: S.Name | None = None
        stored: S.Name | None = None
        layout: tuple[S.LayoutItem, ...] = ()
        for kind, item in clauses:
            if kind == "placement":
                placement, stored = item
            else:
                layout = item
        names_ = tuple(S.Name(str(t), span=self._tok(t)) for t in targets)
        span = Span(self.source, self._span(meta).start, call.span.end)
        stage = S.Stage(
            names_[0].id,
            (),
            call,
            placement,
            layout,
            span=span,
            name_span=names_[0].span,
            stored=stored,
            targets=names_,
        )
        return ("stage", stage)

    @v_args(meta=True)
    def stage_group(self, meta: Meta, c: list[Any]) -> S.StageGroup:
        consts: list[S.Const] = []
        stages: list[S.Stage | S.Repeat] = []
        for kind, item in c[3:]:
            if kind == "const":
                consts.extend(item)
            else:
                stages.append(item)
        return S.StageGroup(
            str(c[0]),
            c[1],
            c[2],
            tuple(consts),
            tuple(stages),
            span=self._span(meta),
            name_span=self._tok(c[0]),
        )

    def start(self, c: list[Any]) -> tuple[S.Region | S.InstanceDecl | S.StageGroup, ...]:
        return tuple(c)


def _f32_problem(text: str, value: float) -> str | None:
    """Why a real literal has no f32 value (it overflows, or a nonzero rounds to 0), or None."""
    try:
        rounded = struct.unpack("<f", struct.pack("<f", value))[0]
    except OverflowError:
        rounded = math.inf
    if math.isinf(rounded):
        return f"number must fit in f32 (at most 3.4028235e+38), not {text}"
    if rounded == 0.0 and value != 0.0:
        return f"number must be 0 or fit in f32 (at least 1.4e-45), not {text}"
    return None


def _limit_diagnostics(source: Source, tree: Tree[Token]) -> list[Diagnostic]:
    """Names longer than S.MAX_NAME_CHARS and expressions nested deeper than S.MAX_EXPR_DEPTH,
    found without recursion (the tree may be thousands of levels deep)."""
    diags: list[Diagnostic] = []
    deepest: dict[int, tuple[Tree[Token], int]] = {}  # id(outermost expression) -> its depth
    stack: list[tuple[Tree[Token] | Token, int, Tree[Token] | None]] = [(tree, 0, None)]
    long_names: set[str] = set()  # reported at their first use only
    while stack:
        node, depth, root = stack.pop()
        if isinstance(node, Token):
            if node.type == "NAME" and len(node) > S.MAX_NAME_CHARS and node not in long_names:
                long_names.add(str(node))
                start = node.start_pos or 0
                shown = f"'{node[:24]}...'"
                diags.append(
                    Diagnostic(
                        Span(source, start, node.end_pos or start),
                        f"name must be at most {S.MAX_NAME_CHARS} characters, "
                        f"not {len(node)} ({shown})",
                        "shorten it: every name becomes a GLSL identifier, a region's also a "
                        "file name",
                    )
                )
            continue
        if node.data in _EXPR_RULES:
            depth += 1
            root = root if root is not None else node
            if depth > deepest.get(id(root), (root, 0))[1]:
                deepest[id(root)] = (root, depth)
        else:
            depth, root = 0, None
        stack.extend((child, depth, root) for child in reversed(node.children))
    for root, depth in deepest.values():
        if depth > S.MAX_EXPR_DEPTH:
            meta = root.meta
            diags.append(
                Diagnostic(
                    Span(source, meta.start_pos, meta.end_pos),
                    f"expression must be nested at most {S.MAX_EXPR_DEPTH} levels deep, "
                    f"not {depth}",
                    "split it into stages: name parts of it (a = ..., b = ...) and combine those",
                )
            )
    return sorted(diags, key=lambda d: d.span.start if d.span is not None else 0)


# a stage's line up to a point inside its target's brackets (no `=` yet)
_LEFT_INDICES = re.compile(r"[ \t]*[A-Za-z_][A-Za-z0-9_]*[ \t]*\[[^\]=\n]*\Z")
# `prod(j` before a ':': a reduction over j by a name that is no reducer
# the start of a line inside a repeat's body that begins another repeat (`        repeat 2`)
_NESTED_REPEAT = re.compile(r"[ \t]{5,}repeat[ \t]+\S*$")
_UNKNOWN_REDUCER = re.compile(
    r"([A-Za-z_][A-Za-z0-9_]*)[ \t]*\([ \t]*[A-Za-z_][A-Za-z0-9_]*[ \t]*\Z"
)


def _syntax_diagnostic(source: Source, exc: UnexpectedInput) -> Diagnostic:
    pos = getattr(exc, "pos_in_stream", None)
    if isinstance(exc, UnexpectedToken):
        tok = exc.token
        pos = tok.start_pos if tok.start_pos is not None else len(source.text)
        width = (
            max(1, len(str(tok))) if tok.type not in ("_NL", "_DEDENT", "_INDENT", "$END") else 1
        )
        expected = sorted({_describe(t) for t in exc.accepts or exc.expected})
        if tok.type == "$END":
            got = "end of file"
        elif tok.type in ("_NL", "_INDENT", "_DEDENT"):
            got = _describe(tok.type)
            # a newline token starts at the line break: point just after the last character
            pos = tok.start_pos if tok.start_pos is not None else len(source.text)
        else:
            got = f"'{tok}'"
        shown = ", ".join(expected[:7]) + (", ..." if len(expected) > 7 else "")
        msg = f"unexpected {got}"
        hint = f"expected {shown}" if expected else None
        if tok.type == "_INDENT":
            # the token borrows the position of the line break before the indented line: point
            # at that line's first character instead
            pos = tok.end_pos if tok.end_pos is not None else pos
            hint = "indentation must only change at the start of a region body"
        elif _NESTED_REPEAT.match(source.text, source.text.rfind("\n", 0, pos) + 1, pos):
            # `repeat` read as a stage's name: a repeat inside a repeat's body
            msg = "a repeat cannot hold another repeat"
            hint = "write one repeat over the stages, with the product of the counts"
        elif tok.type == "COLON" and (
            m := _UNKNOWN_REDUCER.search(source.text, source.text.rfind("\n", 0, pos) + 1, pos)
        ):
            hint = (
                f"'{m.group(1)}' is no reducer: the reductions are sum, max, min, argmax and "
                "argmin (topk and argtopk as a stage's whole value)"
            )
        elif _LEFT_INDICES.match(source.text, source.text.rfind("\n", 0, pos) + 1, pos):
            # inside the brackets left of a stage's `=`: `y[n - M] = ...`, `y[2] = ...`
            hint = (
                "an index left of '=' is an index name (y[n], s[t: T]) or integer arithmetic "
                "of index names, constants and params (kc[h - NQ, pos, d])"
            )
        return Diagnostic(Span(source, pos, pos + width), msg, hint)
    if isinstance(exc, UnexpectedCharacters):
        pos = exc.pos_in_stream or 0
        ch = source.text[pos] if pos < len(source.text) else "?"
        hint = "names are ASCII letters, digits and '_'; comments start with '#'"
        if ch == "&":
            hint = (
                "the logical operators are '&&', '||' and '!' (the language has no bit operators)"
            )
        return Diagnostic(Span(source, pos, pos + 1), f"unexpected character {ch!r}", hint)
    if isinstance(exc, UnexpectedEOF):
        end = len(source.text)
        return Diagnostic(
            Span(source, end, end),
            "unexpected end of file",
            "close every '(' and '[' and finish the last line",
        )
    return Diagnostic(
        Span(source, pos or 0, (pos or 0) + 1),
        "syntax error",
        "compare the line with the README's language reference",
    )


def parse(text: str, path: str = "<input>") -> S.Module:
    """Parse `.fuse` text.  Raises DiagnosticError on a syntax error."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > S.MAX_SOURCE_BYTES:
        raise DiagnosticError(
            [
                Diagnostic(
                    None,
                    f"source {path} must be at most {S.MAX_SOURCE_BYTES // 1024} KiB "
                    f"({S.MAX_SOURCE_BYTES} bytes), not {size} bytes",
                    "split its regions over several files",
                )
            ]
        )
    if not text.endswith("\n"):
        text += "\n"
    source = Source(path, text)
    try:
        tree = _parser().parse(text)
    except UnexpectedInput as exc:
        raise DiagnosticError([_syntax_diagnostic(source, exc)]) from None
    except _GluedKeyword as exc:
        kw, after = exc.keyword, exc.after
        start = kw.start_pos or 0
        raise DiagnosticError(
            [
                Diagnostic(
                    Span(source, start, after.end_pos or start),
                    f"keyword '{kw}' must be followed by a space, not by '{after}'",
                    f"write '{kw} {after}'",
                )
            ]
        ) from None
    except _Misindented as exc:
        levels = " or ".join(str(n) for n in exc.levels)
        raise DiagnosticError(
            [
                Diagnostic(
                    Span(source, exc.pos, exc.pos + 1),
                    f"inconsistent indentation: {exc.indent} columns, matching no enclosing "
                    f"block ({levels})",
                    "indent every line of a block by the same amount (a tab counts 4)",
                )
            ]
        ) from None
    limits = _limit_diagnostics(source, tree)
    if limits:
        raise DiagnosticError(limits)
    transformer = _ToAst(source)
    top = transformer.transform(tree)
    if transformer.diags:
        raise DiagnosticError(transformer.diags)
    regions = tuple(x for x in top if isinstance(x, S.Region))
    instances = tuple(x for x in top if isinstance(x, S.InstanceDecl))
    groups = tuple(x for x in top if isinstance(x, S.StageGroup))
    return S.Module(path, regions, instances=instances, groups=groups)


def parse_file(path: str | Path) -> S.Module:
    from .source_file import read_source

    return parse(read_source(path), str(path))
