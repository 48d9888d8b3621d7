"""`a` on a sweep's job: the sweep's analysis full-screen. Runs ranked on the sweep's metric
(the best highlighted), parameter importance with its method named, the metric against
each parameter, and the best value so far over time.

The numbers are `Monkey.sweep_analysis`'s, as `sweep status` and `monkey report` show them
(monkey.tracking.sweep_analysis); axes and ticks come from the same chart model. They are
read and computed in a thread worker, never on the event loop."""

from __future__ import annotations

from rich.markup import escape
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult, RenderResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static
from textual_plotext import PlotextPlot

from monkey.api import MonkeyError
from monkey.tracking.charts import rgb, run_labels
from monkey.tracking.sweep_analysis import (
    BEST,
    best_last,
    metric_colours,
    minutes,
    parallel_axes,
    scale,
    too_few,
)
from monkey.tui.format import STATE_STYLES
from monkey.tui.job_screen import JobScreen
from monkey.tui.shared import SharedMonkey

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

POLL = 5.0  # seconds between re-reads while the sweep runs
ENDED = ("finished", "cancelled", "interrupted")  # sweep states no run follows
DOT = "#1f77b4"  # the other runs' dots (the HTML report's scatter colour)


def ranked(status: dict[str, Any], analysis: dict[str, Any]) -> list[dict[str, Any]]:
    """Every run of the sweep, best first on its metric; runs without a value last.
    Each: {"job", "state", "value" (or None), "label" (the parameters that differ)}."""
    values = {r["job"]: r["value"] for r in analysis["runs"]}
    labels = run_labels({j["job"]: j["params"] for j in status["jobs"]})
    sign = -1 if (analysis["metric"] or {}).get("goal") == "max" else 1
    rows = [
        {
            "job": j["job"],
            "state": j["state"],
            "value": values.get(j["job"]),
            "label": labels[j["job"]],
        }
        for j in status["jobs"]
    ]
    return sorted(rows, key=lambda r: (r["value"] is None, sign * (r["value"] or 0.0)))


class BuiltPlot(PlotextPlot):
    """A plotext chart built in a thread worker: plotext takes ~60 ms (a loaded machine:
    300) to draw 200 runs' lines, the event loop only shows the finished text. Draw on
    ``plt`` before mounting it, never after."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.built: tuple[tuple[int, int], RenderResult] | None = None  # (size, text) shown

    @property
    def ready(self) -> bool:
        """Built for the widget's current size."""
        return self.built is not None and self.built[0] == tuple(self.size)

    def render(self) -> RenderResult:
        if not self.ready and self.size.area:
            self._build()
        return self.built[1] if self.built else Text("drawing…", style="dim")

    @work(thread=True, exclusive=True, group="plot")
    def _build(self) -> None:
        size = tuple(self.size)
        text = PlotextPlot.render(self)  # sizes, themes and builds the figure
        self.app.call_from_thread(self._show, size, text)

    def _show(self, size: tuple[int, int], text: RenderResult) -> None:
        self.built = (size, text)
        self.refresh()


