"""The agent's state: of one job, a live attempt it watches (``Job``) and a start held until a
slot frees (``Pending``); of a client, its connection (``Conn``); of the agent, what its parts (the mixins ``Agent`` is made of:
wire.py, spawn.py, events.py, cloud.py, adopt.py) share (``AgentState``). Standard library
only (see agent.py)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from monkey.client_agent.common import encode
from monkey.client_agent.rundir import EVENTS

TYPE_CHECKING = False
if TYPE_CHECKING:
    import queue
    import selectors
    import socket
    import subprocess
    from typing import Any

    from monkey.client_agent.orphan import OrphanWatch
    from monkey.client_agent.procs import Cgroups

# seconds a start handed ahead of a free slot is held before it is withdrawn
HOLD_LIMIT = float(os.environ.get("MONKEY_HOLD_LIMIT", "2"))
Key = tuple[str, int]  # (juid, attempt)


class Job:
    """One live attempt the agent watches through a pidfd."""

    __slots__ = (
        "juid",
        "attempt",
        "run_dir",
        "pid",
        "pidfd",
        "child",
        "seq",
        "signalled",
        "cpu_prev",
        "began",
        "tail",
        "gpus",
        "cgroup",
        "preempted",
        "revoked",
        "order",
        "limit",
        "timed_out",
        "cpus",
        "prefix",
        "events_path",
        "push_head",
        "monitor",
        "pulling",
        "container",
    )

    def __init__(
        self,
        juid: str,
        attempt: int,
        run_dir: str,
        pid: int,
        pidfd: int,
        child: bool,
        seq: int,
        started: float,
    ) -> None:
        self.juid = juid
        self.attempt = attempt
        self.run_dir = run_dir
        self.pid = pid  # also the session and process group id
        self.pidfd = pidfd
        self.child = child  # our unreaped child (False for an adopted job)
        self.seq = seq
        self.signalled: int | None = None
        self.cpu_prev = (0, started)  # (ticks, boot time) at last heartbeat; STARTED at first
        self.began = started  # its start on the boot clock (0: unknown)
        self.tail = [0, 0]  # offsets in metrics.jsonl and stdout.log shipped so far
        self.gpus: list[str] = []  # its CUDA_VISIBLE_DEVICES
        self.cgroup = ""  # its cgroup's folder, when the agent could make one
        self.preempted = False  # stopped by a spot/preemption notice
        self.revoked = ""  # why its machine was taken away by a person (a Slurm scancel)
        self.order = (0, 0)  # stdout.log and stderr.log sizes at the last output.order mark
        # [seconds, deadline on the boot clock, grace] (time_limit): a step of the wall clock
        # (NTP, a VM resumed) moves no deadline.
        self.limit: list[float] | None = None
        self.timed_out = False  # stopped by its time limit
        self.cpus = 1  # the worker's slots it takes (a start's ``cpus``)
        self.monitor = ""  # the bwrap its sandbox runs under ("": none; see sandbox.py)
        self.pulling = False  # its image may be being pulled (its heartbeats say how far)
        self.container: list[str] = []  # the argv removing its engine's container, if any
        self.prefix = os.path.join(run_dir, "")  # the run dir's files are prefix + name
        self.events_path = self.prefix + EVENTS
        # its event pushes up to the offset: {"push":"event","juid":J,"attempt":A,"offset":
        head = encode({"push": "event", "juid": juid, "attempt": attempt})
        self.push_head = head[:-2] + b',"offset":'

    @property
    def key(self) -> Key:
        return (self.juid, self.attempt)


class Pending:
    """A start prepared (its run dir materialised) and held until a slot frees."""

    __slots__ = (
        "juid",
        "attempt",
        "run_dir",
        "cwd",
        "argv",
        "env",
        "limit",
        "results",
        "cpus",
        "conn",
        "rid",
        "until",
        "monitor",
        "image",
        "container",
    )

    def __init__(
        self,
        juid: str,
        attempt: int,
        run_dir: str,
        cwd: str,
        argv: list[str],
        env: dict[str, str],
        limit: list[float] | None,
        results: Any,
        cpus: int,
        conn: Conn | None,
        rid: Any,
    ) -> None:
        self.juid, self.attempt, self.run_dir, self.cwd = juid, attempt, run_dir, cwd
        self.argv, self.env, self.limit, self.results = argv, env, limit, results
        self.cpus = cpus
        self.conn, self.rid = conn, rid  # where its reply goes once it spawns or is withdrawn
        self.until = time.monotonic() + HOLD_LIMIT
        self.monitor = ""  # the bwrap running it in a sandbox ("": none)
        self.image = False  # it runs in an image, pulled first
        self.container: list[str] = []  # the argv removing its engine's container, if any

    @property
    def key(self) -> Key:
        return (self.juid, self.attempt)


class Conn:
    """One client connection with its input and output buffers."""

    __slots__ = ("sock", "inbuf", "outbuf", "subscribed", "writing")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.inbuf = bytearray()
        self.outbuf = bytearray()
        self.subscribed = False
        self.writing = False


class AgentState:
    """What the parts of the ``Agent`` use of each other: its state (set in
    ``Agent.__init__``) and the methods one part calls in another. Declarations only."""

    root: str
    socket_path: str
    heartbeat: float
    reserve: int  # bytes set aside in private/reserve (see --reserve)
    termed: bool
    sel: selectors.BaseSelector
    listener: socket.socket | None
    socket_ino: int
    conns: set[Conn]
    unsent: set[Conn]
    jobs: dict[Key, Job]
    held: dict[Key, Pending]
    slots: int
    kill_at: dict[Key, float]
    environ: dict[str, str]
    launcher: str
    job_path: str
    cgroups: Cgroups
    orphan: OrphanWatch
    next_heartbeat: float
    gpu_probe: subprocess.Popen | None
    gpus: list[dict[str, Any]] | None
    reclaims: queue.SimpleQueue[str] | None
    results: dict[Key, Any]
    exiting: set[Key]
    unfetched: dict[Key, str]  # ended attempts (run dirs) the core may not have fetched yet
    unwritten: dict[Key, tuple[Job, dict[str, Any]]]
    watcher: Any
    notice: dict[str, Any] | None
    done: queue.SimpleQueue[tuple[str, Any]]
    done_r: int
    done_w: int

    _send: Callable[[Conn, bytes], None]  # wire.py
    _track: Callable[[Job], None]  # spawn.py
    _start_held: Callable[[], None]
    _withdraw: Callable[[Pending, str], None]
    _append: Callable[..., None]  # events.py
    _tail: Callable[..., None]
    _on_exit: Callable[[Job, int], None]
    _reclaim: Callable[[str], None]
    _keep_reserve: Callable[[], None]
    _exit_fields: Callable[[Job, int | None, int | None, float | None], dict[str, Any]]
    _report_exit: Callable[[Job, dict[str, Any]], bool]
    _results: Callable[..., Any]  # cloud.py
    _keep_results: Callable[[str, dict[str, Any], str], None]
    _adopted_results: Callable[[Job], None]
    _watch: Callable[[Any], None]
    _core_awaits: Callable[[Any], None]
    _leave: Callable[[str], str | None]
    _in_thread: Callable[[str, Job, Callable[[], Any]], None]
    _on_done: Callable[[int], None]
    _claimed: Callable[[str], dict[str, Any] | None]  # adopt.py
    _signal_session: Callable[[Job, int], None]  # agent.py
    _end_tree: Callable[[Job], None]
