"""`monkey rerun`, `clone`, `cat`, `info job --files`: any run, again, from its record alone."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from monkey.models import MonkeyError
from monkey.rerun import apply_sets, rerun_name, write_files
from monkey.snapshot import BlobStore, FileEntry, load_manifest
from tests.conftest import wait_for
from tests.test_ssh import configure, lab  # noqa: F401  (the SSH hosts fixture)

# The job prints digests of its own source file and of its data, and the lr it was given.
TRAIN = """\
import hashlib, os, sys
src = hashlib.sha256(open(__file__, 'rb').read()).hexdigest()[:16]
data = hashlib.sha256(open(os.environ['MONKEY_DATASET_DATA'], 'rb').read()).hexdigest()[:16]
print('src', src, 'data', data, 'args', ' '.join(sys.argv[1:]))
"""


def git(*args: str, cwd: Path | str = ".") -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout


def job_info(cli, juid: str) -> dict[str, Any]:
    return json.loads(cli("info", "job", juid, "--json", check=True).stdout)


def finish(cli, juid: str, timeout: float = 60) -> str:
    """Wait for the job to end; its stdout."""
    wait_for(
        lambda: job_info(cli, juid)["state"] in ("succeeded", "failed"),
        timeout=timeout,
        what=f"{juid} to end",
    )
    info = job_info(cli, juid)
    assert info["state"] == "succeeded", (info, cli("logs", "--stderr", juid).stdout)
    return cli("logs", juid, check=True).stdout


@pytest.fixture
def project(home: Path, tmp_path: Path) -> dict[str, Any]:
    """A git repository with train.py committed, then changed (uncommitted), and a dataset
    beside it."""
    git("init", "-q", "-b", "main")
    git("config", "user.email", "t@example.com")
    git("config", "user.name", "T")
    Path("train.py").write_text(TRAIN)
    Path("lib").mkdir()
    Path("lib/util.py").write_text("X = 1\n")
    git("add", ".")
    git("commit", "-q", "-m", "first")
    edited = TRAIN + "# an uncommitted change\n"
    Path("train.py").write_text(edited)
    Path("notes.txt").write_text("untracked\n")
    data = tmp_path / "data.csv"
    data.write_text("a,b\n1,2\n")
    return {"data": data, "train": edited, "commit": git("rev-parse", "HEAD").strip()}


def test_rerun_runs_the_recorded_code_and_data_with_the_new_parameter(cli, project) -> None:
    first = json.loads(
        cli(
            "run",
            "--json",
            "-d",
            f"{project['data']}:DATA",
            "--",
            "python3",
            "train.py",
            "--lr",
            "0.1",
            "--epochs",
            "2",
            check=True,
        ).stdout
    )["job"]
    out_a = finish(cli, first)
    # The working folder and the data change after the submit.
    Path("train.py").write_text("print('changed')\n")
    project["data"].write_text("other data\n")

    second = cli("rerun", first, "--set", "lr=0.2", check=True).stdout.strip()
    out_b = finish(cli, second)
    src_a, data_a = out_a.split()[1], out_a.split()[3]
    assert out_b == f"src {src_a} data {data_a} args --lr 0.2 --epochs 2\n"
    assert out_a.endswith("args --lr 0.1 --epochs 2\n")

    diff = json.loads(cli("diff", first, second, "--json", check=True).stdout)
    assert set(diff) == {"jobs", "command", "params", "rerun_of"}, diff
    assert diff["params"] == {"lr": [0.1, 0.2]}  # a plain run's flags are its parameters
    assert diff["command"] == [
        "python3 train.py --lr 0.1 --epochs 2",
        "python3 train.py --lr 0.2 --epochs 2",
    ]
    assert diff["rerun_of"] == [None, first]
    text = cli("diff", first, second, check=True).stdout
    assert "[rerun_of]" in text and "[code]" not in text and "[git]" not in text
    info = cli("info", "job", second, check=True).stdout
    assert re.search(rf"^rerun of +{first} \(lr 0\.1 -> 0\.2\)$", info, re.MULTILINE), info
    assert job_info(cli, second)["rerun_of"] == {
        "job": first,
        "changes": {"params": {"lr": [0.1, 0.2]}},
    }

    # An unknown parameter: one line naming the known ones, nothing queued.
    bad = cli("rerun", first, "--set", "bogus=1")
    assert bad.returncode == 1
    assert bad.stderr == (
        f"monkey: error: job {first} has no parameter 'bogus'; its parameters: epochs, lr\n"
    )
    assert json.loads(cli("list", "jobs", "--json").stdout)["total"] == 2

    # cat and info --files show the code as the job saw it.
    assert cli("cat", second, "train.py", check=True).stdout == project["train"]
    files = cli("info", "job", second, "--files", check=True).stdout
    assert "train.py" in files and "lib/util.py" in files and "notes.txt" in files
    listed = json.loads(cli("info", "job", second, "--files", "--json", check=True).stdout)
    assert {f["path"]: f["size"] for f in listed}["train.py"] == len(project["train"])
    missing = cli("cat", second, "nope.py")
    assert missing.returncode == 1 and "has no code file 'nope.py'" in missing.stderr


def test_clone_writes_the_tree_byte_for_byte_with_git_diff_applied(
    cli, monkey, project, tmp_path: Path
) -> None:
    job = monkey.run(
        ["python3", "train.py"], datasets=[f"{project['data']}:DATA"], start_core=False
    )
    record = job.record
    Path("train.py").write_text("print('changed later')\n")
    dest = tmp_path / "copy"
    done = cli("clone", job.juid, "--to", str(dest), "--with-data", check=True)
    assert done.stdout.strip() == str(dest)
    blobs = BlobStore(monkey.home.blobs)
    for f in load_manifest(blobs, record.snapshot):
        path = dest / f.path
        assert path.read_bytes() == blobs.read_bytes(f.digest), f.path
        assert path.stat().st_mode & 0o777 == f.mode
    assert (dest / "train.py").read_text() == project["train"]
    assert (dest / "datasets" / "DATA" / "data.csv").read_text() == "a,b\n1,2\n"
    # A git clone at the job's commit whose uncommitted diff is the recorded one.
    assert git("rev-parse", "HEAD", cwd=dest).strip() == project["commit"]
    recorded = blobs.read_bytes(record.git["diff"])
    now = subprocess.run(
        ["git", "diff", "HEAD", "--binary"], cwd=dest, capture_output=True, check=True
    ).stdout
    assert now == recorded
    # The recorded diff applies to a plain checkout of the commit.
    plain = tmp_path / "plain"
    git("clone", "-q", os.getcwd(), str(plain), cwd=tmp_path)
    git("checkout", "-q", project["commit"], cwd=plain)
    (tmp_path / "p.patch").write_bytes(recorded)
    git("apply", str(tmp_path / "p.patch"), cwd=plain)
    assert (plain / "train.py").read_bytes() == (dest / "train.py").read_bytes()

    again = cli("clone", job.juid, "--to", str(dest))
    assert again.returncode == 1 and "exists and is not empty" in again.stderr


def test_write_files_refuses_unsafe_paths(monkey, tmp_path: Path) -> None:
    blobs = BlobStore(monkey.home.blobs)
    digest, _ = blobs.put_bytes(b"x")
    base = tmp_path / "out"
    base.mkdir()
    for rel in ("../escape", "/etc/passwd", "a/../../b"):
        with pytest.raises(MonkeyError, match="not a path inside"):
            write_files(blobs, [FileEntry(rel, digest, 0o644, 1)], base)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (base / "link").symlink_to(outside)
    with pytest.raises(MonkeyError, match="symlink leads it out"):
        write_files(blobs, [FileEntry("link/file", digest, 0o644, 1)], base)
    assert not (outside / "file").exists() and not (tmp_path / "escape").exists()


def test_set_rewrites_every_form_and_sweep_placeholders(monkey) -> None:
    job = monkey.run(
        ["python3", "t.py", "--lr=0.1", "batch_size=8", "--drop-out", "0.5"], start_core=False
    ).record
    argv, params, changed = apply_sets(
        job, {"lr": "0.2", "batch-size": "16", "drop_out": "0"}, None
    )
    assert argv == ["python3", "t.py", "--lr=0.2", "batch_size=16", "--drop-out", "0"]
    assert changed == {"lr": [0.1, 0.2], "batch_size": [8, 16], "drop-out": [0.5, 0]}
    assert params == {"lr": 0.2, "batch_size": 16, "drop-out": 0}
    cell = monkey.store.create_job(
        name="c",
        argv=["python3", "t.py", "--out", "runs/lr0.1"],
        params={"lr": 0.1},
        provider="local",
        resources=job.resources,
        env={},
        snapshot=None,
        workdir=".",
        datasets=[],
        git={},
        python="3",
    )
    argv, params, changed = apply_sets(
        cell, {"lr": "0.3"}, ["python3", "t.py", "--out", "runs/lr{lr}"]
    )
    assert argv == ["python3", "t.py", "--out", "runs/lr0.3"] and params == {"lr": 0.3}
    assert changed == {"lr": [0.1, 0.3]}
    argv, _, changed = apply_sets(
        cell, {"lr": "0.4", "out": "x"}, ["python3", "t.py", "--out", "runs/lr{lr}"]
    )
    assert argv == ["python3", "t.py", "--out", "x"]
    assert changed == {"lr": [0.1, 0.4], "out": ["runs/lr0.4", "x"]}


def test_set_leaves_every_untouched_word_byte_for_byte(monkey) -> None:
    """A sweep cell whose script's log_params recorded `l2` as 0.0: `--set lr=0.7` changes
    the lr word only; `--l2 0` stays `--l2 0` (it became `--l2 0.0`), and the default name
    of a rerun says it is one."""
    template = ["python3", "t.py", "--lr", "{lr}", "--l2", "{l2}"]
    cell = monkey.store.create_job(
        name="alice-sw-3",
        argv=["python3", "t.py", "--lr", "0.1", "--l2", "0"],
        params={"lr": 0.1, "l2": 0.0},  # l2 as the script's log_params recorded it
        provider="local",
        resources=monkey.run(["true"], start_core=False).record.resources,
        env={},
        snapshot=None,
        workdir=".",
        datasets=[],
        git={},
        python="3",
    )
    argv, params, changed = apply_sets(cell, {"lr": "0.7"}, template)
    assert argv == ["python3", "t.py", "--lr", "0.7", "--l2", "0"]
    assert changed == {"lr": [0.1, 0.7]} and params == {"lr": 0.7, "l2": 0.0}
    assert rerun_name("alice-sw-3") == "alice-sw-3-rerun"
    assert rerun_name("alice-sw-3-rerun") == "alice-sw-3-rerun2"
    assert rerun_name("alice-sw-3-rerun2") == "alice-sw-3-rerun3"


def test_api_rerun_and_missing_blob_error(cli, monkey, project) -> None:
    job = monkey.run(
        ["python3", "train.py", "--lr", "0.1"],
        datasets=[f"{project['data']}:DATA"],
        start_core=False,
    )
    again = job.rerun(set={"lr": 0.3}, name="again", start_core=False)
    assert again.record.argv == ["python3", "train.py", "--lr", "0.3"]
    assert again.record.name == "again" and again.record.snapshot == job.record.snapshot
    assert monkey.store.rerun_of(again.juid) == {
        "job": job.juid,
        "changes": {"params": {"lr": [0.1, 0.3]}, "name": ["train", "again"]},
    }
    # A blob deleted (by hand, or a damaged store): one line naming the job and the piece.
    blobs = BlobStore(monkey.home.blobs)
    [entry] = [f for f in load_manifest(blobs, job.record.snapshot) if f.path == "lib/util.py"]
    blobs.path(entry.digest).unlink()
    before = len(monkey.jobs())
    proc = cli("rerun", job.juid)
    assert proc.returncode == 1
    assert proc.stderr.startswith(
        f"monkey: error: job {job.juid} cannot be run again: its code "
        f"file lib/util.py (blob {entry.digest[:12]}) is missing from "
    )
    assert proc.stderr.count("\n") == 1
    assert len(monkey.jobs()) == before
    proc = cli("clone", job.juid, "--to", "out")
    assert proc.returncode == 1 and "code file lib/util.py" in proc.stderr
    assert not Path("out").exists() and not [p for p in os.listdir() if p.startswith(".out.")]


def test_rerun_failed_sweep_cells(cli, home: Path) -> None:
    Path("cell.py").write_text(
        "import sys\nx, ok = sys.argv[2], sys.argv[4]\n"
        "print('x', x, 'ok', ok)\nsys.exit(0 if x != '2' or ok == '1' else 3)\n"
    )
    sid = cli(
        "sweep",
        "--grid",
        "x=1,2,3",
        "--retries",
        "0",
        "--",
        "python3",
        "cell.py",
        "--x",
        "{x}",
        "--ok",
        "0",
        check=True,
    ).stdout.strip()
    wait_for(
        lambda: json.loads(cli("sweep", "status", sid, "--json").stdout)["state"] == "finished",
        timeout=60,
        what="the sweep to finish",
    )
    status = json.loads(cli("sweep", "status", sid, "--json").stdout)
    assert [j["state"] for j in status["jobs"]] == ["succeeded", "failed", "succeeded"]

    new = cli("rerun", "--sweep", sid, "--failed", "--set", "ok=1", check=True).stdout.strip()
    assert new != sid and new.startswith("sw-")
    wait_for(
        lambda: json.loads(cli("sweep", "status", new, "--json").stdout)["state"] == "finished",
        timeout=60,
        what="the rerun sweep to finish",
    )
    rerun = json.loads(cli("sweep", "status", new, "--json").stdout)
    [cell] = rerun["jobs"]
    assert cell["state"] == "succeeded" and cell["params"] == {"x": 2}
    assert rerun["spec"]["rerun_of"] == sid and rerun["spec"]["cells"] == 1
    assert cli("logs", cell["job"], check=True).stdout == "x 2 ok 1\n"
    assert job_info(cli, cell["job"])["rerun_of"]["job"] == status["jobs"][1]["job"]

    # In place: the first cell again, as a new job of the same sweep.
    assert (
        cli("rerun", "--sweep", sid, "--cells", "1", "--in-place", check=True).stdout.strip() == sid
    )
    wait_for(
        lambda: json.loads(cli("sweep", "status", sid, "--json").stdout)["state"] == "finished",
        timeout=60,
        what="the sweep to finish again",
    )
    assert len(json.loads(cli("sweep", "status", sid, "--json").stdout)["jobs"]) == 4
    none = cli("rerun", "--sweep", new, "--failed")
    assert none.returncode == 1 and "has no failed or lost cells" in none.stderr
    bad = cli("rerun", "--sweep", sid, "--cells", "9")
    assert bad.returncode == 1 and "has cells 1 to 4; no cell 9" in bad.stderr


def test_rerun_on_another_provider(cli, home: Path, lab, project) -> None:
    host = lab.add("h1")
    configure(home, [host.entry(key=lab.key)])
    first = json.loads(
        cli(
            "run",
            "--json",
            "-d",
            f"{project['data']}:DATA",
            "--",
            "python3",
            "train.py",
            "--lr",
            "0.1",
            check=True,
        ).stdout
    )["job"]
    out_a = finish(cli, first)
    Path("train.py").write_text("print('changed')\n")
    second = cli("rerun", first, "--provider", "lab", check=True).stdout.strip()
    out_b = finish(cli, second)
    assert out_b == out_a
    info = job_info(cli, second)
    assert info["provider"] == "lab" and info["instance"] == "lab/h1"
    assert info["rerun_of"]["changes"] == {"provider": ["local", "lab"]}


@pytest.mark.parametrize("flag", ["-f", "--follow"])
def test_rerun_follow_streams_the_new_job_and_exits_with_its_code(
    cli, home: Path, flag: str
) -> None:
    juid = cli("run", "--", "sh", "-c", "echo hi $0; exit 3", "there", check=True).stdout.strip()
    wait_for(lambda: job_info(cli, juid)["state"] == "failed", what=f"{juid} to fail")
    again = cli("rerun", juid, flag)
    assert "Traceback" not in again.stderr, again.stderr
    assert again.returncode == 3, again.stderr
    assert again.stdout == "hi there\n"
    new = re.match(r"monkey: job (\S+) queued on local\n", again.stderr)
    assert new and new.group(1) != juid, again.stderr
    assert f"monkey: job {new.group(1)} failed" in again.stderr
