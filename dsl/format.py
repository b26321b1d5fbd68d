"""`.fuse` text -> the same program in fusec's one canonical layout (`fusec fmt`).

Input: the text of a `.fuse` file and its path.  `format_source` parses it first (dsl/parse.py):
a syntax error raises the parser's own DiagnosticError, and nothing is formatted.  It then
lays out the tokens the parser read, statement by statement, using the parsed module to tell
stages from declarations and to find a stage's placement and layout, and the source text
between tokens for comments, blank lines and the line breaks written inside brackets.

Output: the canonical text.  Only whitespace changes (spaces, indentation, blank lines, line
endings): the tokens, their order, the comments and the block structure stay as written, so the
program means what it meant.  `format_source` checks that on its own output (the same tokens,
indentation levels and comments when read again) and raises AssertionError, a bug here, if not.

The layout, as kernels.fuse is written:
- a region header at column 1, its body indented 4 spaces, a `repeat` body 8 (tabs and other
  widths are re-indented; only the nesting counts);
- one space between words and around operators (`=`, `+`, `*`, `<=`, `&&`, `->`, `..`, `|`,
  `@`); none before `,` `:` `)` `]`, none after `(` `[`, a unary `-` and `!`; a name's `(` or
  `[` follows it directly (`rsqrt(`, `x[`, `region r(`), a keyword's after a space (`tile (`);
- stages: in a run of consecutive stage lines of one block (no blank line and no other
  statement between them; comment lines do not end a run):
  - the `=` signs line up after the longest target of at most TARGET_ALIGN_MAX characters; a
    longer target is followed by one space and moves no other line;
  - the placement/layout clause starts at column CLAUSE_COLUMN + 1 (57), or two columns after
    the run's longest expression when that reaches further.  An expression that would push the
    clause past column CLAUSE_ALIGN_MAX (80), or that is written over several lines, is
    followed by two spaces and moves no other line;
  - two spaces separate a placement from a layout (`in shared  layout d -> subgroup`);
- line breaks inside brackets stay where they are written (long signatures and expressions are
  neither wrapped nor joined): a continuation line is indented 8 spaces past its statement, one
  that starts with `)` or `]` as its statement;
- comments keep their text (trailing whitespace removed).  A comment after code follows it by
  two spaces.  A comment line takes the indentation of the block it was written in: of the
  blocks that close or open around it, the one whose indentation is nearest its own (the
  deeper one on a tie);
- blank lines: a run of them becomes one; none at the start or the end of the file, none inside
  brackets.  A region header and the unindented comment lines directly above it are preceded by
  one blank line (unless they start the file);
- lines end with `\\n`, with no trailing whitespace, and the file with one `\\n`.

Not done here: wrapping or joining long lines, reordering declarations, removing parentheses or
trailing commas, rewriting numbers (`1e-6` stays `1e-6`).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator, Sequence

import attrs
from lark import Token
from lark.exceptions import LarkError

from . import syntax as S
from .diagnostics import Diagnostic, DiagnosticError
from .parse import _parser, parse

INDENT = 4  # spaces per block level
CONTINUATION = 8  # spaces past its statement for a line continued inside brackets
TARGET_ALIGN_MAX = 11  # the longest target (`rot[d: D]`, `q[h: NQ, d]`) the `=` signs align to
CLAUSE_COLUMN = 56  # 0-based column of the placement/layout clause (57 as editors count)
CLAUSE_ALIGN_MAX = 80  # a clause is aligned only when it starts at or before this 0-based column

_OPEN = frozenset(("LPAR", "LSQB"))
_CLOSE = frozenset(("RPAR", "RSQB"))
_NO_SPACE_BEFORE = frozenset(("COMMA", "COLON", "RPAR", "RSQB"))
# MINUS: the unary minus (ADDOP: binary); NOT: `!`
_NO_SPACE_AFTER = frozenset(("LPAR", "LSQB", "MINUS", "NOT"))
_GLUED_TO_BRACKET = frozenset(
    ("NAME", "REDUCER", "TOPK")
)  # `f(`, `x[`, `sum(`: a call, access, header
_LAYOUT_TOKENS = frozenset(("_NL", "_INDENT", "_DEDENT"))
_COMMENT = re.compile(r"#[^\n]*")


@attrs.frozen
class _Gap:
    """The text between two tokens, which holds only whitespace, line breaks and comments."""

    trailing: str | None  # the comment that ends the line of the token before
    lines: tuple[tuple[str | None, int], ...]  # the whole lines after: (comment or None, width)
    breaks: bool  # whether a line break lies in it
    width: int  # the indentation width before the token after it


@attrs.frozen
class _Statement:
    """One logical line: a region header, a declaration, `repeat N:`, or a stage."""

    tokens: tuple[Token, ...]
    depth: int  # 0: region header; 1: region body; 2: repeat body
    kind: str  # "region" | "stage" | "declaration"
    stage: S.Stage | None  # the parsed stage, for a stage


def _width(line: str) -> int:
    """Indentation width of a line, counted as the parser's indenter counts it (tab = 4)."""
    lead = line[: len(line) - len(line.lstrip(" \t"))]
    return lead.count(" ") + lead.count("\t") * 4


