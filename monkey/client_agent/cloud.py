"""The agent's side of cloud instances: results kept through a bucket (results.py, uploaded in
threads whose outcomes come back to the loop) and spot and preemption notices (notice.py, and
Slurm's); the orphan watch is in orphan.py. Standard library only (see agent.py)."""

from __future__ import annotations

import json
import os
import queue
import signal
import time
from collections.abc import Callable

from monkey.client_agent.common import RequestError, encode, log, one_line, write_atomic
from monkey.client_agent.rundir import PREEMPTED, RESULTS, RESULTS_SEQ
from monkey.client_agent.state import AgentState, Job

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

PREEMPT_GRACE = float(os.environ.get("MONKEY_PREEMPT_GRACE", "20"))  # SIGTERM to SIGKILL
PREEMPT_RESERVE = 5.0  # seconds kept before a notice's deadline for the last uploads


class CloudSide(AgentState):
    """The ``Agent``'s uploads of results and its handling of notices."""

    def _results(self, cfg: Any, juid: str, attempt: int, run_dir: str, work: str) -> Any:
        """The attempt's uploads (``results`` of a start), its kept folders restored first
        from the last manifest; None without a bucket."""
        if not cfg:
            return None
        from monkey.client_agent.results import Results

        if not isinstance(cfg, dict) or not isinstance(cfg.get("url"), str):
            raise RequestError(
                "results must be {url, fields, prefix, every, dirs, outputs, restore}"
            )
        try:
            results = Results(cfg, juid, attempt, work, os.path.join(run_dir, RESULTS_SEQ))
            fetched = results.restore(cfg.get("restore"))
        except (OSError, ValueError, TypeError) as e:
            raise RequestError(
                f"restoring the checkpoint of {juid} failed: {one_line(e)}"
            ) from None
        if fetched:
            log(f"{juid}/{attempt}: restored {fetched} bytes of checkpoint and persisted folders")
        return results

    @staticmethod
    def _keep_results(run_dir: str, cfg: dict[str, Any], work: str) -> None:
        """Keep the attempt's upload settings in RUN_DIR (``RESULTS``, 0600: the form is a
        presigned policy), so that an agent that adopts the job keeps uploading it."""
        kept = {k: v for k, v in cfg.items() if k != "restore"}
        try:
            write_atomic(
                os.path.join(run_dir, RESULTS), json.dumps({**kept, "work": work}).encode()
            )
        except OSError as e:
            raise RequestError(f"cannot keep the upload settings in {run_dir}: {e}") from None

    def _adopted_results(self, job: Job) -> None:
        """The upload settings an earlier agent kept for an adopted JOB, if any."""
        from monkey.client_agent.results import Results

        try:
            with open(os.path.join(job.run_dir, RESULTS), "rb") as f:
                cfg = json.loads(f.read())
            results = Results(
                cfg,
                job.juid,
                job.attempt,
                str(cfg.get("work") or ""),
                os.path.join(job.run_dir, RESULTS_SEQ),
            )
        except FileNotFoundError:
            return
        except (OSError, ValueError, TypeError, KeyError) as e:
            log(f"{job.juid}/{job.attempt}: its upload settings cannot be read: {one_line(e)}")
            return
        results.next_at = 0.0  # the earlier agent's uploads may have stopped a while ago
        self.results[job.key] = results

    def _core_awaits(self, attempts: Any) -> None:
        """The attempts the core still awaits here, as a sync or a ping names them (None: it
        did not say): a finished one it does not name was fetched, and is forgotten."""
        if not isinstance(attempts, list):
            return
        named = {(a.get("juid"), a.get("attempt")) for a in attempts if isinstance(a, dict)}
        for key in [k for k in self.unfetched if k not in named]:
            del self.unfetched[key]

    def _leave(self, why: str) -> str | None:
        """Before the orphaned machine powers off (WHY): put in the bucket what the core
        has not fetched of each finished attempt (see results.leave); why it must stay up
        instead (no bucket for one, an upload that failed), or None."""
        if not self.unfetched:
            return None
        from monkey.client_agent.results import leave

        forms = {}
        for (juid, attempt), run_dir in sorted(self.unfetched.items()):
            try:
                with open(os.path.join(run_dir, RESULTS), "rb") as f:
                    forms[juid, attempt] = (run_dir, json.loads(f.read()))
            except FileNotFoundError:
                pass
            except (OSError, ValueError) as e:
                return f"the upload settings of {juid}/{attempt} cannot be read: {one_line(e)}"
        kept = [f"{j}/{n}" for j, n in sorted(self.unfetched) if (j, n) not in forms]
        if kept:
            return (
                "finished attempts not fetched by the core, and no bucket to leave them in: "
                + ", ".join(kept)
            )
        for (juid, attempt), (run_dir, cfg) in forms.items():
            try:
                sent = leave(cfg, juid, attempt, run_dir, why)
            except Exception as e:  # a bucket that refuses, a network error
                return f"leaving {juid}/{attempt} in the bucket failed: {one_line(e)}"
            log(f"{juid}/{attempt}: left in the bucket for the core ({sent} bytes of its run dir)")
        return None

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
            self.watcher = Watcher(
                str(cfg["kind"]), str(cfg["url"]), on_notice, float(cfg.get("every", 1.0))
            )
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
        reported ``preempted`` once its checkpoint is uploaded; a machine a person took
        away (``revoked``: a Slurm allocation cancelled) stops them the same way, each to
        be reported ``revoked``. A rebalance recommendation only uploads checkpoints now."""
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
            if info.get("revoked"):  # a person ended the machine: stopped, not preempted
                job.revoked = info["detail"]
                job.signalled = signal.SIGTERM
                self.kill_at[job.key] = time.monotonic() + grace
                self._signal_session(job, signal.SIGTERM)
                continue
            self._append(
                job,
                "preempt-notice",
                deadline=info["deadline"],
                kind=info["kind"],
                detail=info["detail"],
            )
            try:
                write_atomic(os.path.join(job.run_dir, PREEMPTED), b"1\n")
            except OSError as e:
                log(f"cannot mark {job.run_dir} preempted: {e}")
            job.preempted = True
            job.signalled = signal.SIGTERM
            self.kill_at[job.key] = time.monotonic() + grace
            self._signal_session(job, signal.SIGTERM)
