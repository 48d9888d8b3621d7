"""Jobs described by a job.yml, run through the local provider by a real core and agent:
environments built once per worker, persisted folders across a pause, data folders,
set-up failures, `monkey logs --setup` and `monkey pull`."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from conftest import wait_for
from wheels import build_wheel

JOB_YML = """\
name: mnist
run:
  env_type: {env_type}
{env_file}  env:
    - TEST_ENV: "HELLO"
  install_script: setup.sh
code:
  path: "."
  ignore: ["data**", "output**", "venv**", "wheels**"]
persist:
  - name: output
    path: output
data:
  - name: mnist-data
    type: {data_type}
    path: data
    compression: gztar
providers:
  - name: gcp
    machine_type: n1-standard-2
    preemptible: true
"""

# Writes its progress to output/ and carries on from it: an unchanged script that resumes.
TRAIN = """\
import os, sys, time
try:
    import tinypkg
    print("package", tinypkg.VALUE)
except ImportError:
    print("no package")
print("env", os.environ.get("TEST_ENV"), "data", open("data/x.txt").read().strip(),
      "mounted" if os.path.islink("data") else "copied")
os.makedirs("output", exist_ok=True)
path = "output/progress.txt"
start = int(open(path).read()) if os.path.exists(path) else 0
print("start", start, flush=True)
steps, pause = int(sys.argv[1]), float(sys.argv[2])
for i in range(start, steps):
    with open(path + ".tmp", "w") as f:
        f.write(str(i + 1))
    os.replace(path + ".tmp", path)
    time.sleep(pause)
