"""The agent's side of cloud instances: results kept through a bucket (results.py, uploaded in
threads whose outcomes come back to the loop), spot and preemption notices (notice.py, and
Slurm's), and the orphan watch that powers off an instance no core looks after any more.
Standard library only (see agent.py)."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import time
from collections.abc import Callable
from typing import Any

from monkey.client_agent.common import RequestError, encode, log, one_line, write_atomic
from monkey.client_agent.rundir import PREEMPTED, RESULTS, RESULTS_SEQ
from monkey.client_agent.state import AgentState, Job

PREEMPT_GRACE = float(os.environ.get("MONKEY_PREEMPT_GRACE", "20"))  # SIGTERM to SIGKILL
PREEMPT_RESERVE = 5.0  # seconds kept before a notice's deadline for the last uploads


# How an orphaned cloud instance powers itself off (its cloud then terminates it).
DEFAULT_SHUTDOWN = "sudo -n shutdown -h now || shutdown -h now || poweroff"
SHUTDOWN_RETRY = 300.0  # seconds before a shutdown that left the machine up is tried again


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


class CloudSide(AgentState):
    """The ``Agent``'s uploads of results and its handling of notices."""

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
