"""Pure helpers of the dashboard: how a job reads in a row, filters, sort keys, sparklines."""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass, field

from rich.cells import cell_len
from rich.text import Text

from monkey.api import LIVE, TERMINAL, JobRecord, MonkeyError, State
from monkey.models import run_time as duration
from monkey.models import whole_number

# State colours: each has WCAG AA contrast (>= 4.5:1) against the default dark theme's
# table and status-bar backgrounds (tests/test_tui.py checks them).
STATE_STYLES = {
    "queued": "#e0c060",
    "dispatching": "#5fd7d7",
    "running": "bold #5fd7ff",
    "succeeded": "#7ccf7c",
    "failed": "bold #ff7a7a",
    "cancelled": "#d79be0",
    "paused": "#8fb0ff",
    "preempted": "#ffaa55",
    "lost": "#ff8f8f",
    "unreachable": "bold #ffaa55",  # running, its instance out of reach
    "waiting": "italic #e0c060",  # queued, waiting for other jobs (`run --after`)
    "over quota": "italic #e0c060",  # queued, held back by a quota
}
# Lifecycle order of the states, for sorting by STATE and the status line's counts.
LIFECYCLE = (
    "queued",
    "dispatching",
    "running",
    "paused",
    "preempted",
    "lost",
    "failed",
    "cancelled",
    "succeeded",
)
_STAGE = {state: i for i, state in enumerate(LIFECYCLE)}
STUCK = 300.0  # seconds in dispatching, or with a request not carried out, that look stuck

# Column key -> header; the order is the table's.
COLUMNS = {
    "mark": " ",
    "job": "JOB",
    "name": "NAME",
    "owner": "OWNER",  # drawn when the jobs have owners besides the viewer (a main node)
    "state": "STATE",
    "where": "WHERE",
    "tries": "TRIES",
    "runtime": "RUNTIME",
    "metrics": "LAST METRICS",
    "sweep": "SWEEP",
    "command": "COMMAND",
}
SORTABLE = ("job", "name", "state", "where", "tries", "runtime", "metrics", "sweep", "command")
METRIC = "metric:"  # sort column prefix: by the last value of one metric series
_SPARKS = "▁▂▃▄▅▆▇█"


MARK = Text("●")
NO_MARK = Text(" ")
NO_METRICS = Text("")


def when(ts: float | None) -> str:
    """Local date and time of an epoch timestamp, or `-`."""
    return "-" if ts is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def size(n: float | None) -> str:
    """Bytes as 512B, 3.1M, 2.0G."""
    if n is None:
        return "-"
    for unit in ("B", "K", "M", "G", "T"):
        if abs(n) < 1024 or unit == "T":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    raise AssertionError("unreachable")


def sparkline(values: list[float], width: int = 20) -> str:
    """The last ``width`` values as block characters scaled to their own maximum."""
    values = values[-width:]
    if not values:
        return ""
    top = max(values) or 1.0
    return "".join(_SPARKS[min(7, int(max(0.0, v) / top * 7.999))] for v in values)


def runtime(job: JobRecord, now: float) -> float | None:
    """Seconds the job has run so far (to its end once it stopped)."""
    if not job.started_at:
        return None
    ended = job.state in TERMINAL or job.state == State.PAUSED
    end = (job.finished_at or now) if ended else now
    return end - job.started_at


def where(job: JobRecord) -> str:
    """Provider, and the instance when it has one of its own name."""
    return place(job.provider, job.instance)


def place(provider: str, instance: str | None) -> str:
    """``provider/instance``; an ssh instance id (``lab/gpu1``) names its provider already."""
    if not instance or instance == provider:
        return provider
    return instance if instance.startswith(f"{provider}/") else f"{provider}/{instance}"


def metrics_text(values: dict[str, float | None] | None, most: int = 3) -> Text:
    """The last values of a job's first few series (system series left out)."""
    if not values:
        return NO_METRICS
    shown = sorted((k, v) for k, v in values.items() if not k.startswith("sys/"))[:most]
    return Text("  ".join(f"{k} {'nan' if v is None else f'{v:.4g}'}" for k, v in shown))


