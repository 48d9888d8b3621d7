"""The core can be killed at any moment: no job is lost, none runs twice, no log line goes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import REPO, core_pid, kill_core, start_core, wait_for

from monkey.models import State


def test_core_killed_repeatedly_during_100_jobs(home, monkey):
    (home / "providers.yml").write_text("providers:\n  local: {type: local, slots: 4}\n")
    script = 'echo "start $MONKEY_JUID"; sleep 0.05; echo "end $MONKEY_JUID"'
    jobs = [monkey.run(["sh", "-c", script], start_core=False) for _ in range(100)]
    start_core(home)
    for round_ in range(3):
        wait_for(
            lambda r=round_: sum(j.status == State.SUCCEEDED for j in jobs) > 20 * (r + 1),
            timeout=60,
            what="progress",
        )
        kill_core(home)
        time.sleep(0.1)  # jobs keep running and ending while no core is up
        start_core(home)
    for job in jobs:
        assert job.wait(timeout=120) == State.SUCCEEDED, job.juid
    for job in jobs:
        # An attempt the core opened just before dying may never have started (it is then
        # closed as such); exactly one attempt ran, and its output is there once.
        ran = [a for a in job.attempts() if a.started_at is not None]
        assert len(ran) == 1, (job.juid, job.attempts())
        assert ran[0].exit_code == 0
        assert all(a.reason == "never started" for a in job.attempts() if a.n != ran[0].n)
        assert job.logs() == f"start {job.juid}\nend {job.juid}\n"


def test_job_that_outlives_the_core_is_reattached(home, monkey):
    gate = Path("gate")
    job = monkey.run(
        [
            "sh",
            "-c",
            f"echo up; while [ ! -e {gate.resolve()} ]; do sleep 0.05; done; echo down; exit 4",
        ]
    )
    # running as the store says (its first output may come a few ms before the core records it)
    wait_for(lambda: job.logs() == "up\n" and job.status == State.RUNNING, what="the job to start")
    pid = job.attempts()[0].pid
    kill_core(home)
    os.kill(_agent_pid(home), signal.SIGKILL)  # no agent sees it end either
    gate.touch()  # the job ends while no core runs
    wait_for(lambda: _dead(pid), what="the job to end")
    assert job.status == State.RUNNING
    ended = (home / "runs" / job.juid / "1" / "started").stat().st_mtime  # the code appended
    time.sleep(1.5)  # the restart comes well after the end
    start_core(home)
    assert job.wait(timeout=30) == State.FAILED
    assert job.exit_code == 4
    assert len(job.attempts()) == 1
    assert job.logs() == "up\ndown\n"
    assert abs(job.attempts()[0].ended_at - ended) < 0.5  # its end, not its re-adoption


def test_running_job_is_reattached_and_keeps_streaming(home, monkey):
    gate = Path("gate2")
    job = monkey.run(
        [
            "sh",
            "-c",
            f"i=0; while [ ! -e {gate.resolve()} ]; do echo $i; i=$((i+1)); "
            "sleep 0.01; done; echo done",
        ]
    )
    wait_for(lambda: "5\n" in job.logs(), what="output")
    kill_core(home)
    start_core(home)
    wait_for(
        lambda: job.attempts()[0].heartbeat_at and job.status == State.RUNNING, what="re-attach"
    )
    gate.touch()
    assert job.wait(timeout=30) == State.SUCCEEDED
    lines = job.logs().splitlines()
    assert lines[-1] == "done"
    assert lines[:-1] == [str(i) for i in range(len(lines) - 1)]
    assert len(job.attempts()) == 1


def _dead(pid: int) -> bool:
    """PID is gone or a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _agent_pid(home: Path) -> int:
    return int((home / "private" / "agent.pid").read_text())


def test_vanished_process_is_lost_and_retried(home, monkey):
    job = monkey.run(
        [
            "sh",
            "-c",
            'if [ -e "$MONKEY_CHECKPOINT_DIR/x" ]; then echo again; exit 0; fi; '
            'touch "$MONKEY_CHECKPOINT_DIR/x"; echo once; sleep 300',
        ],
        retries=1,
    )
    wait_for(
        lambda: job.logs() == "once\n" and job.status == State.RUNNING, what="the job to start"
    )
    pid = job.attempts()[0].pid
    kill_core(home)
    os.kill(_agent_pid(home), signal.SIGKILL)
    os.killpg(pid, signal.SIGKILL)  # the machine "lost" the job while nothing watched
    wait_for(lambda: _dead(pid), what="the job to die")
    start_core(home)
    assert job.wait(timeout=60) == State.SUCCEEDED
    attempts = job.attempts()
    assert [a.reason for a in attempts] == ["process vanished", "exit 0"]
    assert job.logs() == "once\nagain\n"
    kinds = [(e["old"], e["new"]) for e in monkey.store.events(job.juid) if e["new"]]
    assert ("running", "lost") in kinds and ("lost", "queued") in kinds


