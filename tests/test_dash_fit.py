"""The dashboard's metrics tab and jobs table at common terminal sizes (issue 42, items 9
and 10): every ticked series has a visible panel, and the table shows what tells runs apart."""

from __future__ import annotations

import re

import pytest
from test_tui import cell, drive, offered, row_text, screen_text, until
from test_tui_charts import NOW

from monkey.api import Monkey
from monkey.tracking.ingest import as_columns
from monkey.tui.app import DashApp
from monkey.tui.job_screen import JobScreen
from monkey.tui.metrics_pane import MetricsPane

SERIES = ("acc", "grad_norm", "loss", "lr")


def logged_run(m: Monkey, argv: list[str], series=SERIES, steps: int = 30) -> str:
    """A finished-looking job with SERIES logged over STEPS steps."""
    template = m.run(["true"], start_core=False, name="template").record
    with m.store.tx() as db:
        job = m.store.create_job(
            name="train",
            argv=argv,
            provider="local",
            resources=template.resources,
            env={},
            snapshot=template.snapshot,
            workdir=template.workdir,
            datasets=[],
            git={},
            python=template.python,
            now=NOW - 100,
        )
        points = [
            (n, s, (i + 1) / (s + 1), NOW - 90 + s)
            for i, n in enumerate(series)
            for s in range(steps)
        ]
        m.store._insert_columns(db, job.juid, 1, as_columns(points))
    return job.juid


@pytest.mark.parametrize("size", [(80, 24), (160, 45)])
def test_every_ticked_series_has_a_visible_panel(home, monkey, size):
    juid = logged_run(monkey, ["python", "train.py"])
    app = DashApp(home, clock=lambda: NOW)

    async def body(pilot) -> None:
        await until(pilot, lambda: app.table.row_count == 2, "the jobs")
        app.push_screen(JobScreen(app.shared, juid, app.clock))
        await pilot.pause()
        await pilot.press("m")
        pane = app.screen.query_one(MetricsPane)
        await until(pilot, lambda: pane.shown, "the first chart")
        for _ in SERIES[1:]:
            await pilot.press("down", "space")
        await until(pilot, lambda: pane.shown and len(pane.shown) == 4, "four series")
        fits = size[1] >= 45

        def every_series_in_view_or_named() -> bool:
            # each series once in the list of series, once more as a panel's title or in
            # the hint that names the panels below the fold
            text = screen_text(app)
            named = all(
                len(re.findall(rf"(?<![\w/]){name}(?![\w/])", text)) >= 2 for name in SERIES
            )
            return named and ("more panels below" in text) is not fits

        await until(pilot, every_series_in_view_or_named, "every panel in view or named")
        if not fits:  # the hint scrolls away with the panels it names
            await pilot.press("tab")
            await pilot.press("end")
            await until(pilot, lambda: "above:" in screen_text(app), "the panels above named")

    drive(app, body, size)


def test_sweep_runs_show_the_args_that_differ_and_metrics_take_their_width(home, monkey):
    base = ["python", "train.py", "--data", "/datasets/imagenet-subset/train", "--epochs", "30"]
    runs = {
        l2: logged_run(
            monkey,
            [*base, "--l2", l2, "--seed", "1"],
            series=("train/cross_entropy", "val/top1_accuracy", "val/top5_accuracy"),
        )
        for l2 in ("0", "0.01")
    }
    template = monkey.run(["true"], start_core=False, name="plain").juid
    with monkey.store.tx():
        sid = monkey.store.create_sweep("l2-search", {"command": base}, state="finished", now=NOW)
    monkey.store.db.execute("UPDATE jobs SET sweep = ? WHERE juid IN (?, ?)", (sid, *runs.values()))
    app = DashApp(home, clock=lambda: NOW)

    async def body(pilot) -> None:
        await until(pilot, lambda: app.table.row_count == 5, "the jobs")
        await until(pilot, lambda: "0.01" in row_text(app, runs["0.01"]), "the l2 of a run")
        for l2, juid in runs.items():
            line = row_text(app, juid)
            assert line.endswith(f"--l2 {l2} --seed 1"), line  # what tells it apart
            assert "train/cross_entropy" in line  # its metrics, cut to the column
        assert row_text(app, template).endswith(" true")

    drive(app, body, (160, 45))


def test_owner_column_shows_on_a_home_with_others_jobs_only(home, monkey):
    mine = monkey.run(["true"], start_core=False).juid
    app = DashApp(home, clock=lambda: NOW)

    async def alone(pilot) -> None:
        await until(pilot, lambda: app.table.row_count == 1, "the job")
        assert "OWNER" not in screen_text(app)  # a home of one user: nobody else's jobs

    drive(app, alone)
    monkey.store.db.execute("UPDATE jobs SET owner = 'alice' WHERE juid = ?", (mine,))
    theirs = monkey.run(["true"], start_core=False).juid
    app = DashApp(home, clock=lambda: NOW)

    async def shared(pilot) -> None:
        await until(pilot, lambda: app.table.row_count == 2, "the jobs")
        await until(pilot, lambda: "OWNER" in screen_text(app), "the OWNER column")
        assert " alice " in row_text(app, mine)
        assert cell(app, theirs, "owner") not in ("", "alice")
        assert offered(app)["cancel"]  # this machine's store: its user steers every job

    drive(app, shared)
