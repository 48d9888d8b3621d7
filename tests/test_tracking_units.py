"""Pure parts of tracking: sweep expansion, early-termination rules, sorting, flattening."""

from __future__ import annotations

import math

import pytest

from monkey.models import MonkeyError
from monkey.tracking import early_stop, sweepspec
from monkey.tracking.compare import sort_rows
from monkey.tracking.ingest import flatten


def test_grid_is_every_combination_in_order():
    spec = sweepspec.check(
        sweepspec.from_options(
            ["train", "--lr", "{lr}", "--bs={bs}"], grid=["lr=0.01,0.1", "bs=32,64,128"]
        )
    )
    cells = sweepspec.expand(spec)
    assert (
        len(cells) == 6
        and cells[0] == {"lr": 0.01, "bs": 32}
        and cells[-1] == {"lr": 0.1, "bs": 128}
    )
    assert sweepspec.render(spec["command"], cells[1]) == ["train", "--lr", "0.01", "--bs=64"]
    assert spec["retries"] == 2 and spec["method"] == "grid"
    shell = sweepspec.check(sweepspec.from_options(["sh", "-c", "echo {a} ${HOME}"], grid=["a=1"]))
    assert sweepspec.render(shell["command"], {"a": 1}) == ["sh", "-c", "echo 1 ${HOME}"]


def test_random_draws_are_reproducible_and_in_range():
    options = sweepspec.from_options(
        ["t", "{lr}", "{n}", "{act}", "{w}"],
        random_count=50,
        log_uniform=["lr=1e-5:1e-1"],
        ints=["n=1:4"],
        choice=["act=relu,gelu"],
        uniform=["w=-1:1"],
    )
    spec = sweepspec.check({**options, "seed": 3})
    cells = sweepspec.expand(spec)
    assert cells == sweepspec.expand(spec) and len(cells) == 50
    assert all(
        1e-5 <= c["lr"] <= 1e-1 and c["n"] in (1, 2, 3, 4) and -1 <= c["w"] <= 1 for c in cells
    )
    assert {c["act"] for c in cells} == {"relu", "gelu"} and {c["n"] for c in cells} == {1, 2, 3, 4}
    small = [c for c in cells if c["lr"] < 1e-3]
    assert len(small) > 15  # log-uniform: half the decades lie below 1e-3


@pytest.mark.parametrize(
    "spec, message",
    [
        (
            {
                "command": ["t", "{a}"],
                "parameters": {"a": {"distribution": "beta", "min": 0, "max": 1}},
                "method": "random",
                "count": 2,
            },
            "unknown distribution 'beta'",
        ),
        (
            {"command": ["t", "{a}"], "parameters": {"a": {"values": [1]}}, "method": "random"},
            "needs a count",
        ),
        (
            {"command": ["t", "{a}"], "parameters": {"a": {"values": [1]}}, "method": "bayes"},
            "unknown sweep method",
        ),
        (
            {
                "command": ["t", "{a}"],
                "parameters": {"a": {"distribution": "log_uniform", "min": 0, "max": 1}},
                "method": "random",
                "count": 1,
            },
            "needs min > 0",
        ),
        (
            {
                "command": ["t", "{a}"],
                "parameters": {"a": {"values": [1]}},
                "metric": {"name": "x", "goal": "up"},
            },
            "goal 'up'",
        ),
        ({"command": [], "parameters": {"a": {"values": [1]}}}, "needs a command"),
    ],
)
def test_bad_specs(spec, message):
    with pytest.raises(MonkeyError, match=message):
        sweepspec.check(spec)


def test_median_rule_stops_runs_below_the_median_of_running_averages():
    curves = {str(q): [q * (1 - 1 / (s + 1)) for s in range(1, 6)] for q in range(1, 6)}
    running = set(curves)
    assert early_stop.median_stop(curves, running, min_steps=3, min_runs=2) == {"1", "2"}
    assert early_stop.median_stop(curves, running, min_steps=6, min_runs=2) == set()
    assert early_stop.median_stop(curves, running, min_steps=3, min_runs=5) == set()


