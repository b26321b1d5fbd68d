"""Mutations of real `.fuse` sources: kernels.fuse (one region at a time, now and then whole) and
the `.fuse` files under examples/ and tests/.

Each mutation takes a `Chooser` (frontend_grammar.py) and a text and returns a new text: line
edits (delete, duplicate, swap, re-indent, splice a line from another source), token edits
(replace with another token of the language or of the corpus, delete, rename an identifier
everywhere), junk (random bytes, unicode, NUL, CR, CRLF, BOM, form feed), extreme numbers (0,
-1, 2^32, 1e309, nan...), deeper expressions (a stage's value wrapped hundreds of times) and
whole-text edits (truncate, CRLF line ends, tab indentation, a region twice).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from pathlib import Path

from .frontend_bias import GLSL_NAMES, LONG_NAME
from .frontend_grammar import Chooser, chance, load_grammar, pick, pick_weighted, weighted

ROOT = Path(__file__).resolve().parents[2]
TOKEN = re.compile(
    r"\d+\.\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+|\d+"
    r"|[A-Za-z_]\w*|->|\.\.|<=|>=|==|!=|#[^\n]*|\S"
)
NUMBER = re.compile(r"(?<![\w.])(\d+\.\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|\d+)(?![\w.])")
IDENT = re.compile(r"(?<![\w.])[A-Za-z_]\w*")
EXTREME_NUMBERS = (
    "0",
    "-1",
    "1",
    "2",
    "4294967296",
    "4294967295",
    "2147483648",
    "-2147483649",
    "18446744073709551616",
    "1e309",
    "-1e309",
    "nan",
    "inf",
    "1e-320",
    "3.5e38",
    "0.0",
    "-0.0",
    "99999999999999999999999999",
    "1" + "0" * 400,
    "(0 - 1)",
    "(1 / 0)",
    "(N / 0)",
    "(N % 0)",
    "(N - N)",
)
JUNK = (
    "\x00",
    "\r\n",
    "\r",
    "\n",
    "\t",
    "\x0b",
    "\x0c",
    "\x1c",
    "\x85",
    "\u00a0",
    "\u2028",
    "\u2029",
    "\ufeff",
    "\u200b",
    "é",
    "\U0001f600",
    "\\",
    '"',
    "'",
    "`",
    "$",
    "@",
    "?",
    "#",
    ";",
    "{",
    "}",
    "..",
    "...",
    "->",
    "\n\n",
    "\n    ",
    "\n        ",
    "\n  ",
)
WRAPPERS = (
    "({})",
    "-{}",
    "exp({})",
    "({} + 0.0)",
    "(1.0 * {})",
    "max({}, 0.0)",
    "select(1 < 2, {}, 0.0)",
    "sum(k9: {})",
)
DEPTHS = (2, 3, 5, 10, 40, 150, 400, 1000, 3000)
MAX_GROWTH = 400_000  # characters a deepened expression may reach


@functools.cache
def corpus() -> tuple[tuple[str, str], ...]:
    """(name, text) seeds: each region of kernels.fuse, the whole file, and every other `.fuse`
    file under examples/ and tests/."""
    out: list[tuple[str, str]] = []
    kernels = (ROOT / "kernels.fuse").read_text()
    for i, chunk in enumerate(split_regions(kernels)):
        out.append((f"kernels.fuse#{i}", chunk))
    out.append(("kernels.fuse", kernels))
    for folder in ("examples", "tests"):
        for path in sorted((ROOT / folder).rglob("*.fuse")):
            out.append((str(path.relative_to(ROOT)), path.read_text()))
    return tuple(out)


def split_regions(text: str) -> list[str]:
    """A file cut before each `region` line, each piece keeping the comments above it, the
    `instance` lines after it and, in front, the stage groups it uses (directly or through
    other groups, in file order), so that every piece checks on its own."""
    lines = text.splitlines(keepends=True)
    heads = [i for i, line in enumerate(lines) if line.startswith(("region ", "stages "))]
    blocks: list[tuple[str, str]] = []  # (first line, text) per region or group
    for n, start in enumerate(heads):
        first = start
        while first > 0 and lines[first - 1].startswith("#"):
            first -= 1
        end = heads[n + 1] if n + 1 < len(heads) else len(lines)
        while end > start + 1 and lines[end - 1].startswith("#"):
            end -= 1  # the next block's comments
        blocks.append((lines[start], "".join(lines[first:end]).rstrip("\n") + "\n"))
    groups = {
        m.group(1): body
        for head, body in blocks
        if (m := re.match(r"stages\s+(\w+)", head)) is not None
    }

    def used(body: str) -> set[str]:
        return {g for g in groups if re.search(rf"\b{g}\(", body.split("\n", 1)[-1])}

    pieces = []
    for head, body in blocks:
        if not head.startswith("region "):
            continue
        need, todo = set(), list(used(body))
        while todo:
            g = todo.pop()
            if g not in need:
                need.add(g)
                todo.extend(used(groups[g]))
        carried = [groups[g] for g in groups if g in need]  # file order
        pieces.append("\n".join([*carried, body]))
    return pieces


@functools.cache
def token_pool() -> tuple[str, ...]:
    """Every distinct token of the corpus and every fixed string of the grammar."""
    seen: set[str] = set(load_grammar().literals())
    for _, text in corpus():
        seen.update(m.group() for m in TOKEN.finditer(text) if not m.group().startswith("#"))
    return tuple(sorted(seen))


def pick_seed(ch: Chooser) -> tuple[str, str]:
    """A seed source: mostly one region of kernels.fuse or a small test file, rarely the whole
    31-region file (slow to check)."""
    seeds = corpus()
    whole = [s for s in seeds if s[0] == "kernels.fuse"]
    rest = [s for s in seeds if s[0] != "kernels.fuse"]
    if chance(ch, 0.01):
        return whole[0]
    kernels = [s for s in rest if s[0].startswith("kernels.fuse#")]
    others = [s for s in rest if not s[0].startswith("kernels.fuse#")]
    return pick(ch, kernels) if chance(ch, 0.7) else pick(ch, others)


# --- line edits -------------------------------------------------------------------------------
def _lines(text: str) -> list[str]:
    return text.split("\n")


def delete_line(ch: Chooser, text: str) -> str:
    lines = _lines(text)
    del lines[ch.below(len(lines))]
    return "\n".join(lines)


def duplicate_line(ch: Chooser, text: str) -> str:
    lines = _lines(text)
    i = ch.below(len(lines))
    lines.insert(ch.below(len(lines) + 1), lines[i])
    return "\n".join(lines)


def swap_lines(ch: Chooser, text: str) -> str:
    lines = _lines(text)
    i, j = ch.below(len(lines)), ch.below(len(lines))
    lines[i], lines[j] = lines[j], lines[i]
    return "\n".join(lines)


def reindent_line(ch: Chooser, text: str) -> str:
    lines = _lines(text)
    i = ch.below(len(lines))
    body = lines[i].lstrip(" \t")
    indent = pick(ch, ("", " ", "  ", "   ", "     ", "        ", "\t", "    \t", " \t", "\t\t"))
    lines[i] = indent + body
    return "\n".join(lines)


def splice_line(ch: Chooser, text: str) -> str:
    """A line from another seed, inserted anywhere."""
    _, other = pick(ch, corpus())
    donor = _lines(other)
    lines = _lines(text)
    lines.insert(ch.below(len(lines) + 1), donor[ch.below(len(donor))])
    return "\n".join(lines)


# --- token edits ------------------------------------------------------------------------------
def _tokens(text: str) -> list[re.Match[str]]:
    return list(TOKEN.finditer(text))


def _token_class(token: str) -> str:
    if token[0].isalpha() or token[0] == "_":
        return "word"
    if token[0].isdigit() or token[0] == ".":
        return "number" if token != ".." else "punct"
    return "punct"


def replace_token(ch: Chooser, text: str) -> str:
    """A token replaced: mostly by one of its own class (a word by a word, a number by a
    number, an operator by an operator: the text still parses more often than not)."""
    toks = [m for m in _tokens(text) if not m.group().startswith("#")]
    if not toks:
        return text
    m = pick(ch, toks)
    kind = weighted(ch, [0.7, 0.2, 0.1])
    if kind == 0:
        same = [t for t in token_pool() if _token_class(t) == _token_class(m.group())]
        new = pick(ch, same)
    elif kind == 1:
        new = pick(ch, token_pool())
    else:
        new = pick(ch, (*GLSL_NAMES, *EXTREME_NUMBERS))
    return text[: m.start()] + new + text[m.end() :]


def delete_token(ch: Chooser, text: str) -> str:
    toks = _tokens(text)
    if not toks:
        return text
    m = pick(ch, toks)
    return text[: m.start()] + text[m.end() :]


def insert_token(ch: Chooser, text: str) -> str:
    toks = _tokens(text)
    at = pick(ch, toks).start() if toks else 0
    return text[:at] + pick(ch, token_pool()) + " " + text[at:]


def rename_identifier(ch: Chooser, text: str) -> str:
    """Every (or one) occurrence of an identifier renamed: to another identifier of the text (a
    collision), a keyword, a GLSL reserved word or builtin, or a very long name."""
    names = sorted({m.group() for m in IDENT.finditer(text)})
    if not names:
        return text
    old = pick(ch, names)
    new = pick_weighted(
        ch,
        (
            (pick(ch, names), 0.35),
            (pick(ch, GLSL_NAMES), 0.35),
            (pick(ch, load_grammar().keywords()), 0.15),
            (LONG_NAME, 0.05),
            (old + "_" + old, 0.1),
        ),
    )
    pattern = re.compile(rf"(?<![\w.]){re.escape(old)}(?!\w)")
    if chance(ch, 0.7):
        return pattern.sub(lambda _: new, text)
    hits = list(pattern.finditer(text))
    m = pick(ch, hits)
    return text[: m.start()] + new + text[m.end() :]


# --- junk, numbers, depth ---------------------------------------------------------------------
def insert_junk(ch: Chooser, text: str) -> str:
    at = ch.below(len(text) + 1)
    kind = weighted(ch, [0.6, 0.2, 0.2])
    if kind == 0:
        junk = pick(ch, JUNK)
    elif kind == 1:  # a byte, as the latin-1 character it decodes to
        junk = chr(ch.below(256))
    else:
        code = ch.below(0x110000)
        junk = chr(code) if not 0xD800 <= code <= 0xDFFF else "\ufffd"
    return text[:at] + junk + text[at:]


def extreme_number(ch: Chooser, text: str) -> str:
    hits = list(NUMBER.finditer(text))
    if not hits:
        return text
    m = pick(ch, hits)
    return text[: m.start()] + pick(ch, EXTREME_NUMBERS) + text[m.end() :]


def _stage_values(text: str) -> list[tuple[int, int]]:
    """(start, end) of each stage's value: after ` = ` up to a placement, layout or comment."""
    spans = []
    offset = 0
    for line in text.split("\n"):
        stripped = line.lstrip()
        eq = line.find(" = ")
        if eq > 0 and not stripped.startswith(("const", "param", "launch", "budget", "region")):
            start = eq + 3
            end = len(line)
            for stop in (" in ", " layout ", "#", " @ "):
                k = line.find(stop, start)
                if k >= 0:
                    end = min(end, k)
            if line[start:end].strip():
                spans.append((offset + start, offset + end))
        offset += len(line) + 1
    return spans


