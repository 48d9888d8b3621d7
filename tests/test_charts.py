"""The chart model (monkey/tracking/charts.py) and the SVG charts drawn with it."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest

from monkey.tracking.charts import colours, ema, log_ticks, nice_ticks, run_labels, tick_label
from monkey.tracking.plots import svg_chart


def test_25_runs_never_put_two_equal_colours_side_by_side():
    palette = colours(25)
    assert len(set(palette[:20])) == 20  # distinct for 20 runs
    assert all(a != b for a, b in zip(palette, palette[1:]))


def test_ticks_are_round_and_cover_the_data():
    assert nice_ticks(0.03712, 2.863) == [0.0, 1.0, 2.0, 3.0]
    assert nice_ticks(0.21, 0.88) == [0.2, 0.4, 0.6, 0.8, 1.0]
    steps = nice_ticks(0, 9, integer=True)
    assert steps == [0, 2, 4, 6, 8, 10] and all(float(s).is_integer() for s in steps)
    assert nice_ticks(0, 3, integer=True) == [0, 1, 2, 3]  # never 0.5 steps for steps
    assert log_ticks(0.003, 2.1) == [0.001, 0.01, 0.1, 1.0, 10.0]
    assert [tick_label(v, 0.2) for v in (0.2, 0.4, 1.0)] == ["0.2", "0.4", "1.0"]
    with pytest.raises(ValueError):
        log_ticks(0, 1)


def test_runs_are_named_by_the_parameters_that_differ():
    labels = run_labels(
        {
            "26-01": {"lr": 0.03, "layers": 4, "seed": 1},
            "26-02": {"lr": 0.1, "layers": 8, "seed": 1},
            "26-03": {},
        }
    )
    assert labels == {"26-01": "lr=0.03 layers=4", "26-02": "lr=0.1 layers=8", "26-03": "26-03"}
    assert run_labels({"a": {"lr": 1}, "b": {"lr": 1}}) == {"a": "a", "b": "b"}


def test_ema_smooths_without_starting_from_zero():
    assert ema([2.0, 2.0, 2.0], 0.9) == pytest.approx([2.0, 2.0, 2.0])
    smooth = ema([0.0, 1.0] * 10, 0.8)
    assert max(smooth[-4:]) - min(smooth[-4:]) < 0.4
    assert ema([1.0, 5.0], 0.0) == [1.0, 5.0]


def test_svg_chart_has_nice_ticks_and_one_legend_entry_per_run():
    lines = {
        f"lr={lr}": [(step, 1 / (step + 1) * lr, 0.0) for step in range(10)]
        for lr in (0.5, 1.0, 2.0)
    }
    svg = svg_chart(lines, "loss")
    root = ET.fromstring(svg)
    texts = {el.get("class"): [] for el in root.iter() if el.get("class")}
    for el in root.iter():
        if el.get("class"):
            texts[el.get("class")].append(el.text)
    assert texts["legend"] == list(lines)
    assert texts["xtick"] == ["0", "2", "4", "6", "8", "10"]  # integer steps
    assert texts["ytick"] == ["0.0", "0.5", "1.0", "1.5", "2.0"]
    strokes = re.findall(r'<polyline class="line" fill="none" stroke="(#[0-9a-f]{6})"', svg)
    assert len(set(strokes)) == 3
