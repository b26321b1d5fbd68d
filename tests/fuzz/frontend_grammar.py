"""The `.fuse` grammar as data, and a deriver that writes sources from it.

`load_grammar()` reads dsl/fuse.lark with Lark's own grammar loader (the EBNF before Lark
compiles it to BNF, so `x*`, `x+`, `x?` and `[x]` stay repetitions whose counts we choose) and
turns it into small frozen nodes.  `derive(grammar, chooser, bias)` walks it from `start`:

- a rule is a frame; its alternatives are weighted by `Bias.alt_weights`, its repetitions
  counted by `Bias.rep_count`, its terminals written by `Bias.terminal` (NAME, INT, FLOAT...);
  a `None` answer falls back to the grammar (uniform choice, the terminal's own definition);
- depth is bounded: below `max_depth` rules only alternatives that can still finish are taken
  (each rule's minimum derivation height is computed from the grammar);
- the indentation tokens are layout: `_NL` starts a line, `_INDENT` / `_DEDENT` change the
  level of the lines after it (4 spaces a level), as the Indenter postlexer of dsl/parse.py
  expects.

Every choice goes through a `Chooser`, so the same code runs under hypothesis (choices are
draws, shrinkable: index 0 is always the simplest) and under a seeded `random.Random` (the
bench: fast, and a case is reproducible from its seed alone).

Not here: what makes a source *meaningful* (names that resolve, shapes that agree); that is
the bias in tests/fuzz/frontend_bias.py.
"""

from __future__ import annotations

import ast
import functools
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from re import _constants as sre_constants  # the stdlib's own regex parser (3.11+)
from re import _parser as sre_parse
from typing import Any, Protocol, Union

from lark import Token, Tree
from lark.grammar import NonTerminal, Terminal
from lark.load_grammar import load_grammar as _lark_load_grammar

GRAMMAR_PATH = Path(__file__).resolve().parents[2] / "dsl" / "fuse.lark"
LAYOUT = ("_NL", "_INDENT", "_DEDENT")


# --- choices ----------------------------------------------------------------------------------
class Chooser(Protocol):
    """The one source of randomness: an integer in [0, n)."""

    def below(self, n: int) -> int: ...


