"""A yes/no question before a destructive action."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static


class ConfirmScreen(ModalScreen[bool]):
    """Asks ``question``; dismisses with True for `y`/Yes, False for `n`/Esc/No."""

    AUTO_FOCUS = "#no"

    BINDINGS = [
        Binding("y", "answer(True)", "Yes"),
        Binding("n,escape", "answer(False)", "No"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.question = ""
        self._text = Static("", id="question")

    def ask(self, question: str) -> None:
        """Show ``question`` (the screen is kept and asked again)."""
        self.question = question
        self._text.update(question)
        if self.is_mounted:
            self.set_focus(self.query_one("#no", Button))

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield self._text
            with Horizontal(id="buttons"):
                yield Button("Yes (y)", variant="error", id="yes")
                yield Button("No (n)", variant="primary", id="no")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
