"""Large sweeps: written in batches that let other writers in, capped unless asked for, and
never half-run when their submission is killed half-way."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from conftest import start_core, wait_for

from monkey.models import MonkeyError, State
from monkey.store.tracking import HOLD

SWEEP = ["sweep", "--uniform", "lr=0.001:0.1", "--max-parallel", "1", "--", "true", "{lr}"]


def start_sweep(cells: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "monkey",
            "sweep",
            "--random",
            str(cells),
            "--max-cells",
            str(cells),
            *SWEEP[1:],
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ.copy(),
    )


def submitting(monkey) -> dict | None:
    found = monkey.store.list_sweeps(states=["submitting"])
    return found[0] if found else None


def cell_numbers(monkey, sid: str) -> list[int]:
    return [int(juid.rsplit("-", 1)[1]) for juid, *_ in monkey.store.sweep_jobs_brief(sid)]


def test_runs_get_in_while_a_large_sweep_is_written(home, monkey, cli):
    start_core(home)
    sweep = start_sweep(20_000)
    sid = wait_for(
        lambda: (s := submitting(monkey)) and s["id"], what="the sweep to start writing its cells"
    )
    runs = []
    while sweep.poll() is None or len(runs) < 3:
        runs.append(cli("run", "--", "true"))
    out, err = sweep.communicate()
    assert sweep.returncode == 0, err
    assert "Traceback" not in err
    for run in runs:
        assert run.returncode == 0 and run.stderr == "", run.stderr
    numbers = cell_numbers(monkey, sid)
    assert len(numbers) == 20_000
    assert monkey.store.get_sweep(sid)["state"] == "running"
    # The sweep did not hold the lock throughout: some runs were recorded between its cells.
    between = [
        r for r in runs if min(numbers) < int(r.stdout.strip().rsplit("-", 1)[1]) < max(numbers)
    ]
    assert between, "no run got in while the sweep was written"
    for run in runs:
        assert monkey.job(run.stdout.strip()).wait(timeout=60) == State.SUCCEEDED


def test_killed_submission_leaves_a_sweep_marked_interrupted_whose_cells_never_run(
    home, monkey, cli
):
    start_core(home)
    sweep = start_sweep(100_000)
    sid = wait_for(
        lambda: (s := submitting(monkey)) and cell_numbers(monkey, s["id"]) and s["id"],
        what="some cells to be written",
    )
    os.kill(sweep.pid, signal.SIGKILL)
    sweep.wait()
    wait_for(
        lambda: monkey.store.get_sweep(sid)["state"] == "interrupted",
        what="the core to mark the sweep interrupted",
    )
    written = len(cell_numbers(monkey, sid))
    assert 0 < written < 100_000

    status = cli("sweep", "status", sid)
    assert f"{sid} ({sid}): interrupted" in status.stdout
    assert f"{written} of its 100000 cells written" in status.stdout
    assert "none will run" in status.stdout
    assert "interrupted" in cli("list", "sweeps").stdout
    refused = cli("sweep", "resume", sid)
    assert refused.returncode == 1 and f"monkey sweep cancel {sid}" in refused.stderr

    # The core dispatched a job submitted after the kill, and none of the sweep's cells.
    later = cli("run", "--", "true", check=True).stdout.strip()
    assert monkey.job(later).wait(timeout=60) == State.SUCCEEDED
    cells = monkey.store.list_jobs(sweep=sid)
    assert all(j.state == State.QUEUED and j.attempts == 0 and j.not_before >= HOLD for j in cells)
    assert cli("sweep", "cancel", sid).returncode == 0
    assert {j.state for j in monkey.store.list_jobs(sweep=sid)} == {State.CANCELLED}


def random_sweep(n: int, *options: str) -> list[str]:
    return ["--random", str(n), *options, "--uniform", "x=0:1", "--", "true", "{x}"]


GRID_10100 = [
    "--grid",
    "a=" + ",".join(map(str, range(101))),
    "--grid",
    "b=" + ",".join(map(str, range(100))),
    "--",
    "true",
    "{a}",
    "{b}",
]


@pytest.mark.parametrize(
    "args, message",
    [
        (
            random_sweep(10_001),
            "this sweep has 10,001 cells, more than the default cap of "
            "10,000; pass --max-cells 10001",
        ),
        (GRID_10100, "this sweep has 10,100 cells, more than the default cap"),
        (random_sweep(6, "--max-cells", "5"), "more than --max-cells 5; pass --max-cells 6"),
        (random_sweep(2, "--max-cells", "0"), "--max-cells must be a whole number >= 1"),
    ],
)
def test_sweeps_over_the_cap_are_refused(home, monkey, cli, args, message):
    proc = cli("sweep", *args)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert message in proc.stderr, proc.stderr
    assert monkey.store.list_sweeps() == []
    assert monkey.store.list_jobs() == []


def test_the_api_caps_sweeps_too(home, monkey):
    with pytest.raises(MonkeyError, match="max_cells=10001 in Python"):
        monkey.sweep(
            "true {x}",
            random=10_001,
            distributions={"x": {"distribution": "uniform", "min": 0, "max": 1}},
        )
    sid = monkey.sweep("true {x}", grid={"x": [1, 2, 3]}, max_cells=3, max_parallel=1)
    assert len(monkey.store.list_jobs(sweep=sid)) == 3
