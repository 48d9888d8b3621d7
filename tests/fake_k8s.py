"""A stateful fake Kubernetes API server on 127.0.0.1 (HTTPS, a bearer token), with a
scheduler and a kubelet that really run each pod's container, for the `kubernetes` provider.

No control plane runs on these machines (no kube-apiserver, kubelet, k3s, kind or kwok:
see /work/shared/services.md), so this serves the calls monkey makes, in the API's own
shapes: every object it stores or answers is checked against the official OpenAPI-generated
models of the `kubernetes` package (``_shaped``: deserialised as V1Pod, V1Node, CoreV1Event,
V1Status...; a key the model does not know, or a required field missing, fails the request
with a 500 that names it), and its behaviour follows the API reference (kubernetes.io/docs/
reference/using-api/api-concepts: list, watch with ``resourceVersion``, bookmarks, ``410
Gone`` for an expired version; label selectors; pods/log with ``follow`` and ``sinceTime``).

Served: ``/version``; nodes (list, get); pods (create with ``generateName``, get, list and
watch in a namespace or all of them, delete with a grace period); pods/log; events (list,
watch); secrets (create, get, delete: image pull secrets of type dockerconfigjson);
SelfSubjectAccessReview (allowed unless the test denies the verb and resource).

The scheduler binds a pending pod to the first node whose allocatable CPU, memory and
``nvidia.com/gpu`` less its running pods' requests hold the pod's requests, whose labels match
its ``nodeSelector`` and whose taints it tolerates; when none fits, the pod gets
``PodScheduled=False`` with reason ``Unschedulable`` and the scheduler's message (``0/3 nodes
are available: 3 Insufficient nvidia.com/gpu. preemption: ...``) and a ``FailedScheduling``
event, and is tried again whenever a pod ends or a node is added.

The kubelet pulls the container's image from its registry and unpacks it with monkey's own
unprivileged runner (monkey/client_agent/image.py and pull.py), with the pod's
``imagePullSecrets`` and the CAs the node trusts, and runs the container's command under
bubblewrap in the image's root (its ``emptyDir`` volumes bound at their mount paths), its
stdout and stderr in the container's log. It drives the real status shapes: ``waiting``
``ContainerCreating``, then ``ErrImagePull`` (containerd's message) and ``ImagePullBackOff``
for an image it cannot pull (tried again every ``pull_backoff`` seconds), ``running``, and
``terminated`` with the exit code (reason Completed or Error, phase Succeeded or Failed:
restartPolicy Never). A deleted pod's container gets SIGTERM (its own process, not
bubblewrap's), then every process of it SIGKILL after the grace period.

A container's memory limit is enforced as its cgroup would: past it (the resident memory
of its processes), they are SIGKILLed and the container ends ``OOMKilled`` (137).
``evict`` disrupts a pod as node pressure, the scheduler's preemption or a drain do
(DisruptionTarget). pods/exec is a websocket in the v4.channel.k8s.io protocol.

A pod's ``persistentVolumeClaim`` volume is a folder of the fake's, one per claim name,
shared by every pod naming it (as a ReadWriteMany claim).

Not served yet: port-forward, PVC objects, any other resource.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "monkey" / "client_agent"))
import image as runner  # noqa: E402  (monkey's unprivileged runner: stdlib only)

GPU = "nvidia.com/gpu"
TOKEN = "fake-k8s-token"
_HISTORY = 1000  # watch events kept; an older resourceVersion is 410 Gone


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def quantity(text: str | int | float) -> float:
    """A Kubernetes quantity ("500m", "2", "16Gi", "1G") as a number (cores, bytes)."""
    text = str(text)
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 1e3, "M": 1e6,
             "G": 1e9, "T": 1e12, "m": 1e-3}  # fmt: skip
    for suffix, factor in units.items():
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * factor
    return float(text)


_MODELS: dict[str, Any] = {}


def _shaped(obj: dict[str, Any], model: str) -> dict[str, Any]:
    """OBJ, checked against the `kubernetes` package's model MODEL (V1Pod...): every key it
    has is a field of the model, and the model's required fields are there."""
    from kubernetes import client

    api = _MODELS.setdefault("api", client.ApiClient())
    back = api.sanitize_for_serialization(api._ApiClient__deserialize(obj, model))

    def check(mine: Any, theirs: Any, path: str) -> None:
        if isinstance(mine, dict) and not path.endswith(("labels", "annotations")):
            for key, value in mine.items():
                if value is None:
                    continue
                if not isinstance(theirs, dict) or key not in theirs:
                    raise ValueError(f"{model}: {path}.{key} is not in the API's shape")
                check(value, theirs[key], f"{path}.{key}")
        elif isinstance(mine, list) and isinstance(theirs, list):
            for i, (a, b) in enumerate(zip(mine, theirs)):
                check(a, b, f"{path}[{i}]")

    check(obj, back, model)
    return obj


