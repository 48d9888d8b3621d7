"""Experiment tracking figures, each next to baselines measured in this same run.

1. ``monkey.log(name, value, step=i)`` hot path per call, against ``list.append`` of a
   tuple, ``SimpleQueue.put``, a JSON line to a buffered file, and MLflow's ``log_metric``
   to a file store when mlflow is installed. Target: at most 1 us per call.
2. Ingestion: a job under monkey logs 1,000,000 points as fast as it can; time from the
   job's first point until all of them are rows in SQLite (through metrics.jsonl, the
   agent, the link and the core). Target: under 5 s. Baseline: a bare ``executemany`` of
   1,000,000 rows into an empty SQLite table.
3. ``monkey compare --sweep S`` over 200 runs x 100 points (one-shot CLI, median wall).
   Target: under 300 ms. Baseline: ``python -c pass``.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import tempfile
import time
from queue import SimpleQueue

from common import MONKEY, PY, fresh_home, make_sweep, median_wall, run_quiet, stop_everything

N_CALLS = 1_000_000
N_POINTS = 1_000_000


def per_call(fn, n: int = N_CALLS) -> float:
    """Microseconds per call of fn(i) in a plain loop."""
    t = time.perf_counter()
    for i in range(n):
        fn(i)
    return (time.perf_counter() - t) / n * 1e6


def hot_path() -> None:
    os.environ["MONKEY_METRICS_FILE"] = os.path.join(tempfile.mkdtemp(), "m.jsonl")  # not a job
    import monkey
    from monkey.client_agent import track as logger

    buf: list = []
    queue: SimpleQueue = SimpleQueue()
    with open(os.path.join(tempfile.mkdtemp(), "lines.jsonl"), "w") as fh:
        baselines = {
            "list.append((name, step, value))": per_call(lambda i: buf.append(("acc", i, 0.5))),
            "SimpleQueue.put((name, step, value))": per_call(lambda i: queue.put(("acc", i, 0.5))),
            "JSON line to a buffered file": per_call(
                lambda i: fh.write(json.dumps({"name": "acc", "step": i, "value": 0.5}) + "\n")
            ),
        }
    log = monkey.log
    # First the call alone: the flusher sleeps and this loop flushes between timed runs of
    # 10,000 calls (the buffer stays as small as the 0.5 s flusher keeps it in training).
    logger.FLUSH_EVERY = 3600.0
    log("warm", 0.0)
    hot = encode = 0.0
    for start in range(0, N_CALLS, 10_000):
        t = time.perf_counter()
        for i in range(start, start + 10_000):
            log("acc", 0.5, step=i)
        t2 = time.perf_counter()
        logger.flush()
        hot += t2 - t
        encode += time.perf_counter() - t2
    hot, encode = hot / N_CALLS * 1e6, encode / N_CALLS * 1e6
    logger.FLUSH_EVERY = 0.5
    logger._wake.set()  # the flusher now writes every 0.5 s while the loop runs
    logger._wake.clear()
    t = time.perf_counter()
    for i in range(N_CALLS):
        log("acc", 0.5, step=i)
    logger.flush()
    busy = (time.perf_counter() - t) / N_CALLS * 1e6
    base = baselines["list.append((name, step, value))"]
    print(
        f"monkey.log(name, value, step=i) hot path {hot:6.3f} us/call  "
        f"({hot / base:.1f}x list.append; target <= 1 us)"
    )
    print(f"  background flush (encode + write)       {encode:6.3f} us/point")
    print(f"  loop with the flusher running, all in   {busy:6.3f} us/call")
    for label, value in baselines.items():
        print(f"  baseline {label:36s} {value:6.3f} us/call")
    try:
        import mlflow
    except ImportError:
        print("  baseline mlflow.log_metric: mlflow not installed, not measured")
        return
    mlflow.set_tracking_uri("file://" + tempfile.mkdtemp())
    with mlflow.start_run():
        ml = per_call(lambda i: mlflow.log_metric("acc", 0.5, step=i), 2000)
    print(
        f"  baseline mlflow.log_metric (file store) {ml:8.1f} us/call ({ml / hot:.0f}x monkey.log)"
    )


def ingestion() -> None:
    home = fresh_home()
    os.environ["MONKEY_HEARTBEAT"] = "1"
    from monkey.api import Monkey

    m = Monkey(home)
    code = (
        "import time, monkey\nprint(time.time(), flush=True)\nlog = monkey.log\n"
        f"for i in range({N_POINTS}): log('loss', 1.0 / (i + 1), step=i)\n"
        "print(time.time(), flush=True)\n"
    )
    try:
        job = m.run([sys.executable, "-c", code])
        deadline = time.time() + 120
        while m.store.db.execute("SELECT COUNT(*) FROM metrics").fetchone()[0] < N_POINTS:
            if time.time() > deadline:
                raise SystemExit("ingestion did not finish in 120 s")
            time.sleep(0.01)
        stored = time.time()
        first, last = (float(x) for x in job.logs().split())
        print(
            f"ingestion of {N_POINTS:,} points: {stored - first:.2f} s from the first point "
            f"to SQLite (target < 5 s); the job logged for {last - first:.2f} s, then "
            f"{stored - last:.2f} s to store the rest"
        )
    finally:
        stop_everything(home)
    db = sqlite3.connect(os.path.join(tempfile.mkdtemp(), "bare.db"))
    db.execute(
        "CREATE TABLE t(series INTEGER, attempt INTEGER, step INTEGER, value REAL, wall REAL)"
    )
    rows = [(1, 1, i, 1.0 / (i + 1), 1.7e9 + i) for i in range(N_POINTS)]
    t = time.perf_counter()
    with db:
        db.executemany("INSERT INTO t VALUES (?, ?, ?, ?, ?)", rows)
    print(f"  baseline: bare executemany of {N_POINTS:,} rows {time.perf_counter() - t:.2f} s")


def compare_sweep() -> None:
    home = fresh_home()
    from monkey.api import Monkey

    m = Monkey(home)
    sid = make_sweep(
        m, 200, lambda i: {"lr": i / 1000, "optim": {"momentum": 0.9}}, lambda i, s: (i + s) / 300
    )
    base = median_wall(lambda: run_quiet([PY, "-c", "pass"]), 11)
    cmp = median_wall(lambda: run_quiet([*MONKEY, "compare", "--sweep", sid]), 11)
    t = time.perf_counter()
    rows = m.compare(sweep=sid)["rows"]
    api = time.perf_counter() - t
    assert len(rows) == 200
    print(
        f"monkey compare --sweep over 200 runs x 100 points: {cmp * 1000:.0f} ms "
        f"(target < 300 ms; {cmp / base:.1f}x `python -c pass` = {base * 1000:.0f} ms); "
        f"the API call alone {api * 1000:.0f} ms"
    )


def main() -> None:
    hot_path()
    ingestion()
    compare_sweep()


if __name__ == "__main__":
    main()
