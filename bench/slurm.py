"""The Slurm provider against raw sbatch, on the same single-node Slurm (tests/slurm.py), same run.

1. 200 trivial jobs (`true`) as one sweep on the `slurm` provider: submission to all finished,
   against one raw `sbatch --array=1-200 --wrap true` (submission to the queue empty); with
   where the time goes (first allocation submitted, first and last job started), and how
   many sbatch calls monkey made (the counting shim).
2. Following 200 jobs that wait or run (`sleep 600`, most of them pending in Slurm's queue):
   squeue calls per minute (a counting shim first on PATH) and the core's CPU seconds per
   minute, over WINDOW seconds.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from common import REPO, fresh_home, stop_everything

sys.path.insert(0, str(REPO / "tests"))
from slurm import PARTITION, SlurmLab  # noqa: E402

JOBS = 200
WINDOW = float(os.environ.get("WINDOW", "60"))


def raw_array(lab: SlurmLab) -> float:
    t0 = time.time()
    lab.run("sbatch", "--parsable", f"--array=1-{JOBS}", "-o", "/dev/null", "--wrap", "true")
    while lab.jobs():
        time.sleep(0.05)
    return time.time() - t0


def core_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    from monkey.api import Monkey
    from monkey.config import Home
    from monkey.core import daemon
    from monkey.models import State

    lab = SlurmLab(Path(tempfile.mkdtemp(prefix="monkey-slurm-")))
    lab.start()
    os.environ.update(lab.env)
    shim = Path(tempfile.mkdtemp(prefix="monkey-shim-"))
    calls = shim / "calls"
    for tool in ("squeue", "sbatch"):
        real = subprocess.run(
            ["which", tool], capture_output=True, text=True, check=True
        ).stdout.strip()
        (shim / tool).write_text(f'#!/bin/sh\necho {tool} >> {calls}\nexec {real} "$@"\n')
        (shim / tool).chmod(stat.S_IRWXU)
    os.environ["PATH"] = f"{shim}:{os.environ['PATH']}"
    home = fresh_home()
    home.mkdir(parents=True)
    (home / "providers.yml").write_text(
        yaml.safe_dump(
            {
                "providers": {
                    "cluster": {"type": "slurm", "partition": PARTITION, "max_instances": 1000}
                }
            }
        )
    )
    project = Path(tempfile.mkdtemp(prefix="monkey-proj-"))
    os.chdir(project)
    m = Monkey(home)
    try:
        raw = raw_array(lab)
        t0 = time.time()
        sid = m.sweep(["true", "{k}"], grid={"k": list(range(JOBS))}, provider="cluster")
        while m.store.get_sweep(sid)["state"] != "finished":
            time.sleep(0.2)
        ours = time.time() - t0
        jobs = m.store.list_jobs(sweep=sid)
        ok = sum(j.state == State.SUCCEEDED for j in jobs)
        starts = sorted(
            a.started_at for j in jobs for a in m.store.attempts(j.juid) if a.started_at
        )
        made = min(r["launched_at"] for r in m.store.instances("cluster"))
        sbatch = sum(1 for line in calls.read_text().splitlines() if line == "sbatch")
        print(
            f"{JOBS} trivial jobs as one sweep: raw sbatch --array {raw:.1f}s, monkey slurm provider "
            f"{ours:.1f}s ({ours / raw:.2f}x; {ok} succeeded; {sbatch} sbatch calls; first allocation "
            f"submitted at {made - t0:.1f}s, jobs started from {starts[0] - t0:.1f}s to {starts[-1] - t0:.1f}s)"
        )

        for _ in range(JOBS):
            m.run(["sleep", "600"], provider="cluster")
        time.sleep(10)  # allocations submitted, the first ones running
        pid = daemon.status(Home(home))
        before_calls = calls.read_text().splitlines().count("squeue")
        cpu0, w0 = core_cpu(pid), time.time()
        time.sleep(WINDOW)
        cpu1, w1 = core_cpu(pid), time.time()
        n = calls.read_text().splitlines().count("squeue") - before_calls
        minutes = (w1 - w0) / 60
        waiting = sum(1 for line in lab.jobs() if "PENDING" in line)
        print(
            f"following {JOBS} jobs ({waiting} allocations pending in Slurm): {n / minutes:.1f} squeue "
            f"calls/min, core CPU {(cpu1 - cpu0) / minutes:.2f} s/min"
        )
    finally:
        m.store.close()
        stop_everything(home)
        lab.cancel_all()
        lab.stop()


if __name__ == "__main__":
    main()