def matches(selector: str, labels: dict[str, str]) -> bool:
    """Whether LABELS match a label selector (``a=b,c!=d,e,!f``: equality ones and
    existence)."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key.strip()) == value.strip():
                return False
        elif "=" in term:
            key, value = term.split("=", 1)
            if labels.get(key.strip().rstrip("=")) != value.strip():
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


class Gone(Exception):
    """A watch asked for a resourceVersion older than the history kept."""


class FakeK8s:
    """The fake's state, its HTTPS server (``url``), scheduler and kubelet; ``close()``
    stops every pod's process and the server."""

    def __init__(
        self,
        root: Path,
        ca: Path | None = None,
        bookmark_every: float = 1.0,
        node_auths: dict[str, Any] | None = None,
    ) -> None:
        """ROOT holds its files; CA: a registry's CA the nodes trust; NODE_AUTHS: registry
        logins the nodes have themselves ({host: {"auth": ...}}, as a kubelet's credential
        provider gives them), used for pods without a pull secret for that host."""
        self.root = root
        self.node_auths = dict(node_auths or {})
        self.lock = threading.Condition()
        self.rv = itertools.count(1000)
        self.version = 1000
        self.compacted = 0  # a watch from before this resourceVersion is 410 Gone
        self.history: list[tuple[int, str, str, dict[str, Any]]] = []  # rv, kind, type, obj
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.secrets: dict[tuple[str, str], dict[str, Any]] = {}
        self.events: dict[tuple[str, str], dict[str, Any]] = {}
        self.nodes: dict[str, dict[str, Any]] = {}
        self.procs: dict[tuple[str, str], subprocess.Popen] = {}
        self.denied: set[tuple[str, str]] = set()  # (verb, resource) refused to the token
        self.execs: set[Any] = set()  # the sockets of the pods/exec websockets open
        self.requests: list[str] = []  # "METHOD path?query" of every request, in order
        self.created: list[dict[str, Any]] = []  # every pod as it was created
        self.created_secrets: list[dict[str, Any]] = []  # every secret as it was created
        self.born: dict[tuple[str, str], float] = {}  # when each pod was created (monotonic)
        self.last_start_delay = 0.0  # seconds from the last pod's creation to its process
        self.roots: dict[tuple[str, str], Path] = {}  # a running pod's image root, here
        # what runs a command in a running pod (pods/exec): its container, image, volumes
        self.sandboxes: dict[tuple[str, str], tuple[dict[str, Any], Any, dict[str, str]]] = {}
        self.bookmark_every = bookmark_every
        self.pull_backoff = 1.0
        self.create_delay = 0.0  # seconds a pod's creation is answered late (a slow API server)
        self.ca_dir = None  # the CAs the node's runtime trusts (a registry's)
        if ca is not None:
            self.ca_dir = root / "node-ca"
            self.ca_dir.mkdir(parents=True, exist_ok=True)
            shutil.copy(ca, self.ca_dir / "ca.crt")
        self.store = root / "images"
        self.closed = threading.Event()
        self.bwrap = shutil.which("bwrap") or "bwrap"
        root.mkdir(parents=True, exist_ok=True)
        key, cert = root / "key.pem", root / "ca.crt"
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
             "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(key), "-out", str(cert),
             "-days", "2", "-subj", "/CN=fake-k8s", "-addext", "subjectAltName=IP:127.0.0.1"],
            check=True, capture_output=True,
        )  # fmt: skip
        self.ca = cert
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    # -- control, for tests ---------------------------------------------------------------

    def add_node(self, name: str, cpus: int = 4, memory: str = "16Gi", gpus: int = 0,
                 labels: dict[str, str] | None = None,
                 taints: list[dict[str, str]] | None = None) -> None:  # fmt: skip
        """A Ready node with CPUS, MEMORY and GPUS allocatable (capacity one CPU more)."""
        allocatable = {"cpu": str(cpus), "memory": memory, "pods": "110"}
        capacity = {**allocatable, "cpu": str(cpus + 1)}
        if gpus:
            allocatable[GPU] = capacity[GPU] = str(gpus)
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "uid": str(uuid.uuid4()),
                "creationTimestamp": _now(),
                "labels": {"kubernetes.io/hostname": name, **(labels or {})},
            },
            "spec": {"taints": taints} if taints else {},
            "status": {
                "capacity": capacity,
                "allocatable": allocatable,
                "conditions": [
                    {"type": "Ready", "status": "True", "reason": "KubeletReady",
                     "message": "kubelet is posting ready status",
                     "lastTransitionTime": _now(), "lastHeartbeatTime": _now()}
                ],
                "nodeInfo": _node_info(),
            },
        }  # fmt: skip
        with self.lock:
            self._record("nodes", "ADDED", node)
            self.nodes[name] = node
        self._schedule()

    def drop_execs(self) -> int:
        """Cut every pods/exec websocket open (as an API server that restarts does); how many."""
        with self.lock:
            socks = list(self.execs)
        for sock in socks:
            try:
                sock.shutdown(2)
            except OSError:
                pass
        return len(socks)

    def deny(self, verb: str, resource: str) -> None:
        """SelfSubjectAccessReviews of VERB on RESOURCE answer not allowed, and such requests
        are refused 403."""
        self.denied.add((verb, resource))

    def expire_history(self) -> None:
        """Forget every watch event so far, as an API server's compaction does: every open
        watch, and any from an older resourceVersion, gets 410 Gone (a client lists again)."""
        with self.lock:
            self.history.clear()
            self.version = self.compacted = next(self.rv)
            self.lock.notify_all()

    def pod(self, name: str, namespace: str = "default") -> dict[str, Any] | None:
        with self.lock:
            pod = self.pods.get((namespace, name))
            return json.loads(json.dumps(pod)) if pod else None

    def evict(self, name: str, namespace: str = "default", how: str = "pressure") -> None:
        """Stop POD as Kubernetes disrupts pods: HOW is ``pressure`` (the kubelet evicts it
        for node pressure: DisruptionTarget TerminationByKubelet, phase Failed, reason
        Evicted, the pod kept), ``preemption`` (the scheduler makes room for a higher
        priority: DisruptionTarget PreemptionByScheduler, then a graceful delete) or
        ``drain`` (the Eviction API: EvictionByEvictionAPI, then a graceful delete). Its
        processes get SIGTERM, then SIGKILL after the pod's grace period."""
        reasons = {
            "pressure": ("TerminationByKubelet", "The node was low on resource: memory. "
                         "Threshold quantity: 100Mi, available: 42Mi."),
            "preemption": ("PreemptionByScheduler", "default-scheduler: preempting to "
                           "accommodate a higher priority pod"),
            "drain": ("EvictionByEvictionAPI", "Eviction API: evicting"),
        }  # fmt: skip
        reason, message = reasons[how]
        with self.lock:
            pod = self.pods[(namespace, name)]
            _set_condition(pod, "DisruptionTarget", "True", reason, message)
            if how == "pressure":
                pod["status"]["reason"], pod["status"]["message"] = "Evicted", message
                self._event(pod, "Warning", "Evicted", message)
            self._changed(pod)
            proc = self.procs.get((namespace, name))
            grace = pod["spec"]["terminationGracePeriodSeconds"]
        if how != "pressure":
            self.delete_pod(namespace, name, None)
        elif proc is not None:
            _term(proc)
            threading.Timer(grace, _kill, (proc, signal.SIGKILL)).start()

    def rootfs(self, name: str, namespace: str = "default") -> Path:
        """The image root POD runs in, on this machine: a file a test puts there appears in
        the pod (read-only to it)."""
        with self.lock:
            return self.roots[(namespace, name)]

    def close(self) -> None:
        self.closed.set()
        with self.lock:
            procs = list(self.procs.values())
            self.lock.notify_all()
        for proc in procs:
            _kill(proc, signal.SIGKILL)
        self.server.shutdown()
        self.server.server_close()

    # -- state ------------------------------------------------------------------------------

    def _record(self, kind: str, type_: str, obj: dict[str, Any]) -> None:
        """Give OBJ a new resourceVersion and keep the watch event (the lock held)."""
        self.version = next(self.rv)
        obj["metadata"]["resourceVersion"] = str(self.version)
        model = {"pods": "V1Pod", "nodes": "V1Node", "events": "CoreV1Event",
                 "secrets": "V1Secret"}[kind]  # fmt: skip
        _shaped(obj, model)
        self.history.append((self.version, kind, type_, json.loads(json.dumps(obj))))
        del self.history[:-_HISTORY]
        self.lock.notify_all()

    def _event(self, pod: dict[str, Any], type_: str, reason: str, message: str,
               source: str = "kubelet") -> None:  # fmt: skip
        """An Event about POD (the lock held); repeated ones are counted, as the API does."""
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        key = (ns, f"{name}.{reason}.{message}")
        event = self.events.get(key)
        if event is not None and event["message"] == message:
            event["count"] += 1
            event["lastTimestamp"] = _now()
            self._record("events", "MODIFIED", event)
            return
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{name}.{uuid.uuid4().hex[:16]}", "namespace": ns,
                         "uid": str(uuid.uuid4()), "creationTimestamp": _now()},
            "involvedObject": {"kind": "Pod", "namespace": ns, "name": name,
                               "uid": pod["metadata"]["uid"], "apiVersion": "v1"},
            "reason": reason,
            "message": message,
            "type": type_,
            "source": {"component": source},
            "count": 1,
            "firstTimestamp": _now(),
            "lastTimestamp": _now(),
        }  # fmt: skip
        self.events[key] = event
        self._record("events", "ADDED", event)

    def _changed(self, pod: dict[str, Any]) -> None:
        self._record("pods", "MODIFIED", pod)

    # -- the scheduler ----------------------------------------------------------------------

    def _schedule(self) -> None:
        """Bind every pending unbound pod that fits a node now; say why each other waits."""
        with self.lock:
            for pod in list(self.pods.values()):
                if pod["spec"].get("nodeName") or pod["metadata"].get("deletionTimestamp"):
                    continue
                node, why = self._fit(pod)
                if node is None:
                    cond = _condition(pod, "PodScheduled")
                    if cond.get("message") != why:
                        _set_condition(pod, "PodScheduled", "False", "Unschedulable", why)
                        self._changed(pod)
                        self._event(pod, "Warning", "FailedScheduling", why, "default-scheduler")
                    continue
                pod["spec"]["nodeName"] = node
                _set_condition(pod, "PodScheduled", "True")
                ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
                self._event(pod, "Normal", "Scheduled",
                            f"Successfully assigned {ns}/{name} to {node}",
                            "default-scheduler")  # fmt: skip
                _set_condition(pod, "Initialized", "True")
                _set_condition(pod, "Ready", "False", "ContainersNotReady",
                               "containers with unready status: [job]")  # fmt: skip
                pod["status"]["containerStatuses"] = [
                    _status(c, {"waiting": {"reason": "ContainerCreating"}})
                    for c in pod["spec"]["containers"]
                ]
                pod["status"]["hostIP"] = "127.0.0.1"
                self._changed(pod)
                threading.Thread(target=self._kubelet, args=((ns, name),), daemon=True).start()

    def _fit(self, pod: dict[str, Any]) -> tuple[str | None, str]:
        """(the first node POD fits, "") or (None, the scheduler's message)."""
        wanted = _requests(pod)
        reasons: dict[str, int] = {}
        for name, node in self.nodes.items():
            why = []
            labels = node["metadata"]["labels"]
            selector = pod["spec"].get("nodeSelector") or {}
            if any(labels.get(k) != v for k, v in selector.items()):
                why.append("node(s) didn't match Pod's node affinity/selector")
            tolerated = pod["spec"].get("tolerations") or []
            for taint in node["spec"].get("taints") or []:
                if taint.get("effect") in ("NoSchedule", "NoExecute") and not any(
                    _tolerates(t, taint) for t in tolerated
                ):
                    why.append(
                        f"node(s) had untolerated taint {{{taint['key']}: {taint.get('value', '')}}}"
                    )
                    break
            used: dict[str, float] = {}
            for other in self.pods.values():
                if other["spec"].get("nodeName") == name and other["status"].get("phase") in (
                    "Pending",
                    "Running",
                ):
                    for res, amount in _requests(other).items():
                        used[res] = used.get(res, 0) + amount
            allocatable = node["status"]["allocatable"]
            for res, amount in wanted.items():
                have = quantity(allocatable.get(res, "0")) - used.get(res, 0)
                if amount > have + 1e-9:
                    why.append(f"Insufficient {res}")
            if not why:
                return name, ""
            for reason in why:
                reasons[reason] = reasons.get(reason, 0) + 1
        count = len(self.nodes)
        parts = ", ".join(f"{n} {r}" for r, n in sorted(reasons.items()))
        message = (
            f"0/{count} nodes are available: {parts}."
            if parts
            else ("0/0 nodes are available: no nodes available to schedule pods.")
        )
        if count:
            message += (
                f" preemption: 0/{count} nodes are available: {count} No preemption victims "
                "found for incoming pod."
            )
        return None, message

    # -- the kubelet ------------------------------------------------------------------------

    def _kubelet(self, key: tuple[str, str]) -> None:
        """Pull the pod's image, run its container, record its end."""
        with self.lock:
            pod = self.pods.get(key)
            if pod is None:
                return
            container = pod["spec"]["containers"][0]
            ref = container["image"]
            secrets = [
                self.secrets.get((key[0], s["name"]))
                for s in pod["spec"].get("imagePullSecrets") or []
            ]
            self._event(pod, "Normal", "Pulling", f'Pulling image "{ref}"')
        folder = self.root / "pods" / pod["metadata"]["uid"]
        folder.mkdir(parents=True)
        while True:
            try:
                bundle = self._pull(ref, secrets, folder)
                break
            except runner.ImageError as exc:
                said = _containerd_error(ref, str(exc))
                with self.lock:
                    pod = self.pods.get(key)
                    if pod is None or pod["metadata"].get("deletionTimestamp"):
                        return
                    self._event(pod, "Warning", "Failed", f'Failed to pull image "{ref}": {said}')
                    self._waiting(pod, "ErrImagePull", said)
                    self._event(pod, "Warning", "Failed", "Error: ErrImagePull")
                if self.closed.wait(self.pull_backoff / 2):
                    return
                with self.lock:
                    pod = self.pods.get(key)
                    if pod is None or pod["metadata"].get("deletionTimestamp"):
                        return
                    message = f'Back-off pulling image "{ref}"'
                    self._waiting(pod, "ImagePullBackOff", message)
                    self._event(pod, "Normal", "BackOff", message)
                if self.closed.wait(self.pull_backoff):
                    return
        with self.lock:
            pod = self.pods.get(key)
            if pod is None or pod["metadata"].get("deletionTimestamp"):
                return
            self._event(pod, "Normal", "Pulled", f'Successfully pulled image "{ref}"')
            volumes = {}
            for volume in pod["spec"].get("volumes") or []:
                if "emptyDir" in volume:
                    path = folder / "volumes" / volume["name"]
                    path.mkdir(parents=True)
                    volumes[volume["name"]] = str(path)
                elif "persistentVolumeClaim" in volume:  # one folder per claim, shared
                    path = self.root / "claims" / volume["persistentVolumeClaim"]["claimName"]
                    path.mkdir(parents=True, exist_ok=True)
                    volumes[volume["name"]] = str(path)
            argv, env = self._argv(container, bundle, volumes)
            program = argv[argv.index("--") + 1]
            path = {e["name"]: e.get("value", "") for e in container.get("env") or []}.get(
                "PATH", runner.image_env(bundle[0])["PATH"]
            )
            cwd = container.get("workingDir") or "/"
            if runner.find_command(str(Path(bundle[0]) / "rootfs"), program, path, cwd)[0]:
                said = (
                    "failed to create containerd task: failed to create shim task: OCI runtime "
                    "create failed: runc create failed: unable to start container process: "
                    f'exec: "{program}": executable file not found in $PATH: unknown'
                )
                self._event(pod, "Warning", "Failed", f"Error: {said}")
                self._terminated(pod, 128, "StartError", said)
                return
            log = open(folder / "container.log", "ab")
            pod["status"]["containerStatuses"][0]["imageID"] = f"{ref.split('@')[0]}@{bundle[1]}"
            try:
                proc = subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    env=env, start_new_session=True,
                )  # fmt: skip
            except OSError as exc:
                self._terminated(pod, 128, "StartError", str(exc))
                return
            finally:
                log.close()
            self.procs[key] = proc
            self.last_start_delay = time.monotonic() - self.born.get(key, time.monotonic())
            self.roots[key] = Path(bundle[0]) / "rootfs"
            self.sandboxes[key] = (container, bundle, volumes)
            self._event(pod, "Normal", "Created", "Created container: job")
            self._event(pod, "Normal", "Started", "Started container job")
            started = _now()
            pod["status"]["phase"] = "Running"
            pod["status"]["startTime"] = pod["status"].get("startTime") or started
            pod["status"]["containerStatuses"][0].update(
                state={"running": {"startedAt": started}}, ready=True, started=True
            )
            _set_condition(pod, "ContainersReady", "True")
            _set_condition(pod, "Ready", "True")
            self._changed(pod)
        limit = quantity(
            ((container.get("resources") or {}).get("limits") or {}).get("memory") or 0
        )
        oom = threading.Event()
        if limit:
            threading.Thread(target=_oom_killer, args=(proc, limit, oom), daemon=True).start()
        code = proc.wait()
        with self.lock:
            self.procs.pop(key, None)
            pod = self.pods.get(key)
            if pod is None:
                return
            if code < 0:
                code = 128 - code
            reason = "OOMKilled" if oom.is_set() else "Completed" if code == 0 else "Error"
            self._terminated(pod, code, reason, None)
            if pod["metadata"].get("deletionTimestamp"):
                self._remove(key)
        self._schedule()

    def _pull(
        self, ref: str, secrets: list[dict[str, Any] | None], folder: Path
    ) -> tuple[str, str]:
        """(the unpacked bundle of REF, its digest), pulled with the pod's pull secrets."""
        name, _, digest = ref.partition("@")
        host = name.split("/", 1)[0]
        auth: dict[str, Any] = dict(self.node_auths)
        for secret in secrets:
            if secret and secret.get("type") == "kubernetes.io/dockerconfigjson":
                data = json.loads(base64.b64decode(secret["data"][".dockerconfigjson"]))
                auth.update({h: _kubelet_login(e) for h, e in data.get("auths", {}).items()})
        options = []
        if self.ca_dir is not None:
            options += ["--cert-dir", str(self.ca_dir)]
        if host in auth:
            authfile = folder / "auth.json"
            authfile.write_text(json.dumps({"auths": {host: auth[host]}}))
            options += ["--authfile", str(authfile)]
        if not digest:
            base = name if ":" in name.rsplit("/", 1)[-1] else f"{name}:latest"
            proc = subprocess.run(
                ["skopeo", "inspect", "--raw", *options, f"docker://{base}"],
                capture_output=True,
            )
            if proc.returncode != 0:
                said = proc.stderr.decode(errors="replace").lower()
                host = name.split("/", 1)[0]
                why = ("not found in registry" if "manifest unknown" in said
                       else "refused access (unauthorized)" if "unauthorized" in said
                       else f"pulling failed: {said.strip()[-200:]}")  # fmt: skip
                raise runner.ImageError(f"image {ref}: {why} {host}")
            import hashlib

            digest = "sha256:" + hashlib.sha256(proc.stdout).hexdigest()
            name = base.rsplit(":", 1)[0] if ":" in base.rsplit("/", 1)[-1] else base
        pull_auth: dict[str, Any] = {}
        if host in auth:
            pull_auth["auths"] = {host: auth[host]}
        if self.ca_dir is not None:
            pull_auth["ca"] = (self.ca_dir / "ca.crt").read_text()
        run_dir = folder / "pull"
        run_dir.mkdir(exist_ok=True)
        if pull_auth:
            (run_dir / "pull-auth.json").write_text(json.dumps(pull_auth))
        cfg = {"ref": ref, "name": name, "digest": digest, "store": str(self.store)}
        with open(run_dir / "setup.log", "ab") as log:
            return runner.pull(cfg, str(run_dir), log), digest

    def _argv(self, container: dict[str, Any], pulled: tuple[str, str],
              volumes: dict[str, str]) -> tuple[list[str], dict[str, str]]:  # fmt: skip
        """The bwrap command that runs CONTAINER in its image, and its environment."""
        bundle = pulled[0]
        config = json.loads((Path(bundle) / "image.json").read_text())
        # As the kubelet: a command replaces the image's Entrypoint and Cmd; args alone
        # replace its Cmd.
        if container.get("command"):
            command = [*container["command"], *(container.get("args") or [])]
        else:
            args = container.get("args") or config.get("Cmd") or []
            command = [*(config.get("Entrypoint") or []), *args]
        env = runner.image_env(bundle)
        for item in container.get("env") or []:
            env[item["name"]] = item.get("value", "")
        mounts = {m["mountPath"]: volumes[m["name"]] for m in container.get("volumeMounts") or []
                  if m["name"] in volumes}  # fmt: skip
        cwd = container.get("workingDir") or config.get("WorkingDir") or "/"
        argv = runner.argv(self.bwrap, bundle, cwd, command, [], [], env)
        # emptyDirs at their mount paths (bwrap makes the mount points in its own root)
        at = argv.index("--chdir")
        binds: list[str] = []
        for path, host in sorted(mounts.items()):
            binds += ["--bind", host, path]
        argv[at:at] = binds
        return argv, {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}

    def _waiting(self, pod: dict[str, Any], reason: str, message: str) -> None:
        status = pod["status"]["containerStatuses"][0]
        status["state"] = {"waiting": {"reason": reason, "message": message}}
        self._changed(pod)

    def _terminated(self, pod: dict[str, Any], code: int, reason: str, message: str | None) -> None:
        status = pod["status"]["containerStatuses"][0]
        started = (status.get("state", {}).get("running") or {}).get("startedAt") or _now()
        ended = {"exitCode": code, "reason": reason, "startedAt": started, "finishedAt": _now(),
                 "containerID": f"fake://{pod['metadata']['uid']}"}  # fmt: skip
        if message:
            ended["message"] = message
        status.update(state={"terminated": ended}, ready=False, started=False)
        pod["status"]["phase"] = "Succeeded" if code == 0 else "Failed"
        _set_condition(pod, "Ready", "False", "PodCompleted", None)
        _set_condition(pod, "ContainersReady", "False", "PodCompleted", None)
        self._changed(pod)

    def _remove(self, key: tuple[str, str]) -> None:
        pod = self.pods.pop(key)
        self._record("pods", "DELETED", pod)

    # -- requests ---------------------------------------------------------------------------

    def create_pod(self, ns: str, body: dict[str, Any]) -> dict[str, Any]:
        meta = body.setdefault("metadata", {})
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise _Error(422, "Invalid", "metadata.name: Required value: name or "
                             "generateName is required")  # fmt: skip
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if (
            not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", meta["name"])
            or len(meta["name"]) > 253
        ):
            raise _Error(422, "Invalid", f'Pod "{meta["name"]}" is invalid: metadata.name: '
                         "Invalid value: a lowercase RFC 1123 subdomain must consist of lower case "
                         "alphanumeric characters, '-' or '.'")  # fmt: skip
        containers = (body.get("spec") or {}).get("containers") or []
        if not containers or not all(c.get("image") and c.get("name") for c in containers):
            raise _Error(422, "Invalid", f'Pod "{meta["name"]}" is invalid: '
                         "spec.containers: Required value")  # fmt: skip
        with self.lock:
            if (ns, meta["name"]) in self.pods:
                raise _Error(409, "AlreadyExists", f'pods "{meta["name"]}" already exists')
            meta.update(namespace=ns, uid=str(uuid.uuid4()), creationTimestamp=_now())
            body["spec"].setdefault("restartPolicy", "Always")
            body["spec"].setdefault("terminationGracePeriodSeconds", 30)
            body["spec"].setdefault("schedulerName", "default-scheduler")
            body["status"] = {"phase": "Pending", "qosClass": _qos(body)}
            self.pods[(ns, meta["name"])] = body
            self.created.append(json.loads(json.dumps(body)))
            self.born[(ns, meta["name"])] = time.monotonic()
            self._record("pods", "ADDED", body)
            out = json.loads(json.dumps(body))
        self._schedule()
        if self.create_delay:  # the pod runs meanwhile; its creator hears of it late
            time.sleep(self.create_delay)
        return out

    def delete_pod(self, ns: str, name: str, grace: int | None) -> dict[str, Any]:
        with self.lock:
            pod = self.pods.get((ns, name))
            if pod is None:
                raise _Error(404, "NotFound", f'pods "{name}" not found')
            grace = pod["spec"]["terminationGracePeriodSeconds"] if grace is None else grace
            proc = self.procs.get((ns, name))
            if proc is None:
                self._remove((ns, name))
                out = json.loads(json.dumps(pod))
            else:
                pod["metadata"]["deletionTimestamp"] = _now()
                pod["metadata"]["deletionGracePeriodSeconds"] = grace
                self._changed(pod)
                out = json.loads(json.dumps(pod))
                _term(proc)
                threading.Timer(grace, _kill, (proc, signal.SIGKILL)).start()
        self._schedule()
        return out

    def list(self, kind: str, ns: str | None, selector: str, fields: str) -> dict[str, Any]:
        with self.lock:
            items = [json.loads(json.dumps(o)) for o in self._objects(kind)
                     if _selected(o, ns, selector, fields)]  # fmt: skip
            return {
                "apiVersion": "v1",
                "kind": {"pods": "PodList", "nodes": "NodeList", "events": "EventList"}[kind],
                "metadata": {"resourceVersion": str(self.version)},
                "items": items,
            }

    def _objects(self, kind: str) -> list[dict[str, Any]]:
        return list({"pods": self.pods, "nodes": self.nodes, "events": self.events}[kind].values())

    def watch(self, kind: str, ns: str | None, selector: str, fields: str, since: int | None,
              bookmarks: bool, timeout: float):  # fmt: skip
        """Yield watch events (dicts) of KIND after resourceVersion SINCE until TIMEOUT;
        Gone when SINCE is older than the history kept."""
        deadline = time.monotonic() + timeout
        with self.lock:
            if since is None:  # "0" or none: the current objects, as ADDED
                since = self.version
                start = [("ADDED", json.loads(json.dumps(o))) for o in self._objects(kind)
                         if _selected(o, ns, selector, fields)]  # fmt: skip
            else:
                start = []
                if self._expired(since):
                    raise Gone()
        yield from ({"type": t, "object": o} for t, o in start)
        last_mark = time.monotonic()
        while not self.closed.is_set():
            with self.lock:
                if self._expired(since):
                    raise Gone()
                fresh = [(rv, t, o) for rv, k, t, o in self.history if rv > since and k == kind]
                if not fresh:
                    left = min(deadline, last_mark + self.bookmark_every) - time.monotonic()
                    if left > 0:
                        self.lock.wait(left)
                    if self._expired(since):
                        raise Gone()
                    fresh = [(rv, t, o) for rv, k, t, o in self.history
                             if rv > since and k == kind]  # fmt: skip
                current = self.version
            for rv, type_, obj in fresh:
                since = rv
                if _selected(obj, ns, selector, fields):
                    yield {"type": type_, "object": obj}
            now = time.monotonic()
            if bookmarks and now - last_mark >= self.bookmark_every:
                last_mark = now
                since = max(since, current)
                yield {"type": "BOOKMARK", "object": {
                    "kind": {"pods": "Pod", "events": "Event", "nodes": "Node"}[kind],
                    "apiVersion": "v1", "metadata": {"resourceVersion": str(since)}}}  # fmt: skip
            if now >= deadline:
                return

    def _expired(self, since: int) -> bool:
        """Whether events after resourceVersion SINCE are no longer kept (the lock held)."""
        oldest = self.history[0][0] if self.history else self.version + 1
        return since < self.compacted or (since < oldest - 1 and since < self.version)

    def log(self, ns: str, name: str, follow: bool, since: str | None):
        """Yield the container log's bytes (from SINCE, an RFC 3339 time: lines written then
        or later); with FOLLOW until the container ended."""
        with self.lock:
            pod = self.pods.get((ns, name))
            if pod is None:
                raise _Error(404, "NotFound", f'pods "{name}" not found')
            path = self.root / "pods" / pod["metadata"]["uid"] / "container.log"
            state = pod["status"].get("containerStatuses", [{}])[0].get("state", {})
            if not path.exists() or "waiting" in state:
                reason = (state.get("waiting") or {}).get("reason", "ContainerCreating")
                raise _Error(400, "BadRequest", f'container "job" in pod "{name}" is waiting '
                             f"to start: {reason}")  # fmt: skip
        skip = 0
        if since:  # the fake keeps no per-line times: all lines when the pod started after
            started = pod["status"].get("startTime") or ""
            if started < since:
                skip = path.stat().st_size
        with open(path, "rb") as f:
            f.seek(skip)
            while True:
                data = f.read(65536)
                if data:
                    yield data
                    continue
                if not follow:
                    return
                with self.lock:
                    live = (ns, name) in self.procs
                if not live:
                    rest = f.read()
                    if rest:
                        yield rest
                    return
                if self.closed.wait(0.05):
                    return