def _gap(text: str) -> _Gap:
    pieces = text.split("\n")
    trailing = pieces[0].strip(" \t\r") or None
    lines = tuple((p.strip(" \t\r") or None, _width(p)) for p in pieces[1:-1])
    return _Gap(trailing, lines, len(pieces) > 1, _width(pieces[-1]))


def _tokens(text: str) -> Iterator[Token]:
    """The tokens the parser reads, with the indenter's _NL, _INDENT and _DEDENT."""
    yield from _parser().parse_interactive(text).iter_parse()


def _statements(text: str, module: S.Module) -> list[_Statement]:
    stages: dict[int, S.Stage] = {}
    blocks: list[S.Region | S.StageGroup] = [*module.regions, *module.groups]
    for block in blocks:
        for item in block.stages:
            for stage in item.stages if isinstance(item, S.Repeat) else (item,):
                stages[stage.span.start] = stage  # a stage group's use may start with `(`
    out: list[_Statement] = []
    current: list[Token] = []
    depth = start_depth = 0

    def close() -> None:
        first = current[0]
        stage = stages.get(first.start_pos or 0)
        header = first.type in ("REGION", "STAGES")  # a region's or a stage group's
        kind = "region" if header else "stage" if stage else "declaration"
        out.append(_Statement(tuple(current), start_depth, kind, stage))
        current.clear()

    for tok in _tokens(text):
        if tok.type == "_NL":
            if current:
                close()
        elif tok.type == "_INDENT":
            depth += 1
        elif tok.type == "_DEDENT":
            depth -= 1
        else:
            if not current:
                start_depth = depth
            current.append(tok)
    if current:
        close()
    assert sum(s.kind == "stage" for s in out) == len(stages), "a stage the tokens do not start"
    return out


def _space(before: Token, after: Token) -> str:
    if after.type in _NO_SPACE_BEFORE or before.type in _NO_SPACE_AFTER:
        return ""
    # a region's dtype parameters, an instance's dtypes: `gated_ffn<Wt in f16, q4_0>(`
    if after.type in ("LESSTHAN", "MORETHAN", "SEMICOLON") or before.type == "LESSTHAN":
        return ""
    if before.type == "MORETHAN" and after.type == "LPAR":
        return ""
    if after.type in _OPEN and before.type in _GLUED_TO_BRACKET:
        return ""
    return " "


def _lay_out(tokens: Sequence[Token], text: str, indent: int) -> list[str]:
    """Tokens of one statement (or a part of one) as lines, the first without its indentation.
    Line breaks inside brackets are kept, with the comments around them."""
    lines = [""]
    for i, tok in enumerate(tokens):
        if i:
            before = tokens[i - 1]
            gap = _gap(text[before.end_pos : tok.start_pos])
            if gap.breaks:
                if gap.trailing:
                    lines[-1] += "  " + gap.trailing
                continued = " " * (indent + CONTINUATION)
                lines.extend(continued + comment for comment, _ in gap.lines if comment)
                lines.append(" " * indent if tok.type in _CLOSE else continued)
            else:
                lines[-1] += _space(before, tok)
        lines[-1] += str(tok)
    return lines


