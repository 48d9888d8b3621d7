"""1,000 trivial jobs (`true`) through the Python API on the local provider with 2 slots,
from the first submission until all have finished.

Targets: at most 2x task-spooler (`tsp -S 2`) and at most 4x a plain Python pool that
spawns and waits for the same commands 2 at a time, both measured here in the same run.
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


def monkey_local() -> float:
    home = fresh_home()
    home.mkdir(parents=True)
    (home / "providers.yml").write_text("providers:\n  local: {type: local, slots: 2}\n")
    from monkey.api import Monkey
    from monkey.config import Home
    from monkey.core import daemon

    os.chdir(tempfile.mkdtemp())  # a small project folder to snapshot
    m = Monkey(home)
    daemon.start(Home(home))
    try:
        t = time.perf_counter()
        for _ in range(N):
            m.run(["true"])
        while m.store.count_jobs().get("succeeded", 0) < N:
            time.sleep(0.005)
        return time.perf_counter() - t
    finally:
        stop_everything(home)


def main() -> None:
    pool = python_pool()
    tsp = task_spooler()
    mk = monkey_local()
    print(f"{N} trivial jobs, 2 at a time")
    print(f"python pool (2 workers): {pool:6.2f} s")
    if tsp is not None:
        print(f"task-spooler (tsp -S 2): {tsp:6.2f} s")
    print(f"monkey local (2 slots):  {mk:6.2f} s  ({mk / pool:.1f}x pool, target <= 4x"
          + (f"; {mk / tsp:.2f}x tsp, target <= 2x)" if tsp else ")"))


if __name__ == "__main__":
    main()
