"""The dashboard's metrics tab and jobs table at common terminal sizes (issue 42, items 9
and 10): every ticked series has a visible panel, and the table shows what tells runs apart."""

from __future__ import annotations

import re

import pytest
from test_tui import drive, screen_text, until
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
        text = screen_text(app)
        # each series once in the list of series, once more as a panel's title or in the
        # hint that names the panels below the fold
        for name in SERIES:
            assert len(re.findall(rf"(?<![\w/]){name}(?![\w/])", text)) >= 2, (name, text)
        fits = size[1] >= 45
        assert ("more panels below" in text) is not fits

    drive(app, body, size)
