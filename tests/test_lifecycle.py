"""A researcher's session on the local provider: run, list, logs, info, cancel, pause, retry."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import sys
import time
from pathlib import Path

from conftest import REPO, core_pid, wait_for

from monkey.models import State

JUID = re.compile(r"^\d{2}-\d{2}-\d{2}-\d{3,}$")


def test_run_prints_id_and_logs_follow_streams_to_the_end(cli, home):
    Path("train.py").write_text(
        "import sys, time\nfor i in range(3):\n    print('step', i, flush=True)\n    time.sleep(0.1)\n"
        "print('oops', file=sys.stderr)\n"
    )
    run = cli("run", "--", sys.executable, "train.py", "--lr", "0.1", check=True)
    juid = run.stdout.strip()
    assert JUID.match(juid), run.stdout

    follow = cli("logs", "--follow", "last")
    assert follow.returncode == 0, follow.stderr
    assert follow.stdout == "step 0\nstep 1\nstep 2\noops\n"  # both streams, as written
    assert cli("logs", "--stderr", juid).stdout == "oops\n"

    listing = cli("list", "jobs", check=True).stdout
    line = next(x for x in listing.splitlines() if x.startswith(juid))
    assert "succeeded" in line and "train" in line and "--lr 0.1" in line

    data = json.loads(cli("list", "jobs", "--json", check=True).stdout)
    assert [j["job"] for j in data["jobs"]] == [juid] and data["total"] == 1
    assert data["jobs"][0]["state"] == "succeeded" and data["jobs"][0]["exit_code"] == 0
    assert data["jobs"][0]["argv"] == [sys.executable, "train.py", "--lr", "0.1"]

    info = json.loads(cli("info", "job", juid, "--json", check=True).stdout)
    assert info["snapshot"] and info["python"]
    assert [a["exit_code"] for a in info["attempts_detail"]] == [0]
    moves = [(e["old"], e["new"]) for e in info["events"] if e["new"]]
    assert moves == [
        (None, "queued"),
        ("queued", "dispatching"),
        ("dispatching", "running"),
        ("running", "succeeded"),
    ]
    text = cli("info", "job", "last", check=True).stdout
    assert "succeeded" in text and "exit 0" in text


def test_follow_exits_with_the_jobs_exit_code(cli, home):
    proc = cli("run", "--follow", "--", "sh", "-c", "echo before; exit 3")
    assert proc.returncode == 3
    assert proc.stdout == "before\n"
    assert "failed" in proc.stderr
    assert "monkey logs --stderr" not in proc.stderr  # both streams were followed: no hint
    assert cli("logs", "--follow", "last").returncode == 3
    assert cli("list", "jobs", "--failed", check=True).stdout.count("failed") == 1
    assert "no jobs match" in cli("list", "jobs", "--running", check=True).stdout


def test_python_api_and_seed_script_form(home, monkey):
    job = monkey.run([sys.executable, "-c", "print('api ok')"])
    assert job.wait(timeout=60) == State.SUCCEEDED
    assert job.logs() == "api ok\n"
    assert monkey.job("last").juid == job.juid
    assert [j.juid for j in monkey.jobs(state="succeeded")] == [job.juid]

    from monkeycli import MonkeyCLI

    seed = MonkeyCLI().run(f"{sys.executable} -u -c 'print(42)'")
    assert seed.wait(timeout=60) == State.SUCCEEDED
    assert seed.logs() == "42\n"
    assert seed.record.argv == [sys.executable, "-u", "-c", "print(42)"]


def _session_members(sid: int) -> list[int]:
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == sid and fields[0] != "Z":
                members.append(int(entry))
    return members


def test_cancel_kills_the_whole_process_tree(cli, home, monkey):
    Path("tree.sh").write_text("sleep 300 &\nsh -c 'sleep 300' &\necho ready\nwait\n")
    job = monkey.run(["sh", "tree.sh"])
    wait_for(
        lambda: job.logs() == "ready\n" and job.attempts()[0].pid,
        what="the job to start its children",
    )
    pid = job.attempts()[0].pid
    wait_for(lambda: len(_session_members(pid)) >= 3, what="the job's processes")
    out = cli("job", "cancel", job.juid, check=True).stdout
    assert job.juid in out
    assert job.wait(timeout=30) == State.CANCELLED
    wait_for(lambda: not _session_members(pid), timeout=10, what="the tree to die")
    assert job.attempts()[0].reason == "cancelled by user"


def test_cancel_and_pause_of_queued_jobs_take_effect_at_once(cli, home, monkey):
    job = monkey.run(["true"], start_core=False)
    held = monkey.run(["true"], start_core=False)
    assert cli("kill", "job", job.juid, check=True).stdout.strip() == f"{job.juid} cancelled"
    assert cli("job", "pause", held.juid, check=True).stdout.strip() == f"{held.juid} paused"
    assert job.status == State.CANCELLED and held.status == State.PAUSED
    assert job.attempts() == [] and held.attempts() == []
    bad = cli("job", "resume", job.juid)
    assert bad.returncode == 1 and "not paused" in bad.stderr
    assert cli("job", "resume", held.juid, check=True).stdout.strip() == f"{held.juid} queued"
    assert held.wait(timeout=60) == State.SUCCEEDED


def test_pause_and_resume_continue_from_the_checkpoint(cli, home, monkey):
    example = REPO / "examples" / "mnist.py"
    job = monkey.run([sys.executable, "-u", str(example), "--n-epochs", "6", "--sleep", "0.5"])
    wait_for(lambda: "epoch 2/6" in job.logs(), timeout=60, what="two epochs")
    assert cli("job", "pause", job.juid, check=True).returncode == 0
    assert job.wait(timeout=30) == State.PAUSED
    done = sum(line.startswith("epoch ") for line in job.logs().splitlines())
    assert 2 <= done < 6
    assert cli("job", "resume", job.juid, check=True).returncode == 0
    assert job.wait(timeout=120) == State.SUCCEEDED
    second = monkey.logs(job.juid, attempt=2).decode()
    first_epoch = int(re.search(r"resumed from epoch (\d+)", second).group(1))
    assert first_epoch >= done
    assert f"epoch {first_epoch + 1}/6" in second and "epoch 1/6" not in second
    assert "final test_acc" in second
    assert [a.reason for a in job.attempts()] == ["paused by user", "exit 0"]


def test_a_time_limit_stops_the_job_and_fails_it_without_retry(cli, home, monkey):
    script = "trap 'echo got TERM; exit 0' TERM; echo start; sleep 60 & wait"
    juid = cli("run", "--time", "2s", "--", "sh", "-c", script, check=True).stdout.strip()
    job = monkey.job(juid)
    assert job.wait(timeout=60) == State.FAILED
    assert job.logs() == "start\ngot TERM\n"  # SIGTERM first: it could checkpoint
    assert [a.reason for a in job.attempts()] == ["time limit 2s reached"]
    assert job.record.resources.time == 2
    # A rerun keeps the limit unless told otherwise; a bad limit is one line, nothing queued.
    again = cli("rerun", juid, "--time", "1:00:00", "--json", check=True).stdout
    assert json.loads(again)["resources"]["time"] == 3600
    cli("job", "cancel", "last", check=True)
    bad = cli("run", "--time", "soon", "--", "true")
    assert bad.returncode != 0
    assert bad.stderr.strip() == (
        "monkey: error: time limit 'soon' is not a duration; write e.g. 90s, "
        "30m, 2h, 1d or HH:MM:SS"
    )
    assert len(monkey.jobs()) == 2


def test_retries_rerun_a_failed_job_with_the_same_checkpoint_dir(home, monkey):
    script = (
        'if [ -f "$MONKEY_CHECKPOINT_DIR/seen" ]; then echo second; exit 0; fi; '
        'touch "$MONKEY_CHECKPOINT_DIR/seen"; echo first; exit 7'
    )
    job = monkey.run(["sh", "-c", script], retries=2)
    assert job.wait(timeout=60) == State.SUCCEEDED
    assert [(a.n, a.exit_code) for a in job.attempts()] == [(1, 7), (2, 0)]
    assert job.logs() == "first\nsecond\n"
    kinds = [e["kind"] for e in monkey.store.events(job.juid)]
    assert kinds.count("retry") == 1

    failing = monkey.run(["sh", "-c", "exit 5"], retries=1)
    assert failing.wait(timeout=60) == State.FAILED
    assert [a.exit_code for a in failing.attempts()] == [5, 5]
    assert failing.exit_code == 5


def test_retry_command_reruns_a_finished_job(cli, home, monkey):
    job = monkey.run(["sh", "-c", "echo run $MONKEY_ATTEMPT"])
    assert job.wait(timeout=60) == State.SUCCEEDED
    assert cli("job", "retry", "last", check=True).stdout.strip() == f"{job.juid} queued"
    wait_for(
        lambda: len(job.attempts()) == 2 and job.status == State.SUCCEEDED,
        timeout=60,
        what="the second attempt",
    )
    assert job.logs() == "run 1\nrun 2\n"
    assert cli("logs", job.juid, "--attempt", "2", check=True).stdout == "run 2\n"
    assert cli("logs", job.juid, "--tail", "1", check=True).stdout == "run 2\n"
    assert cli("logs", job.juid, "--tail", "2", check=True).stdout == "run 1\nrun 2\n"
    assert cli("logs", job.juid, "--follow", "--tail", "1", check=True).stdout == "run 2\n"


def test_secret_env_values_never_reach_the_database(cli, home, monkey):
    proc = cli(
        "run",
        "--env",
        "API_TOKEN=hunter2-secret",
        "--env",
        "SEED=7",
        "--follow",
        "--",
        "sh",
        "-c",
        'echo "${#API_TOKEN} ${API_TOKEN%%-*} seed=$SEED"',
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "14 hunter2 seed=7\n"
    job = monkey.job("last").record
    assert job.env["API_TOKEN"] == "<redacted>" and job.env["SEED"] == "7"
    for path in home.glob("monkey.db*"):
        assert b"hunter2-secret" not in path.read_bytes()
    secret_files = list((home / "secrets").iterdir())
    assert len(secret_files) == 1
    assert secret_files[0].stat().st_mode & 0o777 == 0o600


def test_local_slots_limit_concurrency(home, monkey):
    (home / "providers.yml").write_text("providers:\n  local: {type: local, slots: 1}\n")
    jobs = [monkey.run(["sh", "-c", "date +%s.%N; sleep 0.3; date +%s.%N"]) for _ in range(3)]
    for job in jobs:
        assert job.wait(timeout=60) == State.SUCCEEDED
    spans = sorted(tuple(map(float, job.logs().split())) for job in jobs)
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert start >= end


def test_a_start_held_for_a_busy_slot_is_cancelled_or_runs_once(cli, home, monkey, monkeypatch):
    # Every start after an exit is handed ahead of the slot, and held at most a second.
    monkeypatch.setenv("MONKEY_AHEAD_WINDOW", "60")
    monkeypatch.setenv("MONKEY_HOLD_LIMIT", "1")
    (home / "providers.yml").write_text("providers:\n  local: {type: local, slots: 1}\n")
    assert monkey.run(["true"]).wait(timeout=60) == State.SUCCEEDED
    busy = monkey.run(["sleep", "5"])
    wait_for(lambda: busy.status == State.RUNNING, what="the job taking the slot")
    marker, ran = home.parent / "cancelled-ran", home.parent / "ran.txt"
    doomed = monkey.run(["touch", str(marker)])
    wait_for(lambda: doomed.status == State.DISPATCHING, what="a start held by the agent")
    cli("job", "cancel", doomed.juid, check=True)
    assert doomed.wait(timeout=30) == State.CANCELLED
    assert [a.reason for a in doomed.attempts()] == ["never started"]
    later = monkey.run(["sh", "-c", f"echo ran >> {ran}"])
    assert later.wait(timeout=60) == State.SUCCEEDED
    assert busy.wait(timeout=30) == State.SUCCEEDED
    # withdrawn each second while the slot stayed taken, then run once it freed
    *withdrawn, last = later.attempts()
    assert withdrawn and {a.reason for a in withdrawn} == {"never started"}
    # (an attempt's end is its start plus its run time on the boot clock, issue 46 item 2: it
    # may lie a fraction of a millisecond past the wall-clock moment its slot freed)
    assert last.exit_code == 0 and last.started_at >= busy.attempts()[0].ended_at - 0.005
    assert ran.read_text() == "ran\n" and not marker.exists()


def test_job_environment(home, monkey):
    job = monkey.run(
        ["sh", "-c", 'echo "$MONKEY_JUID $MONKEY_ATTEMPT"; pwd; ls "$MONKEY_CHECKPOINT_DIR"']
    )
    assert job.wait(timeout=60) == State.SUCCEEDED
    juid_line, cwd, *_ = job.logs().splitlines()
    assert juid_line == f"{job.juid} 1"
    assert cwd.startswith(str(home / "runs" / job.juid))
    assert (home / "runs" / job.juid / "checkpoint").is_dir()


def test_database_is_sqlite_wal_with_a_schema_version(home, monkey):
    con = sqlite3.connect(home / "monkey.db")
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert con.execute("PRAGMA user_version").fetchone()[0] >= 1
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"jobs", "attempts", "instances", "events", "blobs", "migrations"} <= tables


def test_jobs_queued_behind_long_jobs_wait_in_the_queue(cli, home, monkey):
    """Starts are handed ahead of the slots only after short jobs: behind a job that ran a
    while, the next ones stay queued (no start held at the agent, no attempt withdrawn)."""
    (home / "providers.yml").write_text("providers:\n  local: {type: local, slots: 1}\n")
    assert monkey.run(["sleep", "1.2"]).wait(timeout=60) == State.SUCCEEDED
    busy = monkey.run(["sleep", "30"])
    after = monkey.run(["true"])
    wait_for(lambda: busy.status == State.RUNNING, what="the job taking the slot")
    time.sleep(2.5)  # longer than an agent holds a start
    assert after.status == State.QUEUED and after.attempts() == []
    cli("job", "cancel", busy.juid, check=True)
    assert after.wait(timeout=60) == State.SUCCEEDED
    assert [a.reason for a in after.attempts()] == ["exit 0"]


def test_the_core_copies_the_wal_into_the_database_file(home, monkey):
    """Writers leave the WAL to the core's checkpointer (no commit of theirs stalls on its
    fsyncs); what they wrote still reaches the database file itself within a second, also
    once the WAL was copied whole and writers reuse it from its start."""

    def in_the_file(count: int) -> bool:  # immutable: the file alone, without its WAL
        con = sqlite3.connect(f"file:{home / 'monkey.db'}?immutable=1", uri=True)
        try:
            return (
                con.execute("SELECT count(*) FROM jobs WHERE state = 'succeeded'").fetchone()[0]
                == count
            )
        except sqlite3.DatabaseError:  # no tables yet, or read while the checkpointer copies pages
            return False
        finally:
            con.close()

    for batch, total in ((20, 20), (5, 25)):
        jobs = [monkey.run(["true"]) for _ in range(batch)]
        assert all(job.wait(timeout=60) == State.SUCCEEDED for job in jobs)
        wait_for(
            lambda total=total: in_the_file(total),
            timeout=10,
            what=f"{total} jobs in the database file",
        )


def test_a_submission_after_a_quiet_spell_does_not_start_the_wal_over(home, monkey):
    """Once the WAL was copied whole, the next commit starts it over and fsyncs its header
    (and, on a new connection, its folder): 3-7 ms that fell on the first submission after
    every quiet spell. The core's checkpointer starts it over itself once it copied it."""
    from monkey.config import Home
    from monkey.core import daemon

    wal = home / "monkey.db-wal"

    def salt() -> bytes:  # salt-1 of the WAL's header: a new one at each start over
        return wal.read_bytes()[16:20]

    assert monkey.run(["true"]).wait(timeout=60) == State.SUCCEEDED
    seen: list[tuple[int, int]] = []

    def quiet() -> bool:  # unchanged over three of the checkpointer's looks
        st = wal.stat()
        seen.append((st.st_size, st.st_mtime_ns))
        return len(seen) > 3 and len(set(seen[-4:])) == 1

    wait_for(quiet, timeout=30, every=0.5, what="the WAL to be copied and left alone")
    daemon.stop(Home(home))  # no checkpointer from here on (this test's connection keeps the WAL)
    before = salt()
    monkey.run(["true"], start_core=False)
    assert salt() == before


