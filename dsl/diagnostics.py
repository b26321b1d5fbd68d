"""One diagnostic type for every stage: `FILE:LINE:COL: error: message`, line, caret, hint."""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from .span import Span


@attrs.frozen
class Diagnostic:
    """A user error. `span` is None only for errors with no source (environment, device)."""

    span: Span | None
    message: str
    hint: str | None = None
    # where the problem is beyond its line: `in instance gated_ffn<q4_0>` (dsl/instances.py)
    note: str | None = None

    def render(self) -> str:
        if self.span is None:
            out = f"fusec: error: {self.message}"
            return out + (f"\n  hint: {self.hint}" if self.hint else "")
        line, col = self.span.line_col()
        text, caret = _window(
            self.span.source.line_text(line), col, self.span.end - self.span.start
        )
        out = f"{self.span}: error: {self.message}\n    {text}\n    {caret}"
        if self.hint:
            out += f"\n  hint: {self.hint}"
        if self.note:
            out += f"\n  note: {self.note}"
        for use in self.span.via:  # the stage group uses this text was expanded through
            text = " ".join(use.source.line_text(use.line_col()[0]).split())
            if len(text) > SHOWN:
                text = text[: SHOWN - 1] + "…"
            out += f"\n  note: {use}: in the stage group used here: {text}"
        return out


SHOWN = 120  # the most characters of a source line a diagnostic shows
_BEFORE = 40  # of which, at most, before the column (a long line is shown around it)


def _window(text: str, col: int, length: int) -> tuple[str, str]:
    """The source line as shown, and the caret line under it: `^` at column `col` and `~` over
    the rest of the span's `length` characters on the line.  A line longer than SHOWN is shown
    around the column, cut with `…` at either end, the span clipped to what is shown."""
    start = 0
    if len(text) > SHOWN:
        start = max(0, min(col - 1 - _BEFORE, len(text) - SHOWN))
    end = min(len(text), start + SHOWN)
    head = "…" if start > 0 else ""
    shown = head + text[start:end] + ("…" if end < len(text) else "")
    at = len(head) + (col - 1 - start)
    width = max(1, min(length, end - (col - 1)))
    return shown, " " * at + "^" + "~" * (width - 1)


class DiagnosticError(Exception):
    """Raised by a stage with every diagnostic it collected; the CLI prints them and exits 1."""

    def __init__(self, diagnostics: Iterable[Diagnostic]) -> None:
        self.diagnostics = tuple(diagnostics)
        super().__init__("\n".join(d.render() for d in self.diagnostics))

    def render(self) -> str:
        return "\n".join(d.render() for d in self.diagnostics)


def error(span: Span | None, message: str, hint: str | None = None) -> DiagnosticError:
    """Shorthand for raising a single diagnostic."""
    return DiagnosticError([Diagnostic(span, message, hint)])
