"""Many submitters at once, plus the core: unique ids, no lock errors."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys

from conftest import REPO, core_pid, wait_for

from monkey.models import State

SUBMIT = """
import sys
from monkey.api import Monkey
m = Monkey()
ids = [m.run(["true"]).juid for _ in range(int(sys.argv[1]))]
print("\\n".join(ids))
"""


def test_eight_processes_submit_200_jobs_each(home, monkey):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SUBMIT, "200"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(8)
    ]
    ids = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        assert "locked" not in err
        ids += out.split()
    assert len(ids) == 1600
    assert len(set(ids)) == 1600
    assert sorted(j.juid for j in monkey.store.list_jobs()) == sorted(ids)
    wait_for(
        lambda: monkey.store.count_jobs() == {"succeeded": 1600},
        timeout=240,
        every=0.5,
        what="all 1600 jobs to finish",
    )


def test_a_lock_held_too_long_gives_one_line_and_the_core_waits_it_out(
    home, monkey, cli, monkeypatch
):
    monkeypatch.setenv("MONKEY_BUSY_WAIT", "1")
    gate = (home.parent / "gate").resolve()
    running = monkey.run(["sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done"])
    wait_for(lambda: running.status == State.RUNNING, what="the job to run")
    pid = core_pid(home)
    holder = sqlite3.connect(home / "monkey.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another program keeps the write lock
    try:
        proc = cli("run", "--", "true")
        assert proc.returncode == 1 and "Traceback" not in proc.stderr
        assert proc.stderr.startswith("monkey: error: ") and len(proc.stderr.splitlines()) == 1
        assert "stayed locked by another process" in proc.stderr
        wait_for(
            lambda: "cannot write" in cli("daemon", "status").stdout,
            what="the core to say it cannot write",
        )
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    gate.touch()  # its heartbeats could not be written meanwhile; its end can
    assert running.wait(timeout=60) == State.SUCCEEDED
    assert core_pid(home) == pid


def test_a_write_of_many_rows_waits_for_the_lock_like_any_other(home, monkey):
    """An admin's ``set_owner`` (one statement, many rows) while another program holds
    the write lock waits for it instead of failing at once."""
    import threading

    from monkey.store import Store

    juids = [monkey.run(["true"]).juid for _ in range(3)]
    holder = sqlite3.connect(home / "monkey.db", isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    threading.Timer(1.0, lambda: holder.execute("COMMIT")).start()
    Store(home / "monkey.db").set_owner(juids, "bob")
    holder.close()
    assert set(Store(home / "monkey.db").job_owners(juids).values()) == {"bob"}
