"""What a cluster's objects say, for the kubernetes driver and its agent: a pod's status
read as an attempt's (waiting, running, ended and why), the cluster as one instance from its
nodes, and what a pod carries in and out (its inputs as a tar, its outputs and kept
folders)."""

from __future__ import annotations

import io
import os
import posixpath
import tarfile

from monkey.drivers.base import Capacity
from monkey.drivers.k8s_api import POD_CACHE, POD_READY, RUN_FOLDER
from monkey.models import MonkeyError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

READ_STDIN = (
    "import io, os, sys, tarfile\n"
    "n, parts, got = int(sys.argv[1]), [], 0\n"
    "while got < n:\n"
    "    chunk = sys.stdin.buffer.read1(n - got)\n"
    "    if not chunk: break\n"
    "    parts.append(chunk); got += len(chunk)\n"
    "data = b''.join(parts)\n"
)
# Unpacks the tar of the pod's inputs (its size: argv[1]) read on stdin into /monkey: each
# file through a temporary name (a blob of the cache claim another pod writes at the same
# time is whole either way), then makes /monkey/ready.
UNPACK = READ_STDIN + (
    f"os.chdir({RUN_FOLDER!r})\n"
    "with tarfile.open(fileobj=io.BytesIO(data)) as tar:\n"
    "    for m in tar:\n"
    "        if m.isdir():\n"
    "            os.makedirs(m.name, exist_ok=True); continue\n"
    "        os.makedirs(os.path.dirname(m.name) or '.', exist_ok=True)\n"
    "        tmp = '%s.%d' % (m.name, os.getpid())\n"
    "        with open(tmp, 'wb') as f: f.write(tar.extractfile(m).read())\n"
    "        os.chmod(tmp, m.mode & 0o777); os.replace(tmp, m.name)\n"
    f"open({POD_READY!r}, 'w').close()\n"
)
# Prints which of the digests read on stdin (one a line; size: argv[1]) the cache claim lacks;
# touches those it has (used now: see k8s_cache).
MISSING = READ_STDIN + (
    f"os.makedirs({POD_CACHE!r} + '/blobs', exist_ok=True)\n"
    f"os.chdir({POD_CACHE!r} + '/blobs')\n"
    "for d in data.decode().split():\n"
    "    if not os.path.isfile(os.path.join(d[:2], d[2:])): print(d)\n"
    "    else:\n"  # in use: `monkey gc` keeps it for its grace period
    "        try: os.utime(os.path.join(d[:2], d[2:]))\n"
    "        except OSError: pass\n"
)
# Writes a tar of the folders named (under /monkey) that exist to stdout.
PACK = (
    "import os, sys, tarfile\n"
    f"os.chdir({RUN_FOLDER!r})\n"
    "with tarfile.open(fileobj=sys.stdout.buffer, mode='w|') as tar:\n"
    "    for name in sys.argv[1:]:\n"
    "        if os.path.exists(name): tar.add(name)\n"
)
_IMAGE_FAILURES = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull")
_START_FAILURES = ("CreateContainerConfigError", "CreateContainerError", "RunContainerError")
_DISRUPTIONS = {
    "TerminationByKubelet": "evicted by its node",
    "PreemptionByScheduler": "preempted by the scheduler",
    "EvictionByEvictionAPI": "evicted (the Eviction API: a node drain)",
    "DeletionByTaintManager": "evicted by a taint of its node",
    "DeletionByPodGC": "deleted by the pod garbage collector (its node is gone)",
}


