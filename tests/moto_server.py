"""moto's server on 127.0.0.1 standing in for EC2 and S3 (helpers for the `moto` fixture).

One in-process `ThreadedMotoServer` serves the whole test session; each test starts from an
empty cloud (`POST /moto-api/reset`). moto is configured like AWS where it can be, before it
is imported (its settings are read once):

- its image catalogue is the single image `IMAGE` (`MOTO_AMIS_PATH`; the full catalogue
  makes the first EC2 call take ~5 s);
- unknown images, instance types and key pairs are refused at launch, as AWS does
  (`MOTO_ENABLE_AMI_VALIDATION`, `MOTO_EC2_ENABLE_INSTANCE_TYPE_VALIDATION`,
  `MOTO_ENABLE_KEYPAIR_VALIDATION`);
- buckets are named in the path only, as monkey's clients address them at any endpoint
  (`S3_IGNORE_SUBDOMAIN_BUCKETNAME`: else an endpoint named ec2.example reads as bucket `ec2`).

Every request reaches moto through a gate (tests/s3_gate.py) that checks S3's presigned
URLs and POST policies as AWS does (moto checks neither): ``endpoint`` is the gate's, so
the URLs and forms monkey's storage signs name it; ``gate.refused`` lists what it refused
(the ``moto`` fixture asserts it refused nothing).

moto answers any credentials until `reject_credentials()` (its `reset-auth` API) makes it
check them as AWS does; the next reset accepts any again.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import urllib.request
from pathlib import Path
from typing import Any

ACCOUNT = "123456789012"  # moto's account for any access key it does not know
REGION = "us-east-1"
IMAGE = "ami-12c6146b"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
_IMAGE_RECORD = {
    "ami_id": IMAGE,
    "name": "monkey-test-debian",
    "description": "test image",
    "owner_id": "137112412989",
    "public": True,
    "virtualization_type": "hvm",
    "image_location": "amazon/monkey-test",
    "architecture": "x86_64",
    "state": "available",
    "platform": None,
    "image_type": "machine",
    "hypervisor": "xen",
    "root_device_name": "/dev/xvda",
    "root_device_type": "ebs",
    "sriov": "simple",
}


class MotoServer:
    """moto's server in this process, on 127.0.0.1 and a free port."""

    def __init__(self, workdir: Path) -> None:
        amis = workdir / "amis.json"
        amis.write_text(json.dumps([_IMAGE_RECORD]))
        os.environ.update(
            MOTO_AMIS_PATH=str(amis),
            MOTO_ENABLE_AMI_VALIDATION="true",
            MOTO_EC2_ENABLE_INSTANCE_TYPE_VALIDATION="true",
            MOTO_ENABLE_KEYPAIR_VALIDATION="true",
            S3_IGNORE_SUBDOMAIN_BUCKETNAME="true",
        )
        from moto.server import ThreadedMotoServer

        from tests.s3_gate import S3Gate

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        self.gate = S3Gate()
        self.gate.backend_port = self._server.get_host_and_port()[1]
        self.gate.trust_key(CREDENTIALS["AWS_ACCESS_KEY_ID"], CREDENTIALS["AWS_SECRET_ACCESS_KEY"])
        self.endpoint = f"http://{self.gate.address}"
        self._backend = f"http://127.0.0.1:{self.gate.backend_port}"

    def _post(self, path: str, body: bytes = b"") -> None:
        request = urllib.request.Request(
            self._backend + path, data=body, method="POST", headers={"Content-Type": "text/plain"}
        )
        with urllib.request.urlopen(request, timeout=30) as reply:
            reply.read()

    def reset(self) -> None:
        """Forget every resource and every refusal, and accept any credentials again."""
        self._post("/moto-api/reset")
        self.gate.refused.clear()
        self.reset_auth()

    def reset_auth(self) -> None:
        """Accept any credentials."""
        self._post("/moto-api/reset-auth", b"inf")

    def reject_credentials(self) -> None:
        """Check credentials as AWS does from now on: the fake ones are refused."""
        self._post("/moto-api/reset-auth", b"0")

    def stop(self) -> None:
        self.gate.close()
        self._server.stop()


class Moto:
    """What a test sees of the server: its endpoint, clients bound to it, its instances."""

    image = IMAGE
    region = REGION

    def __init__(self, server: MotoServer) -> None:
        self.server = server
        self.endpoint = server.endpoint
        self._clients: dict[tuple[str, str], Any] = {}
        self._lock = threading.Lock()

    def boto3(self, service: str, region: str = REGION) -> Any:
        """A boto3 client for SERVICE talking to moto, made once per service and region
        (making one builds every operation's method: about 0.1 s of CPU for EC2's, which
        tests polling moto paid on every look; clients are thread-safe)."""
        with self._lock:
            client = self._clients.get((service, region))
            if client is None:
                import boto3

                client = self._clients[service, region] = boto3.client(
                    service,
                    endpoint_url=self.endpoint,
                    region_name=region,
                    aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                    aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
                )
            return client

    def regions(self) -> list[str]:
        """Regions where EC2 has been used since the last reset."""
        from moto.ec2.models import ec2_backends

        return sorted(ec2_backends[ACCOUNT].keys()) if ACCOUNT in ec2_backends else []

    def instances(self) -> list[dict[str, Any]]:
        """Every instance not terminated, in every region used (listed through the API)."""
        alive = ["pending", "running", "shutting-down", "stopping", "stopped"]
        found = []
        for region in self.regions():
            pages = (
                self.boto3("ec2", region)
                .get_paginator("describe_instances")
                .paginate(Filters=[{"Name": "instance-state-name", "Values": alive}])
            )
            found += [
                dict(i, Region=region)
                for page in pages
                for r in page["Reservations"]
                for i in r["Instances"]
            ]
        return found

    def reclaim_spot(self, instance_id: str, region: str = REGION) -> None:
        """What AWS does when it takes a spot instance back: terminated with the state
        reason ``Server.SpotInstanceTermination`` (the server runs in this process; its API
        has no call for this: TerminateInstances records a user's shutdown)."""
        from moto.ec2.models import ec2_backends
        from moto.ec2.models.instances import StateReason

        backend = ec2_backends[ACCOUNT][region]
        instance = backend.get_instance(instance_id)
        instance.terminate()
        instance.state_reason = StateReason(
            "Server.SpotInstanceTermination: Spot instance termination",
            "Server.SpotInstanceTermination",
        )
        instance._reason = "Service initiated"

    def reject_credentials(self) -> None:
        """Make moto check credentials as AWS does (until the next test)."""
        self.server.reject_credentials()
