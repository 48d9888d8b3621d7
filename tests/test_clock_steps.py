"""Steps of the wall clock (an NTP step, a VM resumed) while jobs run: no time limit,
heartbeat or back-off fires early, and no runtime is negative (issue 46 item 2)."""

from __future__ import annotations

import collections
import json
import time
from pathlib import Path

import pytest
from conftest import wait_for
from stepped_clock import SteppedClock

from monkey.models import State

pytestmark = pytest.mark.system

HOUR = 3600.0
_BEFORE = (State.QUEUED, State.DISPATCHING)


def _ended(monkey, juid: str) -> bool:
    """Whether the job's first attempt ended."""
    return any(a.ended_at is not None for a in monkey.job(juid).attempts())


def test_wall_clock_steps_kill_no_job_early_and_leave_no_negative_runtime(home, monkey, tmp_path):
    clock = SteppedClock(tmp_path / "clock")
    (home / "providers.yml").write_text("providers:\n  local: {type: local, slots: 4}\n")
    clock.monkey("daemon", "start")
    ledger = Path("ledger").resolve()
    mark = f'echo "$MONKEY_JUID/$MONKEY_ATTEMPT" >> {ledger}'

    def run(script: str) -> str:
        args = ("run", "--time", "8s", "--retries", "2", "--", "sh", "-c", script)
        return clock.monkey(*args).stdout.strip()

    # 4 s of work under an 8 s limit, the clock an hour ahead a moment after it starts.
    timed = run(f"{mark}; sleep 4; echo done")
    wait_for(lambda: monkey.job(timed).status not in _BEFORE, what="the timed job to start")
    clock.step(+HOUR)
    late = run(f"{mark}; sleep 3; echo done")  # starts an hour ahead, ends an hour back
    # A job whose first attempt fails at once: the clock goes back an hour during its
    # back-off (2 s), and its second attempt (4 s) sees the clock step both ways.
    retried = run(f'{mark}; [ "$MONKEY_ATTEMPT" = 1 ] && exit 3; sleep 4; echo done')
    wait_for(lambda: _ended(monkey, retried), what="the first attempt to fail")
    clock.step(-HOUR)
    wait_for(lambda: len(monkey.job(retried).attempts()) == 2, what="the back-off to end")
    clock.step(+HOUR)
    time.sleep(1.5)
    clock.step(-HOUR)
    jobs = [monkey.job(j) for j in (timed, retried, late)]
    for job in jobs:
        job.wait(timeout=60)

    runs = collections.Counter(ledger.read_text().splitlines())  # juid/attempt per run
    doubled = [run for run, n in runs.items() if n > 1]
    listed = json.loads(clock.monkey("list", "jobs", "--json").stdout)["jobs"]
    runtimes = {j["job"]: j["runtime"] for j in listed}
    early = [
        (j.juid, a.n, a.reason)
        for j in jobs
        for a in j.attempts()
        if "time limit" in (a.reason or "")
    ]
    negative = [
        (j.juid, a.n)
        for j in jobs
        for a in j.attempts()
        if a.started_at is not None and (a.ended_at or 0) < a.started_at
    ] + [juid for juid, seconds in runtimes.items() if seconds is None or seconds < 0]
    print(
        f"\nclock steps: steps {clock.steps}, jobs {len(jobs)}, early kills {len(early)}, "
        f"doubled runs {len(doubled)}, "
        f"negative runtimes {len(negative)}"
    )
    assert early == []
    assert [(j.juid, j.status) for j in jobs if j.status != State.SUCCEEDED] == []
    assert [j.logs() for j in jobs] == ["done\n"] * 3
    assert sorted(runs) == sorted([f"{timed}/1", f"{retried}/1", f"{retried}/2", f"{late}/1"])
    assert doubled == []
    assert negative == []
    # Each ran its few seconds, whatever the wall clock said meanwhile.
    assert 3.5 < runtimes[timed] < 30 and 2.5 < runtimes[late] < 30, runtimes
    shown = json.loads(clock.monkey("info", late, "--json").stdout)["attempts_detail"]
    assert [2.5 < a["ended_at"] - a["started_at"] < 30 for a in shown] == [True], shown
    log = (home / "daemon.log").read_text()
    assert "no heartbeat" not in log and "lost the link" not in log, log
