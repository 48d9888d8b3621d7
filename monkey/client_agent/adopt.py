"""The adoption path of the agent: ``sync`` tells it the attempts a core believes live; each
one it does not watch is adopted from its run dir (claim, events, exit record), reported
exited, or claimed abandoned when it never started. Standard library only (see agent.py)."""

from __future__ import annotations

import json
import os
import time

from monkey.client_agent.common import RequestError, encode, log, one_line, read_small, trace
from monkey.client_agent.procs import (
    CLK_TCK,
    boottime,
    environ_lines,
    is_running,
    proc_pids,
    read_stat,
    stat_start_ticks,
)
from monkey.client_agent.rundir import (
    ABANDONED,
    ABANDONED_CLAIM,
    EVENTS,
    OLD_PID,
    PREEMPTED,
    SIGNALLED,
    STARTED,
    first_event,
    last_event,
    read_claim,
    read_lines_after,
    recorded_exit,
    tail_offsets,
)
from monkey.client_agent.sandbox import bwrap
from monkey.client_agent.spawn import WRAPPER_CMDLINE
from monkey.client_agent.state import AgentState, Job


def wrapped_sandbox(pid: int) -> str:
    """The bwrap that the job wrapper PID runs its job under ("" when none): the command
    after the wrapper's own words and the job's folder, when it is this agent's bwrap."""
    cmd = read_small(f"/proc/{pid}/cmdline") or b""
    words = cmd[len(WRAPPER_CMDLINE) :].split(b"\0") if cmd.startswith(WRAPPER_CMDLINE) else []
    path = bwrap()[0]
    return path if path and len(words) > 1 and words[1] == path.encode() else ""


# The longest SIGKILL grace an adopted job's mark may still have (more: the mark is not
# this agent's, and its grace is taken as over).
_GRACE_MAX = 3600.0
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class Adoption(AgentState):
    """The ``sync`` op of the ``Agent`` and the adoption of jobs an earlier agent started."""

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
                log(f"adopting {run_dir} failed:\n{trace()}")
                statuses.append(
                    {"juid": juid, "attempt": attempt, "status": "unknown", "error": one_line(e)}
                )
                continue
            statuses.append({"juid": juid, "attempt": attempt, "status": status})
            if status == "exited" and self.orphan.armed:
                self.unfetched[juid, attempt] = run_dir
            job = self.jobs.get((juid, attempt))
            events = os.path.join(job.run_dir if job else run_dir, EVENTS)
            for end, line in read_lines_after(events, offset):
                try:
                    event = json.loads(line)
                except ValueError:
                    log(f"{events}: bad line at {end - len(line) - 1}")
                    continue
                backlog.append(
                    encode(
                        {
                            "push": "event",
                            "juid": juid,
                            "attempt": attempt,
                            "offset": end,
                            "event": event,
                        }
                    )
                )
        self._core_awaits(req.get("attempts") or [])
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
        alive = (
            None if found else self._open_if_alive(pid, start_ticks, os.path.join(run_dir, STARTED))
        )
        job = Job(juid, attempt, run_dir, pid, -1, False, seq, alive[1] if alive else 0.0)
        job.gpus = [g for g in str(record.get("gpus") or "").split(",") if g]
        job.cgroup = str(record.get("cgroup") or "")
        job.limit = record.get("limit")
        if job.limit and alive:  # counted from its start on the boot clock, as when spawned
            job.limit[1] = alive[1] + job.limit[0]
        job.cpus = int(record.get("cpus") or 1)
        job.monitor = str(record.get("sandbox") or "")
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
            signum = int(mark["signal"])
            # On the boot clock, which the wall clock's steps do not move; an agent before
            # it wrote a wall-clock deadline, taken with a bound.
            if "boot_deadline" in mark:
                left = float(mark["boot_deadline"]) - boottime()
            else:
                left = float(mark["deadline"]) - time.time()
        except (OSError, ValueError, KeyError, TypeError):
            return
        job.signalled = signum
        job.timed_out = bool(mark.get("timeout"))
        if alive:
            self.kill_at[job.key] = time.monotonic() + min(_GRACE_MAX, max(0.0, left))

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
            record.update(
                gpus=values.get(b"CUDA_VISIBLE_DEVICES", b"").decode(),
                cgroup=values.get(b"MONKEY_CGROUP", b"").decode(),
                sandbox=wrapped_sandbox(pid),
            )
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
            stat_start_ticks(fields) == start_ticks
            if start_ticks is not None
            else f"MONKEY_STARTED_FILE={claim}".encode() in environ_lines(pid)
        ):
            return pidfd, stat_start_ticks(fields) / CLK_TCK
        os.close(pidfd)
        return None
