"""Jobs in images (issue 44), against a real registry on 127.0.0.1 (tests/registry.py).

1. Warm start: with the core running, `monkey run [--image REF] -- touch t` (a new CLI
   process) until the job's command has run (t's mtime), with the image already on the
   worker, against the same without an image: runs interleaved, the cost is the median of
   the pairs' differences. Target: within 50 ms.
2. Pull: a 300 MB image (one layer of random bytes) pulled and unpacked by a job on a fresh
   worker (as `logs --setup` reports it), against `skopeo copy` of it to a local OCI folder,
   in the same run. Target: at least 0.8x skopeo's speed.
3. Bytes pulled by a second job on the same worker (target 0).
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
BIG = int(os.environ.get("MONKEY_BENCH_IMAGE_MB", "300"))


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

        big = reg.root / "big.bin"
        with open(big, "wb") as f:
            f.write(os.urandom(BIG << 20))
        reg.push("bench/big:1", {"/data/big.bin": big})
        ref = f"{reg.host}/bench/big:1"
        out = Path(tempfile.mkdtemp()) / "oci"
        t = time.perf_counter()
        subprocess.run(
            ["skopeo", "copy", "--quiet", "--src-cert-dir", str(reg.ca.parent),
             "--src-creds", f"{registry.USER}:{registry.PASSWORD}", f"docker://{ref}",
             f"oci:{out}:big"],
            check=True,
        )  # fmt: skip
        skopeo = time.perf_counter() - t
        first = run(home, project, "--image", ref, "--", "true")
        said = re.search(
            r"pulled ([\d,]+) bytes and unpacked in ([\d.]+) s", setup_log(home, first)
        )
        assert said, setup_log(home, first)
        pulled, took = int(said.group(1).replace(",", "")), float(said.group(2))
        print(
            f"pull of a {BIG} MB image: skopeo copy {skopeo:.2f} s; monkey (pull and unpack) "
            f"{took:.1f} s, {pulled / 1e6:.0f} MB: {skopeo / took:.2f}x skopeo's speed "
            "(target >= 0.8x)"
        )
        second = run(home, project, "--image", ref, "--", "true")
        again = re.search(r"\((\d+) bytes pulled\)", setup_log(home, second))
        print(f"bytes pulled by a second job on the worker: {again.group(1) if again else '?'}")
    finally:
        stop_everything(home)
        proc.kill()


if __name__ == "__main__":
    main()
