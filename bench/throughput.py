"""1,000 trivial jobs (`true`) through the Python API on the local provider with 2 slots,
from the first submission until all have finished.

Targets: at most 1.5x task-spooler (`tsp -S 2`, issue 10) and at most 4x a plain Python
pool that spawns and waits for the same commands 2 at a time, both measured here in the
same run. Also printed: the CPU seconds the core and the agent spent (their own, and the
agent's children: the jobs' wrappers), which say where the time goes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from common import fresh_home, stop_everything

N = int(sys.argv[1]) if len(sys.argv) > 1 else 1000


def python_pool() -> float:
    t = time.perf_counter()
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda _: subprocess.run(["true"]), range(N)))
    return time.perf_counter() - t


def task_spooler() -> float | None:
    if not shutil.which("tsp"):
        return None
    tmp = tempfile.mkdtemp()
    env = dict(os.environ, TS_SOCKET=f"{tmp}/tsp.sock", TS_MAXFINISHED=str(N + 10), TMPDIR=tmp)
    subprocess.run(["tsp", "-S", "2"], env=env, check=True)
    try:
        t = time.perf_counter()
        for _ in range(N):
            subprocess.run(["tsp", "-n", "true"], env=env, stdout=subprocess.DEVNULL, check=True)
        while True:
            out = subprocess.run(["tsp"], env=env, capture_output=True, text=True).stdout
            if " running " not in out and " queued " not in out:
                break
            time.sleep(0.005)
        return time.perf_counter() - t
    finally:
        subprocess.run(["tsp", "-K"], env=env, stderr=subprocess.DEVNULL)


def _cpu(pid: int) -> tuple[float, float]:
    """(own, waited-for children's) CPU seconds of process PID."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick, (int(fields[13]) + int(fields[14])) / tick


def monkey_local() -> tuple[float, str]:
    home = fresh_home()
    home.mkdir(parents=True)
    (home / "providers.yml").write_text("providers:\n  local: {type: local, slots: 2}\n")
    from monkey.api import Monkey
    from monkey.config import Home
    from monkey.core import daemon

    os.chdir(tempfile.mkdtemp())  # a small project folder to snapshot
    m = Monkey(home)
    h = Home(home)
    daemon.start(h)
    try:
        m.run(["true"]).wait(timeout=30)  # the agent is up
        core, agent = int(h.daemon_pid.read_text()), int((h.private / "agent.pid").read_text())
        before = [_cpu(core), _cpu(agent)]
        client = time.process_time()
        t = time.perf_counter()
        for _ in range(N):
            m.run(["true"])
        while m.store.count_jobs().get("succeeded", 0) < N + 1:
            time.sleep(0.005)
        took = time.perf_counter() - t
        client = time.process_time() - client
        (core0, _), (agent0, kids0) = before
        (core1, _), (agent1, kids1) = _cpu(core), _cpu(agent)
        return took, (
            f"CPU s: submitting {client:.2f}, core {core1 - core0:.2f}, agent "
            f"{agent1 - agent0:.2f}, jobs' wrappers and commands {kids1 - kids0:.2f}"
        )
    finally:
        stop_everything(home)


def main() -> None:
    pool = python_pool()
    tsp = task_spooler()
    mk, cpu = monkey_local()
    print(f"{N} trivial jobs, 2 at a time")
    print(f"python pool (2 workers): {pool:6.2f} s")
    if tsp is not None:
        print(f"task-spooler (tsp -S 2): {tsp:6.2f} s")
    print(
        f"monkey local (2 slots):  {mk:6.2f} s  ({mk / pool:.1f}x pool, target <= 4x"
        + (f"; {mk / tsp:.2f}x tsp, target <= 1.5x)" if tsp else ")")
    )
    print(cpu)


if __name__ == "__main__":
    main()
