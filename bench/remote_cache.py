"""What bounding a remote's blob cache on the laptop costs (`monkey server` on loopback, TLS),
in the same run:

- the trim each command ends with, on a cache of a 5,000-file project that is under its
  limit (the common case), against re-submitting that unchanged project;
- re-submitting the project after its blobs were all evicted (the files read and copied
  into the cache again, nothing uploaded), against re-submitting it unchanged and against
  submitting it from a new cache (another laptop's: the same reads, nothing uploaded).

`python bench/remote_cache.py [RUNS]` (default 15, medians).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import MONKEY, fresh_home, median_wall, start_main_node, stop_everything
from remote_submit import FILES, blob_count, project


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 15
    home = fresh_home()
    laptop_env, stop = start_main_node(home)
    try:
        big = project(Path(tempfile.mkdtemp(prefix="monkey-bench-project-")))

        def submit(**env: str) -> None:
            subprocess.run(
                [*MONKEY, "--remote", "lab", "run", "--workdir", str(big), "--", "true"],
                stdout=subprocess.DEVNULL,
                check=True,
                env={**laptop_env, **env},
            )

        submit()  # the first upload
        before = blob_count(home)
        unchanged = median_wall(submit, runs)
        trim = _trim_time(laptop_env, runs)

        times = []
        for _ in range(runs):
            submit(MONKEY_REMOTE_CACHE_MAX="0")  # ends with every blob of the cache gone
            t = time.perf_counter()
            submit()
            times.append(time.perf_counter() - t)
        again = statistics.median(times)
        fresh = []
        for _ in range(runs):
            t = time.perf_counter()
            submit(XDG_CACHE_HOME=tempfile.mkdtemp(prefix="monkey-bench-cache-"))
            fresh.append(time.perf_counter() - t)
        new_cache = statistics.median(fresh)
        added = blob_count(home) - before
    finally:
        stop()
        stop_everything(home)
    print(f"re-submit {FILES:,} files, unchanged:      {unchanged * 1000:7.1f} ms")
    print(
        f"trim of its cache (under the limit): {trim * 1000:7.1f} ms "
        f"({trim / unchanged:.1%} of the re-submit)"
    )
    print(f"submit from a new cache:             {new_cache * 1000:7.1f} ms")
    print(
        f"re-submit after a full eviction:     {again * 1000:7.1f} ms "
        f"({again / unchanged:.2f}x the unchanged re-submit, {again / new_cache:.2f}x a new "
        f"cache's); blobs added on the server: {added} (target 0)"
    )


def _trim_time(laptop_env: dict[str, str], runs: int) -> float:
    """Median time of the trim a command ends with, in a process of its own over the
    laptop's cache (as a command runs it: the lease taken, the blobs counted)."""
    code = (
        "import os, statistics, sys, time\n"
        "from monkey.config import Home\n"
        "from monkey.remote.cache import Cache\n"
        "from monkey.store import Store\n"
        "c = Cache('lab'); store = Store(Home(c.root).db); times = []\n"
        f"for _ in range({runs}):\n"
        "    t = time.perf_counter(); c.trim(store); times.append(time.perf_counter() - t)\n"
        "print(statistics.median(times))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**laptop_env, "PYTHONPATH": os.environ["PYTHONPATH"]},
        capture_output=True,
        text=True,
        check=True,
    )
    return float(out.stdout)


if __name__ == "__main__":
    main()