def deepen_expression(ch: Chooser, text: str) -> str:
    """A stage's value (or a subexpression: a name or number in it) wrapped many times, or a
    long chain of additions."""
    spans = _stage_values(text)
    if not spans:
        return text
    start, end = pick(ch, spans)
    inner = text[start:end].rstrip()
    end = start + len(inner)
    atoms = list(re.finditer(r"[A-Za-z_]\w*\[[^\[\]]*\]|[A-Za-z_]\w*|\d+\.?\d*", inner))
    if atoms and chance(ch, 0.5):
        a = pick(ch, atoms)
        start, end, inner = start + a.start(), start + a.end(), a.group()
    depth = pick(ch, DEPTHS)
    # past about a megabyte a source takes seconds to parse: big is not the point here
    depth = min(depth, max(2, MAX_GROWTH // (len(inner) + 20)))
    if chance(ch, 0.2):
        op = pick(ch, (" + ", " * ", " - ", " / "))
        new = op.join([f"({inner})"] * depth)
    else:
        wrapper = pick(ch, WRAPPERS)
        new = inner
        for _ in range(depth):
            new = wrapper.format(new)
    return text[:start] + new + text[end:]


# --- whole-text edits -------------------------------------------------------------------------
def truncate(ch: Chooser, text: str) -> str:
    return text[: ch.below(len(text) + 1)]


def crlf(ch: Chooser, text: str) -> str:
    return text.replace("\n", pick(ch, ("\r\n", "\r", "\n\n", "\n \n")))


def tab_indent(ch: Chooser, text: str) -> str:
    return re.sub(r"(?m)^    ", pick(ch, ("\t", "  ", "     ", "\t    ")), text)


def twice(ch: Chooser, text: str) -> str:
    return text + "\n" + text


def drop_indentation(ch: Chooser, text: str) -> str:
    return re.sub(r"(?m)^[ \t]+", "", text)


MUTATIONS: tuple[tuple[Callable[[Chooser, str], str], float], ...] = (
    (replace_token, 0.16),
    (delete_line, 0.07),
    (duplicate_line, 0.06),
    (swap_lines, 0.06),
    (reindent_line, 0.07),
    (splice_line, 0.06),
    (delete_token, 0.07),
    (insert_token, 0.05),
    (rename_identifier, 0.1),
    (insert_junk, 0.08),
    (extreme_number, 0.12),
    (deepen_expression, 0.05),
    (truncate, 0.02),
    (crlf, 0.01),
    (tab_indent, 0.01),
    (twice, 0.01),
    (drop_indentation, 0.005),
)
FAMILIES: dict[str, tuple[Callable[[Chooser, str], str], ...]] = {
    "structure": (
        delete_line,
        duplicate_line,
        swap_lines,
        reindent_line,
        splice_line,
        truncate,
        crlf,
        tab_indent,
        twice,
        drop_indentation,
    ),
    "tokens": (replace_token, delete_token, insert_token, insert_junk),
    "names": (rename_identifier,),
    "numbers": (extreme_number,),
    "depth": (deepen_expression,),
}


def mutate(ch: Chooser, family: str | None = None) -> tuple[str, str]:
    """A seed and 1-4 mutations of it (from one family, or any); returns (description, text)."""
    name, text = pick_seed(ch)
    count = 1 + weighted(ch, [0.5, 0.25, 0.15, 0.1])
    done = []
    for _ in range(count):
        if family is None:
            fn = MUTATIONS[weighted(ch, [w for _, w in MUTATIONS])][0]
        else:
            fn = pick(ch, FAMILIES[family])
        text = fn(ch, text)
        done.append(fn.__name__)
    return f"{name}: {', '.join(done)}", text
