"""The main node keeps its core up (issue 46, finding 3): the server started the core, so a
core that dies (SIGKILLed, out of memory) is the server's child to reap and to start again,
or running jobs' ends, retries and dispatch would wait for someone's next command. A thread
of the server looks every ``CHECK`` seconds; a core that will not start is tried again
with a back-off (up to ``MOST_WAIT``); each restart is logged and counted in
``server status``."""

from __future__ import annotations

import json
import logging
import os
import threading
import time

from monkey.config import Home, write_private
from monkey.models import MonkeyError

log = logging.getLogger("monkey.server")
CHECK = 1.0  # seconds between two looks at the core
MOST_WAIT = 60.0  # seconds between two tries, at most, while the core will not start
RECORD = "core-restarts.json"  # under MONKEY_HOME/server: {"count", "last_at", "last_pid"}


class CoreWatch:
    """A thread of the server that restarts its core when it is gone."""

    def __init__(self, home: Home, pid: int | None) -> None:
        self.home, self.pid = home, pid
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="core-watch", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        from monkey.core import daemon

        wait = CHECK
        while not self.stopped.wait(wait):
            try:
                if daemon.status(self.home):
                    wait = CHECK
                    continue
                self._reap()
                if self.stopped.is_set():
                    return
                gone = self.pid
                self.pid = daemon.start(self.home)
                log.warning("the core (pid %s) was gone; started another (pid %s)", gone, self.pid)
                _count(self.home, self.pid)
                wait = CHECK
            except (MonkeyError, OSError) as exc:
                wait = min(max(wait * 2, 2.0), MOST_WAIT)
                log.error("the core is not running and cannot start: %s; again in %.0fs", exc, wait)

    def _reap(self) -> None:
        """Collect the exit of the core the server started (a zombie otherwise)."""
        if self.pid and self.pid > 0:
            try:
                os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # not the server's child (started by someone else)
                pass

    def close(self) -> None:
        self.stopped.set()


def _count(home: Home, pid: int) -> None:
    path = home.root / "server" / RECORD
    seen = restarts(home)
    data = {"count": seen["count"] + 1, "last_at": time.time(), "last_pid": pid}
    try:
        write_private(path, json.dumps(data).encode())
    except OSError:
        pass  # a full disk: the log line says it


def restarts(home: Home) -> dict[str, float]:
    """{"count", "last_at", "last_pid"} of the server's restarts of its core (0 when none)."""
    try:
        data = json.loads((home.root / "server" / RECORD).read_text())
        return {k: float(data[k]) for k in ("count", "last_at", "last_pid")}
    except (OSError, ValueError, KeyError, TypeError):
        return {"count": 0, "last_at": 0.0, "last_pid": 0}
