"""A full disk, then freed (issue 46 item 4): MONKEY_HOME on its own 30 MB tmpfs (needs root),
one slot of two taken by a job whose output fills the disk and one by a job held by a gate,
QUEUED jobs behind them. Once the disk is full: SUBMITS `monkey run`s, each of which must be
refused in one line with nothing written; then the gate opens, the queued jobs must wait for
disk, and the filler's output is deleted: every queued job must start by itself and succeed.
Prints submissions refused cleanly, queued jobs started after space returned, jobs failed,
and the seconds from the space's return to the last queued job's end.
`python bench/disk_full.py [QUEUED] [SUBMITS]` (default 5 and 10)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main(queued: int = 5, submits: int = 10) -> None:
    top = Path(tempfile.mkdtemp(prefix="monkey-disk-full-"))
    disk, work = top / "disk", top / "project"
    disk.mkdir()
    work.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=30m", "tmpfs", str(disk)], check=True)
    home = disk / "mh"
    env = {**os.environ, "MONKEY_HOME": str(home), "PYTHONPATH": str(REPO)}

    def monkey(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "monkey", *args],
            capture_output=True,
            text=True,
            env=env,
            cwd=work,
            timeout=120,
        )

    def jobs() -> dict[str, dict[str, object]]:
        listed = json.loads(monkey("list", "jobs", "--all", "--json").stdout)["jobs"]
        return {j["job"]: j for j in listed}

    def wait(predicate, what: str, timeout: float = 120) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise SystemExit(f"timed out waiting for {what}")
            time.sleep(0.2)

    try:
        home.mkdir()
        (home / "providers.yml").write_text("providers:\n  local: {type: local, slots: 2}\n")
        gate = work / "gate"
        (work / "train.py").write_text("print('trained')\n")
        go = work / "go"
        fill = f"while [ ! -e {go} ]; do sleep 0.05; done; yes xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
        filler_id = monkey("run", "--", "sh", "-c", fill).stdout.strip()
        held = monkey("run", "--", "sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done")
        waiting = [monkey("run", "--", "python3", "train.py").stdout.strip() for _ in range(queued)]
        assert all(waiting), "a job was refused before the disk filled"
        go.touch()
        wait(lambda: jobs()[filler_id]["state"] == "failed", "the disk to fill")

        before_jobs, blobs = len(jobs()), sorted((home / "blobs").rglob("*"))
        (work / "train.py").write_text("print('a new version')\n")
        refused = 0
        for _ in range(submits):
            out = monkey("run", "--", "python3", "train.py")
            lines = out.stderr.strip().splitlines()
            refused += (
                out.returncode != 0
                and len(lines) == 1
                and "disk full at" in lines[0]
                and "bytes free" in lines[0]
            )
        clean = len(jobs()) == before_jobs and sorted((home / "blobs").rglob("*")) == blobs

        gate.touch()
        wait(lambda: jobs()[held.stdout.strip()]["state"] == "succeeded", "the gated job")
        wait(  # (before issue 46, they failed at once instead)
            lambda: (
                "waiting for disk" in monkey("list", "jobs").stdout
                or all(jobs()[j]["state"] in ("succeeded", "failed") for j in waiting)
            ),
            "the jobs to wait",
        )
        for log in (home / "runs" / filler_id).rglob("stdout.log"):
            log.unlink()  # the user deletes the output that filled the disk
        freed = time.monotonic()
        wait(
            lambda: all(jobs()[j]["state"] in ("succeeded", "failed") for j in waiting),
            "the queued jobs to end",
        )
        took = time.monotonic() - freed
        listed = jobs()
        started = sum(listed[j]["state"] == "succeeded" for j in waiting)
        failed = sum(j["state"] == "failed" for j in listed.values()) - 1  # but the filler
        print(
            f"submissions refused cleanly: {refused}/{submits} (nothing written: {clean}); "
            f"queued jobs started after space returned: {started}/{queued}; "
            f"failed besides the filler: {failed}; all ended {took:.1f}s after space returned"
        )
    finally:
        monkey("daemon", "stop")
        try:  # the agent, which would stay idle for minutes
            os.kill(int((home / "private" / "agent.pid").read_text()), signal.SIGTERM)
        except (OSError, ValueError):
            pass
        subprocess.run(["umount", "-l", str(disk)], check=False)
        shutil.rmtree(top, ignore_errors=True)


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
