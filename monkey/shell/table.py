"""Fast terminal tables and colours (rich costs ~85 ms per listing; this costs ~1 ms)."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence
from typing import TextIO

STATE_COLOURS = {
    "queued": "33",
    "dispatching": "36",
    "running": "1;36",
    "succeeded": "32",
    "failed": "1;31",
    "cancelled": "2",
    "paused": "35",
    "preempted": "33",
    "lost": "31",
}


def use_colour(stream: TextIO) -> bool:
    """Colour only on a terminal, and never when NO_COLOR is set."""
    if "NO_COLOR" in os.environ:
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    return stream.isatty()


def paint(text: str, code: str | None, enabled: bool) -> str:
    return f"\x1b[{code}m{text}\x1b[0m" if enabled and code else text


def state_text(state: str, enabled: bool) -> str:
    return paint(state, STATE_COLOURS.get(state), enabled)


# Control characters shown escaped in a cell, so a multi-line command stays on its row.
_ESCAPES = {i: f"\\x{i:02x}" for i in (*range(32), 127)} | {9: "\\t", 10: "\\n", 13: "\\r"}


def render(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    stream: TextIO | None = None,
    colours: Sequence[Sequence[str | None]] | None = None,
    flex: int | None = None,
) -> None:
    """Print an aligned table; column ``flex`` is cut to fit the terminal's width."""
    out = stream or sys.stdout
    colour = use_colour(out)
    rows = [[cell.translate(_ESCAPES) for cell in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    if flex is not None and out.isatty():
        total = shutil.get_terminal_size((120, 24)).columns
        others = sum(w for i, w in enumerate(widths) if i != flex) + 2 * (len(widths) - 1)
        widths[flex] = max(len(headers[flex]), min(widths[flex], total - others))
    lines = ["  ".join(paint(h.ljust(w), "1", colour) for h, w in zip(headers, widths, strict=True)).rstrip()]
    last = len(headers) - 1
    for r, row in enumerate(rows):
        cells = []
        for i, (cell, w) in enumerate(zip(row, widths, strict=False)):
            if len(cell) > w:
                cell = cell[: max(0, w - 1)] + "…"
            text = cell if i == last else cell.ljust(w)
            code = colours[r][i] if colours else None
            cells.append(paint(text, code, colour))
        lines.append("  ".join(cells).rstrip())
    out.write("\n".join(lines) + "\n")


def ago(seconds: float | None) -> str:
    """A compact age: 5s, 3m, 2h, 4d."""
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def duration(seconds: float | None) -> str:
    """A run time: 0.4s, 12s, 3m05s, 2h10m."""
    if seconds is None:
        return "-"
    if seconds < 10:
        return f"{seconds:.1f}s"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"