class SweepScreen(Screen[None]):
    """A sweep's analysis; Esc goes back, Enter on a run opens it."""

    BINDINGS = [Binding("escape,backspace", "back", "Back")]

    class Loaded(Message):
        """`sweep_status` and `sweep_analysis` of the sweep, or why they could not be read."""

        def __init__(
            self,
            status: dict[str, Any] | None,
            analysis: dict[str, Any] | None,
            error: str | None = None,
        ) -> None:
            super().__init__()
            self.status = status
            self.analysis = analysis
            self.error = error

    def __init__(self, shared: SharedMonkey, sweep: str) -> None:
        super().__init__()
        self.shared = shared
        self.sweep = sweep
        self.rows: list[dict[str, Any]] = []  # the ranked table, as shown
        self.best: str | None = None
        self.importance: dict[str, float] = {}
        self.method = ""
        # parameter -> (x positions, y positions, index of the best run or -1), as plotted
        self.scatters: dict[str, tuple[list[float], list[float], int]] = {}
        self.curve: tuple[list[float], list[float]] = ([], [])
        self.parallel: dict[str, list[float]] = {}  # run -> its position on each axis
        self._shown: object = None

    def compose(self) -> ComposeResult:
        yield Static(f"sweep {escape(self.sweep)}: reading…", id="sweep-title")
        with VerticalScroll(id="sweep-body"):
            with Horizontal(id="sweep-top"):
                yield DataTable(id="sweep-runs", cursor_type="row", zebra_stripes=True)
                yield Static("", id="sweep-importance")
            yield Grid(id="sweep-plots")
        yield Footer()

    def on_mount(self) -> None:
        self._timer = self.set_interval(POLL, self._load)
        self._load()

    @work(thread=True, exclusive=True, group="sweep")
    def _load(self) -> None:
        try:
            status = self.shared("sweep_status", self.sweep)
            self.post_message(
                self.Loaded(status, self.shared("sweep_analysis", status["id"], status))
            )
        except MonkeyError as exc:
            self.post_message(self.Loaded(None, None, str(exc)))

    @on(Loaded)
    async def _on_loaded(self, message: Loaded) -> None:
        title = self.query_one("#sweep-title", Static)
        if message.status is None or message.analysis is None:
            title.update(f"sweep {escape(self.sweep)}: {escape(message.error or '')}")
            return
        status, analysis = message.status, message.analysis
        if status["state"] in ENDED and status["done"] == status["total"]:
            self._timer.stop()  # nothing will change: no more reads
        shown = (
            [(j["job"], j["state"]) for j in status["jobs"]],
            [(r["job"], r["value"]) for r in analysis["runs"]],
        )
        if shown == self._shown:
            return  # nothing changed: no redraw
        self._shown = shown
        metric = analysis["metric"]
        self.best, self.method = analysis["best"], analysis["method"]
        self.importance = analysis["importance"]
        head = (
            f"sweep [b]{escape(status['id'])}[/b] · {escape(status['name'])} · "
            f"{status['state']} · {status['done']}/{status['total']} ended"
        )
        if metric:
            head += f" · {escape(metric['name'])} ({metric['goal']})"
            if self.best:
                value = next(r["value"] for r in analysis["runs"] if r["job"] == self.best)
                head += f" · best [b {BEST}]{value:.4g}[/] by [b {BEST}]{self.best}[/]"
        else:
            head += " · no metric: give the sweep one (--metric NAME) to rank its runs"
        title.update(head)
        self._table(status, analysis)
        self._show_importance(analysis)
        await self._plots(analysis)

    def _parallel(self, runs: list[dict[str, Any]], metric: str) -> BuiltPlot:
        """Parameters -> metric: a line per run coloured by its value, the best in red; the
        metric's ticks on the right."""
        axes, scaled = parallel_axes(runs, metric)
        self.parallel = {r["job"]: [pos[i] for pos, _ in scaled] for i, r in enumerate(runs)}
        chart = BuiltPlot(id="sweep-parallel")
        plt = chart.plt
        colours = metric_colours(runs)
        xs: list[float] = list(range(len(axes)))
        for i in best_last(runs, self.best):
            best = runs[i]["job"] == self.best
            plt.plot(
                xs,
                self.parallel[runs[i]["job"]],
                color=rgb(BEST if best else colours[i]),
                marker="dot" if not best else None,
                yside="right",
            )
        plt.xticks(xs, axes)
        ticks = scaled[-1][1]
        # plotext's annotations say yside is a number; it takes "left"/"right" (its docs)
        plt.yticks([p for p, _ in ticks], [t for _, t in ticks], yside="right")  # type: ignore[arg-type]
        plt.yticks([], [], yside="left")  # type: ignore[arg-type]
        plt.ylim(-0.05, 1.05, yside="right")  # type: ignore[arg-type]
        plt.title(f"parameters and {metric}")
        return chart

    @on(DataTable.RowSelected, "#sweep-runs")
    def _on_run(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value:
            self.app.push_screen(JobScreen(self.shared, event.row_key.value, self.app.clock))  # type: ignore[attr-defined]

    def action_back(self) -> None:
        self.dismiss(None)

    def _table(self, status: dict[str, Any], analysis: dict[str, Any]) -> None:
        table = self.query_one("#sweep-runs", DataTable)
        name = (analysis["metric"] or {}).get("name", "metric")
        self.rows = ranked(status, analysis)
        table.clear(columns=True)
        table.add_columns("#", "JOB", "STATE", name, "PARAMS")
        for i, row in enumerate(self.rows, start=1):
            best = row["job"] == self.best
            mark = f"bold {BEST}" if best else ""
            value = "-" if row["value"] is None else f"{row['value']:.4g}"
            table.add_row(
                Text(f"{i}" + (" ★" if best else ""), style=mark),
                Text(row["job"], style=mark),
                Text(row["state"], style=STATE_STYLES.get(row["state"], "")),
                Text(value, style=mark),
                Text(row["label"], style=mark),
                key=row["job"],
            )

    def _show_importance(self, analysis: dict[str, Any]) -> None:
        box = self.query_one("#sweep-importance", Static)
        if len(analysis["runs"]) < 2:
            box.update("parameter importance: needs two runs with a value")
            return
        width = max(map(len, self.importance), default=0)
        lines = [f"[b]parameter importance[/b] (method: {escape(self.method)})"]
        for name, share in self.importance.items():
            lines.append(
                f"{escape(name):<{width}}  {share:4.2f} [{DOT}]{'█' * round(share * 20)}[/]"
            )
        if note := too_few(analysis):
            lines.append(escape(note))
        box.update("\n".join(lines))

    async def _plots(self, analysis: dict[str, Any]) -> None:
        """A scatter of the metric per parameter (most important first), and best so far:
        the charts of the previous read are gone before the new ones are mounted (their ids
        are the same; messages wait meanwhile, so two reads never interleave)."""
        grid = self.query_one("#sweep-plots", Grid)
        await grid.remove_children()
        runs, metric = analysis["runs"], (analysis["metric"] or {}).get("name", "")
        self.scatters = {}
        plots = [self._parallel(runs, metric)] if runs else []
        for param in [*self.importance, *analysis.get("unranked", {})]:
            mine = [r for r in runs if param in r["params"]]
            if not mine:
                continue
            xs, xticks = scale([r["params"][param] for r in mine])
            ys, yticks = scale([r["value"] for r in mine])
            best = next((i for i, r in enumerate(mine) if r["job"] == self.best), -1)
            self.scatters[param] = (xs, ys, best)
            chart = BuiltPlot(classes="sweep-plot")
            plt = chart.plt
            others = [i for i in range(len(mine)) if i != best]
            plt.scatter([xs[i] for i in others], [ys[i] for i in others], color=rgb(DOT))
            if best >= 0:
                plt.scatter([xs[best]], [ys[best]], color=rgb(BEST), marker="●")
            _ticks(plt, xticks, yticks)
            plt.title(f"{metric} by {param}")
            plots.append(chart)
        self.curve = minutes(analysis["best_so_far"])
        if self.curve[0]:
            chart = BuiltPlot(classes="sweep-plot")
            plt = chart.plt
            xs, ys = self.curve
            step_x, step_y = xs[:1], ys[:1]  # a step line: flat until the next best
            for i in range(1, len(xs)):
                step_x += [xs[i], xs[i]]
                step_y += [ys[i - 1], ys[i]]
            xpos, xticks = scale(step_x)
            ypos, yticks = scale(step_y)
            plt.plot(xpos, ypos, color=rgb(BEST))
            _ticks(plt, xticks, yticks)
            plt.title(f"best {metric} so far")
            plt.xlabel("minutes")
            plots.append(chart)
        await grid.mount_all(plots)


def _ticks(plt: Any, xticks: list[tuple[float, str]], yticks: list[tuple[float, str]]) -> None:
    """Place the chart model's ticks (positions in [0, 1], labels) on a plotext chart."""
    plt.xticks([p for p, _ in xticks], [t for _, t in xticks])
    plt.yticks([p for p, _ in yticks], [t for _, t in yticks])
    plt.xlim(-0.05, 1.05)
    plt.ylim(-0.05, 1.05)
