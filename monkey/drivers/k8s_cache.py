"""A cluster's cache claim (the entry's ``cache_claim``) for `monkey gc` and `du --hosts`,
as an SSH host's folder is: the hosts' own clean-up and measure scripts (ssh_remote.CLEAN,
ssh_remote.USAGE) run by python3 in a pod that mounts the claim, through the API server's
exec. The claim holds the blobs of the jobs' code and datasets by digest under
/monkey/cache/blobs (a pod's check touches those it uses) and each home's list of the blobs
its jobs need under /monkey/cache/runs/<home>/, so one home's gc never takes another's.

The pod is one of this home's running pods (every one mounts the claim); with none, a pod
of its own in the entry's default image, deleted once done. With neither (no pod runs and
the entry names no image), the chore waits, as for a host out of reach."""

from __future__ import annotations

import time

from monkey.drivers.k8s_api import LABEL, POD_CACHE, Cluster, label_value, pod_manifest
from monkey.drivers.k8s_pods import READ_STDIN, status_of
from monkey.models import MonkeyError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

CHORES = f"{LABEL}/chores"  # the label of a pod made to reach the claim (not a job's)
# The script's stdin: the bytes sent (an exec's stdin never ends), its own arguments after.
_FED = READ_STDIN + "sys.stdin = io.TextIOWrapper(io.BytesIO(data)); del sys.argv[1]\n"
_LIFE = 900  # seconds a chores pod lives at most (one a core left behind ends by itself)


def runs_dir(home_id: str) -> str:
    """This home's folder in the claim (its list of the blobs its jobs need)."""
    return f"{POD_CACHE}/runs/{label_value(home_id)}"


def run_in_claim(
    cluster: Cluster,
    options: dict[str, Any],
    home_id: str,
    script: str,
    args: list[str],
    data: bytes = b"",
    auths: dict[str, Any] | None = None,
) -> bytes:
    """SCRIPT's output, run by python3 with ARGS and DATA on its stdin in a pod mounting the
    claim of the entry OPTIONS (AUTHS: the registry login of the default image's registry,
    for a pod made for it). MonkeyError in one line when it cannot be."""
    home = label_value(home_id)
    pod = _running_pod(cluster, options, f"{LABEL}/home={home}")
    made = None
    if pod is None:
        made = pod = _chores_pod(cluster, options, home, auths)
    try:
        argv = ["python3", "-I", "-c", _FED + script, str(len(data)), *args]
        status, out, err = cluster.exec(pod, argv, data, 600)
    finally:
        if made is not None:
            _remove(cluster, made, bool(auths))
    if status != 0:
        said = err.decode(errors="replace").strip().splitlines() or [f"exit {status}"]
        raise MonkeyError(f"in pod {pod}: {said[-1][-200:]}")
    return out


def _running_pod(cluster: Cluster, options: dict[str, Any], selector: str) -> str | None:
    claim = str(options["cache_claim"])
    for pod in cluster.pods(selector):
        volumes = pod["spec"].get("volumes") or []
        mounts = any((v.get("persistentVolumeClaim") or {}).get("claimName") == claim
                     for v in volumes)  # fmt: skip
        if mounts and not pod["metadata"].get("deletionTimestamp"):
            if status_of(pod)[0] == "running":
                return str(pod["metadata"]["name"])
    return None


def _chores_pod(
    cluster: Cluster, options: dict[str, Any], home: str, auths: dict[str, Any] | None
) -> str:
    """A pod of the default image that mounts the claim and sleeps, once it runs; its name."""
    image = options.get("image")
    if not image:
        raise MonkeyError(
            f"no pod of this home runs to reach the cache claim {options['cache_claim']} "
            "and the provider's entry names no image to start one in (provider add "
            "--image REF); done once one runs"
        )
    name = f"monkey-{home[:6]}-cache-chores".lower()
    _remove(cluster, name, bool(auths))  # one a core left behind
    labels = {CHORES: home}
    secret = None
    if auths:
        secret = f"{name}-pull"
        cluster.pull_secret(secret, auths, labels)
    manifest = pod_manifest(name, labels, str(image), 1, None, 0, options, secret)
    spec = manifest["spec"]
    spec["activeDeadlineSeconds"] = _LIFE
    spec["containers"][0]["command"] = ["python3", "-I", "-c", f"import time; time.sleep({_LIFE})"]
    cluster.create_pod(manifest)
    deadline = time.monotonic() + float(options.get("schedule_timeout", 60))
    while True:
        pods = [p for p in cluster.pods(f"{CHORES}={home}") if p["metadata"]["name"] == name]
        kind, line, _ = status_of(pods[0]) if pods else ("gone", "deleted meanwhile", {})
        if kind == "running":
            return name
        if kind in ("image", "failed", "ended", "gone") or time.monotonic() > deadline:
            _remove(cluster, name, bool(auths))
            raise MonkeyError(
                f"a pod to reach the cache claim {options['cache_claim']} did not run: "
                f"{line or kind}"
            )
        time.sleep(0.2)


def _remove(cluster: Cluster, name: str, secret: bool) -> None:
    cluster.delete_pod(name, 0)
    if secret:
        cluster.delete_secret(f"{name}-pull")
