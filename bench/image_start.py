"""Jobs in images (issue 44), against a real registry on 127.0.0.1 (tests/registry.py).

1. Warm start: with the core running, `monkey run [--image REF] -- touch t` (a new CLI
   process) until the job's command has run (t's mtime), with the image already on the
   worker, against the same without an image: runs interleaved, the cost is the median of
   the pairs' differences. Target: within 50 ms.
2. Bytes pulled by a second job on the same worker (target 0).

The pull's speed against skopeo's: bench/image_pull.py.
"""

from __future__ import annotations

import os
import re
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


def run(home: Path, project: str, *args: str) -> str:
    out = subprocess.run(
        [*MONKEY, "run", *args], capture_output=True, text=True, check=True, cwd=project
    )
    juid = out.stdout.strip()
    from monkey.api import Monkey

    job = Monkey(home).job(juid)
    job.wait(timeout=600)
    assert str(job.status) == "succeeded", f"{juid}: {job.status}"
    return juid


def start_to_command(home: Path, project: str, image: list[str]) -> float:
    t0 = time.time()
    juid = run(home, project, *image, "--", "touch", "t")
    return os.stat(home / "runs" / juid / "1" / "work" / "t").st_mtime_ns / 1e9 - t0


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
        plain = statistics.median(p for p, _ in pairs)
        boxed = statistics.median(b for _, b in pairs)
        cost = statistics.median(b - p for p, b in pairs)
        print(
            f"warm start, run -> command: without image {plain * 1000:6.1f} ms, with image "
            f"{boxed * 1000:6.1f} ms; image cost {cost * 1000:+5.1f} ms (median of {RUNS} "
            "pairs; target <= 50 ms)"
        )

        ref = f"{reg.host}/bench/tiny:1"
        second = run(home, project, "--image", ref, "--", "true")
        again = re.search(r"\((\d+) bytes pulled\)", setup_log(home, second))
        print(f"bytes pulled by a second job on the worker: {again.group(1) if again else '?'}")
    finally:
        stop_everything(home)
        proc.kill()


if __name__ == "__main__":
    main()
