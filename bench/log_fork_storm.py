"""A storm of training scripts that log with monkey.log from fork-started Process children,
a thread and a fork Pool (the shape that hung at the Pool's exit in about 1% of runs under
load: issue 42, item 16), run RUNS times in LOOPS parallel loops, each run given 60 s.
Prints runs, hangs (target 0) and failures. `python bench/log_fork_storm.py [RUNS] [LOOPS]`
(default 1000 runs in 6 loops: the loops themselves are the load)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = textwrap.dedent(
    """
    import multiprocessing as mp, threading, monkey
    def child(i):
        for s in range(50):
            monkey.log(f"child{i}", s, step=s)
    def thread():
        for s in range(50):
            monkey.log("thread", s, step=s)
    if __name__ == "__main__":
        monkey.log("parent", 1.0)
        procs = [mp.get_context("fork").Process(target=child, args=(i,)) for i in range(2)]
        [p.start() for p in procs]
        [p.join() for p in procs]
        t = threading.Thread(target=thread)
        t.start()
        t.join()
        with mp.get_context("fork").Pool(2) as pool:
            pool.map(child, [2, 3])
    """
)


def one(folder: Path) -> str:
    """Run the script once in FOLDER: ok, hang or failed."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "MONKEY_METRICS_FILE": str(folder / "m.jsonl")}
    env.pop("MONKEY_RUN_DIR", None)
    proc = subprocess.Popen(
        [sys.executable, str(folder / "train.py")], cwd=folder, env=env, start_new_session=True
    )
    try:
        return "ok" if proc.wait(60) == 0 else "failed"
    except subprocess.TimeoutExpired:
        if os.environ.get("STORM_DUMP"):  # the stacks of the hung tree, for a diagnosis
            pids = subprocess.run(
                ["pgrep", "-g", str(proc.pid)], capture_output=True, text=True
            ).stdout.split()
            for pid in pids:
                dump = subprocess.run(
                    ["py-spy", "dump", "--native", "--pid", pid], capture_output=True, text=True
                )
                print(f"== {pid}\n{dump.stdout}{dump.stderr}", flush=True)
            for pid in pids:
                try:
                    status = open(f"/proc/{pid}/status").read().splitlines()
                except OSError:
                    continue
                print(pid, [line for line in status if line.startswith(("Sig", "Shd", "State"))])
        os.killpg(proc.pid, 9)
        proc.wait()
        return "hang"


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    loops = int(sys.argv[2]) if len(sys.argv) > 2 else 6
    with tempfile.TemporaryDirectory() as tmp:
        folders = []
        for i in range(loops):
            folder = Path(tmp) / str(i)
            folder.mkdir()
            (folder / "train.py").write_text(SCRIPT)
            folders.append(folder)
        started = time.monotonic()
        with ThreadPoolExecutor(loops) as pool:
            outcomes = list(pool.map(lambda i: one(folders[i % loops]), range(runs)))
    print(
        f"runs {runs} in {loops} loops, {time.monotonic() - started:.0f}s: "
        f"hangs {outcomes.count('hang')} (target 0), failed {outcomes.count('failed')}"
    )


if __name__ == "__main__":
    main()
