"""Pure helpers of the dashboard: how a job reads in a row, filters, sort keys, sparklines."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from rich.cells import cell_len
from rich.text import Text

from monkey.api import TERMINAL, JobRecord, MonkeyError, State

STATE_STYLES = {
    "queued": "yellow",
    "dispatching": "cyan",
    "running": "bold cyan",
    "succeeded": "green",
    "failed": "bold red",
    "cancelled": "magenta",
    "paused": "#5f87ff",
    "preempted": "#ff8700",
    "lost": "red",
}

# Column key -> header; the order is the table's.
COLUMNS = {
    "mark": " ",
    "job": "JOB",
    "name": "NAME",
    "state": "STATE",
    "where": "WHERE",
    "tries": "TRIES",
    "runtime": "RUNTIME",
    "metrics": "LAST METRICS",
    "sweep": "SWEEP",
    "command": "COMMAND",
}
SORTABLE = ("job", "name", "state", "where", "tries", "runtime", "sweep", "command")
_SPARKS = "▁▂▃▄▅▆▇█"


MARK = Text("●")
NO_MARK = Text(" ")
NO_METRICS = Text("")


def duration(seconds: float | None) -> str:
    """A short human duration: 42s, 3m05s, 2h10m, 3d04h."""
    if seconds is None:
        return "-"
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


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


def row_cells(job: JobRecord, now: float, metrics: dict[str, float | None] | None = None
              ) -> dict[str, object]:
    """The table cells of one job, by column key. Cells that cannot hold markup (the job
    id, which keys the sort, tries, runtime) are strings; the rest are rich Texts, so that
    names and commands are never read as markup."""
    command = job.command if len(job.command) <= 60 else job.command[:57] + "..."
    return {
        "mark": NO_MARK,
        "job": job.juid,
        "name": Text(job.name),
        "state": Text(job.state.value + ("*" if job.request else ""),
                      style=STATE_STYLES.get(job.state.value, "")),
        "where": Text(where(job)),
        "tries": str(job.attempts),
        "runtime": duration(runtime(job, now)),
        "metrics": metrics_text(metrics),
        "sweep": Text(job.sweep or ""),
        "command": Text(command),
    }


def cell_widths(cells: dict[str, object]) -> tuple[int, ...]:
    """Terminal cells each table cell takes (all are one line)."""
    out = []
    for cell in cells.values():
        text = cell.plain if isinstance(cell, Text) else str(cell)
        out.append(len(text) if text.isascii() else cell_len(text))
    return tuple(out)


def juid_order(juid: str) -> tuple[str, int]:
    """Chronological order of job ids (the per-day counter may pass 999)."""
    day, _, n = juid.rpartition("-")
    return day, int(n) if n.isdigit() else 0


def sort_key(column: str, now: float):
    """A key function over job records for sorting the table by ``column``."""
    keys = {
        "job": lambda j: juid_order(j.juid),
        "name": lambda j: (j.name.lower(), juid_order(j.juid)),
        "state": lambda j: (j.state.value, juid_order(j.juid)),
        "where": lambda j: (where(j), juid_order(j.juid)),
        "tries": lambda j: (j.attempts, juid_order(j.juid)),
        "runtime": lambda j: (runtime(j, now) or 0.0, juid_order(j.juid)),
        "sweep": lambda j: (j.sweep or "", juid_order(j.juid)),
        "command": lambda j: (j.command, juid_order(j.juid)),
    }
    return keys[column]


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
            hay = " ".join((job.juid, job.name, job.command, job.provider, job.instance or "",
                            job.sweep or "", job.state.value)).lower()  # fmt: skip
            return all(w in hay for w in self.words)
        return True
