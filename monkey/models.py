"""Domain types shared by every part of monkey: job states, jobs, attempts. No I/O here."""

from __future__ import annotations

import enum
import functools
import json
import re

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, AnyStr


class MonkeyError(Exception):
    """A user-facing error: its message is one line naming the problem and the fix."""


class Forbidden(MonkeyError):
    """A user asked for what only an admin or the owner of what it names may do (HTTP 403)."""


class State(str, enum.Enum):
    """Lifecycle state of a job."""

    QUEUED = "queued"
    DISPATCHING = "dispatching"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    PAUSED = "paused"
    PREEMPTED = "preempted"
    LOST = "lost"

    def __str__(self) -> str:
        return self.value


TERMINAL = frozenset({State.SUCCEEDED, State.FAILED, State.CANCELLED, State.PREEMPTED, State.LOST})
LIVE = frozenset({State.DISPATCHING, State.RUNNING})
# How a queued job whose provider waits for room on this machine's disk is shown; the
# provider's recorded reason begins with it (see monkey.core.room).
DISK_WAIT = "waiting for disk"

# The only legal moves; every other transition is refused by the store.
TRANSITIONS: dict[State, frozenset[State]] = {
    State.QUEUED: frozenset({State.DISPATCHING, State.CANCELLED, State.PAUSED}),
    State.DISPATCHING: frozenset(
        {
            State.RUNNING,
            State.QUEUED,
            State.FAILED,
            State.CANCELLED,
            State.PAUSED,
            State.LOST,
            State.PREEMPTED,
        }
    ),
    State.RUNNING: frozenset(
        {
            State.QUEUED,  # its provider gave it up before it ran: it goes to another
            State.SUCCEEDED,
            State.FAILED,
            State.CANCELLED,
            State.PAUSED,
            State.PREEMPTED,
            State.LOST,
        }
    ),
    State.PAUSED: frozenset({State.QUEUED, State.CANCELLED}),
    State.SUCCEEDED: frozenset({State.QUEUED}),
    State.FAILED: frozenset({State.QUEUED}),
    State.CANCELLED: frozenset({State.QUEUED}),
    State.PREEMPTED: frozenset({State.QUEUED}),
    State.LOST: frozenset({State.QUEUED}),
}


def can_transition(old: State, new: State) -> bool:
    """Whether a job may move from ``old`` to ``new``."""
    return new in TRANSITIONS[old]


class Request(str, enum.Enum):
    """What a user asked of a live job; the core carries it out."""

    CANCEL = "cancel"
    PAUSE = "pause"


class _LaterPattern:
    """A regular expression compiled on its first use (see ``later_pattern``)."""

    def __init__(self, pattern: Any, flags: int) -> None:  # str or bytes
        self._args = (pattern, flags)

    def __getattr__(self, name: str) -> Any:
        found = getattr(re.compile(*self._args), name)
        setattr(self, name, found)  # the next look-up finds it at once
        return found


def later_pattern(pattern: AnyStr, flags: int = 0) -> re.Pattern[AnyStr]:
    """``re.compile(PATTERN, FLAGS)`` done when the pattern is first used: a module's
    patterns cost a one-shot command nothing it does not use (each compile is 0.1-0.3 ms,
    and a module holds several)."""
    return _LaterPattern(pattern, flags)  # type: ignore[return-value]  # its methods, later


JUID_RE = later_pattern(r"^\d{2}-\d{2}-\d{2}-\d{3,}$")

_NOT_SECRET_NAMES = frozenset({"PWD", "OLDPWD"})
REDACTED = "<redacted>"


