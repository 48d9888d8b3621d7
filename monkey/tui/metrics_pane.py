"""Live line charts of a job's logged metric series; several runs overlaid when marked, one
panel (and y-axis) per chosen metric, a legend beside the panels naming runs by the
parameters that differ; EMA smoothing, log y and x by step, epoch or wall time on keys.

What is drawn comes from the chart model (monkey.tracking.plots / charts), as in the PNG and
HTML charts: ``drawn`` holds each panel's series as plotted, ``ticks`` its y ticks."""

from __future__ import annotations

import math
import time

from rich.markup import escape
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import SelectionList, Static
from textual.worker import get_current_worker
from textual_plotext import PlotextPlot

from monkey.api import MonkeyError
from monkey.tracking.charts import colour_param, rgb, run_labels, value_colour
from monkey.tracking.plots import X_AXES, X_LABELS, Style, axis, plot_points, run_colours
from monkey.tui.shared import SharedMonkey

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

POLL = 2.0  # seconds between reads of the selected series
MAX_POINTS = 400  # points drawn per series; longer series are thinned evenly
PANEL_ROWS = 9  # the least height of a metric's panel: past what fits, the panels scroll
SMOOTHING = (0.0, 0.3, 0.6, 0.8, 0.9, 0.95)  # EMA weights `[` and `]` step through

Series = list[tuple[int | None, float, float]]


