"""A live job's records, written by the agent: events appended to events.jsonl and pushed,
metrics tailed from its files, heartbeats with its CPU, memory and GPU figures, and its exit
(with the disk reserve that lets an exit be recorded on a full disk). Standard library only
(see agent.py)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import queue
import time

from monkey.client_agent.common import encode, log, one_line, read_small, write_atomic
from monkey.client_agent.procs import (
    CLK_TCK,
    PAGE_SIZE,
    boottime,
    detect_gpus,
    free_bytes,
    gpu_usage_probe,
    parse_gpu_usage,
    session_usage,
)
from monkey.client_agent.rundir import (
    CODE_RECORD,
    METRICS,
    ORDER,
    PREEMPTED,
    PULL,
    SETUP_FAILED,
    STARTED,
    STDERR,
    STDOUT,
    read_exit_code,
    read_new,
    reclaim_code,
    scrape,
)
from monkey.client_agent.state import AgentState, Job

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

TAIL_BUDGET = 64 << 20  # bytes one job may ship per tail pass (keeps the loop responsive)
# exit.reason of a job stopped because a person took its machine away (a Slurm allocation
# cancelled with scancel): an end of its own, not a preemption to resume from.
REVOKED = "revoked"

# An agent started with --reserve keeps that much space aside under its root
# (private/reserve), given up when an event cannot be written for a full disk: a job that
# filled the disk of a host still has its exit recorded.
NEARLY_FULL = 1 << 20  # free bytes below which a failed job's note says its disk is full
# Appending to a file of the run dir: never through a link a job made there (the agent would
# write where it points, with its own rights)
_APPEND = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC


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
    if code in (126, 127) and b"spawn" in (
        read_small(os.path.join(job.run_dir, STARTED)) or b""
    ).split(b"\n"):
        return {"code": code, "signal": None, "reason": "spawn"}  # the command never started
    if code != 1:  # launcher.py exits 1 when the set-up failed
        return {"code": code, "signal": None, "reason": "exited"}
    try:
        with open(os.path.join(job.run_dir, SETUP_FAILED), encoding="utf-8") as f:
            return {"code": code, "signal": None, "reason": "setup", "error": f.read().strip()}
    except OSError:
        return {"code": code, "signal": None, "reason": "exited"}


def _pull_progress(job: Job) -> dict[str, Any] | None:
    """{"bytes", "total"} of the job's image pull while it runs (see image.py); None once
    it is over (the job stops asking) or before it began."""
    raw = read_small(job.prefix + PULL)
    if raw is None:
        return None
    try:
        said = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(said, dict) or said.get("done"):
        job.pulling = False
        return None
    return {"bytes": int(said.get("bytes") or 0), "total": said.get("total")}


def _reclaimer(runs: queue.SimpleQueue[str]) -> None:
    """The reclaiming thread: the code copies of ended attempts, one after another."""
    while True:
        reclaim_code(runs.get())


class Events(AgentState):
    """The ``Agent``'s records of its jobs, from their started event to their exit."""

    def _reclaim(self, run_dir: str) -> None:
        """Have the attempt's code copy deleted by the reclaiming thread (started once)."""
        if not os.path.exists(os.path.join(run_dir, CODE_RECORD)):
            return
        if self.reclaims is None:
            import threading

            self.reclaims = queue.SimpleQueue()
            threading.Thread(
                target=_reclaimer, args=(self.reclaims,), daemon=True, name="reclaim"
            ).start()
        self.reclaims.put(run_dir)

    def _append(self, job: Job, etype: str, strict: bool = False, **fields: Any) -> None:
        """Append one event line to the job's events.jsonl and push it to subscribers.

        A failed write is logged and skipped, or raised when STRICT; an exit that a full disk
        kept out is tried again until there is room (``_write_unwritten``).
        """
        event = {"seq": job.seq + 1, "ts": time.time(), "type": etype, **fields}
        line = encode(event)
        try:
            fd = os.open(job.events_path, _APPEND, 0o600)
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
            if etype == "exit" and e.errno in (errno.ENOSPC, errno.EDQUOT):
                if job.key not in self.unwritten:
                    log(
                        f"cannot append the exit of {job.juid}/{job.attempt}, until there is room: {e}"
                    )
                self.unwritten[job.key] = (job, fields)
                self.exiting.add(job.key)
                return
            log(f"cannot append a {etype} event for {job.juid}/{job.attempt}: {e}")
            return
        job.seq += 1
        if etype == "exit":  # the code copy is not needed any more: reclaimed off the loop
            self._reclaim(job.run_dir)
            if self.orphan.armed:  # the machine may power off before the core fetches it
                self.unfetched[job.key] = job.run_dir
        push = b'%s%d,"event":%s}\n' % (job.push_head, offset, line[:-1])  # the line as encoded
        for conn in list(self.conns):
            if conn.subscribed:
                self._send(conn, push)

    def _write_unwritten(self) -> None:
        """Try again the exits a full disk kept out of their events.jsonl (each goes back to
        ``unwritten`` if there is still no room)."""
        for key, (job, fields) in list(self.unwritten.items()):
            del self.unwritten[key]
            self.exiting.discard(key)
            self._append(job, "exit", **fields)

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
                self._append(
                    job,
                    "metrics",
                    log=[job.tail[0], log_end],
                    out=[job.tail[1], out_end],
                    lines=lines.decode(errors="replace"),
                    stdout=scraped.decode(errors="replace"),
                )
                if job.seq == seq:  # not written: try again on the next pass
                    return
            # Output with nothing to scrape needs no event: a re-scan finds nothing either.
            job.tail = [log_end, out_end]
            shipped += len(lines) + len(out)

    @staticmethod
    def _mark_order(job: Job) -> int | None:
        """Append the logs' sizes to output.order when either grew since the last mark; the
        size of stdout.log (None when unknown)."""
        try:  # stderr's first: a stdout byte written before a stderr byte counted is counted
            err = os.stat(job.prefix + STDERR).st_size
            sizes = (os.stat(job.prefix + STDOUT).st_size, err)
        except OSError:
            return None
        if sizes != job.order:
            try:
                with open(os.open(job.prefix + ORDER, _APPEND, 0o600), "a") as fh:
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
            if job.pulling:
                pull = _pull_progress(job)
                if pull is not None:
                    extra["pull"] = pull
            if gpu_usage:
                extra["gpus"] = [
                    {"index": int(g), **gpu_usage[g]}
                    for g in job.gpus
                    if g in gpu_usage and g.isdigit()
                ]
            self._append(
                job, "heartbeat", cpu=round(cpu, 1), rss=rss * PAGE_SIZE, procs=procs, **extra
            )

    def _on_exit(self, job: Job, _mask: int) -> None:
        """The job's wrapper exited: reap, clean its group, record the exit event."""
        if self.termed and self.notice is None:  # Slurm signalled the job and us at once
            self._on_done(0)
        self.sel.unregister(job.pidfd)
        self.jobs.pop(job.key, None)
        self.kill_at.pop(job.key, None)
        ended = time.time()  # the exit's time, not its record's
        ran = boottime() - job.began  # how long it ran, whatever the wall clock did meanwhile
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
        fields = self._exit_fields(job, code, returncode, ended)
        if job.began:
            fields["ran"] = round(max(0.0, ran), 3)
        self._report_exit(job, fields)

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

    def _exit_fields(
        self, job: Job, code: int | None, returncode: int | None, ended: float | None
    ) -> dict[str, Any]:
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
        elif job.revoked:
            fields.update(reason=REVOKED, detail=job.revoked)
        return fields

    def _report_exit(self, job: Job, fields: dict[str, Any]) -> bool:
        """Record JOB's exit; with uploads (``results``), once the last one is done, in a
        thread: the core then finds in the bucket what the next attempt restores. Whether
        the exit is still on its way (that upload, or room on a full disk)."""
        results = self.results.get(job.key)
        if results is None:
            self._append(job, "exit", **fields)
            return job.key in self.unwritten
        self.exiting.add(job.key)

        def last_upload() -> tuple[dict[str, Any], dict[str, Any]]:
            try:
                return fields, results.upload(final=True)
            except Exception as e:  # reported with the exit: the core keeps what it has
                return fields, {"error": one_line(e)}

        self._in_thread("exit", job, last_upload)
        return True
