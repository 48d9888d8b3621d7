"""`monkey list jobs` through a remote (`monkey server` on loopback, TLS) against the local
`monkey list jobs`, in the same run, with 100,000 jobs in the server's store.

Target (issue 27): the remote listing at most 1.3x the local one. Both CLIs are the
console script run by the clean interpreter (common.MONKEY); the server runs with this one
(it needs starlette and uvicorn). `python bench/remote_list.py [REPEAT]` (default 21 runs
each, medians).
"""

from __future__ import annotations

import subprocess
import sys
import time

from common import MONKEY, PY, copy_jobs, fresh_home, median_wall, start_main_node, stop_everything

N = 100_000


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
    laptop_env, stop = start_main_node(home)
    try:

        def quiet(argv: list[str], env: dict[str, str] | None = None) -> None:
            subprocess.run(
                argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, env=env
            )

        time.sleep(1)
        base = median_wall(lambda: quiet([PY, "-c", "pass"]), repeat)
        local = median_wall(lambda: quiet([*MONKEY, "list", "jobs"]), repeat)
        remote = median_wall(
            lambda: quiet([*MONKEY, "--remote", "lab", "list", "jobs"], laptop_env), repeat
        )
    finally:
        stop()
        stop_everything(home)
    print(f"python -c pass:                  {base * 1000:7.1f} ms")
    print(f"monkey list jobs (local):        {local * 1000:7.1f} ms  ({local / base:.1f}x pass)")
    print(
        f"monkey --remote lab list jobs:   {remote * 1000:7.1f} ms  ({remote / local:.2f}x local, "
        "target <= 1.3x)"
    )


if __name__ == "__main__":
    main()
