"""Syntax highlighting for `.fuse`: a Pygments lexer, and the word lists and patterns that
scripts/gen_textmate.py writes into the VS Code grammar (editors/vscode/).

Input: the language itself, read at import time. The keywords are the grammar's identifier
literals (`region`, `const`, `in`, ..., from the terminals of the Lark parser that parses
`.fuse`); names, numbers, comments and the operators are the grammar's own terminal patterns;
the dtypes, functions, reducers, placements and scopes come from `dsl/types.py`. A word added
to the language is highlighted without an edit here.

Output: `FuseLexer` (registered as Pygments' `fuse` lexer by the `pygments.lexers` entry point
in pyproject.toml, so `pygmentize -l fuse kernels.fuse` works) and the lists below.

Not checked here: whether the text parses. The lexer never gives `Token.Error`: a character
the language does not know (`$`) is plain text, since the checker reports it at its line.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from lark.lexer import PatternStr
from pygments.lexer import RegexLexer, bygroups, words
from pygments.token import (
    Comment,
    Keyword,
    Name,
    Number,
    Operator,
    Punctuation,
    Text,
    Whitespace,
)

from . import types as T
from .parse import _parser

_TERMINALS = {t.name: t.pattern for t in _parser().terminals}


def _regex(terminal: str) -> str:
    """A terminal of dsl/fuse.lark as a regular expression, grouped."""
    return f"(?:{_TERMINALS[terminal].to_regexp()})"


# the grammar's string literals: keywords (`region`, `in`) and symbols (`->`, `..`, `(`)
_LITERALS = [p.value for p in _TERMINALS.values() if isinstance(p, PatternStr)]

# `x` is a keyword only between a layout's target and its vector width (`k -> lane x 4`); it
# is also the usual name of an input vector (`x: f32[K]`), which Lark's contextual lexer reads
# as a NAME. So `x` is highlighted as a keyword only where a width follows it.
CONTEXTUAL_KEYWORDS: dict[str, str] = {"x": r"(?=[ \t]+[0-9])"}
KEYWORDS: tuple[str, ...] = tuple(
    sorted(w for w in _LITERALS if w.isidentifier() and w not in CONTEXTUAL_KEYWORDS)
)
assert set(CONTEXTUAL_KEYWORDS) <= {w for w in _LITERALS if w.isidentifier()}
REGION_KEYWORD = "region"  # followed by the region's name, highlighted as a function's
assert REGION_KEYWORD in KEYWORDS

TYPES: tuple[str, ...] = tuple(sorted(T.BUFFER_DTYPES))
# elementwise functions and reducers; highlighted only where a `(` follows, so that a value
# that happens to be called `exp` or `sum` stays a name
FUNCTIONS: tuple[str, ...] = tuple(
    sorted(set(T.FUNCTIONS) | set(T.REDUCERS) | set(T.TOPK_REDUCERS))
)
# the words of placements (`in shared`) and reduction scopes (`@ subgroup`), which the grammar
# reads as names and the checker gives their meaning
CONSTANTS: tuple[str, ...] = tuple(
    sorted(({p.value for p in T.Placement} | {s.value for s in T.Scope}) - set(KEYWORDS))
)

NAME = _regex("NAME")
FLOAT = _regex("FLOAT")
INT = _regex("INT")
COMMENT = _regex("COMMENT")
_BRACKETS_AND_SEPARATORS = set("()[],:")
_SYMBOLS = [w for w in _LITERALS if not w.isidentifier()]
PUNCTUATION = (
    "[" + "".join(re.escape(s) for s in sorted(set(_SYMBOLS) & _BRACKETS_AND_SEPARATORS)) + "]"
)
# the symbols that are no punctuation, longest first (`->` before `-`), and the operator
# terminals (`||`, `&&`, comparisons, `!`, `+ -`, `* / %`)
OPERATOR = "|".join(
    [
        re.escape(s)
        for s in sorted(set(_SYMBOLS) - _BRACKETS_AND_SEPARATORS, key=lambda s: (-len(s), s))
    ]
    + [_regex(t) for t in ("OROP", "ANDOP", "COMPOP", "NOT", "ADDOP", "MULOP")]
)
FUNCTION_CALL = r"(?=\s*\()"


class FuseLexer(RegexLexer):  # type: ignore[misc]  # pygments is untyped
    """Pygments lexer for `.fuse` region files."""

    name = "fuse"
    aliases: ClassVar[list[str]] = ["fuse"]
    filenames: ClassVar[list[str]] = ["*.fuse"]
    mimetypes: ClassVar[list[str]] = ["text/x-fuse"]

    tokens: ClassVar[dict[str, list[Any]]] = {
        "root": [
            (r"\s+", Whitespace),
            (COMMENT, Comment.Single),
            (
                rf"({REGION_KEYWORD})([ \t]+)({NAME})",
                bygroups(Keyword, Whitespace, Name.Function),
            ),
            *((rf"{w}{after}", Keyword) for w, after in CONTEXTUAL_KEYWORDS.items()),
            (words(KEYWORDS, suffix=r"\b"), Keyword),
            (words(TYPES, suffix=r"\b"), Keyword.Type),
            (words(FUNCTIONS, suffix=rf"\b{FUNCTION_CALL}"), Name.Builtin),
            (words(CONSTANTS, suffix=r"\b"), Keyword.Pseudo),
            (NAME, Name),
            (FLOAT, Number.Float),
            (INT, Number.Integer),
            (OPERATOR, Operator),
            (PUNCTUATION, Punctuation),
            (r".", Text),  # outside the language; the checker reports it
        ]
    }