@functools.cache
def _secret_patterns() -> tuple[re.Pattern[str], re.Pattern[str]]:
    """The (name, value) patterns of secrets, compiled on first use (the value pattern
    alone takes a one-shot command 1.5 ms to compile)."""
    # Names that usually hold a secret. KEY counts as a word of the name (API_KEY, KEY_ID,
    # APIKEY), so that KEYBOARD and MONKEY_* do not; PWD and OLDPWD alone are the cwd.
    name = re.compile(
        r"PASS|PWD|CREDENTIAL|TOKEN|SECRET|PRIVATE|SESSION|COOKIE|SIGNATURE|AUTH(?!OR(?!IZ))"
        r"|(?:^|_)(?:API|ACCESS|SSH|SIGNING|ENCRYPTION|MASTER|LICENSE)?KEYS?(?:_|$)",
        re.I,
    )
    # Values that are secrets whatever their name: URLs with a password, private keys,
    # and the shapes of common API tokens (GitHub, GitLab, Slack, OpenAI/Stripe, AWS,
    # Hugging Face, Google, JWTs).
    value = re.compile(
        r"[A-Za-z][A-Za-z0-9+.-]*://[^\s/@:]*:[^\s@]+@"
        r"|-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----"
        r"|(?<![A-Za-z0-9])(?:"
        r"(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"
        r"|glpat-[A-Za-z0-9_-]{20,}|xox[bpas]-[A-Za-z0-9-]{10,}"
        r"|(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}|sk-[A-Za-z0-9_-]{20,}"
        r"|(?:AKIA|ASIA)[0-9A-Z]{16}|hf_[A-Za-z0-9]{20,}|AIza[0-9A-Za-z_-]{35}"
        r"|ya29\.[0-9A-Za-z_-]{20,}|eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*)"
    )
    return name, value


def is_secret_name(name: str) -> bool:
    """Whether an environment variable name looks like it holds a secret."""
    return name.upper() not in _NOT_SECRET_NAMES and bool(_secret_patterns()[0].search(name))


def is_secret(name: str, value: str) -> bool:
    """Whether a variable holds a secret, judged by its name or by its value."""
    return is_secret_name(name) or bool(_secret_patterns()[1].search(value))


def whole_number(text: str) -> int | None:
    """TEXT as a whole number when it is one in ASCII digits (at most 18), else None:
    ``str.isdigit`` takes "²", which ``int`` refuses, and ``int`` refuses 4,301 digits."""
    return int(text) if 0 < len(text) <= 18 and text.isascii() and text.isdigit() else None


def env_seconds(name: str, default: float) -> float:
    """The environment variable NAME as seconds (DEFAULT when unset); MonkeyError naming it
    and the fix when it is not a number of seconds."""
    import math
    import os

    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds >= 0):
        raise MonkeyError(
            f"{name}={text[:40]!r} is not a number of seconds; unset it or give one, "
            f"e.g. {default:g}"
        )
    return seconds


RETRY_DELAY_MAX = 300.0  # the longest back-off before a job runs again


def retry_delay(attempt: int, base: float = 2.0, cap: float = RETRY_DELAY_MAX) -> float:
    """Back-off before re-running a job whose attempt number ``attempt`` failed."""
    return min(cap, base * (2 ** max(0, attempt - 1)))


