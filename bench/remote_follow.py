"""`monkey logs -f` through a remote (`monkey server` on loopback, TLS) beside the local
`monkey logs -f`, on the same job in the same run: the delay from the job's write to the
follower's print. Target (issue 27): the remote's p95 at most 0.5 s.

A job prints a line with its write time every 20-80 ms (200 lines); both followers run
from its start. `python bench/remote_follow.py [RUNS]` (default 3, medians).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import MONKEY, fresh_home, start_main_node, stop_everything
from follow import LINES, Reader, p95

JOB = f"""
import random, time
for i in range({LINES}):
    time.sleep(random.uniform(0.02, 0.08))
    print(f"{{time.time():.6f}}", flush=True)
"""


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    home = fresh_home()
    from monkey.api import Monkey
    from monkey.config import Home
    from monkey.core import daemon

    project = tempfile.mkdtemp()
    (Path(project) / "job.py").write_text(JOB)
    m = Monkey(home)
    daemon.start(Home(home))
    laptop_env, stop = start_main_node(home)
    results: dict[str, list[float]] = {"local": [], "remote": []}
    try:
        m.run(["true"], workdir=project).wait(timeout=30)  # warm: the agent is up
        for _ in range(runs):
            job = m.run([sys.executable, "job.py"], workdir=project)
            procs = {
                "local": subprocess.Popen(
                    [*MONKEY, "logs", "-f", "--stdout", job.juid], stdout=subprocess.PIPE
                ),
                "remote": subprocess.Popen(
                    [*MONKEY, "--remote", "lab", "logs", "-f", "--stdout", job.juid],
                    stdout=subprocess.PIPE,
                    env=laptop_env,
                ),
            }
            readers = {k: Reader(p) for k, p in procs.items()}
            for r in readers.values():
                r.start()
            for k, r in readers.items():
                if not r.done.wait(120):
                    raise SystemExit(f"the {k} follower missed lines")
                procs[k].wait(timeout=60)
                results[k].append(p95(r.delays))
            print(
                "run: write-to-print p95 "
                + ", ".join(f"{k} {v[-1] * 1000:.1f} ms" for k, v in results.items())
            )
    finally:
        stop()
        stop_everything(home)
    local, remote = (statistics.median(results[k]) for k in ("local", "remote"))
    print(
        f"median of {runs} runs: logs -f p95 local {local * 1000:.1f} ms, remote "
        f"{remote * 1000:.1f} ms (target <= 500 ms)"
    )


if __name__ == "__main__":
    main()
