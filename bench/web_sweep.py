"""A sweep's page in Monkey Web (issue 43 item 4): what its data costs the server for a
sweep of 100 runs x 100 points, and how much of it is the curves' runs and the report's
plots (metric by parameter, best so far) the page gained.

Prints, next to its baseline measured in the same run: `views.sweep_page` (everything the
page shows), against the same without the two new parts (the part before them: the table,
parallel coordinates and importance), medians of 5. Usage: python bench/web_sweep.py"""

from __future__ import annotations

import math
import random

from common import fresh_home, make_sweep, median_wall

from monkey.api import Monkey
from monkey.server.web import curves, views

RUNS = 100


def main() -> None:
    m = Monkey(fresh_home())
    rng = random.Random(1)
    lrs = [10 ** rng.uniform(-4, 0) for _ in range(RUNS)]
    sid = make_sweep(
        m,
        RUNS,
        lambda i: {"lr": lrs[i], "layers": rng.choice((2, 4, 8)), "seed": rng.randrange(10_000)},
        lambda i, s: s / 100 - abs(math.log10(lrs[i]) + 2) / 4,
    )
    admin = {"name": "bench", "admin": True}
    page = views.sweep_page(m, sid, admin, None, False)
    whole = median_wall(lambda: views.sweep_page(m, sid, admin, None, False), 5)
    status = m.sweep_status(sid)
    added = median_wall(
        lambda: (
            curves.curve_runs(status["jobs"]),
            views._report_plots(m, status, ["layers", "lr", "seed"]),
        ),
        5,
    )
    svg = sum(map(len, page["report"]["scatters"])) + len(page["report"]["progress"])
    print(
        f"sweep page's data, {RUNS} runs x 100 points: {whole * 1000:.0f} ms, of which "
        f"{added * 1000:.0f} ms the curves' runs and the report's plots (baseline, the page "
        f"before them: {(whole - added) * 1000:.0f} ms); the plots' SVG {svg / 1000:.0f} KB, "
        f"curves of the first {len(page['curves']['runs'])} runs"
    )


if __name__ == "__main__":
    main()