@attrs.frozen
class _StageText:
    """A stage laid out in parts, before the run it belongs to aligns them."""

    target: list[str]
    value: list[str]
    clause: str  # "" when the stage has neither placement nor layout


def _stage_text(st: _Statement, text: str, indent: int) -> _StageText:
    assert st.stage is not None
    tokens = st.tokens
    starts = [t.start_pos for t in tokens]
    equal = next(i for i, t in enumerate(tokens) if t.type == "EQUAL")
    # the clause keywords are the tokens before the placement's name and the first layout item
    placement = starts.index(st.stage.placement.span.start) - 1 if st.stage.placement else None
    layout = starts.index(st.stage.layout[0].span.start) - 1 if st.stage.layout else None
    parts = [i for i in (placement, layout) if i is not None]
    end = min(parts, default=len(tokens))
    bounds = [*parts, len(tokens)]
    clause = "  ".join(
        " ".join(_lay_out(tokens[a:b], text, indent)) for a, b in itertools.pairwise(bounds)
    )
    return _StageText(
        _lay_out(tokens[:equal], text, indent),
        _lay_out(tokens[equal + 1 : end], text, indent),
        clause,
    )


def _lay_out_run(run: Sequence[_Statement], text: str) -> list[list[str]]:
    """The lines of a run of stages of one block, `=` signs and clauses aligned."""
    indent = run[0].depth * INDENT
    parts = [_stage_text(st, text, indent) for st in run]
    aligned = [len(p.target) == 1 and len(p.target[0]) <= TARGET_ALIGN_MAX for p in parts]
    target_width = max(
        (len(p.target[0]) for p, a in zip(parts, aligned, strict=True) if a), default=0
    )
    heads: list[list[str]] = []
    for p, a in zip(parts, aligned, strict=True):
        lines = [*p.target]
        lines[-1] = (lines[-1].ljust(target_width) if a else lines[-1]) + " = " + p.value[0]
        lines.extend(p.value[1:])
        lines[0] = " " * indent + lines[0]
        heads.append(lines)
    ends = [
        len(h[0]) if len(h) == 1 and p.clause else None for h, p in zip(heads, parts, strict=True)
    ]
    reach = [e + 2 for e in ends if e is not None and e + 2 <= CLAUSE_ALIGN_MAX]
    column = max([CLAUSE_COLUMN, *reach])
    for lines, p, end in zip(heads, parts, ends, strict=True):
        if not p.clause:
            continue
        if end is not None and end + 2 <= CLAUSE_ALIGN_MAX:
            lines[-1] = lines[-1].ljust(column) + p.clause
        else:
            lines[-1] += "  " + p.clause
    return heads


def _comment_depth(width: int, widths: Sequence[int], depth: int, next_depth: int) -> int:
    """The block of a comment line of indentation `width` between a statement at `depth` and
    one at `next_depth`: of the blocks that close or open there, the one whose indentation
    (`widths`, per depth) is nearest the comment's, the deeper one on a tie."""
    lo, hi = min(depth, next_depth), max(depth, next_depth)
    return min(range(lo, hi + 1), key=lambda d: (abs(widths[d] - width), -d))


_BLANK = None  # a blank line among the output lines


def format_source(text: str, path: str) -> str:
    """`text` in the canonical layout.  Raises the parser's DiagnosticError on a syntax error."""
    module = parse(text, path)
    if not text.endswith("\n"):
        text += "\n"  # as parse() reads it
    statements = _statements(text, module)
    lines = _with_comments(statements, _lay_out_statements(statements, text), text)
    collapsed: list[str] = []
    for line in lines:
        if line is not _BLANK:
            collapsed.append(line)
        elif collapsed and collapsed[-1] != "":
            collapsed.append("")
    while collapsed and collapsed[-1] == "":
        collapsed.pop()
    formatted = "".join(line + "\n" for line in collapsed)
    _check_unchanged(text, formatted, path)
    return formatted


