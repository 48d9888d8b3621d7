"""``monkey.log`` in a job on an SSH host (tests/sshd.py, loopback) against the same job on
the local provider, measured in this same run.

The job calls ``monkey.log("loss", x, step=i)`` N times (1,000,000 by default) and prints
its own per-call cost. On the host its python has no monkey installed: ``import monkey`` is
the in-job API the agent ships (shim.py + track.py); locally it is the installed package.
Both run the system's python3 (the host's user may not reach another). Each side runs
3 times, interleaved; the figure is the median per-call cost of each and their ratio.
Target: the host within 1.5x of local, and every point of every job stored.

Usage: python bench/log_remote.py [N]   (as root it uses a throw-away `monkeyssh` user)
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml
from common import REPO, fresh_home, stop_everything

sys.path.insert(0, str(REPO / "tests"))  # the test fixtures' sshd lab
from sshd import Lab  # noqa: E402

N = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
RUNS = 3
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else "python3"
JOB = f"""\
import json, sys, time
import monkey
log = monkey.log
t = time.perf_counter()
for i in range({N}):
    log("loss", i * 1e-6, step=i)
per_call = (time.perf_counter() - t) / {N} * 1e9
print(json.dumps({{"per_call_ns": per_call, "module": monkey.__file__}}))
"""


def stored(m, juid: str) -> int:
    return len(m.metrics(juid).get("loss", []))


def one(m, provider: str) -> tuple[float, str]:
    job = m.run([PYTHON, "job.py"], provider=provider)
    if job.wait(600).value != "succeeded":
        raise SystemExit(f"the {provider} job failed: {m.info(job.juid)}")
    deadline = time.monotonic() + 120
    while (count := stored(m, job.juid)) < N:
        if time.monotonic() > deadline:
            raise SystemExit(f"{provider}: {count} of {N} points stored")
        time.sleep(0.1)
    if count != N:
        raise SystemExit(f"{provider}: {count} points stored, {N} logged")
    out = json.loads("".join(job.logs()).strip().splitlines()[-1])
    return out["per_call_ns"], out["module"]


def main() -> None:
    client = Path(tempfile.mkdtemp(prefix="monkey-bench-client-"))
    os.environ["HOME"] = str(client)
    os.environ.pop("SSH_AUTH_SOCK", None)
    lab = Lab(client)
    home = fresh_home()
    project = Path(tempfile.mkdtemp())
    os.chdir(project)
    (project / "job.py").write_text(JOB)
    try:
        host = lab.add("h1")
        from monkey.api import Monkey
        from monkey.config import Home
        from monkey.core import daemon

        home.mkdir(parents=True, exist_ok=True)
        providers = {"lab": {"type": "ssh", "hosts": [host.entry(key=lab.key)]}}
        (home / "providers.yml").write_text(yaml.safe_dump({"providers": providers}))
        daemon.start(Home(home))
        m = Monkey(home)
        m.run(["true"], provider="lab").wait(120)  # first contact: the agent's install, not timed
        times: dict[str, list[float]] = {"local": [], "lab": []}
        modules = {}
        for _ in range(RUNS):
            for provider in times:
                ns, modules[provider] = one(m, provider)
                times[provider].append(ns)
        local, remote = (statistics.median(times[p]) for p in ("local", "lab"))
        print(f"monkey.log x {N:,} per job, {RUNS} jobs each, all points stored")
        for provider, label in (("local", "local provider"), ("lab", "SSH host")):
            runs = ", ".join(f"{t:.0f}" for t in times[provider])
            print(
                f"  {label:15} {statistics.median(times[provider]):6.0f} ns/call "
                f"(runs {runs}; monkey from {modules[provider]})"
            )
        print(f"  SSH host / local: {remote / local:.2f}x (target: at most 1.5x)")
    finally:
        stop_everything(home)
        lab.close()
        os.chdir("/")
        for folder in (client, home.parent, project):  # ~450 MB of points per run
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
