"""One attempt of the `kubernetes` provider as its cluster agent (k8s_agent.py) keeps it:
its pod, what the watch and the pod's relay said of it, and its run folder's files in
MONKEY_HOME (the job's output kept byte for byte, setup.log, how far the pod's events were
taken: an adopting core goes on from there)."""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field

from monkey.client_agent.common import write_atomic
from monkey.client_agent.rundir import EVENTS, ORDER, POD_TAKEN, SETUP_LOG, STDERR, STDOUT

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from monkey.drivers.k8s_link import PodLink

FOLLOWED = (STDOUT, STDERR, ORDER)  # the pod's files kept byte for byte in MONKEY_HOME


@dataclass
class Attempt:
    """One attempt as the cluster agent keeps it: its pod, what the watch and its relay
    said, and how far its run folder has taken the pod's files."""

    juid: str
    n: int
    run_dir: str
    pod: str
    image: str
    created: float
    secret: str | None = None
    seq: int = 0
    phase: str | None = None
    scheduled: bool = False
    said: str = ""  # the last line written to setup.log
    beat_at: float = 0.0
    signalled: int | None = None  # the signal asked
    ended: bool = False  # its exit event is written
    ending: dict[str, Any] | None = None  # the exit, once known
    disrupted: str = ""  # why Kubernetes is stopping the pod (evicted, preempted, drained)
    # Its container's end as the watch saw it: its exit code and "OOMKilled, limit ..." (or "")
    container_end: tuple[int | None, str] | None = None
    container_ended: threading.Event = field(default_factory=threading.Event)
    # Its `started` event is written: what the watch saw of its pod before waits for it
    # (a pod may run and end before its creation's answer came back).
    started: bool = False
    gone: bool = False  # the watch saw its pod deleted before its `started` was written
    booting: bool = False  # its inputs are being put in the pod, or its relay opened
    relinks: int = 0  # tries in a row to open its relay again
    kept_at: float = 0.0  # when its kept folders were last read back (or its agent linked)
    kept_changed: bool = False  # they changed in the pod since (its relay says so)
    keeping: bool = False  # they are being read back now
    fetching: threading.Lock = field(default_factory=threading.Lock)  # a read-back at a time
    link: PodLink | None = None  # the relay to the pod's agent, while open
    start: dict[str, Any] = field(default_factory=dict)  # what POD_START holds
    taken: dict[str, int] = field(default_factory=dict)  # of the pod's events and setup.log
    lock: threading.Lock = field(default_factory=threading.Lock)  # its local files

    def file(self, name: str, at: int, data: bytes) -> None:
        """Append the bytes of the pod's file NAME from offset AT that the run folder lacks
        (the job's output kept byte for byte, setup.log's lines)."""
        with self.lock:
            path = os.path.join(self.run_dir, name)
            if name == SETUP_LOG:
                have = int(self.taken.get(SETUP_LOG, 0))
            elif name in FOLLOWED:
                have = os.path.getsize(path) if os.path.exists(path) else 0
            else:
                return
            if at + len(data) <= have:
                return
            with open(path, "ab") as f:
                f.write(data[max(0, have - at) :])
            if name == SETUP_LOG:
                self.taken[SETUP_LOG] = at + len(data)
                self._write_taken()

    def take(self, offset: int) -> None:
        """Record how far the pod's events were taken (an adopting core goes on from there)."""
        with self.lock:
            self.taken[EVENTS] = max(offset, int(self.taken.get(EVENTS, 0)))
            self._write_taken()

    def setup_line(self, text: str) -> None:
        """Add TEXT to the attempt's setup.log (once, when it repeats the last line)."""
        if text == self.said:
            return
        self.said = text
        try:
            with open(os.path.join(self.run_dir, SETUP_LOG), "a") as f:
                f.write(f"[monkey] {text}\n")
        except OSError:
            pass

    def _write_taken(self) -> None:
        write_atomic(os.path.join(self.run_dir, POD_TAKEN), json.dumps(self.taken).encode())
