"""scripts/screenshots.py: the README's SVGs, regenerated from a demo MONKEY_HOME."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytestmark = pytest.mark.system  # runs scripts/ in a subprocess that drives the dashboard

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "screenshots.py"


def svg_text(path: Path) -> str:
    """The text an SVG shows (parsing it as XML on the way), spaces normalised."""
    root = ET.parse(path).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    return " ".join(" ".join(root.itertext()).replace("\xa0", " ").split())


def test_screenshots_script_writes_the_readme_svgs(tmp_path):
    out = tmp_path / "docs"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), "--home", str(tmp_path / "demo")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    names = ["dash-jobs.svg", "dash-metrics.svg", "dash-problems.svg", "report-chart.svg"]
    web = ["web-jobs.png", "web-job.png", "web-sweep.png", "web-compare.png"]  # by chromium
    assert done.stdout.split() == [str(out / name) for name in (*names, *web)]
    assert sorted(p.name for p in out.iterdir()) == sorted(names + web)  # nothing else
    for name in web:
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name

    jobs = svg_text(out / "dash-jobs.svg")
    for name in ("lr-depth-1", "lr-depth-12", "eval", "prepare", "export", "train/loss"):
        assert name in jobs, name
    assert "… --lr 0.001 --layers 2" in jobs  # a sweep's runs: the args that differ
    assert "running" in jobs and "failed" in jobs and "queued" in jobs

    problems = svg_text(out / "dash-problems.svg")
    assert "problems first" in problems
    rows = problems[problems.index("SWEEP") :]
    # the two failed jobs come first, above the queued and succeeded ones
    assert max(rows.index(" eval "), rows.index("lr-depth-12")) < rows.index("prepare")

    metrics = svg_text(out / "dash-metrics.svg")
    assert "series of 4 runs" in metrics and "train/loss" in metrics and "val/loss" in metrics
    assert "layers=2 lr=0.001" in metrics  # runs named by the parameters that differ

    chart = svg_text(out / "report-chart.svg")
    assert "val/loss" in chart and "step" in chart
    legend = [f"layers={d} lr={lr}" for lr in (0.001, 0.003, 0.01, 0.03) for d in (2, 4, 8)]
    assert all(entry in chart for entry in legend)  # one legend entry per run of the sweep
