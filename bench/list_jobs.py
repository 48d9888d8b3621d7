"""`monkey list jobs` with 100,000 jobs in the store, newest 50 as a table.

Target: median wall time at most 4x `python -c pass` run by the same interpreter (issue 13; it was 8x).
"""

from __future__ import annotations

import sys
import time

from common import copy_jobs, fresh_home, median_wall, run_quiet

N = 100_000


def main() -> None:
    home = fresh_home()
    from monkey.api import Monkey

    m = Monkey(home)
    job = m.run(["true"], start_core=False)
    t = time.perf_counter()
    copy_jobs(m, job.juid, [{"juid": f"25-01-{1 + i // 9000:02d}-{i % 9000 + 1:04d}",
                             "state": ("succeeded", "failed", "running", "queued")[i % 4]}
                            for i in range(N)])  # fmt: skip
    print(f"inserted {N} jobs in {time.perf_counter() - t:.1f}s")
    base = median_wall(lambda: run_quiet([sys.executable, "-c", "pass"]), 21)
    listing = median_wall(lambda: run_quiet([sys.executable, "-m", "monkey", "list", "jobs"]), 21)
    filtered = median_wall(
        lambda: run_quiet([sys.executable, "-m", "monkey", "list", "jobs", "--failed"]), 21
    )
    print(f"python -c pass:            {base * 1000:7.1f} ms")
    print(f"monkey list jobs:          {listing * 1000:7.1f} ms  ({listing / base:.1f}x, target <= 4x)")
    print(f"monkey list jobs --failed: {filtered * 1000:7.1f} ms  ({filtered / base:.1f}x, target <= 4x)")


if __name__ == "__main__":
    main()
