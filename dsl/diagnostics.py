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
        text = self.span.source.line_text(line)
        line_end = len(text) - (col - 1)
        width = max(1, min(self.span.end - self.span.start, line_end))
        caret = " " * (col - 1) + "^" + "~" * (width - 1)
        out = f"{self.span}: error: {self.message}\n    {text}\n    {caret}"
        if self.hint:
            out += f"\n  hint: {self.hint}"
        if self.note:
            out += f"\n  note: {self.note}"
        for use in self.span.via:  # the stage group uses this text was expanded through
            text = " ".join(use.source.line_text(use.line_col()[0]).split())
            out += f"\n  note: {use}: in the stage group used here: {text}"
        return out


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
