"""The dashboard's metrics pane controls (EMA, log y, x by step/epoch/time) and its sweep
analysis view, driven by Textual's pilot over a real MONKEY_HOME filled through the store;
assertions are on the chart model's series as drawn, not on pixels. SVG snapshots of both
(`pytest tests/test_tui_charts.py --snapshot-update` after a deliberate change)."""

from __future__ import annotations

import math
import random
from collections.abc import Awaitable, Callable

import pytest
from test_tui import drive as tui_drive
from test_tui import screen_text, until

from monkey.api import Monkey
from monkey.tracking.charts import ema, value_colour
from monkey.tracking.ingest import as_columns
from monkey.tracking.sweep_analysis import METHOD
from monkey.tui.app import DashApp
from monkey.tui.help_screen import HelpScreen
from monkey.tui.job_screen import JobScreen
from monkey.tui.metrics_pane import MetricsPane
from monkey.tui.sweep_view import BuiltPlot, SweepScreen

NOW = 1_795_000_000.0  # 2026-11-18 08:26:40 UTC
SIZE = (140, 44)
LRS = (0.001, 0.003, 0.01, 0.03, 0.1, 0.3)


def fill_sweep(m: Monkey, n: int = 12, steps: int = 20) -> tuple[str, list[str]]:
    """A finished-looking sweep of N runs over lr, layers and seed where only lr matters:
    loss ends at |log10(lr) + 2| (best at lr=0.01) plus noise far below the lr effect. Each
    run logs `loss` and `epoch` (every 5 steps) at fixed wall times, one run a minute."""
    spec = {
        "command": ["python", "t.py"],
        "method": "grid",
        "count": None,
        "parameters": {"lr": {"values": list(LRS)}},
        "metric": {"name": "loss", "goal": "min"},
        "max_parallel": None,
        "early_terminate": None,
        "retries": 0,
        "seed": 0,
    }
    template = m.run(["true"], start_core=False, name="template").record
    rng = random.Random(7)
    juids = []
    with m.store.tx() as db:
        sid = m.store.create_sweep("lr-search", spec, state="finished", now=NOW - 7200)
        for i in range(n):
            params = {
                "lr": LRS[i % len(LRS)],
                "layers": rng.choice((2, 4, 8)),
                "seed": rng.randrange(1000),
            }
            job = m.store.create_job(
                name="lr-search",
                argv=["python", "t.py", str(i)],
                provider="local",
                resources=template.resources,
                env={},
                snapshot=template.snapshot,
                workdir=template.workdir,
                datasets=[],
                git={},
                python=template.python,
                sweep=sid,
                params=params,
                now=NOW - 7000 + i,
            )
            final = abs(math.log10(params["lr"]) + 2) + rng.uniform(0, 0.01)
            start = NOW - 6000 + 60 * i
            points = [("loss", s, final + 2.0 / (s + 1), start + 3 * s) for s in range(steps)]
            points += [("epoch", s, s // 5, start + 3 * s) for s in range(0, steps, 5)]
            m.store._insert_columns(db, job.juid, 1, as_columns(points))
            juids.append(job.juid)
    return sid, juids


def drawn(view: SweepScreen) -> bool:
    """The sweep view shows its data with every chart built (they are built in threads)."""
    plots = view.query(BuiltPlot)
    return bool(view.scatters and plots and all(p.ready for p in plots))


async def sweep_view(app: DashApp, pilot, rows: int, juid: str) -> SweepScreen:
    """The sweep view (key a) of JUID's sweep, once the table shows ROWS jobs, drawn."""
    await until(pilot, lambda: app.table.row_count == rows, "the jobs")
    app.table.move_cursor(juid)
    await pilot.press("a")
    await until(
        pilot, lambda: isinstance(app.screen, SweepScreen) and drawn(app.screen), "the sweep view"
    )
    return app.screen


def drive(app: DashApp, body: Callable[..., Awaitable[None]]) -> None:
    tui_drive(app, body, SIZE)


async def overlaid_metrics(app: DashApp, pilot, juids: list[str]) -> MetricsPane:
    """The metrics pane (key m) of the first run's screen with the other runs overlaid."""
    app.push_screen(JobScreen(app.shared, juids[0], app.clock, overlay=juids[1:]))
    await pilot.pause()
    await pilot.press("m")
    return app.screen.query_one(MetricsPane)


def test_keys_smooth_log_scale_and_change_x_of_the_plotted_series(home, monkey):
    _, juids = fill_sweep(monkey, n=3)
    app = DashApp(home, clock=lambda: NOW)

    async def body(pilot) -> None:
        await until(pilot, lambda: app.table.row_count == 4, "the jobs")
        pane = await overlaid_metrics(app, pilot, juids)
        await until(
            pilot,
            lambda: pane.drawn.get("loss") and len(pane.drawn["loss"]) == 3,
            "the loss of the three runs",
        )
        raw = {j: pane.drawn["loss"][j] for j in juids}
        xs, ys = raw[juids[0]]
        assert xs == list(range(20)) and ys[0] > ys[-1]  # x by step
        text = screen_text(app)
        for label in ("lr=0.001", "lr=0.003", "lr=0.01"):  # legend: what differs, beside the data
            assert label in text, label
        assert "x: step (x)" in text and "smoothing: off" in text and "y: linear" in text

        await pilot.press("right_square_bracket", "right_square_bracket")  # 0 -> 0.3 -> 0.6
        assert pane.style.smooth == 0.6
        assert pane.drawn["loss"][juids[0]] == (xs, ema(ys, 0.6))
        assert "smoothing: EMA 0.6" in screen_text(app)
        await pilot.press("left_square_bracket", "left_square_bracket", "left_square_bracket")
        assert pane.style.smooth == 0.0 and pane.drawn["loss"][juids[0]] == (xs, ys)

        lin_ticks = pane.ticks["loss"]
        await pilot.press("y")
        assert pane.style.log_y and "y: log" in screen_text(app)
        assert pane.ticks["loss"] != lin_ticks  # powers of ten covering the values
        assert all(math.log10(t).is_integer() for t in pane.ticks["loss"])
        assert pane.drawn["loss"][juids[0]] == (xs, ys)  # all above 0: every point kept
        await pilot.press("y")

        await pilot.press("x")  # by epoch: each point at the epoch logged at or before it
        await until(
            pilot,
            lambda: pane.drawn["loss"][juids[0]][0] == [s // 5 for s in range(20)],
            "x by epoch",
        )
        assert "x: epoch" in screen_text(app)
        await pilot.press("x")  # by wall time: seconds since the run's first point
        assert pane.drawn["loss"][juids[0]][0] == [3.0 * s for s in range(20)]
        assert "x: seconds" in screen_text(app)
        await pilot.press("x")
        assert pane.style.x == "step" and pane.drawn["loss"][juids[0]][0] == xs

    drive(app, body)


def test_sweep_view_ranks_the_parameter_that_matters_and_highlights_the_best_run(home, monkey):
    sid, juids = fill_sweep(monkey, n=12)
    analysis = monkey.sweep_analysis(sid)  # what `sweep status` and `monkey report` show
    app = DashApp(home, clock=lambda: NOW)

    async def body(pilot) -> None:
        view = await sweep_view(app, pilot, 13, juids[3])
        assert list(view.importance)[0] == "lr" and view.importance["lr"] > 0.9
        assert view.importance == analysis["importance"] and view.method == METHOD
        assert view.best == analysis["best"]
        best_lr = monkey.store.get_job(view.best).params["lr"]
        assert best_lr == 0.01
        assert view.rows[0]["job"] == view.best  # ranked: best (lowest loss) first
        values = [r["value"] for r in view.rows]
        assert values == sorted(values)
        table = view.query_one("#sweep-runs")
        first = table.get_row_at(0)
        assert "★" in str(first[0]) and "#d62728" in str(first[1].style)  # highlighted
        assert set(view.scatters) == {"lr", "layers", "seed"}
        for xs, ys, best in view.scatters.values():
            assert len(xs) == len(ys) == 12 and best >= 0
        assert view.curve[1] == [v for _, v in analysis["best_so_far"]]
        assert len(view.parallel) == 12 and all(len(p) == 4 for p in view.parallel.values())
        assert view.parallel[view.best][-1] == min(p[-1] for p in view.parallel.values())
        text = screen_text(app)
        assert "method: variance split" in text and "loss by lr" in text
        assert "parameters and loss" in text
        table.focus()
        await pilot.press("enter")  # the run under the cursor: the best
        await until(pilot, lambda: isinstance(app.screen, JobScreen), "the best run's screen")
        assert app.screen.juid == view.best
        await pilot.press("escape", "escape")
        assert not isinstance(app.screen, (SweepScreen, JobScreen))

    drive(app, body)


def test_a_running_sweep_redraws_its_view_in_place_at_every_change(home, monkey):
    """A running sweep changes between two reads: the view draws again without mounting a
    second chart with the same id (DuplicateIds crashed the dashboard 15-20 s in)."""
    sid, juids = fill_sweep(monkey, n=6)
    monkey.store.db.execute("UPDATE sweeps SET state = 'running' WHERE id = ?", (sid,))
    app = DashApp(home, clock=lambda: NOW)

    async def body(pilot) -> None:
        view = await sweep_view(app, pilot, 7, juids[0])
        for round_ in range(3):  # three runs start: three redraws
            first = view.query_one("#sweep-parallel")
            monkey.store.db.execute(
                "UPDATE jobs SET state = 'running' WHERE juid = ?", (juids[round_],)
            )
            view._load()
            await until(
                pilot,
                lambda old=first: drawn(view) and view.query_one("#sweep-parallel") is not old,
                f"redraw {round_ + 1}",
            )
            assert len(view.query("#sweep-parallel")) == 1
        assert app.return_code in (None, 0) and app.is_running

    drive(app, body)


def test_past_20_overlaid_runs_are_coloured_by_a_parameter_with_a_colour_bar(home, monkey):
    _, juids = fill_sweep(monkey, n=25, steps=3)
    app = DashApp(home, clock=lambda: NOW)

    async def body(pilot) -> None:
        await until(pilot, lambda: app.table.row_count == 26, "the jobs")
        pane = await overlaid_metrics(app, pilot, juids)
        await until(pilot, lambda: len(pane.drawn.get("loss", {})) == 25, "25 runs drawn")
        seeds = {j: monkey.store.get_job(j).params["seed"] for j in juids}
        assert pane.by == ("seed", min(seeds.values()), max(seeds.values()))
        assert pane.palette[min(seeds, key=seeds.get)] == value_colour(0.0)
        assert pane.palette[max(seeds, key=seeds.get)] == value_colour(1.0)
        assert "colour: seed" in screen_text(app)

    drive(app, body)


def test_a_on_a_job_outside_any_sweep_says_so(home, monkey):
    juid = monkey.run(["true"], start_core=False).juid
    app = DashApp(home, clock=lambda: NOW)

    async def body(pilot) -> None:
        await until(pilot, lambda: app.table.row_count == 1, "the job")
        await pilot.press("a")
        await until(
            pilot,
            lambda: any(
                f"job {juid} is not part of a sweep" in str(n.message) for n in app._notifications
            ),
            "the warning",
        )
        assert not isinstance(app.screen, SweepScreen)

    drive(app, body)


@pytest.mark.system  # drives the dashboard app
def test_help_lists_the_chart_and_sweep_keys(home):
    app = DashApp(home)

    async def body(pilot) -> None:
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen), "the help")
        assert "Sweep analysis" in screen_text(app)  # among the keys that work everywhere
        app.screen.query_one("#dialog").scroll_end(animate=False)
        await pilot.pause()
        text = screen_text(app)
        for words in (
            "metrics pane",
            "Smooth more",
            "Smooth less",
            "Log/linear y",
            "x: step/epoch/time",
            "sweep analysis",
        ):
            assert words in text, words

    drive(app, body)


@pytest.fixture
def fixed_sweep(home, monkey, monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    sid, juids = fill_sweep(monkey, n=12)
    return sid, juids


def _open(keys: tuple[str, ...], ready: Callable[[DashApp], object], juid: str | None = None):
    async def run_before(pilot) -> None:
        app = pilot.app
        await until(pilot, lambda: app.table.row_count == 13, "the jobs")
        if juid:
            app.table.move_cursor(juid)
        await pilot.press(*keys)
        await until(pilot, lambda: ready(app), "the view")
        await pilot.pause(0.3)

    return run_before


def test_sweep_view_snapshot(fixed_sweep, home, snap_compare):
    _, juids = fixed_sweep
    app = DashApp(home, clock=lambda: NOW)
    assert snap_compare(
        app,
        terminal_size=SIZE,
        run_before=_open(
            ("a",), lambda a: isinstance(a.screen, SweepScreen) and drawn(a.screen), juids[0]
        ),
    )


def test_metrics_pane_snapshot_smoothed_on_a_log_scale(fixed_sweep, home, snap_compare):
    _, juids = fixed_sweep
    app = DashApp(home, clock=lambda: NOW)

    async def run_before(pilot) -> None:
        await until(pilot, lambda: app.table.row_count == 13, "the jobs")
        app.push_screen(JobScreen(app.shared, juids[0], app.clock, overlay=juids[1:4]))
        await pilot.pause()
        await pilot.press("m", "right_square_bracket", "y")
        pane = app.screen.query_one(MetricsPane)
        await until(pilot, lambda: len(pane.drawn.get("loss", {})) == 4, "the chart")
        await pilot.pause(0.3)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)
