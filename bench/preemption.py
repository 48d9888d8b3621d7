"""Spot preemption on moto's server + a loopback sshd per instance address + a metadata
service per address (tests/imds.py), as tests/test_spot.py runs it:

1. A notice injected while a job runs → the job running again on a fresh instance. monkey's
   own time is the total minus the fake cloud's create call (measured alone, median) and
   minus the grace the job itself took to stop after SIGTERM. Parts: notice → SIGTERM (the
   agent's preempt-notice event), checkpoint upload (job exit → exit event), re-queue →
   instance created (less the create call), agent ready → job start. Median of ROUNDS.
2. Agent CPU on an idle instance over --seconds (default 60) while it polls the metadata
   every second, against the same agent not polling.

Prints figures; asserts nothing. Usage: python bench/preemption.py [--seconds 60] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from common import REPO, fresh_home

sys.path.insert(0, str(REPO / "tests"))  # the test fixtures: sshd lab, moto server, metadata
from imds import Metadata  # noqa: E402
from moto_server import CREDENTIALS, IMAGE, Moto, MotoServer  # noqa: E402
from sshd import Lab  # noqa: E402

TRAIN = """\
import json, os, signal, sys, time
path = os.path.join(os.environ["MONKEY_CHECKPOINT_DIR"], "state.json")
state = json.load(open(path)) if os.path.exists(path) else {"epoch": 0}
print("start at epoch", state["epoch"], flush=True)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
while state["epoch"] < 1000:
    time.sleep(0.1)
    state["epoch"] += 1
    with open(path + ".tmp", "w") as out:
        json.dump(state, out)
    os.replace(path + ".tmp", path)
"""


def monkey(*args: str) -> str:
    return subprocess.run(
        [sys.executable, "-m", "monkey", *args], capture_output=True, text=True, check=True
    ).stdout


def info(juid: str) -> dict[str, Any]:
    return json.loads(monkey("info", "job", juid, "--json"))


def wait(pred: Any, timeout: float = 120) -> Any:
    end = time.time() + timeout
    while time.time() < end:
        value = pred()
        if value:
            return value
        time.sleep(0.05)
    raise SystemExit("timed out")


def log_times(home: Path, pattern: str) -> list[tuple[float, str]]:
    """(epoch seconds, line) of daemon.log lines matching PATTERN."""
    out = []
    for line in (home / "daemon.log").read_text().splitlines():
        if re.search(pattern, line):
            stamp = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            out.append((stamp, line))
    return out


def run_events(lab: Lab, juid: str, n: int) -> tuple[dict[str, dict[str, Any]], Path]:
    """The agent's events of attempt N (by type, last wins) and its run dir on the host."""
    [events] = [
        p
        for h in lab.hosts
        for p in h.dir.rglob("events.jsonl")
        if p.parent.name == str(n) and p.parent.parent.name == juid
    ]
    found = {}
    for line in events.read_text().splitlines():
        event = json.loads(line)
        found[event["type"]] = event
    return found, events.parent


