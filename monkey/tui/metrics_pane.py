"""Live line charts of a job's logged metric series; several runs overlaid when marked, one
panel (and y-axis) per chosen metric, runs named by the parameters that differ."""

from __future__ import annotations

import math
import time

from textual import on, work
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widgets import SelectionList, Static
from textual.worker import get_current_worker
from textual_plotext import PlotextPlot

from monkey.api import MonkeyError
from monkey.tracking.charts import colours, nice_ticks, rgb, run_labels, tick_label
from monkey.tui.shared import SharedMonkey

POLL = 2.0  # seconds between reads of the selected series
MAX_POINTS = 400  # points drawn per series; longer series are thinned evenly

Series = list[tuple[int | None, float, float]]


class MetricsPane(Horizontal):
    """Series names on the left (space toggles one), the chart of the chosen ones on the right."""

    class Loaded(Message):
        """Series names of every run, and the points of the chosen series."""

        def __init__(self, names: list[str], points: dict[tuple[str, str], Series],
                     labels: dict[str, str]) -> None:
            super().__init__()
            self.names = names
            self.points = points
            self.labels = labels

    def __init__(self, shared: SharedMonkey, juids: list[str], **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.shared = shared
        self.juids = juids
        self.chosen: set[str] = set()
        self.names: list[str] = []
        self.shown: dict[tuple[str, str], tuple[int, float]] | None = None  # None: not drawn yet
        self.labels: dict[str, str] = {}

    def compose(self) -> ComposeResult:
        with Vertical(id="series-side"):
            yield Static("series" + (f" of {len(self.juids)} runs" if len(self.juids) > 1 else ""),
                         classes="pane-title")
            yield SelectionList[str](id="series")
        yield PlotextPlot(id="chart")

    def on_mount(self) -> None:
        self._read()

    @work(thread=True, exclusive=True, group="metrics")
    def _read(self) -> None:
        """Read the names, then the chosen series, every POLL seconds until cancelled."""
        worker = get_current_worker()
        monkey = self.shared.fresh()
        try:
            jobs = {juid: monkey.store.get_job(juid) for juid in self.juids}
            labels = run_labels({juid: job.params if job else {} for juid, job in jobs.items()})
            while not worker.is_cancelled:
                names: set[str] = set()
                points: dict[tuple[str, str], Series] = {}
                chosen = set(self.chosen)
                for juid in self.juids:
                    try:
                        mine = monkey.metric_names(juid)
                    except MonkeyError:
                        continue
                    names.update(mine)
                    for name in chosen & set(mine):
                        points[(juid, name)] = monkey.metrics(juid, name).get(name, [])
                if not worker.is_cancelled:
                    self.post_message(self.Loaded(sorted(names), points, labels))
                time.sleep(POLL if chosen or names else POLL / 4)
        finally:
            monkey.store.close()

    @on(Loaded)
    def _on_loaded(self, message: Loaded) -> None:
        self.labels = message.labels
        if message.names != self.names:
            self.names = message.names
            if not self.chosen and message.names:
                user = [n for n in message.names if not n.startswith("sys/")]
                self.chosen = {(user or message.names)[0]}
                self._read()  # read the first series at once rather than after POLL
            box = self.query_one("#series", SelectionList)
            at = box.highlighted
            was = box.get_option_at_index(at).value if at is not None else None
            box.clear_options()
            box.add_options([(n, n, n in self.chosen) for n in message.names])
            box.highlighted = message.names.index(was) if was in message.names else 0
        self._draw(message.points)

    @on(SelectionList.SelectedChanged, "#series")
    def _on_choice(self, event: SelectionList.SelectedChanged) -> None:
        chosen = set(event.selection_list.selected)
        if chosen != self.chosen:
            self.chosen = chosen
            self._read()

    def _draw(self, points: dict[tuple[str, str], Series]) -> None:
        points = {k: v for k, v in points.items() if k[1] in self.chosen}
        stamp = {k: (len(v), v[-1][2] if v else 0.0) for k, v in points.items()}
        if stamp == self.shown:
            return
        self.shown = stamp
        chart = self.query_one("#chart", PlotextPlot)
        plt = chart.plt
        plt.clear_data()
        plt.clear_figure()
        many = len(self.juids) > 1
        metrics = sorted({name for _, name in points})
        palette = dict(zip(self.juids, colours(len(self.juids))))  # one colour per run
        if len(metrics) > 1:
            plt.subplots(len(metrics), 1)
        for row, metric in enumerate(metrics, start=1):
            if len(metrics) > 1:
                plt.subplot(row, 1)
            ys_all: list[float] = []
            for juid in self.juids:
                xs, ys = _thin(points.get((juid, metric), []))
                if xs:  # one palette with the PNG and HTML charts: 20 runs stay distinct
                    ys_all += ys
                    label = self.labels.get(juid, juid) if many and row == 1 else None
                    plt.plot(xs, ys, label=label, color=rgb(palette[juid]))
            if ys_all:
                ticks = nice_ticks(min(ys_all), max(ys_all))
                step = ticks[1] - ticks[0] if len(ticks) > 1 else 1.0
                plt.yticks(ticks, [tick_label(t, step) for t in ticks])
            plt.title(metric)
            plt.xlabel("step")
        if not points:
            plt.title("no metrics yet: log them with monkey.log(name, value, step=...)"
                      if not self.names else "choose series with space")
        chart.refresh()


def _thin(series: Series) -> tuple[list[float], list[float]]:
    """x (step, else the point's index) and y of at most MAX_POINTS points; NaN dropped."""
    every = max(1, math.ceil(len(series) / MAX_POINTS))
    xs, ys = [], []
    for i, (step, value, _) in enumerate(series[::every]):
        if not math.isnan(value):
            xs.append(float(step if step is not None else i * every))
            ys.append(value)
    return xs, ys
