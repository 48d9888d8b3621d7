"""`monkey list jobs` (the command as pip installs it) with 100,000 jobs in the store, newest
50 as a table.

Target: median wall time at most 3x `python -c pass` (issue 26; 4x in issue 13), both run by a
clean virtualenv's interpreter (common.PY: a global one with many packages starts 3x slower
and flatters the ratio). It also prints the floor: a `python -c` importing just the modules
from outside monkey that the command imports (re for pip's console script, argparse, json,
sqlite3, pathlib...), which no change to monkey's own code could go below.
"""

from __future__ import annotations

import time

from common import MONKEY, PY, copy_jobs, floor_wall, fresh_home, median_wall, run_quiet

N = 100_000


def main() -> None:
    home = fresh_home()
    from monkey.api import Monkey

    m = Monkey(home)
    job = m.run(["true"], start_core=False)
    t = time.perf_counter()
    copy_jobs(
        m,
        job.juid,
        [
            {
                "juid": f"25-01-{1 + i // 9000:02d}-{i % 9000 + 1:04d}",
                "state": ("succeeded", "failed", "running", "queued")[i % 4],
            }
            for i in range(N)
        ],
    )
    print(f"inserted {N} jobs in {time.perf_counter() - t:.1f}s")
    base = median_wall(lambda: run_quiet([PY, "-c", "pass"]), 21)
    listing = median_wall(lambda: run_quiet([*MONKEY, "list", "jobs"]), 21)
    filtered = median_wall(lambda: run_quiet([*MONKEY, "list", "jobs", "--failed"]), 21)
    floor = floor_wall([*MONKEY, "list", "jobs"], 21)
    print(f"python -c pass:            {base * 1000:7.1f} ms")
    print(
        f"its imports from outside:  {floor * 1000:7.1f} ms  ({floor / base:.1f}x: the floor "
        "of any code of monkey's)"
    )
    print(
        f"monkey list jobs:          {listing * 1000:7.1f} ms  ({listing / base:.1f}x, target <= 3x)"
    )
    print(
        f"monkey list jobs --failed: {filtered * 1000:7.1f} ms  ({filtered / base:.1f}x, target <= 3x)"
    )


if __name__ == "__main__":
    main()