def recovery(rounds: int) -> None:
    home = fresh_home()
    client = Path(tempfile.mkdtemp(prefix="monkey-bench-client-"))
    os.environ.update(
        HOME=str(client),
        AWS_EC2_METADATA_DISABLED="true",
        **CREDENTIALS,
        AWS_CONFIG_FILE=str(client / "none"),
        AWS_SHARED_CREDENTIALS_FILE=str(client / "none"),
        MONKEY_HEARTBEAT="0.5",
        MONKEY_PREEMPT_GRACE="5",
    )
    os.environ.pop("SSH_AUTH_SOCK", None)
    server = MotoServer(Path(tempfile.mkdtemp(prefix="monkey-bench-moto-")))
    moto = Moto(server)
    lab = Lab(client)
    metadata: dict[str, Metadata] = {}
    project = Path(tempfile.mkdtemp(prefix="monkey-bench-project-"))
    os.chdir(project)
    try:
        config, port = "", 0
        for n in range(1, rounds + 3):
            host = lab.add(f"i{n}", trusted=False, address=f"127.0.0.{n + 3}", own_home=True)
            config += f"Host {host.address}\n    Port {host.port}\n"
            metadata[host.address] = Metadata(host.address, port)
            port = metadata[host.address].port
        (lab.ssh_dir / "config").write_text(config)
        monkey(
            "provider",
            "add",
            "aws",
            "aws",
            "--endpoint",
            moto.endpoint,
            "--region",
            "us-east-1",
            "--size",
            "t3.micro",
            "--image",
            IMAGE,
            "--subnet-cidr",
            "127.0.0.0/24",
            "--address",
            "private",
            "--user",
            lab.user,
            "--max-instances",
            "2",
            "--idle-timeout",
            "600",
        )
        path = home / "providers.yml"
        doc = yaml.safe_load(path.read_text())
        doc["providers"]["aws"].update(
            spot=True,
            metadata_url=f"http://{{address}}:{port}",
            checkpoint_every=1,
            notice_every=0.05,
        )
        path.write_text(yaml.safe_dump(doc))
        for host in lab.hosts:
            host.authorize((home / "keys" / "aws.pub").read_text())
        Path("train.py").write_text(TRAIN)
        parts: dict[str, list[float]] = {
            k: []
            for k in (
                "notice -> SIGTERM",
                "checkpoint upload",
                "re-queue -> created (less the create call)",
                "created -> agent ready",
                "agent ready -> job start",
                "monkey's own total",
            )
        }
        create_call = create_seconds(moto)
        for _ in range(rounds):
            juid = json.loads(monkey("run", "--json", "-p", "aws", "--", "python3", "train.py"))[
                "job"
            ]
            wait(lambda j=juid: info(j)["state"] == "running" and info(j)["attempts"] == 1)
            time.sleep(1.5)  # an upload or two
            job = info(juid)
            node = job["instance"].split("/", 1)[1]
            [address] = [i["PrivateIpAddress"] for i in moto.instances() if i["InstanceId"] == node]
            t0 = time.time()
            metadata[address].interrupt(seconds=120)
            wait(
                lambda j=juid: info(j)["attempts"] == 2 and info(j)["attempts_detail"][1].get("pid")
            )
            second = info(juid)["attempts_detail"][1]
            first, run1 = run_events(lab, juid, 1)
            exited = (run1 / "exit").stat().st_mtime
            ended = info(juid)["attempts_detail"][0]["ended_at"]
            new = second["instance"]
            created = min(
                t for t, _ in log_times(home, f"monkey.core: aws: created {re.escape(new)} ")
            )
            ready = min(t for t, _ in log_times(home, f"{re.escape(new)}: connected"))
            grace = exited - first["preempt-notice"]["ts"]
            parts["notice -> SIGTERM"].append(first["preempt-notice"]["ts"] - t0)
            parts["checkpoint upload"].append(first["exit"]["ts"] - exited)
            parts["re-queue -> created (less the create call)"].append(
                created - ended - create_call
            )
            parts["created -> agent ready"].append(ready - created)
            parts["agent ready -> job start"].append(second["started_at"] - ready)
            parts["monkey's own total"].append(second["started_at"] - t0 - grace - create_call)
            monkey("job", "cancel", juid)
        print(f"notice → job running again on a fresh moto instance, median of {rounds}:")
        for name, values in parts.items():
            print(f"  {name:45s} {statistics.median(values) * 1000:8.0f} ms")
        print(
            f"  (excluded: the job's own stop after SIGTERM, and moto's create call, {create_call * 1000:.0f} ms\n"
            "   median alone; the issue's target is 2 s, its bound 5 s)"
        )
    finally:
        subprocess.run([sys.executable, "-m", "monkey", "daemon", "stop"], capture_output=True)
        left = [i["InstanceId"] for i in moto.instances()]
        if left:
            moto.boto3("ec2").terminate_instances(InstanceIds=left)
        print(
            f"  idle instances terminated by the bench at the end: {len(left)}; left in the (fake) "
            f"cloud: {len(moto.instances())}"
        )
        for service in metadata.values():
            service.close()
        lab.close()
        server.stop()


def create_seconds(moto: Moto) -> float:
    """Median seconds of the fake cloud's RunInstances + a listing, alone (default VPC)."""
    ec2, took = moto.boto3("ec2"), []
    for _ in range(3):
        start = time.perf_counter()
        made = ec2.run_instances(ImageId=IMAGE, MinCount=1, MaxCount=1, InstanceType="t3.micro")
        ec2.describe_instances(InstanceIds=[made["Instances"][0]["InstanceId"]])
        took.append(time.perf_counter() - start)
        ec2.terminate_instances(InstanceIds=[made["Instances"][0]["InstanceId"]])
    return statistics.median(took)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_agent_cpu(seconds: float, watch: bool) -> tuple[float, int]:
    """CPU seconds of an idle agent over SECONDS (polling the metadata every 1 s when WATCH),
    and the metadata requests it made."""
    root = Path(tempfile.mkdtemp(prefix="monkey-bench-agent-"))
    sock_path = str(root / "agent.sock")
    service = Metadata("127.0.0.1")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "monkey.client_agent",
            "--root",
            str(root),
            "--socket",
            sock_path,
            "--idle-timeout",
            "3600",
        ],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stderr=subprocess.DEVNULL,
    )
    try:
        wait(lambda: os.path.exists(sock_path), 10)
        conn = socket.socket(socket.AF_UNIX)
        conn.connect(sock_path)
        request: dict[str, Any] = {"id": 1, "op": "sync", "attempts": []}
        if watch:
            request["watch"] = {"kind": "ec2", "url": service.url, "every": 1.0}
        conn.sendall((json.dumps(request) + "\n").encode())
        conn.recv(65536)
        conn.close()  # an idle instance: nobody connected
        time.sleep(1.0)
        before, asked = cpu_seconds(proc.pid), service.requests
        time.sleep(seconds)
        return cpu_seconds(proc.pid) - before, service.requests - asked
    finally:
        proc.terminate()
        proc.wait()
        service.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--seconds", type=float, default=60.0, help="idle agent measurement (default 60)"
    )
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    recovery(args.rounds)
    polling, requests = idle_agent_cpu(args.seconds, watch=True)
    quiet, _ = idle_agent_cpu(args.seconds, watch=False)
    print(
        f"idle agent over {args.seconds:.0f} s: {polling:.3f} CPU s polling the metadata every 1 s "
        f"({requests} requests) = {100 * polling / args.seconds:.3f}% of a core "
        f"(target < 1%); not polling: {quiet:.3f} CPU s; ratio {polling / max(quiet, 0.01):.1f}x"
    )


if __name__ == "__main__":
    main()
