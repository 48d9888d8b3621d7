"""What a job runs is fixed at submit time; data is stored once and found by the job."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import start_core

from monkey.models import State


def test_edit_after_submit_does_not_change_what_the_job_runs(home, monkey):
    show = "import os\nprint('version {}', os.path.exists('notes.log'))\n"
    Path("train.py").write_text(show.format("one"))
    Path("notes.log").write_text("ignored\n")
    Path(".gitignore").write_text("*.log\n")
    job = monkey.run([sys.executable, "train.py"], start_core=False)
    Path("train.py").write_text(show.format("two"))
    start_core(home)
    assert job.wait(timeout=60) == State.SUCCEEDED
    assert job.logs() == "version one False\n"  # and notes.log left out: .gitignore honoured


def test_unchanged_files_are_stored_once(home, monkey):
    Path("big.bin").write_bytes(os.urandom(1 << 20))
    first = monkey.run(["true"], start_core=False)
    count, size = monkey.store.blob_count()
    second = monkey.run(["true"], start_core=False)
    assert monkey.store.blob_count() == (count, size)
    assert first.record.snapshot == second.record.snapshot


def test_code_sent_as_a_delta_and_resent_when_the_agent_lost_it(home, monkey):
    Path("pkg").mkdir()
    for i in range(20):
        Path(f"pkg/m{i}.py").write_text(f"V = {i}\n")
    Path("old.txt").write_text("old\n")
    show = ["sh", "-c", "find . -type f ! -name '.*' | LC_ALL=C sort; cat pkg/m7.py"]
    first = monkey.run(show)
    assert first.wait(timeout=60) == State.SUCCEEDED
    Path("pkg/m7.py").write_text("V = 'changed'\n")
    Path("old.txt").unlink()
    Path("new.txt").write_text("new\n")
    second = monkey.run(show)
    assert second.wait(timeout=60) == State.SUCCEEDED
    names = sorted(f"./pkg/m{i}.py" for i in range(20))
    assert first.logs() == "\n".join(sorted([*names, "./old.txt"])) + "\nV = 7\n"
    assert second.logs() == "\n".join(sorted([*names, "./new.txt"])) + "\nV = 'changed'\n"
    cached = home / "manifests"
    assert {p.name for p in cached.iterdir()} == {
        f"{first.record.snapshot}.json",
        f"{second.record.snapshot}.json",
    }
    # the agent lost its cache: the start naming a list is refused, the job queued again
    # (no retry used) and started with the full list
    shutil.rmtree(cached)
    Path("new.txt").write_text("newer\n")
    third = monkey.run(["cat", "new.txt"])
    assert third.wait(timeout=60) == State.SUCCEEDED
    assert third.logs() == "newer\n"
    assert [a.reason for a in third.attempts()] == ["never started", "exit 0"]
    assert (cached / f"{third.record.snapshot}.json").exists()


def test_dataset_is_checksummed_stored_once_and_exposed(home, monkey, tmp_path):
    data = tmp_path / "mnist-data"
    data.mkdir()
    (data / "train.csv").write_text("1,2,3\n")
    (data / "sub").mkdir()
    (data / "sub" / "labels.txt").write_text("cat\n")
    script = 'cat "$MONKEY_DATASET_DIGITS/train.csv" "$MONKEY_DATASET_DIGITS/sub/labels.txt"'
    job = monkey.run(["sh", "-c", script], datasets=[f"{data}:digits"])
    assert job.wait(timeout=60) == State.SUCCEEDED
    assert job.logs() == "1,2,3\ncat\n"
    blobs = monkey.store.blob_count()
    again = monkey.run(["sh", "-c", script], datasets=[f"{data}:digits"])
    assert again.wait(timeout=60) == State.SUCCEEDED
    assert monkey.store.blob_count() == blobs
    assert again.record.datasets[0]["digest"] == job.record.datasets[0]["digest"]
    (data / "train.csv").write_text("4,5,6\n")
    changed = monkey.run(["sh", "-c", script], datasets=[f"{data}:digits"])
    assert changed.wait(timeout=60) == State.SUCCEEDED
    assert changed.logs() == "4,5,6\ncat\n"
    assert changed.record.datasets[0]["digest"] != job.record.datasets[0]["digest"]


def test_single_file_dataset(home, monkey, tmp_path):
    f = tmp_path / "weights.bin"
    f.write_bytes(b"\x00\x01\x02")
    job = monkey.run(["sh", "-c", 'wc -c < "$MONKEY_DATASET_WEIGHTS"'], datasets=[str(f)])
    assert job.wait(timeout=60) == State.SUCCEEDED
    assert job.logs().strip() == "3"


def test_git_commit_and_uncommitted_diff_are_recorded(home, monkey):
    env = dict(
        os.environ,
        GIT_AUTHOR_NAME="t",
        GIT_AUTHOR_EMAIL="t@t",
        GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@t",
    )
    Path("train.py").write_text("print(1)\n")
    for cmd in (["git", "init", "-q"], ["git", "add", "."], ["git", "commit", "-qm", "x"]):
        subprocess.run(cmd, check=True, env=env)
    Path("train.py").write_text("print(2)\n")
    job = monkey.run([sys.executable, "train.py"], start_core=False)
    git = job.record.git
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    assert git["commit"] == head and git["dirty"] is True
    diff = (home / "blobs" / git["diff"][:2] / git["diff"][2:]).read_text()
    assert "+print(2)" in diff


def test_a_job_that_changes_the_shared_dataset_copy_cannot_spoil_the_next_one(
    home, monkey, tmp_path
):
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    (data / "train.csv").write_text("1,2,3\n")
    (data / "sub" / "labels.txt").write_text("cat\n")
    spoil = (
        'chmod -R u+w "$MONKEY_DATASET_D"; echo spoiled > "$MONKEY_DATASET_D/train.csv"; '
        'rm "$MONKEY_DATASET_D/sub/labels.txt"; touch "$MONKEY_DATASET_D/extra"'
    )
    first = monkey.run(["sh", "-c", spoil], datasets=[f"{data}:d"])
    assert first.wait(timeout=60) == State.SUCCEEDED
    read = 'cat "$MONKEY_DATASET_D/train.csv" "$MONKEY_DATASET_D/sub/labels.txt"; ls "$MONKEY_DATASET_D"'
    second = monkey.run(["sh", "-c", read], datasets=[f"{data}:d"])
    assert second.wait(timeout=60) == State.SUCCEEDED
    assert second.logs() == "1,2,3\ncat\nsub\ntrain.csv\n"
