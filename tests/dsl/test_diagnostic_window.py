"""A diagnostic shows at most `SHOWN` characters of its source line, around the column, with the
caret under the same character as in the source (dsl/diagnostics.py).  A new-user probe wrote a
20 KB expression on one line and got a 20 KB source line and caret line back."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fusec.dsl.diagnostics import SHOWN, Diagnostic
from fusec.dsl.span import Source, Span


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet="abcxyz()[]+*0123456789 ", min_size=1, max_size=3000),
    data=st.data(),
)
def test_the_caret_points_where_the_span_starts(text: str, data: st.DataObject) -> None:
    start = data.draw(st.integers(0, len(text) - 1))
    length = data.draw(st.integers(1, len(text) - start))
    source = Source("f.fuse", "# first line\n" + text + "\nlast\n")
    offset = len("# first line\n")
    rendered = Diagnostic(Span(source, offset + start, offset + start + length), "m").render()
    head, shown, caret = rendered.split("\n")[:3]
    assert head == f"f.fuse:2:{start + 1}: error: m"
    shown, caret = shown.removeprefix("    "), caret.removeprefix("    ")
    at = caret.index("^")
    assert shown[at] == text[start]  # the same character, wherever the window lies
    assert len(shown) <= SHOWN + 2 and len(caret) <= len(shown)
    if len(text) <= SHOWN:
        assert shown == text  # short lines are shown whole
    # the tildes cover the span as far as it is shown, never past the line
    assert set(caret[at + 1 :]) <= {"~"}
    assert len(caret) - at == min(length, len(shown) - at - shown.endswith("…"))