class RandomChooser:
    """Choices from a seeded `random.Random` (the bench)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def below(self, n: int) -> int:
        return self.rng.randrange(n) if n > 1 else 0


class DrawChooser:
    """Choices as hypothesis draws: shrinking moves every choice toward 0."""

    def __init__(self, draw: Callable[[Any], Any]) -> None:
        from hypothesis import strategies as st

        self.draw = draw
        self.st = st

    def below(self, n: int) -> int:
        return int(self.draw(self.st.integers(0, n - 1))) if n > 1 else 0


def weighted(ch: Chooser, weights: Sequence[float]) -> int:
    """An index drawn with the given weights (index 0 is where shrinking goes)."""
    units = [max(0, round(w * 1000)) for w in weights]
    total = sum(units)
    if total == 0:
        return ch.below(len(weights))
    r = ch.below(total)
    for i, u in enumerate(units):
        if r < u:
            return i
        r -= u
    return len(units) - 1


def chance(ch: Chooser, p: float) -> bool:
    """True with probability p; a zero draw (the shrunk one) is False."""
    return ch.below(1000) >= 1000 - round(p * 1000)


def pick(ch: Chooser, seq: Sequence[Any]) -> Any:
    return seq[ch.below(len(seq))]


def pick_weighted(ch: Chooser, table: Sequence[tuple[Any, float]]) -> Any:
    return table[weighted(ch, [w for _, w in table])][0]


# --- the grammar as data ----------------------------------------------------------------------
@dataclass(frozen=True)
class Lit:
    """An anonymous string in a rule, or one alternative of a string terminal."""

    text: str


@dataclass(frozen=True)
class Rx:
    """A regular-expression terminal definition."""

    pattern: str


@dataclass(frozen=True)
class Sym:
    name: str
    terminal: bool


@dataclass(frozen=True)
class Seq:
    items: tuple[Node, ...]
    label: str  # the alias, or the one symbol's name, or the items spelled out


@dataclass(frozen=True)
class Alt:
    options: tuple[Seq, ...]


@dataclass(frozen=True)
class Rep:
    item: Node
    lo: int
    hi: int | None


Node = Union[Lit, Rx, Sym, Seq, Alt, Rep]


@dataclass
class Grammar:
    rules: dict[str, Alt]
    terminals: dict[str, Alt | None]  # None: declared, produced by the postlexer
    ignore: tuple[str, ...]
    heights: dict[str, int] = field(default_factory=dict)

    def literals(self) -> list[str]:
        """Every fixed string of the language: keywords, punctuation, operators."""
        out: set[str] = set()

        def walk(n: Node) -> None:
            match n:
                case Lit(text):
                    out.add(text)
                case Seq(items, _):
                    for i in items:
                        walk(i)
                case Alt(options):
                    for o in options:
                        walk(o)
                case Rep(item, _, _):
                    walk(item)

        for alt in self.rules.values():
            walk(alt)
        for t in self.terminals.values():
            if t is not None:
                walk(t)
        return sorted(out)

    def keywords(self) -> list[str]:
        return [s for s in self.literals() if re.fullmatch(r"[A-Za-z_]\w*", s)]


def _unquote(tok: Token) -> Lit | Rx:
    text = str(tok)
    if tok.type == "STRING":
        end = text.rindex('"')
        return Lit(ast.literal_eval(text[: end + 1]))
    end = text.rindex("/")
    return Rx(text[1:end])


def _label(items: tuple[Node, ...]) -> str:
    if len(items) == 1 and isinstance(items[0], Sym):
        return items[0].name
    parts = []
    for i in items:
        match i:
            case Lit(text):
                parts.append(text)
            case Sym(name, _):
                parts.append(name)
            case _:
                parts.append("...")
    return " ".join(parts)


def _convert(t: Any) -> Node:
    if isinstance(t, Terminal):
        return Sym(t.name, True)
    if isinstance(t, NonTerminal):
        return Sym(t.name, False)
    assert isinstance(t, Tree), t
    kids = t.children
    match t.data:
        case "expansions":
            return Alt(tuple(_as_seq(_convert(c)) for c in kids))
        case "expansion":
            items = tuple(_convert(c) for c in kids)
            return Seq(items, _label(items))
        case "alias":
            seq = _as_seq(_convert(kids[0]))
            alias = kids[1]
            return Seq(seq.items, str(getattr(alias, "name", alias)))
        case "expr":
            item = _convert(kids[0])
            op = str(kids[1])
            if op == "?":
                return Rep(item, 0, 1)
            if op == "*":
                return Rep(item, 0, None)
            if op == "+":
                return Rep(item, 1, None)
            if op == "~":
                lo = int(kids[2])
                return Rep(item, lo, int(kids[3]) if len(kids) > 3 else lo)
            raise NotImplementedError(f"grammar operator {op!r}")
        case "maybe":
            return Rep(_convert(kids[0]), 0, 1)
        case "value":
            return _convert(kids[0])
        case "literal":
            return _unquote(kids[0])
    raise NotImplementedError(f"grammar construct {t.data!r}: teach tests/fuzz/frontend_grammar.py")


def _as_seq(n: Node) -> Seq:
    if isinstance(n, Seq):
        return n
    return Seq((n,), _label((n,)))


def _height(n: Node, h: dict[str, int]) -> int:
    inf = 10**9
    match n:
        case Lit() | Rx():
            return 0
        case Sym(name, True):
            return 0
        case Sym(name, False):
            return 1 + h.get(name, inf) if h.get(name, inf) < inf else inf
        case Seq(items, _):
            return max((_height(i, h) for i in items), default=0)
        case Alt(options):
            return min(_height(o, h) for o in options)
        case Rep(item, lo, _):
            return 0 if lo == 0 else _height(item, h)
    raise AssertionError(n)


@functools.cache
def load_grammar(path: Path = GRAMMAR_PATH) -> Grammar:
    """dsl/fuse.lark through Lark's loader, as frozen nodes with each rule's minimum height."""
    g, _ = _lark_load_grammar(path.read_text(), str(path), [], False)
    rules: dict[str, Alt] = {}
    for name, _params, tree, _options in g.rule_defs:
        node = _convert(tree)
        rules[str(name)] = node if isinstance(node, Alt) else Alt((_as_seq(node),))
    terminals: dict[str, Alt | None] = {}
    for name, (tree, _prio) in g.term_defs:
        if tree is None:
            terminals[name] = None
        else:
            node = _convert(tree)
            terminals[name] = node if isinstance(node, Alt) else Alt((_as_seq(node),))
    grammar = Grammar(rules, terminals, tuple(g.ignore))
    heights: dict[str, int] = {}
    changed = True
    while changed:
        changed = False
        for name, alt in rules.items():
            hh = _height(alt, heights)
            if hh < heights.get(name, 10**9):
                heights[name] = hh
                changed = True
    grammar.heights = heights
    return grammar


def node_height(g: Grammar, n: Node) -> int:
    return _height(n, g.heights)


# --- regular expressions ----------------------------------------------------------------------
def regex_text(ch: Chooser, pattern: str, max_repeat: int = 4) -> str:
    """A string matching `pattern` (lookarounds are skipped): for terminals with no bias."""
    out: list[str] = []

    def gen(items: Any) -> None:
        for op, arg in items:
            if op == sre_constants.LITERAL:
                out.append(chr(arg))
            elif op == sre_constants.NOT_LITERAL:
                out.append(pick(ch, [c for c in "abc xyz019_" if ord(c) != arg]))
            elif op == sre_constants.ANY:
                out.append(pick(ch, "abcxyz019_ "))
            elif op == sre_constants.IN:
                out.append(_from_set(ch, arg))
            elif op == sre_constants.BRANCH:
                gen(pick(ch, arg[1]))
            elif op == sre_constants.SUBPATTERN:
                gen(arg[-1])
            elif op in (sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT):
                lo, hi, sub = arg
                hi = min(hi, lo + max_repeat)
                for _ in range(lo + ch.below(hi - lo + 1)):
                    gen(sub)
            elif op in (sre_constants.ASSERT, sre_constants.ASSERT_NOT, sre_constants.AT):
                pass
            else:
                raise NotImplementedError(f"regex op {op} in {pattern!r}")

    gen(sre_parse.parse(pattern))
    return "".join(out)


def _from_set(ch: Chooser, items: Any) -> str:
    if items and items[0][0] == sre_constants.NEGATE:
        excluded = "".join(_from_set(ch, [it]) for it in items[1:] if it[0] != "")
        choices = [c for c in "abc xyz019_+-*(),:" if c not in excluded and c != "\n"]
        return pick(ch, choices)
    op, arg = pick(ch, items)
    if op == sre_constants.LITERAL:
        return chr(arg)
    if op == sre_constants.RANGE:
        return chr(arg[0] + ch.below(arg[1] - arg[0] + 1))
    if op == sre_constants.CATEGORY:
        return {
            sre_constants.CATEGORY_DIGIT: "0",
            sre_constants.CATEGORY_SPACE: " ",
            sre_constants.CATEGORY_WORD: "a",
        }.get(arg, "a")
    raise NotImplementedError(f"regex set item {op}")


# --- derivation -------------------------------------------------------------------------------
@dataclass
class Frame:
    """One rule being derived."""

    rule: str
    label: str = ""  # the chosen top-level alternative (alias or symbol name)
    reps: int = 0  # repetitions visited so far at this frame's level
    names: int = 0  # NAME tokens written so far at this frame's level
    children: dict[str, int] = field(default_factory=dict)  # rules started, by name
    data: dict[str, Any] = field(default_factory=dict)


class Bias:
    """No bias: the grammar's own uniform choices.  Subclasses steer toward meaningful text."""

    def __init__(self, ch: Chooser) -> None:
        self.ch = ch

    def enter(self, frame: Frame, parent: Frame | None) -> None:
        pass

    def chosen(self, frame: Frame) -> None:
        pass

    def exit(self, frame: Frame) -> None:
        pass

    def alt_weights(self, frame: Frame, labels: list[str]) -> list[float] | None:
        return None

    def rep_count(self, frame: Frame, rep: Rep) -> int | None:
        return None

    def terminal(self, frame: Frame, name: str) -> str | None:
        return None


