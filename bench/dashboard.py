"""The dashboard under load: 10,000 jobs, and a job printing 5,000 lines per second.

Prints, each next to a baseline measured in the same run:
- first full paint with 10,000 jobs (target < 1 s), against a bare Textual DataTable
  given the same 10,000 rows directly (no monkey at all);
- CPU used while idle over 30 s with 2,000 jobs (target < 3% of a core), against an
  empty Textual app idle as long;
- key -> modal painted: the modal's first frame written out (new-job form, cancel and pause
  confirmations, keys help; target < 100 ms), against a key whose action does nothing;
- main-thread time of one refresh while jobs change (target < 50 ms), against redrawing
  the whole table each second (what diffing by `updated_at` avoids);
- key-press latency while the log pane follows a job printing 5,000 lines/s (target
  < 100 ms), against the same with the job printing nothing.

Usage: python bench/dashboard.py [--jobs N] [--seconds S] [--only modal]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import sys
import threading
import time

from common import fresh_home, stop_everything

from monkey.api import Monkey
from monkey.models import Resources, State
from monkey.tui.log_pane import MAX_LINES


def make_jobs(m: Monkey, n: int) -> None:
    states = [State.SUCCEEDED, State.FAILED, State.CANCELLED, State.QUEUED]
    for i in range(n):
        m.store.create_job(
            name=f"train-{i % 97}",
            argv=["python", "train.py", "--lr", str(i / n)],
            provider="local",
            resources=Resources(),
            env={},
            snapshot=None,
            workdir="/w",
            datasets=[],
            git={},
            python="3.11",
            sweep=f"grid-{i // 50}" if i % 3 else None,
            state=states[i % len(states)],
        )


async def first_paint_ours(home, n: int) -> float:
    from monkey.tui.app import DashApp

    start = time.perf_counter()
    app = DashApp(home)
    async with app.run_test(size=(160, 50)) as pilot:
        while not app.table.row_count:
            await pilot.pause(0.005)
        await pilot.pause()
        screen = time.perf_counter() - start
        while app.table.row_count < n:
            await pilot.pause(0.005)
        await pilot.pause()
        took = time.perf_counter() - start
        app.exit()
    return screen, took


async def first_paint_bare(rows: list[list[str]]) -> float:
    from textual.app import App
    from textual.widgets import DataTable

    class Bare(App):
        def compose(self):
            yield DataTable()

        def on_mount(self) -> None:
            table = self.query_one(DataTable)
            table.add_columns(*[str(i) for i in range(len(rows[0]))])
            table.add_rows(rows)

    start = time.perf_counter()
    app = Bare()
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot.pause()
        took = time.perf_counter() - start
        app.exit()
    return took


async def idle_cpu(home, n: int, seconds: float) -> tuple[float, float]:
    """Share of one core the dashboard with ``n`` jobs uses idle for ``seconds``, and an
    empty Textual app's."""
    from textual.app import App
    from textual.widgets import Static

    from monkey.tui.app import OVERLAP, DashApp

    class Empty(App):
        def compose(self):
            yield Static("idle")

    out = []
    for app in (DashApp(home), Empty()):
        async with app.run_test(size=(160, 50)) as pilot:
            if isinstance(app, DashApp):
                while app.table.row_count < n:
                    await pilot.pause(0.01)
            await pilot.pause(OVERLAP + 2.0)  # settled: no job changed lately
            cpu, wall = time.process_time(), time.perf_counter()
            await asyncio.sleep(seconds)
            out.append((time.process_time() - cpu) / (time.perf_counter() - wall))
            app.exit()
    return out[0], out[1]


async def modal_latency(
    home, n: int, rounds: int
) -> tuple[dict[str, list[float]], dict[str, float], list[float]]:
    """Key press -> the modal's first frame written to the terminal, for each modal key
    (`n` new job, `c` cancel and `p` pause confirmations, `?` keys help) while the dashboard
    polls ``n`` jobs: the warm times by key, the first (cold) opening of each, and key -> a
    no-op action's end as the baseline.

    A frame is what the app hands its driver (`App._display`, the one place Textual writes a
    screen's update out), so this counts layout, render and compositing, and not the pilot's
    own waits for the app to go idle (which `pilot.press` adds: it doubled the figure)."""
    from textual.binding import Binding
    from textual.screen import ModalScreen

    from monkey.tui.app import DashApp

    done: list[float] = []
    frames: list[tuple[float, object]] = []

    class Timed(DashApp):
        BINDINGS = [*DashApp.BINDINGS, Binding("ctrl+t", "ping", "ping", show=False)]

        def action_ping(self) -> None:
            done.append(time.perf_counter())

        def _display(self, screen, update) -> None:
            dialog = screen.query("#dialog")
            if dialog and dialog.first().region:  # the modal's content, not an empty frame
                frames.append((time.perf_counter(), screen))
            super()._display(screen, update)

    def painted(since: float) -> float | None:
        screen = app.screen
        if isinstance(screen, ModalScreen):
            return next((t for t, s in frames if t >= since and s is screen), None)
        return None

    warm: dict[str, list[float]] = {key: [] for key in MODAL_KEYS}
    cold: dict[str, float] = {}
    base = []
    gc.collect()  # the earlier sections' apps: their garbage is not this app's to collect
    app = Timed(home)
    async with app.run_test(size=(160, 50)) as pilot:
        while app.table.row_count < n:
            await pilot.pause(0.01)
        await pilot.pause(0.5)
        for i in range(rounds + len(MODAL_KEYS)):
            key = MODAL_KEYS[i % len(MODAL_KEYS)]
            frames.clear()
            start = time.perf_counter()
            await pilot.press(key)
            while (at := painted(start)) is None:
                await asyncio.sleep(0.001)
            if key in cold:
                warm[key].append(at - start)
            else:
                cold[key] = at - start
            await pilot.press("escape")
            await asyncio.sleep(0.05)
            start = time.perf_counter()
            await pilot.press("ctrl+t")
            base.append(done[-1] - start)
            await asyncio.sleep(0.05)
        app.exit()
    return warm, cold, base