def status_of(pod: dict[str, Any]) -> tuple[str, str | None, dict[str, Any]]:
    """What POD is doing, as (kind, one line, details): ``pending`` (with the scheduler's
    message), ``creating`` (pulling its image), ``image`` (cannot be pulled: the line
    says why), ``failed`` (its container cannot start), ``running``, ``ended`` (details:
    the container's ``terminated`` state)."""
    status = pod.get("status") or {}
    image = pod["spec"]["containers"][0]["image"]
    containers = status.get("containerStatuses") or []
    state = (containers[0].get("state") or {}) if containers else {}
    if "terminated" in state:
        ended = state["terminated"]
        if ended.get("reason") in ("StartError", "ContainerCannotRun"):
            said = ended.get("message") or ""
            return "failed", f"the container cannot start ({ended['reason']}): {said[-300:]}", ended
        return "ended", None, ended
    if status.get("phase") in ("Succeeded", "Failed") and not containers:
        return "ended", None, {"exitCode": None, "reason": status.get("reason")}
    if "running" in state:
        return "running", None, state["running"]
    waiting = state.get("waiting") or {}
    reason, message = waiting.get("reason") or "", waiting.get("message") or ""
    if reason in _IMAGE_FAILURES:
        low = message.lower()
        host = image.split("/", 1)[0] if "/" in image else "docker.io"
        if "not found" in low or "manifest unknown" in low:
            return "image", f"image {image}: not found in registry {host} ({reason})", waiting
        if any(s in low for s in ("401", "unauthorized", "denied", "authoriz", "403")):
            return "image", (
                f"image {image}: registry {host} refused the pull (unauthorized, {reason}); "
                f"log in on this machine: monkey registry login {host}"
            ), waiting  # fmt: skip
        if "x509: " in message:  # the node's runtime refuses the registry's certificate
            said = "x509: " + message.split("x509: ", 1)[1][:200]
            if "unknown authority" in said:
                said += (
                    f"; the cluster's nodes do not trust the CA of registry {host}: install it "
                    f"in each node's container runtime (containerd: /etc/containerd/certs.d/"
                    f"{host}/ca.crt; see README, Kubernetes)"
                )
            return "image", f"image {image}: {said}", waiting
        if reason == "InvalidImageName":
            return "image", f"image {image}: invalid image name ({message})", waiting
        return "creating", f"pulling image {image}: {reason}: {message[-200:]}", waiting
    if reason in _START_FAILURES:
        return "failed", f"the container cannot start ({reason}): {message[-300:]}", waiting
    if reason:
        return "creating", f"pulling image {image}" if reason == "ContainerCreating" else (
            f"creating {reason}"
        ), waiting  # fmt: skip
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            said = (cond.get("message") or cond.get("reason") or "").split(" preemption:")[0]
            return "pending", f"pending {said}".strip(), cond
    if pod["spec"].get("nodeName"):
        return "creating", f"pulling image {image}", {}
    return "pending", "pending", {}


