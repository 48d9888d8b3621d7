"""The dashboard's sweep analysis view on a sweep of 200 runs x 100 points.

Prints, each next to a baseline measured in the same run:
- the worker's read + analysis (`sweep_status` + `sweep_analysis`, off the event loop),
  against `Monkey.compare` of the same sweep (the ranked table `monkey compare` prints);
- main-thread time of drawing the view from that result (table, importance, scatters,
  best so far; target < 100 ms), against the same app handling a key that does nothing;
- key `a` -> the view painted with its data.

Usage: python bench/sweep_view.py [--runs N]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import statistics
import time
from collections.abc import Callable

from common import fresh_home, make_sweep, median_wall

from monkey.api import Monkey
from monkey.tui.app import DashApp
from monkey.tui.sweep_view import SweepScreen


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=200)
    runs = parser.parse_args().runs
    home = fresh_home()
    m = Monkey(home)
    rng = random.Random(1)
    lrs = [10 ** rng.uniform(-4, 0) for _ in range(runs)]
    sid = make_sweep(m, runs, lambda i: {"lr": lrs[i], "layers": rng.choice((2, 4, 8)),
                                         "seed": rng.randrange(10_000)},
                     lambda i, s: s / 100 - abs(math.log10(lrs[i]) + 2) / 4)
    base = median_wall(lambda: m.compare(sweep=sid), 5)
    work = median_wall(lambda: m.sweep_analysis(sid, m.sweep_status(sid)), 5)
    print(f"read + analysis of {runs} runs (worker thread): {work * 1000:.0f} ms; "
          f"{work / base:.1f}x `Monkey.compare` of the sweep = {base * 1000:.0f} ms")

    drawn: list[float] = []  # the handler's drawing steps (the handler itself is bound early)

    def timing(step: Callable[..., None]) -> Callable[..., None]:
        def timed(self: SweepScreen, *args: object) -> None:
            t = time.perf_counter()
            step(self, *args)
            drawn.append(time.perf_counter() - t)

        return timed

    for name in ("_table", "_show_importance", "_plots"):
        setattr(SweepScreen, name, timing(getattr(SweepScreen, name)))
    app = DashApp(home)

    async def drive() -> tuple[float, float, float]:
        async with app.run_test(size=(160, 48)) as pilot:
            while app.table.row_count < runs:
                await pilot.pause(0.05)
            idle = []
            for _ in range(5):
                t = time.perf_counter()
                await pilot.press("f12")  # bound to nothing
                idle.append(time.perf_counter() - t)
            t = time.perf_counter()
            await pilot.press("a")
            while not (isinstance(app.screen, SweepScreen) and app.screen.scatters):
                await pilot.pause(0.01)
            await pilot.pause()
            shown = time.perf_counter() - t
            app.exit()
        return statistics.median(idle), shown, sum(drawn[:3])

    idle, shown, draw = asyncio.run(drive())
    print(f"main-thread time drawing the view: {draw * 1000:.0f} ms (target < 100 ms); "
          f"{draw / idle:.1f}x a key bound to nothing = {idle * 1000:.1f} ms")
    print(f"key a -> the view painted with its data: {shown * 1000:.0f} ms "
          f"(of which the worker's read + analysis ~{work * 1000:.0f} ms)")


if __name__ == "__main__":
    main()