def shared_head(argvs: list[list[str]]) -> int:
    """How many leading words every one of ARGVS (a sweep's runs) shares, less the flag of
    the first value that differs (``--l2`` of ``--l2 0`` and ``--l2 0.01``); 0 for one."""
    if len(argvs) < 2:
        return 0
    first, shortest = argvs[0], min(len(a) for a in argvs)
    head = 0
    while head < shortest and all(a[head] == first[head] for a in argvs):
        head += 1
    if head and first[head - 1].startswith("-") and any(len(a) > head for a in argvs):
        head -= 1
    return head


def command_text(argv: list[str], head: int = 0) -> str:
    """The command as the table shows it: past the HEAD words its sweep's runs share (an
    ellipsis in their place, so what tells runs apart comes first), at most 60 cells."""
    command = shlex.join(argv) if not 0 < head < len(argv) else "… " + shlex.join(argv[head:])
    return command if len(command) <= 60 else command[:57] + "..."


def row_cells(
    job: JobRecord,
    now: float,
    metrics: dict[str, float | None] | None = None,
    head: int = 0,
    owner: str | None = None,
) -> dict[str, Text | str]:
    """The table cells of one job, by column key. Cells that cannot hold markup (the job
    id, which keys the sort, tries, runtime) are strings; the rest are rich Texts, so that
    names and commands are never read as markup. HEAD: the leading words of the command
    that its sweep's runs share (``shared_head``), left out; OWNER: who submitted it."""
    command = command_text(job.argv, head)
    return {
        "mark": NO_MARK,
        "job": job.juid,
        "name": Text(job.name),
        "owner": Text(owner or ""),
        "state": Text(
            job.shown_state
            + ("*" if job.request else "")
            + (  # a queued job's priority, when not 0 (`run --priority`)
                f" ({job.priority:+d})"
                if job.priority and job.state in (State.QUEUED, State.PAUSED)
                else ""
            ),
            style=STATE_STYLES.get(job.shown_state, ""),
        ),
        "where": Text(where(job)),
        "tries": str(job.attempts),
        "runtime": duration(runtime(job, now)),
        "metrics": metrics_text(metrics),
        "sweep": Text(job.sweep or ""),
        "command": Text(command),
    }


def cell_widths(cells: dict[str, Text | str]) -> tuple[int, ...]:
    """Terminal cells each table cell takes (all are one line)."""
    out = []
    for cell in cells.values():
        text = cell.plain if isinstance(cell, Text) else str(cell)
        out.append(len(text) if text.isascii() else cell_len(text))
    return tuple(out)


def juid_order(juid: str) -> tuple[str, int]:
    """Chronological order of job ids (the per-day counter may pass 999)."""
    day, _, n = juid.rpartition("-")
    return day, whole_number(n) or 0


def sort_key(column: str, now: float):
    """A key function over job records for sorting the table by ``column``."""
    keys = {
        "job": lambda j: juid_order(j.juid),
        "name": lambda j: (j.name.lower(), juid_order(j.juid)),
        "state": lambda j: (_STAGE.get(j.state.value, 99), juid_order(j.juid)),
        "where": lambda j: (where(j), juid_order(j.juid)),
        "tries": lambda j: (j.attempts, juid_order(j.juid)),
        "runtime": lambda j: (runtime(j, now) or 0.0, juid_order(j.juid)),
        "sweep": lambda j: (j.sweep or "", juid_order(j.juid)),
        "command": lambda j: (j.command, juid_order(j.juid)),
    }
    return keys.get(column, keys["job"])


def problem_rank(job: JobRecord, now: float) -> int | None:
    """How much a job needs looking at: 0 lost, 1 failed, 2 stuck, 3 preempted; None: fine."""
    state = job.state
    if state == State.LOST:
        return 0
    if state == State.FAILED:
        return 1
    if now - job.updated_at > STUCK and (state == State.DISPATCHING or job.request):
        return 2
    if state == State.PREEMPTED:
        return 3
    return None


