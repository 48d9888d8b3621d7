"""A job using monkey's in-job API, run by a Python that has no monkey installed (a fresh
virtualenv: what a worker has), and what `monkey metrics` / `compare` show of it. Each
provider's tests run it there and on the local provider and expect the same."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

SCRIPT = """\
import monkey
monkey.log_params({"lr": 0.1, "optim": {"name": "sgd"}}, seed=7)
for step in range(50):
    monkey.log("loss", 1.0 / (step + 1), step=step)
    monkey.log({"acc": step / 50, "val.loss": 2.0 / (step + 1)}, step=step)
monkey.log("final_test_acc", 0.97)
monkey.flush()
monkey.summary(best_acc=0.98)
(monkey.checkpoint_dir() / "ckpt.txt").write_text("saved")
print("preempted", monkey.preempted(), "checkpoint", (monkey.checkpoint_dir() / "ckpt.txt").read_text())
"""

# What compare shows of the job, whatever ran it.
COMPARED = {
    "state": "succeeded",
    "lr": 0.1,
    "optim.name": "sgd",
    "seed": 7,
    "best_acc": 0.98,
    "acc": 0.98,
    "acc:best": 0.98,
    "final_test_acc": 0.97,
    "final_test_acc:best": 0.97,
    "loss": 0.02,
    "loss:best": 0.02,
    "val.loss": 0.04,
    "val.loss:best": 0.04,
}


@pytest.fixture
def open_tmp() -> Iterator[Path]:
    """A folder the hosts' user (tests/sshd.py) can read: for a worker's environments."""
    path = Path(tempfile.mkdtemp(prefix="monkey-in-job-"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def bare_python(folder: Path) -> str:
    """A virtualenv's python without monkey (nor any package) importable: a worker's. From
    the system's python3 when there is one (the hosts' user may not reach this one's)."""
    base = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    if not (folder / "bin" / "python").exists():
        subprocess.run([base, "-m", "venv", "--without-pip", str(folder)], check=True)
    python = str(folder / "bin" / "python")
    probe = subprocess.run(
        [python, "-c", "import monkey"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert "No module named 'monkey'" in probe.stderr, probe.stderr
    return python


def site_packages(venv: Path) -> Path:
    [site] = (venv / "lib").glob("python*/site-packages")
    return site


def tracked(cli: Any, juid: str) -> tuple[dict[str, Any], dict[str, list[list[Any]]]]:
    """The job's compare row (without its id, name and cost) and its points (without times)."""
    [row] = json.loads(cli("compare", juid, "--json", check=True).stdout)
    del row["job"], row["name"]
    row.pop("cost", None)  # a cloud's
    points = json.loads(cli("metrics", juid, "--json", check=True).stdout)
    series = {
        name: [[p["step"], p["value"]] for p in pts]
        for name, pts in points.items()
        if not name.startswith("sys/")
    }
    return row, series


def check_tracked(cli: Any, juid: str) -> tuple[dict[str, Any], dict[str, list[list[Any]]]]:
    """tracked(), checked against what SCRIPT logs."""
    row, series = tracked(cli, juid)
    assert {k: (round(v, 6) if isinstance(v, float) else v) for k, v in row.items()} == COMPARED, (
        row
    )
    assert [p[0] for p in series["loss"]] == list(range(50))
    assert sorted(series) == ["acc", "final_test_acc", "loss", "val.loss"], series
    assert series["final_test_acc"] == [[None, 0.97]]
    assert cli("logs", "--stdout", juid, check=True).stdout == "preempted False checkpoint saved\n"
    return row, series