MODAL_KEYS = ("n", "c", "p", "question_mark")


def churn(home, stop: threading.Event, per_second: int) -> None:
    """Pause and resume queued jobs, ``per_second`` changes a second, until ``stop``."""
    m = Monkey(home)
    queued = [j.juid for j in m.jobs(state="queued", limit=per_second)]
    paused = False
    while not stop.wait(1.0):
        old, new = (State.PAUSED, State.QUEUED) if paused else (State.QUEUED, State.PAUSED)
        for juid in queued:
            m.store.transition(juid, old, new, kind="user", detail="bench")
        paused = not paused
    m.store.close()


async def refresh_times(home, n: int, seconds: float, per_second: int) -> dict[str, list[float]]:
    from textual import on

    from monkey.tui.app import DashApp, DataLoaded

    times: list[float] = []

    class Timed(DashApp):
        @on(DataLoaded)
        def _timed(self, message: DataLoaded) -> None:
            start = time.perf_counter()
            self._on_data(message)
            times.append(time.perf_counter() - start)
            message.prevent_default()

    app = Timed(home)
    out: dict[str, list[float]] = {}
    async with app.run_test(size=(160, 50)) as pilot:
        while app.table.row_count < n:
            await pilot.pause(0.01)
        times.clear()
        await pilot.pause(3.0)
        out["idle"] = list(times)
        stop = threading.Event()
        worker = threading.Thread(target=churn, args=(home, stop, per_second))
        worker.start()
        times.clear()
        await pilot.pause(seconds)
        out["changing"] = list(times)
        stop.set()
        worker.join()
        rebuild = []
        for _ in range(3):  # what a naive dashboard does each second
            start = time.perf_counter()
            app.table._rebuild()
            rebuild.append(time.perf_counter() - start)
            await pilot.pause(0.05)
        out["rebuild"] = rebuild
        app.exit()
    return out


FLOOD = (
    "import sys, time\n"
    "rate, seconds = {rate}, {seconds}\n"
    "start = time.monotonic(); i = 0\n"
    "while i < rate * seconds:\n"
    "    due = int((time.monotonic() - start) * rate) + 1\n"
    "    while i < min(due, rate * seconds):\n"
    "        sys.stdout.write(f'step {{i}} loss {{1 / (i + 1):.6f}} some more text to be realistic\\n')\n"
    "        i += 1\n"
    "    sys.stdout.flush()\n"
    "    time.sleep(0.005)\n"
)


async def key_latency(
    home, juid: str, seconds: float, lines: int | None
) -> tuple[list[float], float, int]:
    """Key-press to action latencies while the log pane follows ``juid``; the catch-up time
    from the job's end to the pane showing its last line (when ``lines`` is given); and
    the lines the pane received."""
    from textual.binding import Binding

    from monkey.tui.app import DashApp
    from monkey.tui.log_pane import LogPane

    pressed: list[float] = []
    handled: list[float] = []

    class Timed(DashApp):
        BINDINGS = [*DashApp.BINDINGS, Binding("ctrl+t", "ping", "ping", show=False)]

        def action_ping(self) -> None:
            handled.append(time.perf_counter())

    m = Monkey(home)
    app = Timed(home, job=juid)
    catch_up = 0.0
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot.pause(0.3)
        await pilot.press("l")
        pane = app.screen.query_one(LogPane)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            pressed.append(time.perf_counter())
            await pilot.press("ctrl+t")
            await asyncio.sleep(0.05)
        if lines:
            m.job(juid).wait(60)
            done = time.perf_counter()
            while sum(1 for x in pane.view.lines[-5:] if x.startswith(f"step {lines - 1} ")) == 0:
                await pilot.pause(0.01)
            catch_up = time.perf_counter() - done
        received = pane.view.line_count
        app.exit()
    m.store.close()
    return [h - p for p, h in zip(pressed, handled)], catch_up, received