def test_gpus_are_assigned_exclusively(home, monkey, cli):
    (home / "providers.yml").write_text(
        "providers:\n  local: {type: local, slots: 4, gpus: [0, 1]}\n"
    )
    gate = Path("gate").resolve()
    hold = f'echo "gpus=$CUDA_VISIBLE_DEVICES"; while [ ! -e {gate} ]; do sleep 0.05; done'
    first = monkey.run(["sh", "-c", hold], gpus=1)
    second = monkey.run(["sh", "-c", hold], gpus=1)
    third = monkey.run(["sh", "-c", 'echo "gpus=$CUDA_VISIBLE_DEVICES"'], gpus=1)
    cpu_only = monkey.run(["sh", "-c", 'echo "gpus=[$CUDA_VISIBLE_DEVICES]"'])
    assert cpu_only.wait(timeout=60) == State.SUCCEEDED
    assert cpu_only.logs() == "gpus=[]\n"  # a CPU job must not grab a GPU
    wait_for(lambda: first.logs() and second.logs(), what="both GPU jobs")
    assert {first.logs(), second.logs()} == {"gpus=0\n", "gpus=1\n"}
    assert third.status == State.QUEUED  # both GPUs are taken
    gate.touch()
    assert third.wait(timeout=60) == State.SUCCEEDED
    assert third.logs() in ("gpus=0\n", "gpus=1\n")
    bad = cli("run", "--gpus", "3", "--", "true")
    assert bad.returncode == 1 and "could never run" in bad.stderr
    providers = cli("list", "providers", check=True).stdout
    assert "local" in providers and " 2 " in providers


