"""One job full-screen: its detail, its live log and its metrics."""

from __future__ import annotations

from collections.abc import Callable

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Static, TabbedContent, TabPane

from monkey.api import MonkeyError
from monkey.tui.footer import KeyFooter
from monkey.tui.format import STATE_STYLES, place
from monkey.tui.job_detail import JobDetail
from monkey.tui.log_pane import LogPane
from monkey.tui.metrics_pane import MetricsPane
from monkey.tui.shared import SharedMonkey

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class JobScreen(Screen[None]):
    """Opened with Enter on a job (or `monkey web --juid JOB`); Esc goes back.

    ``overlay``: other jobs (the marked ones) whose metrics are drawn over this one's.
    """

    BINDINGS = [
        Binding("escape,backspace", "back", "Back"),
        Binding("d", "tab('detail')", "Detail"),
        Binding("l", "tab('log')", "Log"),
        Binding("m", "tab('metrics')", "Metrics"),
    ]

    class Info(Message):
        """`Monkey.info` of the job, read by the poll worker."""

        def __init__(self, info: dict[str, Any] | None, error: str | None) -> None:
            super().__init__()
            self.info = info
            self.error = error

    def __init__(
        self,
        shared: SharedMonkey,
        juid: str,
        clock: Callable[[], float],
        overlay: list[str] | None = None,
    ) -> None:
        super().__init__()
        self.shared = shared
        self.juid = juid
        self.overlay = [j for j in overlay or [] if j != juid]
        self.clock = clock

    def compose(self) -> ComposeResult:
        yield Static(f"job {self.juid}", id="job-title")
        with TabbedContent(initial="detail", id="job-tabs"):
            with TabPane("Detail", id="detail"):
                yield JobDetail(id="job-detail")
            with TabPane("Log", id="log"):
                yield LogPane(self.shared, self.juid, id="log-pane")
            with TabPane("Metrics", id="metrics"):
                yield MetricsPane(self.shared, [self.juid, *self.overlay], id="metrics-pane")
        yield Static("", id="steer-note")  # why its actions are disabled: another's job
        yield KeyFooter()

    def on_mount(self) -> None:
        self.set_interval(1.0, self._poll)
        self._poll()

    @work(thread=True, exclusive=True, group="job-poll")
    def _poll(self) -> None:
        try:
            self.post_message(self.Info(self.shared("info", self.juid), None))
        except MonkeyError as exc:
            self.post_message(self.Info(None, str(exc)))

    @on(Info)
    def _on_info(self, message: Info) -> None:
        title = self.query_one("#job-title", Static)
        if message.info is None:
            title.update(f"job {self.juid}: {message.error}")
            return
        info = message.info
        style = STATE_STYLES.get(info["state"], "")
        where = place(info["provider"], info["instance"])
        title.update(
            f"job [b]{info['job']}[/b] · {info['name']} · [{style}]{info['state']}[/] · {where}"
        )
        self.query_one(JobDetail).show(info, self.clock())
        why = getattr(self.app, "refused", {}).get(self.juid)  # the dashboard's, from its poll
        note = self.query_one("#steer-note", Static)
        if why and not note.display:
            note.update(Text(why))
            note.display = True

    def action_back(self) -> None:
        self.dismiss(None)

    def action_tab(self, tab: str) -> None:
        tabs = self.query_one(TabbedContent)
        if tabs.query(f"#{tab}"):
            tabs.active = tab
            if tab == "log":
                self.query_one(LogPane).view.focus()
            elif tab == "metrics":
                self.query_one("#series").focus()
