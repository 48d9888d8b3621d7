"""The `kubernetes` provider (issue 45) against tests/fake_k8s.py and a registry on 127.0.0.1.

    python bench/k8s.py [N]    (N pods for figure 3, default 100)

1. Submit to first log line: with the core running and the image on the node already,
   `monkey run -p k8s --image REF -- echo first` (a new CLI process) until `first` is in the
   job's stdout.log, RUNS times one after another; the median, and the fake's own share
   (pod created -> its process started: what a kubelet does) beside it.
2. Preemption to the resumed pod's first line: a running job's pod evicted (node pressure:
   the kubelet's SIGTERM to monkey's agent in the pod), until the next attempt's first line
   is in its stdout.log, RUNS_PREEMPT times; the median.
3. Watch, not polling: the API requests monkey makes per minute while N pods run (a
   `sleep`), counted by the fake over a window, against what polling each pod every 5 s
   would make (N * 12 per minute). Target: a constant, whatever N (one watch; each pod's
   relay to its agent is one exec kept open).
"""

from __future__ import annotations

import base64
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import MONKEY, REPO, fresh_home, stop_everything

sys.path.insert(0, str(REPO / "tests"))
import fake_k8s  # noqa: E402
import registry  # noqa: E402

RUNS = 11
RUNS_PREEMPT = 5
PODS = int(sys.argv[1]) if len(sys.argv) > 1 else 100
WINDOW = 30.0


def cli(project: str, *args: str) -> str:
    return subprocess.run(
        [*MONKEY, *args], capture_output=True, text=True, check=True, cwd=project
    ).stdout.strip()


def main() -> None:
    home = fresh_home()
    work = Path(tempfile.mkdtemp(prefix="monkey-bench-k8s-"))
    reg, reg_proc = registry.start(work / "registry")
    login = base64.b64encode(f"{registry.USER}:{registry.PASSWORD}".encode()).decode()
    fake = fake_k8s.FakeK8s(work / "k8s", ca=reg.ca, node_auths={reg.host: {"auth": login}})
    project = str(work / "project")
    Path(project).mkdir()
    try:
        reg.push("lab/py:1", {}, python=True)  # monkey's agent runs in the pod with python3
        fake.add_node("node-a", cpus=PODS + 4, memory="512Gi")
        kubeconfig = fake_k8s.kubeconfig(fake, work / "kubeconfig")
        cli(project, "provider", "add", "kubernetes", "k8s", "--kubeconfig", str(kubeconfig))
        subprocess.run(
            [*MONKEY, "registry", "login", reg.host, "--username", registry.USER,
             "--password-stdin", "--ca-file", str(reg.ca)],
            input=registry.PASSWORD, text=True, check=True, capture_output=True, cwd=project,
        )  # fmt: skip
        ref = f"{reg.host}/lab/py:1"
        first = cli(project, "run", "-p", "k8s", "--image", ref, "--", "echo", "warm")
        wait_log(home, first, "warm", 60)  # the core up, the image on the node

        totals, kubelet = [], []
        for _ in range(RUNS):
            began = time.perf_counter()
            juid = cli(project, "run", "-p", "k8s", "--image", ref, "--", "echo", "first")
            wait_log(home, juid, "first", 60)
            totals.append(time.perf_counter() - began)
            kubelet.append(fake.last_start_delay)
        print(
            f"submit -> first log line: median {statistics.median(totals) * 1000:.0f} ms over "
            f"{RUNS} jobs (the fake's own pod created -> process started: median "
            f"{statistics.median(kubelet) * 1000:.0f} ms)"
        )

        resumed = []
        for _ in range(RUNS_PREEMPT):
            juid = cli(project, "run", "-p", "k8s", "--image", ref, "--", "sh", "-c",
                       "echo attempt $MONKEY_ATTEMPT; exec sleep 600")  # fmt: skip
            wait_log(home, juid, "attempt 1", 60)
            pod = fake.created[-1]["metadata"]["name"]
            began = time.perf_counter()
            fake.evict(pod, "default", "pressure")
            wait_log(home, juid, "attempt 2", 120, attempt=2)
            resumed.append(time.perf_counter() - began)
            cli(project, "job", "cancel", juid)
        print(
            f"preemption -> the resumed pod's first log line: median "
            f"{statistics.median(resumed) * 1000:.0f} ms over {RUNS_PREEMPT} evictions"
        )

        juids = [
            cli(
                project,
                "run",
                "-p",
                "k8s",
                "--image",
                ref,
                "--",
                "sh",
                "-c",
                "echo up; exec sleep 600",
            )  # fmt: skip
            for _ in range(PODS)
        ]
        for juid in juids:  # every pod running, its agent relayed
            wait_log(home, juid, "up", 600)
        time.sleep(2)
        before = len(fake.requests)
        time.sleep(WINDOW)
        made = fake.requests[before:]
        per_minute = len(made) * 60 / WINDOW
        kinds: dict[str, int] = {}
        for request in made:
            key = request.split("?")[0]
            kinds[key] = kinds.get(key, 0) + 1
        print(
            f"{len(fake.procs)} pods running: {per_minute:.1f} API requests per minute "
            f"({', '.join(f'{n} {k}' for k, n in sorted(kinds.items())) or 'none'} in "
            f"{WINDOW:.0f} s; the watch is one open request, re-opened every 5 minutes, and "
            f"each pod's relay one exec kept open), "
            f"against {PODS * 12} per minute polling each pod every 5 s"
        )
    finally:
        stop_everything(home)
        fake.close()
        reg_proc.kill()
        reg_proc.wait()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(home.parent, ignore_errors=True)


def wait_log(home: Path, juid: str, text: str, timeout: float, attempt: int = 1) -> None:
    path = home / "runs" / juid / str(attempt) / "stdout.log"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if text in path.read_text():
                return
        except OSError:
            pass
        time.sleep(0.005)
    raise SystemExit(f"{juid}: no {text!r} in its log within {timeout:.0f} s")


if __name__ == "__main__":
    main()
