"""The monkey worker agent: starts, watches and signals every job on one worker.

Standard library only, and nothing imported from the rest of ``monkey``: this folder is
copied alone to workers that have just a python3 (Linux, ``os.pidfd_open``).

    python -m monkey.client_agent --root ROOT --socket PATH [--idle-timeout S] [--heartbeat S]

The protocol, the run directory's files, the events and the ops are specified in
docs/agent-protocol.md.

This module is the ``Agent``'s loop (lifetime, timers, the small ops and signals) and
``main``; the class is put together from the parts of the other modules (mixins over
``state.AgentState``, which declares what they share):

    wire.py     the connections: listener, framing, requests, replies and pushes
    spawn.py    ``start``: checks, the run dir materialised, held starts, the wrapper, the spawn
    events.py   a live job's records: events, tailed metrics, heartbeats, its exit
    cloud.py    results through a bucket, spot/preemption notices
    adopt.py    ``sync``: jobs of an earlier agent adopted from their run dirs

and their helpers: rundir.py (the run directory's layout and readers, which the rest of
monkey imports too), procs.py (/proc, signals, cgroups, GPU and memory figures), blobs.py
(fetching, checking and copying blobs), orphan.py (an orphaned instance powers off),
state.py (``Job``, ``Pending``, ``Conn``), common.py. Jobs
get launcher.py, shim.py and track.py, copied alone. Every ``.py`` file here is shipped to
workers and counted in the agent's digest (``code_digest``, monkey.version.agent_files).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import queue
import resource
import selectors
import signal
import socket
import subprocess
import threading
import time

from monkey.client_agent import spawn
from monkey.client_agent.adopt import Adoption
from monkey.client_agent.cloud import PREEMPT_GRACE, PREEMPT_RESERVE, CloudSide
from monkey.client_agent.common import HERE, log, read_small, trace, write_atomic
from monkey.client_agent.events import Events
from monkey.client_agent.orphan import OrphanWatch
from monkey.client_agent.procs import (
    Cgroups,
    become_subreaper,
    boottime,
    children_of,
    detect_gpus,
    is_running,
    job_tree,
    mem_total,
    parse_signal,
    read_stat,
    signal_pids,
)
from monkey.client_agent.rundir import SIGNALLED, STARTED
from monkey.client_agent.sandbox import INNER_CMDLINE, engines_found, image_engine, is_monitor
from monkey.client_agent.sandbox import bwrap as sandbox_bwrap
from monkey.client_agent.slurm_end import log_size, slurm_ending
from monkey.client_agent.spawn import WRAPPER_CMDLINE, Spawning, install_job_code
from monkey.client_agent.state import HOLD_LIMIT, Conn, Job, Key, Pending
from monkey.client_agent.wire import Wire

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

VERSION = "1"


def code_digest() -> str:
    """Digest of this agent's source files as loaded (monkey.version.agent_digest computes
    the same from an installed copy): a core that finds another one replaces the agent."""
    h = hashlib.blake2b(digest_size=12)
    for name in sorted(n for n in os.listdir(HERE) if n.endswith(".py")):
        with open(os.path.join(HERE, name), "rb") as f:
            h.update(name.encode() + b"\0" + f.read() + b"\0")
    return h.hexdigest()


TAIL_EVERY = float(os.environ.get("MONKEY_TAIL_EVERY", "0.25"))
UNWRITTEN_EVERY = 1.0  # seconds between tries of an exit event a full disk kept out
DEFERRED_EVERY = 0.01  # seconds between checks whether a job with a held signal runs its command


# ---------------------------------------------------------------- the agent


class Agent(Wire, Spawning, Events, CloudSide, Adoption):
    """The selector loop and the request handlers."""

    def __init__(
        self,
        root: str,
        socket_path: str,
        idle_timeout: float,
        heartbeat: float,
        term_notice: float | None = None,
        slurm_log: str | None = None,
        term_kind: str = "slurm",
    ) -> None:
        self.root = root
        self.reserve = 0  # bytes set aside in private/reserve (see --reserve)
        # In a Slurm allocation: SIGTERM (a requeue, a preemption, the time limit) is a notice
        # with this many seconds before Slurm's SIGKILL; the agent stops once its jobs ended.
        self.term_notice = term_notice
        self.termed = False  # that SIGTERM came: its notice is handled before any exit
        # Whose SIGTERM it is: "slurm" (the agent stops once its jobs ended), or "kubernetes"
        # (the pod's kubelet: the agent stays until the core fetched their results).
        self.term_kind = term_kind
        # The allocation's output file, where Slurm says why it ends it (see slurm_end),
        # and its size when this agent started (what came before is an earlier run's).
        self.slurm_log = slurm_log
        self.slurm_log_from = log_size(slurm_log)
        self.socket_path = socket_path
        self.idle_timeout = idle_timeout
        self.heartbeat = heartbeat
        self.pid_path = os.path.join(root, "private", "agent.pid")
        self.sel = selectors.DefaultSelector()
        self.jobs: dict[Key, Job] = {}
        self.held: dict[Key, Pending] = {}  # starts waiting for a slot, first in first out
        self.slots = 0  # the worker's slots, as the last start that said so gave them
        self.conns: set[Conn] = set()
        self.unsent: set[Conn] = set()  # connections with output queued in this pass
        self.environ = dict(os.environ)  # jobs' base environment (os.environ decodes per read)
        self.kill_at: dict[Key, float] = {}  # SIGKILL deadlines (monotonic)
        self.deferred: dict[Key, int] = {}  # signals held until the job's command runs
        self.next_heartbeat = time.monotonic() + heartbeat
        self.next_tail = time.monotonic() + TAIL_EVERY
        self.gpu_probe: subprocess.Popen | None = None
        self.idle_since: float | None = time.monotonic()
        self.stopping = False
        self.reclaims: queue.SimpleQueue[str] | None = None  # code copies to delete
        self.gpus: list[dict[str, Any]] | None = None
        self.digest = code_digest()  # read once: the files may be replaced while it runs
        job_code = install_job_code(root, self.digest)
        self.launcher = os.path.join(job_code, "launcher.py")
        self.job_path = os.path.join(job_code, "python")
        self.listener: socket.socket | None = None
        self.socket_ino = 0
        self.cgroups = Cgroups(root)
        self.orphan = OrphanWatch()  # armed by the core on an instance monkey created
        self.orphans = False  # a child we did not start may have exited (subreaper)
        # Results through a bucket (results.py) and the metadata watcher (notice.py): their
        # threads hand outcomes to the loop through `done` and a wake-up pipe.
        self.results: dict[Key, Any] = {}
        self.exiting: set[Key] = set()  # exited, their last upload or exit record on its way
        # Ended attempts of an armed orphan watch that the core still awaits: left in the
        # bucket before the machine powers off, which it does not do without one.
        self.unfetched: dict[Key, str] = {}
        # Exits whose event a full disk kept from being written, tried again until there is
        # room (their keys are in `exiting`: a sync finds them running meanwhile).
        self.unwritten: dict[Key, tuple[Job, dict[str, Any]]] = {}
        self.next_unwritten = 0.0
        self.watcher: Any = None
        self.notice: dict[str, Any] | None = None
        self.done: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self.done_r, self.done_w = os.pipe()
        os.set_blocking(self.done_r, False)
        os.set_blocking(self.done_w, False)

    # ---- lifetime

    def serve(self) -> None:
        """Listen, loop until told to stop, then clean up (jobs keep running)."""
        self._open_listener()
        write_atomic(self.pid_path, f"{os.getpid()}\n".encode())
        self._keep_reserve()
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGTERM, self._on_stop_signal)
        signal.signal(signal.SIGINT, self._on_stop_signal)
        # a handler rather than SIG_IGN, which jobs would inherit
        signal.signal(signal.SIGHUP, lambda *_: None)
        if self.cgroups.base is None and become_subreaper():
            signal.signal(signal.SIGCHLD, self._on_child)
        self.sel.register(wake_r, selectors.EVENT_READ, lambda _m: os.read(wake_r, 512))
        self.sel.register(self.done_r, selectors.EVENT_READ, self._on_done)
        log(f"serving {self.root} on {self.socket_path}")
        try:
            while not self.stopping:
                self._loop_once()
        finally:
            self._cleanup()
            log(f"stopped; jobs left running: {len(self.jobs)}")

    def _on_stop_signal(self, signum: int, _frame: Any) -> None:
        if self.term_notice is None or signum != signal.SIGTERM or not self.jobs:
            self.stopping = True
            return
        if self.termed:  # Slurm's SIGTERM, and the batch shell's relay of it: one notice
            return
        self.termed = True
        if self.term_kind == "slurm":
            detail, cancelled = slurm_ending(self.slurm_log, self.slurm_log_from)
        else:
            detail, cancelled = f"{self.term_kind} stops this instance (SIGTERM)", False
        self.done.put(
            (
                "notice",
                {
                    "kind": self.term_kind,
                    "deadline": time.time() + self.term_notice,
                    "detail": detail,
                    **({"revoked": True} if cancelled else {}),
                },
            )
        )
        self._wake()

    def _on_child(self, signum: int, _frame: Any) -> None:
        self.orphans = True

    def _reap_orphans(self) -> None:
        """Reap the exited processes that jobs left behind and that came to us as their
        subreaper (never a job's wrapper: its exit status is read in ``_on_exit``)."""
        self.orphans = False
        ours = {job.pid for job in self.jobs.values() if job.child}
        if self.gpu_probe is not None:
            ours.add(self.gpu_probe.pid)
        for pid in children_of(os.getpid()) - ours:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass

    def _cleanup(self) -> None:
        for p in list(self.held.values()):
            self._withdraw(p, "the agent is stopping")
        self.cgroups.close({job.cgroup for job in self.jobs.values()})
        for conn in list(self.conns):
            self._flush_blocking(conn, deadline=time.monotonic() + 2)
            self._close(conn)
        try:
            if os.stat(self.socket_path).st_ino == self.socket_ino:
                os.unlink(self.socket_path)
        except OSError:
            pass
        try:
            os.unlink(self.pid_path)
        except OSError:
            pass

    def _loop_once(self) -> None:
        for key, mask in self.sel.select(self._timeout()):
            try:
                key.data(mask)
            except Exception:
                log("error in the loop:\n" + trace())
        try:
            self._run_timers()
        except Exception:
            log("error in a timer:\n" + trace())
        while self.unsent:
            conn = self.unsent.pop()
            if conn in self.conns:
                self._flush(conn)

    def _timeout(self) -> float | None:
        now, boot = time.monotonic(), boottime()
        deadlines = list(self.kill_at.values())
        deadlines += [
            now + j.limit[1] - boot for j in self.jobs.values() if j.limit and not j.timed_out
        ]
        if self.jobs:
            deadlines.append(self.next_heartbeat)
            deadlines.append(self.next_tail)
        if self.idle_since is not None and not self.orphan.armed:  # armed: it stays idle
            deadlines.append(self.idle_since + self.idle_timeout)
        orphan_at = self.orphan.deadline()
        if orphan_at is not None:
            deadlines.append(orphan_at)
        if self.held:
            deadlines.append(next(iter(self.held.values())).until)
        if self.deferred:
            deadlines.append(now + DEFERRED_EVERY)
        if self.unwritten:
            deadlines.append(self.next_unwritten)
        deadlines += [r.next_at for k, r in self.results.items() if k in self.jobs]
        if not deadlines:
            return 60.0
        return min(60.0, max(0.0, min(deadlines) - now))

    def _run_timers(self) -> None:
        now = time.monotonic()
        while (
            self.held and (p := next(iter(self.held.values()))).until <= now
        ):  # slots stayed taken
            self._withdraw(p, f"no slot freed within {HOLD_LIMIT:.0f}s")
        if self.orphans:
            self._reap_orphans()
        if self.cgroups.leftover:
            self.cgroups.tidy()
        if self.deferred:
            self._send_deferred()
        if self.unwritten and now >= self.next_unwritten:
            self.next_unwritten = now + UNWRITTEN_EVERY
            self._write_unwritten()
        for key, when in list(self.kill_at.items()):
            if when <= now:
                del self.kill_at[key]
                job = self.jobs.get(key)
                if job is not None:
                    log(f"{job.juid}/{job.attempt}: grace over, SIGKILL")
                    job.signalled = signal.SIGKILL
                    self._signal_session(job, signal.SIGKILL)
        boot = boottime()
        for job in list(self.jobs.values()):
            if job.limit and not job.timed_out and boot >= job.limit[1]:
                log(f"{job.juid}/{job.attempt}: time limit of {job.limit[0]:.0f}s reached, SIGTERM")
                job.timed_out = True
                job.signalled = signal.SIGTERM
                self.kill_at[job.key] = min(
                    now + job.limit[2], self.kill_at.get(job.key, float("inf"))
                )
                self._signal_session(job, signal.SIGTERM)
        if self.jobs and now >= self.next_tail:
            for job in list(self.jobs.values()):
                self._tail(job)
            self.next_tail = time.monotonic() + TAIL_EVERY
        if self.jobs and now >= self.next_heartbeat:
            self._heartbeats()
            self.next_heartbeat = time.monotonic() + self.heartbeat
        for key, res in list(self.results.items()):
            if key in self.jobs and self.notice is None and res.due(now):
                res.next_at = now + res.every  # due again after this one
                self._in_thread("saved", self.jobs[key], res.upload)
        self.orphan.check(bool(self.jobs or self.exiting or self.held), now, self._leave)
        if self.jobs or self.conns or self.exiting or self.held:
            self.idle_since = None
        elif self.idle_since is None:
            self.idle_since = now
        elif now - self.idle_since >= self.idle_timeout and not self.orphan.armed:  # armed: stays
            log("idle, exiting")
            self.stopping = True
        if (
            self.notice is not None
            and self.notice["kind"] == "slurm"
            and not (self.jobs or self.exiting)
        ):
            log("jobs ended after Slurm's notice, exiting")
            self.stopping = True

    # ---- requests

    def op_hello(self, req: dict[str, Any]) -> dict[str, Any]:
        if self.gpus is None:
            self.gpus = detect_gpus()
        return {
            "version": VERSION,
            "digest": self.digest,
            "code": HERE,
            "pid": os.getpid(),
            "root": self.root,
            "cpus": os.cpu_count(),
            "memory": mem_total(),
            "gpus": self.gpus,
            "sandbox": dict(zip(("bwrap", "why"), sandbox_bwrap())),
            "images": {**dict(zip(("engine", "why"), image_engine())), "found": engines_found()},
        }

    def op_ping(self, req: dict[str, Any]) -> dict[str, Any]:
        """The core's sign of life to an instance it created (see OrphanWatch)."""
        self.orphan.arm(req.get("orphan"))
        self._core_awaits(req.get("attempts"))
        return {}

    def op_jobs(self, req: dict[str, Any]) -> dict[str, Any]:
        jobs = [
            {"juid": j.juid, "attempt": j.attempt, "pid": j.pid, "run_dir": j.run_dir}
            for j in self.jobs.values()
        ]
        return {"jobs": jobs}

    def op_notice(self, req: dict[str, Any]) -> dict[str, Any]:
        """A notice from the instance's own scheduler (Slurm's signal before a time limit or
        a preemption, relayed by the batch script): handled as a preemption notice."""
        lead = float(req.get("lead", PREEMPT_GRACE + PREEMPT_RESERVE))
        self._on_notice(
            {
                "kind": str(req.get("kind") or "slurm"),
                "deadline": time.time() + lead,
                "detail": str(req.get("detail") or "notice"),
            }
        )
        return {"jobs": len(self.jobs)}

    def op_shutdown(self, req: dict[str, Any]) -> dict[str, Any]:
        stopping = not (req.get("if_idle") and (self.jobs or self.held))
        self.stopping = self.stopping or stopping
        return {"stopping": stopping}

    def op_signal(self, req: dict[str, Any]) -> dict[str, Any]:
        key = (req["juid"], req["attempt"])
        signum = parse_signal(req["signal"])
        grace = float(req.get("grace", 10))
        job = self.jobs.get(key)
        if job is None:
            if key in self.held:
                self._withdraw(self.held[key], f"signalled {req['signal']}")
            return {"running": False}
        when = time.monotonic() + max(0.0, grace)
        if signum != signal.SIGKILL and job.signalled == signum and key in self.kill_at:
            # Asked again (the core repeats a signal whose link broke): the job has it.
            self.kill_at[key] = min(when, self.kill_at[key])
            return {"running": True}
        job.signalled = signum
        if signum != signal.SIGKILL:
            self.kill_at[key] = min(when, self.kill_at.get(key, when))
        self._signal_session(job, signum)
        return {"running": True}

    def _signal_session(self, job: Job, signum: int) -> None:
        """Send SIGNUM to the job and every process it started: its cgroup's, else its
        session's, its process group's and those carrying its environment, with their
        descendants.

        A signal other than SIGKILL is held while the job's command has yet to run: the
        wrapper traps TERM/INT/HUP to outlive the job, so one sent before the command's
        exec would be taken by the wrapper (or by its fork that has not exec'd yet, which
        shares its handlers) and the job would never see it. It is sent once the command
        runs (``_send_deferred``), or dropped if the wrapper ends first."""
        if signum != signal.SIGKILL and not self._command_runs(job):
            self.deferred[job.key] = signum
            return
        self.deferred.pop(job.key, None)
        if signum != signal.SIGKILL and job.key in self.kill_at:
            self._mark_signalled(job, signum)
        done: set[int] = set()
        group = None  # the process group signalled at once
        if job.monitor and signum != signal.SIGKILL:  # all but bwrap's (see sandbox.py)
            done = {pid for pid in self._tree(job) | {job.pid} if is_monitor(pid, job.monitor)}
        elif job.child:  # our unreaped child: its pid (its group's id) cannot have been reused
            try:
                os.killpg(job.pid, signum)
                group = job.pid
                done.add(job.pid)
            except OSError:
                pass
        elif job.pidfd >= 0:
            try:
                signal.pidfd_send_signal(job.pidfd, signum)
                done.add(job.pid)
            except OSError:
                pass
        # The others, each once: a second TERM could run a job's handler twice.
        for pid in self._tree(job) - done:
            if (
                group is not None
                and (fields := read_stat(pid)) is not None
                and int(fields[2]) == group
            ):
                continue
            try:
                os.kill(pid, signum)
            except OSError:
                pass

    def _mark_signalled(self, job: Job, signum: int) -> None:
        """Record in the job's run dir, before sending it, the signal the job is about to
        get and when its grace ends, for an agent that adopts the job: it sends no second
        one, and keeps the deadline.

        Marked first, so that no agent killed in between leaves a job that got a TERM
        without the mark (an adopter would send a second one, which could run a handler
        twice or end one saving a checkpoint). An agent killed after the mark but before
        the signal leaves the opposite: a job the adopter believes signalled, which still
        ends at the deadline, by SIGKILL."""
        deadline = boottime() + self.kill_at[job.key] - time.monotonic()
        mark = {"signal": signum, "boot_deadline": deadline, "timeout": job.timed_out}
        try:
            write_atomic(os.path.join(job.run_dir, SIGNALLED), json.dumps(mark).encode())
        except OSError as e:
            log(f"cannot mark {job.run_dir} signalled: {e}")

    def _command_runs(self, job: Job) -> bool:
        """Whether a process of the job runs a program other than the wrapper: one whose
        command line is not the wrapper's (its forks show it until they exec; a command
        run with `exec` replaces the wrapper itself), or a zombie's (empty).

        The wrapper's own command line is empty for an instant too, while it still execs
        /bin/sh: posix_spawn returns once the kernel has given the child its new memory,
        before the arguments are in place in it. A signal then would take the wrapper
        before its trap (the job's command never run), so a running wrapper's empty
        command line counts as not yet."""
        for pid in self._tree(job) | {job.pid}:
            cmd = read_small(f"/proc/{pid}/cmdline")
            if cmd is None or cmd.startswith(WRAPPER_CMDLINE):
                continue
            if job.monitor and (
                cmd.startswith(INNER_CMDLINE) or cmd.startswith(job.monitor.encode() + b"\0")
            ):
                continue  # the sandbox, its job yet to exec
            if cmd or pid != job.pid or not is_running(read_stat(pid)):
                return True
        return False

    def _send_deferred(self) -> None:
        """Send the held signals of jobs whose command now runs."""
        for key, signum in list(self.deferred.items()):
            job = self.jobs.get(key)
            if job is None:
                del self.deferred[key]
            elif self._command_runs(job):
                self._signal_session(job, signum)

    def _tree(self, job: Job) -> set[int]:
        """Every process of the job still around."""
        if job.cgroup:
            return Cgroups.pids(job.cgroup)
        tag = f"MONKEY_STARTED_FILE={os.path.join(job.run_dir, STARTED)}".encode()
        # An adopted job's wrapper was reaped by someone else: its pid may name a stranger.
        sid = job.pid if job.child or job.pidfd >= 0 else None
        return job_tree(sid, tag, set())

    def _end_tree(self, job: Job) -> None:
        """SIGKILL whatever is left of a job that ended, remove its engine's container (a
        launcher killed leaves it running), and release its cgroup."""
        if job.container:  # in a thread: the engine's answer never holds this loop
            threading.Thread(
                target=subprocess.run,
                args=(job.container,),
                kwargs={"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL},
                daemon=True,
                name="container-rm",
            ).start()
        if job.child:  # the wrapper's zombie keeps the group id ours
            try:
                os.killpg(job.pid, signal.SIGKILL)
            except OSError:
                pass
        if job.cgroup:
            self.cgroups.release(job.cgroup)
            return
        signal_pids(self._tree(job), signal.SIGKILL)
        if not self.jobs:  # orphans that came to us (subreaper) and kept no trace of a job
            strays = children_of(os.getpid())
            strays.discard(self.gpu_probe.pid if self.gpu_probe is not None else -1)
            strays.discard(job.pid)
            signal_pids(job_tree(None, None, strays), signal.SIGKILL)


def keep_fds_private() -> None:
    """Make the descriptors this process was started with (beyond 0-2) close on exec, so
    that no job inherits them (jobs are spawned without closing every descriptor)."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2:
            try:
                os.set_inheritable(fd, False)
            except OSError:
                pass  # the listing's own descriptor, closed by now


# ---------------------------------------------------------------- main


def raise_fd_limit() -> None:
    """Allow one pidfd per live job: lift the soft limit of open files to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            pass


def lock_root(root: str) -> int | None:
    """The fd holding ROOT/private/agent.lock, or None when another agent holds it."""
    private = os.path.join(root, "private")
    os.makedirs(root, 0o700, exist_ok=True)
    try:
        os.mkdir(private, 0o700)
    except FileExistsError:
        pass
    fd = os.open(os.path.join(private, "agent.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def main(argv: list[str] | None = None) -> int:
    """Entry point: parse arguments, take the root's lock, serve."""
    parser = argparse.ArgumentParser(prog="monkey.client_agent", description="monkey worker agent")
    parser.add_argument("--root", required=True, help="the worker's monkey folder")
    parser.add_argument("--socket", required=True, help="Unix socket path to listen on")
    parser.add_argument("--idle-timeout", type=float, default=600.0)
    parser.add_argument("--heartbeat", type=float, default=5.0)
    parser.add_argument(
        "--reserve",
        type=int,
        default=0,
        metavar="BYTES",
        help="space kept aside to record exits when the disk fills up",
    )
    parser.add_argument(
        "--term-notice",
        type=float,
        metavar="SECONDS",
        help="SIGTERM is a preemption notice SECONDS before a SIGKILL (Slurm)",
    )
    parser.add_argument(
        "--term-kind",
        default="slurm",
        help="whose SIGTERM --term-notice is: slurm (stop once the jobs ended) or kubernetes",
    )
    parser.add_argument(
        "--slurm-log",
        metavar="PATH",
        help="the allocation's output file, where Slurm says why it ends it (a cancel or not)",
    )
    args = parser.parse_args(argv)
    # Run folders, blobs, logs and checkpoints are the user's alone; a job gets the umask of
    # whoever started the agent (the login's, passed on by the SSH relay), as without monkey.
    spawn.JOB_UMASK = os.umask(0o077)
    with contextlib.suppress(KeyError, ValueError):
        spawn.JOB_UMASK = int(os.environ["MONKEY_JOB_UMASK"], 8) & 0o777
    root = os.path.abspath(args.root)
    lock_fd = lock_root(root)
    if lock_fd is None:
        return 0
    raise_fd_limit()
    keep_fds_private()
    agent = Agent(
        root,
        os.path.abspath(args.socket),
        args.idle_timeout,
        max(0.05, args.heartbeat),
        args.term_notice,
        args.slurm_log,
        args.term_kind,
    )
    agent.reserve = max(0, args.reserve)
    agent.serve()
    os.close(lock_fd)
    return 0