def _lay_out_statements(statements: Sequence[_Statement], text: str) -> list[list[str]]:
    """Each statement's lines, the stages aligned run by run."""
    laid_out: list[list[str]] = []
    run: list[_Statement] = []
    for i, st in enumerate(statements):
        if st.kind == "stage":
            prev = statements[i - 1]  # a stage never comes first: a region header does
            gap = _gap(text[prev.tokens[-1].end_pos : st.tokens[0].start_pos])
            blank = any(comment is None for comment, _ in gap.lines)
            if run and (prev.kind != "stage" or prev.depth != st.depth or blank):
                laid_out.extend(_lay_out_run(run, text))
                run = []
            run.append(st)
            continue
        if run:
            laid_out.extend(_lay_out_run(run, text))
            run = []
        lines = _lay_out(st.tokens, text, st.depth * INDENT)
        lines[0] = " " * (st.depth * INDENT) + lines[0]
        laid_out.append(lines)
    if run:
        laid_out.extend(_lay_out_run(run, text))
    return laid_out


def _with_comments(
    statements: Sequence[_Statement], laid_out: Sequence[list[str]], text: str
) -> list[str | None]:
    """The statements' lines with the comment lines and blank lines (_BLANK) around them."""
    first = statements[0].tokens[0].start_pos if statements else len(text)
    prefix = _gap("\n" + text[:first])  # the file's first line has no token before to trail
    out: list[str | None] = [comment for comment, _ in prefix.lines]
    width = prefix.width  # the indentation the next statement was written with
    widths: list[int] = []  # per depth, the indentation of the blocks open at a statement
    for i, (st, lines) in enumerate(zip(statements, laid_out, strict=True)):
        widths = [*widths[: st.depth], width]
        nxt = statements[i + 1] if i + 1 < len(statements) else None
        gap = _gap(text[st.tokens[-1].end_pos : nxt.tokens[0].start_pos if nxt else len(text)])
        out.extend(lines[:-1])
        out.append(lines[-1] + ("  " + gap.trailing if gap.trailing else ""))
        next_depth = nxt.depth if nxt else 0
        candidates = [*widths, gap.width] if next_depth > st.depth else widths
        between: list[str | None] = []
        for comment, indent in gap.lines:
            depth = _comment_depth(indent, candidates, st.depth, next_depth)
            between.append(_BLANK if comment is None else " " * (depth * INDENT) + comment)
        if nxt is not None and nxt.kind == "region":
            # one blank line before a region and the unindented comments directly above it
            top = len(between)
            while top and (line := between[top - 1]) is not None and line.startswith("#"):
                top -= 1
            between.insert(top, _BLANK)
        out.extend(between)
        width = gap.width
    return out


def _signature(text: str) -> tuple[list[tuple[str, str]], list[str]]:
    tokens = [(t.type, "" if t.type in _LAYOUT_TOKENS else str(t)) for t in _tokens(text)]
    if tokens[:1] == [("_NL", "")]:
        del tokens[0]  # blank or comment lines before the first region, or none
    comments = [c.rstrip(" \t\r") for c in _COMMENT.findall(text)]
    return tokens, comments


def _check_unchanged(text: str, formatted: str, path: str) -> None:
    """The formatted text must read as the same tokens, blocks and comments as the original."""
    size = len(formatted.encode("utf-8", "surrogatepass"))
    if size > S.MAX_SOURCE_BYTES:
        raise DiagnosticError(
            [
                Diagnostic(
                    None,
                    f"formatted, {path} would be {size} bytes, past the "
                    f"{S.MAX_SOURCE_BYTES // 1024} KiB a source may hold",
                    "split its regions over several files",
                )
            ]
        )
    try:
        same = _signature(formatted) == _signature(text)
    except LarkError as exc:
        raise AssertionError(f"fusec fmt wrote text that does not parse ({path}): {exc}") from exc
    assert same, f"fusec fmt changed the tokens or comments of {path}"
