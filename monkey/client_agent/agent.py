"""The monkey worker agent: starts, watches and signals every job on one worker.

Standard library only, and nothing imported from the rest of ``monkey``: this folder is
copied alone to workers that have just a python3 (Linux, ``os.pidfd_open``).

    python -m monkey.client_agent --root ROOT --socket PATH [--idle-timeout S] [--heartbeat S]

The protocol, the run directory's files, the events and the ops are specified in
docs/agent-protocol.md.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
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
import time
import traceback
from collections.abc import Callable
from typing import Any

from monkey.client_agent import spawn
from monkey.client_agent.common import (
    HERE,
    RequestError,
    encode,
    log,
    one_line,
    read_small,
    write_atomic,
)
from monkey.client_agent.procs import (
    CLK_TCK,
    PAGE_SIZE,
    Cgroups,
    become_subreaper,
    boottime,
    children_of,
    detect_gpus,
    environ_lines,
    free_bytes,
    gpu_usage_probe,
    is_running,
    job_tree,
    mem_total,
    parse_gpu_usage,
    parse_signal,
    proc_pids,
    read_stat,
    session_usage,
    signal_pids,
    stat_start_ticks,
)
from monkey.client_agent.rundir import (
    ABANDONED,
    ABANDONED_CLAIM,
    CODE_RECORD,
    EVENTS,
    METRICS,
    OLD_PID,
    ORDER,
    PREEMPTED,
    RESULTS,
    RESULTS_SEQ,
    SETUP_FAILED,
    SIGNALLED,
    STARTED,
    STDERR,
    STDOUT,
    first_event,
    last_event,
    read_claim,
    read_exit_code,
    read_lines_after,
    read_new,
    reclaim_code,
    recorded_exit,
    scrape,
    tail_offsets,
)
from monkey.client_agent.spawn import WRAPPER_CMDLINE, Spawning, install_job_code
from monkey.client_agent.state import HOLD_LIMIT, Job, Key, Pending
from monkey.client_agent.wire import Conn, Wire

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
TAIL_BUDGET = 64 << 20  # bytes one job may ship per tail pass (keeps the loop responsive)
DEFERRED_EVERY = 0.01  # seconds between checks whether a job with a held signal runs its command
PREEMPT_GRACE = float(os.environ.get("MONKEY_PREEMPT_GRACE", "20"))  # SIGTERM to SIGKILL
PREEMPT_RESERVE = 5.0  # seconds kept before a notice's deadline for the last uploads
# How an orphaned cloud instance powers itself off (its cloud then terminates it).
DEFAULT_SHUTDOWN = "sudo -n shutdown -h now || shutdown -h now || poweroff"
SHUTDOWN_RETRY = 300.0  # seconds before a shutdown that left the machine up is tried again

# An agent started with --reserve keeps that much space aside under its root
# (private/reserve), given up when an event cannot be written for a full disk: a job that
# filled the disk of a host still has its exit recorded.
NEARLY_FULL = 1 << 20  # free bytes below which a failed job's note says its disk is full


def _reclaimer(runs: queue.SimpleQueue[str]) -> None:
    """The reclaiming thread: the code copies of ended attempts, one after another."""
    while True:
        reclaim_code(runs.get())


# ---------------------------------------------------------------- the agent


class Agent(Wire, Spawning):
    """The selector loop and the request handlers."""

    def __init__(self, root: str, socket_path: str, idle_timeout: float, heartbeat: float,
                 term_notice: float | None = None) -> None:
        self.root = root
        self.reserve = 0  # bytes set aside in private/reserve (see --reserve)
        # In a Slurm allocation: SIGTERM (a requeue, a preemption, the time limit) is a notice
        # with this many seconds before Slurm's SIGKILL; the agent stops once its jobs ended.
        self.term_notice = term_notice
        self.termed = False  # that SIGTERM came: its notice is handled before any exit
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
        self.exiting: set[Key] = set()  # exited, their last upload on its way
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
        self.termed = True
        self.done.put(("notice", {"kind": "slurm", "deadline": time.time() + self.term_notice,
                                  "detail": "Slurm is ending the allocation (requeue, "
                                            "preemption or time limit)"}))  # fmt: skip
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
                log("error in the loop:\n" + traceback.format_exc())
        try:
            self._run_timers()
        except Exception:
            log("error in a timer:\n" + traceback.format_exc())
        while self.unsent:
            conn = self.unsent.pop()
            if conn in self.conns:
                self._flush(conn)

    def _timeout(self) -> float | None:
        now = time.monotonic()
        deadlines = list(self.kill_at.values())
        deadlines += [now + j.limit[1] - time.time() for j in self.jobs.values()
                      if j.limit and not j.timed_out]  # fmt: skip
        if self.jobs:
            deadlines.append(self.next_heartbeat)
            deadlines.append(self.next_tail)
        if self.idle_since is not None:
            deadlines.append(self.idle_since + self.idle_timeout)
        if self.orphan.deadline() is not None:
            deadlines.append(self.orphan.deadline())
        if self.held:
            deadlines.append(next(iter(self.held.values())).until)
        if self.deferred:
            deadlines.append(now + DEFERRED_EVERY)
        deadlines += [r.next_at for k, r in self.results.items() if k in self.jobs]
        if not deadlines:
            return 60.0
        return min(60.0, max(0.0, min(deadlines) - now))

    def _run_timers(self) -> None:
        now = time.monotonic()
        while self.held and (p := next(iter(self.held.values()))).until <= now:  # slots stayed taken
            self._withdraw(p, f"no slot freed within {HOLD_LIMIT:.0f}s")
        if self.orphans:
            self._reap_orphans()
        if self.cgroups.leftover:
            self.cgroups.tidy()
        if self.deferred:
            self._send_deferred()
        for key, when in list(self.kill_at.items()):
            if when <= now:
                del self.kill_at[key]
                job = self.jobs.get(key)
                if job is not None:
                    log(f"{job.juid}/{job.attempt}: grace over, SIGKILL")
                    job.signalled = signal.SIGKILL
                    self._signal_session(job, signal.SIGKILL)
        for job in list(self.jobs.values()):
            if job.limit and not job.timed_out and time.time() >= job.limit[1]:
                log(f"{job.juid}/{job.attempt}: time limit of {job.limit[0]:.0f}s reached, SIGTERM")
                job.timed_out = True
                job.signalled = signal.SIGTERM
                self.kill_at[job.key] = min(now + job.limit[2], self.kill_at.get(job.key, float("inf")))
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
        self.orphan.check(bool(self.jobs or self.exiting or self.held), now)
        if self.jobs or self.conns or self.exiting or self.held:
            self.idle_since = None
        elif self.idle_since is None:
            self.idle_since = now
        elif now - self.idle_since >= self.idle_timeout and not self.orphan.armed:  # armed: stays
            log("idle, exiting")
            self.stopping = True
        if self.notice is not None and self.notice["kind"] == "slurm" and not (self.jobs or self.exiting):
            log("jobs ended after Slurm's notice, exiting")
            self.stopping = True


    # ---- requests


    def op_hello(self, req: dict[str, Any]) -> dict[str, Any]:
        if self.gpus is None:
            self.gpus = detect_gpus()
        return {
            "version": VERSION, "digest": self.digest, "code": HERE, "pid": os.getpid(),
            "root": self.root,
            "cpus": os.cpu_count(), "memory": mem_total(), "gpus": self.gpus,
        }  # fmt: skip

    def op_ping(self, req: dict[str, Any]) -> dict[str, Any]:
        """The core's sign of life to an instance it created (see OrphanWatch)."""
        self.orphan.arm(req.get("orphan"))
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
        self._on_notice({"kind": str(req.get("kind") or "slurm"), "deadline": time.time() + lead,
                         "detail": str(req.get("detail") or "notice")})  # fmt: skip
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
        done: set[int] = set()
        group = None  # the process group signalled at once
        if job.child:  # our unreaped child: its pid (its group's id) cannot have been reused
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
            if group is not None and (fields := read_stat(pid)) is not None and int(fields[2]) == group:
                continue
            try:
                os.kill(pid, signum)
            except OSError:
                pass
        if signum != signal.SIGKILL and job.key in self.kill_at:
            # For an agent that adopts the job: it has the signal, and when the grace ends.
            deadline = time.time() + self.kill_at[job.key] - time.monotonic()
            mark = {"signal": signum, "deadline": deadline, "timeout": job.timed_out}
            try:
                write_atomic(os.path.join(job.run_dir, SIGNALLED), json.dumps(mark).encode())
            except OSError as e:
                log(f"cannot mark {job.run_dir} signalled: {e}")

    def _command_runs(self, job: Job) -> bool:
        """Whether a process of the job runs a program other than the wrapper: one whose
        command line is not the wrapper's (its forks show it until they exec; a command
        run with `exec` replaces the wrapper itself), or a zombie's (empty)."""
        for pid in self._tree(job) | {job.pid}:
            cmd = read_small(f"/proc/{pid}/cmdline")
            if cmd is not None and not cmd.startswith(WRAPPER_CMDLINE):
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
        """SIGKILL whatever is left of a job that ended, and release its cgroup."""
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

    # ---- start


    def _results(self, cfg: Any, juid: str, attempt: int, run_dir: str, work: str) -> Any:
        """The attempt's uploads (``results`` of a start), its kept folders restored first
        from the last manifest; None without a bucket."""
        if not cfg:
            return None
        from monkey.client_agent.results import Results

        if not isinstance(cfg, dict) or not isinstance(cfg.get("url"), str):
            raise RequestError("results must be {url, fields, prefix, every, dirs, outputs, restore}")
        try:
            results = Results(cfg, juid, attempt, work, os.path.join(run_dir, RESULTS_SEQ))
            fetched = results.restore(cfg.get("restore"))
        except (OSError, ValueError, TypeError) as e:
            raise RequestError(f"restoring the checkpoint of {juid} failed: {one_line(e)}") from None
        if fetched:
            log(f"{juid}/{attempt}: restored {fetched} bytes of checkpoint and persisted folders")
        return results

    @staticmethod
    def _keep_results(run_dir: str, cfg: dict[str, Any], work: str) -> None:
        """Keep the attempt's upload settings in RUN_DIR (``RESULTS``, 0600: the form is a
        presigned policy), so that an agent that adopts the job keeps uploading it."""
        kept = {k: v for k, v in cfg.items() if k != "restore"}
        try:
            write_atomic(os.path.join(run_dir, RESULTS), json.dumps({**kept, "work": work}).encode())
        except OSError as e:
            raise RequestError(f"cannot keep the upload settings in {run_dir}: {e}") from None

    def _adopted_results(self, job: Job) -> None:
        """The upload settings an earlier agent kept for an adopted JOB, if any."""
        from monkey.client_agent.results import Results

        try:
            with open(os.path.join(job.run_dir, RESULTS), "rb") as f:
                cfg = json.loads(f.read())
            results = Results(cfg, job.juid, job.attempt, str(cfg.get("work") or ""),
                              os.path.join(job.run_dir, RESULTS_SEQ))  # fmt: skip
        except FileNotFoundError:
            return
        except (OSError, ValueError, TypeError, KeyError) as e:
            log(f"{job.juid}/{job.attempt}: its upload settings cannot be read: {one_line(e)}")
            return
        results.next_at = 0.0  # the earlier agent's uploads may have stopped a while ago
        self.results[job.key] = results

    # ---- notices and uploads

    def _watch(self, cfg: Any) -> None:
        """Watch the instance's metadata as ``watch`` ({kind: ec2|gce, url, every}) says,
        once (a start or a sync may carry it)."""
        if not cfg or self.watcher is not None:
            return
        from monkey.client_agent.notice import Watcher

        def on_notice(info: dict[str, Any]) -> None:
            self.done.put(("notice", info))
            self._wake()

        try:
            self.watcher = Watcher(str(cfg["kind"]), str(cfg["url"]), on_notice,
                                   float(cfg.get("every", 1.0)))  # fmt: skip
        except (KeyError, ValueError, TypeError) as e:
            raise RequestError(f"bad watch {cfg!r}: {one_line(e)}") from None
        log(f"watching {cfg['kind']} metadata at {cfg['url']} for notices")

    def _wake(self) -> None:
        try:
            os.write(self.done_w, b"x")
        except (BlockingIOError, OSError):
            pass

    def _in_thread(self, what: str, job: Job, call: Callable[[], Any]) -> None:
        """Run CALL (an upload) in a thread; its outcome comes back to the loop as WHAT."""
        import threading

        def run() -> None:
            try:
                outcome = call()
            except Exception as e:  # a bucket that refuses, a network error
                outcome = {"error": one_line(e)}
            self.done.put((what, (job, outcome)))
            self._wake()

        threading.Thread(target=run, daemon=True, name=f"upload-{job.juid}").start()

    def _on_done(self, _mask: int) -> None:
        try:
            while os.read(self.done_r, 512):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        while True:
            try:
                what, value = self.done.get_nowait()
            except queue.Empty:
                return
            if what == "notice":
                self._on_notice(value)
            elif what == "saved":
                job, saved = value
                if "error" in saved:
                    log(f"{job.juid}/{job.attempt}: checkpoint upload failed: {saved['error']}")
                if job.key in self.jobs:
                    self._append(job, "saved", **saved)
            elif what == "exit":
                job, (fields, saved) = value
                self.exiting.discard(job.key)
                self.results.pop(job.key, None)
                self._append(job, "exit", **fields, saved=saved)

    def _on_notice(self, info: dict[str, Any]) -> None:
        """A notice: tell the core; on a spot interruption or a preemption stop every job
        (SIGTERM, SIGKILL after the grace, capped below the deadline), each to be
        reported ``preempted`` once its checkpoint is uploaded. A rebalance recommendation
        only uploads checkpoints now."""
        log(f"notice: {info['kind']}: {info['detail']}")
        push = encode({"push": "notice", **info})
        for conn in list(self.conns):
            if conn.subscribed:
                self._send(conn, push)
        if info["kind"] == "rebalance":
            for res in self.results.values():
                res.next_at = 0.0
            return
        if self.notice is not None:
            return
        self.notice = info
        for p in list(self.held.values()):
            self._withdraw(p, "this instance is being preempted")
        grace = min(PREEMPT_GRACE, max(0.0, info["deadline"] - time.time() - PREEMPT_RESERVE))
        for job in list(self.jobs.values()):
            self._append(job, "preempt-notice", deadline=info["deadline"], kind=info["kind"],
                         detail=info["detail"])  # fmt: skip
            try:
                write_atomic(os.path.join(job.run_dir, PREEMPTED), b"1\n")
            except OSError as e:
                log(f"cannot mark {job.run_dir} preempted: {e}")
            job.preempted = True
            job.signalled = signal.SIGTERM
            self.kill_at[job.key] = time.monotonic() + grace
            self._signal_session(job, signal.SIGTERM)


    # ---- events

    def _reclaim(self, run_dir: str) -> None:
        """Have the attempt's code copy deleted by the reclaiming thread (started once)."""
        if not os.path.exists(os.path.join(run_dir, CODE_RECORD)):
            return
        if self.reclaims is None:
            import threading

            self.reclaims = queue.SimpleQueue()
            threading.Thread(target=_reclaimer, args=(self.reclaims,), daemon=True,
                             name="reclaim").start()  # fmt: skip
        self.reclaims.put(run_dir)

    def _append(self, job: Job, etype: str, strict: bool = False, **fields: Any) -> None:
        """Append one event line to the job's events.jsonl and push it to subscribers.

        A failed write is logged and skipped (an exit is found again on the next sync), or
        raised when STRICT.
        """
        event = {"seq": job.seq + 1, "ts": time.time(), "type": etype, **fields}
        line = encode(event)
        try:
            fd = os.open(
                job.events_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600
            )
            try:
                written = os.write(fd, line)
                if written != len(line):
                    log(f"{job.events_path}: short write {written}/{len(line)}")
                    os.write(fd, line[written:])
                offset = os.lseek(fd, 0, os.SEEK_CUR)
            finally:
                os.close(fd)
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT) and self._spend_reserve():
                self._append(job, etype, strict, **fields)
                return
            if strict:
                raise
            log(f"cannot append a {etype} event for {job.juid}/{job.attempt}: {e}")
            return
        job.seq += 1
        if etype == "exit":  # the code copy is not needed any more: reclaimed off the loop
            self._reclaim(job.run_dir)
        push = b"%s%d,\"event\":%s}\n" % (job.push_head, offset, line[:-1])  # the line as encoded
        for conn in list(self.conns):
            if conn.subscribed:
                self._send(conn, push)

    def _tail(self, job: Job, final: bool = False) -> None:
        """Ship new metrics.jsonl lines and scraped stdout lines as metrics events (a file
        is read only when its size, taken once per pass, shows it grew)."""
        out_size = self._mark_order(job)
        metrics = job.prefix + METRICS
        try:
            log_size = os.stat(metrics).st_size
        except FileNotFoundError:
            log_size = 0
        shipped = 0
        while shipped < TAIL_BUDGET or final:
            log_end, lines = job.tail[0], b""
            if log_size > log_end:
                log_end, lines = read_new(metrics, log_end, final)
            out_end, out = job.tail[1], b""
            if out_size is None or out_size > out_end:
                out_end, out = read_new(job.prefix + STDOUT, out_end, final)
            if not lines and not out:
                return
            scraped = scrape(out)
            if lines or scraped:
                seq = job.seq
                self._append(job, "metrics", log=[job.tail[0], log_end], out=[job.tail[1], out_end],
                             lines=lines.decode(errors="replace"),
                             stdout=scraped.decode(errors="replace"))  # fmt: skip
                if job.seq == seq:  # not written: try again on the next pass
                    return
            # Output with nothing to scrape needs no event: a re-scan finds nothing either.
            job.tail = [log_end, out_end]
            shipped += len(lines) + len(out)

    @staticmethod
    def _mark_order(job: Job) -> int | None:
        """Append the logs' sizes to output.order when either grew since the last mark; the
        size of stdout.log (None when unknown)."""
        try:
            sizes = (os.stat(job.prefix + STDOUT).st_size,
                     os.stat(job.prefix + STDERR).st_size)
        except OSError:
            return None
        if sizes != job.order:
            try:
                with open(job.prefix + ORDER, "a") as fh:
                    fh.write(f"{sizes[0]} {sizes[1]}\n")
            except OSError as e:
                log(f"cannot mark the output order of {job.juid}/{job.attempt}: {e}")
                return sizes[0]
            job.order = sizes
        return sizes[0]

    def _gpu_usage(self) -> dict[str, dict[str, float]]:
        """GPU usage read by the previous heartbeat's nvidia-smi; starts the next one."""
        usage: dict[str, dict[str, float]] = {}
        probe = self.gpu_probe
        if probe is not None and probe.poll() is not None:
            assert probe.stdout is not None
            usage = parse_gpu_usage(probe.stdout.read())
            probe.stdout.close()
            probe = None
        if probe is None:
            if self.gpus is None:
                self.gpus = detect_gpus()
            probe = gpu_usage_probe() if self.gpus else None
        self.gpu_probe = probe
        return usage

    def _heartbeats(self) -> None:
        gpu_usage = self._gpu_usage()
        usage = session_usage({job.pid for job in self.jobs.values()})
        now = boottime()
        for job in list(self.jobs.values()):
            ticks, rss, procs = usage.get(job.pid, (0, 0, 0))
            prev_ticks, prev_time = job.cpu_prev
            elapsed = now - prev_time
            cpu = 100.0 * max(0, ticks - prev_ticks) / CLK_TCK / elapsed if elapsed > 0 else 0.0
            job.cpu_prev = (max(ticks, prev_ticks), now)
            extra: dict[str, Any] = {}
            if gpu_usage:
                extra["gpus"] = [{"index": int(g), **gpu_usage[g]} for g in job.gpus
                                 if g in gpu_usage and g.isdigit()]  # fmt: skip
            self._append(job, "heartbeat", cpu=round(cpu, 1), rss=rss * PAGE_SIZE, procs=procs,
                         **extra)

    def _on_exit(self, job: Job, _mask: int) -> None:
        """The job's wrapper exited: reap, clean its group, record the exit event."""
        if self.termed and self.notice is None:  # Slurm signalled the job and us at once
            self._on_done(0)
        self.sel.unregister(job.pidfd)
        self.jobs.pop(job.key, None)
        self.kill_at.pop(job.key, None)
        ended = time.time()  # the exit's time, not its record's
        # The slot is free: a held start waits for none of the records, nor for the
        # clean-up when the job's leftovers are in its cgroup. Without one, the sweep for
        # its leftovers must come first: it takes the agent's children for strays only
        # while no other job runs.
        if job.cgroup:
            self._start_held()
        # Leftovers, before reaping: the wrapper's zombie keeps its pid (the session and
        # group id) from being reused meanwhile.
        self._end_tree(job)
        returncode = os.waitstatus_to_exitcode(os.waitpid(job.pid, 0)[1]) if job.child else None
        os.close(job.pidfd)
        if not job.cgroup:
            self._start_held()
        self._tail(job, final=True)
        # A wrapper that exited by itself exited with the code it wrote in the exit file.
        code = returncode
        if code is None or code < 0:
            code = read_exit_code(job.run_dir)
        self._report_exit(job, self._exit_fields(job, code, returncode, ended))

    def _reserve_path(self) -> str:
        return os.path.join(self.root, "private", "reserve")

    def _keep_reserve(self) -> None:
        """Set the reserve aside, unless it is already (or the disk is full, or it is 0)."""
        path = self._reserve_path()
        if not self.reserve or os.path.exists(path):
            return
        try:
            write_atomic(path, bytes(self.reserve))
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(f"{path}.tmp")

    def _spend_reserve(self) -> bool:
        """Give the reserve back to the disk; whether there was one."""
        try:
            os.unlink(self._reserve_path())
        except OSError:
            return False
        log("the disk is full: gave up the reserved space to record a job's events")
        return True

    def _exit_fields(self, job: Job, code: int | None, returncode: int | None,
                     ended: float | None) -> dict[str, Any]:  # fmt: skip
        """The fields of JOB's exit event (TS: when it ended, None when unknown); a failed
        job whose run folder is on a (nearly) full disk says so (``disk``)."""
        fields = exit_fields(job, code, returncode)
        if fields.get("code") != 0:
            free = free_bytes(job.run_dir)
            if 0 <= free < NEARLY_FULL:
                fields["disk"] = {"path": job.run_dir, "free": free}
        if ended is not None:
            fields["ts"] = ended
        if job.timed_out and job.limit:
            fields.update(reason="timeout", limit=job.limit[0])
        elif job.preempted:
            fields["reason"] = PREEMPTED
            if self.notice is not None:
                fields["detail"] = self.notice["detail"]
        return fields

    def _report_exit(self, job: Job, fields: dict[str, Any]) -> bool:
        """Record JOB's exit; with uploads (``results``), once the last one is done, in a
        thread: the core then finds in the bucket what the next attempt restores. Whether
        the exit waits for that upload."""
        results = self.results.get(job.key)
        if results is None:
            self._append(job, "exit", **fields)
            return False
        self.exiting.add(job.key)

        def last_upload() -> tuple[dict[str, Any], dict[str, Any]]:
            try:
                return fields, results.upload(final=True)
            except Exception as e:  # reported with the exit: the core keeps what it has
                return fields, {"error": one_line(e)}

        self._in_thread("exit", job, last_upload)
        return True

    # ---- sync and adoption

    def op_sync(self, req: dict[str, Any], backlog: list[bytes]) -> dict[str, Any]:
        self._watch(req.get("watch"))
        self.orphan.arm(req.get("orphan"))
        statuses = []
        for item in req.get("attempts") or []:
            juid, attempt, run_dir = item["juid"], item["attempt"], item["run_dir"]
            offset = int(item.get("offset") or 0)
            if not isinstance(run_dir, str) or not os.path.isabs(run_dir):
                raise RequestError(f"run_dir must be an absolute path: {run_dir!r}")
            try:
                status = self._adopt(juid, attempt, run_dir)
            except Exception as e:
                log(f"adopting {run_dir} failed:\n{traceback.format_exc()}")
                statuses.append({"juid": juid, "attempt": attempt, "status": "unknown",
                                 "error": one_line(e)})  # fmt: skip
                continue
            statuses.append({"juid": juid, "attempt": attempt, "status": status})
            job = self.jobs.get((juid, attempt))
            events = os.path.join(job.run_dir if job else run_dir, EVENTS)
            for end, line in read_lines_after(events, offset):
                try:
                    event = json.loads(line)
                except ValueError:
                    log(f"{events}: bad line at {end - len(line) - 1}")
                    continue
                backlog.append(encode({
                    "push": "event", "juid": juid, "attempt": attempt,
                    "offset": end, "event": event,
                }))  # fmt: skip
        return {"attempts": statuses}

    def _adopt(self, juid: str, attempt: int, run_dir: str) -> str:
        """Status of an attempt, tracking it again or recording its exit when needed."""
        if (juid, attempt) in self.jobs or (juid, attempt) in self.exiting:
            return "running"
        if (juid, attempt) in self.held:  # a client that syncs starts it again itself
            self._withdraw(self.held[(juid, attempt)], "a sync named it")
        last = last_event(os.path.join(run_dir, EVENTS))
        if last is not None and last.get("type") == "exit":
            return "exited"
        record = first_event(os.path.join(run_dir, EVENTS))
        # A whole started event has a cgroup ("" for none); those of agents before the
        # `pid` file went had only the pid.
        if record is None or record.get("type") != "started" or "cgroup" not in record:
            try:  # an earlier agent's record
                with open(os.path.join(run_dir, OLD_PID), "rb") as f:
                    record = json.loads(f.read())
            except (FileNotFoundError, ValueError):  # none, or torn by an agent killed writing it
                record = self._claimed(run_dir)
                if record is None:
                    return "unknown"
        pid, start_ticks = int(record["pid"]), record.get("start_ticks")
        seq = last["seq"] if last else 0
        # A wrapper that wrote its exit code is over, whatever now holds its pid.
        found = recorded_exit(run_dir)
        alive = None if found else self._open_if_alive(pid, start_ticks, os.path.join(run_dir, STARTED))
        job = Job(juid, attempt, run_dir, pid, -1, False, seq, alive[1] if alive else 0.0)
        job.gpus = [g for g in str(record.get("gpus") or "").split(",") if g]
        job.cgroup = str(record.get("cgroup") or "")
        job.limit = record.get("limit")
        job.cpus = int(record.get("cpus") or 1)
        job.tail = tail_offsets(job.events_path)
        if seq == 0:
            self._append(job, "started", **{k: v for k, v in record.items() if k != "type"})
        job.preempted = os.path.exists(os.path.join(run_dir, PREEMPTED))
        self._signalled_before(job, alive is not None)
        self._adopted_results(job)
        if alive is not None:
            job.pidfd = alive[0]
            self._track(job)
            log(f"{juid}/{attempt}: adopted pid {pid}")
            return "running"
        self._end_tree(job)
        self._tail(job, final=True)
        found = found or recorded_exit(run_dir)
        try:  # it ended while no agent watched: when the wrapper wrote its exit code
            ended = os.stat(found[0]).st_mtime if found else None
        except OSError:
            ended = None
        # Its last upload too (a checkpoint saved as it ended), before the exit is told.
        fields = self._exit_fields(job, found[1] if found else None, None, ended)
        return "running" if self._report_exit(job, fields) else "exited"

    def _signalled_before(self, job: Job, alive: bool) -> None:
        """Take over the signal an earlier agent sent an adopted job, and (when ALIVE) its
        SIGKILL deadline: a repeated request is then no second signal, and the grace still
        ends."""
        try:
            with open(os.path.join(job.run_dir, SIGNALLED), "rb") as f:
                mark = json.loads(f.read())
            signum, deadline = int(mark["signal"]), float(mark["deadline"])
        except (OSError, ValueError, KeyError, TypeError):
            return
        job.signalled = signum
        job.timed_out = bool(mark.get("timeout"))
        if alive:
            self.kill_at[job.key] = time.monotonic() + max(0.0, deadline - time.time())

    @staticmethod
    def _claimed(run_dir: str) -> dict[str, Any] | None:
        """The started record of a job whose wrapper claimed RUN_DIR but whose agent died
        before recording it; None when it never started. In that case RUN_DIR is claimed
        "abandoned" first (O_EXCL, as the wrapper does), so that a wrapper or a `start`
        still on its way (from an agent or a core that died) can never run it later."""
        os.makedirs(run_dir, exist_ok=True)
        path = os.path.join(run_dir, STARTED)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            pass
        else:
            try:
                os.write(fd, ABANDONED_CLAIM)
            finally:
                os.close(fd)
            return None
        if os.path.exists(os.path.join(run_dir, ABANDONED)):
            return None
        claim = read_claim(run_dir)
        if claim == ABANDONED_CLAIM:
            return None
        tag = f"MONKEY_STARTED_FILE={path}".encode()
        try:
            pid = int((claim or b"").split(b"\n")[0])
        except ValueError:
            # Created, not written: by a wrapper that is writing its pid now (the job runs
            # only after), or by one or a sync killed in between. Nothing ran unless a live
            # process holds the claim; none can make it later (it exists): abandon it.
            holder = next((p for p in proc_pids() if tag in environ_lines(p)), 0)
            if not holder:
                with open(path, "ab") as f:
                    f.write(ABANDONED_CLAIM)
                return None
            claim = read_claim(run_dir) or b""
            pid = int(claim.split(b"\n")[0]) if claim[:1].isdigit() else holder
        env = environ_lines(pid)
        record: dict[str, Any] = {"pid": pid, "cgroup": ""}
        if tag in env:  # else gone: its code tells how it ended
            values = dict(line.partition(b"=")[::2] for line in env)
            record.update(gpus=values.get(b"CUDA_VISIBLE_DEVICES", b"").decode(),
                          cgroup=values.get(b"MONKEY_CGROUP", b"").decode())  # fmt: skip
        return record

    @staticmethod
    def _open_if_alive(pid: int, start_ticks: int | None, claim: str) -> tuple[int, float] | None:
        """(a pidfd, its start as boot time) for PID when it is still running and still the
        job's wrapper: START_TICKS are its start time when known, else its environment
        names CLAIM."""
        if pid <= 0:
            return None
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            return None
        # Read after pidfd_open: the pidfd is for the process checked.
        fields = read_stat(pid)
        if is_running(fields) and (
            stat_start_ticks(fields) == start_ticks if start_ticks is not None
            else f"MONKEY_STARTED_FILE={claim}".encode() in environ_lines(pid)
        ):
            return pidfd, stat_start_ticks(fields) / CLK_TCK
        os.close(pidfd)
        return None


