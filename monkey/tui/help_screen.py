"""`?`: every key of the dashboard, gathered from the bindings themselves."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static


class HelpScreen(ModalScreen[None]):
    """Lists the keys of each part of the dashboard; any of `?`, `q`, Esc closes it."""

    BINDINGS = [Binding("escape,q,question_mark", "close", "Close")]

    def __init__(self, sections: list[tuple[str, list[Binding]]]) -> None:
        super().__init__()
        self.sections = sections

    def compose(self) -> ComposeResult:
        from rich.table import Table

        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold")
        table.add_column()
        for title, bindings in self.sections:
            table.add_row(f"[u]{title}[/u]", "")
            for b in bindings:
                keys = ", ".join(_key_name(k) for k in b.key.split(","))
                table.add_row(keys, b.description or b.action)
            table.add_row("", "")
        table.add_row("ctrl+p", "command palette: every action by name")
        with VerticalScroll(id="dialog"):
            yield Static("keys", id="help-title")
            yield Static(table)

    def action_close(self) -> None:
        self.dismiss(None)


def _key_name(key: str) -> str:
    names = {
        "slash": "/",
        "question_mark": "?",
        "space": "space",
        "escape": "esc",
        "left_square_bracket": "[",
        "right_square_bracket": "]",
        "exclamation_mark": "!",
    }
    return names.get(key.strip(), key.strip())
