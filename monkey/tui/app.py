"""`monkey dash`: the full-screen dashboard of jobs, logs, metrics and instances.

Every read and every change goes through `monkey.api.Monkey`, in thread workers that post
messages; widgets change only in the message handlers, so the UI never waits on SQLite.
"""

from __future__ import annotations

import asyncio
import gc
import os
import sqlite3
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from rich.text import Text
from textual import on, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.message import Message
from textual.screen import ModalScreen, Screen
from textual.widgets import DataTable, Input, Static, TabbedContent, TabPane

from monkey import version
from monkey.api import LIVE, Home, JobRecord, MonkeyError, State
from monkey.tui import crash
from monkey.tui.confirm import ConfirmScreen
from monkey.tui.footer import KeyFooter
from monkey.tui.format import (
    JobFilter,
    cell_widths,
    legal,
    metrics_text,
    row_cells,
    shared_head,
)
from monkey.tui.help_screen import HelpScreen
from monkey.tui.instances_pane import InstancesPane
from monkey.tui.job_screen import JobScreen
from monkey.tui.jobs_table import JobsTable
from monkey.tui.log_pane import LogPane
from monkey.tui.metrics_pane import MetricsPane
from monkey.tui.new_job import NewJobScreen
from monkey.tui.shared import SharedMonkey
from monkey.tui.status_bar import StatusBar
from monkey.tui.sweep_view import SweepScreen
from monkey.tui.virtual_table import VirtualTable

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

POLL = 1.0  # seconds between looks at the store: the table is at most this late
OVERLAP = 5.0  # re-read jobs changed this long before the newest change seen (late commits)
RESYNC = 30.0  # seconds between full re-reads, a safety net under the incremental ones
REMOTE_RESYNC = 300.0  # the same through a remote (10,000 jobs: seconds of work both ends)
FIRST = 200  # newest jobs read and shown first at start, before all the others
PAINTED = 2.0  # seconds a key that opens a modal waits at most for its first frame

# What each control action does to a job, for the confirmation and the notes.
CONTROLS = {
    "cancel": ("Cancel", "stops it for good (SIGTERM, then SIGKILL)", True),
    "pause": ("Pause", "stops it gracefully and holds it until resumed", True),
    "resume": ("Resume", "re-queues it; it continues from its checkpoint", False),
    "retry": ("Retry", "runs it again as a new attempt", False),
}


class DataLoaded(Message):
    """What one poll of the store found."""

    def __init__(
        self,
        jobs: list[JobRecord],
        cells: dict[str, dict[str, Text | str]],
        widths: dict[str, tuple[int, ...]],
        metrics: dict[str, Text],
        values: dict[str, dict[str, float | None]],
        now: float,
        core_pid: int | None,
        live: list[dict[str, Any]],
        instances: list[dict[str, Any]],
        providers: dict[str, tuple[str, dict[str, Any]]],
        problem: str | None,
        created: list[dict[str, Any]],
        partial: bool = False,
        refused: dict[str, str] | None = None,
        owners_shown: bool = False,
    ) -> None:
        super().__init__()
        self.partial = partial  # more of this poll follows (the first screen at start)
        self.refused = refused or {}  # newly read: jobs the viewer may not steer, and why
        self.owners_shown = owners_shown  # whether the OWNER column is worth drawing
        self.created = created  # the cloud instances monkey created, with their cost
        self.jobs = jobs
        self.cells = cells
        self.widths = widths
        self.metrics = metrics
        self.values = values  # last metric values of the jobs in ``cells`` or ``metrics``
        self.now = now
        self.core_pid = core_pid
        self.live = live
        self.instances = instances
        self.providers = providers
        self.problem = problem


class PollFailed(Message):
    """A look at the store failed (a broken providers.yml, an unreadable database...)."""

    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error


class ControlDone(Message):
    """Outcome of a control action over one or more jobs."""

    def __init__(self, action: str, done: list[str], errors: list[str]) -> None:
        super().__init__()
        self.action = action
        self.done = done
        self.errors = errors


class CoreStarted(Message):
    def __init__(self, pid: int | None, error: str | None) -> None:
        super().__init__()
        self.pid = pid
        self.error = error