def test_a_run_ahead_of_the_others_is_judged_at_the_step_they_reached():
    """The worst run started first (a loaded machine staggers starts): it is judged at the
    latest step the others reached, by both rules, instead of escaping them until it ends."""
    curves = {str(q): [q * (1 - 1 / (s + 1)) for s in range(1, 6)] for q in range(2, 6)}
    curves["1"] = [1 * (1 - 1 / (s + 1)) for s in range(1, 21)]  # 20 steps; the others 5
    assert early_stop.median_stop(curves, set(curves), min_steps=3, min_runs=2) == {"1", "2"}
    assert "1" in early_stop.asha_stop(curves, set(curves), min_steps=2, eta=2)
    alone = {"1": curves["1"], "2": curves["2"][:2]}  # nobody else reached step 3 yet
    assert early_stop.median_stop(alone, set(alone), min_steps=3, min_runs=1) == set()


def test_asha_keeps_the_top_third_at_each_rung():
    curves = {str(i): [float(i)] * 3 for i in range(9)}
    assert early_stop.asha_stop(curves, set(curves), min_steps=1, eta=3) == {
        str(i) for i in range(6)
    }
    assert early_stop.asha_stop({"a": [1.0]}, {"a"}, min_steps=1, eta=3) == set()  # alone


def test_goal_min_is_oriented_and_nan_is_worst():
    assert early_stop.oriented([1.0, math.nan, None], "min") == [-1.0, -math.inf, -math.inf]


def test_sort_puts_missing_and_nan_last():
    rows = [{"x": 2.0}, {"x": None}, {"x": math.nan}, {"x": 5.0}, {"x": 1.0}]
    assert [r["x"] for r in sort_rows(rows, "x", descending=True)][:3] == [5.0, 2.0, 1.0]
    assert [r["x"] for r in sort_rows(rows, "x", descending=False)][:3] == [1.0, 2.0, 5.0]


def test_flatten_nested_configs():
    assert flatten({"optim": {"lr": 0.1, "betas": {"b1": 0.9}}, "bs": 32, "empty": {}}) == {
        "optim.lr": 0.1,
        "optim.betas.b1": 0.9,
        "bs": 32,
        "empty": {},
    }


@pytest.mark.parametrize(
    "args, kwargs, message",
    [
        (("acc", None), {}, "the value of 'acc' must be a number, got None"),
        (("acc", "high"), {}, "the value of 'acc' must be a number, got 'high'"),
        (("acc", [0.1, 0.2]), {}, "the value of 'acc' must be a number, got [0.1, 0.2]"),
        (("acc", 0.5), {"step": "ten"}, "step must be a whole number, got 'ten'"),
        (({"loss": None},), {}, "the value of 'loss' must be a number, got None"),
        ((7, 0.5), {}, "name must be a string or a dict, got int"),
    ],
)
def test_a_bad_log_call_names_the_metric_and_the_value(args, kwargs, message):
    from monkey.client_agent import track as logger

    with pytest.raises((TypeError, ValueError)) as err:
        logger.log(*args, **kwargs)
    assert str(err.value) == f"monkey.log: {message}" and not logger._points


def test_plots_draw_steps_logged_out_of_order_in_step_order():
    from monkey.tracking.plots import xy

    assert xy([(5, 3.0, 0.0), (1, 1.0, 0.1), (3, 2.0, 0.2), (None, math.nan, 0.3)]) == (
        [1, 3, 5],
        [1.0, 2.0, 3.0],
    )


@pytest.mark.parametrize(
    "metric, goal, expected",
    [
        ("val_loss", None, "min"),
        ("error_rate", None, "min"),
        ("acc", None, "max"),
        ("val_loss", "max", "max"),
        ("acc", "minimize", "min"),
    ],
)
def test_a_sweep_metric_without_a_goal_is_minimised_when_it_is_a_loss(metric, goal, expected):
    spec = sweepspec.from_options(["t", "{lr}"], grid=["lr=1"])
    spec["metric"] = {"name": metric, "goal": goal}
    assert sweepspec.check(spec)["metric"] == {"name": metric, "goal": expected}