def test_providers_yml_edited_while_the_core_runs_takes_effect(home, monkey):
    """Raising `gpus` in providers.yml with the core up: the next job gets them (the core
    reads the file again) and a job running meanwhile goes on undisturbed."""
    gate = Path("gate").resolve()
    running = monkey.run(["sh", "-c", f"echo up; while [ ! -e {gate} ]; do sleep 0.05; done"])
    wait_for(lambda: running.logs() == "up\n", what="the first job to run")
    before = core_pid(home)
    (home / "providers.yml").write_text(
        "providers:\n  local: {type: local, slots: 4, gpus: [0, 1]}\n"
    )
    job = monkey.run(["sh", "-c", 'echo "gpus=$CUDA_VISIBLE_DEVICES"'], gpus=2)
    assert job.wait(timeout=60) == State.SUCCEEDED
    assert job.logs() == "gpus=0,1\n"
    assert core_pid(home) == before
    gate.touch()
    assert running.wait(timeout=60) == State.SUCCEEDED
    assert len(running.attempts()) == 1


def test_a_multi_line_command_stays_on_its_row_in_list_jobs(cli, home, monkey):
    job = monkey.run(["python3", "-c", "import sys\nprint(1)"], start_core=False)
    lines = cli("list", "jobs", check=True).stdout.splitlines()
    assert len(lines) == 2
    assert lines[1].startswith(job.juid) and lines[1].endswith("python3 -c 'import sys\\nprint(1)'")


