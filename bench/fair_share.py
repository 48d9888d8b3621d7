"""Fair share on a shared queue (issue 29): two owners, JOBS one-second jobs each, on a
local provider of 4 slots; the first owner's jobs are all queued before the second's. Each
second after the first 10, while both have jobs queued and every slot is busy, the share of
the running jobs each owner has is sampled (once one owner's queue is empty, the other takes
every slot, as it should). Target: every sample within 40-60%. `python bench/fair_share.py [JOBS]` (default 100).
"""

from __future__ import annotations

import sys
import tempfile
import time

from common import fresh_home, stop_everything

SLOTS = 4


def main() -> None:
    jobs = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    home = fresh_home()
    from monkey.api import Monkey
    from monkey.config import Home
    from monkey.core import daemon

    Home(home).ensure().providers_file.write_text(
        f"providers:\n  local: {{type: local, slots: {SLOTS}}}\n"
    )
    m = Monkey(home)
    project = tempfile.mkdtemp()
    daemon.start(Home(home))
    samples: list[float] = []
    try:
        m.run(["true"], workdir=project).wait(timeout=30)  # warm: the agent is up
        for owner in ("ana", "bob"):
            m.actor = owner
            for _ in range(jobs):
                m.run(["sleep", "1"], workdir=project)
        started = time.monotonic()
        while True:
            running = {o: int(u[3]) for (o, _), u in m.store.quota_use("local").items()}
            queued = m.store.count_jobs().get("queued", 0)
            if not queued:
                break
            both = len(m.store.queued_owners()) == 2  # a share is fair while both wait
            if time.monotonic() - started >= 10 and both and sum(running.values()) == SLOTS:
                samples.append(running.get("ana", 0) / SLOTS)
            time.sleep(1)
    finally:
        stop_everything(home)
    inside = sum(0.4 <= s <= 0.6 for s in samples)
    print(
        f"two owners x {jobs} one-second jobs on {SLOTS} slots: {len(samples)} samples with "
        f"every slot busy; ana's share min {min(samples, default=0):.0%}, max "
        f"{max(samples, default=0):.0%}; {inside} of {len(samples)} within 40-60% "
        "(target: all)"
    )


if __name__ == "__main__":
    main()