def sort_jobs(
    juids: list[str],
    records: dict[str, JobRecord],
    column: str,
    reverse: bool,
    now: float,
    values: dict[str, dict[str, float | None]] | None = None,
    *,
    group: bool = False,
    problems: bool = False,
) -> list[str]:
    """Job ids in table order: by ``column`` (a column key or ``metric:NAME``, jobs without
    that metric last whichever the direction), grouped by sweep, problems first."""
    if column.startswith(METRIC):
        name = column[len(METRIC) :]
        values = values or {}
        has = [j for j in juids if _number(values.get(j, {}).get(name)) is not None]
        rest = sorted(set(juids).difference(has), key=lambda j: juid_order(j), reverse=True)
        order = sorted(has, key=lambda j: (values[j][name], juid_order(j)), reverse=reverse) + rest
    else:
        by = sort_key(column, now)
        order = sorted(juids, key=lambda j: by(records[j]), reverse=reverse)
    if group:  # stable: sweeps together (in name order, jobs of no sweep last)
        order.sort(key=lambda j: (records[j].sweep is None, records[j].sweep or ""))
    if problems:
        ranks = {j: 9 if (rank := problem_rank(records[j], now)) is None else rank for j in order}
        order.sort(key=lambda j: ranks[j])
    return order


def _number(value: float | None) -> float | None:
    return None if value is None or value != value else value


def legal(action: str, job: JobRecord) -> bool:
    """Whether a control action applies to a job in its state (as `Monkey` would accept)."""
    state = job.state
    if action == "cancel":
        return state in (State.QUEUED, State.PAUSED) or (state in LIVE and job.request != "cancel")
    if action == "pause":
        return state == State.QUEUED or (state in LIVE and job.request is None)
    if action == "resume":
        return state == State.PAUSED
    if action == "retry":
        return state in TERMINAL
    raise ValueError(action)


def contrast(fg: str, bg: str) -> float:
    """WCAG contrast ratio of two ``#rrggbb`` colours (1 to 21)."""

    def luminance(colour: str) -> float:
        channels = [int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5)]
        lin = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]

    a, b = sorted((luminance(fg), luminance(bg)), reverse=True)
    return (a + 0.05) / (b + 0.05)


@dataclass
class JobFilter:
    """What the `/` filter asks: ``state:running,failed provider:P sweep:S`` and free words."""

    states: frozenset[State] = frozenset()
    providers: frozenset[str] = frozenset()
    sweeps: frozenset[str] = frozenset()
    words: list[str] = field(default_factory=list)

    @classmethod
    def parse(cls, text: str) -> JobFilter:
        """Parse filter text; raise MonkeyError naming an unknown state or key."""
        states: set[State] = set()
        providers: set[str] = set()
        sweeps: set[str] = set()
        words = []
        for token in text.split():
            key, sep, value = token.partition(":")
            if not sep or key not in ("state", "provider", "sweep"):
                if sep and key.isalpha() and value:
                    raise MonkeyError(
                        f"unknown filter {key!r}; use state:, provider:, sweep: or plain words"
                    )
                words.append(token.lower())
                continue
            values = {v for v in value.split(",") if v}
            if key == "state":
                for v in values:
                    try:
                        states.add(State(v))
                    except ValueError:
                        allowed = ", ".join(s.value for s in State)
                        raise MonkeyError(f"unknown state {v!r}; use one of {allowed}") from None
            elif key == "provider":
                providers |= values
            else:
                sweeps |= values
        return cls(frozenset(states), frozenset(providers), frozenset(sweeps), words)

    def __bool__(self) -> bool:
        return bool(self.states or self.providers or self.sweeps or self.words)

    def matches(self, job: JobRecord) -> bool:
        if self.states and job.state not in self.states:
            return False
        if self.providers and job.provider not in self.providers:
            return False
        if self.sweeps and (job.sweep or "") not in self.sweeps:
            return False
        if self.words:
            hay = " ".join(
                (
                    job.juid,
                    job.name,
                    job.command,
                    job.provider,
                    job.instance or "",
                    job.sweep or "",
                    job.state.value,
                )
            ).lower()
            return all(w in hay for w in self.words)
        return True
