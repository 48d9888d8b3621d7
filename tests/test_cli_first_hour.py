"""The first hour through the installed CLI: failures in plain sight, a forgiving CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from test_tui import drive, screen_text, until

from monkey.tui.app import DashApp

FAILING = "import time\nprint('before', flush=True)\ntime.sleep(0.8)\n1 / 0\n"


def _run(cli, *argv: str) -> str:
    return cli("run", "--", *argv, check=True).stdout.strip()


def test_failed_job_shows_its_traceback_in_order_with_attempts_marked(cli, home):
    Path("train.py").write_text(FAILING)
    juid = _run(cli, sys.executable, "-u", "train.py")
    follow = cli("logs", "-f")  # no job: the last one
    assert follow.returncode == 1
    assert follow.stdout.index("before") < follow.stdout.index("ZeroDivisionError")

    out = cli("logs", juid, check=True).stdout
    assert out.index("before\n") < out.index("Traceback") < out.index("ZeroDivisionError")
    assert cli("logs", "--stdout", juid).stdout == "before\n"
    assert "before" not in cli("logs", "--stderr", juid).stdout
    assert cli("logs", "--tail", "1", juid).stdout == "ZeroDivisionError: division by zero\n"

    info = cli("info", juid, check=True).stdout  # short form of `info job`
    assert "last output of attempt 1 (exit 1):" in info
    assert "ZeroDivisionError: division by zero" in info

    assert cli("retry", juid, check=True).stdout.strip() == f"{juid} queued"
    cli("logs", "-f", juid)
    out = cli("logs", juid, check=True).stdout
    assert out.startswith("── attempt 1 on local ──\nbefore\n")
    assert "── attempt 2 on local, after exit 1 ──\nbefore\n" in out
    assert out.count("ZeroDivisionError") == 2

    # RUNTIME is what the attempts ran, not first start to last end
    record = json.loads(cli("list", "jobs", "--json", check=True).stdout)["jobs"][0]
    attempts = json.loads(cli("info", juid, "--json", check=True).stdout)["attempts_detail"]
    assert record["job"] == juid and len(attempts) == 2
    assert record["runtime"] == sum(a["ended_at"] - a["started_at"] for a in attempts)


def test_plain_runs_record_their_flags_as_parameters(cli, home):
    Path("train.py").write_text("pass\n")
    a = _run(cli, sys.executable, "train.py", "--lr", "0.1", "--batch-size=32", "seed=1")
    b = _run(cli, sys.executable, "train.py", "--lr", "0.2", "--batch-size=32", "-n", "5", "seed=1")
    cli("logs", "-f", b)
    cli("logs", "-f", a)
    rows = json.loads(cli("compare", a, b, "--json", check=True).stdout)
    assert [(r["lr"], r["batch-size"], r["seed"]) for r in rows] == [(0.1, 32, 1), (0.2, 32, 1)]
    table = cli("compare", a, b, check=True).stdout
    assert "lr" in table.splitlines()[0] and "0.2" in table
    diff = cli("diff", a, b, check=True).stdout
    assert "lr: 0.1 -> 0.2" in diff and "n: - -> 5" in diff


def test_mistakes_get_a_suggestion(cli, home):
    lst = cli("lst", "jobs")
    assert lst.returncode == 2 and "did you mean list?" in lst.stderr
    option = cli("list", "jobs", "--lmit", "3")
    assert option.returncode == 2 and "did you mean --limit?" in option.stderr
    sweep = cli("sweep", "stauts", "last")
    assert sweep.returncode == 2
    assert "unknown action 'stauts'; did you mean status?" in sweep.stderr
    assert len(sweep.stderr.strip().splitlines()) == 1


def test_list_jobs_says_what_part_it_shows_and_fits_80_columns(cli, home):
    long = "echo " + "a long argument " * 10
    juids = [_run(cli, "sh", "-c", f"{long} {i}") for i in range(3)]
    for juid in juids:
        cli("logs", "-f", juid)
    part = cli("list", "jobs", "--limit", "2", check=True)
    assert len(part.stdout.splitlines()) == 3
    assert part.stderr.strip() == "2 of 3 jobs; --all or --limit N"
    assert len(cli("list", "jobs", "--all", check=True).stdout.splitlines()) == 4
    data = json.loads(cli("list", "jobs", "--json", "-l", "1", check=True).stdout)
    assert data["total"] == 3 and len(data["jobs"]) == 1

    env = dict(os.environ, COLUMNS="80")
    narrow = subprocess.run(
        [sys.executable, "-m", "monkey", "list", "jobs"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    lines = narrow.splitlines()
    assert all(len(line) <= 80 for line in lines), lines
    assert lines[0].startswith("JOB") and lines[0].rstrip().endswith("COMMAND")
    assert all(line.endswith("…") for line in lines[1:])
    assert [line.split()[0] for line in lines[1:]] == juids[::-1]


def test_short_forms_control_jobs(cli, home):
    juid = _run(cli, "sleep", "30")
    assert cli("pause", juid, check=True).stdout.split()[0] == juid
    cli("logs", "-f", juid)
    assert cli("resume", juid, check=True).stdout.strip() == f"{juid} queued"
    cli("cancel", juid, check=True)
    cli("logs", "-f", juid)
    assert json.loads(cli("info", juid, "--json", check=True).stdout)["state"] == "cancelled"


@pytest.mark.system  # the CLI in a subprocess
def test_monkeycli_prints_the_job_id(home):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from monkeycli import MonkeyCLI; "
            "job = MonkeyCLI().run('echo hi', start_core=False); print('id', job.juid)",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    juid = out[1].split()[1]
    assert out[0] == f"Submitted job {juid}: echo hi"


def test_a_run_from_a_repository_sub_folder_snapshots_the_root_and_runs_in_the_sub_folder(
    cli, home, monkey, tmp_path, monkeypatch
):
    repo = tmp_path / "repo"
    (repo / "experiments").mkdir(parents=True)
    (repo / "lib.py").write_text("ANSWER = 42\n")
    (repo / ".gitignore").write_text("big/\n")
    (repo / "big").mkdir()
    (repo / "big" / "data.bin").write_bytes(b"x" * 1000)
    (repo / "experiments" / "train.py").write_text(
        "import os, sys\n"
        "sys.path.insert(0, os.path.abspath('..'))\n"  # as `cd experiments && python train.py`
        "import lib\n"
        "print(lib.ANSWER, os.path.basename(os.getcwd()), os.path.exists('../big'))\n"
    )
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "x"]):
        subprocess.run(["git", *args], cwd=repo, check=True, env={**os.environ, **env})
    monkeypatch.chdir(repo / "experiments")
    juid = cli(
        "run", "--outputs", "out/*.txt", "--", sys.executable, "train.py", check=True
    ).stdout.strip()
    assert cli("logs", "-f", juid, check=True).stdout == "42 experiments False\n"
    info = cli("info", juid, check=True).stdout
    assert f"workdir      {repo.resolve()}" in info or str(repo.resolve()) in info
    assert "experiments/ (sub-folder of the workdir)" in info
    dash = DashApp(home, job=juid)  # the dashboard's job detail says so too

    async def detail(pilot) -> None:
        await until(
            pilot, lambda: "sub-folder of the workdir" in screen_text(dash), "the job detail"
        )
        assert "runs in experiments/ (sub-folder of the workdir)" in " ".join(
            screen_text(dash).split()
        )

    drive(dash, detail)
    record = json.loads(cli("info", juid, "--json", check=True).stdout)
    assert record["workdir"] == str(repo.resolve()) and record["git"]["subdir"] == "experiments"
    assert monkey.store.outputs(juid) == ["experiments/out/*.txt"]  # globs from where it runs

    again = cli("rerun", juid, check=True).stdout.split()[0]  # a rerun keeps the sub-folder
    assert cli("logs", "-f", again, check=True).stdout == "42 experiments False\n"

    monkeypatch.chdir(tmp_path)  # outside a repository: the current folder is the root
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "t.py").write_text("import os; print(sorted(os.listdir('.')))\n")
    monkeypatch.chdir(tmp_path / "sub")
    plain = _run(cli, sys.executable, "t.py")
    assert cli("logs", "-f", plain, check=True).stdout == "['t.py']\n"
    assert json.loads(cli("info", plain, "--json", check=True).stdout)["git"] == {}


def _big_project(monkeypatch) -> None:
    monkeypatch.setenv("MONKEY_BIG_BYTES", "20000")  # 100 MB and 2 GB, scaled down
    monkeypatch.setenv("MONKEY_HUGE_BYTES", "200000")
    Path("train.py").write_text("print('ok')\n")
    Path("data").mkdir()
    Path("models").mkdir()
    for i in range(3):
        Path(f"data/part{i}.bin").write_bytes(os.urandom(20000))
    Path("models/m.bin").write_bytes(os.urandom(5000))


def test_a_big_working_folder_is_announced_and_a_huge_one_needs_yes(cli, home, monkeypatch):
    _big_project(monkeypatch)
    run = cli("run", "--", sys.executable, "train.py", check=True)
    note = [line for line in run.stderr.splitlines() if "note:" in line]
    assert len(note) == 1 and "holds 65.0 kB in 5 files" in note[0]
    assert (
        "largest: data/ 60.0 kB, models/ 5.0 kB" in note[0]
        and ".monkeyignore (e.g. data/)" in note[0]
    )
    assert cli("logs", "-f", run.stdout.strip(), check=True).stdout == "ok\n"
    Path("weights.bin").write_bytes(os.urandom(90000))  # a big file at the top: named too
    run = cli("run", "--", sys.executable, "train.py", check=True)
    note = [line for line in run.stderr.splitlines() if "note:" in line]
    assert "largest: weights.bin 90.0 kB, data/ 60.0 kB, models/ 5.0 kB" in note[0], note
    assert ".monkeyignore (e.g. weights.bin)" in note[0], note
    os.unlink("weights.bin")

    Path("data/more.bin").write_bytes(os.urandom(150000))  # past the "2 GB"
    refused = cli("run", "--", sys.executable, "train.py")
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr.strip().splitlines()[-1].endswith("or pass --yes to store it all")
    assert len(json.loads(cli("list", "jobs", "--json", check=True).stdout)["jobs"]) == 2
    cli("run", "--yes", "--", sys.executable, "train.py", check=True)
    Path(".monkeyignore").write_text("data/\n")  # as the note says: the code is small again
    data = cli("run", "--dataset", "data", "--", "true")  # the same check for --dataset
    assert data.returncode == 1 and data.stderr.count("note:") == 1
    assert "the dataset" in data.stderr.splitlines()[-1] and "--yes" in data.stderr
    assert len(json.loads(cli("list", "jobs", "--json", check=True).stdout)["jobs"]) == 3


@pytest.mark.system  # the CLI in a terminal
def test_a_huge_working_folder_asks_on_a_terminal_with_a_progress_bar(home, monkeypatch):
    import pty

    _big_project(monkeypatch)
    Path("data/more.bin").write_bytes(os.urandom(150000))

    def on_terminal(answer: bytes) -> bytes:
        pid, fd = pty.fork()
        if pid == 0:
            os.execv(
                sys.executable,
                [sys.executable, "-m", "monkey", "run", "--", sys.executable, "train.py"],
            )
        out = b""
        while b"[y/N]" not in out:
            out += os.read(fd, 4096)
        os.write(fd, answer)
        while True:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        os.waitpid(pid, 0)
        return out

    no = on_terminal(b"n\n").decode()
    assert "Store all 215.0 kB of" in no and "not stored: the working folder" in no
    yes = on_terminal(b"y\n").decode()
    assert "storing working folder" in yes  # rich's bar, drawn while storing
    assert (
        len(
            json.loads(
                subprocess.run(
                    [sys.executable, "-m", "monkey", "list", "jobs", "--json"],
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout
            )["jobs"]
        )
        == 1
    )


def test_search_finds_jobs_by_their_output_or_command_newest_first(cli, home):
    oom = (
        "import sys\nprint('epoch 1', flush=True)\n"
        "sys.exit('RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB')\n"
    )
    Path("train.py").write_text(oom)
    a = _run(cli, sys.executable, "train.py")
    b = _run(cli, sys.executable, "-c", "print('all fine')")
    cli("logs", "-f", a)
    cli("logs", "-f", b)
    out = cli("search", "CUDA out of memory", check=True).stdout
    assert out == (
        f"{a}  failed     train  (stderr, attempt 1)\n"
        "    RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
    )
    assert cli("search", "out", "of", "CUDA").returncode == 1  # the words in order

    c = _run(
        cli, sys.executable, "train.py", "--note", "memory-test"
    )  # indexed since the last search
    cli("logs", "-f", c)
    hits = json.loads(cli("search", "cuda out of memory", "--json", check=True).stdout)
    assert [h["job"] for h in hits] == [c, a]
    assert [h["job"] for h in json.loads(cli("search", "memory-test", "--json").stdout)] == [c]

    cli("retry", a, check=True)  # a new attempt's output is indexed too
    cli("logs", "-f", a)
    hit = json.loads(cli("search", "epoch 1", "--json", check=True).stdout)
    assert [(h["job"], h["source"]) for h in hit] == [
        (c, "stdout, attempt 1"),
        (a, "stdout, attempt 2"),
    ]
    cli("rm", "--yes", c, check=True)
    assert [h["job"] for h in json.loads(cli("search", "CUDA", "--json").stdout)] == [a]


def test_report_and_plot_take_any_set_of_jobs(cli, home, tmp_path):
    from test_tracking_sweeps import Tables, png_size

    Path("train.py").write_text(
        "import json, sys\n"
        "lr = float(sys.argv[2])\n"
        "for step in range(3):\n"
        "    print(json.dumps({'monkey': {'step': step, 'acc': lr * step}}), flush=True)\n"
    )
    a = cli(
        "run", "--name", "exp-a", "--", sys.executable, "train.py", "--lr", "0.1", check=True
    ).stdout.strip()
    b = cli(
        "run", "--name", "exp-b", "--", sys.executable, "train.py", "--lr", "0.2", check=True
    ).stdout.strip()
    c = cli(
        "run", "--name", "other", "--", sys.executable, "train.py", "--lr", "0.3", check=True
    ).stdout.strip()
    for juid in (a, b, c):
        cli("logs", "-f", juid)

    html = tmp_path / "exp.html"
    assert cli("report", "--name", "exp-*", "-o", str(html), check=True).stdout.strip() == str(html)
    page = Tables()
    page.feed(html.read_text())
    header, *body = page.rows
    assert header[:4] == ["job", "name", "state", "lr"] and [r[0] for r in body] == [a, b]
    assert page.svgs == 1 and page.polylines == 2  # acc, one line per job
    assert "jobs named exp-*" in html.read_text()

    everything = tmp_path / "all.html"
    cli("report", "--since", "1h", "-o", str(everything), check=True)
    page = Tables()
    page.feed(everything.read_text())
    assert [r[0] for r in page.rows[1:]] == [a, b, c]
    picked = tmp_path / "picked.html"
    cli("report", "--jobs", c, a, "-o", str(picked), check=True)
    page = Tables()
    page.feed(picked.read_text())
    assert sorted(r[0] for r in page.rows[1:]) == [a, c]

    png = tmp_path / "acc.png"
    cli("plot", "--name", "exp-*", "-m", "acc", "-o", str(png), "--size", "640x480", check=True)
    assert png_size(png) == (640, 480)

    none = cli("report", "--name", "nothing*", "-o", str(tmp_path / "x.html"))
    assert none.returncode == 1 and "no jobs named nothing*" in none.stderr
    both = cli("report", "last", "--name", "exp-*", "-o", str(tmp_path / "x.html"))
    assert both.returncode == 2 and "not both" in both.stderr
    assert not (tmp_path / "x.html").exists()


def test_the_end_of_one_of_todays_ids_names_the_job(cli, monkey):
    """`monkey info 003` is today's job 003 (ids are day-scoped, as the seed's 20-09-17-001);
    an end that several of today's ids share lists them; a prefix still wins."""
    juids = [monkey.run(["true"], start_core=False).juid for _ in range(12)]
    today = juids[0][:9]
    assert all(j.startswith(today) for j in juids)
    info = cli("info", "003", "--json", check=True).stdout
    assert json.loads(info)["job"] == f"{today}003"
    end = f"{today[-2]}-011"  # the end of today's 011: 7-011 for 26-12-07-011
    assert cli("info", "job", end, check=True).returncode == 0
    ambiguous = cli("cancel", "1")
    assert ambiguous.returncode != 0
    line = ambiguous.stderr.strip()
    assert len(line.splitlines()) == 1
    assert f"'1' matches several jobs: {today}001, {today}011" in line
    missing = cli("info", "099")
    assert missing.returncode != 0 and "no job matches '099'" in missing.stderr
