"""`monkey logs` on a 1 GB log: the tail is read from the end, the whole is streamed.

1. ``monkey logs JOB --tail 5``: median wall time against ``python -c pass`` run by the
   same interpreter (target: a small constant ratio, whatever the log's size), peak RSS.
2. ``monkey logs JOB > /dev/null``: throughput in MB/s against ``cat LOG > /dev/null``,
   peak RSS (target: bounded, not the log's size).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time

from common import MONKEY, PY, fresh_home, median_wall, run_quiet

SIZE = 1 << 30
LINE = b"epoch 12 step 3456 loss 0.123456 acc 0.987654 lr 0.001 grad_norm 1.234\n"


def timed(argv: list[str]) -> tuple[float, int]:
    """Wall time and peak RSS (bytes) of one run of ``argv``, output to /dev/null."""
    t = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"{argv} failed")
    return time.perf_counter() - t, usage.ru_maxrss * 1024


def main() -> None:
    home = fresh_home()
    from monkey.api import Monkey

    m = Monkey(home)
    job = m.run(["true"], start_core=False)
    run_dir = home / "runs" / job.juid / "1"
    run_dir.mkdir(parents=True)
    m.store.begin_attempt(m.store.get_job(job.juid), "local", str(run_dir))
    log = run_dir / "stdout.log"
    block = LINE * ((8 << 20) // len(LINE))
    with open(log, "wb") as fh:
        while fh.tell() < SIZE:
            fh.write(block)
    size = log.stat().st_size
    logs = [*MONKEY, "logs", job.juid]
    try:
        base = median_wall(lambda: run_quiet([PY, "-c", "pass"]), 11)
        tail = median_wall(lambda: run_quiet([*logs, "--tail", "5"]), 11)
        tail_rss = timed([*logs, "--tail", "5"])[1]
        print(
            f"logs --tail 5 of {size >> 20} MB: {tail * 1e3:.0f} ms, "
            f"python -c pass {base * 1e3:.0f} ms, ratio {tail / base:.1f}x, "
            f"peak RSS {tail_rss >> 20} MB"
        )
        full = sorted(timed(logs) for _ in range(3))[1]
        cat = sorted(timed(["cat", str(log)]) for _ in range(3))[1]
        print(
            f"logs > /dev/null: {size / full[0] / 1e6:.0f} MB/s, peak RSS {full[1] >> 20} MB; "
            f"cat: {size / cat[0] / 1e6:.0f} MB/s"
        )
    finally:
        m.store.close()
        shutil.rmtree(home.parent)


if __name__ == "__main__":
    main()
