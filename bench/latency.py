"""With the core running: `monkey run -- true` (a new CLI process) until the job's process
has started, as recorded by the agent. Target: median at most 4x `python -c pass` (issue 26;
under 150 ms in issue 11), both run by a clean virtualenv's interpreter (common.PY). It
also prints the floor: a `python -c` importing just the modules from outside monkey that the
CLI process imports, which no change to monkey's own code could go below.
"""

from __future__ import annotations

import statistics
import tempfile

from common import (
    MONKEY,
    PY,
    floor_wall,
    fresh_home,
    median_wall,
    run_quiet,
    run_to_start,
    stop_everything,
)

RUNS = 21


def main() -> None:
    home = fresh_home()
    from monkey.api import Monkey
    from monkey.config import Home
    from monkey.core import daemon

    project = tempfile.mkdtemp()
    m = Monkey(home)
    daemon.start(Home(home))
    try:
        m.run(["true"]).wait(timeout=30)  # warm: the agent is up
        latencies = run_to_start(m, project, RUNS)
        base = median_wall(lambda: run_quiet([PY, "-c", "pass"]), 11)
        floor = floor_wall([*MONKEY, "run", "--", "true"], 11, cwd=project)
        lat = statistics.median(latencies)
        print(f"python -c pass:                      {base * 1000:6.1f} ms")
        print(
            f"its CLI's imports from outside:     {floor * 1000:6.1f} ms ({floor / base:.1f}x: the "
            "floor of any code of monkey's)"
        )
        print(
            f"monkey run -- true -> process start: {lat * 1000:6.1f} ms median "
            f"(min {min(latencies) * 1000:.1f}, max {max(latencies) * 1000:.1f}) = "
            f"{lat / base:.1f}x, target <= 4x"
        )
    finally:
        stop_everything(home)


if __name__ == "__main__":
    main()
