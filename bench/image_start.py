"""Jobs in images (issue 44), against a real registry on 127.0.0.1 (tests/registry.py).

1. Warm start: with the core running, `monkey run [--image REF] -- touch t` (a new CLI
   process) until the job's command has run (t's mtime), with the image already on the
   worker, against the same without an image: runs interleaved, the cost is the median of
   the pairs' differences. Target: within 50 ms. The CPU time of the `monkey run` process
   (and its children: skopeo when it runs) is shown beside it.
2. Bytes pulled by a second job on the same worker (target 0).

The pull's speed against skopeo's: bench/image_pull.py.
"""

from __future__ import annotations

import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import MONKEY, REPO, fresh_home, stop_everything

sys.path.insert(0, str(REPO / "tests"))
import registry  # noqa: E402

RUNS = 21


def run(home: Path, project: str, *args: str) -> tuple[str, float]:
    """(the job `monkey run ARGS` submitted, once it succeeded; the CPU seconds of that
    command and its children)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(
        [*MONKEY, "run", *args], capture_output=True, text=True, check=True, cwd=project
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    juid = out.stdout.strip()
    from monkey.api import Monkey

    job = Monkey(home).job(juid)
    job.wait(timeout=600)
    assert str(job.status) == "succeeded", f"{juid}: {job.status}"
    return juid, cpu


def start_to_command(home: Path, project: str, image: list[str]) -> tuple[float, float]:
    """(seconds from `monkey run` to the job's command, CPU seconds of `monkey run`)."""
    t0 = time.time()
    juid, cpu = run(home, project, *image, "--", "touch", "t")
    return os.stat(home / "runs" / juid / "1" / "work" / "t").st_mtime_ns / 1e9 - t0, cpu


def setup_log(home: Path, juid: str) -> str:
    return (home / "runs" / juid / "1" / "setup.log").read_text()


def main() -> None:
    root = Path(tempfile.mkdtemp())
    reg, proc = registry.start(root / "registry")
    home = fresh_home()
    home.mkdir(parents=True)
    from monkey.config import Home
    from monkey.core import daemon
    from monkey.images import Registries

    try:
        reg.push("bench/tiny:1", {"/etc/said": "hi\n"})
        Registries(Home(home)).login(reg.host, registry.USER, registry.PASSWORD, str(reg.ca))
        project = tempfile.mkdtemp()
        daemon.start(Home(home))
        tiny = ["--image", f"{reg.host}/bench/tiny:1"]
        start_to_command(home, project, tiny)  # pulled once: warm from here
        start_to_command(home, project, [])
        pairs = [
            (start_to_command(home, project, []), start_to_command(home, project, tiny))
            for _ in range(RUNS)
        ]
        for what, i in (("wall, run -> command", 0), ("CPU of monkey run", 1)):
            plain = statistics.median(p[i] for p, _ in pairs)
            boxed = statistics.median(b[i] for _, b in pairs)
            cost = statistics.median(b[i] - p[i] for p, b in pairs)
            print(
                f"warm start, {what}: without image {plain * 1000:6.1f} ms, with image "
                f"{boxed * 1000:6.1f} ms; image cost {cost * 1000:+5.1f} ms (median of {RUNS} "
                f"pairs{'; target <= 50 ms' if i == 0 else ''})"
            )

        ref = f"{reg.host}/bench/tiny:1"
        second, _cpu = run(home, project, "--image", ref, "--", "true")
        again = re.search(r"\((\d+) bytes pulled\)", setup_log(home, second))
        print(f"bytes pulled by a second job on the worker: {again.group(1) if again else '?'}")
    finally:
        stop_everything(home)
        proc.kill()


if __name__ == "__main__":
    main()
