"""Pull speed of jobs' images (issue 44), against a real registry on 127.0.0.1 with TLS and
a login (tests/registry.py).

A 300 MB image (one layer of random bytes) pulled and unpacked by a job on a worker that
has none of it (as `logs --setup` reports it: from the start of the pull to the image's
root ready), against `skopeo copy` of it to a local OCI folder (which fetches the same
bytes and unpacks nothing), in the same run, 3 rounds interleaved. Target: at least 0.8x
skopeo's speed.
"""

from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import MONKEY, REPO, fresh_home, stop_everything

sys.path.insert(0, str(REPO / "tests"))
import registry  # noqa: E402

ROUNDS = 3
BIG = int(os.environ.get("MONKEY_BENCH_IMAGE_MB", "300"))


def main() -> None:
    root = Path(tempfile.mkdtemp())
    reg, proc = registry.start(root / "registry")
    home = fresh_home()
    home.mkdir(parents=True)
    from monkey.api import Monkey
    from monkey.config import Home
    from monkey.core import daemon
    from monkey.images import Registries

    try:
        Registries(Home(home)).login(reg.host, registry.USER, registry.PASSWORD, str(reg.ca))
        big = reg.root / "big.bin"
        with open(big, "wb") as f:
            f.write(os.urandom(BIG << 20))
        reg.push("bench/big:1", {"/data/big.bin": big})
        ref = f"{reg.host}/bench/big:1"
        project = tempfile.mkdtemp()
        daemon.start(Home(home))
        ratios = []
        for _ in range(ROUNDS):
            out = root / "skopeo"
            shutil.rmtree(out, ignore_errors=True)
            t = time.perf_counter()
            subprocess.run(
                ["skopeo", "copy", "--quiet", "--src-cert-dir", str(reg.ca.parent),
                 "--src-creds", f"{registry.USER}:{registry.PASSWORD}", f"docker://{ref}",
                 f"oci:{out}:big"],
                check=True,
            )  # fmt: skip
            skopeo = time.perf_counter() - t
            shutil.rmtree(home / "images", ignore_errors=True)  # a worker without the image
            juid = subprocess.run(
                [*MONKEY, "run", "--image", ref, "--", "true"],
                capture_output=True, text=True, check=True, cwd=project,
            ).stdout.strip()  # fmt: skip
            job = Monkey(home).job(juid)
            job.wait(timeout=600)
            log = (home / "runs" / juid / "1" / "setup.log").read_text()
            said = re.search(r"pulled ([\d,]+) bytes and unpacked in ([\d.]+) s", log)
            assert str(job.status) == "succeeded" and said, log
            pulled, took = int(said.group(1).replace(",", "")), float(said.group(2))
            ratios.append(skopeo / took)
            print(
                f"pull of a {BIG} MB image: skopeo copy {skopeo:.2f} s; monkey (pull and "
                f"unpack) {took:.2f} s, {pulled / 1e6:.0f} MB: {skopeo / took:.2f}x skopeo's speed"
            )
        print(
            f"median: {statistics.median(ratios):.2f}x skopeo's speed over {ROUNDS} rounds "
            "(target >= 0.8x)"
        )
    finally:
        stop_everything(home)
        proc.kill()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
