"""A fault storm: the agent and the core are SIGKILLed at random, and the wall clock of their
processes steps an hour either way, while a few hundred short jobs with a time limit start
and end. Every job must run exactly once, keep every log byte, and end as it ended: none
killed by its time limit, none with a negative run time."""

from __future__ import annotations

import collections
import contextlib
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from conftest import core_pid, start_core, wait_for
from stepped_clock import SteppedClock

from monkey.handles import Job
from monkey.models import TERMINAL, State

JOBS = 300
STORM_SECONDS = 30.0
HOUR = 3600.0


def _pid_in(path: Path) -> int | None:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None


def _kill(pid: int | None) -> bool:
    if not pid or pid < 0:
        return False
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


def _storm(
    home: Path,
    rng: random.Random,
    kills: dict[str, int],
    stop: threading.Event,
    start: Callable[[], object],
    clock: SteppedClock | None,
) -> None:
    """SIGKILL the agent (sometimes while the core is stopped) or the core at random, and
    START the core again, and step the CLOCK an hour either way every few seconds (never
    more than two from the true time), until STOP is set; KILLS counts them."""
    step_at = time.monotonic() + rng.uniform(1, 3)
    while not stop.is_set():
        time.sleep(rng.uniform(0.02, 0.4))
        if clock is not None and time.monotonic() >= step_at:
            step_at = time.monotonic() + rng.uniform(1, 3)
            clock.step(
                rng.choice([-HOUR, HOUR]) if abs(clock.offset) < 2 * HOUR else -clock.offset / 2
            )
        agent = _pid_in(home / "private" / "agent.pid")
        roll = rng.random()
        if roll < 0.6:
            kills["agent"] += _kill(agent)
        elif roll < 0.75:  # the agent dies while the core, stopped, has events unread
            core = core_pid(home)
            if core and core > 0 and agent:
                try:
                    os.kill(core, signal.SIGSTOP)
                except ProcessLookupError:  # the core ended by itself meanwhile
                    continue
                time.sleep(rng.uniform(0.05, 0.3))
                kills["agent"] += _kill(agent)
                os.kill(core, signal.SIGCONT)
        elif _kill(core_pid(home)):
            kills["core"] += 1
            wait_for(lambda: core_pid(home) is None, what="the core to die")
            time.sleep(rng.uniform(0, 0.3))  # jobs go on ending while no core runs
            start()


@contextlib.contextmanager
def storm(home: Path, seed: int, clock: SteppedClock | None = None) -> Iterator[dict[str, int]]:
    """The agent and the core SIGKILLed at random, and the CLOCK of the core and agent
    stepped (``_storm``) while the block runs, on a worker of 16 slots; then the core is
    started again. Yields the counts of kills."""
    (home / "providers.yml").write_text("providers:\n  local: {type: local, slots: 16}\n")
    start: Callable[[], object] = (
        (lambda: start_core(home)) if clock is None else (lambda: clock.monkey("daemon", "start"))
    )
    start()
    kills = {"agent": 0, "core": 0}
    stop = threading.Event()
    failed: list[BaseException] = []

    def run() -> None:
        try:
            _storm(home, random.Random(seed), kills, stop, start, clock)
        except BaseException as exc:  # a core that could not start: the test fails with it
            failed.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        yield kills
    finally:
        stop.set()
        thread.join()
    if failed:
        raise failed[0]
    start()


