"""`monkey search` over 2,000 ended jobs with 200 lines of output each (400,000 lines).

The first search indexes everything; later ones read only what is new. Printed against
`python -c pass` and `monkey list jobs` run by the same interpreter in the same run.
"""

from __future__ import annotations

import time

from common import MONKEY, PY, copy_jobs, fresh_home, median_wall, run_quiet

N = 2_000
LINES = 200


def main() -> None:
    home = fresh_home()
    from monkey.api import Monkey

    m = Monkey(home)
    job = m.run(["true"], start_core=False)
    changes = []
    for i in range(N):
        changes.append(
            {
                "juid": f"25-01-01-{i + 1:04d}",
                "attempts": 1,
                "state": "failed" if i % 100 == 0 else "succeeded",
            }
        )
        run = m.home.run_dir(changes[-1]["juid"], 1)
        run.mkdir(parents=True)
        lines = [f"epoch {k} step {k * 10} loss {1 / (k + 1):.4f} lr 0.001" for k in range(LINES)]
        if i % 100 == 0:
            lines.append("RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB")
        (run / "stdout.log").write_text("\n".join(lines) + "\n")
    copy_jobs(m, job.juid, changes)
    m.store.close()
    search = [*MONKEY, "search", "CUDA out of memory"]
    t = time.perf_counter()
    run_quiet(search)
    first = time.perf_counter() - t
    base = median_wall(lambda: run_quiet([PY, "-c", "pass"]), 11)
    listing = median_wall(lambda: run_quiet([*MONKEY, "list", "jobs"]), 11)
    again = median_wall(lambda: run_quiet(search), 11)
    print(f"python -c pass:              {base * 1000:7.1f} ms")
    print(f"monkey list jobs:            {listing * 1000:7.1f} ms  ({listing / base:.1f}x)")
    print(
        f"first search (indexes {N * LINES:,} lines): {first * 1000:7.1f} ms  ({first / base:.1f}x)"
    )
    print(f"later searches:              {again * 1000:7.1f} ms  ({again / base:.1f}x)")


if __name__ == "__main__":
    main()