def test_a_cancel_survives_the_agent_dying_before_the_job_stops(cli, home, monkey):
    # The job takes its TERM and goes on (as one saving a checkpoint may); its agent dies
    # before the grace ends. The agent that adopts the job is asked again: it knows the
    # job has its TERM (no second one) and when the grace ends, and stops it then.
    job = monkey.run(["sh", "-c", 'trap "echo TERM" TERM; echo up; while :; do sleep 0.05; done'])
    wait_for(lambda: job.logs() == "up\n" and job.status == State.RUNNING, what="the job to start")
    first_agent = _agent_pid(home)
    cli("job", "cancel", job.juid, check=True)
    wait_for(lambda: job.logs() == "up\nTERM\n", what="the job to take its TERM")
    os.kill(first_agent, signal.SIGKILL)
    assert job.wait(timeout=60) == State.CANCELLED
    assert _agent_pid(home) != first_agent
    assert _dead(job.attempts()[0].pid)
    assert job.logs() == "up\nTERM\n"
    assert job.attempts()[0].signal == signal.SIGKILL


def test_only_one_core_per_home(cli, home):
    start_core(home)
    pid = core_pid(home)
    second = subprocess.run(
        [sys.executable, "-m", "monkey", "daemon", "run"],
        capture_output=True,
        text=True,
        timeout=30,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    assert second.returncode == 1
    assert "already running" in second.stderr
    assert core_pid(home) == pid
    status = cli("daemon", "status")
    assert status.returncode == 0 and str(pid) in status.stdout
    assert "stopped" in cli("daemon", "stop", check=True).stdout
    assert cli("daemon", "status").returncode == 3


def test_core_restart_with_10000_jobs_is_quick_to_dispatch(home, monkey):
    # Many finished jobs in the store must not slow the way back to dispatching.
    monkey.run(["true"], start_core=False)
    job = monkey.store.get_job(monkey.job("last").juid)
    with monkey.store.tx() as db:
        db.executemany(
            "INSERT INTO jobs(juid, name, state, argv, provider, resources, env, workdir, datasets,"
            " git, python, created_at, updated_at) VALUES (?, 'x', 'succeeded', '[\"true\"]', "
            "'local', '{\"cpus\":1,\"gpus\":0,\"memory\":null}', '{}', '/', '[]', '{}', '3', 0, 0)",
            [(f"00-01-01-{i:05d}",) for i in range(10000)],
        )
    start_core(home)
    assert monkey.job(job.juid).wait(timeout=30) == State.SUCCEEDED


def test_follow_and_wait_start_a_stopped_core(cli, home, monkey):
    """`daemon stop` while a job runs, then `logs --follow`: the job ends, the follow too."""
    gate = Path("gate3")
    job = monkey.run(
        ["sh", "-c", f"echo up; while [ ! -e {gate.resolve()} ]; do sleep 0.05; done; echo down"]
    )
    wait_for(lambda: job.logs() == "up\n", what="the job to start")
    cli("daemon", "stop", check=True)
    gate.touch()
    follow = cli("logs", "--follow", job.juid, timeout=60)
    assert (follow.returncode, follow.stdout) == (0, "up\ndown\n")
    assert core_pid(home)
    cli("daemon", "stop", check=True)
    later = monkey.run(["echo", "later"], start_core=False)
    assert later.wait(timeout=60) == State.SUCCEEDED
    assert later.logs() == "later\n"


def test_cancel_asked_while_a_start_is_refused_is_not_lost(home, monkey):
    from monkey.config import Home
    from monkey.core.scheduler import Core
    from monkey.models import Request

    core = Core(Home(home))
    try:
        cancelled = monkey.run(["true"], start_core=False)
        queued = monkey.run(["true"], start_core=False)
        for job in (cancelled, queued):
            record = monkey.store.get_job(job.juid)
            monkey.store.begin_attempt(record, "local", str(home / "runs" / job.juid / "1"))
        assert monkey.store.set_request(cancelled.juid, Request.CANCEL.value, [State.DISPATCHING])
        for job in (cancelled, queued):  # the agent answered: never started
            core._never_started(monkey.store.get_attempt(job.juid, 1))
        assert cancelled.status == State.CANCELLED
        assert queued.status == State.QUEUED  # started again later, no retry used
        assert [a.reason for a in queued.attempts()] == ["never started"]
    finally:
        core.close()


def test_an_exit_the_store_cannot_take_as_sent_never_stops_the_core(home, monkey):
    """A cluster agent's exit can reach the core before its `started` did (a watch event
    late or reordered, a relay replaying it): the exit proves the command started, so the
    job ends as it says; an exit of an attempt ended or moved meanwhile is ignored; the
    pushes after them are handled in the same pass."""
    from monkey.config import Home
    from monkey.core.scheduler import Core

    core = Core(Home(home))
    try:
        early, moved, other = (monkey.run(["true"], start_core=False) for _ in range(3))
        for job in (early, moved, other):
            record = monkey.store.get_job(job.juid)
            monkey.store.begin_attempt(record, "lab", str(home / "runs" / job.juid / "1"))
        monkey.store.end_attempt(moved.juid, 1, final=State.QUEUED, exit_code=None,
                                 signal=None, reason="given up", move_to="local")  # fmt: skip
        now = time.time()

        def push(juid: str, kind: str, offset: int, **event: object) -> dict:
            return {"push": "event", "juid": juid, "attempt": 1, "offset": offset,
                    "event": {"seq": 1, "ts": now, "type": kind, **event}}  # fmt: skip

        ended = {"code": 0, "signal": None, "reason": "exited"}
        core._handle_pushes(("lab", "lab"), [
            push(early.juid, "exit", 80, **ended),
            push(moved.juid, "exit", 80, **ended),
            push(other.juid, "started", 40, pid=0),
        ])  # fmt: skip
        assert early.status == State.SUCCEEDED
        assert [(a.exit_code, a.reason) for a in early.attempts()] == [(0, "exit 0")]
        assert moved.status == State.QUEUED and monkey.store.get_job(moved.juid).provider == "local"
        assert other.status == State.RUNNING
    finally:
        core.close()


def test_agent_killed_while_the_core_is_stopped_is_noticed(home, monkey):
    """The agent dies while the core, stopped, has not read its last events: the core
    reads them, notices the broken link, connects to a new agent and follows the rest."""
    gates = [Path("gate-a").resolve(), Path("gate-b").resolve()]
    jobs = [
        monkey.run(["sh", "-c", f"echo up; while [ ! -e {g} ]; do sleep 0.02; done; echo down"])
        for g in gates
    ]
    for job in jobs:
        wait_for(lambda j=job: j.logs() == "up\n" and j.status == State.RUNNING, what="the jobs")
    core = core_pid(home)
    agent = _agent_pid(home)
    os.kill(core, signal.SIGSTOP)
    try:
        gates[0].touch()
        events = home / "runs" / jobs[0].juid / "1" / "events.jsonl"
        wait_for(lambda: b'"type":"exit"' in events.read_bytes(), what="the agent to see A end")
        os.kill(agent, signal.SIGKILL)
        wait_for(lambda: _dead(agent), what="the agent to die")
    finally:
        os.kill(core, signal.SIGCONT)
    assert jobs[0].wait(timeout=60) == State.SUCCEEDED
    gates[1].touch()  # B ends after the agent that started it is gone
    assert jobs[1].wait(timeout=60) == State.SUCCEEDED
    assert [job.logs() for job in jobs] == ["up\ndown\n", "up\ndown\n"]
    assert [len(job.attempts()) for job in jobs] == [1, 1]
    assert core_pid(home) == core


def test_a_wedged_agent_is_noticed(home, monkey, monkeypatch):
    """The link stays open but the agent answers nothing (stopped, or a half-open
    connection): after the heartbeat timeout the job shows its instance unreachable, and
    after the provider's lost_after the attempt is lost, not followed for ever."""
    monkeypatch.setenv("MONKEY_HEARTBEAT_TIMEOUT", "2")
    (home / "providers.yml").write_text("providers:\n  local: {type: local, lost_after: 4}\n")
    job = monkey.run(["sh", "-c", "echo up; sleep 300"])
    wait_for(lambda: job.logs() == "up\n" and job.attempts()[0].heartbeat_at, what="heartbeats")
    agent = _agent_pid(home)
    os.kill(agent, signal.SIGSTOP)
    try:
        wait_for(
            lambda: job.record.unreachable_since, timeout=60, what="the job to show unreachable"
        )
        assert job.status == State.RUNNING
        wait_for(lambda: job.status == State.LOST, timeout=60, what="the attempt to be lost")
    finally:
        os.kill(agent, signal.SIGCONT)
    assert job.attempts()[0].reason.startswith("its instance was unreachable for ")
    assert job.attempts()[0].reason.endswith("(lost_after 4s)")


def _gated_job(monkey, gate: Path):
    """A job that prints `up`, waits for ``gate`` to exist, prints `down` and exits 3."""
    job = monkey.run(
        [
            "sh",
            "-c",
            f"echo up; while [ ! -e {gate.resolve()} ]; do sleep 0.05; done; echo down; exit 3",
        ]
    )
    wait_for(lambda: job.logs() == "up\n", what="the job to start")
    return job


def test_follow_survives_the_core_dying_while_it_follows(home, monkey):
    """SIGKILL the core after `logs --follow` started: it starts another and sees the end."""
    job = _gated_job(monkey, Path("gate4"))
    follow = subprocess.Popen(
        [sys.executable, "-m", "monkey", "logs", "--follow", job.juid],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert follow.stdout.readline() == "up\n"  # it has woken the core already
        kill_core(home)
        Path("gate4").touch()  # the job ends while no core runs; only a core can record it
        out, err = follow.communicate(timeout=90)  # a hang guard, not a timing
    finally:
        follow.kill()
        follow.wait()
    assert (follow.returncode, "up\n" + out) == (3, "up\ndown\n"), err
    assert f"job {job.juid} failed (exit 3)" in err
    assert core_pid(home)
    assert len(job.attempts()) == 1


def test_wait_survives_the_core_dying_while_it_waits(home, monkey):
    """SIGKILL the core while `Job.wait()` waits, twice: it starts another and returns the end."""
    job = _gated_job(monkey, Path("gate5"))
    script = (
        "import sys\nfrom monkey import Monkey\njob = Monkey().job(sys.argv[1])\n"
        "print(job.wait().value, job.exit_code)"
    )
    waiter = subprocess.Popen(
        [sys.executable, "-c", script, job.juid], stdout=subprocess.PIPE, text=True
    )
    try:
        first = core_pid(home)
        kill_core(home)
        # Only the waiter starts a core here, so once one runs the waiter is surely waiting.
        wait_for(lambda: core_pid(home) not in (None, -1, first), what="the waiter to start a core")
        kill_core(home)
        Path("gate5").touch()  # the job ends while no core runs; only a core can record it
        out = waiter.communicate(timeout=90)[0]  # a hang guard, not a timing
    finally:
        waiter.kill()
        waiter.wait()
    assert (waiter.returncode, out) == (0, "failed 3\n")
    assert core_pid(home)
    assert len(job.attempts()) == 1


def test_a_new_core_tries_an_instance_before_counting_a_stepped_hour_as_out_of_reach(home, monkey):
    """A core marks an instance out of reach (its agent died), the wall clock steps an hour
    ahead, the core dies before it links again (the fault storm's clock storm once lost 25
    jobs so). The next core's own connect finds the job; the hour the stored time claims is
    never silence this core saw, and the attempt is not lost."""
    from monkey.store import Store

    gate = Path("gate-step").resolve()
    job = _gated_job(monkey, gate)
    kill_core(home)
    agent = _agent_pid(home)
    os.kill(agent, signal.SIGKILL)
    wait_for(lambda: _dead(agent), what="the agent to die")
    # What the killed core left, read an hour of wall clock later.
    assert Store(home / "monkey.db").set_unreachable(job.juid, 1, time.time() - 3600, "test")
    start_core(home)
    gate.touch()
    assert job.wait(timeout=60) == State.FAILED  # the gated job's own exit 3
    assert job.logs() == "up\ndown\n"
    [attempt] = job.attempts()
    assert attempt.exit_code == 3, attempt.reason
