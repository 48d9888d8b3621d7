"""The first upload of a 1 GB dataset to a main node (`monkey server` on loopback, TLS)
against `scp` of the same file to a real sshd on loopback, in the same run.

Target (issue 27): monkey's throughput at least 0.5x scp's. Monkey's time is the whole
`monkey --remote lab run --dataset BIG -- true` command with empty caches on both sides
(hashing, the laptop's cache, the upload and the server's re-hash), each run with a new
file. `python bench/remote_upload.py [RUNS] [MB]` (default 3 runs of 1024 MB, medians).
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import MONKEY, REPO, fresh_home, start_main_node, stop_everything

sys.path.insert(0, str(REPO / "tests"))  # the test fixtures' sshd on loopback
from sshd import Lab  # noqa: E402


def random_file(path: Path, mb: int) -> None:
    with open(path, "wb") as f:
        for _ in range(mb):
            f.write(os.urandom(1 << 20))


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    mb = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
    home = fresh_home()
    from monkey.config import Home
    from monkey.core import daemon

    daemon.start(Home(home))
    laptop_env, stop = start_main_node(home)
    lab = Lab(Path(tempfile.mkdtemp(prefix="monkey-bench-ssh-")))
    host = lab.add("target")
    work = Path(tempfile.mkdtemp(prefix="monkey-bench-upload-"))
    project = Path(tempfile.mkdtemp(prefix="monkey-bench-project-"))  # empty: the data only
    scp_times, monkey_times = [], []
    try:
        for i in range(runs):
            data = work / f"data{i}.bin"
            random_file(data, mb)
            target = f"{host.user}@{host.address}:{host.dir}/copy.bin"
            t = time.perf_counter()
            subprocess.run(
                ["scp", "-q", "-P", str(host.sshd_port), "-i", lab.key]
                + ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]
                + [str(data), target],
                check=True,
            )
            scp_times.append(time.perf_counter() - t)
            (host.dir / "copy.bin").unlink()
            t = time.perf_counter()
            subprocess.run(
                [*MONKEY, "--remote", "lab", "run", "--dataset", str(data), "--", "true"],
                check=True,
                stdout=subprocess.DEVNULL,
                env=laptop_env,
                cwd=project,
            )
            monkey_times.append(time.perf_counter() - t)
            data.unlink()
            shutil.rmtree(Path(laptop_env["XDG_CACHE_HOME"]) / "monkey", ignore_errors=True)
    finally:
        stop()
        stop_everything(home)
        lab.close()
        shutil.rmtree(work, ignore_errors=True)
    scp_t, monkey_t = statistics.median(scp_times), statistics.median(monkey_times)
    print(f"scp of {mb} MB:                 {scp_t:6.2f} s  ({mb / scp_t:6.0f} MB/s)")
    print(
        f"monkey run --dataset ({mb} MB): {monkey_t:6.2f} s  ({mb / monkey_t:6.0f} MB/s) = "
        f"{scp_t / monkey_t:.2f}x scp's throughput, target >= 0.5x"
    )


if __name__ == "__main__":
    main()
