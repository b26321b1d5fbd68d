"""Source locations: a file name plus Lark's 0-based offsets, shown as 1-based line:col."""

from __future__ import annotations

import attrs


@attrs.frozen
class Source:
    """One `.fuse` file's text, kept so diagnostics can quote a line."""

    path: str
    text: str

    def line_col(self, offset: int) -> tuple[int, int]:
        """1-based line and column of a character offset."""
        line = self.text.count("\n", 0, offset) + 1
        start = self.text.rfind("\n", 0, offset) + 1
        return line, offset - start + 1

    def line_text(self, line: int) -> str:
        """Line `line` as `line_col` counts lines: only a line feed ends one (str.splitlines
        would also split at a lone carriage return, a form feed, U+2028 ...)."""
        lines = self.text.split("\n")
        text = lines[line - 1] if 0 < line <= len(lines) else ""
        return text.removesuffix("\r")


@attrs.frozen
class Span:
    """A half-open character range [start, end) in one source."""

    source: Source = attrs.field(eq=False, repr=False)
    start: int
    end: int
    # text of a stage group (dsl/compose.py) expanded into a region: the uses it came through,
    # innermost first; a diagnostic here names them in notes
    via: tuple[Span, ...] = attrs.field(default=(), eq=False, repr=False, kw_only=True)

    @property
    def path(self) -> str:
        return self.source.path

    def line_col(self) -> tuple[int, int]:
        return self.source.line_col(self.start)

    def join(self, other: Span) -> Span:
        start, end = min(self.start, other.start), max(self.end, other.end)
        return Span(self.source, start, end, via=self.via or other.via)

    def __str__(self) -> str:
        line, col = self.line_col()
        return f"{self.path}:{line}:{col}"
