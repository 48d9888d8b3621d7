"""The `ec2` provider against moto's server, each instance reached over a real sshd on its
loopback address (as tests/test_ec2.py does): how long creating, listing and terminating
take through libcloud, how long from create to an instance taking jobs (listing, SSH
contact, agent install), and what `instances()` costs the core's loop (it never waits).
moto answers at once and nothing boots, so these are monkey's own costs, not EC2's.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, fresh_home

sys.path.insert(0, str(REPO / "tests"))  # the test fixtures' sshd lab and moto server
from moto_server import CREDENTIALS, IMAGE, MotoServer  # noqa: E402
from sshd import Lab  # noqa: E402

ROUNDS = 3


def main() -> None:
    home = fresh_home()
    client = Path(tempfile.mkdtemp(prefix="monkey-bench-client-"))
    os.environ.update(
        HOME=str(client),
        AWS_EC2_METADATA_DISABLED="true",
        **CREDENTIALS,
        AWS_CONFIG_FILE=str(client / "none"),
        AWS_SHARED_CREDENTIALS_FILE=str(client / "none"),
    )
    os.environ.pop("SSH_AUTH_SOCK", None)
    moto = MotoServer(Path(tempfile.mkdtemp(prefix="monkey-bench-moto-")))
    lab = Lab(client)
    try:
        from monkey.config import Home, ProviderConfig
        from monkey.drivers import ec2_setup
        from monkey.drivers.ec2 import EC2Driver

        config = ""
        for n in range(1, ROUNDS + 1):
            host = lab.add(f"i{n}", trusted=False, address=f"127.0.0.{n + 3}", own_home=True)
            config += f"Host {host.address}\n    Port {host.port}\n"
        (lab.ssh_dir / "config").write_text(config)
        h = Home(home).ensure()
        wanted = {
            "region": "us-east-1",
            "size": "t3.micro",
            "image": IMAGE,
            "endpoint": moto.endpoint,
            "address": "private",
            "user": lab.user,
            "max_instances": ROUNDS,
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
        drv = EC2Driver(ProviderConfig("aws", "ec2", entry), h)
        drv.list_nodes()  # the first call builds the clients (credentials, libcloud)
        made, creates, reaches, lists, calls = [], [], [], [], []
        for _ in range(ROUNDS):
            start = time.perf_counter()
            inst = drv.create_node()
            creates.append(time.perf_counter() - start)
            made.append(inst.id)
            while not any(c.instance == inst.id for c in drv.instances()):
                t = time.perf_counter()
                drv.instances()
                calls.append(time.perf_counter() - t)
                time.sleep(0.005)
            reaches.append(time.perf_counter() - start)
            t = time.perf_counter()
            drv.list_nodes()
            lists.append(time.perf_counter() - t)
        start = time.perf_counter()
        for instance in made:
            drv.destroy_node(instance)
        destroy = (time.perf_counter() - start) / len(made)
        drv.close()
        ms = 1000
        print(
            f"create_node (libcloud RunInstances + a listing)   median {statistics.median(creates) * ms:7.1f} ms"
        )
        print(
            f"create to taking jobs (list, SSH, agent install)   median {statistics.median(reaches) * ms:7.1f} ms"
        )
        print(
            f"list_nodes ({ROUNDS} instances at most)                  median {statistics.median(lists) * ms:7.1f} ms"
        )
        print(f"destroy_node                                       mean   {destroy * ms:7.1f} ms")
        print(
            f"instances() while contacting ({len(calls)} calls)       "
            f"median {statistics.median(calls) * 1e6:7.1f} us, max {max(calls) * 1e6:.0f} us"
        )
    finally:
        lab.close()
        moto.stop()


if __name__ == "__main__":
    main()
