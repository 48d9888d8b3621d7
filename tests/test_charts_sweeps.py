"""Small multiples, smoothing, log scale, colour by parameter, PNG panels, and sweep
analysis (importance, parallel coordinates, scatters, best so far) drawn as SVG."""

from __future__ import annotations

import random
import struct
import xml.etree.ElementTree as ET
from html.parser import HTMLParser

import pytest

from monkey.tracking import sweep_analysis as sa
from monkey.tracking.plots import Style, png_plot, svg_charts, xy
from monkey.tracking.report import sweep_report

NS = "{http://www.w3.org/2000/svg}"


def texts(el: ET.Element, cls: str) -> list[str]:
    return [e.text for e in el.iter() if e.get("class") == cls]


def runs_of(n: int) -> dict[str, list]:
    return {
        f"lr={lr}": [(s, 2.0 / (s + 1) + lr, float(s)) for s in range(12)]
        for lr in [round(0.01 * (i + 1), 2) for i in range(n)]
    }


def test_each_metric_gets_its_own_panel_and_y_axis_and_one_legend_names_the_runs():
    loss = runs_of(3)
    mem = {run: [(s, 1000.0 + 50 * s, float(s)) for s in range(12)] for run in loss}
    root = ET.fromstring(svg_charts({"loss": loss, "sys/mem": mem}))
    panels = [g for g in root.iter(f"{NS}g") if g.get("class") == "panel"]
    assert [p.get("data-metric") for p in panels] == ["loss", "sys/mem"]
    # the memory's 1,000s do not flatten the loss: each panel has its own y ticks
    assert texts(panels[0], "ytick")[-1] == "2.5" and texts(panels[1], "ytick")[0] == "1000"
    assert all(texts(p, "xtick") == ["0", "5", "10", "15"] for p in panels)  # integer steps
    assert texts(root, "legend") == list(loss)  # one entry per run, not per line
    legend = next(g for g in root.iter(f"{NS}g") if g.get("class") == "legend-box")
    rects = [
        float(p.find(f"{NS}rect").get("x")) + float(p.find(f"{NS}rect").get("width"))
        for p in panels
    ]
    legend_x = min(float(t.get("x")) for t in legend.iter(f"{NS}text"))
    assert legend_x > max(rects)  # outside the data
    assert root.get("width") == "100%"  # as wide as the page


def test_smoothing_keeps_the_raw_line_faint_and_log_scale_ticks_powers_of_ten():
    noisy = {"a": [(s, 10.0 ** (s % 3), 0.0) for s in range(30)]}
    root = ET.fromstring(svg_charts({"v": noisy}, Style(smooth=0.6, log_y=True)))
    assert len([e for e in root.iter(f"{NS}polyline") if e.get("class") == "raw"]) == 1
    assert texts(root, "ytick") == ["1", "10", "100"]
    with pytest.raises(ValueError):
        svg_charts({"v": noisy}, Style(smooth=1.0))


def test_x_by_epoch_and_time():
    loss = [(0, 3.0, 100.0), (10, 2.0, 160.0), (20, 1.0, 220.0)]
    epochs = [(0, 1.0, 100.0), (15, 2.0, 190.0)]
    assert xy(loss, "epoch", epochs) == ([1.0, 1.0, 2.0], [3.0, 2.0, 1.0])
    assert xy(loss, "time") == ([0.0, 60.0, 120.0], [3.0, 2.0, 1.0])


def test_past_20_runs_colour_by_a_parameter_with_a_colour_bar():
    lines = runs_of(25)
    style = Style(by={run: float(run[3:]) for run in lines}, by_name="lr")
    root = ET.fromstring(svg_charts({"loss": lines}, style))
    assert [g for g in root.iter(f"{NS}g") if g.get("class") == "colour-bar"]
    assert len(texts(root, "legend")) == 25
    strokes = [e.get("stroke") for e in root.iter(f"{NS}polyline") if e.get("class") == "line"]
    assert len(set(strokes)) == 25 and strokes[0] != strokes[-1]


def test_png_has_one_panel_per_metric(tmp_path):
    pytest.importorskip("matplotlib")  # the `plot` and `test` extras install it
    loss = runs_of(3)
    out = png_plot(
        {"loss": loss, "acc": loss}, tmp_path / "p.png", Style(smooth=0.6), size=(700, 500)
    )
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", data[16:24]) == (700, 500)


