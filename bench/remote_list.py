"""`monkey list jobs` through a remote (`monkey server` on loopback, TLS) against the local
`monkey list jobs`, in the same run, with 100,000 jobs in the server's store.

Target (issue 27): the remote listing at most 1.3x the local one. Both CLIs run with the clean
interpreter (common.PY); the server runs with this one (it needs starlette and uvicorn).
`python bench/remote_list.py [REPEAT]` (default 21 runs each, medians).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import PY, copy_jobs, fresh_home, median_wall, stop_everything

N = 100_000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    repeat = int(sys.argv[1]) if len(sys.argv) > 1 else 21
    home = fresh_home()
    from monkey.api import Monkey

    m = Monkey(home)
    job = m.run(["true"], start_core=False)
    copy_jobs(
        m,
        job.juid,
        [
            {
                "juid": f"25-01-{1 + i // 9000:02d}-{i % 9000 + 1:04d}",
                "state": ("succeeded", "failed", "running", "queued")[i % 4],
            }
            for i in range(N)
        ],
    )
    server_env = dict(os.environ)
    port = free_port()
    started = subprocess.run(
        [sys.executable, "-m", "monkey", "server", "start", "--bind", f"127.0.0.1:{port}"],
        capture_output=True,
        text=True,
        env=server_env,
        check=True,
    ).stdout
    token, fp = re.search(r"--token (\S+) --fingerprint (\S+)", started).groups()
    laptop = Path(tempfile.mkdtemp(prefix="monkey-bench-laptop-"))
    laptop_env = dict(
        os.environ,
        HOME=str(laptop),
        XDG_CONFIG_HOME=str(laptop / ".config"),
        MONKEY_HOME=str(laptop / ".monkey"),
    )
    subprocess.run(
        [
            PY,
            "-m",
            "monkey",
            "remote",
            "add",
            "lab",
            f"https://127.0.0.1:{port}",
            "--token",
            token,
            "--fingerprint",
            fp,
        ],
        env=laptop_env,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    try:

        def quiet(argv: list[str], env: dict[str, str]) -> None:
            subprocess.run(
                argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, env=env
            )

        time.sleep(1)
        base = median_wall(lambda: quiet([PY, "-c", "pass"], server_env), repeat)
        local = median_wall(lambda: quiet([PY, "-m", "monkey", "list", "jobs"], server_env), repeat)
        remote = median_wall(
            lambda: quiet([PY, "-m", "monkey", "--remote", "lab", "list", "jobs"], laptop_env),
            repeat,
        )
    finally:
        subprocess.run(
            [sys.executable, "-m", "monkey", "server", "stop"],
            env=server_env,
            stdout=subprocess.DEVNULL,
        )
        stop_everything(home)
    print(f"python -c pass:                  {base * 1000:7.1f} ms")
    print(f"monkey list jobs (local):        {local * 1000:7.1f} ms  ({local / base:.1f}x pass)")
    print(
        f"monkey --remote lab list jobs:   {remote * 1000:7.1f} ms  ({remote / local:.2f}x local, "
        "target <= 1.3x)"
    )


if __name__ == "__main__":
    main()
