"""Fast terminal tables and colours (rich costs ~85 ms per listing; this costs ~1 ms)."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from monkey.models import whole_number
from monkey.shell.common import columns

TYPE_CHECKING = False
if TYPE_CHECKING:
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
    "unreachable": "1;33",  # running, its instance out of reach (not a state of its own)
    "waiting": "2;33",  # queued, waiting for other jobs (`run --after`)
    "over quota": "2;33",  # queued, held back by its owner's quota (`monkey server quota`)
    "waiting for disk": "2;33",  # queued, this machine's disk too full to start it
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


def printable(text: str) -> str:
    """TEXT with its control characters escaped (a newline as \\n), as table cells show them."""
    return text.translate(_ESCAPES)


def render(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    stream: TextIO | None = None,
    colours: Sequence[Sequence[str | None]] | None = None,
    flex: int | None = None,
    shrink: dict[int, int] | None = None,
    drop: Sequence[int] = (),
) -> int:
    """Print an aligned table that fits the terminal (see ``fit``): column ``flex`` is cut
    with an ellipsis first, then the ``shrink`` columns (index -> narrowest width) in turn,
    then the ``drop`` columns are left out in turn. Never wider than the terminal, never
    wrapped; piped output is cut only when $COLUMNS is set. Returns how many columns were
    left out."""
    out = stream or sys.stdout
    colour = use_colour(out)
    rows = [[cell.translate(_ESCAPES) for cell in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    total = terminal_width(out)
    shown = list(range(len(headers)))
    if total is not None and (flex is not None or shrink or drop):
        shown = fit(widths, total, flex, shrink or {}, drop, [len(h) for h in headers])
    cut = [h[: widths[i]] for i, h in enumerate(headers)]
    lines = ["  ".join(paint(cut[i].ljust(widths[i]), "1", colour) for i in shown).rstrip()]
    last = shown[-1]
    for r, row in enumerate(rows):
        cells = []
        for i in shown:
            cell, w = row[i], widths[i]
            if len(cell) > w:
                cell = cell[: max(0, w - 1)] + "…"
            text = cell if i == last else cell.ljust(w)
            code = colours[r][i] if colours else None
            cells.append(paint(text, code, colour))
        lines.append("  ".join(cells).rstrip())
    out.write("\n".join(lines) + "\n")
    return len(headers) - len(shown)


def terminal_width(out: TextIO) -> int | None:
    """Columns to fit in: $COLUMNS, else the terminal's; None for piped output."""
    given = whole_number(os.environ.get("COLUMNS", ""))
    if given is not None:
        return given
    return columns(out, 120) if out.isatty() else None


def fit(
    widths: list[int],
    total: int,
    flex: int | None,
    shrink: dict[int, int],
    drop: Sequence[int],
    headers: list[int],
) -> list[int]:
    """Narrow WIDTHS in place to fit TOTAL columns; the indexes of the columns kept."""
    shown = list(range(len(widths)))
    flex_min = max(4, min(headers[flex], widths[flex])) if flex is not None else 0
    steps = [("shrink", i) for i in shrink] + [("drop", i) for i in drop]
    while True:
        others = sum(widths[i] for i in shown if i != flex) + 2 * (len(shown) - 1)
        room = total - others
        if flex is not None and room >= flex_min:
            widths[flex] = min(widths[flex], room)
            return shown
        if flex is None and room >= 0:
            return shown
        if not steps:
            if flex is not None:
                widths[flex] = flex_min
            return shown
        how, i = steps.pop(0)
        if how == "shrink":
            widths[i] = min(widths[i], max(shrink[i], widths[i] - (flex_min - room)))
        elif len(shown) > 1:
            shown.remove(i)


def ago(seconds: float | None) -> str:
    """A compact age: 5s, 3m, 2h, 4d."""
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"