def disruption_of(pod: dict[str, Any]) -> str:
    """Why Kubernetes is stopping POD (its DisruptionTarget condition), in one line; ""."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "DisruptionTarget" and cond.get("status") == "True":
            reason = cond.get("reason") or "DisruptionTarget"
            said = _DISRUPTIONS.get(reason, reason)
            message = (cond.get("message") or "").strip()
            return f"{said}: {message}" if message else said
    return ""


def inputs_tar(
    blobs: list[str], blobs_dir: str, kept: dict[str, str], blobs_at: str = "blobs"
) -> bytes:
    """What a pod gets before its agent starts, as a gzipped tar of paths under /monkey: the
    agent's code (agent/monkey/client_agent/), the BLOBS of the job's code and datasets
    (under BLOBS_AT, as BLOBS_DIR holds them) and the local folders KEPT names by their
    folder in the pod (the job's checkpoint, its saved persisted folders)."""
    from monkey.version import AGENT_SRC, agent_files

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        init = tarfile.TarInfo("agent/monkey/__init__.py")
        tar.addfile(init, io.BytesIO(b""))
        for name in agent_files():
            tar.add(str(AGENT_SRC / name), f"agent/monkey/client_agent/{name}")
        for digest in dict.fromkeys(blobs):
            path = os.path.join(blobs_dir, digest[:2], digest[2:])
            try:
                tar.add(path, f"{blobs_at}/{digest[:2]}/{digest[2:]}")
            except OSError as exc:
                raise MonkeyError(f"missing blob {digest}: {exc}") from None
        for folder, local in kept.items():
            if os.path.isdir(local) and os.listdir(local):
                tar.add(local, folder)
    return buf.getvalue()


def unpack_kept(data: bytes, kept: dict[str, str]) -> int:
    """Replace each local folder of KEPT ({folder in the pod: local path}) by the one the
    tar DATA holds (a folder it lacks leaves the local one as it was); the files written.
    Nothing leaves its folder."""
    import shutil

    count = 0
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        members = tar.getmembers()
        for folder, local in kept.items():
            mine = [m for m in members if m.name == folder or m.name.startswith(folder + "/")]
            if not mine:
                continue
            fresh = f"{local}.fetching"
            shutil.rmtree(fresh, ignore_errors=True)
            os.makedirs(fresh)
            for member in mine:
                rel = posixpath.normpath(member.name[len(folder) :].lstrip("/"))
                if rel.startswith("..") or rel.startswith("/"):
                    continue
                target = os.path.join(fresh, rel) if rel != "." else fresh
                if member.isdir():
                    os.makedirs(target, exist_ok=True)
                elif member.isfile() and (source := tar.extractfile(member)) is not None:
                    os.makedirs(os.path.dirname(target), exist_ok=True)
                    with open(target, "wb") as f:
                        f.write(source.read())
                    os.chmod(target, member.mode & 0o700 | 0o600)
                    count += 1
            old = f"{local}.old"
            shutil.rmtree(old, ignore_errors=True)
            if os.path.exists(local):
                os.replace(local, old)
            os.replace(fresh, local)
            shutil.rmtree(old, ignore_errors=True)
    return count


def unpack_outputs(data: bytes, globs: list[str], dest: str, prefix: str = "") -> int:
    """The regular files of the tar DATA under PREFIX (a folder) whose path there (or a
    folder of it) matches one of GLOBS, written under DEST; how many. Nothing leaves DEST."""
    import fnmatch

    count = 0
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        for member in tar:
            name = posixpath.normpath(member.name)
            if prefix:
                if not name.startswith(prefix + "/"):
                    continue
                name = name[len(prefix) + 1 :]
            if not member.isfile() or name.startswith(("/", "..")) or name == ".":
                continue
            parts = name.split("/")
            prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
            if not any(fnmatch.fnmatch(p, g) for p in prefixes for g in globs):
                continue
            target = os.path.join(dest, *parts)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            source = tar.extractfile(member)
            if source is None:
                continue
            with open(target, "wb") as f:
                f.write(source.read())
            count += 1
    return count


def pod_rows(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What `list providers --monkey-instances` shows of monkey's PODS: pod, node, phase
    (a disruption or deletion under way named), created (epoch s), job, cpus, gpus."""
    from datetime import datetime

    from monkey.drivers.k8s_api import GPU, LABEL

    rows = []
    for pod in pods:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        status = pod.get("status") or {}
        requests = ((spec.get("containers") or [{}])[0].get("resources") or {}).get("requests")
        phase = str(status.get("phase") or "Pending").lower()
        if disruption_of(pod):
            phase += ", disrupted"
        elif meta.get("deletionTimestamp"):
            phase += ", terminating"
        try:
            created = datetime.fromisoformat(
                str(meta.get("creationTimestamp")).replace("Z", "+00:00")
            ).timestamp()
        except ValueError:
            created = None
        rows.append(
            {
                "pod": meta.get("name"),
                "node": spec.get("nodeName"),
                "phase": phase,
                "created": created,
                "job": (meta.get("labels") or {}).get(f"{LABEL}/job"),
                "cpus": (requests or {}).get("cpu"),
                "gpus": (requests or {}).get(GPU),
            }
        )
    return sorted(rows, key=lambda r: str(r["pod"]))


def manifest_cpus(manifest: dict[str, Any]) -> int:
    return int(manifest["spec"]["containers"][0]["resources"]["requests"]["cpu"])


def node_ready(node: dict[str, Any]) -> bool:
    """Whether NODE says it is Ready."""
    conditions = node.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def node_shapes(nodes: list[dict[str, Any]]) -> list[list[int]]:
    """The distinct [cpus, gpus, memory] allocatable on the cluster's ready nodes."""
    from monkey.drivers.k8s_api import GPU, amount

    shapes = set()
    for node in nodes:
        if not node_ready(node) or node.get("spec", {}).get("unschedulable"):
            continue
        allocatable = node["status"].get("allocatable", {})
        shapes.add(
            (
                int(amount(allocatable.get("cpu", 0))),
                int(amount(allocatable.get(GPU, 0))),
                int(amount(allocatable.get("memory", 0))),
            )
        )
    return sorted([list(s) for s in shapes])


def capacity_of(name: str, nodes: list[dict[str, Any]]) -> Capacity:
    """The cluster NAME as one instance: its ready nodes' allocatable CPUs and GPUs summed
    (the scheduler places each pod on one node, and says so when none fits)."""
    from monkey.drivers.k8s_api import GPU, amount

    ready = [n for n in nodes if node_ready(n) and not n.get("spec", {}).get("unschedulable")]
    cpus = sum(int(amount(n["status"].get("allocatable", {}).get("cpu", 0))) for n in ready)
    gpus = sum(int(amount(n["status"].get("allocatable", {}).get(GPU, 0))) for n in ready)
    memory = sum(int(amount(n["status"].get("allocatable", {}).get("memory", 0))) for n in ready)
    return Capacity(name, cpus, [str(i) for i in range(gpus)], memory or None)