class OrphanWatch:
    """Powers off a cloud instance monkey created once it is orphaned: no job and no request
    from its core for ``timeout`` seconds (the core's laptop sleeps, its main node died), so
    that it stops billing (EC2 terminates it: it was launched with shutdown behaviour
    ``terminate``; GCE stops it, and the core deletes it when it comes back).

    Only the core arms it, in a sync, start or ping carrying ``orphan: {timeout, command}``,
    and only for instances it created: an agent on this machine, an SSH host or a Slurm
    node is never armed and never shuts anything down."""

    def __init__(self) -> None:
        self.timeout = 0.0  # 0: not armed
        self.command = DEFAULT_SHUTDOWN
        self.contact = time.monotonic()  # the core's last request
        self.idle_since: float | None = time.monotonic()  # no job since (None: one runs)
        self.tried_at: float | None = None  # the last shutdown tried (monotonic)

    @property
    def armed(self) -> bool:
        return self.timeout > 0

    def arm(self, spec: Any) -> None:
        """Take the core's ``orphan`` field (None: leave things as they are)."""
        if spec is None:
            return
        if not isinstance(spec, dict):
            raise RequestError("orphan must be an object {timeout, command}")
        timeout, command = spec.get("timeout"), spec.get("command") or DEFAULT_SHUTDOWN
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0:
            raise RequestError(f"orphan timeout must be a number of seconds, got {timeout!r}")
        if not isinstance(command, str):
            raise RequestError("orphan command must be a shell command line")
        if (float(timeout), command) != (self.timeout, self.command):
            log(f"orphan watch: powering the machine off after {timeout:g}s with no job and no "
                f"request from the core ({command})" if timeout else "orphan watch: off")
        self.timeout, self.command = float(timeout), command

    def deadline(self) -> float | None:
        """When the machine is orphaned if nothing happens (None: not armed, or a job runs)."""
        if not self.armed or self.idle_since is None:
            return None
        since = max(self.contact, self.idle_since)
        if self.tried_at is not None and self.tried_at >= since:
            return self.tried_at + SHUTDOWN_RETRY
        return since + self.timeout

    def check(self, busy: bool, now: float) -> None:
        """Note whether a job runs (BUSY); run the shutdown command once the machine has
        been orphaned for long enough. An open connection that says nothing is no contact
        (the link of a core on a laptop that sleeps stays open)."""
        if busy:
            self.idle_since = None
            return
        if self.idle_since is None:
            self.idle_since = now
        due = self.deadline()
        if due is None or now < due:
            return
        self.tried_at = now
        log(f"orphaned: no job for {now - self.idle_since:.0f}s and no request from the core "
            f"for {now - self.contact:.0f}s (orphan_timeout {self.timeout:g}s): powering the "
            f"machine off so that its cloud terminates it: {self.command}")
        try:
            done = subprocess.run(["/bin/sh", "-c", self.command], stdin=subprocess.DEVNULL,
                                  capture_output=True, timeout=120, start_new_session=True)
        except (OSError, subprocess.TimeoutExpired) as e:
            log(f"the shutdown command failed: {one_line(e)}; trying again in {SHUTDOWN_RETRY:.0f}s")
            return
        said = " ".join((done.stdout + done.stderr).decode(errors="replace").split())[:500]
        if done.returncode:
            log(f"the shutdown command exited {done.returncode}: {said or 'no output'}; trying "
                f"again in {SHUTDOWN_RETRY:.0f}s")
        else:
            log("the shutdown command succeeded" + (f": {said}" if said else ""))


