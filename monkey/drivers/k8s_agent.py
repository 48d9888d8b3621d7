"""The `kubernetes` provider's agent: the agent protocol (docs/agent-protocol.md) spoken by
a thread of the core, which runs each attempt as one Pod.

The core links to it as to any agent (an AgentLink over one end of a socket pair) and asks
it to ``start``, ``signal`` and ``sync`` attempts. A start creates the attempt's Pod (the
job's image, its command and own environment, its CPUs, memory and GPUs as requests and
limits; a registry login becomes a pull secret of the pod's); what the pod does comes from
ONE watch of this home's pods (``Cluster.watch``), never from polling, and is written to the
attempt's run folder in MONKEY_HOME as the worker agent writes it: ``events.jsonl``
(started, heartbeats carrying a one-line ``phase`` while the pod waits: ``pending 0/3 nodes
are available: 3 Insufficient nvidia.com/gpu.``, ``pulling image REF``; exit), the pod's log
as ``stdout.log`` (Kubernetes merges stdout and stderr), and what the pod went through in
``setup.log``. An image that cannot be pulled (not found, unauthorized) ends the attempt
at once as a failed set-up (one line, not retried), a pod not scheduled within
``schedule_timeout`` as ``given_up`` (the core hands the job to another of its providers);
both delete the pod; ``signal`` deletes the pod with the grace period asked.

A core that restarts links again and syncs: attempts whose pod still exists are adopted
(their log followed on from the bytes already kept), those whose pod is gone without an
exit are ``vanished``.

The job's code snapshot goes into the pod's emptyDir (``/monkey/work``) through the API
server's exec channel once the pod runs (a tar on the exec's stdin: the image needs sh,
head and tar), and the pod's command waits for it; no ConfigMap, no inbound port.

With ``run --outputs``, the pod's command prints a mark once the job ended (cut from the
log) and waits; the files matching the globs are read through an exec into the run
folder's work/, then the pod ends.

A pod Kubernetes disrupts (its DisruptionTarget condition: evicted for node pressure,
preempted by the scheduler, a drain) ends its attempt ``preempted`` with the reason, as a
spot notice does: the job goes back to the queue without using a retry and runs again in a
new pod (the kubelet gives the job SIGTERM and the pod's grace period).

A container OOMKilled ends its attempt with its code (137) and ``OOMKilled, limit 16Gi``.
A pod of this home that no attempt has once a core synced (its attempt ended while no core
ran) is an orphan: deleted with its pull secret.

Not done yet (issue 45): datasets, checkpoints, persisted folders and ``monkey.log`` in the
pod (they need the worker agent inside the pod, reached through the same exec channel).
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import socket
import tarfile
import threading
import time
from dataclasses import dataclass, field

from monkey.client_agent.rundir import ABANDONED, EVENTS, SETUP_LOG, STDOUT
from monkey.drivers.agent_link import AgentLink
from monkey.drivers.k8s_api import LABEL, RUN_FOLDER, Cluster, label_value, pod_manifest
from monkey.drivers.k8s_pods import (
    capacity_of,
    code_tar,
    disruption_of,
    manifest_cpus,
    mark_of,
    one_name,
    status_of,
    unpack_outputs,
)
from monkey.models import MonkeyError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

log = logging.getLogger("monkey.kubernetes")

VERSION = 1
# Variables of a job's start that name this machine's folders: meaningless in a pod.
_LOCAL_ONLY = {"MONKEY_RUN_DIR", "MONKEY_CHECKPOINT_DIR", "CUDA_VISIBLE_DEVICES", "PYTHONPATH"}
# What a start may ask that a pod cannot have yet (it needs monkey's agent in the pod).
_NOT_YET = (
    ("datasets", "datasets"),
    ("placed", "job.yml data folders"),
    ("setup", "a job.yml set-up"),
    ("persist", "persisted folders"),
)


@dataclass
class _Attempt:
    juid: str
    n: int
    run_dir: str
    pod: str
    image: str
    created: float
    secret: str | None = None
    seq: int = 0
    phase: str | None = None
    scheduled: bool = False
    said: str = ""  # the last line written to setup.log
    beat_at: float = 0.0
    signalled: int | None = None  # the signal asked (the pod was deleted for it)
    ended: bool = False  # its exit event is written
    ending: dict[str, Any] | None = None  # the exit, written once its log is whole
    code: bytes | None = None  # the job's code as a tar, until it is in the pod
    outputs: list[str] = field(default_factory=list)  # run --outputs globs, brought back
    mark: str = ""  # what the pod prints once its job ended, before its outputs are read
    disrupted: str = ""  # why Kubernetes is stopping the pod (evicted, preempted, drained)
    # Its `started` event is written: what the watch saw of its pod before waits for it
    # (a pod may run and end before its creation's answer came back).
    started: bool = False
    workdir: str = ""  # where it goes in the pod (the command's folder: cwd)
    logging: threading.Thread | None = None
    log_done: threading.Event = field(default_factory=threading.Event)


class ClusterAgent:
    """The agent protocol over a cluster: one per provider, in the core."""

    def __init__(self, name: str, home_id: str, options: dict[str, Any]) -> None:
        self.name = name
        self.options = options
        self.home_id = home_id
        self.selector = f"{LABEL}/home={label_value(home_id)}"
        self.schedule_timeout = float(options.get("schedule_timeout", 60))
        self.beat = max(0.2, float(os.environ.get("MONKEY_HEARTBEAT", "5")))
        self.lock = threading.RLock()
        self.attempts: dict[tuple[str, int], _Attempt] = {}
        self.pods: dict[str, dict[str, Any]] = {}  # by name, as the watch last saw them
        self.listed = threading.Event()  # the watch's first listing is in
        self.subscribers: list[_Conn] = []
        self.closed = threading.Event()
        self.error: str | None = None  # why the watch cannot follow the cluster now
        self.manifests: dict[str, list[Any]] = {}  # code file lists given, by digest
        self._cluster: Cluster | None = None
        self._threads: list[threading.Thread] = []

    @property
    def cluster(self) -> Cluster:
        with self.lock:
            if self._cluster is None:
                self._cluster = Cluster(
                    self.options.get("kubeconfig"),
                    self.options.get("context"),
                    self.options.get("namespace"),
                )
            return self._cluster

    # -- links ------------------------------------------------------------------------------

    def connect(self) -> AgentLink:
        """A link to this agent (its watch and heartbeats start with the first)."""
        self.cluster  # noqa: B018  (a kubeconfig problem is the link's error)
        with self.lock:
            if not self._threads:
                for target, what in ((self._watching, "watch"), (self._beating, "beats")):
                    thread = threading.Thread(
                        target=target, name=f"k8s-{self.name}-{what}", daemon=True
                    )
                    thread.start()
                    self._threads.append(thread)
        mine, theirs = socket.socketpair()
        conn = _Conn(self, mine)
        threading.Thread(target=conn.serve, name=f"k8s-{self.name}-link", daemon=True).start()
        return AgentLink(theirs)

    def close(self) -> None:
        self.closed.set()
        with self.lock:
            for conn in list(self.subscribers):
                conn.close()
            if self._cluster is not None:
                self._cluster.close()

    # -- requests ---------------------------------------------------------------------------

    def hello(self) -> dict[str, Any]:
        """The protocol's hello; cpus, memory and gpus: the cluster's ready nodes'
        allocatable ones (one listing)."""
        cap = capacity_of(self.name, self.cluster.nodes())
        return {"version": VERSION, "digest": "kubernetes", "code": "", "pid": os.getpid(),
                "root": "", "cpus": cap.slots, "memory": cap.memory or 0,
                "gpus": [{"index": g} for g in cap.gpus]}  # fmt: skip

    def start(self, req: dict[str, Any]) -> dict[str, Any]:
        juid, n, run_dir = req["juid"], int(req["attempt"]), req["run_dir"]
        image_fields = req.get("image") or {}
        image = (
            f"{image_fields['name']}@{image_fields['digest']}"
            if image_fields
            else self.options.get("image")
        )
        if not image:
            raise MonkeyError(
                f"provider {self.name!r} runs jobs in images: give run --image REF, or "
                "image: in job.yml or in the provider's entry"
            )
        missing = [what for key, what in _NOT_YET if req.get(key)]
        if missing:
            raise MonkeyError(
                f"provider {self.name!r} (kubernetes) cannot give a pod {' or '.join(missing)} "
                "yet: put what the job needs into its image"
            )
        os.makedirs(run_dir, exist_ok=True)
        if os.path.exists(os.path.join(run_dir, EVENTS)) or os.path.exists(
            os.path.join(run_dir, ABANDONED)
        ):
            raise MonkeyError(f"{run_dir} was used already: not started again")
        pod = label_value(f"monkey-{self.home_id[:6]}-{juid}-{n}").lower()
        labels = {
            f"{LABEL}/home": label_value(self.home_id),
            f"{LABEL}/job": label_value(juid),
            f"{LABEL}/attempt": str(n),
            f"{LABEL}/owner": label_value(str(req.get("owner") or "unknown")),
        }
        env = {k: str(v) for k, v in (req.get("env") or {}).items() if k not in _LOCAL_ONLY}
        resources = req.get("resources") or {}
        gpus = int(resources.get("gpus") or 0)
        files = self._files(req)
        outputs = [str(o) for o in req.get("outputs") or []]
        code, work, cwd = None, None, ""
        if files:
            code = code_tar(files, req["blobs_dir"])
            work = f"{RUN_FOLDER}/work"
            if req.get("workdir_name"):
                work = f"{work}/{one_name(req['workdir_name'])}"
            cwd = posixpath.normpath(f"{work}/{req['cwd']}") if req.get("cwd") else work
            if not cwd.startswith(f"{work}"):
                raise MonkeyError(f"cwd {req['cwd']!r} leaves the job's code")
        secret = None
        auths = (req.get("image_auth") or {}).get("auths")
        cluster = self.cluster
        if auths:
            secret = f"{pod}-pull"
            cluster.pull_secret(secret, auths, labels)
        manifest = pod_manifest(
            pod,
            labels,
            image,
            list(req["argv"]),
            env,
            int(resources.get("cpus") or req.get("cpus") or 1),
            resources.get("memory"),
            gpus,
            self.options,
            secret,
            cwd or None,
            mark_of(pod) if code is not None and outputs else None,
        )
        att = _Attempt(juid, n, run_dir, pod, image, time.time(), secret)
        att.code, att.workdir, att.outputs = code, cwd, outputs
        att.mark = mark_of(pod) if code is not None and outputs else ""
        with self.lock:
            self.attempts[(juid, n)] = att
        try:
            cluster.create_pod(manifest)
        except MonkeyError:
            with self.lock:
                self.attempts.pop((juid, n), None)
            if secret:
                cluster.delete_secret(secret)
            raise
        self._setup_line(att, f"pod {pod} created in namespace {cluster.namespace} ({image})")
        with self.lock:
            self._emit(att, "started", pid=0, pod=pod, gpus=[], cpus=manifest_cpus(manifest))
            att.started = True
            seen = self.pods.get(pod)
        if seen is not None:
            self._follow(att, seen)
        return {"pid": 0}

    def signal(self, req: dict[str, Any]) -> dict[str, Any]:
        """Delete the attempt's pod: SIGTERM, then SIGKILL after the grace asked (0 for KILL)."""
        with self.lock:
            att = self.attempts.get((req["juid"], int(req["attempt"])))
        if att is None or att.ended or att.ending is not None:
            return {"running": False}
        sig = str(req.get("signal", "TERM")).upper().removeprefix("SIG")
        grace = 0 if sig in ("KILL", "9") else int(float(req.get("grace", 10)))
        att.signalled = 9 if grace == 0 else 15
        self._setup_line(att, f"pod {att.pod} deleted (SIG{sig}, grace {grace}s)")
        gone = not self.cluster.delete_pod(att.pod, grace)
        if gone:
            self._end(att, {"code": None, "signal": att.signalled, "reason": "killed"})
        return {"running": not gone}

    def sync(self, req: dict[str, Any]) -> dict[str, Any]:
        """The named attempts' status; those not known here are adopted from their run
        folder and the pods the watch lists."""
        self.listed.wait(20)
        out = []
        for item in req.get("attempts") or []:
            juid, n, run_dir = item["juid"], int(item["attempt"]), item["run_dir"]
            with self.lock:
                att = self.attempts.get((juid, n))
            if att is None:
                att = self._adopt(juid, n, run_dir)
            if att is None:
                status = "exited" if _has_exit(run_dir) else "unknown"
                if status == "unknown":
                    os.makedirs(run_dir, exist_ok=True)
                    open(os.path.join(run_dir, ABANDONED), "a").close()
            else:
                status = "exited" if att.ended else "running"
            out.append({"juid": juid, "attempt": n, "status": status})
        with self.lock:  # every live attempt of the cluster is named by a core's sync
            tracked = {a.pod for a in self.attempts.values()}
            orphans = sorted(name for name in self.pods if name not in tracked)
        if orphans:
            threading.Thread(target=self._collect, args=(orphans,), daemon=True).start()
        return {"attempts": out}

    def _collect(self, orphans: list[str]) -> None:
        """Delete the pods (and pull secrets) of this home that no attempt has: left by a
        core that died, whose attempts were ended since (lost, cancelled)."""
        for name in orphans:
            log.warning("%s: deleting pod %s: no attempt of this home runs there", self.name, name)
            try:
                self.cluster.delete_pod(name, 0)
                self.cluster.delete_secret(f"{name}-pull")
            except MonkeyError as exc:
                log.warning("%s: %s", self.name, exc)

    def jobs(self) -> dict[str, Any]:
        with self.lock:
            return {
                "jobs": [
                    {"juid": a.juid, "attempt": a.n, "pid": 0, "run_dir": a.run_dir}
                    for a in self.attempts.values()
                    if not a.ended
                ]
            }

    def _adopt(self, juid: str, n: int, run_dir: str) -> _Attempt | None:
        """The attempt a core before this one started, when its run folder says it started
        and has no exit: followed again from its pod, or ended ``vanished`` without one."""
        events = _events(run_dir)
        if not events or any(e.get("type") == "exit" for e in events):
            return None
        started = next((e for e in events if e.get("type") == "started"), None)
        if started is None:
            return None
        pod_name = str(started.get("pod") or "")
        with self.lock:
            pod = self.pods.get(pod_name)
            image = pod["spec"]["containers"][0]["image"] if pod else ""
            att = _Attempt(juid, n, run_dir, pod_name, image, started.get("ts") or time.time())
            att.seq = max(int(e.get("seq") or 0) for e in events)
            att.started = True
            att.secret = f"{pod_name}-pull"
            command = pod["spec"]["containers"][0].get("command") or [] if pod else []
            if len(command) > 5 and command[5] == mark_of(pod_name):  # sh -c SCRIPT $0 $1 $2
                att.mark = command[5]
            self.attempts[(juid, n)] = att
        if pod is None:
            self._end(att, {"code": None, "signal": None, "reason": "vanished"})
        else:
            self._follow(att, pod)
        return att

    # -- the cluster's side ----------------------------------------------------------------

    def _watching(self) -> None:
        """Follow this home's pods with one watch; reconnect after a failure (its line is
        the provider's error meanwhile)."""
        delay = 1.0
        while not self.closed.is_set():
            try:
                self.cluster.watch(self.selector, self._listed, self._changed, self.closed.is_set)
                delay = 1.0
            except MonkeyError as exc:
                if self.error != str(exc):
                    log.warning("%s: %s", self.name, exc)
                self.error = str(exc)
                if self.closed.wait(delay):
                    return
                delay = min(30.0, delay * 2)

    def _listed(self, pods: list[dict[str, Any]]) -> None:
        with self.lock:
            self.pods = {p["metadata"]["name"]: p for p in pods}
            self.error = None
        for pod in pods:
            self._changed("MODIFIED", pod)
        with self.lock:  # attempts whose pod is gone from the listing (deleted meanwhile)
            named = set(self.pods)
            gone = [a for a in self.attempts.values() if a.pod not in named and not a.ended]
        for att in gone:
            if att.ending is None and time.time() - att.created > 5:
                self._changed("DELETED", {"metadata": {"name": att.pod}})
        self.listed.set()

    def _changed(self, kind: str, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        with self.lock:
            if kind == "DELETED":
                self.pods.pop(name, None)
            else:
                self.pods[name] = pod
            att = next((a for a in self.attempts.values() if a.pod == name), None)
        if att is None or att.ended or not att.started:
            return
        if kind == "DELETED":
            if att.ending is None:
                if att.signalled is not None:
                    self._end(att, {"code": None, "signal": att.signalled, "reason": "killed"})
                elif att.disrupted:
                    self._end(att, {"code": None, "signal": None, "reason": "preempted",
                                    "detail": att.disrupted})  # fmt: skip
                else:
                    self._setup_line(att, f"pod {name} was deleted from outside monkey")
                    self._end(att, {"code": None, "signal": None, "reason": "vanished"})
            return
        self._follow(att, pod)

    def _follow(self, att: _Attempt, pod: dict[str, Any]) -> None:
        """Act on what POD does now: its phase on the job, its log, its end."""
        kind, line, details = status_of(pod)
        disrupted = disruption_of(pod)
        if disrupted and not att.disrupted:
            att.disrupted = disrupted
            self._setup_line(att, f"pod {att.pod}: {disrupted}")
        if pod["spec"].get("nodeName") and not att.scheduled:
            att.scheduled = True
            self._setup_line(att, f"pod {att.pod} scheduled on node {pod['spec']['nodeName']}")
        if kind in ("pending", "creating"):
            if line != att.phase:
                att.phase = line
                self._setup_line(att, line or kind)
                self._emit(att, "heartbeat", phase=line)
            return
        if kind in ("image", "failed"):
            self._fail(att, line or kind)
            return
        if att.phase is not None:
            att.phase = None
            self._emit(att, "heartbeat")
        with self.lock:
            tar = att.code if kind == "running" else None
            if tar is not None:
                att.code = None
        if tar is not None:
            threading.Thread(target=self._upload, args=(att, tar), daemon=True).start()
        self._log(att)
        if kind == "ended" and att.ending is None:
            code = details.get("exitCode")
            reason = details.get("reason") or ""
            detail = {}
            if reason == "OOMKilled":
                limits = pod["spec"]["containers"][0].get("resources", {}).get("limits", {})
                said = f"OOMKilled, limit {limits['memory']}" if "memory" in limits else "OOMKilled"
                self._setup_line(att, f"pod {att.pod}: {said}")
                detail = {"detail": said}
            if att.signalled is not None:
                ending = {"code": code, "signal": att.signalled, "reason": "killed"}
            elif att.disrupted:  # as a spot notice: queued again without using a retry
                ending = {"code": code, "signal": None, "reason": "preempted",
                          "detail": att.disrupted}  # fmt: skip
            else:
                ending = {"code": code, "signal": None, "reason": "exited", **detail}
            att.ending = ending
            threading.Thread(target=self._end_after_log, args=(att,), daemon=True).start()

    def _upload(self, att: _Attempt, code: bytes) -> None:
        """Put the job's CODE (a tar) into its pod's run folder through an exec; the pod's
        command then starts in it. A failure ends the attempt as a failed set-up."""
        started = time.monotonic()
        work = f"{RUN_FOLDER}/work"
        script = (
            f"mkdir -p {work} '{att.workdir}' && head -c {len(code)} | tar -x -f - -C {work}"
            f" && touch {RUN_FOLDER}/ready"
        )
        try:
            status, _out, err = self.cluster.exec(att.pod, ["sh", "-c", script], code)
        except MonkeyError as exc:
            self._fail(att, f"the job's code could not be put in pod {att.pod}: {exc}")
            return
        if status != 0:
            said = (err.decode(errors="replace").strip().splitlines() or [f"exit {status}"])[-1]
            self._fail(
                att,
                f"the job's code could not be put in pod {att.pod} (its image needs sh, head "
                f"and tar): {said[-200:]}",
            )
            return
        self._setup_line(
            att,
            f"the job's code ({len(code):,} bytes) put in pod {att.pod} in "
            f"{time.monotonic() - started:.1f} s",
        )

    def _fetch(self, att: _Attempt) -> None:
        """Bring the files of the job's work folder that match its outputs globs into its
        run folder's work/ (a tar read through an exec), then let the pod end."""
        work = f"{RUN_FOLDER}/work"
        script = f"cd {work} && tar -c -f - . ; touch {RUN_FOLDER}/fetched"
        try:
            _status, out, err = self.cluster.exec(att.pod, ["sh", "-c", script])
            count = unpack_outputs(out, att.outputs, os.path.join(att.run_dir, "work"))
            self._setup_line(att, f"{count} output files brought back from pod {att.pod}")
        except (MonkeyError, OSError, tarfile.TarError) as exc:
            self._setup_line(att, f"the outputs of pod {att.pod} could not be brought back: {exc}")

    def _files(self, req: dict[str, Any]) -> list[Any] | None:
        """The start's code files [[relpath, digest, mode]]: given, or the list its manifest
        names (or a change to one) when this agent was given it; unknown: the core sends
        the full list again."""
        files, manifest = req.get("files"), req.get("manifest")
        if files is None and manifest:
            if req.get("base"):
                base = self.manifests.get(req["base"])
                if base is None:
                    raise MonkeyError(f"unknown manifest {req['base']}: send the full file list")
                changes = list(req.get("changes") or [])
                dropped = set(req.get("removed") or []) | {c[0] for c in changes}
                files = sorted([f for f in base if f[0] not in dropped] + changes)
            else:
                files = self.manifests.get(manifest)
                if files is None:
                    raise MonkeyError(f"unknown manifest {manifest}: send the full file list")
        if files is not None and manifest:
            with self.lock:
                if len(self.manifests) > 256:
                    self.manifests.clear()
                self.manifests[manifest] = files
        return files

    def _fail(self, att: _Attempt, why: str, reason: str = "setup") -> None:
        """End ATT as a failed set-up (WHY, one line; REASON ``given_up``: no node took it,
        another provider may), its pod deleted, not retried."""
        if att.ending is not None:
            return
        att.ending = {"code": None, "signal": None, "reason": reason, "error": why}
        self._setup_line(att, why)
        try:
            self.cluster.delete_pod(att.pod, 0)
        except MonkeyError as exc:
            log.warning("%s: %s", self.name, exc)
        self._end(att, att.ending)

    def _log(self, att: _Attempt) -> None:
        """Follow the pod's log into stdout.log (once; from the bytes kept there already)."""
        with self.lock:
            if att.logging is not None:
                return
            att.logging = threading.Thread(
                target=self._logging, args=(att,), name=f"k8s-log-{att.pod}", daemon=True
            )
        att.logging.start()

    def _logging(self, att: _Attempt) -> None:
        path = os.path.join(att.run_dir, STDOUT)
        try:
            skip = os.path.getsize(path)
        except OSError:
            skip = 0
        mark = att.mark.encode() if att.mark else b""
        held = b""  # the end of what came, while it may be the start of the mark
        done = False  # the mark came: what follows is the pod's own end
        try:
            with open(path, "ab") as out:
                for chunk in self.cluster.log(att.pod, follow=True):
                    if skip:
                        cut = min(skip, len(chunk))
                        chunk, skip = chunk[cut:], skip - cut
                    if not chunk or done:
                        continue
                    data, held = held + chunk, b""
                    at = data.find(mark) if mark else -1
                    if at >= 0:  # the job ended: its outputs are read before the pod ends
                        out.write(data[:at])
                        out.flush()
                        done = True
                        self._fetch(att)
                        continue
                    keep = len(mark) - 1 if mark else 0
                    while keep and not data.endswith(mark[:keep]):
                        keep -= 1
                    data, held = (data[:-keep], data[-keep:]) if keep else (data, b"")
                    out.write(data)
                    out.flush()
                out.write(held)
        except MonkeyError as exc:
            self._setup_line(att, f"the pod's log could not be read: {exc}")
        finally:
            att.log_done.set()

    def _end_after_log(self, att: _Attempt) -> None:
        att.log_done.wait(30)
        assert att.ending is not None
        self._end(att, att.ending)
        try:
            self.cluster.delete_pod(att.pod, 0)
        except MonkeyError as exc:
            log.warning("%s: %s", self.name, exc)

    def _end(self, att: _Attempt, ending: dict[str, Any]) -> None:
        with self.lock:
            if att.ended:
                return
            att.ended = True
        att.ending = ending
        self._emit(att, "exit", **ending)
        if att.secret:
            try:
                self.cluster.delete_secret(att.secret)
            except MonkeyError as exc:
                log.warning("%s: %s", self.name, exc)

    def _beating(self) -> None:
        """Heartbeats of the live attempts (their phase), and the schedule timeout."""
        while not self.closed.wait(min(self.beat, 0.5)):
            now = time.time()
            with self.lock:
                live = [
                    a
                    for a in self.attempts.values()
                    if a.started and not a.ended and a.ending is None
                ]
            for att in live:
                if not att.scheduled and now - att.created > self.schedule_timeout:
                    said = (att.phase or "pending").removeprefix("pending").strip()
                    self._fail(
                        att,
                        f"not scheduled within schedule_timeout {self.schedule_timeout:g}s"
                        + (f": {said}" if said else ""),
                        "given_up",
                    )
                elif now - att.beat_at >= self.beat:
                    att.beat_at = now
                    self._emit(att, "heartbeat", **({"phase": att.phase} if att.phase else {}))

    # -- the run folder ----------------------------------------------------------------------

    def _emit(self, att: _Attempt, kind: str, **fields: Any) -> None:
        """Append an event to the attempt's events.jsonl and push it to the linked cores."""
        with self.lock:
            if att.ended and kind != "exit":
                return
            att.seq += 1
            event = {"seq": att.seq, "ts": time.time(), "type": kind, **fields}
            path = os.path.join(att.run_dir, EVENTS)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, (json.dumps(event) + "\n").encode())
                offset = os.fstat(fd).st_size
            finally:
                os.close(fd)
            push = {"push": "event", "juid": att.juid, "attempt": att.n, "offset": offset,
                    "event": event}  # fmt: skip
            for conn in list(self.subscribers):
                conn.send(push)

    def _setup_line(self, att: _Attempt, text: str) -> None:
        if text == att.said:
            return
        att.said = text
        try:
            with open(os.path.join(att.run_dir, SETUP_LOG), "a") as f:
                f.write(f"[monkey] {text}\n")
        except OSError:
            pass


