"""Submitting through a remote (`monkey server` on loopback, TLS) against submitting on
the main node itself, in the same run (issue 27's targets):

- `monkey run -- true` until the job's process starts: remote at most 1.5x local;
- submitting an unchanged 5,000-file project again: no blob uploaded, and the submit (the
  `monkey run --workdir P -- true` command) at most 2x the local one.

Both CLIs are the console script run by the clean interpreter (common.MONKEY); the server
runs with this one. `python bench/remote_submit.py [RUNS]` (default 15, medians).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import MONKEY, fresh_home, median_wall, run_to_start, start_main_node, stop_everything

FILES = 5_000


def project(root: Path) -> Path:
    """A project of FILES small files in 50 folders."""
    for i in range(FILES):
        folder = root / f"pkg{i % 50}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"mod{i}.py").write_text(f"VALUE = {i}\n" + "# padding\n" * (i % 40))
    return root


def blob_count(home: Path) -> int:
    return sum(len(files) for _, _, files in os.walk(home / "blobs"))


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 15
    home = fresh_home()
    from monkey.api import Monkey
    from monkey.config import Home
    from monkey.core import daemon

    m = Monkey(home)
    daemon.start(Home(home))
    laptop_env, stop = start_main_node(home)
    try:
        empty = tempfile.mkdtemp()
        m.run(["true"]).wait(timeout=30)  # warm: the agent is up
        run_to_start(m, empty, 2, remote=laptop_env)  # warm: the remote's cache exists
        local_lat = statistics.median(run_to_start(m, empty, runs))
        remote_lat = statistics.median(run_to_start(m, empty, runs, remote=laptop_env))

        big = project(Path(tempfile.mkdtemp(prefix="monkey-bench-project-")))

        def submit(remote: bool) -> None:
            prefix = ["--remote", "lab"] if remote else []
            subprocess.run(
                [*MONKEY, *prefix, "run", "--workdir", str(big), "--", "true"],
                stdout=subprocess.DEVNULL,
                check=True,
                env=laptop_env if remote else None,
            )

        submit(True)  # the first upload
        before = blob_count(home)
        local_submit = median_wall(lambda: submit(False), runs)
        remote_submit = median_wall(lambda: submit(True), runs)
        added = blob_count(home) - before
    finally:
        stop()
        stop_everything(home)
    print(f"run -- true -> process start, local:   {local_lat * 1000:7.1f} ms")
    print(
        f"run -- true -> process start, remote:  {remote_lat * 1000:7.1f} ms "
        f"({remote_lat / local_lat:.2f}x local, target <= 1.5x)"
    )
    print(f"re-submit {FILES:,} files, local:        {local_submit * 1000:7.1f} ms")
    print(
        f"re-submit {FILES:,} files, remote:       {remote_submit * 1000:7.1f} ms "
        f"({remote_submit / local_submit:.2f}x local, target <= 2x); blobs added on the "
        f"server by {runs + 1} remote re-submits: {added} (target 0)"
    )


if __name__ == "__main__":
    main()