class DashApp(App[None]):
    """The dashboard of HOME (this machine's) or of a facade (a main node's ``RemoteMonkey``).
    ``job`` opens it on one job; ``clock`` is injectable for snapshots."""

    CSS_PATH = Path(__file__).with_name("dash.tcss")
    TITLE = "monkey"
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("question_mark", "help", "Keys"),
        Binding("slash", "filter", "Filter"),
        Binding("enter", "open", "Open"),
        Binding("c", "control('cancel')", "Cancel"),
        Binding("p", "control('pause')", "Pause"),
        Binding("u", "control('resume')", "Resume"),
        Binding("r", "control('retry')", "Retry"),
        Binding("n", "new_job", "New job"),
        Binding("i", "instances", "Instances"),
        Binding("a", "sweep", "Sweep analysis", show=False),
        Binding("D", "start_core", "Start core", show=False),
        Binding("escape", "clear", "Clear filter/marks", show=False),
    ]

    def __init__(
        self,
        home: str | os.PathLike[str] | Home | Any | None = None,
        *,
        job: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__()
        self.shared = SharedMonkey(home)
        self.open_job = job
        self.clock = clock
        self.core_pid: int | None = None
        self.providers: dict[str, tuple[str, dict[str, Any]]] | None = None
        self._offered: frozenset[str] = frozenset(CONTROLS)
        self._instances_shown: object = None
        self._polling = False
        self._frozen = False  # the heap frozen once every job was loaded
        self._problem: str | None = None
        self._since: float | None = None
        self._since_at = 0.0  # when the newest change was first seen
        self._seen: dict[str, JobRecord] = {}
        self._sent_metrics: dict[str, Text] = {}
        self._sweeps: dict[str, set[str]] = {}  # sweep -> its jobs seen
        self._heads: dict[str, int] = {}  # sweep -> the command words its runs share
        self._owners: dict[str, str | None] = {}  # juid -> who submitted it (poll worker's)
        self._others = False  # some job is not the viewer's: the OWNER column is drawn
        self._me: str | None = None  # the viewer, on this machine
        self.refused: dict[str, str] = {}  # juid -> why the viewer may not steer it
        self._note = ""  # the line that says why, as shown
        self._last_full = 0.0
        version.code_digest()  # the code this dashboard runs, to notice a reinstall against
        self.crash: str | None = None  # the one line of an unexpected error (see crash.py)
        self.restart: str | None = None  # how monkey changed on disk: `monkey dash` restarts
        self.reopen: str | None = None  # the job whose screen was open then
        self.table = JobsTable(id="jobs-table")
        self.status = StatusBar(id="status")
        self.instances = InstancesPane(id="instances-pane")
        self.note = Static("", id="steer-note")  # why the current job's actions are disabled

    def compose(self) -> ComposeResult:
        yield self.status
        with TabbedContent(id="main-tabs"):
            with TabPane("Jobs", id="jobs"):
                yield self.table
            with TabPane("Instances", id="instances"):
                yield self.instances
        yield self.note
        yield Input(
            placeholder="filter: words, state:running,failed provider:P sweep:S "
            "(Enter applies, Esc closes)",
            id="filter",
            classes="hidden",
        )
        yield KeyFooter()

    def on_mount(self) -> None:
        self.table.focus()
        self.set_interval(POLL, self.poll)
        self.poll()
        if self.open_job:
            self.push_screen(JobScreen(self.shared, self.open_job, self.clock))

    def _handle_exception(self, error: Exception) -> None:
        """An exception nothing expected ends the dashboard with one line (``crash``) and
        exit status 1, its traceback in the crash log instead of on the screen."""
        self.crash = crash.record(error)
        self._return_code = 1
        if self._exception is None:  # Textual's pilot raises it in the test that drove it
            self._exception = error
            self._exception_event.set()
        self._close_messages_no_wait()

    def on_unmount(self) -> None:
        self.workers.cancel_all()
        if self._frozen:
            gc.unfreeze()

    # -- reading the store --------------------------------------------------------------

    def poll(self) -> None:
        """Look at the store now (skipped while the previous look is still running)."""
        if self._restart_if_reinstalled():
            return
        if not self._polling:
            self._polling = True
            self._poll()

    def _restart_if_reinstalled(self) -> bool:
        """Exit for `monkey dash` to start again on the new code when monkey was reinstalled
        since the dashboard opened, once no dialog or filter is open (meanwhile, a notice)."""
        noticed = self.restart is None
        if noticed:
            self.restart = version.reinstalled()
            if self.restart is None:
                return False
        if isinstance(self.screen, ModalScreen) or isinstance(self.focused, Input):
            if noticed:
                self.notify(
                    f"{self.restart}; the dashboard restarts once you are done here",
                    severity="warning",
                    timeout=30,
                )
            return False
        if isinstance(self.screen, JobScreen):
            self.reopen = self.screen.juid
        self.exit()
        return True

    @work(thread=True, group="poll")
    def _poll(self) -> None:
        try:
            if self._since is None:  # the first screen before reading thousands of jobs
                self._read_store(FIRST)
            self._read_store()
        except (MonkeyError, OSError, sqlite3.Error) as exc:
            self.post_message(PollFailed(str(exc)))

    def _read_store(self, first: int | None = None) -> None:
        """Post what changed in the store since the last look (runs in the poll worker);
        with ``first``, only the newest ``first`` jobs (a partial look)."""
        real_now = time.time()
        resync = REMOTE_RESYNC if self.shared.remote else RESYNC
        full = first is not None or self._since is None or real_now - self._last_full > resync
        if first is not None:
            jobs = self.shared("jobs", limit=first)
        elif full:
            jobs = self.shared("jobs")
            self._last_full = real_now
        else:  # late commits land within OVERLAP of the newest change; past that, only
            # newer changes: an idle table must not re-read the last burst every second
            late = real_now - self._since_at < 2 * OVERLAP
            assert self._since is not None  # else the poll is full
            jobs = self.shared("jobs_changed", self._since - (OVERLAP if late else 0.0))
        seen = self._seen
        changed = [j for j in jobs if seen.get(j.juid) != j]
        for job in changed:
            seen[job.juid] = job
        changed += self._sweeps_reshown(changed)
        new = [j.juid for j in changed if j.juid not in self._owners]
        if first is None:
            newest = max((j.updated_at for j in jobs), default=0.0)
            if self._since is None or newest > self._since:
                self._since_at = real_now
            self._since = max(self._since or 0.0, newest) or real_now
        problem, state, refused = None, None, {}
        if self.shared.remote:  # what a local poll reads one by one, in one round trip
            state = self.shared("dashboard_state", self.clock(), new or None)
            providers = {name: (kind, opts) for name, (kind, opts) in state["providers"].items()}
            problem = state["problem"]
            # who submitted the new jobs, and those the main node refuses this viewer
            owners, refused, me = state["owners"], state["refused"], state["me"]
            self._others = True  # a main node's jobs: whose each is matters
        else:
            owners = self.shared("job_owners", new) if new else {}
            me = self._me = self._me or self.shared("acting_user")
            try:
                providers = {
                    name: (cfg.type, dict(cfg.options))
                    for name, cfg in self.shared.get("providers").items()
                }
            except MonkeyError as exc:  # the jobs are still worth showing
                providers, problem = {}, str(exc)
        for juid in new:
            owner = self._owners[juid] = owners.get(juid)
            self._others = self._others or owner not in (None, me)
        now = self.clock()
        # Metrics change without a change of the job's record while it runs, and its last
        # batch may land just after it ended: read them for live and recently changed jobs.
        watch = {j for j, job in seen.items() if job.state in LIVE}
        watch.update(j.juid for j in (changed if full else jobs))
        last = self.shared("latest_metrics", sorted(watch))
        heads = self._heads
        cells = {
            job.juid: row_cells(
                job,
                now,
                last.get(job.juid),
                heads.get(job.sweep or "", 0),
                self._owners.get(job.juid),
            )
            for job in changed
        }
        sent = self._sent_metrics
        metrics = {}
        for juid in watch:
            text = cells[juid]["metrics"] if juid in cells else metrics_text(last.get(juid))
            assert isinstance(text, Text)  # row_cells' metrics cell is a metrics_text too
            if sent.get(juid) != text:
                sent[juid] = text
                if juid not in cells:
                    metrics[juid] = text
        values = {juid: last[juid] for juid in (*cells, *metrics) if juid in last}
        widths = {juid: cell_widths(row) for juid, row in cells.items()}
        if state is None:
            state = {
                "core": self.shared("core_status"),
                "live": self.shared("live_attempts"),
                "instances": self.shared("instances"),
                "created": self.shared("monkey_instances", now) if providers else [],
            }
        self.post_message(
            DataLoaded(
                changed,
                cells,
                widths,
                metrics,
                values,
                now,
                state["core"],
                state["live"],
                state["instances"],
                providers,
                problem,
                state["created"],
                partial=first is not None,
                refused=refused,
                owners_shown=self._others,
            )
        )

    def _sweeps_reshown(self, changed: list[JobRecord]) -> list[JobRecord]:
        """The jobs, besides CHANGED, whose command cell changes because the words their
        sweep's runs share changed (a run came): the table shows what tells runs apart."""
        seen, touched = self._seen, set()
        for job in changed:
            if job.sweep and job.juid not in self._sweeps.setdefault(job.sweep, set()):
                self._sweeps[job.sweep].add(job.juid)
                touched.add(job.sweep)
        again: list[JobRecord] = []
        fresh = {job.juid for job in changed}
        for sweep in touched:
            members = self._sweeps[sweep]
            head = shared_head([seen[j].argv for j in sorted(members)])
            if head != self._heads.get(sweep, 0):
                self._heads[sweep] = head
                again += [seen[j] for j in members if j not in fresh]
        return again

    @on(PollFailed)
    def _on_poll_failed(self, message: PollFailed) -> None:
        self._polling = False
        self._report(message.error)

    def _report(self, problem: str | None) -> None:
        """Tell a problem reading the state once, not at every poll."""
        if problem and problem != self._problem:
            self.notify(problem, severity="error", timeout=15)
        self._problem = problem

    @on(DataLoaded)
    def _on_data(self, message: DataLoaded) -> None:
        self._polling = message.partial
        if not message.partial and not self._frozen:  # every job loaded: the heap's bulk,
            # kept for the session; the collector's full passes now skip it (they took up
            # to 100 ms with 2,000 jobs, each pause delaying a key's modal as much)
            self.call_after_refresh(gc.freeze)
            self._frozen = True
        self._report(message.problem)
        if self.core_pid and not message.core_pid:
            self.notify(
                f"the core of main node {self.shared.remote} stopped; its server restarts it"
                if self.shared.remote
                else "the core stopped; press D to start it",
                severity="warning",
            )
        self.core_pid = message.core_pid
        self.providers = message.providers
        self.refused.update(message.refused)
        self.table.show_column("owner", message.owners_shown)
        self.table.load(message.jobs, message.cells, message.widths, message.now, message.values)
        self.table.show_metrics(message.metrics, message.values)
        shown = (message.providers, message.instances, message.live, message.created)
        if shown != self._instances_shown:  # idle: nothing to redraw
            self._instances_shown = shown
            self.instances.show(
                message.providers, message.instances, message.live, message.now, message.created
            )
        self._show_status()

    @on(JobsTable.Changed)
    def _on_table_changed(self) -> None:
        self._show_status()

    @on(VirtualTable.Highlighted, "#jobs-table")
    def _on_cursor(self) -> None:
        self._offer_legal_actions()

    def _show_status(self) -> None:
        table = self.table
        self.status.show(
            core_pid=self.core_pid,
            counts=table.counts,
            shown=table.row_count,
            marked=len(table.marked),
            filter_text=self.query_one("#filter", Input).value if table.filter else "",
            sort=table.sort_label(),
            grouped=table.group_sweeps,
            problems=table.problems,
            remote=self.shared.remote,
        )
        self._offer_legal_actions()

    def _legal_actions(self) -> frozenset[str]:
        """Control actions that apply to at least one of the targets the viewer may steer
        (a main node's refusals: ``refused``)."""
        if isinstance(self.screen, JobScreen):  # its state is read there; the API judges
            return frozenset() if self.screen.juid in self.refused else frozenset(CONTROLS)
        records = [
            self.table.records[j]
            for j in self.table.targets()
            if j in self.table.records and j not in self.refused
        ]
        return frozenset(a for a in CONTROLS if any(legal(a, r) for r in records))

    def _offer_legal_actions(self) -> None:
        """Re-draw the footer's keys when the set of legal actions changed, and say in one
        line why they are disabled when the targets are others' jobs."""
        offered = self._legal_actions()
        if offered != self._offered:
            self._offered = offered
            self.refresh_bindings()
        if isinstance(self.screen, JobScreen):
            return
        theirs = [j for j in self.table.targets() if j in self.refused]
        text = (
            ""
            if not theirs
            else self.refused[theirs[0]]
            if len(theirs) == 1
            else f"{len(theirs)} of the marked jobs are others'; only their owner or an admin "
            "may cancel, pause, resume or retry them"
        )
        if self._note != text:
            self._note = text
            self.note.update(Text(text))
            self.note.display = bool(text)

    # -- opening, filtering -------------------------------------------------------------

    @on(VirtualTable.Selected, "#jobs-table")
    def _on_row(self) -> None:
        self.action_open()

    def action_open(self) -> None:
        juid = self.table.current_juid()
        if juid:
            self.push_screen(
                JobScreen(
                    self.shared,
                    juid,
                    self.clock,
                    overlay=self.table.targets() if self.table.marked else None,
                )
            )

    def action_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.remove_class("hidden")
        box.focus()

    @on(Input.Submitted, "#filter")
    def _on_filter(self, event: Input.Submitted) -> None:
        try:
            job_filter = JobFilter.parse(event.value)
        except MonkeyError as exc:
            self.notify(str(exc), severity="error")
            return
        self.table.set_filter(job_filter)
        if not job_filter:
            event.input.add_class("hidden")
        self.table.focus()

    def action_clear(self) -> None:
        box = self.query_one("#filter", Input)
        if box.has_focus:
            box.add_class("hidden")
            self.table.focus()
        elif self.table.marked:
            self.table.clear_marks()
        elif self.table.filter:
            box.value = ""
            box.add_class("hidden")
            self.table.set_filter(JobFilter())

    def action_instances(self) -> None:
        tabs = self.query_one("#main-tabs", TabbedContent)
        tabs.active = "jobs" if tabs.active == "instances" else "instances"
        (self.table if tabs.active == "jobs" else self.instances.query_one(DataTable)).focus()

    async def action_help(self) -> None:
        sections = [
            ("everywhere", self.BINDINGS),
            ("jobs table", JobsTable.BINDINGS),
            ("job screen", JobScreen.BINDINGS),
            ("log pane", LogPane.BINDINGS),
            ("metrics pane", MetricsPane.BINDINGS),
            ("sweep analysis", SweepScreen.BINDINGS),
            ("new job form", NewJobScreen.BINDINGS),
        ]
        await self.show_modal(
            self.modal(
                "help",
                lambda: HelpScreen(
                    [
                        (t, [b for b in bs if isinstance(b, Binding) and not b.priority])
                        for t, bs in sections
                    ]
                ),
            )
        )

    def modal(self, name: str, make: Callable[[], Screen[Any]]) -> Screen[Any]:
        """The modal ``name``, made once and kept (installed): composing a form costs a few
        hundred ms on a loaded machine, showing a composed one a frame."""
        if not self.is_screen_installed(name):
            self.install_screen(make(), name)
        return self.get_screen(name)

    async def show_modal(
        self, screen: Screen[Any], callback: Callable[[Any], None] | None = None
    ) -> None:
        """Push ``screen`` and return once it is mounted and painted: the keys bound to this
        (priority bindings of the jobs table) hold the keys typed after them until then, so
        those land in the modal instead of the screen under it."""
        await self.push_screen(screen, callback)
        try:
            await asyncio.wait_for(screen.wait_for_refresh(), PAINTED)
        except asyncio.TimeoutError:  # a suspended or stopping app: let the keys through
            pass

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if isinstance(self.screen, SweepScreen) and action not in ("quit", "help"):
            return False  # the jobs table's keys do not reach behind the sweep view
        if isinstance(self.screen, JobScreen) and action in (
            "filter",
            "instances",
            "open",
            "clear",
        ):
            return False
        if action == "control" and parameters:
            if isinstance(self.screen, JobScreen):  # shown disabled: another user's job
                return None if self.screen.juid in self.refused else True
            if parameters[0] not in self._offered:
                return None  # shown disabled: no pause on a failed job, nothing of others'
        return True

    # -- changing jobs ------------------------------------------------------------------

    def targets(self) -> list[str]:
        if isinstance(self.screen, JobScreen):
            return [self.screen.juid]
        return self.table.targets()

    async def action_control(self, action: str) -> None:
        juids = self.targets()
        if not juids:
            self.notify("no job selected", severity="warning")
            return
        theirs = [j for j in juids if j in self.refused]
        juids = [j for j in juids if j not in self.refused]
        if theirs and not juids:  # from the command palette: the keys are disabled
            self.notify(self.refused[theirs[0]], severity="warning")
            return
        if not isinstance(self.screen, JobScreen):
            records = self.table.records
            juids = [j for j in juids if j not in records or legal(action, records[j])]
            if not juids:
                self.notify(f"{action} does not apply to the selected job(s)", severity="warning")
                return
        label, effect, destructive = CONTROLS[action]
        if not destructive and len(juids) == 1:
            self._control(action, juids)
            return
        which = (
            juids[0]
            if len(juids) == 1
            else f"{len(juids)} jobs ({', '.join(juids[:3])}"
            + (", ...)" if len(juids) > 3 else ")")
        )
        question = f"{label} {which}? This {effect}."

        def answered(yes: bool | None) -> None:
            if yes:
                self._control(action, juids)

        confirm = self.modal("confirm", ConfirmScreen)
        confirm.ask(question)  # type: ignore[attr-defined]
        await self.show_modal(confirm, answered)

    @work(thread=True, group="control")
    def _control(self, action: str, juids: list[str]) -> None:
        done, errors = [], []
        for juid in juids:
            try:
                state: State = self.shared(action, juid)
            except MonkeyError as exc:
                errors.append(str(exc))
                continue
            final = {"cancel": State.CANCELLED, "pause": State.PAUSED}.get(action)
            # As the CLI says it: a running job stops once its agent has stopped it.
            done.append(
                f"{juid} {state.value}"
                if final in (None, state)
                else f"{juid} requested (job is {state.value})"
            )
        self.post_message(ControlDone(action, done, errors))

    @on(ControlDone)
    def _on_control(self, message: ControlDone) -> None:
        if message.done:
            shown = ", ".join(message.done[:4]) + (" ..." if len(message.done) > 4 else "")
            self.notify(f"{message.action}: {shown}")
            if not message.errors:
                self.table.clear_marks()
        for error in message.errors[:3]:
            self.notify(error, severity="error")
        if len(message.errors) > 3:
            self.notify(f"{len(message.errors) - 3} more jobs refused", severity="error")
        self.poll()

    def action_sweep(self) -> None:
        """The analysis of the current job's sweep."""
        juid = self.screen.juid if isinstance(self.screen, JobScreen) else self.table.current_juid()
        record = self.table.records.get(juid) if juid else None
        if record is None or not record.sweep:
            self.notify(
                f"job {juid} is not part of a sweep" if juid else "no job selected",
                severity="warning",
            )
            return
        self.push_screen(SweepScreen(self.shared, record.sweep))

    async def action_new_job(self) -> None:
        # The providers the last poll read: reading them here would wait for the store's
        # lock behind a slow poll, with the (not yet shown) form taking the keys.
        if self.providers is None:
            try:
                self.providers = {n: (c.type, {}) for n, c in self.shared.get("providers").items()}
            except MonkeyError as exc:
                self.notify(str(exc), severity="error")
                return
        if not self.providers:
            self.notify(self._problem or "no provider is configured", severity="error")
            return
        providers = sorted(self.providers)

        def submitted(juid: str | None) -> None:
            if juid:
                self.notify(f"job {juid} queued")
                self.poll()

        form = self.modal("new-job", lambda: NewJobScreen(self.shared))
        form.start(providers, str(Path.cwd()))  # type: ignore[attr-defined]
        await self.show_modal(form, submitted)

    def action_start_core(self) -> None:
        if self.core_pid:
            self.notify(f"the core is already running (pid {self.core_pid})")
            return
        self.notify("starting the core…")
        self._start_core()

    @work(thread=True, exclusive=True, group="core")
    def _start_core(self) -> None:
        try:
            self.post_message(CoreStarted(self.shared("start_core"), None))
        except MonkeyError as exc:
            self.post_message(CoreStarted(None, str(exc)))

    @on(CoreStarted)
    def _on_core(self, message: CoreStarted) -> None:
        if message.error:
            self.notify(message.error, severity="error")
        else:
            self.notify(f"core running (pid {message.pid})")
            self.poll()

    # -- command palette ----------------------------------------------------------------

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for action, (label, effect, _) in CONTROLS.items():
            if action not in self._offered:
                continue
            yield SystemCommand(
                f"{label} job(s)",
                f"the marked jobs or the current one: {effect}",
                lambda a=action: self.action_control(a),
            )
        yield SystemCommand(
            "New job", "submit a command with a provider and resources", self.action_new_job
        )
        yield SystemCommand(
            "Start core", "start the core in the background when it is down", self.action_start_core
        )
        if not isinstance(screen, JobScreen):
            yield SystemCommand(
                "Filter jobs", "by words, state:, provider:, sweep:", self.action_filter
            )
            yield SystemCommand(
                "Mark sweep",
                "mark every job of the current job's sweep",
                self.table.action_mark_sweep,
            )
            yield SystemCommand(
                "Sweep analysis",
                "the current job's sweep: ranked runs, parameter importance, scatters, best so far",
                self.action_sweep,
            )
            yield SystemCommand(
                "Group by sweep", "toggle grouping the table by sweep", self.table.action_group
            )
            yield SystemCommand(
                "Instances", "providers, instances and live attempts", self.action_instances
            )
