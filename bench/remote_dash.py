"""The dashboard's reads through a remote (`monkey server` on loopback, TLS) against the same
reads of this machine's store, in the same run, with 10,000 jobs in the server's store: the
first screen (200 newest jobs), a full read (the start, and the re-read every 30 s) and one
idle poll (what the dashboard reads each second when nothing changed).

`python bench/remote_dash.py [REPEAT]` (default 21 runs each, medians).
"""

from __future__ import annotations

import os
import sys
import time

from common import copy_jobs, fresh_home, median_wall, start_main_node, stop_everything

N = 10_000


def idle_poll(m) -> None:
    """The reads of one poll of the dashboard that finds nothing changed (monkey.tui.app):
    through a remote, the jobs changed and one call for the rest."""
    now = time.time()
    m.jobs_changed(now)
    m.latest_metrics([])
    if hasattr(m, "store"):
        {name: (cfg.type, dict(cfg.options)) for name, cfg in m.providers.items()}
        m.core_status()
        m.live_attempts()
        m.instances()
        m.monkey_instances(now)
    else:
        m.dashboard_state(now)


def main() -> None:
    repeat = int(sys.argv[1]) if len(sys.argv) > 1 else 21
    home = fresh_home()
    from monkey.api import Monkey

    local = Monkey(home)
    job = local.run(["true"], start_core=False)
    copy_jobs(
        local,
        job.juid,
        [
            {
                "juid": f"25-01-{1 + i // 9000:02d}-{i % 9000 + 1:04d}",
                "state": ("succeeded", "failed", "cancelled")[i % 3],
            }
            for i in range(N)
        ],
    )
    laptop_env, stop = start_main_node(home)
    try:
        for name in ("HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME"):
            os.environ[name] = laptop_env[name]
        from monkey.remote.facade import RemoteMonkey

        remote = RemoteMonkey("lab")
        time.sleep(1)
        figures = []
        for what, fn, times in (
            ("first screen, jobs(limit=200)", lambda m: m.jobs(limit=200), repeat),
            (f"full read, jobs() of {N + 1}", lambda m: m.jobs(), max(3, repeat // 4)),
            ("idle poll", idle_poll, repeat),
        ):
            here = median_wall(lambda fn=fn: fn(local), times)
            there = median_wall(lambda fn=fn: fn(remote), times)
            figures.append((what, here, there))
        remote.close()
    finally:
        stop()
        stop_everything(home)
    for what, here, there in figures:
        print(
            f"{what:32} local {here * 1000:8.1f} ms  remote {there * 1000:8.1f} ms  "
            f"({there / here:.1f}x)"
        )


if __name__ == "__main__":
    main()