def exit_fields(job: Job, code: int | None, returncode: int | None) -> dict[str, Any]:
    """code, signal and reason of an exit event."""
    sig = None
    if code is None and returncode is not None:
        if returncode < 0:
            return {"code": None, "signal": -returncode, "reason": "killed"}
        code = returncode
    if job.signalled is not None:
        if code is None or code > 128:
            sig = code - 128 if code is not None else job.signalled
        return {"code": code, "signal": sig, "reason": "killed"}
    if code is None:
        return {"code": None, "signal": None, "reason": "vanished"}
    if code != 1:  # launcher.py exits 1 when the set-up failed
        return {"code": code, "signal": None, "reason": "exited"}
    try:
        with open(os.path.join(job.run_dir, SETUP_FAILED), encoding="utf-8") as f:
            return {"code": code, "signal": None, "reason": "setup", "error": f.read().strip()}
    except OSError:
        return {"code": code, "signal": None, "reason": "exited"}


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
    parser.add_argument("--reserve", type=int, default=0, metavar="BYTES",
                        help="space kept aside to record exits when the disk fills up")
    parser.add_argument("--term-notice", type=float, metavar="SECONDS",
                        help="SIGTERM is a preemption notice SECONDS before a SIGKILL (Slurm)")
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
    agent = Agent(root, os.path.abspath(args.socket), args.idle_timeout, max(0.05, args.heartbeat),
                  args.term_notice)
    agent.reserve = max(0, args.reserve)
    agent.serve()
    os.close(lock_fd)
    return 0