def parse_size(value: object) -> int:
    """Bytes from 17179869184, "16G", "512M", "1.5T", "64GiB"; MonkeyError otherwise."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    text = str(value).strip().upper().removesuffix("B").removesuffix("I")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(text[-1:], 1)
    try:
        size = float(text[:-1] if text[-1:] in "KMGT" else text) * scale
    except ValueError:
        size = -1.0
    if not 0 <= size < 1 << 80:  # refuses nan and inf too
        raise MonkeyError(f"memory {value!r} is not a size; write e.g. 16G or 512M")
    return int(size)


_DURATION = later_pattern(r"(\d+)([smhd]?)")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(value: object) -> int:
    """Seconds from "90s", "30m", "2h", "1d" or "HH:MM:SS" ("MM:SS"), or an int (seconds,
    from Python); MonkeyError otherwise. A bare number in text is refused: Slurm reads it as
    minutes, others as seconds, so the unit must be written."""
    text = str(value).strip().lower()
    seconds = -1
    if isinstance(value, int) and not isinstance(value, bool):
        seconds = value
    elif text.isdigit() and int(text) > 0:
        raise MonkeyError(
            f"time limit {value!r} has no unit; write {text}m for {text} minutes "
            f"(or {text}s, {text}h, {text}d, HH:MM:SS)"
        )
    elif (found := _DURATION.fullmatch(text)) is not None and found[2]:
        seconds = int(found[1]) * _UNITS[found[2]]
    elif re.fullmatch(r"\d+(:[0-5]?\d){1,2}", text):
        for part in text.split(":"):
            seconds = max(seconds, 0) * 60 + int(part)
    if seconds <= 0:
        raise MonkeyError(
            f"time limit {value!r} is not a duration; write e.g. 90s, 30m, 2h, 1d or HH:MM:SS"
        )
    return seconds


def human_size(n: float) -> str:
    """Bytes as 5 B, 12.0 kB, 340.5 MB, 1.2 GB, 3.0 TB (powers of 1000)."""
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


# A span between two wall-clock times longer than this is taken for a stepped clock.
ABSURD_SPAN = 366 * 86400.0


def wall_span(start: float | None, end: float | None) -> float | None:
    """Seconds from START to END, two wall-clock times (stored, or read in other processes):
    None when either is unknown or the span is negative or absurd, as a step of the wall clock
    between them makes it (NTP, a VM resumed). A caller takes None as "unknown", never as a
    deadline passed."""
    if start is None or end is None:
        return None
    seconds = end - start
    return seconds if 0.0 <= seconds <= ABSURD_SPAN else None


def run_time(seconds: float | None) -> str:
    """A run time as the CLI and the dashboard show it: 0.4s, 12s, 3m05s, 2h10m, 3d04h;
    `-` when unknown (never negative: a clock stepped back reads 0.0s)."""
    if seconds is None:
        return "-"
    if seconds < 10:
        return f"{max(0.0, seconds):.1f}s"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def format_duration(seconds: float) -> str:
    """A duration as its largest exact unit: 3600 -> "1h", 90 -> "90s", 5400 -> "90m"."""
    whole = int(seconds)
    for unit in ("d", "h", "m"):
        if whole and whole % _UNITS[unit] == 0:
            return f"{whole // _UNITS[unit]}{unit}"
    return f"{whole}s"


class Record:
    """Base of the value classes below: equality, repr and ``replace`` over their
    ``__slots__``. Plain classes rather than dataclasses: importing dataclasses (it loads
    inspect, ast and dis) and building these four took a one-shot command 6 ms."""

    __slots__: tuple[str, ...] = ()
    __hash__ = None  # type: ignore[assignment]  # mutable values

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in self.__slots__)

    def __repr__(self) -> str:
        fields = ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__)
        return f"{type(self).__name__}({fields})"

    def as_dict(self) -> dict[str, Any]:
        """The fields as a plain dict."""
        return {n: getattr(self, n) for n in self.__slots__}

    def replace(self, **changes: Any) -> Any:
        """A copy with CHANGES applied (like ``dataclasses.replace``)."""
        unknown = set(changes) - set(self.__slots__)
        if unknown:
            raise TypeError(f"{type(self).__name__} has no field {sorted(unknown)[0]!r}")
        return _rebuilt(type(self), tuple(changes.get(n, getattr(self, n)) for n in self.__slots__))

    def __reduce__(self) -> tuple[Any, ...]:  # copy and pickle, immutable classes too
        return _rebuilt, (type(self), tuple(getattr(self, n) for n in self.__slots__))


def _rebuilt(cls: type[Record], values: tuple[Any, ...]) -> Any:
    """An instance of CLS holding VALUES, in the order of its ``__slots__``."""
    record = object.__new__(cls)
    for n, v in zip(cls.__slots__, values):
        object.__setattr__(record, n, v)
    return record


class Resources(Record):
    """What a job asks of a worker."""

    __slots__ = ("cpus", "gpus", "memory", "host", "time", "providers")

    def __init__(
        self,
        cpus: int = 1,
        gpus: int = 0,
        memory: str | None = None,
        host: str | None = None,
        time: int | None = None,
        providers: list[str] | None = None,
    ) -> None:
        self.cpus = cpus
        self.gpus = gpus
        self.memory = memory
        self.host = host  # pinned to this instance of the provider (`run --host`)
        self.time = time  # seconds an attempt may run (`run --time`), then it fails
        # The providers it may run on, in order (`run -p a,b`), when more than one: one that
        # gives it up before it ran (no room there) hands it to the next that can hold it.
        self.providers = providers

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"cpus": self.cpus, "gpus": self.gpus, "memory": self.memory}
        if self.host:
            out["host"] = self.host
        if self.time:
            out["time"] = self.time
        if self.providers:
            out["providers"] = self.providers
        return out


class Ending(str, enum.Enum):
    """How an attempt ended, as its agent (or the core, for what no agent saw) reports it;
    the agent protocol's ``exit.reason`` values plus the core's own."""

    EXITED = "exited"  # the job's process exited with a code
    KILLED = "killed"  # a signal ended it (cancel, pause, grace over, the kernel)
    VANISHED = "vanished"  # gone without an exit code (killed while no agent watched)
    SETUP = "setup"  # its environment's set-up failed: the command never ran
    SILENT = "silent"  # no heartbeat from its instance for too long
    TERMINATED = "terminated"  # its instance is gone (terminated, reclaimed)
    PREEMPTED = "preempted"  # a spot/preemption notice stopped it, or the cloud reclaimed it
    REVOKED = "revoked"  # a person took its machine away (a Slurm allocation scancel'ed)
    TIMEOUT = "timeout"  # its time limit (`run --time`) was reached: the agent stopped it
    SPAWN = "spawn"  # its command could not be run (not found: code 127; not executable: 126)
    # Its provider gave it up before it ran, for want of room there (a pod no node took
    # within schedule_timeout): another provider of the job's may take it.
    GIVEN_UP = "given_up"

    @classmethod
    def of(cls, event: dict[str, Any]) -> Ending:
        """The ending an exit event reports (an unknown reason counts as an exit)."""
        try:
            return cls(event.get("reason") or "exited")
        except ValueError:
            return cls.EXITED


class InstanceState(str, enum.Enum):
    """State of a machine as its provider reports it (libcloud's NodeState, narrowed)."""

    PENDING = "pending"  # asked for, booting
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"
    TERMINATED = "terminated"  # gone for good (a released SSH host is one too)
    UNKNOWN = "unknown"  # the provider cannot say (an API error, an unreachable host)

    def __str__(self) -> str:
        return self.value


# The moves a provider can report; the store refuses the others (a terminated machine
# never comes back: a new one has a new id).
INSTANCE_TRANSITIONS: dict[InstanceState, frozenset[InstanceState]] = {
    InstanceState.PENDING: frozenset(InstanceState) - {InstanceState.PENDING},
    InstanceState.RUNNING: frozenset(InstanceState)
    - {InstanceState.RUNNING, InstanceState.PENDING},
    InstanceState.STOPPING: frozenset(
        {InstanceState.STOPPED, InstanceState.TERMINATED, InstanceState.UNKNOWN}
    ),
    InstanceState.STOPPED: frozenset(
        {
            InstanceState.PENDING,
            InstanceState.RUNNING,
            InstanceState.TERMINATED,
            InstanceState.UNKNOWN,
        }
    ),
    InstanceState.TERMINATED: frozenset(),
    InstanceState.UNKNOWN: frozenset(InstanceState) - {InstanceState.UNKNOWN},
}


class Instance(Record):
    """One machine of a provider, normalised across kinds (a libcloud Node, an SSH host,
    this machine, a Slurm allocation). Immutable: ``replace`` makes a changed copy."""

    __slots__ = (
        "id",
        "provider",
        "name",
        "state",
        "address",
        "size",
        "spot",
        "launched_at",
        "extra",
        "price",
    )
    id: str  # unique across providers: "aws/i-0abc...", "lab/gpu1", "local"
    provider: str
    name: str
    state: InstanceState
    address: str | None  # where its agent is reached (SSH), None for this machine
    size: str | None  # the provider's size name (e.g. g5.xlarge)
    spot: bool  # spot / preemptible capacity
    launched_at: float | None
    extra: dict[str, Any]  # provider-only data
    price: float | None  # estimated $ per hour (None: unknown)

    def __init__(
        self,
        id: str,
        provider: str,
        name: str,
        state: InstanceState,
        address: str | None = None,
        size: str | None = None,
        spot: bool = False,
        launched_at: float | None = None,
        extra: dict[str, Any] | None = None,
        price: float | None = None,
    ) -> None:
        values = (
            id,
            provider,
            name,
            state,
            address,
            size,
            spot,
            launched_at,
            {} if extra is None else extra,
            price,
        )
        for n, v in zip(self.__slots__, values):
            object.__setattr__(self, n, v)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"Instance is immutable; use replace({name}=...)")


