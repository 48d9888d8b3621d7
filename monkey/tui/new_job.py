"""The new-job form: command, provider and resources, submitted through `Monkey.run`."""

from __future__ import annotations

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Select, Static

from monkey.api import MonkeyError
from monkey.models import whole_number
from monkey.tui.shared import SharedMonkey


class NewJobScreen(ModalScreen[str | None]):
    """Dismisses with the new job's id, or None when cancelled; errors keep it open."""

    AUTO_FOCUS = "#command"  # focused as it mounts: the keys typed after `n` go there
    BINDINGS = [
        Binding("escape", "cancel", "Cancel"),
        Binding("ctrl+s", "submit", "Submit"),
    ]

    class Result(Message):
        """What `Monkey.run` answered: a job id or an error."""

        def __init__(self, juid: str | None, error: str | None) -> None:
            super().__init__()
            self.juid = juid
            self.error = error

    def __init__(self, shared: SharedMonkey) -> None:
        super().__init__()
        self.shared = shared
        self.providers: list[str] = []
        self.workdir = ""

    def start(self, providers: list[str], workdir: str) -> None:
        """Open afresh (the screen is kept between uses): empty command, these providers."""
        self.providers, self.workdir = providers, workdir
        if self.is_mounted:
            self._reset()

    def _reset(self) -> None:
        select = self.query_one("#provider", Select)
        select.set_options([(p, p) for p in self.providers])
        select.value = self.providers[0]
        for ident, value in (
            ("command", ""),
            ("name", ""),
            ("cpus", "1"),
            ("gpus", "0"),
            ("retries", "0"),
            ("memory", ""),
            ("workdir", self.workdir),
        ):
            self.query_one(f"#{ident}", Input).value = value
        self.query_one("#submit", Button).disabled = False
        self._error("")
        self.set_focus(self.query_one("#command", Input))  # now, not after queued keys

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="dialog"):
            yield Static("new job", id="form-title")
            yield Label("command")
            yield Input(placeholder="python train.py --lr 0.1", id="command")
            yield Label("name (default: the script's name)")
            yield Input(id="name")
            yield Label("provider")
            yield Select(
                [(p, p) for p in self.providers],
                value=self.providers[0],
                allow_blank=False,
                id="provider",
            )
            with Horizontal(classes="row"):
                for label, ident, value in (
                    ("cpus", "cpus", "1"),
                    ("gpus", "gpus", "0"),
                    ("retries", "retries", "0"),
                ):
                    with Vertical(classes="cell"):
                        yield Label(label)
                        yield Input(value, type="integer", id=ident)
                with Vertical(classes="cell"):
                    yield Label("memory")
                    yield Input(placeholder="8G", id="memory")
            yield Label("working directory (snapshotted now)")
            yield Input(self.workdir, id="workdir")
            yield Static("", id="form-error")
            with Horizontal(id="buttons"):
                yield Button("Submit (ctrl+s)", variant="primary", id="submit")
                yield Button("Cancel (esc)", id="cancel")

    def _value(self, ident: str) -> str:
        return self.query_one(f"#{ident}", Input).value.strip()

    def action_submit(self) -> None:
        command = self._value("command")
        if not command:
            self._error("give a command to run, e.g. python train.py")
            return
        numbers = {}
        for ident in ("cpus", "gpus", "retries"):
            text = self._value(ident)
            number = whole_number(text)
            if number is None:
                self._error(f"{ident} must be a whole number, e.g. 1")
                return
            numbers[ident] = number
        provider = self.query_one("#provider", Select).value
        self.query_one("#submit", Button).disabled = True
        self._error("submitting…")
        self._submit(
            command,
            dict(
                provider=str(provider),
                name=self._value("name") or None,
                memory=self._value("memory") or None,
                workdir=self._value("workdir") or None,
                **numbers,
            ),
        )

    @work(thread=True, exclusive=True, group="submit")
    def _submit(self, command: str, options: dict[str, object]) -> None:
        try:
            job = self.shared("run", command, **options)
        except (MonkeyError, ValueError, OSError) as exc:
            self.post_message(self.Result(None, str(exc)))
        else:
            self.post_message(self.Result(job.juid, None))

    @on(Result)
    def _on_result(self, message: Result) -> None:
        if message.juid:
            self.dismiss(message.juid)
        else:
            self.query_one("#submit", Button).disabled = False
            self._error(message.error or "the job was not submitted")

    def _error(self, text: str) -> None:
        box = self.query_one("#form-error", Static)
        box.update(text)
        if text:  # on a short terminal the message sits below the fold
            box.scroll_visible(animate=False)

    @on(Input.Submitted)
    def _on_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.action_submit()

    @on(Button.Pressed)
    def _on_button(self, event: Button.Pressed) -> None:
        if event.button.id == "submit":
            self.action_submit()
        else:
            self.action_cancel()

    def action_cancel(self) -> None:
        self.dismiss(None)