class MetricsPane(Horizontal):
    """Series names and the legend on the left (space toggles a series), the charts of the
    chosen ones on the right, one panel each, with the current x axis, smoothing and y scale
    above them. Panels share the height down to PANEL_ROWS rows each; past that they scroll,
    and a line above them names the panels below the fold."""

    BINDINGS = [
        Binding("right_square_bracket", "smooth(1)", "Smooth more"),
        Binding("left_square_bracket", "smooth(-1)", "Smooth less"),
        Binding("y", "log_y", "Log/linear y"),
        Binding("x", "next_x", "x: step/epoch/time"),
    ]

    class Loaded(Message):
        """Series names of every run, the points of the chosen series, and each run's
        ``epoch`` series (read only while x is by epoch)."""

        def __init__(
            self,
            names: list[str],
            points: dict[tuple[str, str], Series],
            labels: dict[str, str],
            epochs: dict[str, Series],
            palette: dict[str, str],
            by: tuple[str, float, float] | None,
        ) -> None:
            super().__init__()
            self.names = names
            self.points = points
            self.labels = labels
            self.epochs = epochs
            self.palette = palette  # run -> colour
            self.by = by  # past 20 runs: (parameter coloured by, its lowest, highest value)

    def __init__(self, shared: SharedMonkey, juids: list[str], **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.shared = shared
        self.juids = juids
        self.chosen: set[str] = set()
        self.names: list[str] = []
        self.style = Style()  # x axis, EMA weight, log y: the keys change it
        self.points: dict[tuple[str, str], Series] = {}
        self.epochs: dict[str, Series] = {}
        self.shown: dict[tuple[str, str], tuple[int, float]] | None = None  # None: not drawn yet
        self._shown_style: tuple[object, ...] | None = None
        self.drawn: dict[str, dict[str, tuple[list[float], list[float]]]] = {}
        self.ticks: dict[str, list[float]] = {}
        self.labels: dict[str, str] = {}
        self.palette: dict[str, str] = {}
        self.by: tuple[str, float, float] | None = None

    def compose(self) -> ComposeResult:
        with Vertical(id="series-side"):
            yield Static(
                "series" + (f" of {len(self.juids)} runs" if len(self.juids) > 1 else ""),
                classes="pane-title",
            )
            yield SelectionList[str](id="series")
            yield Static("", id="legend")
        with Vertical(id="chart-side"):
            yield Static(self.settings(), id="chart-settings")
            yield Static("", id="chart-hint")
            yield VerticalScroll(PlotextPlot(classes="panel"), id="charts")

    def on_mount(self) -> None:
        charts = self.query_one("#charts")
        self.watch(charts, "scroll_y", self._show_hint, init=False)
        # the panels' layout settles after the refresh that drew them: named again once it has
        self.watch(charts, "virtual_size", self._show_hint, init=False)
        self._read()

    def settings(self) -> str:
        """The x axis, smoothing and y scale in use, and the keys that change them."""
        s = self.style
        smooth = f"EMA {s.smooth:g}" if s.smooth else "off"
        return (
            f"x: {X_LABELS[s.x]} (x)  ·  smoothing: {smooth} ([ ])  ·  "
            f"y: {'log' if s.log_y else 'linear'} (y)"
        )

    # -- keys ---------------------------------------------------------------------------

    def action_smooth(self, by: int) -> None:
        at = SMOOTHING.index(self.style.smooth) if self.style.smooth in SMOOTHING else 0
        self.style.smooth = SMOOTHING[min(len(SMOOTHING) - 1, max(0, at + by))]
        self._restyle()

    def action_log_y(self) -> None:
        self.style.log_y = not self.style.log_y
        self._restyle()

    def action_next_x(self) -> None:
        self.style.x = X_AXES[(X_AXES.index(self.style.x) + 1) % len(X_AXES)]
        if self.style.x == "epoch":
            self._read()  # the runs' epoch series, read at once
        self._restyle()

    def _restyle(self) -> None:
        self.query_one("#chart-settings", Static).update(self.settings())
        self._draw()

    # -- reading ------------------------------------------------------------------------

    @work(thread=True, exclusive=True, group="metrics")
    def _read(self) -> None:
        """Read the names, then the chosen series, every POLL seconds until cancelled."""
        worker = get_current_worker()
        monkey = self.shared.fresh()
        try:
            params = {juid: _params(monkey, juid) for juid in self.juids}
            labels = run_labels(params)
            palette, by = _colours(self.juids, params)
            while not worker.is_cancelled:
                names: set[str] = set()
                points: dict[tuple[str, str], Series] = {}
                epochs: dict[str, Series] = {}
                chosen = set(self.chosen)
                for juid in self.juids:
                    try:
                        mine = monkey.metric_names(juid)
                    except MonkeyError:
                        continue
                    names.update(mine)
                    for name in chosen & set(mine):
                        points[(juid, name)] = monkey.metrics(juid, name).get(name, [])
                    if self.style.x == "epoch" and "epoch" in mine:
                        epochs[juid] = monkey.metrics(juid, "epoch").get("epoch", [])
                if not worker.is_cancelled:
                    self.post_message(
                        self.Loaded(sorted(names), points, labels, epochs, palette, by)
                    )
                time.sleep(POLL if chosen or names else POLL / 4)
        finally:
            self.shared.close(monkey)

    @on(Loaded)
    def _on_loaded(self, message: Loaded) -> None:
        if message.labels != self.labels or message.palette != self.palette:
            self.labels, self.palette, self.by = message.labels, message.palette, message.by
            self._show_legend()
        if message.names != self.names:
            self.names = message.names
            if not self.chosen and message.names:
                user = [n for n in message.names if not n.startswith("sys/") and n != "epoch"]
                self.chosen = {(user or message.names)[0]}
                self._read()  # read the first series at once rather than after POLL
            box = self.query_one("#series", SelectionList)
            at = box.highlighted
            was = box.get_option_at_index(at).value if at is not None else None
            box.clear_options()
            box.add_options([(n, n, n in self.chosen) for n in message.names])
            box.highlighted = message.names.index(was) if was in message.names else 0
        self.points = message.points
        self.epochs = message.epochs
        self._draw()

    @on(SelectionList.SelectedChanged, "#series")
    def _on_choice(self, event: SelectionList.SelectedChanged) -> None:
        chosen = set(event.selection_list.selected)
        if chosen != self.chosen:
            self.chosen = chosen
            self._read()

    # -- drawing ------------------------------------------------------------------------

    def _show_legend(self) -> None:
        """Each run's colour and label, beside the panels rather than over the data."""
        legend = self.query_one("#legend", Static)
        if len(self.juids) < 2:
            legend.display = False
            return
        head = ["[b]runs[/b]"]
        if self.by:  # too many runs for distinct colours: a colour bar of the parameter
            name, lo, hi = self.by
            bar = "".join(f"[{value_colour(i / 7)}]█[/]" for i in range(8))
            head.append(f"colour: {escape(name)} {lo:.3g} {bar} {hi:.3g}")
        legend.update(
            "\n".join(
                head
                + [f"[{self.palette[j]}]━━[/] {escape(self.labels.get(j, j))}" for j in self.juids]
            )
        )

    def _draw(self) -> None:
        points = {k: v for k, v in self.points.items() if k[1] in self.chosen}
        stamp = {k: (len(v), v[-1][2] if v else 0.0) for k, v in points.items()}
        style = self.style
        now = (
            style.x,
            style.smooth,
            style.log_y,
            tuple(len(s) for s in self.epochs.values()),
        )  # epochs: read after a switch
        if stamp == self.shown and now == self._shown_style:
            return
        self.shown, self._shown_style = stamp, now
        style.epochs = self.epochs
        metrics = sorted({name for _, name in points})
        charts = self._panels(len(metrics))
        self.drawn, self.ticks = {}, {}
        for chart, metric in zip(charts, metrics):
            plt = chart.plt
            plt.clear_data()
            plt.clear_figure()
            lines = {j: points[(j, metric)] for j in self.juids if (j, metric) in points}
            data = {j: xy for j, xy in plot_points(lines, style).items() if xy[0]}
            self.drawn[metric] = {j: _thin(xs, ys) for j, (xs, _, ys) in data.items()}
            self._panel(plt, metric, data)
            chart.refresh()
        if not points:
            plt = charts[0].plt
            plt.clear_data()
            plt.clear_figure()
            plt.title(
                "no metrics yet: log them with monkey.log(name, value, step=...)"
                if not self.names
                else "choose series with space"
            )
            charts[0].refresh()
        self.call_after_refresh(self._show_hint)

    def _panels(self, n: int) -> list[PlotextPlot]:
        """N panels (at least one), each of the height the pane shares out (PANEL_ROWS at
        least)."""
        box = self.query_one("#charts", VerticalScroll)
        charts = list(box.query(PlotextPlot))
        if len(charts) < max(1, n):
            more = [PlotextPlot(classes="panel") for _ in range(max(1, n) - len(charts))]
            box.mount_all(more)
            charts += more
        for extra in charts[max(1, n) :]:
            extra.remove()
        charts = charts[: max(1, n)]
        self._size_panels(charts)
        return charts

    def _size_panels(self, charts: list[PlotextPlot] | None = None) -> None:
        box = self.query_one("#charts", VerticalScroll)
        charts = list(box.query(PlotextPlot)) if charts is None else charts
        height = max(PANEL_ROWS, box.size.height // max(1, len(charts)))
        for chart in charts:
            chart.styles.height = height

    def on_resize(self) -> None:
        self._size_panels()
        self.call_after_refresh(self._show_hint)

    def _show_hint(self) -> None:
        """Name the panels that do not fit in view (those above, those below)."""
        if not self.is_attached or not self.query("#chart-hint"):
            return  # the pane went (its job screen closed) before this turn came
        box = self.query_one("#charts", VerticalScroll)
        metrics = list(self.drawn)
        top, bottom = box.scroll_y, box.scroll_y + box.size.height
        charts = list(box.query(PlotextPlot))[: len(metrics)]
        above = [m for m, c in zip(metrics, charts) if c.virtual_region.y < top]
        below = [m for m, c in zip(metrics, charts) if c.virtual_region.bottom > bottom]
        parts = []
        if above:
            parts.append(f"↑ {len(above)} above: {', '.join(above)}")
        if below:
            parts.append(
                f"↓ {len(below)} more panel{'s' if len(below) > 1 else ''} below: "
                f"{', '.join(below)}"
            )
        hint = self.query_one("#chart-hint", Static)
        hint.display = bool(parts)
        if parts:
            hint.update(escape("  ·  ".join(parts) + " (scroll)"))

    def _panel(
        self, plt: Any, metric: str, data: dict[str, tuple[list[float], list[float], list[float]]]
    ) -> None:
        """One metric's panel: its own y axis, nice ticks (powers of ten on a log scale);
        when smoothed, the raw lines faint under the smoothed ones (as W&B draws them)."""
        style = self.style
        fy = math.log10 if style.log_y else float
        if style.smooth:
            for juid, (xs, raw, _) in data.items():
                xs, raw = _thin(xs, raw)
                plt.plot(xs, [fy(v) for v in raw], color=_faint(rgb(self.palette[juid])))
        for juid, (xs, ys) in self.drawn[metric].items():
            plt.plot(xs, [fy(v) for v in ys], color=rgb(self.palette[juid]))
        xs_all = [v for xs, _, _ in data.values() for v in xs]
        ys_all = [v for _, raw, _ in data.values() for v in raw]
        title = metric
        if ys_all:
            yticks, ylabels = axis(min(ys_all), max(ys_all), False, style.log_y)
            self.ticks[metric] = yticks
            plt.yticks([fy(t) for t in yticks], ylabels)
            xticks, xlabels = axis(min(xs_all), max(xs_all), style.x != "time", False)
            plt.xticks(xticks, xlabels)
        elif style.x == "epoch":
            title += ": x by epoch needs runs that log 'epoch' (press x)"
        elif style.log_y:
            title += ": no values above 0 for a log scale (press y)"
        plt.title(title)
        plt.xlabel(X_LABELS[style.x])


def _params(monkey: Any, juid: str) -> dict[str, Any]:
    """Job JUID's parameters ({} when it is gone), read from this machine's store or, through
    a main node, by its API."""
    if hasattr(monkey, "store"):
        job = monkey.store.get_job(juid)
        return job.params if job else {}
    try:
        return monkey.get_job(juid).params
    except MonkeyError:
        return {}


def _colours(
    juids: list[str], params: dict[str, dict[str, Any]]
) -> tuple[dict[str, str], tuple[str, float, float] | None]:
    """Run -> colour as the PNG and HTML charts: 20 distinct colours, past 20 runs by the
    value of the numeric parameter that differs most (and that parameter's range)."""
    by = colour_param(params) if len(juids) > 20 else None
    values = {j: float(p[by]) for j, p in params.items() if by and by in p}
    palette = run_colours(juids, Style(by=values, by_name=by or ""))
    return palette, (by, min(values.values()), max(values.values())) if by and values else None


def _faint(colour: tuple[int, int, int]) -> tuple[int, int, int]:
    """COLOUR halfway to grey: the raw line under a smoothed one."""
    return tuple(round((c + 128) / 2) for c in colour)  # type: ignore[return-value]


def _thin(xs: list[float], ys: list[float]) -> tuple[list[float], list[float]]:
    """At most MAX_POINTS of the points, evenly spaced (smoothing ran over all of them)."""
    every = max(1, math.ceil(len(xs) / MAX_POINTS))
    return xs[::every], ys[::every]