class Attempt(Record):
    """One try of a job on one instance. Its instance's size, spot or not, and the
    estimated $ per hour charged to it (the instance's price times the job's share of its
    CPUs) are recorded when it began."""

    __slots__ = (
        "juid",
        "n",
        "instance",
        "state",
        "started_at",
        "ended_at",
        "exit_code",
        "signal",
        "reason",
        "pid",
        "run_dir",
        "heartbeat_at",
        "events_offset",
        "gpus",
        "size",
        "spot",
        "price",
    )

    def __init__(
        self,
        juid: str,
        n: int,
        instance: str,
        state: str,
        started_at: float | None = None,
        ended_at: float | None = None,
        exit_code: int | None = None,
        signal: int | None = None,
        reason: str | None = None,
        pid: int | None = None,
        run_dir: str = "",
        heartbeat_at: float | None = None,
        events_offset: int = 0,
        gpus: str = "",
        size: str | None = None,
        spot: bool = False,
        price: float | None = None,
    ) -> None:
        self.juid = juid
        self.n = n
        self.instance = instance
        self.state = state
        self.started_at = started_at
        self.ended_at = ended_at
        self.exit_code = exit_code
        self.signal = signal
        self.reason = reason
        self.pid = pid
        self.run_dir = run_dir
        self.heartbeat_at = heartbeat_at
        self.events_offset = events_offset
        self.gpus = gpus
        self.size = size
        self.spot = spot
        self.price = price

    def cost(self, now: float) -> float | None:
        """Estimated $ spent on this attempt (so far, while it runs); None when unknown."""
        if self.price is None or self.started_at is None:
            return None
        return self.price * max(0.0, (self.ended_at or now) - self.started_at) / 3600


