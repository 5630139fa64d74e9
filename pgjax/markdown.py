"""Markdown tables: the one writer every report, benchmark and study uses, so every table pgjax prints has
the same shape (a header row, a separator row whose colons say each column's alignment, one row per
record) and a cell can never break its table.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

SEPARATORS = {"l": "---", "r": "---:", "c": ":---:"}


def cell(value: object) -> str:
    """``value`` as one cell: its ``str`` on one line (line breaks become spaces) with ``|`` escaped, ``None``
    as ``-``."""
    if value is None:
        return "-"
    return " ".join(str(value).splitlines()).replace("|", "\\|")


def row(cells: Iterable[object]) -> str:
    """One table row: ``| a | b |``."""
    return "| " + " | ".join(cell(value) for value in cells) + " |"


def table(header: Sequence[object], rows: Iterable[Sequence[object]], align: str | None = None) -> str:
    """A markdown table of ``header`` and ``rows`` (each as long as the header; ``None`` cells are ``-``).

    ``align``: one letter per column, ``l`` (left), ``r`` (right) or ``c`` (centre); by default the first
    column is left-aligned (a name) and the others right-aligned (numbers)."""
    align = align if align is not None else "l" + "r" * (len(header) - 1)
    if len(align) != len(header) or set(align) - set(SEPARATORS):
        raise ValueError(f"align needs one of l, r, c per column ({len(header)}), got {align!r}")
    lines = [row(header), "| " + " | ".join(SEPARATORS[a] for a in align) + " |"]
    for number, cells in enumerate(rows):
        if len(cells) != len(header):
            raise ValueError(f"row {number} has {len(cells)} cells for {len(header)} columns: {list(cells)}")
        lines.append(row(cells))
    return "\n".join(lines)
