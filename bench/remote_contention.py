"""`monkey list jobs` through a remote while the main node is busy: 10,000 jobs in its
store, 20 submissions of 5,000-file projects from laptops always in flight, and one
provider whose cloud hangs (a blackholed EC2 endpoint, as bench/blackhole.py).

Target (issue 27): the listing's p99 at most 100 ms. The submitting laptops' own work (a
snapshot of each project) runs at the lowest CPU priority here, as on machines of their own;
the server's share of each submission (the upload, the record) runs as it would. Printed: its median and p99 on the
idle server first, then under that load, for WINDOW seconds (RUNS listings at least).
`python bench/remote_contention.py [WINDOW]` (default 30 s).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml
from common import MONKEY, REPO, copy_jobs, fake_aws, fresh_home, start_main_node, stop_everything
from remote_submit import project

sys.path.insert(0, str(REPO / "tests"))  # the test fixtures' blackhole
from blackhole import Blackhole  # noqa: E402
from moto_server import IMAGE, REGION  # noqa: E402

JOBS = 10_000
SUBMITTERS = 20


def listing(env: dict[str, str]) -> float:
    t = time.perf_counter()
    subprocess.run(
        [*MONKEY, "--remote", "lab", "list", "jobs"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=True,
        env=env,
    )
    return time.perf_counter() - t


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[-1]


def main() -> None:
    window = float(sys.argv[1]) if len(sys.argv) > 1 else 30.0
    home = fresh_home()
    work = Path(tempfile.mkdtemp(prefix="monkey-bench-contention-"))
    fake_aws(str(work))
    from monkey.api import Monkey
    from monkey.config import Home
    from monkey.core import daemon

    hole = Blackhole()
    h = Home(home).ensure()
    m = Monkey(home)
    job = m.run(["true"], start_core=False)
    copy_jobs(
        m,
        job.juid,
        [{"juid": f"25-02-01-{i + 1:05d}", "state": "succeeded"} for i in range(JOBS)],
    )
    entry = {"type": "ec2", "region": REGION, "endpoint": hole.endpoint, "size": "t3.micro"}
    entry.update(image=IMAGE, max_instances=1)
    h.providers_file.write_text(yaml.safe_dump({"providers": {"dead": entry}}))
    daemon.start(h)
    laptop_env, stop = start_main_node(home)
    projects = [project(work / f"p{i}") for i in range(SUBMITTERS)]
    done = threading.Event()
    submitted = [0]

    def submitter(folder: Path) -> None:
        n = 0
        while not done.is_set():
            (folder / "changing.py").write_text(f"N = {n}\n")  # one new blob each time
            subprocess.run(  # niced: the laptops are other machines, sharing no CPU
                ["nice", "-n", "19", *MONKEY, "--remote", "lab", "run", "--workdir", str(folder)]
                + ["--", "true"],
                stdout=subprocess.DEVNULL,
                env=laptop_env,
                check=True,
            )
            n += 1
            submitted[0] += 1

    try:
        m.run(["true"], provider="dead")
        deadline = time.monotonic() + 60
        while not hole.hanging():
            if time.monotonic() > deadline:
                raise SystemExit("the core never called the blackholed endpoint")
            time.sleep(0.05)
        idle = [listing(laptop_env) for _ in range(101)]
        threads = [threading.Thread(target=submitter, args=(p,)) for p in projects]
        for t in threads:
            t.start()
        time.sleep(3)  # every submission under way
        busy: list[float] = []
        started = time.monotonic()
        while time.monotonic() - started < window or len(busy) < 101:
            busy.append(listing(laptop_env))
        done.set()
        for t in threads:
            t.join(timeout=300)
    finally:
        done.set()
        stop()
        stop_everything(home)
        hole.stop()
    print(
        f"remote list jobs ({JOBS:,} jobs), idle:  median {statistics.median(idle) * 1000:6.1f} "
        f"ms, p99 {p99(idle) * 1000:6.1f} ms"
    )
    print(
        f"remote list jobs, {SUBMITTERS} submissions in flight and a hung cloud: median "
        f"{statistics.median(busy) * 1000:6.1f} ms, p99 {p99(busy) * 1000:6.1f} ms "
        f"(target <= 100 ms; {len(busy)} listings, {submitted[0]} submissions done)"
    )


if __name__ == "__main__":
    main()
