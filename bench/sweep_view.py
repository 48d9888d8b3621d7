"""The dashboard's sweep analysis view on a sweep of 200 runs x 100 points.

Prints, each next to a baseline measured in the same run:
- the worker's read + analysis (`sweep_status` + `sweep_analysis`, off the event loop),
  against `Monkey.compare` of the same sweep (the ranked table `monkey compare` prints);
- the event loop's longest stall while the view opens and its charts are drawn (target
  < 100 ms; plotext builds them in threads), against the same probe on the idle dashboard;
- key `a` -> the view with every chart drawn.

Usage: python bench/sweep_view.py [--runs N]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import time
from collections.abc import Awaitable, Callable

from common import fresh_home, make_sweep, median_wall

from monkey.api import Monkey
from monkey.tui.app import DashApp
from monkey.tui.sweep_view import BuiltPlot, SweepScreen


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=200)
    runs = parser.parse_args().runs
    home = fresh_home()
    m = Monkey(home)
    rng = random.Random(1)
    lrs = [10 ** rng.uniform(-4, 0) for _ in range(runs)]
    sid = make_sweep(
        m,
        runs,
        lambda i: {"lr": lrs[i], "layers": rng.choice((2, 4, 8)), "seed": rng.randrange(10_000)},
        lambda i, s: s / 100 - abs(math.log10(lrs[i]) + 2) / 4,
    )
    base = median_wall(lambda: m.compare(sweep=sid), 5)
    work = median_wall(lambda: m.sweep_analysis(sid, m.sweep_status(sid)), 5)
    print(
        f"read + analysis of {runs} runs (worker thread): {work * 1000:.0f} ms; "
        f"{work / base:.1f}x `Monkey.compare` of the sweep = {base * 1000:.0f} ms"
    )

    app = DashApp(home)

    async def stalls(during: Callable[[], Awaitable[object]]) -> float:
        """The event loop's longest stall (ms late on a 5 ms sleep) while DURING runs."""
        lags: list[float] = []
        done = asyncio.Event()

        async def probe() -> None:
            while not done.is_set():
                t = time.perf_counter()
                await asyncio.sleep(0.005)
                lags.append(time.perf_counter() - t - 0.005)

        task = asyncio.create_task(probe())
        await during()
        done.set()
        await task
        return max(lags) * 1000

    async def drive() -> tuple[float, float, float]:
        async with app.run_test(size=(160, 48)) as pilot:
            while app.table.row_count < runs:
                await pilot.pause(0.05)
            await pilot.pause(2)
            idle = await stalls(lambda: asyncio.sleep(1))
            shown = 0.0

            async def open_view() -> None:
                nonlocal shown
                t = time.perf_counter()
                await pilot.press("a")
                while not (
                    isinstance(app.screen, SweepScreen)
                    and app.screen.scatters
                    and all(p.ready for p in app.screen.query(BuiltPlot))
                ):
                    await asyncio.sleep(0.005)
                shown = time.perf_counter() - t

            busy = await stalls(open_view)
            app.exit()
        return idle, busy, shown

    idle, busy, shown = asyncio.run(drive())
    print(
        f"event loop's longest stall while the view opens and draws: {busy:.0f} ms "
        f"(target < 100 ms); idle, the same probe: {idle:.0f} ms"
    )
    print(
        f"key a -> the view with every chart drawn: {shown * 1000:.0f} ms "
        f"(of which the worker's read + analysis ~{work * 1000:.0f} ms)"
    )


if __name__ == "__main__":
    main()
