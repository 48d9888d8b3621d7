"""Whether a core serves this MONKEY_HOME and, when none does, since when.

The core touches ``private/core.alive`` once a second (and as it stops), so the file's
mtime is the last moment a core was known to run. Clients read it without taking the
core's lock (a probe that took it could make a core starting at that instant refuse to
start), and with nothing heavier than ``os``: `monkey list jobs` asks on every call."""

from __future__ import annotations

import os
import time

from monkey.config import Home

TOUCH_EVERY = 1.0


def alive_file(home: Home) -> str:
    return str(home.private / "core.alive")


def _runs(pid: int) -> bool:
    """Whether PID is a live monkey core (not a process that reused a dead core's pid)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return b"monkey" in fh.read()  # `monkey daemon run` or a detached core
    except FileNotFoundError:
        return not os.path.isdir("/proc")  # no procfs (macOS): trust the signal probe
    except OSError:
        return True


def absent_since(home: Home) -> float | None:
    """None while a core serves this home; else when the last one was last known to run
    (0.0 when no core ever ran here)."""
    try:
        with open(home.daemon_pid, "rb") as fh:
            pid = int(fh.read().strip() or b"0")
    except (OSError, ValueError):
        pid = 0
    if pid > 0 and _runs(pid):
        return None
    try:
        return os.stat(alive_file(home)).st_mtime
    except OSError:
        return 0.0


class Presence:
    """The core's side: ``previous`` is when the core before this one was last known to
    run (None: unknown); ``touch`` marks this one alive."""

    def __init__(self, home: Home) -> None:
        self.path = alive_file(home)
        try:
            self.previous: float | None = os.stat(self.path).st_mtime
        except OSError:
            self.previous = None
        self.touched = 0.0  # the last touch (monotonic)
        self.touch(force=True)

    def touch(self, force: bool = False) -> None:
        if not force and time.monotonic() - self.touched < TOUCH_EVERY:
            return
        self.touched = time.monotonic()
        now = time.time()
        try:
            os.utime(self.path, (now, now))
        except FileNotFoundError:
            try:
                os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))
            except OSError:
                pass  # a courtesy for clients; the core goes on without it
        except OSError:
            pass
