"""The one function that decides how an attempt's end moves its job (monkey.core.endings)."""

from __future__ import annotations

from monkey.core.endings import Facts, decide
from monkey.models import Job, Resources, State


def _job(retries: int = 2, request: str | None = None, argv: list[str] | None = None) -> Job:
    return Job(
        juid="26-11-27-001",
        name="t",
        argv=argv or ["train"],
        provider="local",
        resources=Resources(time=90),
        state=State.RUNNING,
        retries=retries,
        request=request,
    )


def test_a_command_that_never_started_is_not_retried():
    for code, why in (
        (127, "command not found: train (not on the job's PATH, or not executable)"),
        (126, "not executable: train (a folder, or a file without its x bit: chmod +x it)"),
    ):
        end = decide(_job(), {"code": code, "reason": "spawn"}, Facts())
        assert (end.final, end.reason, end.requeue) == (
            State.FAILED,
            f"failed to start: {why}",
            None,
        )


def test_failures_and_losses_are_retried_while_retries_remain():
    assert decide(_job(), {"code": 127, "reason": "exited"}, Facts(retries_done=1)).requeue == 4.0
    assert decide(_job(), {"code": 3}, Facts(retries_done=2)).requeue is None
    lost = decide(_job(), {"reason": "vanished"}, Facts())
    assert (lost.final, lost.reason, lost.requeue) == (State.LOST, "process vanished", 2.0)
    setup = decide(_job(), {"code": 1, "reason": "setup", "error": "pip failed"}, Facts())
    assert (setup.final, setup.requeue) == (State.FAILED, None)
    timeout = decide(_job(), {"code": 143, "reason": "timeout", "limit": 90}, Facts())
    assert (timeout.final, timeout.reason, timeout.requeue) == (
        State.FAILED,
        "time limit 90s reached",
        2.0,
    )


def test_a_request_wins_and_success_is_exit_0():
    assert (
        decide(_job(request="cancel"), {"code": 127, "reason": "spawn"}, Facts()).final
        == State.CANCELLED
    )
    assert decide(_job(request="pause"), {"code": 0}, Facts()).final == State.PAUSED
    assert decide(_job(), {"code": 0, "reason": "killed"}, Facts()).final == State.SUCCEEDED


def test_preemptions_requeue_uncounted_until_the_limit():
    again = decide(_job(), {"reason": "preempted", "detail": "spot"}, Facts(preemptions=1))
    assert (again.final, again.reason, again.requeue, again.requeue_kind) == (
        State.PREEMPTED,
        "preempted: spot",
        0.0,
        "preempt",
    )
    last = decide(_job(), {"reason": "preempted"}, Facts(preemptions=3, max_preemptions=3))
    assert (last.reason, last.requeue) == (
        "preempted; preempted 4 times, max_preemptions is 3",
        None,
    )


def test_a_full_disk_is_named_where_the_job_ran():
    event = {"code": 1, "disk": {"path": "/w/runs", "free": 10}}
    remote = decide(_job(retries=0), event, Facts(remote=True, host="gpu1"))
    assert remote.reason == "exit 1; disk full on gpu1 at /w/runs (10 bytes free)"
    local = decide(_job(retries=0), {"code": None, "signal": 9}, Facts(note="; disk full here"))
    assert local.reason == "killed by signal 9; disk full here"
