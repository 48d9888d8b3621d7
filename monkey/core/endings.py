"""How an attempt's end decides its job's next state: one pure function, ``decide``.

Given the job as recorded, the attempt's exit event (the agent protocol's ``exit`` fields,
or the core's own for what no agent saw) and the few facts the core looks up (retries
used, preemptions so far), it returns the job's next state, the reason it shows, and
whether and when the job is queued again. The core records it (``Store.end_attempt``).
"""

from __future__ import annotations

from dataclasses import dataclass

from monkey.models import Ending, Job, Request, State, format_duration, retry_delay

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# What a command the wrapper could not run shows (the agent reports its exit as ``spawn``).
NOT_FOUND = "command not found: {} (not on the job's PATH, or not executable)"
NOT_EXECUTABLE = "not executable: {} (a folder, or a file without its x bit: chmod +x it)"


def span(seconds: float) -> str:
    """A length of time as 45s, 12m 5s, 3h 20m."""
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m {whole % 60}s" if whole % 60 else f"{whole // 60}m"
    return f"{whole // 3600}h {whole % 3600 // 60}m" if whole % 3600 // 60 else f"{whole // 3600}h"


@dataclass(frozen=True)
class Facts:
    """What decides an ending besides the job and its exit event, as the core found it."""

    retries_done: int = 0  # automatic retries used so far (counted against --retries)
    preemptions: int = 0  # times preempted since the user last queued it
    max_preemptions: int = 10  # providers.yml's max_preemptions
    remote: bool = False  # it ran on another machine (a full disk there is named)
    host: str = ""  # the machine it ran on
    note: str = ""  # "; disk full ..." when its local folder's disk is (nearly) full
    elsewhere: str | None = None  # the provider it goes to when its own gave it up
    nowhere: str = ""  # "; no other provider of a,b can hold it: ..." when none can


@dataclass(frozen=True)
class Decision:
    """The job's next state and reason; ``requeue``: seconds before it is queued again
    (None: it stays ended), as a ``retry`` (counted) or a ``preempt`` (not); ``move_to``:
    the provider it is queued for now (FINAL queued), its own having given it up."""

    final: State
    reason: str
    requeue: float | None = None
    requeue_kind: str = "retry"
    move_to: str | None = None


def decide(job: Job, event: dict[str, Any], facts: Facts) -> Decision:
    """The ending of JOB's attempt whose exit EVENT says how it ended.

    A cancel or pause asked wins; an attempt its provider gave up before it ran (no room
    there) moves the job to ``facts.elsewhere`` without using a retry, else fails it; a
    failed or lost attempt is retried while retries remain, except a set-up that failed or
    a command that could not be started (the same inputs would fail the same way); a
    preempted one is queued again, without counting,
    until it has been preempted ``max_preemptions`` times."""
    code, why = event.get("code"), Ending.of(event)
    if job.request == Request.CANCEL.value:
        return Decision(State.CANCELLED, "cancelled by user")
    if job.request == Request.PAUSE.value:
        return Decision(State.PAUSED, "paused by user")
    if why == Ending.PREEMPTED:
        reason, again = _preempted(event, facts)
        return Decision(State.PREEMPTED, reason, 0.0 if again else None, "preempt")
    if why == Ending.GIVEN_UP:  # no room there: another provider of its own, or the end
        said = f"{job.provider}: {event.get('error') or 'given up before it ran'}"
        if facts.elsewhere:
            return Decision(State.QUEUED, f"{said}; moved to {facts.elsewhere}",
                            move_to=facts.elsewhere)  # fmt: skip
        return Decision(State.FAILED, said + facts.nowhere)
    if why == Ending.SETUP:  # not retried: the same inputs would fail the same way
        return Decision(
            State.FAILED, f"setup: {event.get('error')}; see `monkey logs --setup {job.juid}`"
        )
    if why == Ending.SPAWN:  # not retried either: the command is not there to run
        what = NOT_EXECUTABLE if code == 126 else NOT_FOUND
        return Decision(
            State.FAILED, "failed to start: " + what.format(job.argv[0] if job.argv else "?")
        )
    if code == 0 and why in (Ending.EXITED, Ending.KILLED):
        return Decision(State.SUCCEEDED, "exit 0")
    final, reason = _failed(job, event, facts)
    requeue = retry_delay(facts.retries_done + 1) if facts.retries_done < job.retries else None
    return Decision(final, reason, requeue)


def _failed(job: Job, event: dict[str, Any], facts: Facts) -> tuple[State, str]:
    """(FAILED or LOST, why) for an attempt that did not succeed."""
    code, sig, why = event.get("code"), event.get("signal"), Ending.of(event)
    if why == Ending.VANISHED:
        return State.LOST, "process vanished"
    if why == Ending.SILENT:
        return State.LOST, (
            f"its instance was unreachable for {span(event['silence'])} "
            f"(lost_after {span(event.get('lost_after') or 0)})"
        )
    if why == Ending.TERMINATED:
        return State.LOST, "its instance was terminated"
    if why == Ending.TIMEOUT:
        return (
            State.FAILED,
            f"time limit {format_duration(event.get('limit') or job.resources.time or 0)} reached",
        )
    reason = f"exit {code}" if code is not None else f"killed by signal {sig}"
    if why == Ending.REVOKED:  # a person took its machine away: an end, not a preemption
        return State.FAILED, f"{event.get('detail') or 'its machine was taken away'}; {reason}"
    if isinstance(event.get("detail"), str) and event["detail"]:  # the worker's word on it:
        reason += f" ({event['detail'][:200]})"  # a pod OOMKilled at its limit
    disk = event.get("disk")
    if isinstance(disk, dict) and facts.remote:
        return (
            State.FAILED,
            reason
            + f"; disk full on {facts.host} at {disk.get('path')} ({disk.get('free')} bytes free)",
        )
    return State.FAILED, reason + facts.note


def _preempted(event: dict[str, Any], facts: Facts) -> tuple[str, bool]:
    """The reason a preempted attempt ends with, and whether its job is re-queued (not
    once it has been preempted ``max_preemptions`` times)."""
    saved = event.get("saved") or {}
    reason = "preempted" + (f": {event['detail']}" if event.get("detail") else "")
    if saved.get("digest"):
        reason += (
            f"; checkpoint saved ({saved['bytes']} bytes sent, manifest {saved['digest'][:12]})"
        )
    elif saved.get("error"):
        reason += f"; checkpoint upload failed: {saved['error']}"
    done, limit = facts.preemptions, facts.max_preemptions
    if done >= limit:
        return reason + f"; preempted {done + 1} times, max_preemptions is {limit}", False
    return reason, True
