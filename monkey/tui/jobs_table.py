"""The live jobs table: rows diffed by `updated_at`, filtered, sorted, marked for bulk actions."""

from __future__ import annotations

from collections import Counter

from rich.text import Text
from textual.binding import Binding
from textual.message import Message

from monkey.api import LIVE, JobRecord
from monkey.tui.format import (
    COLUMNS,
    MARK,
    METRIC,
    NO_MARK,
    SORTABLE,
    JobFilter,
    duration,
    juid_order,
    problem_rank,
    runtime,
    sort_jobs,
    sort_key,
)
from monkey.tui.virtual_table import VirtualTable

Values = dict[str, float | None]


class JobsTable(VirtualTable):
    """Every job matching the filter; only rows whose record changed are redrawn, and only
    when on screen."""

    BINDINGS = [
        Binding("space", "mark", "Mark"),
        Binding("w", "mark_sweep", "Mark sweep"),
        Binding("s", "next_sort", "Sort"),
        Binding("S", "reverse_sort", "Reverse sort", show=False),
        Binding("exclamation_mark", "problems", "Problems first"),
        Binding("g", "group", "Group sweeps", show=False),
        # The dashboard's keys that open a modal, handled before the next key is passed on
        # (priority), so keys typed right after `n` land in the form, not in this table.
        *(
            Binding(key, f"app.{action}", description, priority=True)
            for key, action, description in (
                ("question_mark", "help", "Keys"),
                ("c", "control('cancel')", "Cancel"),
                ("p", "control('pause')", "Pause"),
                ("u", "control('resume')", "Resume"),
                ("r", "control('retry')", "Retry"),
                ("n", "new_job", "New job"),
            )
        ),
    ]

    class Changed(Message):
        """The shown rows, marks, filter or order changed (for the status line)."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.records: dict[str, JobRecord] = {}
        self.cells: dict[str, dict[str, Text | str]] = {}  # of every job, shown or not
        self.values: dict[str, Values] = {}  # last metric values, for sorting by a metric
        self.marked: set[str] = set()
        self.filter = JobFilter()
        self.sort_column = "job"
        self.sort_reverse = True
        self.group_sweeps = False
        self.problems_first = False
        self.now = 0.0
        self.live: set[str] = set()
        self.shown: set[str] = set()
        self.counts: Counter[str] = Counter()  # jobs by state, for the status line
        self.problems = 0  # jobs the problems view puts first

    def on_mount(self) -> None:
        # Too wide for the terminal: LAST METRICS gives way first (its first series stay
        # readable), then NAME and SWEEP, so that COMMAND's differing args stay in view.
        self.narrowest = {"metrics": 28, "name": 16, "sweep": 12}
        self.last_fits = 32  # COMMAND: a sweep's differing args (its shared words elided)
        self.hidden = {"owner"}  # drawn once jobs have owners besides the viewer
        self.set_columns(COLUMNS)

    # -- data ---------------------------------------------------------------------------

    def load(
        self,
        jobs: list[JobRecord],
        cells: dict[str, dict[str, Text | str]],
        widths: dict[str, tuple[int, ...]],
        now: float,
        values: dict[str, Values] | None = None,
    ) -> None:
        """Apply changed job records with their cells and cell widths (made off the UI
        thread by `row_cells`): all jobs at first, then those changed since the last load."""
        self.now = now
        self.values.update(values or {})
        moved = not self.records
        by = sort_key(self.sort_column, now)
        for job in jobs:
            juid = job.juid
            old = self.records.get(juid)
            self.records[juid] = job
            (self.live.add if job.state in LIVE else self.live.discard)(juid)
            row = cells[juid]
            row["mark"] = MARK if juid in self.marked else NO_MARK
            self.cells[juid] = row
            if self.filter.matches(job) != (juid in self.shown):
                moved = True
            elif (
                old is None
                or by(old) != by(job)
                or old.sweep != job.sweep
                or (self.problems_first and problem_rank(old, now) != problem_rank(job, now))
            ):
                moved = True
        if jobs:  # idle polls skip this pass over every job
            records = self.records.values()
            self.counts = Counter(r.state.value for r in records)
            self.problems = sum(problem_rank(r, now) is not None for r in records)
        self.update_rows({j: tuple(cells[j].values()) for j in cells}, widths)
        self._tick_runtimes(now)
        if moved or (values and self.sort_column.startswith(METRIC)):
            self._resort()
        self.post_message(self.Changed())

    def show_metrics(self, metrics: dict[str, Text], values: dict[str, Values]) -> None:
        """New last-metric values of running jobs."""
        self.values.update(values)
        changed = {}
        for juid, text in metrics.items():
            if juid in self.cells:
                self.cells[juid]["metrics"] = text
                changed[juid] = tuple(self.cells[juid].values())
        if changed:
            self.update_rows(changed)
            if self.sort_column.startswith(METRIC):
                self._resort()

    def _set_cell(self, juid: str, column: str, value: Text | str) -> None:
        self.cells[juid][column] = value
        self.update_rows({juid: tuple(self.cells[juid].values())})

    def _tick_runtimes(self, now: float) -> None:
        """Running jobs' runtimes move every second without a change of their record."""
        for juid in self.live & self.shown:
            text = duration(runtime(self.records[juid], now))
            if self.cells[juid]["runtime"] != text:
                self._set_cell(juid, "runtime", text)

    def _resort(self) -> None:
        juids = [j for j, job in self.records.items() if self.filter.matches(job)]
        self.shown = set(juids)
        self.set_order(
            sort_jobs(
                juids,
                self.records,
                self.sort_column,
                self.sort_reverse,
                self.now,
                self.values,
                group=self.group_sweeps,
                problems=self.problems_first,
            )
        )

    def _rebuild(self) -> None:
        self._resort()
        self.post_message(self.Changed())

    # -- what the user sees and picks ----------------------------------------------------

    def current_juid(self) -> str | None:
        return self.cursor_key

    def targets(self) -> list[str]:
        """The jobs an action applies to: the marked ones, else the one under the cursor."""
        if self.marked:
            return sorted(self.marked, key=juid_order)
        current = self.current_juid()
        return [current] if current else []

    def set_filter(self, job_filter: JobFilter) -> None:
        self.filter = job_filter
        self._rebuild()

    def metric_names(self) -> list[str]:
        """Names of the (non-system) metrics some job has a last value of."""
        return sorted({n for v in self.values.values() for n in v if not n.startswith("sys/")})

    def sort_label(self) -> str:
        """The order as the status line says it: ``STATE ↑``, ``loss ↓``."""
        column = self.sort_column
        name = column[len(METRIC) :] if column.startswith(METRIC) else COLUMNS[column]
        return f"{name} {'↓' if self.sort_reverse else '↑'}" + (
            " · problems first" if self.problems_first else ""
        )

    def sort_by(self, column: str, reverse: bool | None = None) -> None:
        """Sort by a column key or ``metric:NAME`` (the metrics column: its first metric)."""
        if column == "metrics":
            names = self.metric_names()
            if not names:
                self.notify("no job has logged a metric yet", severity="warning")
                return
            column = METRIC + names[0]
        if column not in SORTABLE and not column.startswith(METRIC):
            return
        if reverse is None:
            reverse = not self.sort_reverse if column == self.sort_column else column == "job"
        self.sort_column, self.sort_reverse = column, reverse
        self._rebuild()

    def _set_mark(self, juid: str, on: bool) -> None:
        (self.marked.add if on else self.marked.discard)(juid)
        self._set_cell(juid, "mark", MARK if on else NO_MARK)

    def action_mark(self) -> None:
        juid = self.current_juid()
        if juid:
            self._set_mark(juid, juid not in self.marked)
            self.cursor_row += 1
            self.post_message(self.Changed())

    def action_mark_sweep(self) -> None:
        """Mark every job of the sweep under the cursor (unmark it when all are marked)."""
        juid = self.current_juid()
        if not juid:
            return
        sweep = self.records[juid].sweep
        if sweep is None:
            self.notify(f"job {juid} is not part of a sweep", severity="warning")
            return
        members = [j for j, r in self.records.items() if r.sweep == sweep]
        on = not all(j in self.marked for j in members)
        for member in members:
            self._set_mark(member, on)
        self.post_message(self.Changed())

    def clear_marks(self) -> None:
        for juid in list(self.marked):
            self._set_mark(juid, False)
        self.post_message(self.Changed())

    def action_next_sort(self) -> None:
        """Next column, then each metric in turn: STATE → ... → RUNTIME → acc → loss → SWEEP."""
        cycle = [c for c in SORTABLE if c != "metrics"]
        at = cycle.index("runtime") + 1
        cycle[at:at] = [METRIC + n for n in self.metric_names()]
        now = self.sort_column
        column = cycle[(cycle.index(now) + 1) % len(cycle)] if now in cycle else cycle[0]
        self.sort_by(column, reverse=column in ("job", "runtime", "tries"))

    def action_reverse_sort(self) -> None:
        self.sort_by(self.sort_column, reverse=not self.sort_reverse)

    def action_group(self) -> None:
        self.group_sweeps = not self.group_sweeps
        self._rebuild()

    def action_problems(self) -> None:
        """Toggle the problems view: lost, failed, stuck and preempted jobs on top."""
        self.problems_first = not self.problems_first
        self._rebuild()
        if self.problems_first:
            self.cursor_row = 0

    def on_virtual_table_header_clicked(self, event: VirtualTable.HeaderClicked) -> None:
        event.stop()
        self.sort_by(event.column)
