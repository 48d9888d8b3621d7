"""How soon a dependent job starts once its dependency succeeded (`run --after`), local
provider, core running: for each of CHAINS chains `A: true` then `B --after A: true`, the
time from A's process exit (its attempt's end, as the agent recorded it) to B's process start
(as the agent recorded it). Target (issue 29): median at most 100 ms.
`python bench/after.py [CHAINS]` (default 100).
"""

from __future__ import annotations

import statistics
import sys
import tempfile

from common import fresh_home, stop_everything


def main() -> None:
    chains = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    home = fresh_home()
    from monkey.api import Monkey
    from monkey.config import Home
    from monkey.core import daemon

    m = Monkey(home)
    project = tempfile.mkdtemp()
    daemon.start(Home(home))
    delays = []
    try:
        m.run(["true"], workdir=project).wait(timeout=30)  # warm: the agent is up
        for _ in range(chains):
            a = m.run(["sleep", "0.05"], workdir=project)
            b = m.run(["true"], workdir=project, after=a.juid)
            b.wait(timeout=60)
            [end] = [x.ended_at for x in m.store.attempts(a.juid)]
            [start] = [x.started_at for x in m.store.attempts(b.juid)]
            delays.append(start - end)
    finally:
        stop_everything(home)
    delays.sort()
    print(
        f"dependency exit -> dependent start ({chains} chains): median "
        f"{statistics.median(delays) * 1000:.1f} ms, p90 {delays[int(len(delays) * 0.9)] * 1000:.1f} "
        f"ms, max {delays[-1] * 1000:.1f} ms (target: median <= 100 ms)"
    )


if __name__ == "__main__":
    main()
