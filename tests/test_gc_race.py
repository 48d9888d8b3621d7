"""gc and submissions cannot race (issue 24 §3, §4): a gc killed midway never makes a later
submission of the same project lose its code; a gc started while a submission reuses old
blobs never deletes them; a submission killed while storing a large file leaves partial
files that `du` counts and the next gc removes, while a live submitter's are left alone.
Driven through the CLI as a user would."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import wait_for
from test_disk import assert_consistent, blob_count

MB = 1 << 20


def monkey_cmd(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "monkey", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ.copy(),
    )


def succeeds(cli, juid: str) -> None:
    follow = cli("logs", "--follow", juid)
    info = json.loads(cli("info", "job", juid, "--json", check=True).stdout)
    assert follow.returncode == 0 and info["state"] == "succeeded", info.get("reason")


def make_project(files: int) -> None:
    Path("pkg").mkdir(exist_ok=True)
    for i in range(files):
        Path(f"pkg/m{i}.py").write_text(f"V = {i}  # {os.urandom(8).hex()}\n")
    Path("main.py").write_text(
        f"import os\nassert len(os.listdir('pkg')) == {files}\nprint('ok')\n"
    )


def test_a_gc_killed_midway_never_breaks_the_next_submission_of_the_same_project(
    cli, home: Path
) -> None:
    make_project(3000)
    first = cli("run", "--", "python3", "main.py", check=True).stdout.strip()
    succeeds(cli, first)
    cli("rm", "--yes", first, check=True)
    before = blob_count(home)
    gc = monkey_cmd("gc", "--grace", "0s")
    wait_for(
        lambda: gc.poll() is not None or blob_count(home) < before,
        every=0.001,
        what="gc to start deleting",
    )
    gc.send_signal(signal.SIGKILL)
    gc.wait()
    # The project, unchanged, submitted again (its digests cached): every run of it works.
    for _ in range(2):
        again = cli("run", "--", "python3", "main.py", check=True).stdout.strip()
        succeeds(cli, again)
    assert_consistent(home)


def test_a_gc_started_during_a_submission_that_reuses_old_blobs_keeps_them(cli, home: Path) -> None:
    make_project(2000)
    previous = cli("run", "--", "python3", "main.py", check=True).stdout.strip()
    succeeds(cli, previous)
    for _ in range(4):
        cli("rm", "--yes", previous, check=True)  # its blobs stay, unreferenced, till a gc
        run = monkey_cmd("run", "--", "python3", "main.py")
        time.sleep(0.05)  # the race of the issue: gc 50 ms after the run
        gc = monkey_cmd("gc", "--grace", "0s")
        out, err = run.communicate(timeout=120)
        assert run.returncode == 0, err
        assert gc.wait(timeout=120) == 0, gc.stderr.read() if gc.stderr else ""
        previous = out.strip()
        succeeds(cli, previous)
        assert_consistent(home)


def partial_files(home: Path) -> list[Path]:
    return [*home.glob("blobs/.tmp-*"), *home.glob("blobs/??/.tmp-*")]


def test_partial_files_of_a_killed_submission_are_counted_and_removed_but_a_live_ones_kept(
    cli, home: Path
) -> None:
    Path("main.py").write_text("import os\nprint(os.path.getsize('big.bin'))\n")
    with open("big.bin", "wb") as f:
        for _ in range(300):
            f.write(os.urandom(MB))
    # A submission storing big.bin while a gc --grace 0s runs: its partial file is kept.
    run = monkey_cmd("run", "--", "python3", "main.py")
    wait_for(
        lambda: run.poll() is not None or partial_files(home),
        every=0.001,
        what="the submission to start storing big.bin",
    )
    gc = monkey_cmd("gc", "--grace", "0s")
    out, err = run.communicate(timeout=120)
    assert run.returncode == 0, err
    assert gc.wait(timeout=120) == 0
    juid = out.strip()
    follow = cli("logs", "--follow", juid)
    assert follow.returncode == 0 and follow.stdout == f"{300 * MB}\n", follow
    # Submissions killed while storing it (a changed big.bin each time) leave partial files.
    for _ in range(2):
        with open("big.bin", "r+b") as f:
            f.write(os.urandom(16))
        killed = monkey_cmd("run", "--", "python3", "main.py")
        wait_for(
            lambda p=killed: p.poll() is not None or partial_files(home),
            every=0.001,
            what="the submission to start storing big.bin",
        )
        killed.send_signal(signal.SIGKILL)
        killed.wait()
    left = partial_files(home)
    assert left, "no partial file to clean"
    size = sum(p.stat().st_size for p in left)
    usage = json.loads(cli("du", "--json", check=True).stdout)["blobs"]
    assert usage["partial_files"] == len(left) and usage["partial_bytes"] == size, usage
    assert "partial files" in cli("du", check=True).stdout
    cli("gc", "--grace", "0s", check=True)
    assert partial_files(home) == []
    assert json.loads(cli("du", "--json", check=True).stdout)["blobs"]["partial_files"] == 0
    succeeds(cli, juid)  # the first job's blobs are all there
    assert_consistent(home)