def synthetic_sweep(n: int = 40) -> list[dict]:
    """Only lr moves the metric; layers and seed are noise-free decoys."""
    rng = random.Random(3)
    runs = []
    for i in range(n):
        lr = rng.choice([0.001, 0.01, 0.1, 1.0])
        params = {"layers": rng.choice([2, 4, 8]), "seed": rng.randint(0, 10**6), "lr": lr}
        acc = {0.001: 0.5, 0.01: 0.7, 0.1: 0.9, 1.0: 0.3}[lr] + rng.gauss(0, 0.01)
        runs.append({"job": f"j{i:02d}", "params": params, "value": acc, "ended": 60.0 * i})
    return runs


def test_importance_ranks_the_only_parameter_that_matters_first():
    runs = synthetic_sweep()
    result = sa.analyse(runs, "max")
    names = list(result["importance"])
    assert names[0] == "lr" and result["importance"]["lr"] > 0.9
    assert all(result["importance"][k] < 0.2 for k in ("layers", "seed"))
    assert result["best"] == max(runs, key=lambda r: r["value"])["job"]
    values = [v for _, v in result["best_so_far"]]
    assert values == sorted(values) and values[-1] == max(r["value"] for r in runs)
    assert "fANOVA" in result["method"]


class Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.svgs: list[str] = []
        self.best_rows = 0
        self._depth = 0
        self._buf: list[str] = []
        self.has_remote = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag in ("script", "link") or str(a.get("src", "")).startswith("http"):
            self.has_remote = True
        if tag == "tr" and a.get("class") == "best":
            self.best_rows += 1


def test_sweep_report_shows_analysis_and_small_multiples():
    runs = synthetic_sweep(8)
    status = {
        "id": "sw-1",
        "name": "s",
        "state": "finished",
        "done": 8,
        "total": 8,
        "counts": {"succeeded": 8},
        "created_at": 0.0,
        "best": None,
        "spec": {
            "command": ["t"],
            "method": "grid",
            "parameters": {},
            "metric": {"name": "acc", "goal": "max"},
        },
    }
    table = {"columns": ["job"], "rows": [{"job": r["job"]} for r in runs]}
    charts = {
        "acc": {r["job"]: [(s, r["value"] * s, 0.0) for s in range(5)] for r in runs},
        "loss": {r["job"]: [(s, 1.0 / (s + 1), 0.0) for s in range(5)] for r in runs},
    }
    analysis = sa.analyse(runs, "max") | {"runs": runs, "metric": {"name": "acc", "goal": "max"}}
    html = sweep_report(status, table, charts, Style(), analysis)
    page = Page()
    page.feed(html)
    assert not page.has_remote and page.best_rows == 1
    svgs = [ET.fromstring(m) for m in __import__("re").findall(r"<svg .*?</svg>", html)]
    by_class = {s.get("class"): s for s in svgs}
    parallel = by_class["parallel"]
    assert texts(parallel, "axis-name") == ["layers", "seed", "lr", "acc"]
    assert len([p for p in parallel.iter(f"{NS}polyline")]) == 8
    assert [p.get("class") for p in parallel.iter(f"{NS}polyline")][-1] == "run best"
    metrics = next(s for s in svgs if s.get("class") is None)
    assert [g.get("data-metric") for g in metrics.iter(f"{NS}g") if g.get("class") == "panel"] == [
        "acc",
        "loss",
    ]
    assert texts(metrics, "legend") == [r["job"] for r in runs]
    assert sum(1 for s in svgs if s.get("class") == "scatter") == 3 + 1  # 3 params + progress


def test_a_parameter_every_run_has_with_one_value_is_not_ranked():
    """`epochs` logged with log_params by every run, always 10: a constant, not a parameter
    of importance 0.00 beside the ones that vary (the dashboard and the report ranked it)."""
    runs = [
        {"job": f"j{i}", "params": {"lr": lr, "epochs": 10}, "value": v, "ended": float(i)}
        for i, (lr, v) in enumerate([(0.1, 1.0), (0.1, 1.1), (0.01, 0.2), (0.01, 0.3)])
    ]
    analysis = sa.analyse(runs, "min")
    assert list(analysis["importance"]) == ["lr"] and analysis["importance"]["lr"] > 0.9
    assert analysis["constants"] == {"epochs": 10} and "epochs" not in analysis["unranked"]
