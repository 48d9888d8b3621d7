"""MONKEY_HOME stays small (issue 13 §2): the code copy of an attempt is reclaimed when it
ends, `monkey rm` deletes jobs, `monkey gc` frees the blobs no job needs (and stays
consistent when killed), `monkey du` shows usage. Driven through the CLI as a user would."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from conftest import wait_for

from monkey.rerun import check_blobs
from monkey.sizes import tree_size
from monkey.snapshot import BlobStore
from monkey.store import Store

MB = 1 << 20


def run_job(cli, *argv: str, code: int = 0) -> str:
    juid = cli("run", "--", *argv, check=True).stdout.strip()
    follow = cli("logs", "--follow", juid)
    assert follow.returncode == code, follow.stderr
    return juid


def blob_files(home: Path) -> dict[str, int]:
    return {p.parent.name + p.name: p.stat().st_size for p in (home / "blobs").glob("??/*")}


def blob_count(home: Path) -> int:
    """Blob files now (while a gc may be deleting them)."""
    return sum(len(os.listdir(shard)) for shard in (home / "blobs").glob("??"))


def assert_consistent(home: Path) -> None:
    """The database is sound, every blob it lists is there, and every job can run again."""
    db = sqlite3.connect(home / "monkey.db")
    try:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        rows = {d for (d,) in db.execute("SELECT digest FROM blobs")}
    finally:
        db.close()
    assert rows <= set(blob_files(home)), "a blob row without its file"
    store = Store(home / "monkey.db")
    try:
        for job in store.list_jobs():
            check_blobs(BlobStore(home / "blobs"), job, store.job_spec(job.juid), git=True)
    finally:
        store.close()


def test_the_code_copy_is_reclaimed_when_the_job_ends(cli, home: Path) -> None:
    for i in range(5):
        Path(f"weights{i}.bin").write_bytes(os.urandom(10 * MB))
    Path("train.py").write_text(
        "import os\nassert os.path.getsize('weights3.bin') == 10 << 20\n"
        "os.makedirs('results', exist_ok=True)\nopen('results/score.txt', 'w').write('0.9')\n"
        "print('trained')\n"
    )
    juid = cli(
        "run", "--outputs", "results/*", "--", sys.executable, "train.py", check=True
    ).stdout.strip()
    assert cli("logs", "--follow", juid).stdout == "trained\n"
    run_dir = home / "runs" / juid / "1"
    wait_for(lambda: not (run_dir / "code.json").exists(), what="the code copy to be reclaimed")
    size, _ = tree_size(home / "runs" / juid)
    assert size < MB, f"the run folder holds {size} bytes after the job"
    assert (run_dir / "work" / "results" / "score.txt").read_text() == "0.9"
    assert (run_dir / "stdout.log").read_text() == "trained\n"
    assert not (run_dir / "work" / "weights0.bin").exists()
    # The code is still in the blob store: the job can be seen and run again.
    assert cli("cat", juid, "train.py", check=True).stdout.startswith("import os")
    again = cli("rerun", juid, check=True).stdout.strip().split()[-1]
    assert cli("logs", "--follow", again).stdout == "trained\n"
    # Its copy too is deleted after its end, by the agent's reclaiming thread.
    rerun_record = home / "runs" / again / "1" / "code.json"
    wait_for(lambda: not rerun_record.exists(), what="the rerun's code copy to be reclaimed")
    assert rerun_record.parent.is_dir()
    usage = json.loads(cli("du", "--json", check=True).stdout)
    assert 50 * MB <= usage["blobs"]["bytes"] < 51 * MB  # stored once for both jobs
    assert usage["runs"]["bytes"] < MB and usage["runs"]["jobs"] == 2


def test_rm_and_gc_free_the_expected_bytes(cli, home: Path) -> None:
    Path("shared.bin").write_bytes(os.urandom(4 * MB))
    Path("a.bin").write_bytes(os.urandom(20 * MB))
    first = run_job(cli, "true")
    os.unlink("a.bin")
    Path("b.bin").write_bytes(os.urandom(8 * MB))
    second = run_job(cli, "false", code=1)  # a failed job
    assert len({first, second}) == 2

    refused = cli("rm", first)  # no terminal and no --yes: nothing deleted
    assert refused.returncode != 0 and "--yes" in refused.stderr
    assert cli("info", "job", first).returncode == 0

    before = sum(blob_files(home).values())
    out = cli("rm", "--yes", first, check=True).stdout
    assert "deleted 1 jobs" in out
    assert cli("info", "job", first).returncode != 0 and not (home / "runs" / first).exists()
    gc = cli("gc", "--grace", "0s", check=True).stdout
    freed = before - sum(blob_files(home).values())
    # a.bin and the first job's file list went; shared.bin and b.bin stay for the second job.
    assert 20 * MB <= freed < 20 * MB + 64 * 1024, freed
    assert gc.startswith("freed 21.0 MB") and "1 folders" not in gc, gc
    assert_consistent(home)
    assert cli("gc", "--grace", "0s", check=True).stdout.startswith("freed 0 B")

    # --failed selects the second job; afterwards gc leaves an empty blob store.
    assert "deleted 1 jobs" in cli("rm", "--failed", "--yes", check=True).stdout
    cli("gc", "--grace", "0s", check=True)
    assert blob_files(home) == {}
    assert_consistent(home)


def test_rm_refuses_a_running_job(cli, home: Path) -> None:
    juid = cli("run", "--", "sleep", "60", check=True).stdout.strip()
    wait_for(lambda: "running" in cli("info", "job", juid).stdout, what="the job to run")
    out = cli("rm", "--yes", juid)
    assert out.returncode != 0 and "cancel it first" in out.stderr
    assert cli("info", "job", juid).returncode == 0
    cli("job", "cancel", juid, check=True)


def test_gc_killed_midway_leaves_the_store_consistent(cli, home: Path) -> None:
    Path("pkg").mkdir()
    for i in range(3000):
        Path(f"pkg/m{i}.py").write_text(f"V = {i}  # {os.urandom(8).hex()}\n")
    doomed = run_job(cli, "true")
    for i in range(3000):
        os.unlink(f"pkg/m{i}.py")
    Path("keep.txt").write_text("kept\n")
    kept = run_job(cli, "cat", "keep.txt")
    cli("rm", "--yes", doomed, check=True)
    before = blob_count(home)
    gc = subprocess.Popen(
        [sys.executable, "-m", "monkey", "gc", "--grace", "0s"],
        stdout=subprocess.DEVNULL,
        env=os.environ.copy(),
    )
    # Kill it once it has started deleting (or at its end, if it was quicker than the poll).
    wait_for(
        lambda: gc.poll() is not None or blob_count(home) < before,
        every=0.001,
        what="gc to start deleting",
    )
    gc.send_signal(signal.SIGKILL)
    gc.wait()
    assert_consistent(home)
    # A second gc finishes the work: what is left is the kept job's (keep.txt, its file
    # list, its package list), and it runs again.
    cli("gc", "--grace", "0s", check=True)
    assert_consistent(home)
    assert len(blob_files(home)) < 5
    again = cli("rerun", kept, check=True).stdout.strip().split()[-1]
    assert cli("logs", "--follow", again).returncode == 0


ENV_JOB = """\
name: envs
run:
  env_type: pip
  env_file: requirements.txt
