"""`run --after JOB` / `--after-any JOB` (issue 29, part 1): a job starts only once the jobs
it names succeeded (or ended), waits visibly meanwhile, is cancelled with the reason when
one it needs fails, and keeps all of that across a SIGKILLed core."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from conftest import kill_core, start_core, wait_for

ENDED = ("succeeded", "failed", "cancelled", "lost", "preempted")


def _state(monkey, juid: str) -> str:
    return monkey.store.get_job(juid).state.value


def _ended(monkey, *juids: str, timeout: float = 60) -> None:
    wait_for(
        lambda: all(_state(monkey, j) in ENDED for j in juids),
        timeout=timeout,
        what=f"jobs {', '.join(juids)} to end",
    )


def test_a_diamond_runs_in_order(monkey, tmp_path: Path):
    """A; B and C after A; D after B and C: each starts only after what it names ended,
    and D after both."""
    log = tmp_path / "order"
    step = f"sleep 0.5; echo $0 >> {log}"
    a = monkey.run(["sh", "-c", step, "a"]).juid
    b = monkey.run(["sh", "-c", step, "b"], after=a).juid
    c = monkey.run(["sh", "-c", step, "c"], after=[a]).juid
    d = monkey.run(["sh", "-c", step, "d"], after=f"{b},{c}").juid
    _ended(monkey, a, b, c, d)
    assert [_state(monkey, j) for j in (a, b, c, d)] == ["succeeded"] * 4
    order = log.read_text().split()
    assert order[0] == "a" and order[-1] == "d" and sorted(order[1:3]) == ["b", "c"]
    record = {j: monkey.store.get_job(j) for j in (a, b, c, d)}
    for late, early in ((b, a), (c, a), (d, b), (d, c)):
        assert record[late].started_at >= record[early].finished_at


def test_a_waiting_job_is_shown_waiting_and_says_on_which(monkey, cli):
    a = monkey.run(["sleep", "30"]).juid
    b = cli("run", "--after", "last", "--", "true", check=True).stdout.strip()
    wait_for(lambda: _state(monkey, a) == "running", what="the first job to run")
    table = cli("list", "jobs", check=True).stdout
    row = next(line for line in table.splitlines() if line.startswith(b))
    assert row.split()[2] == "waiting"
    listed = json.loads(cli("list", "jobs", "--json", check=True).stdout)["jobs"]
    mine = next(j for j in listed if j["job"] == b)
    assert (mine["state"], mine["waiting_on"]) == ("queued", [a])
    shown = cli("info", b, check=True).stdout
    assert f"waiting for {a} to succeed" in shown
    assert re.search(rf"\nafter +{a} \(waiting to succeed: running\)\n", shown), shown
    assert json.loads(cli("info", b, "--json", check=True).stdout)["after"] == [
        {"job": a, "any": False, "state": "running", "met": False}
    ]
    assert _state(monkey, b) == "queued"  # never started early
    cli("cancel", a, check=True)
    _ended(monkey, a, b)
    assert _state(monkey, b) == "cancelled"


def test_a_failed_dependency_cancels_its_dependents_in_a_chain(monkey, cli):
    a = monkey.run(["sh", "-c", "exit 3"]).juid
    b = monkey.run(["true"], after=a).juid
    c = monkey.run(["true"], after=b).juid
    any_end = monkey.run(["echo", "cleanup"], after_any=a).juid
    _ended(monkey, a, b, c, any_end)
    assert [_state(monkey, j) for j in (a, b, c, any_end)] == [
        "failed",
        "cancelled",
        "cancelled",
        "succeeded",
    ]
    assert monkey.store.get_job(b).reason == f"dependency {a} failed"
    assert monkey.store.get_job(c).reason == f"dependency {b} ended cancelled"
    assert f"cancelled (dependency {a} failed)" in cli("info", b, check=True).stdout
    assert monkey.store.get_job(b).attempts == 0  # it never ran


def test_retrying_a_dependency_does_not_revive_dependents_retrying_one_re_arms_it(
    monkey, cli, tmp_path: Path
):
    flag = tmp_path / "ready"
    a = monkey.run(["test", "-e", str(flag)]).juid
    b = monkey.run(["echo", "ran"], after=a).juid
    _ended(monkey, a, b)
    assert _state(monkey, b) == "cancelled"
    flag.touch()
    cli("retry", a, check=True)
    _ended(monkey, a)
    assert _state(monkey, a) == "succeeded"
    assert _state(monkey, b) == "cancelled"  # not revived by its dependency's retry
    cli("retry", b, check=True)  # re-armed: it waits for a, which has succeeded now
    _ended(monkey, b)
    assert _state(monkey, b) == "succeeded"
    assert monkey.logs(b) == b"ran\n"


def test_after_a_sweep_waits_for_every_cell_however_each_ended(monkey, tmp_path: Path):
    """A sweep's runs fail or are stopped early as a matter of course: the job after it
    waits for each to end, and runs."""
    log = tmp_path / "order"
    sid = monkey.sweep(
        ["sh", "-c", f"sleep 0.3; echo cell >> {log}; test $0 != 2", "{x}"],
        grid={"x": [1, 2, 3]},
        max_parallel=1,
        retries=0,
    )
    last = monkey.run(["sh", "-c", f"echo last >> {log}"], after=sid).juid
    cells = [row[0] for row in monkey.store.sweep_jobs_brief(sid)]
    assert [(d["job"], d["any"]) for d in monkey.info(last)["after"]] == [
        (c, True) for c in sorted(cells)
    ]
    _ended(monkey, last, *cells)
    assert sorted(monkey.store.get_job(c).state.value for c in cells) == [
        "failed",
        "succeeded",
        "succeeded",
    ]
    assert log.read_text().split() == ["cell", "cell", "cell", "last"]
    assert monkey.store.get_job(last).state.value == "succeeded"


def test_a_sweep_after_a_job_holds_every_cell(monkey):
    a = monkey.run(["sleep", "1"]).juid
    sid = monkey.sweep(["echo", "{x}"], grid={"x": [1, 2]}, after=a)
    cells = [row[0] for row in monkey.store.sweep_jobs_brief(sid)]
    assert all(monkey.info(c)["after"][0]["job"] == a for c in cells)
    _ended(monkey, a, *cells)
    a_end = monkey.store.get_job(a).finished_at
    assert all(monkey.store.get_job(c).started_at >= a_end for c in cells)


def test_dependencies_survive_a_sigkilled_core(monkey, home: Path):
    a = monkey.run(["sleep", "2"]).juid
    b = monkey.run(["sh", "-c", "echo once"], after=a).juid
    c = monkey.run(["true"], after=[b]).juid
    wait_for(lambda: _state(monkey, a) == "running", what="the first job to run")
    kill_core(home)
    start_core(home)
    _ended(monkey, a, b, c)
    assert [_state(monkey, j) for j in (a, b, c)] == ["succeeded"] * 3
    assert monkey.store.get_job(b).attempts == 1  # exactly once
    assert monkey.logs(b) == b"once\n"
    assert monkey.store.get_job(b).started_at >= monkey.store.get_job(a).finished_at


def test_naming_a_job_that_does_not_exist_records_nothing(monkey, cli):
    for argv, words in (
        (["--after", "26-01-01-999"], "--after 26-01-01-999: no job matches"),
        (["--after-any", "no-such-sweep"], "--after-any no-such-sweep: no sweep matches"),
        (["--after", ","], "an empty job id"),
    ):
        done = cli("run", *argv, "--", "true")
        assert done.returncode == 1, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and words in done.stderr
    assert monkey.store.list_jobs() == []


@pytest.mark.system  # starts a main node
def test_through_a_remote_the_main_node_resolves_and_holds_dependencies(home: Path, tmp_path):
    from mainnode import MainNode, wait_until_ended

    node = MainNode(home, tmp_path)
    node.start()
    try:
        node.add_remote()
        first = node.laptop("--remote", "lab", "run", "--", "sleep", "2").stdout.strip()
        done = node.laptop("--remote", "lab", "run", "--after", "last", "--", "echo", "then")
        assert done.returncode == 0, done.stderr
        second = done.stdout.strip()
        listed = node.laptop("--remote", "lab", "list", "jobs", "--json").stdout
        assert next(j for j in json.loads(listed)["jobs"] if j["job"] == second)["waiting_on"] == [
            first
        ]
        wait_until_ended(node, second)
        info = json.loads(node.server("info", second, "--json").stdout)
        assert info["state"] == "succeeded"
        assert info["after"] == [{"job": first, "any": False, "state": "succeeded", "met": True}]
        refused = node.laptop("--remote", "lab", "run", "--after", "99-01-01-001", "--", "true")
        assert refused.returncode == 1
        assert "--after 99-01-01-001: no job matches" in refused.stderr
    finally:
        node.close()


def test_a_job_others_wait_for_is_not_removed(monkey, cli):
    done = monkey.run(["true"])
    done.wait(timeout=60)
    hold = monkey.run(["sleep", "30"]).juid
    waiting = monkey.run(["true"], after=[done.juid, hold]).juid
    refused = cli("rm", "--yes", done.juid)
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines() == [
        f"monkey: error: job {waiting} waits for job {done.juid} (run --after); cancel it "
        f"first (`monkey job cancel {waiting}`) or leave {done.juid} out"
    ]
    assert monkey.store.get_job(done.juid) is not None
    cli("cancel", waiting, hold, check=True)
    _ended(monkey, waiting, hold)
    assert cli("rm", "--yes", done.juid).returncode == 0


def test_info_counts_the_rest_of_a_long_list(monkey, cli):
    sid = monkey.sweep(["echo", "{x}"], grid={"x": list(range(12))})
    cells = [row[0] for row in monkey.store.sweep_jobs_brief(sid)]
    _ended(monkey, *cells)
    after = monkey.run(["true"], after=sid).juid
    _ended(monkey, after)
    lines = [line for line in cli("info", after, check=True).stdout.splitlines()]
    shown = [line for line in lines if line.startswith("after ")]
    assert len(shown) == 11
    assert shown[-1].split(None, 1)[1] == "2 more, 2 of them done (--json lists them)"
    assert len(json.loads(cli("info", after, "--json", check=True).stdout)["after"]) == 12


def test_a_dependency_that_ends_or_runs_again_marks_its_waiting_jobs_changed(tmp_path: Path):
    """Whether a job waits is part of its record (`waiting`), and a change of it is a change
    of the job (`updated_at`), which the dashboard and Monkey Web redraw: when the job it
    waits for ends, and when that one is queued again for a retry."""
    from monkey.api import Monkey
    from monkey.models import State

    m = Monkey(tmp_path / "home")
    a = m.run(["true"], start_core=False).juid
    b = m.run(["true"], start_core=False, after=a).juid
    c = m.run(["true"], start_core=False, after_any=a).juid
    store, t = m.store, time.time() + 1000
    assert [store.get_job(j).waiting for j in (a, b, c)] == [False, True, True]
    assert [store.get_job(j).shown_state for j in (a, b, c)] == ["queued", "waiting", "waiting"]
    store.begin_attempt(store.get_job(a), "local", "/r/1", now=t)
    store.attempt_started(a, 1, 11, t)
    store.end_attempt(
        a, 1, final=State.FAILED, exit_code=1, signal=None, reason="x", requeue_after=0, now=t + 1
    )  # failed, and queued again at once for its retry: both still wait
    assert [(store.get_job(j).waiting, store.get_job(j).updated_at) for j in (b, c)] == [
        (True, t + 1),
        (True, t + 1),
    ]
    store.begin_attempt(store.get_job(a), "local", "/r/2", now=t + 2)
    store.attempt_started(a, 2, 12, t + 2)
    store.end_attempt(a, 2, final=State.SUCCEEDED, exit_code=0, signal=None, reason="x", now=t + 3)
    assert [(store.get_job(j).waiting, store.get_job(j).updated_at) for j in (b, c)] == [
        (False, t + 3),
        (False, t + 3),
    ]


def test_an_ending_finds_its_waiting_jobs_by_their_ids(tmp_path: Path):
    """The jobs waiting for one that ends are looked up by id among its dependents, never by
    walking every queued job: each ending cost more the more jobs were queued (1,000 trivial
    jobs submitted at once)."""
    from monkey.api import Monkey
    from monkey.models import State

    m = Monkey(tmp_path / "home")
    a = m.run(["true"], start_core=False).juid
    m.run(["true"], start_core=False, after=a)
    for _ in range(3):
        m.run(["true"], start_core=False)
    store, t = m.store, time.time()
    store.begin_attempt(store.get_job(a), "local", "/r/1", now=t)
    store.attempt_started(a, 1, 11, t)
    asked: list[str] = []
    store.db.set_trace_callback(asked.append)
    store.end_attempt(a, 1, final=State.SUCCEEDED, exit_code=0, signal=None, reason="x", now=t)
    store.db.set_trace_callback(None)
    [touch] = [sql for sql in asked if "FROM job_deps WHERE dep" in sql]
    plan = " / ".join(p[3] for p in store.db.execute("EXPLAIN QUERY PLAN " + touch))
    assert "(juid=?)" in plan and "(state=?)" not in plan, plan