class _Error(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message

    def status(self) -> dict[str, Any]:
        return _shaped({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                        "message": self.message, "reason": self.reason, "code": self.code},
                       "V1Status")  # fmt: skip


def _selected(obj: dict[str, Any], ns: str | None, selector: str, fields: str) -> bool:
    meta = obj["metadata"]
    if ns is not None and meta.get("namespace") != ns:
        return False
    if selector and not matches(selector, meta.get("labels") or {}):
        return False
    for term in filter(None, fields.split(",")):
        key, _, value = term.partition("=")
        here: Any = obj
        for part in key.strip().split("."):
            here = here.get(part) if isinstance(here, dict) else None
        if str(here) != value.strip():
            return False
    return True


def _requests(pod: dict[str, Any]) -> dict[str, float]:
    total: dict[str, float] = {}
    for container in pod["spec"]["containers"]:
        resources = container.get("resources") or {}
        asked = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        for res, amount in asked.items():
            total[res] = total.get(res, 0) + quantity(amount)
    return total


def _qos(pod: dict[str, Any]) -> str:
    resources = [c.get("resources") or {} for c in pod["spec"]["containers"]]
    if not any(r.get("requests") or r.get("limits") for r in resources):
        return "BestEffort"
    if all(r.get("limits") and r.get("requests", r["limits"]) == r["limits"] for r in resources):
        return "Guaranteed"
    return "Burstable"


def _tolerates(toleration: dict[str, Any], taint: dict[str, Any]) -> bool:
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    if toleration.get("operator") == "Exists":
        return not toleration.get("key") or toleration["key"] == taint["key"]
    return toleration.get("key") == taint["key"] and toleration.get("value") == taint.get("value")


def _condition(pod: dict[str, Any], type_: str) -> dict[str, Any]:
    for cond in pod["status"].get("conditions") or []:
        if cond["type"] == type_:
            return cond
    return {}


def _set_condition(pod: dict[str, Any], type_: str, status: str, reason: str | None = None,
                   message: str | None = None) -> None:  # fmt: skip
    conds = pod["status"].setdefault("conditions", [])
    cond = {"type": type_, "status": status, "lastProbeTime": None,
            "lastTransitionTime": _now()}  # fmt: skip
    if reason:
        cond["reason"] = reason
    if message:
        cond["message"] = message
    for i, old in enumerate(conds):
        if old["type"] == type_:
            conds[i] = cond
            return
    conds.append(cond)


def _status(container: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
    return {"name": container["name"], "image": container["image"], "imageID": "",
            "ready": False, "restartCount": 0, "started": False, "state": state}  # fmt: skip


def _valid_secret(body: dict[str, Any]) -> None:
    """The API server's checks of a secret of type kubernetes.io/dockerconfigjson: its data
    has `.dockerconfigjson`, base64 of a JSON object (422 Invalid otherwise)."""
    if body.get("type") != "kubernetes.io/dockerconfigjson":
        return
    name = body.get("metadata", {}).get("name")
    data = (body.get("data") or {}).get(".dockerconfigjson")
    if data is None:
        raise _Error(422, "Invalid", f'Secret "{name}" is invalid: data[.dockerconfigjson]: '
                     "Required value")  # fmt: skip
    try:
        if not isinstance(json.loads(base64.b64decode(data, validate=True)), dict):
            raise ValueError("not an object")
    except ValueError as exc:
        raise _Error(422, "Invalid", f'Secret "{name}" is invalid: data[.dockerconfigjson]: '
                     f"Invalid value: \"<secret contents redacted>\": {exc}") from None  # fmt: skip


def _kubelet_login(entry: dict[str, Any]) -> dict[str, str]:
    """A registry's entry of a pull secret as the kubelet reads it (DockerConfigEntry:
    ``auth``, base64 of user:password, wins over ``username`` and ``password``), as the
    auth.json entry the runtime is given."""
    user, password = entry.get("username") or "", entry.get("password") or ""
    if entry.get("auth"):
        user, _, password = base64.b64decode(entry["auth"]).decode().partition(":")
    return {"auth": base64.b64encode(f"{user}:{password}".encode()).decode()}


def _containerd_error(ref: str, said: str) -> str:
    """The runner's one line (image.py) as containerd words an ErrImagePull."""
    if "not found in registry" in said:
        return (f'rpc error: code = NotFound desc = failed to pull and unpack image "{ref}": '
                f'failed to resolve reference "{ref}": {ref}: not found')  # fmt: skip
    if "unauthorized" in said:
        return (f'rpc error: code = Unknown desc = failed to pull and unpack image "{ref}": '
                f'failed to resolve reference "{ref}": pull access denied, repository does '
                "not exist or may require authorization: authorization failed: "
                "401 Unauthorized")  # fmt: skip
    if "certificate is not trusted" in said:  # the node's runtime lacks the registry's CA
        name, _, digest = ref.partition("@")
        host, _, repo = name.partition("/")
        return (f'rpc error: code = Unknown desc = failed to pull and unpack image "{ref}": '
                f'failed to resolve reference "{ref}": failed to do request: Head '
                f'"https://{host}/v2/{repo}/manifests/{digest}": tls: failed to verify '
                "certificate: x509: certificate signed by unknown authority")  # fmt: skip
    return f'rpc error: code = Unknown desc = failed to pull and unpack image "{ref}": {said}'


def _node_info() -> dict[str, str]:
    return {"architecture": "amd64", "bootID": "", "containerRuntimeVersion": "fake://1.0",
            "kernelVersion": os.uname().release, "kubeProxyVersion": "", "kubeletVersion":
            "v1.31.0-fake", "machineID": "", "operatingSystem": "linux",
            "osImage": "fake", "systemUUID": ""}  # fmt: skip


def _oom_killer(proc: subprocess.Popen, limit: float, oom: threading.Event) -> None:
    """The container's memory limit, as its cgroup enforces it: once the resident memory of
    its processes (the container's process and all its descendants, whatever their session)
    passes LIMIT bytes, they are SIGKILLed and OOM set."""
    page = os.sysconf("SC_PAGE_SIZE")
    while proc.poll() is None:
        parents: dict[int, int] = {}
        rss: dict[int, int] = {}
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/stat") as f:
                    parents[int(pid)] = int(f.read().rsplit(")", 1)[1].split()[1])
                with open(f"/proc/{pid}/statm") as f:
                    rss[int(pid)] = int(f.read().split()[1]) * page
            except (OSError, ValueError, IndexError):
                continue
        tree, grew = {proc.pid}, True
        while grew:
            more = {p for p, parent in parents.items() if parent in tree} - tree
            tree |= more
            grew = bool(more)
        if sum(rss.get(p, 0) for p in tree) > limit:
            oom.set()
            # the whole group at once, as the cgroup's OOM kill: each stopped first, so that
            # none sees another die (a shell would say "Killed" and exit 137)
            for sig in (signal.SIGSTOP, signal.SIGKILL):
                for pid in tree:
                    try:
                        os.kill(pid, sig)
                    except OSError:
                        pass
            _kill(proc, signal.SIGKILL)
            return
        time.sleep(0.05)


def _term(proc: subprocess.Popen) -> None:
    """The kubelet's SIGTERM: to the container's own process (what its command became), not
    to bubblewrap around it nor to processes that left its process group (as a runtime
    signals the container's PID 1 alone)."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if os.getpgid(int(pid)) != proc.pid:
                continue
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == "bwrap":
                    continue
            os.kill(int(pid), signal.SIGTERM)
        except (OSError, ValueError):
            continue


def _kill(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


_POD = re.compile(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)(/log|/exec)?")
_LIST = re.compile(r"/api/v1(?:/namespaces/([^/]+))?/(pods|events|nodes)")


_WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def _frame(opcode: int, payload: bytes) -> bytes:
    """A server's websocket frame (unmasked, final)."""
    n = len(payload)
    head = bytes([0x80 | opcode])
    if n < 126:
        head += bytes([n])
    elif n < 1 << 16:
        head += bytes([126]) + n.to_bytes(2, "big")
    else:
        head += bytes([127]) + n.to_bytes(8, "big")
    return head + payload


def _websocket_exec(sock: Any, proc: subprocess.Popen) -> None:
    """Relay PROC's stdin, stdout and stderr over the websocket SOCK (one thread: reads and
    writes of a TLS socket never overlap); then its exit as channel 3's Status, and close."""
    import queue
    import select

    feed: queue.Queue[bytes | None] = queue.Queue()

    def feeding() -> None:  # stdin in its own thread: a full pipe never stalls the relay
        assert proc.stdin is not None
        try:
            while (data := feed.get()) is not None:
                proc.stdin.write(data)
                proc.stdin.flush()
        except OSError:
            pass
        finally:
            try:
                proc.stdin.close()
            except OSError:
                pass

    threading.Thread(target=feeding, daemon=True).start()
    assert proc.stdout is not None and proc.stderr is not None
    outs = {proc.stdout.fileno(): 1, proc.stderr.fileno(): 2}
    buf = b""
    open_ws = True
    try:
        while outs or (open_ws and proc.poll() is None):
            ready = [] if not open_ws else [sock]
            if open_ws and sock.pending():
                r = [sock]
            else:
                r, _, _ = select.select([*ready, *outs], [], [], 0.2)
            for fd in [f for f in r if f is not sock]:
                data = os.read(fd, 65536)
                if data:
                    sock.sendall(_frame(2, bytes([outs[fd]]) + data))
                else:
                    del outs[fd]
            if sock in r:
                data = sock.recv(65536)
                if not data:
                    open_ws = False
                    feed.put(None)
                    continue
                buf += data
                while True:  # every whole frame in BUF
                    if len(buf) < 2:
                        break
                    opcode, n, at = buf[0] & 0x0F, buf[1] & 0x7F, 2
                    if n == 126:
                        n, at = int.from_bytes(buf[2:4], "big"), 4
                    elif n == 127:
                        n, at = int.from_bytes(buf[2:10], "big"), 10
                    masked = buf[1] & 0x80
                    if len(buf) < at + (4 if masked else 0) + n:
                        break
                    mask = buf[at : at + 4] if masked else b"\0\0\0\0"
                    at += 4 if masked else 0
                    payload = bytes(b ^ mask[i % 4] for i, b in enumerate(buf[at : at + n]))
                    buf = buf[at + n :]
                    if opcode == 8:  # close
                        open_ws = False
                        feed.put(None)
                        break
                    if opcode in (1, 2) and payload[:1] == b"\0" and len(payload) > 1:
                        feed.put(payload[1:])
        code = proc.wait()
        if code == 0:
            status = {"metadata": {}, "status": "Success"}
        else:
            status = {"metadata": {}, "status": "Failure", "reason": "NonZeroExitCode",
                      "message": f"command terminated with non-zero exit code: exit status {code}",
                      "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]}}  # fmt: skip
        if open_ws:
            sock.sendall(_frame(2, b"\x03" + json.dumps(status).encode()))
            sock.sendall(_frame(8, (1000).to_bytes(2, "big")))
    except (OSError, ssl.SSLError):
        pass
    finally:
        feed.put(None)
        if proc.poll() is None:
            _kill(proc, signal.SIGKILL)
            proc.wait()


def _handler(fake: FakeK8s) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_args: Any) -> None:
            pass

        def _send(self, code: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> dict[str, Any]:
            length = int(self.headers.get("Content-Length") or 0)
            return json.loads(self.rfile.read(length) or b"{}")

        def _stream(self, chunks: Any, content_type: str, line: bool) -> None:
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.flush()  # the status line now: a client waits for the headers
            try:
                for chunk in chunks:
                    data = (json.dumps(chunk) + "\n").encode() if line else chunk
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                    self.wfile.flush()
            except Gone:
                data = (json.dumps({"type": "ERROR", "object": _Error(
                    410, "Expired", "too old resource version").status()}) + "\n").encode()  # fmt: skip
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
                return
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

        def _route(self, method: str) -> None:
            url = urlparse(self.path)
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            fake.requests.append(f"{method} {self.path}")
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                return self._send(401, _Error(401, "Unauthorized", "Unauthorized").status())
            try:
                self._serve(method, url.path, query)
            except _Error as exc:
                self._send(exc.code, exc.status())
            except ValueError as exc:  # a shape the API does not have
                self._send(500, _Error(500, "InternalError", str(exc)).status())

        def _serve(self, method: str, path: str, query: dict[str, str]) -> None:
            if path == "/version" and method == "GET":
                return self._send(200, {"major": "1", "minor": "31", "gitVersion": "v1.31.0-fake",
                                        "platform": "linux/amd64"})  # fmt: skip
            if (
                path == "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
                and method == "POST"
            ):
                body = self._body()
                attrs = body.get("spec", {}).get("resourceAttributes", {})
                allowed = (attrs.get("verb"), attrs.get("resource")) not in fake.denied
                body["status"] = {"allowed": allowed}
                body.setdefault("metadata", {})["creationTimestamp"] = None
                return self._send(201, _shaped(body, "V1SelfSubjectAccessReview"))
            secret = re.fullmatch(r"/api/v1/namespaces/([^/]+)/secrets(?:/([^/]+))?", path)
            if secret:
                return self._secret(method, secret[1], secret[2])
            pod = _POD.fullmatch(path)
            if pod:
                ns, name, log = pod.groups()
                self._allowed("delete" if method == "DELETE" else "get", "pods")
                if log == "/exec" and method in ("GET", "POST"):
                    self._allowed("create", "pods/exec")
                    return self._exec(ns, name, parse_qs(urlparse(self.path).query))
                if log and method == "GET":
                    chunks = fake.log(ns, name, query.get("follow", "").lower() == "true",
                                      query.get("sinceTime"))  # fmt: skip
                    first = next(chunks, b"")  # errors before the 200
                    return self._stream(itertools.chain([first], chunks), "text/plain", False)
                if method == "GET":
                    found = fake.pod(name, ns)
                    if found is None:
                        raise _Error(404, "NotFound", f'pods "{name}" not found')
                    return self._send(200, found)
                if method == "DELETE":
                    body = self._body() if self.headers.get("Content-Length") else {}
                    grace = body.get("gracePeriodSeconds", query.get("gracePeriodSeconds"))
                    return self._send(200, fake.delete_pod(ns, name, None if grace is None
                                                           else int(grace)))  # fmt: skip
            node = re.fullmatch(r"/api/v1/nodes/([^/]+)", path)
            if node and method == "GET":
                with fake.lock:
                    if node[1] not in fake.nodes:
                        raise _Error(404, "NotFound", f'nodes "{node[1]}" not found')
                    return self._send(200, fake.nodes[node[1]])
            listed = _LIST.fullmatch(path)
            if listed:
                ns, kind = listed.groups()
                if method == "POST" and kind == "pods" and ns:
                    self._allowed("create", "pods")
                    return self._send(201, fake.create_pod(ns, self._body()))
                if method == "GET":
                    self._allowed("list", kind)
                    selector = query.get("labelSelector", "")
                    fields = query.get("fieldSelector", "")
                    if query.get("watch", "").lower() in ("true", "1"):
                        since = query.get("resourceVersion")
                        events = fake.watch(
                            kind, ns, selector, fields,
                            int(since) if since and since != "0" else None,
                            query.get("allowWatchBookmarks", "").lower() == "true",
                            float(query.get("timeoutSeconds") or 1800),
                        )  # fmt: skip
                        return self._stream(events, "application/json", True)
                    return self._send(200, fake.list(kind, ns, selector, fields))
            raise _Error(404, "NotFound", f"the server could not find the requested resource "
                         f"({method} {path})")  # fmt: skip

        def _exec(self, ns: str, name: str, query: dict[str, list[str]]) -> None:
            """pods/exec over a websocket, in the v4.channel.k8s.io protocol: frames whose
            first byte is the channel (0 stdin, 1 stdout, 2 stderr, 3 the final Status).
            The command runs in the pod's sandbox (its image, its emptyDir volumes)."""
            with fake.lock:
                sandbox = fake.sandboxes.get((ns, name))
                pod = fake.pods.get((ns, name))
            if pod is None:
                raise _Error(404, "NotFound", f'pods "{name}" not found')
            if sandbox is None or (ns, name) not in fake.procs:
                raise _Error(400, "BadRequest", "cannot exec into a container in a completed "
                             "pod; current phase is " + pod["status"].get("phase", "Pending"))  # fmt: skip
            if self.headers.get("Upgrade", "").lower() != "websocket":
                raise _Error(400, "BadRequest", "Upgrade request required")
            protocols = [
                p.strip() for p in self.headers.get("Sec-WebSocket-Protocol", "").split(",")
            ]
            if "v4.channel.k8s.io" not in protocols:
                raise _Error(400, "BadRequest", "only v4.channel.k8s.io is served")
            container, bundle, volumes = sandbox
            argv, env = fake._argv({**container, "command": query.get("command", []), "args": []}, bundle,
                                   volumes)  # fmt: skip
            accept = base64.b64encode(hashlib.sha1(
                (self.headers["Sec-WebSocket-Key"] + _WS_GUID).encode()).digest()).decode()  # fmt: skip
            self.send_response(101)
            self.send_header("Upgrade", "websocket")
            self.send_header("Connection", "Upgrade")
            self.send_header("Sec-WebSocket-Accept", accept)
            self.send_header("Sec-WebSocket-Protocol", "v4.channel.k8s.io")
            self.end_headers()
            self.wfile.flush()
            self.close_connection = True
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, env=env, start_new_session=True)  # fmt: skip
            with fake.lock:
                fake.execs.add(self.connection)
            try:
                _websocket_exec(self.connection, proc)
            finally:
                with fake.lock:
                    fake.execs.discard(self.connection)

        def _allowed(self, verb: str, resource: str) -> None:
            if (verb, resource) in fake.denied:
                raise _Error(403, "Forbidden", f'{resource} is forbidden: User "fake" cannot '
                             f'{verb} resource "{resource}" in API group ""')  # fmt: skip

        def _secret(self, method: str, ns: str, name: str | None) -> None:
            self._allowed({"POST": "create", "GET": "get", "DELETE": "delete"}.get(method, ""),
                          "secrets")  # fmt: skip
            with fake.lock:
                if method == "POST" and name is None:
                    body = self._body()
                    meta = body.setdefault("metadata", {})
                    if not meta.get("name") and meta.get("generateName"):
                        meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
                    if (ns, meta.get("name")) in fake.secrets:
                        raise _Error(
                            409, "AlreadyExists", f'secrets "{meta["name"]}" already exists'
                        )
                    _valid_secret(body)
                    meta.update(namespace=ns, uid=str(uuid.uuid4()), creationTimestamp=_now())
                    fake.secrets[(ns, meta["name"])] = body
                    fake.created_secrets.append(json.loads(json.dumps(body)))
                    fake._record("secrets", "ADDED", body)
                    return self._send(201, body)
                found = fake.secrets.get((ns, name or ""))
                if found is None:
                    raise _Error(404, "NotFound", f'secrets "{name}" not found')
                if method == "GET":
                    return self._send(200, found)
                if method == "DELETE":
                    del fake.secrets[(ns, name or "")]
                    fake._record("secrets", "DELETED", found)
                    return self._send(200, found)
            raise _Error(405, "MethodNotAllowed", f"{method} is not allowed here")

        def do_GET(self) -> None:
            self._route("GET")

        def do_POST(self) -> None:
            self._route("POST")

        def do_DELETE(self) -> None:
            self._route("DELETE")

    return Handler


def kubeconfig(fake: FakeK8s, path: Path, namespace: str = "default",
               context: str = "fake", token: str = TOKEN) -> Path:  # fmt: skip
    """Write a kubeconfig at PATH whose context CONTEXT reaches FAKE (its CA embedded, a
    bearer token), as `kubectl config view --raw` shows one."""
    import yaml

    ca = base64.b64encode(fake.ca.read_bytes()).decode()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": fake.url,
                                                  "certificate-authority-data": ca}}],
        "users": [{"name": "tester", "user": {"token": token}}],
        "contexts": [{"name": context, "context": {"cluster": "fake", "user": "tester",
                                                   "namespace": namespace}}],
        "current-context": context,
    }  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path
