"""A table of one-line rows drawn on demand through Textual's public Line API.

Only the rows on screen are rendered (``render_line``), each row's strip is cached until
its cells or the column widths change, and changing one row repaints one line. Setting
10,000 rows costs a list copy, not a layout pass. Built on `ScrollView`, `Strip` and
component classes only — no private Textual API — so textual can be upgraded freely.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

Cell = Text | str
PAD = 1  # spaces either side of a cell


class VirtualTable(ScrollView, can_focus=True):
    """Rows keyed by strings, in an order the owner sets; a row cursor; a fixed header.

    Each cell is a `str` or a one-style `Text` (its spans are not drawn). Column widths
    only grow, from the widths the owner measures (`update_rows`), so a row never has
    to be measured on the UI thread. When the rows are wider than the table, the columns
    named in ``narrowest`` give up width, in that order, down to their narrowest (their cells
    cut with `…`), until the last column has ``last_fits`` cells in view (0: all of it).
    """

    COMPONENT_CLASSES = {"virtual-table--header", "virtual-table--cursor"}
    DEFAULT_CSS = """
    VirtualTable {
        background: $surface;
        color: $foreground;
    }
    VirtualTable > .virtual-table--header {
        text-style: bold;
        background: $panel;
        color: $foreground;
    }
    VirtualTable > .virtual-table--cursor {
        background: $block-cursor-blurred-background;
    }
    VirtualTable:focus > .virtual-table--cursor {
        background: $block-cursor-background;
        color: $block-cursor-foreground;
        text-style: bold;
    }
    """
    BINDINGS = [
        Binding("up", "cursor(-1)", "Up", show=False),
        Binding("down", "cursor(1)", "Down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("home", "edge(0)", "First row", show=False),
        Binding("end", "edge(1)", "Last row", show=False),
        Binding("enter", "select", "Open", show=False),
    ]

    cursor_row: reactive[int] = reactive(0, always_update=False, repaint=False)

    class Highlighted(Message):
        """The cursor moved onto the row ``key``."""

        def __init__(self, table: VirtualTable, key: str) -> None:
            super().__init__()
            self.table = table
            self.key = key

        @property
        def control(self) -> VirtualTable:
            return self.table

    class Selected(Highlighted):
        """Enter (or a second click) on the row ``key``."""

    class HeaderClicked(Message):
        """A click on the header of ``column``."""

        def __init__(self, table: VirtualTable, column: str) -> None:
            super().__init__()
            self.table = table
            self.column = column

        @property
        def control(self) -> VirtualTable:
            return self.table

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.columns: dict[str, str] = {}
        self.widths: list[int] = []  # what each column's widest cell takes
        self.shown_widths: list[int] = []  # as drawn: fitted to the table (see ``narrowest``)
        self.narrowest: dict[str, int] = {}  # column -> its narrowest width, in giving order
        self.hidden: set[str] = set()  # columns not drawn (``show_column``)
        self.last_fits = 0  # the width of the last column that ``narrowest`` makes room for
        self._drawn: list[int] = []  # the indexes of the columns drawn
        self.order: list[str] = []
        self._index: dict[str, int] = {}
        self._cells: dict[str, tuple[Cell, ...]] = {}
        self._strips: dict[str, Strip] = {}
        self._styles: dict[str, Style] = {}

    # -- content ------------------------------------------------------------------------

    def set_columns(self, columns: Mapping[str, str]) -> None:
        """Column key -> header label, in display order."""
        self.columns = dict(columns)
        self.widths = [len(label) for label in self.columns.values()]
        self._strips.clear()
        self._resize()

    def update_rows(
        self, cells: Mapping[str, Sequence[Cell]], widths: Mapping[str, Sequence[int]] | None = None
    ) -> None:
        """Set the cells of rows (shown or not) and widen columns to ``widths``."""
        grew = False
        if widths:
            for row_widths in widths.values():
                for i, w in enumerate(row_widths):
                    if w > self.widths[i]:
                        self.widths[i] = w
                        grew = True
        for key, row in cells.items():
            self._cells[key] = tuple(row)
            self._strips.pop(key, None)
        if grew:
            self._strips.clear()
            self._resize()
            self.refresh()
            return
        top = self.scroll_offset.y
        for key in cells:
            y = self._index.get(key)
            if y is not None and top <= y < top + self.size.height:
                self.refresh_line(y + 1)

    def set_order(self, keys: list[str]) -> None:
        """Show these rows (whose cells are known) in this order; the cursor stays on its row."""
        keep = self.cursor_key
        self.order = keys
        self._index = {key: i for i, key in enumerate(keys)}
        self._resize()
        row = self._index.get(keep, min(self.cursor_row, max(0, len(keys) - 1))) if keep else 0
        self.set_reactive(VirtualTable.cursor_row, row)
        self._scroll_to_cursor()
        self.refresh()

    def forget(self, keys: list[str]) -> None:
        """Drop rows' cells (call `set_order` without them)."""
        for key in keys:
            self._cells.pop(key, None)
            self._strips.pop(key, None)

    @property
    def row_count(self) -> int:
        return len(self.order)

    @property
    def cursor_key(self) -> str | None:
        """The key of the row under the cursor, or None when the table is empty."""
        if not self.order:
            return None
        return self.order[min(self.cursor_row, len(self.order) - 1)]

    def cell(self, key: str, column: str) -> Cell:
        """The cell of row ``key`` in ``column``."""
        return self._cells[key][list(self.columns).index(column)]

    def move_cursor(self, key: str) -> None:
        """Put the cursor on row ``key`` (when shown)."""
        if key in self._index:
            self.cursor_row = self._index[key]

    # -- drawing ------------------------------------------------------------------------

    def show_column(self, column: str, shown: bool = True) -> None:
        """Draw COLUMN, or leave it out (its cells are kept)."""
        if (column not in self.hidden) != shown:
            (self.hidden.discard if shown else self.hidden.add)(column)
            self._strips.clear()
            self._resize()
            self.refresh()

    def _resize(self) -> None:
        self._fit()
        width = sum(self.shown_widths[i] + 2 * PAD for i in self._drawn)
        self.virtual_size = Size(width, len(self.order) + 1)

    def _fit(self) -> None:
        """The widths to draw: the columns' own, the ``narrowest`` columns narrowed as far as
        the table's width needs (and allows)."""
        keys = list(self.columns)
        drawn = [i for i, k in enumerate(keys) if k not in self.hidden]
        widths = list(self.widths)
        excess = sum(widths[i] + 2 * PAD for i in drawn) - self.size.width
        if drawn and self.last_fits:  # the last column may run off the edge past that
            excess -= max(0, widths[drawn[-1]] - self.last_fits)
        for column, least in self.narrowest.items():
            if excess <= 0 or column not in keys:
                break
            i = keys.index(column)
            give = min(excess, max(0, widths[i] - least))
            widths[i] -= give
            excess -= give
        if widths != self.shown_widths or drawn != self._drawn:
            self.shown_widths, self._drawn = widths, drawn
            self._strips.clear()
            self.refresh()

    def on_resize(self) -> None:
        self._resize()

    def _style(self, spec: str | Style) -> Style:
        if isinstance(spec, Style):
            return spec
        style = self._styles.get(spec)
        if style is None:
            style = self._styles[spec] = Style.parse(spec) if spec else Style()
        return style

    def _row_strip(self, cells: Sequence[Cell], base: Style) -> Strip:
        segments = []
        widths = self.shown_widths
        for i in self._drawn:
            cell, width = cells[i], widths[i]
            if isinstance(cell, Text):
                text, style = cell.plain, base + self._style(cell.style)
            else:
                text, style = cell, base
            if len(text) > width:
                text = text[: width - 1] + "…" if width > 1 else text[:width]
            segments.append(Segment(" " * PAD + text.ljust(width) + " " * PAD, style))
        return Strip(segments, sum(widths[i] + 2 * PAD for i in self._drawn))

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        width = self.size.width
        base = self.rich_style
        if y == 0:
            style = base + self.get_component_rich_style("virtual-table--header")
            header = self._row_strip(list(self.columns.values()), style)
            return header.crop_extend(scroll_x, scroll_x + width, style)
        row = scroll_y + y - 1
        if row >= len(self.order):
            return Strip.blank(width, base)
        key = self.order[row]
        if row == self.cursor_row:  # plain text in the cursor's colours: readable on it
            style = base + self.get_component_rich_style("virtual-table--cursor")
            plain = [c.plain if isinstance(c, Text) else c for c in self._cells[key]]
            return self._row_strip(plain, style).crop_extend(scroll_x, scroll_x + width, style)
        strip = self._strips.get(key)
        if strip is None:
            strip = self._strips[key] = self._row_strip(self._cells[key], base)
        return strip.crop_extend(scroll_x, scroll_x + width, base)

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._strips.clear()

    # -- cursor and keys ----------------------------------------------------------------

    def watch_cursor_row(self, old: int, new: int) -> None:
        for row in (old, new):
            self.refresh_line(row + 1)
        self._scroll_to_cursor()
        key = self.cursor_key
        if key is not None:
            self.post_message(self.Highlighted(self, key))

    def validate_cursor_row(self, row: int) -> int:
        return max(0, min(row, len(self.order) - 1))

    def _scroll_to_cursor(self) -> None:
        rows = max(1, self.size.height - 1)
        top = self.scroll_offset.y
        row = self.cursor_row
        if row < top:
            self.scroll_to(y=row, animate=False, immediate=True)
        elif row >= top + rows:
            self.scroll_to(y=row - rows + 1, animate=False, immediate=True)

    def action_cursor(self, delta: int) -> None:
        self.cursor_row += delta

    def action_page(self, direction: int) -> None:
        self.cursor_row += direction * max(1, self.size.height - 2)

    def action_edge(self, end: int) -> None:
        self.cursor_row = len(self.order) - 1 if end else 0

    def action_select(self) -> None:
        key = self.cursor_key
        if key is not None:
            self.post_message(self.Selected(self, key))

    def on_click(self, event: events.Click) -> None:
        x, y = event.x + self.scroll_offset.x, event.y
        if y == 0:
            edge = 0
            keys = list(self.columns)
            for i in self._drawn:
                column, width = keys[i], self.shown_widths[i]
                edge += width + 2 * PAD
                if x < edge:
                    self.post_message(self.HeaderClicked(self, column))
                    break
            return
        row = self.scroll_offset.y + y - 1
        if row < len(self.order):
            if row == self.cursor_row:
                self.action_select()
            self.cursor_row = row