"""


def test_gc_frees_environments_and_dataset_copies_no_job_uses(cli, home: Path) -> None:
    Path("job.yml").write_text(ENV_JOB)
    Path("data").mkdir()

    def submit(version: str) -> str:
        """A job in a virtualenv of its own requirements, reading a dataset of its own."""
        Path("requirements.txt").write_text(f"# {version}\n")
        Path("data/weights.bin").write_bytes(os.urandom(3 * MB))
        juid = cli(
            "run",
            "--dataset",
            "data:weights",
            "--",
            "sh",
            "-c",
            'test -n "$VIRTUAL_ENV" && ls "$MONKEY_DATASET_WEIGHTS"',
            check=True,
        ).stdout.strip()
        follow = cli("logs", "--follow", juid)
        assert follow.returncode == 0 and "weights.bin" in follow.stdout, follow.stderr
        return juid

    gone, old, kept = submit("first"), submit("second"), submit("third")
    envs, datasets = home / "envs", home / "datasets"

    def key(juid: str) -> str:
        return json.loads((home / "runs" / juid / "1" / "setup.json").read_text())["key"]

    def digest(juid: str) -> str:
        return json.loads(cli("info", juid, "--json", check=True).stdout)["datasets"][0]["digest"]

    gone_env, gone_data = envs / key(gone), datasets / digest(gone)
    old_env, old_data = envs / key(old), datasets / digest(old)
    assert old_env.is_dir() and old_data.is_dir() and key(old) != key(kept)
    env_bytes, _ = tree_size(old_env)
    before = json.loads(cli("du", "--json", check=True).stdout)
    assert before["envs"]["bytes"] > 2.9 * env_bytes > 0
    assert before["datasets"]["bytes"] >= 9 * MB

    assert cli("gc", "--grace", "0s", check=True).stdout.startswith("freed 0 B")  # all in use
    cli("rm", "--yes", gone, check=True)
    out = cli("gc", "--grace", "0s", check=True).stdout
    freed = re.search(r"1 environments \((\d+\.\d) MB\), 1 dataset copies \(3\.1 MB\)", out)
    assert freed and abs(float(freed.group(1)) * 1e6 - env_bytes) < 0.1 * env_bytes, out
    assert not gone_env.exists() and not gone_data.exists()
    cli("rm", "--yes", old, check=True)
    # Killed midway (once it set the first folder aside, or at its end): nothing a job uses
    # is touched, and the next gc finishes.
    gc = subprocess.Popen(
        [sys.executable, "-m", "monkey", "gc", "--grace", "0s"],
        stdout=subprocess.DEVNULL,
        env=os.environ.copy(),
    )
    wait_for(
        lambda: gc.poll() is not None or any(envs.glob(".gc-*")) or not old_env.exists(),
        every=0.001,
        what="gc to start deleting",
    )
    gc.send_signal(signal.SIGKILL)
    gc.wait()
    assert (envs / key(kept)).is_dir() and (datasets / digest(kept)).is_dir()
    out = cli("gc", "--grace", "0s", check=True).stdout
    assert not old_env.exists() and not old_data.exists(), out
    assert not list(envs.glob(".gc-*")) and not list(datasets.glob(".gc-*"))
    assert not (datasets / f"{old_data.name}.stamp").exists()
    after = json.loads(cli("du", "--json", check=True).stdout)
    assert before["envs"]["bytes"] - after["envs"]["bytes"] >= 2 * env_bytes * 0.9
    assert before["datasets"]["bytes"] - after["datasets"]["bytes"] >= 6 * MB
    assert_consistent(home)

    # The job that remains runs again in its environment (reused) and its dataset copy.
    again = cli("rerun", kept, check=True).stdout.strip().split()[-1]
    assert cli("logs", "--follow", again).returncode == 0
    record = json.loads((home / "runs" / again / "1" / "setup.json").read_text())
    assert record["key"] == key(kept) and record["reused"]


def test_gc_forgets_the_caches_of_projects_that_are_gone(
    cli, home: Path, tmp_path: Path, monkeypatch
) -> None:
    """The stat cache (a digest per file) and the walk memo (ignore decisions per folder)
    keep rows for every project ever submitted; gc drops those of files and folders gone."""
    projects = {name: tmp_path / name for name in ("kept", "gone")}
    for folder in projects.values():
        (folder / "src").mkdir(parents=True)
        (folder / ".gitignore").write_text("*.log\n")
        (folder / "src" / "model.bin").write_bytes(os.urandom(MB))
    time.sleep(2.1)  # out of the racy window: the caches remember only older changes
    for folder in projects.values():
        monkeypatch.chdir(folder)
        run_job(cli, "true")

    def cached() -> tuple[set[str], set[str]]:
        db = sqlite3.connect(home / "monkey.db")
        try:
            files = {p for (p,) in db.execute("SELECT path FROM stat_cache")}
            return files, {r for (r,) in db.execute("SELECT root FROM walk_memo")}
        finally:
            db.close()

    files, roots = cached()
    for folder in projects.values():
        assert str(folder / "src" / "model.bin") in files and str(folder) in roots
    monkeypatch.chdir(tmp_path)
    (projects["kept"] / ".gitignore").unlink()  # a file gone from a project still there
    shutil.rmtree(projects["gone"])
    cli("gc", check=True)  # the default grace: caches do not wait for it

    files, roots = cached()
    gone = str(projects["gone"])
    assert not [f for f in files if f.startswith(gone + os.sep)], files
    assert gone not in roots
    assert str(projects["kept"] / ".gitignore") not in files
    assert str(projects["kept"] / "src" / "model.bin") in files
    assert str(projects["kept"]) in roots
    assert_consistent(home)