def test_agent_and_core_killed_at_random(home, monkey, tmp_path):
    ledger = Path("ledger").resolve()
    script = (
        f'echo "$MONKEY_JUID" >> {ledger}; echo "start $MONKEY_JUID"; '
        'sleep 0.0$((RANDOM % 3)); echo "end $MONKEY_JUID"'
    )
    seed = int(os.environ.get("MONKEY_FAULT_STORM_SEED", random.randrange(1 << 30)))
    clock = SteppedClock(tmp_path / "clock")

    def run() -> Job:
        return monkey.run(["bash", "-c", script], time=20, start_core=False)

    jobs = [run() for _ in range(JOBS // 2)]
    with storm(home, seed, clock) as kills:
        # The other half arrives during the storm.
        for _ in range(JOBS - len(jobs)):
            jobs.append(run())
            time.sleep(STORM_SECONDS / JOBS)
        deadline = time.monotonic() + STORM_SECONDS
        while time.monotonic() < deadline and not all(j.status in TERMINAL for j in jobs):
            time.sleep(0.2)
    for job in jobs:
        job.wait(timeout=120)

    runs = collections.Counter(ledger.read_text().splitlines())
    once = [j for j in jobs if runs.get(j.juid) == 1]
    complete = [j for j in jobs if j.logs() == f"start {j.juid}\nend {j.juid}\n"]
    stuck = [j for j in jobs if j.status not in TERMINAL]
    attempts = [a for j in jobs for a in j.attempts()]
    early = [(a.juid, a.reason) for a in attempts if "time limit" in (a.reason or "")]
    negative = [a.juid for a in attempts if a.started_at and (a.ended_at or 0) < a.started_at]
    print(
        f"\nfault storm (seed {seed}): jobs tried {len(jobs)} / ran exactly once {len(once)}"
        f" / logs byte-complete {len(complete)} / left stuck {len(stuck)};"
        f" agent kills {kills['agent']}, core kills {kills['core']}"
        f"\nclock storm: steps {clock.steps}, jobs {len(jobs)}, early kills {len(early)},"
        f" doubled runs {sum(n > 1 for n in runs.values())}, negative runtimes {len(negative)}"
    )
    assert kills["agent"] > 0 and kills["core"] > 0 and clock.steps > 0
    assert early == [] and negative == []
    assert not stuck, [(j.juid, j.status) for j in stuck]
    assert [
        (j.juid, j.status, runs.get(j.juid), [a.reason for a in j.attempts()])
        for j in jobs
        if runs.get(j.juid) != 1
    ] == []
    assert [(j.juid, j.logs()) for j in jobs if j not in complete] == []
    assert [(j.juid, j.status) for j in jobs if j.status != State.SUCCEEDED] == []
    for job in jobs:
        ran = [a for a in job.attempts() if a.started_at is not None]
        assert len(ran) == 1, (job.juid, job.attempts())


def test_cancels_in_a_storm_stop_each_job_once(home, monkey):
    # Jobs that run until cancelled, each taking its TERM and going on (only the SIGKILL
    # after the grace stops them), are cancelled at random while agents and the core die:
    # each ends cancelled, ran at most once, and none runs on. (That a job gets one TERM
    # is checked where no agent dies in the microseconds between sending it and marking
    # it sent: test_agent.py and test_recovery.py.)
    ledger = Path("ledger").resolve()
    script = (
        f'echo "$MONKEY_JUID" >> {ledger}; trap "echo TERM" TERM; '
        "echo up; while :; do sleep 0.05; done"
    )
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    jobs = [monkey.run(["bash", "-c", script], start_core=False) for _ in range(40)]
    with storm(home, seed + 1) as kills:
        for job in rng.sample(jobs, len(jobs)):
            time.sleep(rng.uniform(0, 0.6))
            job.cancel()
        time.sleep(2)
    for job in jobs:
        job.wait(timeout=120)
    runs = collections.Counter(ledger.read_text().splitlines())
    print(
        f"\ncancel storm (seed {seed}): jobs {len(jobs)} / started {len(runs)} / "
        f"agent kills {kills['agent']}, core kills {kills['core']}"
    )
    assert kills["agent"] > 0
    assert [(j.juid, j.status) for j in jobs if j.status != State.CANCELLED] == []
    assert [j.juid for j in jobs if runs.get(j.juid, 0) > 1] == []
    for job in jobs:
        assert all(_dead(a.pid) for a in job.attempts() if a.pid), job.juid


def _dead(pid: int) -> bool:
    """PID is gone or a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