print("done", open(path).read(), flush=True)
"""


def make_project(
    folder: Path, env_type: str = "none", data_type: str = "copy", install: str = "echo installing"
) -> None:
    """A project laid out like the original sample."""
    env_file = ""
    if env_type == "pip":
        build_wheel(folder / "wheels")
        (folder / "requirements.txt").write_text(
            f"--no-index\n--find-links {folder / 'wheels'}\ntinypkg\n"
        )
        env_file = "  env_file: requirements.txt\n"
    (folder / "setup.sh").write_text(f"{install}\necho run >> {folder / 'installs.log'}\n")
    (folder / "data").mkdir()
    (folder / "data" / "x.txt").write_text("42\n")
    (folder / "train.py").write_text(TRAIN)
    (folder / "job.yml").write_text(
        JOB_YML.format(env_type=env_type, env_file=env_file, data_type=data_type)
    )


def setup_record(home: Path, juid: str, attempt: int = 1) -> dict:
    return json.loads((home / "runs" / juid / str(attempt) / "setup.json").read_text())


def test_pip_environment_is_built_once_per_worker_and_reused(cli, home):
    home.mkdir(exist_ok=True)
    (home / "providers.yml").write_text("providers:\n  local: {type: local, slots: 2}\n")
    make_project(Path.cwd(), env_type="pip")
    # Two jobs needing the same new environment at the same moment: it is built once.
    first = [
        cli("run", "--", "python", "train.py", "1", "0", check=True).stdout.strip()
        for _ in range(2)
    ]
    for juid in first:
        assert cli("logs", "--follow", juid).returncode == 0
    records = [setup_record(home, j) for j in first]
    assert sorted(r["reused"] for r in records) == [False, True]
    assert len({r["key"] for r in records}) == 1
    built = next(r for r in records if not r["reused"])
    waited = next(j for j, r in zip(first, records) if r["reused"])
    assert (
        "waiting for another job preparing environment"
        in cli("logs", "--setup", waited, check=True).stdout
    )

    # A later job with the same inputs reuses it at once.
    third = cli("run", "--", "python", "train.py", "1", "0", check=True).stdout.strip()
    follow = cli("logs", "--follow", third)
    assert follow.returncode == 0, follow.stderr
    assert "package tinypkg 1.0" in follow.stdout and "env HELLO data 42 copied" in follow.stdout
    record = setup_record(home, third)
    assert record["reused"] and record["seconds"] < 1.0 < built["seconds"]
    setup_log = cli("logs", "--setup", third, check=True).stdout
    assert f"reusing environment {record['key']}" in setup_log
    assert "pip install" not in setup_log
    built_log = cli(
        "logs", "--setup", next(j for j in first if not setup_record(home, j)["reused"]), check=True
    ).stdout
    assert "Successfully installed tinypkg-1.0" in built_log and "installing" in built_log
    # The install script ran once for the three jobs.
    assert Path("installs.log").read_text() == "run\n"


def test_paused_job_resumes_from_its_persisted_progress(cli, home, tmp_path):
    make_project(Path.cwd())
    Path("output").mkdir()
    Path("output/progress.txt").write_text("999")  # the laptop's copy is never shipped
    juid = cli("run", "--", "python", "train.py", "60", "0.05", check=True).stdout.strip()
    progress = home / "runs" / juid / "1" / "work" / "output" / "progress.txt"
    wait_for(
        lambda: progress.exists() and int(progress.read_text() or 0) >= 5,
        what="progress in output/",
    )
    assert cli("job", "pause", juid).returncode == 0
    wait_for(lambda: "paused" in cli("list", "jobs").stdout, what="the job to pause")
    saved = int((home / "runs" / juid / "persist" / "output" / "progress.txt").read_text())
    assert 5 <= saved < 60
    assert cli("job", "resume", juid).returncode == 0
    follow = cli("logs", "--follow", juid)
    assert follow.returncode == 0, follow.stderr
    starts = [
        int(line.split()[1]) for line in follow.stdout.splitlines() if line.startswith("start")
    ]
    assert starts == [0, saved]  # the second attempt continued, not from zero
    assert "done 60" in follow.stdout
    assert (
        "restored persisted folder output"
        in cli("logs", "--setup", juid, "--attempt", "2", check=True).stdout
    )
    pulled = cli("pull", juid, "--to", str(tmp_path / "results"))
    assert pulled.returncode == 0, pulled.stderr
    assert (tmp_path / "results" / "output" / "progress.txt").read_text() == "60"
    again = cli("pull", juid, "--to", str(tmp_path / "results"))
    assert again.returncode == 1 and "is not empty; pass --force" in again.stderr
    (tmp_path / "notes.txt").write_text("mine")
    onto_file = cli("pull", juid, "--to", str(tmp_path / "notes.txt"))
    assert onto_file.returncode == 1 and "Traceback" not in onto_file.stderr
    assert "notes.txt is a file, not a folder" in onto_file.stderr
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_mounted_data_folder_is_a_link_to_the_workers_copy(cli, home):
    make_project(Path.cwd(), data_type="mount")
    proc = cli("run", "--follow", "--", "python", "train.py", "1", "0")
    assert proc.returncode == 0, proc.stderr
    assert "env HELLO data 42 mounted" in proc.stdout
    assert "no package" in proc.stdout  # env_type none: no environment built


def test_failed_setup_fails_the_attempt_with_reason_setup_and_is_not_retried(cli, home):
    make_project(Path.cwd(), install="echo broken mirror >&2; exit 3")
    proc = cli("run", "--follow", "--retries", "2", "--", "python", "train.py", "1", "0")
    assert proc.returncode == 1
    assert "set-up failed" in proc.stdout and "env HELLO" not in proc.stdout  # never ran
    info = json.loads(cli("info", "job", "last", "--json", check=True).stdout)
    assert info["state"] == "failed" and info["attempts"] == 1
    reason = info["attempts_detail"][0]["reason"]
    assert reason.startswith("setup: install_script setup.sh exited 3")
    assert "monkey logs --setup" in reason
    log = cli("logs", "--setup", "last", check=True).stdout
    assert "broken mirror" in log and "set-up failed" in log


def test_conda_missing_on_the_worker_is_a_clear_setup_failure(cli, home, monkeypatch):
    make_project(Path.cwd())
    Path("environment.yml").write_text("name: x\ndependencies: [python]\n")
    Path("job.yml").write_text(
        Path("job.yml")
        .read_text()
        .replace("env_type: none\n", "env_type: conda\n  env_file: environment.yml\n")
    )
    monkeypatch.delenv("CONDA_EXE", raising=False)
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + ":/usr/bin:/bin")
    proc = cli("run", "--follow", "--", "python", "train.py", "1", "0")
    assert proc.returncode == 1
    assert "conda is not installed on this worker" in proc.stderr
    assert "use env_type: pip" in proc.stderr


def test_persisted_folders_are_saved_while_the_job_runs(cli, home):
    make_project(Path.cwd())
    juid = cli(
        "run",
        "--env",
        "MONKEY_PERSIST_INTERVAL=0.2",
        "--",
        "python",
        "train.py",
        "200",
        "0.05",
        check=True,
    ).stdout.strip()
    saved = home / "runs" / juid / "persist" / "output" / "progress.txt"
    wait_for(saved.exists, what="a periodic save")
    info = json.loads(cli("info", "job", juid, "--json", check=True).stdout)
    assert info["state"] == "running"
    assert cli("job", "cancel", juid).returncode == 0


def test_a_job_in_a_pip_environment_can_import_monkey_to_log(cli, home, monkey):
    # Installed with pip (here: PYTHONPATH hidden from the job), monkey is not in the job's
    # fresh virtualenv, yet `import monkey; monkey.log(...)` must work there.
    make_project(Path.cwd(), env_type="pip")
    Path("train.py").write_text(
        "import sys, tinypkg, monkey\nprint(sys.prefix)\nmonkey.log('acc', 0.5, step=1)\n"
    )
    juid = cli(
        "run", "--env", "PYTHONPATH=/nonexistent", "--", "python", "train.py", check=True
    ).stdout.strip()
    follow = cli("logs", "--follow", juid)
    assert follow.returncode == 0, cli("logs", "--stderr", juid).stdout
    *setup, last = follow.stdout.strip().splitlines()  # set-up first, then the job's output
    assert last == setup_record(home, juid)["prefix"]  # inside the env
    assert any("building pip environment" in line for line in setup)
    assert monkey.metrics(juid, "acc")["acc"][0][:2] == (1, 0.5)
