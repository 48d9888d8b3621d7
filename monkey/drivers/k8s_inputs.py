"""What a pod carries in and out through the API server's exec channel: its inputs before
monkey's agent starts there (the agent's code, the job's blobs, checkpoint and saved
persisted folders: only the blobs a cache claim lacks), and the job's results once it
exited (its checkpoint, persisted folders and ``run --outputs``), the checkpoint and persisted
folders also now and then while it runs."""

from __future__ import annotations

import os
import time

from monkey.drivers.k8s_api import POD_CACHE, RUN_FOLDER, Cluster
from monkey.drivers.k8s_pods import (
    MISSING,
    PACK,
    UNPACK,
    inputs_tar,
    unpack_kept,
    unpack_outputs,
)
from monkey.models import MonkeyError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def put_inputs(
    cluster: Cluster, pod: str, image: str, start: dict[str, Any], cache_claim: str | None
) -> str:
    """Put what START (the attempt's POD_START record) names into POD, unpacked into
    /monkey by the image's python3 (checked first: MonkeyError in one line without one),
    which lets the agent start; the line saying so. With CACHE_CLAIM, one exec first asks
    which blobs the claim lacks, and only those are sent."""
    began = time.monotonic()
    kept = {k: v for k, v in (start.get("kept") or {}).items() if v}
    blobs = list(dict.fromkeys(start.get("blobs") or []))
    at, cached = "blobs", ""
    if cache_claim and blobs:
        listed = "\n".join(blobs).encode()
        out = _python3(cluster, pod, image, MISSING, listed, f"the cache claim {cache_claim}")
        lacking = set(out.decode().split())
        at = POD_CACHE.removeprefix(RUN_FOLDER + "/") + "/blobs"
        cached = (f", {len(blobs) - len(lacking)} of its {len(blobs)} blobs in the cache "
                  f"claim {cache_claim} already")  # fmt: skip
        blobs = [b for b in blobs if b in lacking]
    try:
        tar = inputs_tar(blobs, start["blobs_dir"], kept, at)
    except (KeyError, OSError) as exc:
        raise MonkeyError(f"the job's inputs could not be read: {exc}") from None
    _python3(cluster, pod, image, UNPACK, tar, f"the job's inputs could not be put in pod {pod}")
    return (
        f"monkey's agent and the job's inputs ({len(tar):,} bytes{cached}) put in pod {pod} "
        f"in {time.monotonic() - began:.1f} s"
    )


def _python3(cluster: Cluster, pod: str, image: str, script: str, data: bytes, what: str) -> bytes:
    """SCRIPT run by the pod's python3 with DATA on its stdin (its size its argument); its
    output. When it fails, MonkeyError: the image has no python3 (asked then, by one exec:
    never on the way of a pod that has one), or WHAT and the script's last line."""
    try:
        status, out, err = cluster.exec(pod, ["python3", "-I", "-c", script, str(len(data))], data)
        said = (err.decode(errors="replace").strip().splitlines() or [f"exit {status}"])[-1]
    except MonkeyError as exc:
        status, out, said = -1, b"", str(exc)
    if status == 0:
        return out
    if cluster.exec(pod, ["sh", "-c", "command -v python3"])[0] != 0:
        raise MonkeyError(
            f"image {image} has no python3: monkey's agent runs in the pod with the "
            "image's python3 (standard library only); use an image that has one"
        )
    raise MonkeyError(f"{what}: {said[-200:]}")


def fetch_results(cluster: Cluster, pod: str, start: dict[str, Any], run_dir: str) -> list[str]:
    """Read the job's checkpoint, persisted folders and outputs back from POD (one exec)
    into the local folders START names and RUN_DIR's work/; the lines saying so."""
    outputs = start.get("outputs") or []
    said = []
    try:
        count, out = _read_back(cluster, pod, start, ["run/work"] if outputs else [])
        if outputs:
            got = unpack_outputs(out, outputs, os.path.join(run_dir, "work"), "run/work")
            said.append(f"{got} output files brought back from pod {pod}")
        if count:
            said.append(f"{count} kept files brought back from pod {pod}")
    except (MonkeyError, OSError, ValueError) as exc:
        said.append(f"the job's results could not be brought back from pod {pod}: {exc}")
    return said


def read_kept(cluster: Cluster, pod: str, start: dict[str, Any]) -> int:
    """Read the job's checkpoint and persisted folders back from POD while it runs (one
    exec), replacing the local copies START names: a pod lost without warning then resumes
    from them; the files read. MonkeyError, OSError or ValueError when it cannot."""
    return _read_back(cluster, pod, start, [])[0]


def _read_back(
    cluster: Cluster, pod: str, start: dict[str, Any], more: list[str]
) -> tuple[int, bytes]:
    """The kept folders START names, and the folders MORE (under /monkey), read from POD as
    one tar; the kept ones unpacked over their local copies. (kept files written, the tar)"""
    kept = {k: v for k, v in (start.get("kept") or {}).items() if v}
    if not kept and not more:
        return 0, b""
    status, out, err = cluster.exec(pod, ["python3", "-I", "-c", PACK, *kept, *more], timeout=600)
    if status != 0:
        raise MonkeyError(err.decode(errors="replace").strip()[-200:] or f"exit {status}")
    return unpack_kept(out, kept), out
