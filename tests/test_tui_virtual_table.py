"""monkey's VirtualTable on its own: only the rows on screen are drawn, the cursor stays in
view, a change off screen repaints nothing, clicks and keys post the table's messages."""

from __future__ import annotations

import asyncio

import pytest
from rich.text import Text
from textual.app import App, ComposeResult

from monkey.tui.virtual_table import VirtualTable

pytestmark = pytest.mark.system  # drives a Textual app in a headless terminal

ROWS = 10_000


class Counting(VirtualTable):
    """Counts the rows it draws."""

    drawn: list[str]

    def _row_strip(self, cells, base):
        self.drawn.append(str(cells[0]))
        return super()._row_strip(cells, base)


class Host(App[None]):
    def __init__(self) -> None:
        super().__init__()
        self.table = Counting(id="t")
        self.table.drawn = []
        self.messages: list[tuple[str, str]] = []

    def compose(self) -> ComposeResult:
        yield self.table

    def on_mount(self) -> None:
        table = self.table
        table.set_columns({"id": "ID", "state": "STATE"})
        table.update_rows(
            {f"r{i}": (f"r{i}", Text("ok", style="green")) for i in range(ROWS)},
            {f"r{i}": (len(f"r{i}"), 2) for i in range(ROWS)},
        )
        table.set_order([f"r{i}" for i in range(ROWS)])
        table.focus()

    def on_virtual_table_selected(self, event: VirtualTable.Selected) -> None:
        self.messages.append(("selected", event.key))

    def on_virtual_table_header_clicked(self, event: VirtualTable.HeaderClicked) -> None:
        self.messages.append(("header", event.column))


def run(body) -> None:
    async def main() -> None:
        app = Host()
        async with app.run_test(size=(40, 12)) as pilot:
            await pilot.pause()
            await body(app, pilot)

    asyncio.run(main())


def lines(app: Host) -> list[str]:
    """The screen's text, line by line."""
    table = app.table
    return [table.render_line(y).text.rstrip() for y in range(table.size.height)]


def test_only_rows_on_screen_are_drawn_and_the_cursor_stays_in_view():
    async def body(app: Host, pilot) -> None:
        table = app.table
        assert table.row_count == ROWS
        assert lines(app)[:3] == [" ID     STATE", " r0     ok", " r1     ok"]
        assert set(table.drawn) <= {f"r{i}" for i in range(11)} | {"ID"}  # 11 rows + header
        await pilot.press("end")
        assert table.cursor_key == f"r{ROWS - 1}"
        assert lines(app)[-1] == f" r{ROWS - 1}  ok"  # scrolled to it
        await pilot.press("home", "down", "down", "pagedown")
        assert table.cursor_key == "r12" and lines(app)[-1] == " r12    ok"
        assert len(table.drawn) < 100  # never the 10,000 rows

    run(body)


def test_changes_repaint_their_own_row_and_widen_columns():
    async def body(app: Host, pilot) -> None:
        table = app.table
        table.drawn.clear()
        table.update_rows({"r5000": ("r5000", Text("failed"))})  # off screen: nothing drawn
        await pilot.pause()
        assert table.drawn == []
        table.update_rows({"r3": ("r3", Text("failed"))}, {"r3": (2, 6)})  # wider: redrawn
        await pilot.pause()
        assert lines(app)[4] == " r3     failed" and table.cell("r3", "state").plain == "failed"
        table.set_order(["r3", "r1"])  # a new order keeps the cursor on its row when shown
        assert table.cursor_key == "r3" and table.row_count == 2

    run(body)


def test_enter_and_clicks_post_messages():
    async def body(app: Host, pilot) -> None:
        await pilot.press("down", "enter")
        await pilot.click("#t", offset=(9, 0))  # the STATE header
        await pilot.click("#t", offset=(2, 4))  # row r3: the cursor moves there
        await pilot.click("#t", offset=(2, 4))  # a second click selects it
        await pilot.pause()
        assert app.messages == [("selected", "r1"), ("header", "state"), ("selected", "r3")]

    run(body)
