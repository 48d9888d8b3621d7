"""The `ssh` provider against three real sshd "hosts" on loopback (tests/sshd.py).

1. 200 trivial jobs across 3 SSH hosts (2 slots each), from the first submission until all
   have finished, against the same 200 jobs on the local provider with 6 slots, measured
   here in the same run. Target: at most 3x local.
2. A dataset (500 MB by default) used by a second job on the same host: bytes the client
   put on the wire for the second job, against the dataset's size. Target: no dataset bytes.
3. A 5,000-file codebase with one file changed between two jobs: blobs and bytes sent for
   the second job. Target: that one file.
4. The SSH link cut mid-job and restored: seconds from the link returning until `follow`
   yields output again, and lines lost or doubled. Target: within 2 s, none.

Usage: python bench/ssh.py [N_JOBS] [DATASET_MB]   (as root it uses a throw-away `monkeyssh` user)
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml
from common import REPO, fresh_home, stop_everything

sys.path.insert(0, str(REPO / "tests"))  # the test fixtures' sshd lab and its helpers
from sshd import Lab  # noqa: E402

N = int(sys.argv[1]) if len(sys.argv) > 1 else 200
DATASET_MB = int(sys.argv[2]) if len(sys.argv) > 2 else 500


def start(home: Path, providers: dict) -> object:
    from monkey.api import Monkey
    from monkey.config import Home
    from monkey.core import daemon

    home.mkdir(parents=True, exist_ok=True)
    (home / "providers.yml").write_text(yaml.safe_dump({"providers": providers}))
    daemon.start(Home(home))
    return Monkey(home)


def wait_done(m, juids: list[str], timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while True:
        done = m.store.count_jobs()
        if not any(done.get(s, 0) for s in ("queued", "dispatching", "running")):
            failed = [j for j in juids if m.job(j).status.value != "succeeded"]
            if failed:
                raise SystemExit(f"{len(failed)} jobs did not succeed, e.g. {m.info(failed[0])}")
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out: {done}")
        time.sleep(0.005)


def many_jobs(provider: str, providers: dict) -> float:
    home = fresh_home()
    os.chdir(tempfile.mkdtemp())
    m = start(home, providers)
    try:
        m.run(["true"], provider=provider).wait(120)  # first contact / agent start not timed
        t = time.perf_counter()
        juids = [m.run(["true"], provider=provider).juid for _ in range(N)]
        wait_done(m, juids)
        return time.perf_counter() - t
    finally:
        stop_everything(home)


def sent_blobs(home: Path) -> list[tuple[int, int]]:
    """(blobs, bytes) of every `sent N blobs` line of the daemon's log."""
    text = (home / "daemon.log").read_text()
    return [(int(a), int(b)) for a, b in re.findall(r"sent (\d+) blobs, (\d+) bytes", text)]


def sync_figures(lab: Lab, key: str) -> None:
    host = lab.hosts[0]
    home = fresh_home()
    project = Path(tempfile.mkdtemp())
    os.chdir(project)
    m = start(home, {"lab": {"type": "ssh", "hosts": [host.entry(key=key)]}})
    try:
        data = project / "data"
        data.mkdir()
        with open(data / "big.bin", "wb") as fh:
            for _ in range(DATASET_MB):
                fh.write(os.urandom(1 << 20))
        (project / ".monkeyignore").write_text("data/\n")
        m.run(["true"], provider="lab", datasets=["data"]).wait(600)
        before = host.relay.sent
        m.run(["true"], provider="lab", datasets=["data"]).wait(600)
        wire = host.relay.sent - before
        print(
            f"dataset {DATASET_MB} MB, second job on the same host: {wire / 1e3:.1f} kB on the "
            f"wire in all (target: no dataset bytes; first job sent "
            f"{sent_blobs(home)[-1][1] / 1e6:.0f} MB)"
        )

        code = project / "code"
        for i in range(5000):
            sub = code / f"pkg{i // 100}"
            sub.mkdir(parents=True, exist_ok=True)
            (sub / f"mod{i}.py").write_text(f"VALUE = {i}\n")
        os.chdir(code)
        m.run(["true"], provider="lab").wait(600)
        first = sent_blobs(home)[-1]
        (code / "pkg7" / "mod700.py").write_text("VALUE = 'changed'\n")
        before, logged = host.relay.sent, len(sent_blobs(home))
        m.run(["true"], provider="lab").wait(600)
        wire = host.relay.sent - before
        second = sent_blobs(home)[logged:]
        print(f"5,000-file codebase, first job: {first[0]} blobs, {first[1] / 1e3:.0f} kB")
        print(
            f"one file changed, second job: {sum(b for b, _ in second)} blob(s), "
            f"{sum(n for _, n in second)} bytes of blobs, {wire / 1e3:.1f} kB on the wire in all "
            f"(target: that file only)"
        )
    finally:
        stop_everything(home)


def cut_and_restore(lab: Lab, key: str) -> None:
    host = lab.hosts[1]
    home = fresh_home()
    os.chdir(tempfile.mkdtemp())
    Path("count.py").write_text(
        "import time\nfor i in range(300):\n    print(f'line {i:04d}', flush=True)\n"
        "    time.sleep(0.02)\n"
    )
    m = start(home, {"lab": {"type": "ssh", "hosts": [host.entry(key=key)]}})
    try:
        job = m.run(["python3", "count.py"], provider="lab")
        chunks: list[tuple[float, bytes]] = []

        def follow() -> None:
            for chunk in m.follow(job.juid):
                chunks.append((time.monotonic(), chunk))

        reader = threading.Thread(target=follow)
        reader.start()
        while not chunks:
            time.sleep(0.01)
        time.sleep(1)
        host.cut()
        time.sleep(2)
        restored = time.monotonic()
        host.restore()
        reader.join(120)
        back = min(t for t, _ in chunks if t > restored) - restored
        text = b"".join(c for _, c in chunks).decode()
        expected = "".join(f"line {i:04d}\n" for i in range(300))
        lines = text.splitlines()
        lost = len(set(expected.splitlines()) - set(lines))
        doubled = len(lines) - len(set(lines))
        print(
            f"link cut 2 s mid-job: follow output back {back:.2f} s after the link returned "
            f"(target <= 2 s); {lost} lines lost, {doubled} doubled, identical: {text == expected}"
        )
    finally:
        stop_everything(home)


def main() -> None:
    lab = Lab(Path(tempfile.mkdtemp(prefix="monkey-bench-client-")))
    os.environ["HOME"] = str(lab.ssh_dir.parent)
    os.environ.pop("SSH_AUTH_SOCK", None)
    try:
        hosts = [lab.add(f"h{i}") for i in range(3)]
        ssh = {"lab": {"type": "ssh", "hosts": [h.entry(key=lab.key, cpus=2) for h in hosts]}}
        remote = many_jobs("lab", ssh)
        local = many_jobs("local", {"local": {"type": "local", "slots": 6}})
        print(f"{N} trivial jobs, 6 slots")
        print(f"local provider (6 slots):    {local:6.2f} s")
        print(
            f"3 SSH hosts (2 slots each):  {remote:6.2f} s  ({remote / local:.1f}x local, "
            f"target <= 3x)"
        )
        sync_figures(lab, lab.key)
        cut_and_restore(lab, lab.key)
    finally:
        lab.close()


if __name__ == "__main__":
    main()
