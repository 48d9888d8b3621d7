"""What a cluster's objects say, for the kubernetes driver and its agent: a pod's status
read as an attempt's (waiting, running, ended and why), the cluster as one instance from its
nodes, and what a pod carries in and out (its code as a tar, its outputs)."""

from __future__ import annotations

import io
import os
import posixpath
import stat
import tarfile

from monkey.drivers.base import Capacity
from monkey.models import MonkeyError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

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


def code_tar(files: list[Any], blobs_dir: str) -> bytes:
    """The job's code FILES ([[relpath, digest, mode]], blobs in BLOBS_DIR) as a tar: files
    with their mode, links out of the project as symlinks (their blob holds the target)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel, digest, mode in files:
            name = posixpath.normpath(str(rel))
            if name.startswith("/") or name == ".." or name.startswith("../"):
                raise MonkeyError(f"unsafe path {rel!r} in the job's code")
            try:
                with open(os.path.join(blobs_dir, digest[:2], digest[2:]), "rb") as f:
                    data = f.read()
            except OSError as exc:
                raise MonkeyError(f"missing blob {digest} of {rel}: {exc}") from None
            info = tarfile.TarInfo(name)
            if stat.S_ISLNK(int(mode)):
                info.type, info.linkname = tarfile.SYMTYPE, os.fsdecode(data)
                tar.addfile(info)
            else:
                info.size, info.mode = len(data), int(mode) & 0o777
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def mark_of(pod: str) -> str:
    """What POD prints once its job ended (never a line a job writes by chance)."""
    import hashlib

    return "monkey-job-ended-" + hashlib.sha256(pod.encode()).hexdigest()[:24]


def unpack_outputs(data: bytes, globs: list[str], dest: str) -> int:
    """The regular files of the tar DATA whose path (or a folder of it) matches one of
    GLOBS, written under DEST; how many. Nothing leaves DEST."""
    import fnmatch

    count = 0
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        for member in tar:
            name = posixpath.normpath(member.name)
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


def one_name(text: str) -> str:
    if not text or "/" in text or text in (".", ".."):
        raise MonkeyError(f"workdir_name must be one path component: {text!r}")
    return text


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
