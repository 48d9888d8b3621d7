"""Results that read right (issue 25, section 7): a report of values logged once and a runs
table that fits the page, compare keeping its sorted column on a narrow terminal, sweep
status refusing to rank parameters from too few runs, `rm --sweep` deleting the sweep, and
time limits that must carry a unit."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

from conftest import wait_for

TRAIN = """\
import json, sys
lr = float(sys.argv[2])
for step in range(3):
    print(json.dumps({"monkey": {"step": step, "val_loss": 1 / (1 + lr * step), "acc": lr * step}}))
print(json.dumps({"monkey": {"test_acc": lr * 10}}), flush=True)
"""


class Page(HTMLParser):
    """What a reader of the report sees: the CSS, the runs table's container and id cells,
    line-chart panels, and the values drawn as bars."""

    def __init__(self) -> None:
        super().__init__()
        self.css = ""
        self.wrapped_table = False
        self.id_cells: list[str] = []
        self.panels: list[str] = []
        self.values: dict[str, list[str]] = {}  # metric -> the value texts beside its bars
        self.bars: dict[str, int] = {}
        self._stack: list[str] = []
        self._in: str | None = None
        self._metric: str | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        cls = (a.get("class") or "").split()
        if tag == "table" and a.get("id") == "runs":
            self.wrapped_table = "table-wrap" in self._stack
        self._stack.append(" ".join(cls))
        if tag == "style":
            self._in = "style"
        elif tag == "td" and "id" in cls:
            self._in = "id"
            self.id_cells.append("")
        elif tag == "g" and "panel" in cls:
            self.panels.append(a["data-metric"])
        elif tag == "g" and "values" in cls:
            self._metric = a["data-metric"]
            self.values[self._metric], self.bars[self._metric] = [], 0
        elif tag == "rect" and "bar" in cls and self._metric:
            self.bars[self._metric] += 1
        elif tag == "text" and "value" in cls and self._metric:
            self._in = "value"

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        self.handle_endtag(tag)

    def handle_endtag(self, tag):
        if self._stack:
            self._stack.pop()
        if tag == "g":
            self._metric = None
        self._in = None

    def handle_data(self, data):
        if self._in == "style":
            self.css += data
        elif self._in == "id":
            self.id_cells[-1] += data
        elif self._in == "value" and self._metric:
            self.values[self._metric].append(data)


def _sweep(cli, monkey, *extra: str, tail: tuple[str, ...] = ()) -> str:
    Path("train.py").write_text(TRAIN)
    sid = cli(
        "sweep",
        *extra,
        "--metric",
        "val_loss",
        "--goal",
        "min",
        "--",
        sys.executable,
        "train.py",
        "--lr",
        "{lr}",
        *tail,
        check=True,
    ).stdout.strip()
    wait_for(
        lambda: monkey.store.get_sweep(sid)["state"] == "finished",
        timeout=120,
        what="the sweep to finish",
    )
    return sid


def _six_random(cli, monkey) -> str:
    return _sweep(
        cli,
        monkey,
        "--random",
        "6",
        "--uniform",
        "lr=0.001:0.1",
        "--uniform",
        "momentum=0.5:0.99",
        "--seed",
        "1",
        tail=("--momentum", "{momentum}"),
    )


def test_six_random_runs_are_too_few_to_rank_parameters(cli, home, monkey, tmp_path):
    sid = _six_random(cli, monkey)
    # No value repeats in 6 random runs: no importance of 1.00 each, but how many runs would do.
    status = cli("sweep", "status", sid, check=True).stdout
    assert (
        "parameter importance: too few runs to rank parameters (6 runs with a value, their "
        "values need repeats); about 10 runs would do"
    ) in status
    assert "1.00" not in status
    out = tmp_path / "report.html"
    cli("report", sid, "-o", str(out), check=True)
    assert "too few runs to rank parameters" in out.read_text()


def test_report_draws_values_logged_once_and_fits_the_page(cli, home, monkey, tmp_path):
    sid = _six_random(cli, monkey)
    juids = [j.juid for j in monkey.store.list_jobs(sweep=sid, newest_first=False)]
    # test_acc (logged once per run) as a bar and value per run, not an empty axis; the wide
    # runs table scrolls in its container and never breaks a job id.
    out = tmp_path / "report.html"
    cli("report", sid, "-o", str(out), check=True)
    page = Page()
    page.feed(out.read_text())
    assert page.panels == ["acc", "val_loss"]
    assert page.bars == {"test_acc": 6}
    lrs = {j.juid: j.params["lr"] for j in monkey.store.list_jobs(sweep=sid)}
    assert sorted(float(v) for v in page.values["test_acc"]) == sorted(
        float(f"{lr * 10:.4g}") for lr in lrs.values()
    )
    assert sorted(page.id_cells) == sorted(juids)
    assert page.wrapped_table
    assert re.search(r"\.table-wrap\{[^}]*overflow-x:auto", page.css)
    nowrap = {
        sel.strip()
        for sels, body in re.findall(r"([^{}]+)\{([^}]*)\}", page.css)
        if "white-space:nowrap" in body
        for sel in sels.split(",")
    }
    assert {"th", "td"} <= nowrap  # ids and names (sw-...-4) never break at their hyphens


def test_compare_on_a_narrow_terminal_keeps_the_sorted_column(cli, home, monkey):
    sid = _six_random(cli, monkey)
    narrow = dict(os.environ, COLUMNS="70")
    shown = subprocess.run(
        [sys.executable, "-m", "monkey", "compare", "--sweep", sid, "--sort", "val_loss"],
        capture_output=True,
        text=True,
        env=narrow,
    )
    header = shown.stdout.splitlines()[0].split()
    assert shown.returncode == 0 and "val_loss" in header, shown.stdout
    assert "columns left out to fit the terminal" in shown.stderr
    ranked = subprocess.run(
        [sys.executable, "-m", "monkey", "compare", "--sweep", sid],
        capture_output=True,
        text=True,
        env=narrow,
    )
    assert "val_loss:best" in ranked.stdout.splitlines()[0].split()


def test_rm_of_every_job_of_a_sweep_deletes_the_sweep(cli, home, monkey):
    sid = _six_random(cli, monkey)
    cli("rm", "--sweep", sid, "--yes", check=True)
    assert sid not in cli("list", "sweeps", check=True).stdout
    gone = cli("sweep", "status", sid)
    assert gone.returncode != 0 and f"no sweep matches {sid!r}" in gone.stderr


def test_a_grid_that_repeats_values_is_ranked_and_a_partial_rm_keeps_the_sweep(cli, home, monkey):
    sid = _sweep(
        cli, monkey, "--grid", "lr=0.01,0.1", "--grid", "seed=1,2", tail=("--seed", "{seed}")
    )
    status = cli("sweep", "status", sid, check=True).stdout
    assert re.search(r"^  lr\s+1\.00 #+$", status, re.M)  # only lr moves val_loss
    assert re.search(r"^  seed\s+0\.00 *$", status, re.M)
    assert "too few runs" not in status
    first = monkey.store.list_jobs(sweep=sid, newest_first=False)[0].juid
    cli("rm", first, "--yes", check=True)
    assert re.search(rf"^{sid}\s.*\b3/3\b", cli("list", "sweeps", check=True).stdout, re.M)


def test_a_time_limit_needs_its_unit_everywhere(cli, home, monkey):
    for args in (
        ["run", "--time", "5", "--", "true"],
        ["sweep", "--grid", "a=1,2", "--time", "5", "--", "echo", "{a}"],
    ):
        bad = cli(*args)
        assert bad.returncode == 1, bad.stderr
        assert bad.stderr.strip() == (
            "monkey: error: time limit '5' has no unit; write 5m for 5 "
            "minutes (or 5s, 5h, 5d, HH:MM:SS)"
        )
    assert monkey.jobs() == [] and monkey.store.list_sweeps() == []
    assert "a bare number is refused: write 5m" in " ".join(cli("run", "--help").stdout.split())

    juid = cli("run", "--time", "5m", "--", "true", check=True).stdout.strip()
    assert re.search(
        r"^time limit\s+5m per attempt$", cli("info", "job", juid, check=True).stdout, re.M
    )
    again = cli("rerun", juid, "--time", "90", "--json")
    assert again.returncode == 1 and "write 90m for 90 minutes" in again.stderr
    sid = cli(
        "sweep", "--grid", "a=1,2", "--time", "1:30:00", "--", "echo", "{a}", check=True
    ).stdout.strip()
    assert {j.resources.time for j in monkey.store.list_jobs(sweep=sid)} == {5400}
    plain = cli("run", "--", "true", check=True).stdout.strip()
    assert re.search(r"^time limit\s+none$", cli("info", "job", plain, check=True).stdout, re.M)
