"""Running the core: one per MONKEY_HOME (a file lock), in the foreground or detached."""

from __future__ import annotations

import errno
import os
import sys
import time
from pathlib import Path

from monkey.config import (
    Home,
    first_error,
    lock_now,
    open_private,
    python_entry,
    stop_process,
    write_private,
)
from monkey.models import MonkeyError
from monkey.version import PACKAGE, fresh_entry, version

TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess
    from typing import Any


def read_only(home: Home) -> str | None:
    """Why no core can run in MONKEY_HOME because it may not be written (a read-only
    mount), as one line naming the fix; None when it may."""
    if os.access(home.root, os.W_OK):
        return None
    why = (
        "it is on a read-only file system"
        if _on_read_only_fs(home.root)
        else "you may not write to it"
    )
    return (
        f"MONKEY_HOME {home.root} cannot be written ({why}): the core keeps its database "
        "there; remount it read-write, or set MONKEY_HOME to a folder you may write to"
    )


def _on_read_only_fs(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _try_lock(home: Home) -> int | None:
    """The lock's fd when this process could take it, else None (a core holds it). In a
    home that may not be written the lock is taken read-only (no core can run there, but
    one that ran before the home became read-only may still hold it)."""
    try:
        fd = os.open(home.daemon_lock, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise
        try:
            fd = os.open(home.daemon_lock, os.O_RDONLY)
        except FileNotFoundError:  # never made: no core ever ran here
            fd = os.open(os.devnull, os.O_RDONLY)
    return lock_now(fd)


def status(home: Home) -> int | None:
    """PID of the core serving this MONKEY_HOME, or None when none runs."""
    home.ensure()
    fd = _try_lock(home)
    if fd is not None:
        os.close(fd)
        return None
    try:
        return int(home.daemon_pid.read_text().strip())
    except (OSError, ValueError):
        return -1  # locked but the pid file is not written yet


def who(home: Home) -> str:
    """The running core as "pid N", or "pid N, still starting" while it has yet to write its
    pid file (the holder of its lock, from /proc/locks)."""
    pid = status(home)
    if pid is not None and pid > 0:
        return f"pid {pid}"
    holder = lock_holder(home.daemon_lock)
    return f"pid {holder}, still starting" if holder else "still starting"


def lock_holder(path: Path) -> int | None:
    """The pid holding a flock on PATH, from /proc/locks (None when unknown)."""
    try:
        inode = os.stat(path).st_ino
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if "->" in fields:  # a waiter, not a holder
            continue
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5].rsplit(":", 1)[-1] == str(inode):
            try:
                return int(fields[4])
            except ValueError:
                return None
    return None


def core_version_file(home: Home) -> Path:
    """Where the running core records its version (see monkey.version)."""
    return home.private / "core.version"


def core_version(home: Home) -> str | None:
    """The version the running core recorded, or None (none runs, or a core from before
    versions were recorded)."""
    try:  # os-level: a wake reads it once per submitted job
        fd = os.open(core_version_file(home), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, 4096).decode(errors="replace").strip() or None
    except OSError:
        return None
    finally:
        os.close(fd)


def outdated(home: Home) -> bool:
    """Whether a core runs code other than this process's (a reinstall since it started).
    A core still starting (locked, no pid yet) is not: its version is written just before
    its pid, and the file may still hold the previous core's."""
    pid = status(home)
    return pid is not None and pid > 0 and core_version(home) != version()


def local_agent(home: Home, stop_if_idle: bool = False) -> dict[str, Any] | None:
    """The local agent's ``hello`` (pid, digest: its code's version), or None when none runs;
    with STOP_IF_IDLE it is asked to stop when it runs no job (``stopping`` says whether)."""
    from monkey.drivers.agent_link import AgentError, AgentGone, connect_unix

    try:
        with connect_unix(str(home.socket_path("agent"))) as link:
            hello = link.request("hello", timeout=10)
            if stop_if_idle:
                hello["stopping"] = bool(
                    link.request("shutdown", timeout=10, if_idle=True)["stopping"]
                )
            return hello
    except (OSError, AgentError, AgentGone):
        return None


def condition(home: Home) -> str:
    """Why the running core cannot write, or "" when it can: what it said of its last write,
    else a (nearly) full disk under the home, which it may not have tried yet (an agent that
    cannot record a job's end has nothing to tell it)."""
    from monkey.core.outage import read_status
    from monkey.store.errors import NEARLY_FULL, DiskFull, free_bytes

    said = read_status(home.core_status)
    if said:
        return said
    free = free_bytes(home.root)
    return (
        f"its disk is nearly full: {DiskFull(home.root, free)}" if 0 <= free < NEARLY_FULL else ""
    )


def run_foreground(home: Home | None = None) -> int:
    """Serve as the core until SIGTERM/SIGINT; refuses when another core holds the lock, and
    says why in one line on stderr when it cannot start (a damaged database among others)."""
    home = (home or Home()).ensure()
    fd = _try_lock(home)
    if fd is None:
        print(f"monkey: a core is already running for {home.root} ({who(home)})", file=sys.stderr)
        return 1
    if (why := read_only(home)) is not None:
        os.close(fd)
        print(f"monkey: error: the core cannot start: {why}", file=sys.stderr)
        return 1
    import logging

    logging.basicConfig(
        level=os.environ.get("MONKEY_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from monkey.core.scheduler import Core
    from monkey.store import Store

    try:
        store = Store(home.db)
        try:
            store.check_integrity()  # a damaged file is refused before anything is written
        finally:
            store.close()
        # The version first: a client that sees the pid finds this core's version.
        write_private(core_version_file(home), version().encode())
        write_private(home.daemon_pid, f"{os.getpid()}\n".encode())
        core = Core(home)
    except (MonkeyError, OSError) as exc:  # e.g. a damaged database or a full disk
        print(f"monkey: error: the core cannot start: {exc}", file=sys.stderr)
        home.daemon_pid.unlink(missing_ok=True)
        os.close(fd)
        return 1

    def _stop(signum: int, frame: object) -> None:
        core.restart = False  # told to stop: no core takes over, even after a reinstall
        core.stop()

    import signal

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    logging.getLogger("monkey.core").info("core %d serving %s", os.getpid(), home.root)
    try:
        core.run()
    finally:
        home.daemon_pid.unlink(missing_ok=True)
        os.close(fd)
    if core.restart:  # monkey was reinstalled: a core on the new code takes over
        spawn(home, fresh=not PACKAGE.is_dir())
    return 0


def spawn(home: Home, fresh: bool = False) -> subprocess.Popen[bytes]:
    """Start a detached core (it exits at once if another one holds the lock). It runs in
    MONKEY_HOME, isolated from the caller's folder (see ``python_entry``); with FRESH, on the
    monkey this python finds installed now (this process's import path holds an install
    that is gone: see ``version.installed_elsewhere``)."""
    import subprocess

    home.ensure()
    env = dict(os.environ, MONKEY_HOME=str(home.root))
    argv = (
        fresh_entry("monkey.core.daemon", "run_foreground")
        if fresh
        else python_entry("monkey.core.daemon", "run_foreground")
    )
    with open_private(home.daemon_log) as log:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=env,
            cwd=home.root,
            start_new_session=True,
            close_fds=True,
        )


def start(home: Home, timeout: float = 10.0) -> int:
    """Start the core in the background (if needed) and wait until it serves; MonkeyError
    with the first error it logged when it cannot start. A core running other code than
    this process's (monkey was reinstalled) is restarted: its jobs keep running and the
    new core re-attaches to them."""
    pid = status(home)
    if not pid and (why := read_only(home)) is not None:
        raise MonkeyError(f"the core cannot start: {why}")
    if pid and outdated(home):
        import logging

        logging.getLogger("monkey.core").info(
            "restarting the core (pid %d): monkey was reinstalled", pid
        )
        stop(home)
        pid = status(home)
    if pid:
        return pid
    try:
        offset = home.daemon_log.stat().st_size
    except FileNotFoundError:
        offset = 0
    proc = spawn(home)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None and not status(home):
            why = first_error(home.daemon_log, offset)
            raise MonkeyError(f"the core could not start: {why}; see {home.daemon_log}")
        if ping(home):
            return status(home) or proc.pid
        time.sleep(0.01)
    raise MonkeyError(f"the core did not come up within {timeout:.0f}s; see {home.daemon_log}")


def stop(home: Home, timeout: float = 15.0) -> int | None:
    """Ask the core to stop and wait for it; returns the pid that stopped, or None."""
    return stop_process(lambda: status(home), "the core", timeout)


def ping(home: Home) -> bool:
    """Wake the core; False when no core listens. Through ``_socket``, the C module under
    ``socket``: socket.py (which turns its constants into enums and loads selectors, select
    and array) cost each `monkey run` about 1.5 ms before its job could start."""
    from _socket import AF_UNIX, SOCK_DGRAM, socket

    sock = socket(AF_UNIX, SOCK_DGRAM)
    sock.setblocking(False)
    try:
        sock.sendto(b"w", str(home.socket_path("core")))
    except BlockingIOError:
        return True  # its queue is full of wake-ups already
    except OSError:
        return False
    finally:
        sock.close()
    return True


def wake(home: Home) -> None:
    """Wake the core; when none runs, or one of another version (see ``start``), start one
    and wait until it serves (MonkeyError with its first error when it cannot start). A
    running core of this version costs one datagram and a file read."""
    if core_version(home) != version() or not ping(home):
        start(home)


class Keeper:
    """Keeps a core serving while someone waits on its work (a follow, a wait).

    ``check`` is cheap to call often: about once a second it probes the core's lock and starts
    a core when none runs (a new core re-attaches to the live attempts), so a core that dies
    mid-wait never leaves the waiter hanging."""

    def __init__(self, home: Home, every: float = 1.0) -> None:
        self.home = home
        self.every = every
        self._next = 0.0
        self._proc: subprocess.Popen[bytes] | None = None  # the core we started, until it serves
        self._log_from = 0  # where the started core's lines begin in daemon.log

    def check(self) -> None:
        """Start a core when none serves; raise MonkeyError when the one started could not start."""
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + self.every
        if status(self.home):
            self._proc = None
            return
        if self._proc is not None:
            code = self._proc.poll()
            if code is None:
                return  # still starting
            if code > 0:
                why = first_error(self.home.daemon_log, self._log_from)
                raise MonkeyError(f"the core could not start: {why}; see {self.home.daemon_log}")
        try:
            self._log_from = self.home.daemon_log.stat().st_size
        except OSError:
            self._log_from = 0
        self._proc = spawn(self.home)
