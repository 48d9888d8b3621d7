"""Live line charts of a job's logged metric series; several runs overlaid when marked."""

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
from monkey.tracking.charts import colours, rgb
from monkey.tui.shared import SharedMonkey

POLL = 2.0  # seconds between reads of the selected series
MAX_POINTS = 400  # points drawn per series; longer series are thinned evenly

Series = list[tuple[int | None, float, float]]


class MetricsPane(Horizontal):
    """Series names on the left (space toggles one), the chart of the chosen ones on the right."""

    class Loaded(Message):
        """Series names of every run, and the points of the chosen series."""

        def __init__(self, names: list[str], points: dict[tuple[str, str], Series]) -> None:
            super().__init__()
            self.names = names
            self.points = points

    def __init__(self, shared: SharedMonkey, juids: list[str], **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.shared = shared
        self.juids = juids
        self.chosen: set[str] = set()
        self.names: list[str] = []
        self.shown: dict[tuple[str, str], tuple[int, float]] | None = None  # None: not drawn yet

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
                    self.post_message(self.Loaded(sorted(names), points))
                time.sleep(POLL if chosen or names else POLL / 4)
        finally:
            monkey.store.close()

    @on(Loaded)
    def _on_loaded(self, message: Loaded) -> None:
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
        lines = sorted(points.items())
        for colour, ((juid, name), series) in zip(colours(len(lines)), lines):
            xs, ys = _thin(series)
            if xs:  # one palette with the PNG and HTML charts: 20 runs stay distinct
                plt.plot(xs, ys, label=f"{juid} {name}" if many else name, color=rgb(colour))
        if not points:
            plt.title("no metrics yet: log them with monkey.log(name, value, step=...)"
                      if not self.names else "choose series with space")
        else:
            plt.title(", ".join(sorted({name for _, name in points})))
            plt.xlabel("step")
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