class Job(Record):
    """A job as recorded in the store: everything needed to run it again."""

    __slots__ = (
        "juid",
        "name",
        "state",
        "argv",
        "provider",
        "resources",
        "env",
        "snapshot",
        "workdir",
        "datasets",
        "git",
        "python",
        "retries",
        "attempts",
        "request",
        "exit_code",
        "reason",
        "created_at",
        "updated_at",
        "started_at",
        "finished_at",
        "not_before",
        "sweep",
        "params",
        "instance",
        "unreachable_since",
        "priority",
        "held",
        "waiting",
        "phase",
    )

    def __init__(
        self,
        juid: str,
        name: str,
        state: State,
        argv: list[str],
        provider: str,
        resources: Resources | None = None,
        env: dict[str, str] | None = None,
        snapshot: str | None = None,
        workdir: str = "",
        datasets: list[dict[str, Any]] | None = None,
        git: dict[str, Any] | None = None,
        python: str = "",
        retries: int = 0,
        attempts: int = 0,
        request: str | None = None,
        exit_code: int | None = None,
        reason: str | None = None,
        created_at: float = 0.0,
        updated_at: float = 0.0,
        started_at: float | None = None,
        finished_at: float | None = None,
        not_before: float = 0.0,
        sweep: str | None = None,
        params: dict[str, Any] | None = None,
        instance: str | None = None,
        unreachable_since: float | None = None,
        priority: int = 0,
        held: str | None = None,
        waiting: bool = False,
        phase: str | None = None,
    ) -> None:
        self.juid = juid
        self.name = name
        self.state = state
        self.argv = argv
        self.provider = provider
        self.resources = Resources() if resources is None else resources
        self.env = {} if env is None else env
        self.snapshot = snapshot
        self.workdir = workdir
        self.datasets = [] if datasets is None else datasets
        self.git = {} if git is None else git
        self.python = python
        self.retries = retries
        self.attempts = attempts
        self.request = request
        self.exit_code = exit_code
        self.reason = reason
        self.created_at = created_at
        self.updated_at = updated_at
        self.started_at = started_at
        self.finished_at = finished_at
        self.not_before = not_before
        self.sweep = sweep
        self.params = {} if params is None else params
        self.instance = instance
        # Since when its live attempt's instance is out of reach (a sub-status of running).
        self.unreachable_since = unreachable_since
        self.priority = priority  # higher starts first among queued jobs (`run --priority`)
        # Why a quota holds it back ("over quota: ..."), while it is queued; else None.
        self.held = held if state == State.QUEUED else None
        # Whether it waits queued for other jobs (`run --after`) to succeed or end.
        self.waiting = waiting and state == State.QUEUED
        self.phase = phase  # a live attempt's step before its command: "pulling 12 MB of 45 MB"

    @property
    def shown_state(self) -> str:
        """The state as listings show it: `unreachable` for a live job whose instance is out
        of reach (still `running` in the record and for filters), `waiting` for a queued job
        waiting for other jobs, `over quota` for one a quota holds back, `pulling` for a live
        one whose image is being pulled."""
        if self.unreachable_since is not None and self.state in LIVE:
            return "unreachable"
        if self.phase and self.state in LIVE:  # "pulling ...": its image, before its command
            return self.phase.split()[0]
        if self.waiting:
            return "waiting"
        if self.held:
            return "over quota"
        return self.state.value

    @property
    def command(self) -> str:
        """The command as a shell would show it."""
        import shlex

        return shlex.join(self.argv)

    def to_json(self) -> dict[str, Any]:
        """A plain dict for --json output and the API."""
        return {
            "job": self.juid,
            "name": self.name,
            "state": self.state.value,
            "argv": self.argv,
            "command": self.command,
            "provider": self.provider,
            "instance": self.instance,
            "resources": self.resources.to_json(),
            "env": self.env,
            "snapshot": self.snapshot,
            "workdir": self.workdir,
            "datasets": self.datasets,
            "git": self.git,
            "python": self.python,
            "retries": self.retries,
            "attempts": self.attempts,
            "request": self.request,
            "exit_code": self.exit_code,
            "reason": self.reason,
            "created_at": self.created_at,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "sweep": self.sweep,
            "params": self.params,
            "unreachable_since": self.unreachable_since,
            "priority": self.priority,
            **({"phase": self.phase} if self.phase else {}),
        }


_ENCODER = json.JSONEncoder(separators=(",", ":"), sort_keys=True)  # json.dumps makes one per call


def dumps(value: Any) -> str:
    """Compact, stable JSON used for every stored document."""
    return _ENCODER.encode(value)
