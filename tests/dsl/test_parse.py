"""The lexical layer of dsl/parse.py that catalogue files show poorly: comment-only lines inside
a region body, characters other than a line feed that Python counts as line breaks, and keywords
run together with the word after them (each found by the front-end fuzzer, docs/FUZZING.md)."""

from __future__ import annotations

import pytest

from fusec.dsl.check import check
from fusec.dsl.diagnostics import DiagnosticError
from fusec.dsl.parse import parse

PLAIN = """region r(x: f32[N]) -> y: f32[N]
    const N = 4
    launch workgroup 64
    t[i] = x[i] * 2.0
    y[i] = t[i]
"""
COMMENTED = """# a comment before the first region

region r(x: f32[N]) -> y: f32[N]    # after the signature
    # before the first declaration
    const N = 4
    # why
  # at another indentation
        # deeper still

    launch workgroup 64  # at the end of a line
    t[i] = x[i] * 2.0
    # between two stages
    y[i] = t[i]
    # after the last stage
# after the region
"""

TILE = """region r(m: f32[T, 16]) -> C: f32[T, 4, 4]
    const T = 4
    launch workgroup 64, subgroup >= 16 else shared
    tile (src: 4, dst: 4) lane dst + 4 * src, per t
    c = m[t, dst + 4 * src]
    repeat 2:
        # inside a repeat block
        c = c / sum(dst: c)
    # after it
    C[t, src, dst] = c
"""


def test_comment_only_lines_inside_a_region_body() -> None:
    assert parse(COMMENTED, "a.fuse") == parse(PLAIN, "a.fuse")
    check(parse(COMMENTED, "a.fuse"))
    check(parse(TILE, "a.fuse"))


def test_comment_lines_in_crlf_source() -> None:
    crlf = COMMENTED.replace("\n", "\r\n")
    assert parse(crlf, "a.fuse") == parse(PLAIN, "a.fuse")


@pytest.mark.parametrize(
    "sep", ["\u2028", "\u2029", "\x85", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\r"]
)
def test_quoted_line_is_the_line_named(sep: str) -> None:
    """Only a line feed ends a line: the line a diagnostic names and the line it quotes agree
    whatever other line breaks Python knows a comment holds."""
    text = (
        f"region r(x: f32[N]) -> y: f32[N] # a{sep}b\n"
        "    const N = 4\n"
        "    launch workgroup 64\n"
        "    y[i] = x[j]\n"
    )
    with pytest.raises(DiagnosticError) as exc:
        check(parse(text, "a.fuse"))
    assert exc.value.render().split("\n")[:3] == [
        "a.fuse:4:14: error: unknown name 'j'",
        "        y[i] = x[j]",
        "                 ^",
    ]


@pytest.mark.parametrize(
    ("old", "new", "keyword", "after"),
    [
        ("region r(", "regionr(", "region", "r"),
        ("(x: f32[N])", "(x: statef32[N])", "state", "f32"),
        ("y[i] = t[i]", "y[i] = t[i] inshared", "in", "shared"),
        ("y[i] = t[i]", "y[i] = t[i] layouti -> lane", "layout", "i"),
        ("y[i] = t[i]", "y[i] = sum(k: x[k]) layout i -> lane x4", "x", "4"),
    ],
)
def test_keyword_run_into_the_next_word(old: str, new: str, keyword: str, after: str) -> None:
    """Where the parser accepts a keyword but no name, the lexer once took the keyword's
    letters from the front of a longer word (`regionr(` read as `region r(`)."""
    text = PLAIN.replace(old, new)
    with pytest.raises(DiagnosticError) as exc:
        parse(text, "a.fuse")
    [d] = exc.value.diagnostics
    assert d.message == f"keyword '{keyword}' must be followed by a space, not by '{after}'"
    assert d.span is not None
    assert text[d.span.start : d.span.end] == keyword + after


def test_accepts_names_that_start_with_a_keyword() -> None:
    text = PLAIN.replace("t[i]", "constant[i]").replace("y[i] = ", "y[i] = 0.0 + ")
    text = text.replace("    launch", "    regions = 1.0\n    launch")
    check(parse(text, "a.fuse"))


def test_a_range_reads_the_same_without_spaces_around_its_dots() -> None:
    """`1..100` is `1 .. 100` (the lexer read `1.` as a real and then `.100`, and the hint
    said "expected '..'" beside the two dots; found by a new-user probe).  A real that ends in
    its point (`2.`) still reads as one."""
    import random

    for _ in range(50):
        lo = random.randint(0, 1000)
        hi = lo + random.randint(1, 1000)
        spaced = random.choice(["..", " ..", ".. ", " .. "])
        text = (
            f"region r(x: f32[N] in -{lo}.5{spaced}{hi}.) -> y: f32[N]\n"
            f"    const N = {hi} in {lo + 1}{spaced}{hi + 1}, e = 2.\n"
            "    launch workgroup 64\n"
            "    y[i] = x[i] * e\n"
        )
        (r,) = parse(text, "r.fuse").regions
        n, e = r.consts
        assert (n.range[0].value, n.range[1].value) == (lo + 1, hi + 1)  # type: ignore[index]
        assert e.value.value == 2.0 and isinstance(e.value.value, float)
        values = r.params[0].values
        assert values is not None
        assert (values[0].value, values[1].value) == (-lo - 0.5, float(hi))