def test_api_takes_one_dataset_env_or_output_as_a_plain_string(home, monkey):
    """`m.run(cmd, datasets="train.csv", env="SEED=3")` means one of each, not one per letter."""
    Path("train.csv").write_text("a,b\n")
    job = monkey.run(
        ["sh", "-c", 'cat "$MONKEY_DATASET_TRAIN"; echo "seed=$SEED"'],
        datasets="train.csv",
        env="SEED=3",
        outputs="results/*",
    )
    assert job.wait(timeout=60) == State.SUCCEEDED
    assert job.logs() == "a,b\nseed=3\n"
    assert monkey.run(["true"], datasets=Path("train.csv")).wait(timeout=60) == State.SUCCEEDED


def test_dataset_path_is_taken_from_the_current_folder_with_workdir(cli, home):
    """`monkey run --workdir proj --dataset proj/data.csv`: the path as the shell sees it."""
    Path("proj").mkdir()
    Path("proj/data.csv").write_text("1,2\n")
    run = cli(
        "run",
        "--follow",
        "--workdir",
        "proj",
        "--dataset",
        "proj/data.csv:d",
        "--",
        "sh",
        "-c",
        'cat "$MONKEY_DATASET_D"',
    )
    assert (run.returncode, run.stdout) == (0, "1,2\n"), run.stderr


