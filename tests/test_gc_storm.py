"""The gc storm (issue 24): submissions of overlapping projects, `rm` and `gc --grace 0s` run
in loops at once, each killed at random instants; at the end every remaining job's blobs
verify, every job that ran ran its own code, and `clone` reproduces the files of every job
whose submission said it was accepted. `pytest -s` prints rounds / kills / jobs checked /
blobs missing or damaged (which must be 0). MONKEY_GC_STORM_SECONDS sets its length."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from conftest import wait_for

from monkey.models import MonkeyError
from monkey.rerun import check_blobs
from monkey.snapshot import BlobDamaged, BlobStore
from monkey.store import Store

SECONDS = float(os.environ.get("MONKEY_GC_STORM_SECONDS", "60"))
# Checks that its files are the ones listed (by sha256) in files.json: the code it was given.
MAIN = """\
import hashlib, json, os
listed = json.load(open("files.json"))
found = {}
for folder, _dirs, names in os.walk("."):
    for name in names:
        rel = os.path.relpath(os.path.join(folder, name), ".")
        if rel not in ("files.json", "main.py"):
            found[rel] = hashlib.sha256(open(rel, "rb").read()).hexdigest()
assert found == listed, (sorted(set(found) ^ set(listed)), len(found), len(listed))
print("ok")
"""


class Storm:
    """The loops' shared record: what was accepted, what ran, what was killed."""

    def __init__(self, root: Path, seed: int) -> None:
        self.root = root
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.accepted: dict[str, dict[str, bytes]] = {}  # juid -> its files as submitted
        self.removed: set[str] = set()
        self.maybe_removed: set[str] = set()  # named by an rm killed midway: it may have ended
        self.rounds = self.kills = 0
        self.errors: list[str] = []

    def command(
        self, args: list[str], kill_chance: float, kill_within: float
    ) -> tuple[int | None, str, str]:
        """Run `monkey ARGS`; with KILL_CHANCE, SIGKILL it at a random instant within
        KILL_WITHIN seconds. (exit code or None when killed, stdout, stderr)."""
        with self.lock:
            kill_at = self.rng.uniform(0, kill_within) if self.rng.random() < kill_chance else None
        proc = subprocess.Popen(
            [sys.executable, "-m", "monkey", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=os.environ.copy(),
        )
        if kill_at is not None:
            try:
                out, err = proc.communicate(timeout=kill_at)
                return proc.returncode, out, err
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
                proc.communicate()
                with self.lock:
                    self.kills += 1
                return None, "", ""
        out, err = proc.communicate(timeout=300)
        return proc.returncode, out, err


def write_project(folder: Path, rng: random.Random) -> dict[str, bytes]:
    """Make FOLDER one version of an overlapping project: shared files in one of three
    variants each (the same bytes across projects), a few of its own; its files."""
    for old in folder.rglob("*"):
        if old.is_file():
            old.unlink()
    files: dict[str, bytes] = {}
    for i in range(40):
        files[f"common/c{i}.py"] = f"# shared {i} variant {rng.randrange(3)}\n".encode() * 20
    for i in range(rng.randrange(1, 6)):
        files[f"own/o{i}.bin"] = os.urandom(rng.choice([10, 5000, 200_000]))
    files["data/big.bin"] = bytes([rng.randrange(3)]) * (2 << 20)  # shared, 1 of 3
    for rel, data in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    listed = {rel: hashlib.sha256(data).hexdigest() for rel, data in files.items()}
    (folder / "files.json").write_text(json.dumps(listed))
    (folder / "main.py").write_text(MAIN)
    return {**files, "files.json": (folder / "files.json").read_bytes(), "main.py": MAIN.encode()}


def submitter(storm: Storm, folder: Path) -> None:
    rng = random.Random(storm.rng.random())
    while not storm.stop.is_set():
        files = write_project(folder, rng)
        code, out, err = storm.command(
            ["run", "--workdir", str(folder), "--", "python3", "main.py"],
            kill_chance=0.3,
            kill_within=2.0,
        )
        with storm.lock:
            storm.rounds += 1
            if code == 0:
                storm.accepted[out.strip()] = files
            elif code is not None:
                storm.errors.append(f"run exited {code}: {err.strip()}")


def remover(storm: Storm) -> None:
    while not storm.stop.wait(1.0):
        with storm.lock:
            candidates = sorted(set(storm.accepted) - storm.removed - storm.maybe_removed)
            picked = storm.rng.sample(candidates, min(len(candidates), storm.rng.randrange(1, 3)))
        if not picked:
            continue
        code, _out, err = storm.command(["rm", "--yes", *picked], kill_chance=0.3, kill_within=0.6)
        with storm.lock:
            if code == 0:
                storm.removed.update(picked)
            elif code is None:  # killed after its deletion committed, or before: not named again
                storm.maybe_removed.update(picked)
            elif code is not None and "cancel it first" not in err:  # one not ended yet: kept
                storm.errors.append(f"rm exited {code}: {err.strip()}")


def collector(storm: Storm) -> None:
    while not storm.stop.wait(0.1):
        code, _out, err = storm.command(["gc", "--grace", "0s"], kill_chance=0.5, kill_within=1.0)
        if code not in (0, None):
            with storm.lock:
                storm.errors.append(f"gc exited {code}: {err.strip()}")


def tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_gc_storm(cli, home: Path, tmp_path: Path) -> None:
    seed = int(os.environ.get("MONKEY_GC_STORM_SEED", time.time_ns() % 1_000_000))
    storm = Storm(tmp_path, seed)
    projects = [tmp_path / f"project{i}" for i in range(2)]
    for folder in projects:
        folder.mkdir()
    threads = [threading.Thread(target=submitter, args=(storm, f)) for f in projects]
    threads += [
        threading.Thread(target=remover, args=(storm,)),
        threading.Thread(target=collector, args=(storm,)),
    ]
    for t in threads:
        t.start()
    time.sleep(SECONDS)  # the storm's length; what it checks comes after
    storm.stop.set()
    for t in threads:
        t.join()
    assert not storm.errors, storm.errors[:5]

    # Every job left ends (none fails for want of its code), then every one is checked.
    store = Store(home / "monkey.db")
    blobs = BlobStore(home / "blobs")
    try:
        wait_for(
            lambda: all(j.state.value in ("succeeded", "failed") for j in store.list_jobs()),
            timeout=300,
            every=0.5,
            what="every job to end",
        )
        jobs = store.list_jobs()
        bad_blobs = 0
        failed = []
        for job in jobs:
            try:
                check_blobs(blobs, job, store.job_spec(job.juid), git=True)
            except BlobDamaged:
                bad_blobs += 1
            except MonkeyError:
                bad_blobs += 1
            if job.state.value != "succeeded":
                failed.append((job.juid, job.to_json().get("reason")))
        cloned = 0
        wrong: list[tuple[str, str]] = []  # clones that failed or differ from what was submitted
        (tmp_path / "clones").mkdir()
        for juid, files in storm.accepted.items():
            if juid in storm.removed or store.get_job(juid) is None:
                continue
            dest = tmp_path / "clones" / juid
            done = cli("clone", juid, "--to", str(dest))
            if done.returncode != 0 or tree(dest) != files:
                wrong.append((juid, done.stderr.strip()))
            cloned += 1
    finally:
        store.close()
    print(
        f"\ngc storm (seed {seed}, {SECONDS:.0f}s): rounds {storm.rounds} / kills {storm.kills} / "
        f"jobs checked {len(jobs)} (cloned {cloned}, wrong {len(wrong)}) / "
        f"blobs missing or damaged {bad_blobs}"
    )
    assert bad_blobs == 0
    assert not wrong, wrong[:5]
    assert not failed, failed[:5]
    assert cli("verify", check=True).returncode == 0
    assert jobs and cloned and storm.kills, "the storm did not exercise anything"