def _events(run_dir: str) -> list[dict[str, Any]]:
    try:
        with open(os.path.join(run_dir, EVENTS)) as f:
            return [json.loads(line) for line in f if line.strip().endswith("}")]
    except (OSError, ValueError):
        return []


def _has_exit(run_dir: str) -> bool:
    return any(e.get("type") == "exit" for e in _events(run_dir))


class _Conn:
    """One link from a core: requests in, replies and pushes out."""

    def __init__(self, agent: ClusterAgent, sock: socket.socket) -> None:
        self.agent = agent
        self.sock = sock
        self.wlock = threading.Lock()
        self.open = True

    def send(self, msg: dict[str, Any]) -> None:
        data = (json.dumps(msg, separators=(",", ":")) + "\n").encode()
        with self.wlock:
            try:
                self.sock.sendall(data)
            except OSError:
                self.close()

    def close(self) -> None:
        self.open = False
        with self.agent.lock:
            if self in self.agent.subscribers:
                self.agent.subscribers.remove(self)
        try:
            self.sock.close()
        except OSError:
            pass

    def serve(self) -> None:
        buf = b""
        try:
            while self.open:
                data = self.sock.recv(1 << 16)
                if not data:
                    break
                buf += data
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip():
                        self._handle(json.loads(line))
        except (OSError, ValueError):
            pass
        finally:
            self.close()

    def _handle(self, req: dict[str, Any]) -> None:
        agent, op, rid = self.agent, req.get("op"), req.get("id")
        try:
            if op == "hello":
                reply = agent.hello()
            elif op == "start":
                reply = agent.start(req)
            elif op == "signal":
                reply = agent.signal(req)
            elif op == "sync":
                reply = agent.sync(req)
            elif op == "jobs":
                reply = agent.jobs()
            elif op in ("ping", "shutdown"):
                reply = {"stopping": False}
            else:
                raise MonkeyError(f"unknown op {op!r}")
        except (MonkeyError, KeyError, TypeError, ValueError, OSError) as exc:
            self.send({"id": rid, "ok": False, "error": str(exc) or type(exc).__name__})
            return
        self.send({"id": rid, "ok": True, **reply})
        if op == "sync":
            with agent.lock:  # no event is written between the replay and the subscription
                self._replay(req)
                agent.subscribers.append(self)

    def _replay(self, req: dict[str, Any]) -> None:
        """Push every event of the named attempts after the offset the core has."""
        for item in req.get("attempts") or []:
            path = os.path.join(item["run_dir"], EVENTS)
            try:
                with open(path, "rb") as f:
                    f.seek(int(item.get("offset") or 0))
                    data = f.read()
                    start = int(item.get("offset") or 0)
            except OSError:
                continue
            for line in data.split(b"\n")[:-1]:
                start += len(line) + 1
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                self.send({"push": "event", "juid": item["juid"], "attempt": item["attempt"],
                           "offset": start, "event": event})  # fmt: skip
