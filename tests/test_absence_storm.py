"""An absence storm (issue 24): jobs of random length on this machine and on an SSH host
while the core goes away (SIGKILL or `daemon stop`) for random periods, several longer than
a lowered heartbeat timeout, and the host's sshd is frozen (SIGSTOP) at random. Every job
must run exactly once, keep every log byte, end, and none may be lost."""

from __future__ import annotations

import collections
import random
import threading
import time
from pathlib import Path

import test_absence
import yaml
from conftest import core_pid, start_core, wait_for
from test_absence import TIMEOUT, stall, unstall  # most absences and stalls last longer
from test_fault_storm import _kill

from monkey.config import Home
from monkey.core import daemon
from monkey.models import TERMINAL, State
from tests.sshd import Lab, SSHHost

JOBS = 200
LONGEST = 20.0  # seconds a job sleeps at most (0.1 at least)
STORM_SECONDS = 75.0
lab = test_absence.lab  # SSH hosts on loopback, MONKEY_HEARTBEAT_TIMEOUT set to TIMEOUT


class Tally:
    """Counts and total seconds of the faults the storm made."""

    def __init__(self) -> None:
        self.count: collections.Counter[str] = collections.Counter()
        self.seconds: collections.Counter[str] = collections.Counter()
        self.long = 0  # core absences longer than the heartbeat timeout

    def add(self, kind: str, seconds: float) -> None:
        self.count[kind] += 1
        self.seconds[kind] += seconds


def _core_away(home: Path, rng: random.Random, tally: Tally, stop: threading.Event) -> None:
    """Stop the core (SIGKILL or `daemon stop`) for 0.2-3x the heartbeat timeout, then
    start it again; until STOP is set."""
    while not stop.is_set():
        time.sleep(rng.uniform(1.0, 4.0))
        began = time.monotonic()
        if rng.random() < 0.5:
            if not _kill(core_pid(home)):
                continue
            wait_for(lambda: core_pid(home) is None, what="the core to die")
            kind = "core SIGKILL"
        else:
            if not daemon.stop(Home(home)):
                continue
            kind = "core stop"
        time.sleep(rng.uniform(0.2, 3.0) * TIMEOUT)
        start_core(home)
        length = time.monotonic() - began
        tally.add(kind, length)
        tally.long += length > TIMEOUT


def _stalls(host: SSHHost, rng: random.Random, tally: Tally, stop: threading.Event) -> None:
    """Freeze the host's sshd for 0.2-3x the heartbeat timeout, now and then."""
    while not stop.is_set():
        time.sleep(rng.uniform(1.0, 6.0))
        began = time.monotonic()
        stall(host)
        try:
            time.sleep(rng.uniform(0.2, 3.0) * TIMEOUT)
        finally:
            unstall(host)
        tally.add("link stall", time.monotonic() - began)


def test_absence_storm(home: Path, lab: Lab, monkey) -> None:
    host = lab.add("h1")
    providers = {
        "local": {"type": "local", "slots": 16},
        "lab": {"type": "ssh", "connect_timeout": 3, "hosts": [host.entry(key=lab.key, cpus=16)]},
    }
    (home / "providers.yml").write_text(yaml.safe_dump({"providers": providers}))
    ledgers = {
        "local": Path("ledger").resolve(),
        "lab": host.dir / "ledger",
    }  # the host's user writes there
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    start_core(home)
    tally, stop = Tally(), threading.Event()
    threads = [
        threading.Thread(target=_core_away, args=(home, random.Random(seed + 1), tally, stop)),
        threading.Thread(target=_stalls, args=(host, random.Random(seed + 2), tally, stop)),
    ]
    for thread in threads:
        thread.start()
    jobs = []
    try:
        for i in range(JOBS):
            provider = "local" if i % 2 else "lab"
            script = (
                f'echo "$MONKEY_JUID" >> {ledgers[provider]}; echo "start $MONKEY_JUID"; '
                f'sleep {rng.uniform(0.1, LONGEST):.2f}; echo "end $MONKEY_JUID"'
            )
            jobs.append(
                monkey.run(["bash", "-c", script], provider=provider, retries=1, start_core=False)
            )
            time.sleep(STORM_SECONDS / 2 / JOBS)  # half the storm sees jobs arrive
        deadline = time.monotonic() + STORM_SECONDS / 2
        while time.monotonic() < deadline and not all(j.status in TERMINAL for j in jobs):
            time.sleep(0.5)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    start_core(home)
    for job in jobs:
        job.wait(timeout=180)

    runs = collections.Counter()
    for ledger in ledgers.values():
        runs.update(ledger.read_text().splitlines() if ledger.exists() else [])
    once = [j for j in jobs if runs.get(j.juid) == 1]
    complete = [j for j in jobs if j.logs() == f"start {j.juid}\nend {j.juid}\n"]
    lost = [
        j
        for j in jobs
        if any(a.reason and "unreachable" in a.reason for a in j.attempts())
        or j.status == State.LOST
    ]
    stuck = [j for j in jobs if j.status not in TERMINAL]
    absences = tally.count["core SIGKILL"] + tally.count["core stop"]
    away = tally.seconds["core SIGKILL"] + tally.seconds["core stop"]
    print(
        f"\nabsence storm (seed {seed}): jobs {len(jobs)} / ran exactly once {len(once)} / "
        f"logs byte-complete {len(complete)} / lost {len(lost)} / stuck {len(stuck)}; "
        f"core absences {absences} ({tally.count['core SIGKILL']} SIGKILL, "
        f"{tally.count['core stop']} daemon stop; {tally.long} longer than the "
        f"{TIMEOUT:.0f}s heartbeat timeout), {away:.0f}s in all; link stalls "
        f"{tally.count['link stall']}, {tally.seconds['link stall']:.0f}s in all"
    )
    assert tally.long >= 2 and tally.count["link stall"] > 0
    assert not stuck, [(j.juid, j.status) for j in stuck]
    assert [(j.juid, j.attempts()) for j in lost] == []
    assert [j.juid for j in jobs if runs.get(j.juid) != 1] == []
    assert [(j.juid, j.logs()) for j in jobs if j not in complete] == []
    assert [(j.juid, j.status) for j in jobs if j.status != State.SUCCEEDED] == []
    for job in jobs:
        ran = [a for a in job.attempts() if a.started_at is not None]
        assert len(ran) == 1, (job.juid, job.attempts())