def ms(values: list[float]) -> str:
    if not values:
        return "n/a"
    values = sorted(values)
    p95 = values[min(len(values) - 1, int(len(values) * 0.95))]
    return f"median {statistics.median(values) * 1000:.1f} ms, p95 {p95 * 1000:.1f} ms, max {values[-1] * 1000:.1f} ms"


def report_modals(home) -> None:
    """Print key -> modal painted with 2,000 jobs in ``home``: every modal, then by key."""
    warm, cold, base = asyncio.run(modal_latency(home, 2_000, 40))
    every = [t for times in warm.values() for t in times]
    print(
        f"key -> modal painted, 2,000 jobs, every modal: {ms(every)} (target < 100 ms); "
        f"key -> no-op action: {ms(base)}; ratio of medians "
        f"{statistics.median(every) / max(1e-9, statistics.median(base)):.0f}x"
    )
    for key, times in warm.items():
        print(f"  {key}: {ms(times)}; first opening {cold[key] * 1000:.1f} ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--idle", type=float, default=30.0, help="seconds of idle CPU")
    parser.add_argument("--rate", type=int, default=5_000, help="lines per second")
    parser.add_argument("--only", choices=["modal"], help="measure only this figure")
    args = parser.parse_args()
    if args.only == "modal":
        home = fresh_home()
        make_jobs(Monkey(home), 2_000)
        report_modals(home)
        stop_everything(home)
        return 0

    home = fresh_home()
    m = Monkey(home)
    start = time.perf_counter()
    make_jobs(m, args.jobs)
    print(f"{args.jobs} jobs written in {time.perf_counter() - start:.1f} s")

    from monkey.tui.format import row_cells

    rows = [[str(v) for v in row_cells(j, time.time()).values()] for j in m.jobs()]
    bare = statistics.median(asyncio.run(first_paint_bare(rows)) for _ in range(3))
    paints = [asyncio.run(first_paint_ours(home, args.jobs)) for _ in range(3)]
    ours = statistics.median(p[1] for p in paints)
    print(
        f"first screen of jobs painted, {args.jobs} jobs (median of 3): "
        f"{statistics.median(p[0] for p in paints):.2f} s (target < 1 s)"
    )
    print(
        f"every job loaded, {args.jobs} jobs (median of 3): {ours:.2f} s; "
        f"bare DataTable with the same rows: {bare:.2f} s; ratio {ours / bare:.2f}x"
    )

    times = asyncio.run(refresh_times(home, args.jobs, args.seconds, per_second=20))
    print(f"refresh main-thread time, idle: {ms(times['idle'])}")
    print(
        f"refresh main-thread time, 20 jobs changing a second: {ms(times['changing'])} "
        f"(target < 50 ms)"
    )
    print(
        f"redrawing the whole table instead: {ms(times['rebuild'])}; ratio "
        f"{statistics.median(times['rebuild']) / max(1e-9, statistics.median(times['changing'])):.0f}x"
    )
    m.store.close()
    stop_everything(home)

    home = fresh_home()
    m = Monkey(home)
    make_jobs(m, 2_000)
    ours_cpu, empty_cpu = asyncio.run(idle_cpu(home, 2_000, args.idle))
    print(
        f"idle CPU over {args.idle:.0f} s, 2,000 jobs: {ours_cpu * 100:.1f}% of a core "
        f"(target < 3%); an empty Textual app: {empty_cpu * 100:.1f}%; "
        f"ratio {ours_cpu / max(1e-9, empty_cpu):.1f}x"
    )
    report_modals(home)
    m.store.close()
    stop_everything(home)

    home = fresh_home()
    m = Monkey(home)
    quiet = m.run(["sleep", "600"], workdir=str(home.parent)).juid
    while m.job(quiet).status != State.RUNNING:
        time.sleep(0.05)
    base, _, _ = asyncio.run(key_latency(home, quiet, args.seconds / 2, None))
    m.cancel(quiet)
    total = args.rate * (int(args.seconds) + 2)
    code = FLOOD.format(rate=args.rate, seconds=int(args.seconds) + 2)
    flood = m.run([sys.executable, "-c", code], workdir=str(home.parent)).juid
    lat, catch_up, received = asyncio.run(key_latency(home, flood, args.seconds, total))
    print(f"key latency, log pane following a silent job: {ms(base)}")
    print(
        f"key latency, log pane following {args.rate} lines/s: {ms(lat)} (target < 100 ms); "
        f"ratio of medians {statistics.median(lat) / max(1e-9, statistics.median(base)):.1f}x"
    )
    print(
        f"log pane holds {received} of {total} lines (it keeps the last {MAX_LINES - 1}), "
        f"the last one {catch_up * 1000:.0f} ms after the job ended"
    )
    m.store.close()
    stop_everything(home)
    return 0


if __name__ == "__main__":
    sys.exit(main())