@dataclass
class Tok:
    type: str
    text: str


class Deriver:
    """Walks the grammar from `start`, writing tokens; `render()` lays them out as text."""

    def __init__(self, grammar: Grammar, ch: Chooser, bias: Bias, max_depth: int) -> None:
        self.g = grammar
        self.ch = ch
        self.bias = bias
        self.max_depth = max_depth
        self.frames: list[Frame] = []
        self.tokens: list[Tok] = []
        self.max_tokens = 10**9  # past this many tokens, every choice takes the shortest way out

    def room(self, depth: int) -> int:
        return self.max_depth - depth if len(self.tokens) < self.max_tokens else -1

    def run(self, start: str = "start") -> list[Tok]:
        self.rule(start, 0)
        return self.tokens

    def rule(self, name: str, depth: int) -> None:
        parent = self.frames[-1] if self.frames else None
        if parent is not None:
            parent.children[name] = parent.children.get(name, 0) + 1
        frame = Frame(name)
        self.frames.append(frame)
        self.bias.enter(frame, parent)
        alt = self.g.rules[name]
        seq = alt.options[self.choose(frame, alt, depth)]
        frame.label = seq.label
        self.bias.chosen(frame)
        self.node(seq, depth)
        self.bias.exit(frame)
        self.frames.pop()

    def choose(self, frame: Frame, alt: Alt, depth: int) -> int:
        if len(alt.options) == 1:
            return 0
        heights = [node_height(self.g, o) for o in alt.options]
        room = self.room(depth)
        feasible = [h <= room for h in heights]
        if not any(feasible):
            low = min(heights)
            feasible = [h == low for h in heights]
        weights = self.bias.alt_weights(frame, [o.label for o in alt.options])
        if weights is None or not any(w > 0 and f for w, f in zip(weights, feasible, strict=True)):
            weights = [1.0] * len(alt.options)
        masked = [w if f else 0.0 for w, f in zip(weights, feasible, strict=True)]
        return weighted(self.ch, masked)

    def node(self, n: Node, depth: int) -> None:
        match n:
            case Lit(text):
                self.tokens.append(Tok("LIT", text))
            case Sym(name, True):
                self.terminal(name)
            case Sym(name, False):
                self.rule(name, depth + 1)
            case Seq(items, _):
                for i in items:
                    self.node(i, depth)
            case Alt():
                self.node(n.options[self.choose(self.frames[-1], n, depth)], depth)
            case Rep(item, lo, hi):
                frame = self.frames[-1]
                count = self.bias.rep_count(frame, n)
                frame.reps += 1
                room = self.room(depth)
                if count is None or node_height(self.g, item) > room:
                    if node_height(self.g, item) > room:
                        count = lo
                    else:
                        count = lo + weighted(self.ch, [0.45, 0.3, 0.15, 0.1])
                count = max(lo, count if hi is None else min(hi, count))
                for _ in range(count):
                    self.node(item, depth)
            case Rx(pattern):
                self.tokens.append(Tok("RX", regex_text(self.ch, pattern)))

    def terminal(self, name: str) -> None:
        frame = self.frames[-1]
        if name in LAYOUT:
            self.tokens.append(Tok(name, ""))
            return
        text = self.bias.terminal(frame, name)
        if name == "NAME":
            frame.names += 1
        if text is None:
            definition = self.g.terminals.get(name)
            if definition is None:
                raise NotImplementedError(f"no text for terminal {name}")
            pieces = Deriver(self.g, self.ch, Bias(self.ch), 4)
            pieces.frames.append(Frame(name))
            pieces.node(definition, 0)
            text = "".join(t.text for t in pieces.tokens)
        self.tokens.append(Tok(name, text))


