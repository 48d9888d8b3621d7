"""Sweeps end to end through the local provider: the mnist example over 4 learning rates,
compare, diff, PNG and HTML reports; failing cells that retry; early termination; bad
sweep specs refused with one clear line."""

from __future__ import annotations

import json
import shutil
import struct
import textwrap
from html.parser import HTMLParser
from pathlib import Path

import pytest
from conftest import REPO, wait_for

from monkey.models import MonkeyError, State

LRS = ["0.001", "0.01", "0.1", "0.5"]


def sweep_done(monkey, sid: str) -> bool:
    return monkey.store.get_sweep(sid)["state"] == "finished"


class Tables(HTMLParser):
    """Collects table cells and SVG elements of an HTML page."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self.svgs = 0
        self.polylines = 0
        self.panels: list[str] = []
        self.legend = 0
        self._in_cell = False
        self._table: str | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table":
            self._table = a.get("id")
        elif a.get("class") == "panel":
            self.panels.append(a["data-metric"])
        elif a.get("class") == "legend":
            self.legend += 1
        if self._table != "runs":
            pass
        elif tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self._in_cell = True
            self.rows[-1].append("")
        if tag == "svg":
            self.svgs += 1
        elif tag == "polyline" and a.get("class") == "line":
            self.polylines += 1

    def handle_endtag(self, tag):
        if tag == "table":
            self._table = None
        if tag in ("td", "th"):
            self._in_cell = False

    def handle_data(self, data):
        if self._in_cell:
            self.rows[-1][-1] += data


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_mnist_sweep_compare_diff_plot_report(home, monkey, cli, tmp_path):
    shutil.copy(REPO / "examples" / "mnist.py", "mnist.py")
    out = cli(
        "sweep",
        "--grid",
        f"lr={','.join(LRS)}",
        "--metric",
        "test_accuracy",
        "--goal",
        "max",
        "--name",
        "digits",
        "--",
        "python",
        "mnist.py",
        "--learning-rate",
        "{lr}",
        "--n-epochs",
        "3",
        check=True,
    )
    sid = out.stdout.strip()
    assert sid.startswith("sw-")
    wait_for(lambda: sweep_done(monkey, sid), timeout=120, what="the sweep to finish")
    jobs = monkey.store.list_jobs(sweep=sid, newest_first=False)
    assert [j.params for j in jobs] == [{"lr": float(lr)} for lr in LRS]
    assert all(j.state == State.SUCCEEDED for j in jobs)
    for job in jobs:  # one accuracy per epoch
        assert len(monkey.metrics(job.juid, "accuracy")["accuracy"]) == 3

    listing = cli("list", "sweeps", check=True).stdout
    assert sid in listing and "finished" in listing and "4/4" in listing
    status = cli("sweep", "status", sid, check=True).stdout
    assert "4/4 ended" in status and "best" in status

    # compare ranks the runs on the sweep's metric, best first
    rows = json.loads(cli("compare", "--sweep", sid, "--json", check=True).stdout)
    best = [r["test_accuracy:best"] for r in rows]
    assert best == sorted(best, reverse=True)
    assert rows[0]["lr"] == 0.5 and rows[-1]["lr"] == 0.001
    table = cli("compare", "--sweep", sid, "--sort", "lr", check=True).stdout.splitlines()
    assert [line.split()[4] for line in table[1:]] == LRS
    csv_out = cli("compare", *[j.juid for j in jobs], "--csv", check=True).stdout.splitlines()
    assert csv_out[0].startswith("job,name,state,lr,") and len(csv_out) == 5

    # diff shows exactly the parameter that differs
    diff = json.loads(cli("diff", jobs[0].juid, jobs[1].juid, "--json", check=True).stdout)
    assert diff["params"] == {"lr": [0.001, 0.01]}
    assert set(diff) == {"jobs", "command", "params"}
    text = cli("diff", jobs[0].juid, jobs[1].juid, check=True).stdout
    assert "lr: 0.001 -> 0.01" in text

    png = tmp_path / "acc.png"
    cli(
        "plot",
        *[j.juid for j in jobs],
        "--metric",
        "accuracy",
        "--out",
        str(png),
        "--size",
        "800x500",
        check=True,
    )
    assert png_size(png) == (800, 500)

    html = tmp_path / "report.html"
    cli("report", sid, "--out", str(html), check=True)
    page = Tables()
    page.feed(html.read_text())
    header, *body = page.rows
    assert header[:3] == ["job", "name", "state"] and len(body) == 4
    assert [row[0] for row in body] == [r["job"] for r in rows]
    # a panel per metric (accuracy, loss, test_accuracy; epoch is the step), a line per run,
    # one legend entry per run
    assert page.panels == ["accuracy", "loss", "test_accuracy"]
    assert page.polylines == 3 * 4 and page.legend == 4
    assert "parameter importance" in status and "best so far" in status
    swept = tmp_path / "sweep.svg"
    cli("plot", "--sweep", sid, "--smooth", "0.6", "--log-y", "-o", str(swept), check=True)
    assert swept.read_text().count("<svg") == 1


def test_failed_cell_retries_by_itself(home, monkey, cli):
    Path("flaky.py").write_text(
        textwrap.dedent("""
        import os, sys, monkey
        marker = os.path.join(os.environ["MONKEY_CHECKPOINT_DIR"], "tried")
        if int(sys.argv[1]) == 2 and not os.path.exists(marker):
            open(marker, "w").close()
            sys.exit(3)
        monkey.log("score", float(sys.argv[1]))
        """)
    )
    sid = monkey.sweep("python flaky.py {k}", grid={"k": [1, 2]}, retries=1)
    wait_for(lambda: sweep_done(monkey, sid), timeout=60, what="the sweep to finish")
    jobs = {j.params["k"]: j for j in monkey.store.list_jobs(sweep=sid)}
    assert jobs[2].state == State.SUCCEEDED and jobs[2].attempts == 2
    assert jobs[1].attempts == 1
    assert monkey.metrics(jobs[2].juid, "score")["score"][0][1] == 2.0


def test_sweep_pause_resume_cancel_retry(home, monkey, cli):
    sid = monkey.sweep(
        ["python", "-c", "import time; time.sleep({t})"], grid={"t": [30, 30, 30]}, max_parallel=1
    )
    jobs = lambda: monkey.store.list_jobs(sweep=sid, newest_first=False)  # noqa: E731
    wait_for(lambda: jobs()[0].state == State.RUNNING, what="the first cell to run")
    assert [j.state for j in jobs()][1:] == [State.QUEUED, State.QUEUED]  # max_parallel 1
    cli("sweep", "pause", sid, check=True)
    wait_for(lambda: all(j.state == State.PAUSED for j in jobs()), what="all paused")
    assert monkey.store.get_sweep(sid)["state"] == "paused"
    cli("sweep", "resume", sid, check=True)
    wait_for(lambda: jobs()[0].state == State.RUNNING, what="running again")
    cli("sweep", "cancel", sid, check=True)
    wait_for(lambda: all(j.state == State.CANCELLED for j in jobs()), what="all cancelled")
    assert monkey.store.get_sweep(sid)["state"] == "cancelled"
    out = cli("sweep", "retry", sid, check=True).stdout
    assert "3 runs" in out
    wait_for(lambda: jobs()[0].state == State.RUNNING, what="a retried cell to run")
    assert monkey.store.get_sweep(sid)["state"] == "running"
    cli("sweep", "cancel", sid, check=True)


@pytest.mark.parametrize(
    "rule",
    [{"type": "median", "min_steps": 3, "min_runs": 2}, {"type": "asha", "min_steps": 2, "eta": 2}],
)
def test_early_termination_stops_the_worst_runs(home, monkey, rule):
    (home / "providers.yml").write_text("providers:\n  local: {type: local, slots: 5}\n")
    Path("curve.py").write_text(
        textwrap.dedent("""
        import sys, time, monkey
        q = float(sys.argv[1])
        for step in range(1, 26):
            monkey.log("acc", q * (1 - 1 / (step + 1)), step=step)
            time.sleep(0.2)
        """)
    )
    sid = monkey.sweep(
        "python curve.py {q}",
        grid={"q": [1, 2, 3, 4, 5]},
        metric="acc",
        goal="max",
        early_terminate=rule,
    )
    wait_for(lambda: sweep_done(monkey, sid), timeout=90, what="the sweep to finish")
    by_q = {j.params["q"]: j for j in monkey.store.list_jobs(sweep=sid)}
    status = monkey.sweep_status(sid)
    assert {by_q[1].juid, by_q[2].juid} <= set(status["stopped_early"])
    assert by_q[1].state == State.CANCELLED and by_q[2].state == State.CANCELLED
    assert by_q[5].state == State.SUCCEEDED and by_q[5].juid not in status["stopped_early"]
    assert len(monkey.metrics(by_q[1].juid, "acc")["acc"]) < 25
    assert status["best"]["job"] == by_q[5].juid


@pytest.mark.parametrize(
    "args, message",
    [
        (["--random", "3", "--uniform", "lr=1:0.1", "--", "t", "{lr}"], "min 1.0 is above max 0.1"),
        (["--grid", "lr=", "--", "t", "{lr}"], "parameter 'lr' has no values"),
        (["--grid", "lr=1", "--", "t", "{lr}", "{bs}"], "uses {bs} but no parameter 'bs'"),
        (["--grid", "lr=1", "--grid", "bs=2", "--", "t", "{lr}"], "parameter 'bs' is not used"),
        (["--uniform", "lr=0.1:1", "--", "t", "{lr}"], "add --random N"),
        (["--grid", "lr=1", "--early-terminate", "median", "--", "t", "{lr}"], "needs the metric"),
        (["--grid", "lr=1"], "no command given"),
        (["--random", "2", "--int", "n=1.6:1.9", "--", "t", "{n}"], "needs whole-number bounds"),
        (["--grid", "lr=1", "--", "t", "--lr={lr:.3f}"], "write plain {lr}"),
        (["--grid", "lr=1", "--grid", "lr=2", "--", "t", "{lr}"], "'lr' is given twice"),
        (["--random", "0", "--uniform", "lr=0:1", "--", "t", "{lr}"], "count of runs >= 1"),
    ],
)
def test_bad_sweep_specs_are_refused(home, monkey, cli, args, message):
    proc = cli("sweep", *args)
    assert proc.returncode != 0
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert monkey.store.list_sweeps() == [] and monkey.store.list_jobs() == []


def test_bad_sweep_file_is_refused(home, monkey, cli):
    Path("sweep.yml").write_text(
        textwrap.dedent("""
        command: python train.py --lr {lr}
        method: random
        count: 4
        parameters:
          lr: {distribution: gaussian, min: 0, max: 1}
        """)
    )
    proc = cli("sweep", "--file", "sweep.yml")
    assert proc.returncode == 1
    assert "unknown distribution 'gaussian'" in proc.stderr
    assert monkey.store.list_sweeps() == []


@pytest.mark.parametrize(
    "param, early, message",
    [
        ("{distrib: uniform, min: 0, max: 1}", "", "parameter 'lr': unknown key 'distrib'"),
        ("[0.1]", "early_terminate: {type: median, min_step: 1}", "unknown key 'min_step'"),
    ],
)
def test_misspelt_keys_in_a_sweep_file_are_named(home, monkey, cli, param, early, message):
    Path("sweep.yml").write_text(
        f"command: t {{lr}}\nmethod: random\ncount: 2\n"
        f"metric: acc\nparameters:\n  lr: {param}\n{early}\n"
    )
    proc = cli("sweep", "--file", "sweep.yml")
    assert proc.returncode == 1 and message in proc.stderr, proc.stderr
    assert monkey.store.list_sweeps() == []


def test_a_sweep_whose_metric_no_run_logs_still_compares(home, monkey, cli):
    # The sweep ranks on `acc`, but the script logs `accuracy`: a typo, not a crash.
    sid = monkey.sweep(
        "python -c \"import monkey; monkey.log('accuracy', {q})\"", grid={"q": [1, 2]}, metric="acc"
    )
    wait_for(lambda: sweep_done(monkey, sid), timeout=60, what="the sweep to finish")
    proc = cli("compare", "--sweep", sid)
    assert proc.returncode == 0, proc.stderr
    assert "accuracy:best" in proc.stdout.splitlines()[0]
    status = cli("sweep", "status", sid, check=True).stdout
    assert "no run has logged 'acc' (they log: accuracy)" in status
    first = monkey.store.list_jobs(sweep=sid, newest_first=False)[0].juid
    info = cli("info", "job", first, check=True).stdout.splitlines()
    assert [line.split() for line in info if line.startswith(("sweep", "param"))] == [
        ["sweep", sid],
        ["param", "q", "1"],
    ]
    # A run's id where a sweep's is expected: job and sweep ids look alike without `sw-`.
    wrong = cli("sweep", "status", first)
    assert wrong.returncode == 1 and f"'{first}' is a job of sweep {sid}; use {sid}" in wrong.stderr


def test_yaml_random_sweep_with_count(home, monkey, cli):
    Path("sweep.yml").write_text(
        textwrap.dedent("""
        command: python -c "import monkey; monkey.log('y', {lr} * {layers})"
        method: random
        count: 5
        seed: 7
        parameters:
          lr: {distribution: log_uniform, min: 0.0001, max: 0.1}
          layers: [1, 2, 3]
        metric: {name: y, goal: minimize}
        max_parallel: 2
        """)
    )
    sid = cli("sweep", "--file", "sweep.yml", check=True).stdout.strip()
    wait_for(lambda: sweep_done(monkey, sid), timeout=60, what="the sweep to finish")
    jobs = monkey.store.list_jobs(sweep=sid)
    assert len(jobs) == 5 and all(j.state == State.SUCCEEDED for j in jobs)
    for job in jobs:
        assert 0.0001 <= job.params["lr"] <= 0.1 and job.params["layers"] in (1, 2, 3)
    rows = monkey.compare(sweep=sid)["rows"]
    assert [r["y:best"] for r in rows] == sorted(r["y:best"] for r in rows)  # minimised


def test_diff_shows_code_env_and_packages(home, monkey, cli):
    Path("train.py").write_text("lr = 0.1\nprint(lr)\n")
    Path("data.txt").write_text("same\n")
    a = monkey.run("python train.py", env={"SEED": "1"}, start_core=False)
    Path("train.py").write_text("lr = 0.2\nprint(lr)\n")
    Path("extra.py").write_text("x = 1\n")
    b = monkey.run("python train.py", env={"SEED": "2"}, start_core=False)
    # b was submitted from an environment with one package upgraded
    from monkey.snapshot import BlobStore
    from monkey.tracking.packages import as_text, from_text

    blobs = BlobStore(home / "blobs")
    packages = from_text(blobs.read_bytes(monkey.store.job_packages(a.juid)))
    packages["numpy"] = "0.0.1"
    data = as_text(packages)
    monkey.store.set_job_packages(b.juid, blobs.put_bytes(data)[0], len(data))

    result = json.loads(cli("diff", a.juid, b.juid, "--json", check=True).stdout)
    assert "command" not in result and "params" not in result
    assert result["env"] == {"SEED": ["1", "2"]}
    assert result["code"]["changed"] == ["train.py"] and result["code"]["added"] == ["extra.py"]
    assert "-lr = 0.1\n+lr = 0.2\n" in result["code"]["diff"]
    assert result["packages"]["numpy"][1] == "0.0.1"
    text = cli("diff", a.juid, b.juid, check=True).stdout
    assert "SEED: 1 -> 2" in text and "+++ b/train.py" in text and "added: extra.py" in text


@pytest.mark.parametrize(
    "command, out, message",
    [
        ("plot", "nowhere/acc.png", "folder nowhere does not exist"),
        ("plot", "acc.txt", "cannot tell the image format of acc.txt"),
        ("plot", "plots/", "plots/ is a folder; name the file to write, e.g. plots/acc.png"),
        ("report", "nowhere/r.html", "folder nowhere does not exist"),
        ("report", "plots", "plots is a folder"),
    ],
)
def test_plot_and_report_refuse_an_output_they_cannot_write(
    home, monkey, cli, command, out, message
):
    Path("plots").mkdir()
    sid = monkey.sweep("python -c \"import monkey; monkey.log('acc', {q})\"", grid={"q": [1]})
    wait_for(lambda: sweep_done(monkey, sid), timeout=60, what="the sweep to finish")
    target = sid if command == "report" else "last"
    proc = cli(command, target, *(["-m", "acc"] if command == "plot" else []), "-o", out)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert sorted(p.name for p in Path.cwd().rglob("*")) == ["plots"]  # nothing written


def test_plot_data_of_no_job_is_one_line_not_a_crash(monkey):
    """Through the API a plot may name no job and no sweep (the fuzz found it: an
    IndexError, a 500): one line saying what to give."""
    with pytest.raises(MonkeyError, match="name the jobs to draw, or a sweep with --sweep"):
        monkey.plot_data([], metrics="acc")