def test_a_broken_providers_yml_does_not_stop_the_running_core(cli, home, monkey):
    """A half-edited providers.yml: the core keeps what it read, so a cancel still works."""
    job = monkey.run(["sleep", "60"])
    wait_for(lambda: job.status == State.RUNNING, what="the job to run")
    before = core_pid(home)
    (home / "providers.yml").write_text("providers: [half-written\n")
    cli("job", "cancel", job.juid, check=True)
    assert job.wait(timeout=60) == State.CANCELLED
    assert core_pid(home) == before


def test_a_missing_command_is_named_in_plain_words(cli, home):
    proc = cli("run", "--follow", "--", "nosuchcommand-xyz", "--flag")
    assert proc.returncode == 127
    err = cli("logs", "--stderr", "last", check=True).stdout
    assert (
        err
        == "monkey: command not found: nosuchcommand-xyz (not on the job's PATH, or not executable)\n"
    )


def test_a_command_that_cannot_start_fails_at_once_and_says_why(cli, home, monkey):
    """A missing command (127) or a script without its x bit (126) never started: retrying
    it would fail the same way, so --retries is not spent on it, and the reason says so."""
    missing = monkey.run(["nosuchcommand-xyz", "--lr", "0.1"], retries=2)
    assert missing.wait(timeout=60) == State.FAILED
    assert [(a.n, a.exit_code) for a in missing.attempts()] == [(1, 127)]
    assert missing.record.reason == (
        "failed to start: command not found: nosuchcommand-xyz "
        "(not on the job's PATH, or not executable)"
    )
    assert "retry" not in [e["kind"] for e in monkey.store.events(missing.juid)]
    shown = json.loads(cli("info", "job", missing.juid, "--json", check=True).stdout)
    assert shown["reason"] == missing.record.reason

    Path("train.sh").write_text("#!/bin/sh\necho trained\n")  # no x bit
    script = monkey.run(["./train.sh"], retries=2)
    assert script.wait(timeout=60) == State.FAILED
    assert [a.exit_code for a in script.attempts()] == [126]
    assert script.record.reason == (
        "failed to start: not executable: ./train.sh (a folder, "
        "or a file without its x bit: chmod +x it)"
    )
    assert script.logs(stderr=True) == (
        "monkey: not executable: ./train.sh (a folder, or a file without its x bit: chmod +x it)\n"
    )


