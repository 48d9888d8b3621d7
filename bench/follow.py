"""`monkey logs -f` against the polling follower it replaced, on the same job, same run.

A job prints a line with its write time every 20-80 ms (200 lines), then writes nothing for
IDLE seconds. Two followers run side by side from its start: `monkey logs -f --stdout JOB`
(watchdog: woken by the write) and the loop `logs -f` ran before (BASELINE: look, then sleep
50 ms). Printed per run and as the median of RUNS runs:

1. delay from the job's write to the follower's print, p95 and median (ms);
2. the follower's CPU time per idle minute while the job writes nothing (ms of CPU, from
   /proc/PID/stat over the idle window, scaled to 60 s).
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from common import MONKEY, PY, fresh_home, stop_everything

RUNS = 3
LINES = 200
IDLE = 20.0  # seconds the job writes nothing
MEASURED = 16.0  # of which the CPU is measured (after the followers settle)

JOB = f"""
import random, time
for i in range({LINES}):
    time.sleep(random.uniform(0.02, 0.08))
    print(f"{{time.time():.6f}}", flush=True)
time.sleep({IDLE})
print("end", flush=True)
"""

# The follower of `logs -f` before watchdog (monkey/api.py, Monkey.follow, one stream).
BASELINE = """
import sys, time
from monkey.api import Monkey
from monkey.core.daemon import Keeper
from monkey.logfiles import LogCursor
from monkey.models import TERMINAL, State

m, juid = Monkey(), sys.argv[1]
keeper, cursor, out = Keeper(m.home), LogCursor(), sys.stdout.buffer
while True:
    job = m.store.get_job(juid)
    finished = job.state in TERMINAL or job.state == State.PAUSED
    if not finished:
        keeper.check()
    for a in [a for a in m.store.attempts(juid) if a.run_dir]:
        for _, _, piece in cursor.read([m.home.run_dir(juid, a.n) / "stdout.log"]):
            out.write(piece)
            out.flush()
    if finished:
        break
    time.sleep(0.05)
"""


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process PID so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Reader(threading.Thread):
    """Reads a follower's stdout: the delay of each line (now - the time written in it)."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        super().__init__(daemon=True)
        self.proc = proc
        self.delays: list[float] = []
        self.done = threading.Event()  # every timed line has arrived

    def run(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            now = time.time()
            if line.strip() == b"end":
                continue
            self.delays.append(now - float(line))
            if len(self.delays) == LINES:
                self.done.set()


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[-1]


def one_run(m, project: str) -> dict[str, tuple[float, float, float]]:
    """{"watchdog"|"polling": (p95 delay, median delay in ms, CPU ms per idle minute)}."""
    script = Path(project) / "job.py"
    script.write_text(JOB)
    job = m.run([sys.executable, str(script)], workdir=project)
    followers = {
        "watchdog": [*MONKEY, "logs", "-f", "--stdout", job.juid],
        "polling": [PY, "-c", BASELINE, job.juid],
    }
    procs = {k: subprocess.Popen(argv, stdout=subprocess.PIPE) for k, argv in followers.items()}
    readers = {k: Reader(p) for k, p in procs.items()}
    for r in readers.values():
        r.start()
    for r in readers.values():
        if not r.done.wait(120):
            raise SystemExit("a follower missed lines")
    time.sleep((IDLE - MEASURED) / 2)
    before = {k: cpu_seconds(p.pid) for k, p in procs.items()}
    time.sleep(MEASURED)
    after = {k: cpu_seconds(p.pid) for k, p in procs.items()}
    out = {}
    for k, p in procs.items():
        p.wait(timeout=60)
        readers[k].join(timeout=10)
        out[k] = (
            p95(readers[k].delays) * 1e3,
            statistics.median(readers[k].delays) * 1e3,
            (after[k] - before[k]) / MEASURED * 60 * 1e3,
        )
    return out


def main() -> None:
    home = fresh_home()
    from monkey.api import Monkey
    from monkey.config import Home
    from monkey.core import daemon

    project = tempfile.mkdtemp()
    m = Monkey(home)
    daemon.start(Home(home))
    try:
        m.run(["true"], workdir=project).wait(timeout=30)  # warm: the agent is up
        runs = []
        for i in range(RUNS):
            r = one_run(m, project)
            runs.append(r)
            print(
                f"run {i + 1}: "
                + "; ".join(
                    f"{k}: write-to-print p95 {d:.1f} ms (median {md:.1f}), CPU {c:.0f} ms per "
                    "idle minute"
                    for k, (d, md, c) in r.items()
                )
            )
        med = {k: [statistics.median(r[k][i] for r in runs) for i in range(3)] for k in runs[0]}
        (wd, wm, wc), (pd, pm, pc) = med["watchdog"], med["polling"]
        print(
            f"median of {RUNS} runs: logs -f (watchdog) p95 {wd:.1f} ms, median {wm:.1f} ms, "
            f"{wc:.0f} ms CPU per idle minute; polling (before) p95 {pd:.1f} ms, median "
            f"{pm:.1f} ms, {pc:.0f} ms CPU per idle minute; p95 ratio {pd / wd:.1f}x, median "
            f"ratio {pm / wm:.1f}x, idle CPU ratio "
            + (f"{pc / wc:.0f}x" if wc else "inf (0 ticks measured)")
        )
    finally:
        m.store.close()
        stop_everything(home)
        shutil.rmtree(home.parent, ignore_errors=True)
        shutil.rmtree(project, ignore_errors=True)


if __name__ == "__main__":
    main()
