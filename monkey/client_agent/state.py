"""The agent's state of one job: a live attempt it watches (``Job``) and a start held until a
slot frees (``Pending``). Standard library only (see agent.py)."""

from __future__ import annotations

import os
import time
from typing import Any

from monkey.client_agent.common import encode
from monkey.client_agent.rundir import EVENTS
from monkey.client_agent.wire import Conn

# seconds a start handed ahead of a free slot is held before it is withdrawn
HOLD_LIMIT = float(os.environ.get("MONKEY_HOLD_LIMIT", "2"))
Key = tuple[str, int]  # (juid, attempt)


class Job:
    """One live attempt the agent watches through a pidfd."""

    __slots__ = (
        "juid", "attempt", "run_dir", "pid", "pidfd", "child", "seq",
        "signalled", "cpu_prev", "tail", "gpus", "cgroup", "preempted", "order", "limit", "timed_out",
        "cpus", "prefix", "events_path", "push_head",
    )  # fmt: skip

    def __init__(self, juid: str, attempt: int, run_dir: str, pid: int, pidfd: int,
                 child: bool, seq: int, started: float) -> None:  # fmt: skip
        self.juid = juid
        self.attempt = attempt
        self.run_dir = run_dir
        self.pid = pid  # also the session and process group id
        self.pidfd = pidfd
        self.child = child  # our unreaped child (False for an adopted job)
        self.seq = seq
        self.signalled: int | None = None
        self.cpu_prev = (0, started)  # (ticks, boot time) at last heartbeat; STARTED at first
        self.tail = [0, 0]  # offsets in metrics.jsonl and stdout.log shipped so far
        self.gpus: list[str] = []  # its CUDA_VISIBLE_DEVICES
        self.cgroup = ""  # its cgroup's folder, when the agent could make one
        self.preempted = False  # stopped by a spot/preemption notice
        self.order = (0, 0)  # stdout.log and stderr.log sizes at the last output.order mark
        self.limit: list[float] | None = None  # [seconds, epoch deadline, grace] (time_limit)
        self.timed_out = False  # stopped by its time limit
        self.cpus = 1  # the worker's slots it takes (a start's ``cpus``)
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

    __slots__ = ("juid", "attempt", "run_dir", "cwd", "argv", "env", "limit", "results",
                 "cpus", "conn", "rid", "until")  # fmt: skip

    def __init__(self, juid: str, attempt: int, run_dir: str, cwd: str, argv: list[str],
                 env: dict[str, str], limit: list[float] | None, results: Any, cpus: int,
                 conn: Conn | None, rid: Any) -> None:  # fmt: skip
        self.juid, self.attempt, self.run_dir, self.cwd = juid, attempt, run_dir, cwd
        self.argv, self.env, self.limit, self.results = argv, env, limit, results
        self.cpus = cpus
        self.conn, self.rid = conn, rid  # where its reply goes once it spawns or is withdrawn
        self.until = time.monotonic() + HOLD_LIMIT

    @property
    def key(self) -> Key:
        return (self.juid, self.attempt)
