"""40 queued 1-CPU jobs on an `ec2` provider (moto's server, each instance reached over a
real sshd on its loopback address) with `max_instances: 4` of a 2-CPU size, against the
same 40 jobs on 4 pre-existing SSH hosts (the same sshds) in the same run.

Prints: instances created (target: exactly 4), wall time from the first submit to the last
job done for both (target: elastic within 1.5x of the SSH hosts), and the time until every
instance is terminated after `idle_timeout`. moto answers at once and nothing boots, so the
figure is monkey's own cost of provisioning (listing, SSH contact, agent install).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import yaml
from common import REPO, fresh_home

sys.path.insert(0, str(REPO / "tests"))  # the test fixtures' sshd lab and moto server
from moto_server import CREDENTIALS, IMAGE, MotoServer  # noqa: E402
from sshd import Lab  # noqa: E402

JOBS = 40
MACHINES = 4
IDLE = 3


def run_jobs(m: object, provider: str) -> float:
    """Submit JOBS jobs to PROVIDER and wait for all; seconds from first submit to last end."""
    from monkey.models import State

    start = time.perf_counter()
    jobs = [
        m.run(["sh", "-c", "sleep 0.5; echo done"], provider=provider, start_core=False)
        for _ in range(JOBS)
    ]
    m.wake()
    for job in jobs:
        assert job.wait(timeout=600) == State.SUCCEEDED, (job.juid, m.info(job.juid)["reason"])
    return time.perf_counter() - start


def main() -> None:
    home = fresh_home()
    client = Path(tempfile.mkdtemp(prefix="monkey-bench-client-"))
    os.environ.update(
        HOME=str(client),
        AWS_EC2_METADATA_DISABLED="true",
        **CREDENTIALS,
        AWS_CONFIG_FILE=str(client / "none"),
        AWS_SHARED_CREDENTIALS_FILE=str(client / "none"),
        MONKEY_AGENT_IDLE_TIMEOUT="60",
    )
    os.environ.pop("SSH_AUTH_SOCK", None)
    moto = MotoServer(Path(tempfile.mkdtemp(prefix="monkey-bench-moto-")))
    lab = Lab(client)
    from monkey.api import Monkey
    from monkey.config import Home
    from monkey.core import daemon
    from monkey.drivers import ec2_setup

    h = Home(home).ensure()
    try:
        config = ""
        for n in range(MACHINES):
            host = lab.add(f"i{n}", trusted=False, address=f"127.0.0.{n + 4}", own_home=True)
            config += f"Host {host.address}\n    Port {host.port}\n"
        (lab.ssh_dir / "config").write_text(config)
        wanted = {
            "region": "us-east-1",
            "size": "t3.micro",
            "image": IMAGE,
            "endpoint": moto.endpoint,
            "address": "private",
            "user": lab.user,
            "max_instances": MACHINES,
            "idle_timeout": IDLE,
        }
        entry = ec2_setup.setup(
            h,
            "aws",
            ec2_setup.entry_from(wanted, {}),
            subnet_cidr="127.0.0.0/24",
            say=lambda _: None,
        )
        for host in lab.hosts:
            host.authorize((h.keys / "aws.pub").read_text())
        hosts = [
            host.entry(key=str(h.keys / "aws"), cpus=2, workdir=f"{host.workdir}-lab")
            for host in lab.hosts
        ]
        providers = {
            "aws": entry,
            "lab": {"type": "ssh", "trust_on_first_use": True, "hosts": hosts},
        }
        h.providers_file.write_text(yaml.safe_dump({"providers": providers}))
        daemon.start(h)
        m = Monkey(h)
        elastic = run_jobs(m, "aws")
        created = m.store.instances("aws")
        done = time.perf_counter()
        while any(r["state"] != "terminated" for r in m.store.instances("aws")):
            time.sleep(0.1)
            if time.perf_counter() - done > 120:
                raise SystemExit("instances were not terminated within 120 s")
        idle_end = time.perf_counter() - done
        fixed = run_jobs(m, "lab")
        print(
            f"{JOBS} jobs of 1 CPU, max_instances {MACHINES} of a 2-CPU size (moto + loopback sshd)"
        )
        print(f"instances created:               {len(created)} (target: exactly {MACHINES})")
        print(f"elastic, first submit to last end: {elastic:6.2f} s")
        print(f"{MACHINES} pre-existing SSH hosts:        {fixed:6.2f} s")
        print(f"ratio:                             {elastic / fixed:6.2f}x (target <= 1.5x)")
        print(f"all terminated {idle_end:.1f} s after the last job (idle_timeout {IDLE} s)")
    finally:
        daemon.stop(h)
        lab.close()
        moto.stop()


if __name__ == "__main__":
    main()