_OPENERS = ("(", "[")
_CLOSERS = (")", "]")
_TIGHT_AFTER = ("(", "[")
_TIGHT_BEFORE = (")", "]", ",", ":")
_WORDY = re.compile(r"\w$")


@dataclass
class Layout:
    """How tokens become text: the indentation unit, and how often a bracketed list wraps."""

    indent: str = "    "
    wrap: float = 0.0
    comment: float = 0.0


def render(tokens: Sequence[Tok], ch: Chooser, layout: Layout) -> str:
    """Tokens as text: `_NL` ends a line, `_INDENT`/`_DEDENT` set the next lines' level."""
    out: list[str] = []
    level = 0
    newlines = 0
    depth = 0  # open brackets: the Indenter ignores line breaks inside them
    prev: str | None = None
    for tok in tokens:
        if tok.type == "_NL":
            newlines += 1
            continue
        if tok.type == "_INDENT":
            level += 1
            continue
        if tok.type == "_DEDENT":
            level -= 1
            continue
        if newlines:
            if prev is not None and layout.comment and chance(ch, layout.comment):
                out.append("  # " + pick(ch, ("note", "x[k] * 2", "é", "TODO: issue 13", "")))
            out.append("\n" * newlines + layout.indent * level)
            newlines = 0
        elif prev is not None:
            if depth > 0 and layout.wrap and chance(ch, layout.wrap):
                out.append("\n" + " " * ch.below(13))
            elif not (
                prev in _TIGHT_AFTER
                or tok.text in _TIGHT_BEFORE
                or (tok.text in _OPENERS and _WORDY.search(prev))
            ):
                out.append(" ")
        out.append(tok.text)
        if tok.text in _OPENERS:
            depth += 1
        elif tok.text in _CLOSERS:
            depth = max(0, depth - 1)
        prev = tok.text
    if newlines or out:
        out.append("\n")
    return "".join(out)
