"""Submitting through a remote: `run`, `sweep` and `rerun` from a laptop (its own HOME and
MONKEY_HOME) to a real `monkey server` over TLS; the code and data are gathered on the
laptop, only the blobs the server lacks are uploaded, and the server's core runs the jobs."""

from __future__ import annotations

import json
import os
import pwd
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import wait_for
from mainnode import MainNode, node, wait_until_ended  # noqa: F401 - node: a fixture

ADMIN = pwd.getpwuid(os.getuid()).pw_name  # the first admin is named after the server's user


@pytest.fixture(autouse=True)
def lab(node: MainNode) -> None:
    """Every test here submits from a laptop that has the main node as its remote `lab`."""
    node.add_remote()


def project(root: Path, files: int = 3) -> Path:
    """A small project on the laptop: a script, a module, a data file."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "train.py").write_text(
        "import sys, os\n"
        "print('lr', sys.argv[-1], open('notes.txt').read().strip())\n"
        "print('secret', os.environ.get('API_TOKEN'))\n"
    )
    for i in range(files):
        (root / f"notes{'' if i == 0 else i}.txt").write_text(f"note {i}\n")
    return root


def output(node: MainNode, juid: str) -> str:
    wait_until_ended(node, juid)
    return node.server("logs", juid).stdout


def info(node: MainNode, juid: str) -> dict:
    return json.loads(node.server("info", juid, "--json").stdout)


def test_run_from_a_laptop_runs_its_code_on_the_main_node(node, tmp_path):
    code = project(tmp_path / "src" / "proj")
    done = node.laptop(
        "--remote",
        "lab",
        "run",
        "--workdir",
        str(code),
        "--env",
        "API_TOKEN=hunter2-secret-value",
        "--env",
        "SEED=3",
        "--",
        "python3",
        "train.py",
        "--lr",
        "0.5",
    )
    assert done.returncode == 0, done.stderr
    juid = done.stdout.strip()
    assert re.fullmatch(r"\d\d-\d\d-\d\d-\d{3}", juid)
    out = output(node, juid)
    assert "lr 0.5 note 0" in out
    assert "secret hunter2-secret-value" in out  # the secret reached the job
    record = info(node, juid)
    assert record["state"] == "succeeded"
    assert record["owner"] == ADMIN
    assert record["params"] == {"lr": 0.5}
    assert record["env"]["SEED"] == "3"
    # the secret is in no record, through the API or on the server
    assert "hunter2" not in node.server("info", juid, "--json").stdout
    assert "hunter2" not in node.laptop("--remote", "lab", "info", juid, "--json").stdout
    assert b"hunter2" not in (node.home / "monkey.db").read_bytes()
    # the code the job ran is the laptop's, as `cat` on the main node shows it
    assert node.server("cat", juid, "notes.txt").stdout == "note 0\n"
    # the laptop holds its remote settings and the blob cache, no job
    files = node.laptop_files()
    assert ".config/monkey/remotes.json" in files
    assert not [f for f in files if f.startswith(".monkey")]
    assert all(f.startswith((".config/monkey/", ".cache/monkey/remotes/lab/")) for f in files)


def test_a_remote_job_runs_on_the_main_nodes_path_not_the_laptops(node, tmp_path):
    """A laptop whose venv (first on its PATH) does not exist on the main node: the job
    runs on the main node's PATH and Python; the laptop's PATH and VIRTUAL_ENV are not
    carried, unless named with --env; `info` shows what the job got."""
    code = project(tmp_path / "src" / "proj")
    venv = tmp_path / "laptop-only" / "venv"
    (venv / "bin").mkdir(parents=True)
    laptop_path = f"{venv / 'bin'}:{os.environ['PATH']}"
    done = node.laptop(
        "--remote", "lab", "run", "--workdir", str(code), "--env", "LAPTOP_SAYS=hi", "--",
        "python3", "train.py", "--lr", "0.5",
        PATH=laptop_path, VIRTUAL_ENV=str(venv),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    juid = done.stdout.strip()
    assert "lr 0.5" in output(node, juid)
    record = info(node, juid)
    assert record["state"] == "succeeded"
    assert record["env"]["PATH"] == node.server_env["PATH"]  # the main node's
    assert "VIRTUAL_ENV" not in record["env"] or record["env"]["VIRTUAL_ENV"] != str(venv)
    assert record["env"]["LAPTOP_SAYS"] == "hi"
    named = node.laptop(
        "--remote", "lab", "run", "--workdir", str(code), "--env", f"PATH={laptop_path}", "--",
        "true", PATH=laptop_path,
    )  # fmt: skip
    assert named.returncode == 0, named.stderr
    assert info(node, named.stdout.strip())["env"]["PATH"] == laptop_path  # named: carried


def test_an_unchanged_project_uploads_nothing_the_second_time(node, tmp_path):
    code = project(tmp_path / "src" / "proj", files=50)
    (code / "weights.bin").write_bytes(os.urandom(200_000))
    first = node.laptop("--remote", "lab", "run", "--workdir", str(code), "--", "true")
    assert first.returncode == 0, first.stderr
    blobs = node.home / "blobs"
    before = sorted(p for p in blobs.rglob("*") if p.is_file())
    second = node.laptop("--remote", "lab", "run", "--workdir", str(code), "--", "true")
    assert second.returncode == 0, second.stderr
    assert sorted(p for p in blobs.rglob("*") if p.is_file()) == before
    one, two = info(node, first.stdout.strip()), info(node, second.stdout.strip())
    assert one["snapshot"] == two["snapshot"]
    # a changed file: only it (and the new file list) reaches the server
    (code / "notes7.txt").write_text("changed\n")
    third = node.laptop("--remote", "lab", "run", "--workdir", str(code), "--", "cat", "notes7.txt")
    assert third.returncode == 0, third.stderr
    added = sorted(set(p for p in blobs.rglob("*") if p.is_file()) - set(before))
    assert len(added) == 2, added
    assert output(node, third.stdout.strip()) == "changed\n"


def test_a_dataset_is_uploaded_once_and_reaches_the_job(node, tmp_path):
    data = tmp_path / "laptop" / "data"
    data.mkdir(parents=True)
    (data / "train.csv").write_text("a,b\n1,2\n")
    code = project(tmp_path / "src" / "proj")
    done = node.laptop(
        "--remote",
        "lab",
        "run",
        "--workdir",
        str(code),
        "--dataset",
        f"{data}:TRAIN",
        "--",
        "sh",
        "-c",
        'cat "$MONKEY_DATASET_TRAIN/train.csv"',
    )
    assert done.returncode == 0, done.stderr
    assert output(node, done.stdout.strip()) == "a,b\n1,2\n"


def test_bad_input_through_a_remote_is_one_line_and_records_nothing(node, tmp_path):
    code = project(tmp_path / "src" / "proj")
    for argv, words in (
        (["--provider", "nowhere"], "unknown provider 'nowhere'"),
        (["--cpus", "0"], "--cpus must be a whole number >= 1"),
        (["--dataset", str(tmp_path / "missing")], "does not exist"),
        (["--retries", "5000"], "--retries must be a whole number"),
    ):
        done = node.laptop("--remote", "lab", "run", "--workdir", str(code), *argv, "--", "true")
        assert done.returncode != 0, argv
        assert words in done.stderr, (argv, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert json.loads(node.server("list", "jobs", "--json").stdout)["jobs"] == []


def test_run_follow_and_json_through_a_remote(node, tmp_path):
    code = project(tmp_path / "src" / "proj")
    done = node.laptop(
        "--remote", "lab", "run", "-f", "--workdir", str(code), "--", "sh", "-c", "echo hi; exit 4"
    )
    assert done.returncode == 4, done.stderr
    assert done.stdout == "hi\n"
    assert re.search(r"job \S+ queued on local", done.stderr)
    shown = node.laptop("--remote", "lab", "run", "--json", "--workdir", str(code), "--", "true")
    assert shown.returncode == 0, shown.stderr
    record = json.loads(shown.stdout)
    assert record["argv"] == ["true"]
    assert record["job"] in node.server("list", "jobs").stdout


def test_sweep_and_rerun_through_a_remote(node, tmp_path):
    code = project(tmp_path / "src" / "proj")
    sweep_file = tmp_path / "laptop" / "sweep.yml"
    sweep_file.write_text("parameters:\n  lr: [0.1, 0.2]\n")
    done = node.laptop(
        "--remote",
        "lab",
        "sweep",
        "--file",
        str(sweep_file),
        "--workdir",
        str(code),
        "--",
        "python3",
        "train.py",
        "--lr",
        "{lr}",
    )
    assert done.returncode == 0, done.stderr
    sid = done.stdout.strip()
    assert "2 runs queued" in done.stderr
    status = json.loads(node.server("sweep", "status", sid, "--json").stdout)
    juids = [j["job"] for j in status["jobs"]]
    assert sorted(output(node, j).splitlines()[0] for j in juids) == [
        "lr 0.1 note 0",
        "lr 0.2 note 0",
    ]
    again = node.laptop("--remote", "lab", "rerun", juids[0], "--set", "lr=0.7")
    assert again.returncode == 0, again.stderr
    assert output(node, again.stdout.strip()).startswith("lr 0.7 note 0")


def test_another_user_submits_jobs_of_their_own(node, tmp_path):
    token = node.add_user("ada")
    node.add_remote(token=token, name="ada")
    code = project(tmp_path / "src" / "proj")
    done = node.laptop("--remote", "ada", "run", "--workdir", str(code), "--", "true")
    assert done.returncode == 0, done.stderr
    assert info(node, done.stdout.strip())["owner"] == "ada"
    theirs = node.laptop("--remote", "lab", "run", "--workdir", str(code), "--", "sleep", "60")
    refused = node.laptop("--remote", "ada", "kill", "job", theirs.stdout.strip())
    assert refused.returncode != 0
    assert f"belongs to {ADMIN}" in refused.stderr
    # a rerun is the rerunner's job; one carrying another user's secrets is refused
    again = node.laptop("--remote", "ada", "rerun", theirs.stdout.strip())
    assert again.returncode == 0, again.stderr
    assert info(node, again.stdout.strip())["owner"] == "ada"
    secret = node.laptop(
        "--remote", "lab", "run", "--workdir", str(code), "--env", "API_TOKEN=s3cr3t", "--", "true"
    ).stdout.strip()
    stolen = node.laptop("--remote", "ada", "rerun", secret, "--set", "x=1")
    assert stolen.returncode == 1
    assert f"job {secret} carries secret env values of {ADMIN}" in stolen.stderr
    assert node.laptop("--remote", "lab", "rerun", secret).returncode == 0


def test_a_server_killed_during_an_upload_leaves_no_job_and_no_broken_blob(node, tmp_path):
    code = project(tmp_path / "src" / "proj")
    big = tmp_path / "laptop" / "big"
    big.mkdir()
    for i in range(8):
        (big / f"part{i}.bin").write_bytes(os.urandom(8 << 20))
    laptop = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "monkey",
            "--remote",
            "lab",
            "run",
            "--workdir",
            str(code),
            "--dataset",
            str(big),
            "--",
            "true",
        ],
        env=node.laptop_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    blobs = node.home / "blobs"

    def uploading() -> bool:
        return any(p.name.startswith(".tmp-") for p in blobs.rglob("*"))

    wait_for(uploading, timeout=60, every=0.01, what="the upload to begin")
    node.kill(signal.SIGKILL)
    _, err = laptop.communicate(timeout=60)
    assert laptop.returncode == 1
    assert len(err.strip().splitlines()) == 1, err
    assert "lab:" in err
    assert json.loads(node.server("list", "jobs", "--json").stdout)["jobs"] == []
    # every blob in place is whole: its bytes match its digest
    done = node.server("verify")
    assert done.returncode == 0, done.stdout + done.stderr
    # started again, the same command uploads what is missing and the job runs
    node.start()
    done = node.laptop(
        "--remote", "lab", "run", "--workdir", str(code), "--dataset", str(big), "--", "true"
    )
    assert done.returncode == 0, done.stderr
    wait_until_ended(node, done.stdout.strip())
    assert info(node, done.stdout.strip())["state"] == "succeeded"


def test_cat_files_and_clone_fetch_the_code_from_the_main_node(node, tmp_path):
    code = project(tmp_path / "src" / "proj")
    subprocess.run(["git", "init", "-q", str(code)], check=True)
    subprocess.run(
        ["git", "-C", str(code), "-c", "user.email=a@b", "-c", "user.name=a", "add", "."],
        check=True,
    )
    subprocess.run(
        ["git", "-C", str(code), "-c", "user.email=a@b", "-c", "user.name=a", "commit", "-qm", "x"],
        check=True,
    )
    (code / "notes.txt").write_text("uncommitted\n")
    data = tmp_path / "src" / "data.csv"
    data.write_text("x\n1\n")
    juid = node.laptop(
        "--remote", "lab", "run", "--workdir", str(code), "--dataset", str(data), "--", "true"
    ).stdout.strip()
    # a second laptop with an empty cache: everything comes from the server
    other = {"XDG_CACHE_HOME": str(tmp_path / "other-cache")}
    assert node.laptop("--remote", "lab", "cat", juid, "notes.txt", **other).stdout == (
        "uncommitted\n"
    )
    listed = node.laptop("--remote", "lab", "info", juid, "--files", **other)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout == node.server("info", juid, "--files").stdout
    missing = node.laptop("--remote", "lab", "cat", juid, "nope.txt", **other)
    assert missing.returncode == 1
    assert f"job {juid} has no code file 'nope.txt'" in missing.stderr
    dest = tmp_path / "clones" / "c1"
    dest.parent.mkdir()
    done = node.laptop("--remote", "lab", "clone", juid, "--to", str(dest), "--with-data", **other)
    assert done.returncode == 0, done.stderr
    assert (dest / "notes.txt").read_text() == "uncommitted\n"
    assert (dest / "train.py").read_text() == (code / "train.py").read_text()
    assert (dest / "datasets" / "DATA" / "data.csv").read_text() == "x\n1\n"
    # submitted from this machine's repository: a git clone at its commit, diff applied
    log = subprocess.run(
        ["git", "-C", str(dest), "log", "--oneline"], capture_output=True, text=True
    ).stdout
    assert log.strip().endswith("x")
    # a blob damaged on the server is refused by the laptop, never written out
    digest = next(
        f["digest"]
        for f in json.loads(node.server("info", juid, "--files", "--json").stdout)
        if f["path"] == "train.py"
    )
    stored = node.home / "blobs" / digest[:2] / digest[2:]
    stored.chmod(0o600)
    stored.write_bytes(b"print('not what ran')\n")
    fresh = {"XDG_CACHE_HOME": str(tmp_path / "third-cache")}
    damaged = node.laptop("--remote", "lab", "cat", juid, "train.py", **fresh)
    assert damaged.returncode == 1
    assert f"blob {digest}" in damaged.stderr and "refused" in damaged.stderr
    assert len(damaged.stderr.strip().splitlines()) == 1
    assert "not what ran" not in damaged.stdout


def test_the_python_api_goes_to_a_remote_by_name_or_by_environment(node, tmp_path):
    code = project(tmp_path / "src" / "proj")
    script = tmp_path / "src" / "sweep_script.py"
    script.write_text(
        "import sys\n"
        "from monkey import Monkey\n"
        "m = Monkey(remote=sys.argv[1]) if sys.argv[1] != '-' else Monkey()\n"
        f"job = m.run(['python3', 'train.py', '--lr', '0.3'], workdir={str(code)!r})\n"
        "print(job.juid)\n"
    )
    by_name = subprocess.run(
        [sys.executable, str(script), "lab"], env=node.laptop_env, capture_output=True, text=True
    )
    assert by_name.returncode == 0, by_name.stderr
    by_env = subprocess.run(
        [sys.executable, str(script), "-"],
        env={**node.laptop_env, "MONKEY_REMOTE": "lab"},
        capture_output=True,
        text=True,
    )
    assert by_env.returncode == 0, by_env.stderr
    for done in (by_name, by_env):
        juid = done.stdout.strip()
        assert output(node, juid).startswith("lr 0.3 note 0")
    # the handle reads through the remote: state, exit code, output
    check = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from monkey import Monkey; j = Monkey(remote='lab').job(sys.argv[1]); "
            "print(j.status.value, j.exit_code, j.logs(tail=2), end='')",
            by_env.stdout.strip(),
        ],
        env=node.laptop_env,
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stderr
    assert check.stdout == "succeeded 0 lr 0.3 note 0\nsecret None\n"
    assert not [f for f in node.laptop_files() if f.startswith(".monkey")]


def test_pull_fetches_a_jobs_persisted_folders_to_the_laptop(node, tmp_path):
    code = project(tmp_path / "src" / "proj")
    (code / "job.yml").write_text(
        "name: keep\nrun:\n  env_type: none\npersist:\n  - name: out\n    path: out/model\n"
    )
    done = node.laptop(
        "--remote",
        "lab",
        "run",
        "--workdir",
        str(code),
        "--",
        "sh",
        "-c",
        "mkdir -p out/model/sub && echo w1 > out/model/weights.txt && echo s > out/model/sub/s",
    )
    assert done.returncode == 0, done.stderr
    juid = done.stdout.strip()
    wait_until_ended(node, juid)
    dest = tmp_path / "pulled"
    pulled = node.laptop("--remote", "lab", "pull", juid, "--to", str(dest))
    assert pulled.returncode == 0, pulled.stderr
    assert pulled.stdout == f"out/model -> {dest / 'out/model'}\n"
    assert (dest / "out" / "model" / "weights.txt").read_text() == "w1\n"
    assert (dest / "out" / "model" / "sub" / "s").read_text() == "s\n"
    again = node.laptop("--remote", "lab", "pull", juid, "--to", str(dest))
    assert again.returncode == 1
    assert "is not empty; pass --force" in again.stderr
    # nothing of it stays in the laptop's cache
    assert not list((tmp_path / "laptop" / ".cache").rglob("weights.txt"))