def test_a_script_that_exits_127_itself_is_retried_as_any_failure(monkey):
    """Only the wrapper marks a command it could not run: the job's own `exit 127` (a
    command missing inside a script that did start) is an ordinary failure."""
    job = monkey.run(["sh", "-c", "nosuchcommand-xyz"], retries=1)
    assert job.wait(timeout=60) == State.FAILED
    assert [a.exit_code for a in job.attempts()] == [127, 127]
    assert job.record.reason == "exit 127"


def test_a_job_yml_job_whose_command_is_missing_fails_to_start(monkey):
    """The same through the launcher (a job.yml with persisted folders)."""
    Path("job.yml").write_text("name: t\npersist:\n  - name: out\n    path: out\n")
    job = monkey.run(["nosuchcommand-xyz"], retries=2)
    assert job.wait(timeout=60) == State.FAILED
    assert [a.exit_code for a in job.attempts()] == [127]
    assert job.record.reason.startswith("failed to start: command not found: nosuchcommand-xyz")


def test_a_job_whose_inputs_cannot_be_prepared_fails_after_three_tries(monkey, home, cli):
    """A cause that lasts (here a file where the job's checkpoint folder goes) fails the job
    with why, after a few tries; it never spins through thousands of attempts."""
    from conftest import start_core

    juid = monkey.run(["true"], start_core=False).juid
    blocker = home / "runs" / juid / "checkpoint"
    blocker.parent.mkdir(parents=True)
    blocker.write_text("not a folder\n")
    start_core(home)
    wait_for(lambda: monkey.job(juid).status == State.FAILED, what="the job to fail")
    info = json.loads(cli("info", "job", juid, "--json", check=True).stdout)
    assert len(info["attempts_detail"]) == 3
    assert "cannot prepare its inputs on" in info["attempts_detail"][-1]["reason"]
    assert "File exists" in info["attempts_detail"][-1]["reason"]


def test_listing_several_states_keeps_the_newest_first_across_them(monkey):
    """`list jobs --failed` (failed and lost) merges both states in submission order."""
    juids = [monkey.run(["true"], start_core=False).juid for _ in range(7)]
    states = ["failed", "lost", "lost", "succeeded", "failed", "lost", "failed"]
    with monkey.store.tx() as db:
        for juid, state in zip(juids, states):
            db.execute("UPDATE jobs SET state = ? WHERE juid = ?", (state, juid))
    picked = [j for j, s in zip(juids, states) if s in ("failed", "lost")]
    wanted = [State.FAILED, State.LOST]
    assert [j.juid for j in monkey.store.list_jobs(states=wanted, limit=4)] == picked[::-1][:4]
    assert [
        j.juid for j in monkey.store.list_jobs(states=wanted, limit=4, newest_first=False)
    ] == picked[:4]
    assert [j.juid for j in monkey.store.list_jobs(states=wanted)] == picked[::-1]
    assert monkey.store.count_listed(states=wanted) == len(picked)
