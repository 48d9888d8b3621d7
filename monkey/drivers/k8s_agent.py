"""The `kubernetes` provider's agent: the agent protocol (docs/agent-protocol.md) spoken by
a thread of the core, which runs each attempt as one Pod with monkey's own worker agent
inside (monkey/client_agent, run by the image's python3), reached through the API server.

The core links to it as to any agent (an AgentLink over one end of a socket pair) and asks
it to ``start``, ``signal`` and ``sync`` attempts. A start creates the attempt's Pod (the
job's image, its CPUs, memory and GPUs as requests and limits, an emptyDir at /monkey; a
registry login becomes a pull secret of the pod's); what the pod does comes from ONE watch
of this home's pods (``Cluster.watch``), never from polling, and is written to the
attempt's run folder in MONKEY_HOME: ``events.jsonl`` (started, heartbeats carrying a
one-line ``phase`` while the pod waits: ``pending 0/3 nodes are available: 3 Insufficient
nvidia.com/gpu.``, ``pulling image REF``; exit) and what the pod went through in
``setup.log``. An image that cannot be pulled (not found, unauthorized) ends the attempt at
once as a failed set-up (one line, not retried), a pod not scheduled within
``schedule_timeout`` as ``given_up`` (the core hands the job to another of its providers);
both delete the pod.

Once the pod runs, one exec puts monkey's agent, the blobs of the job's code and datasets,
its checkpoint and its saved persisted folders into /monkey (an image without python3 fails
there, in one line), and the pod's command becomes the agent. A second exec, kept open,
runs the relay (client_agent/pod.py, through ``PodLink``): the core's cluster agent hands
the pod's agent the job's ``start`` (its paths the pod's) and gets its events (heartbeats,
``monkey.log`` metrics, its exit) and its logs on the same stream, from the offsets kept
here: so the job runs as on any worker (set-up, datasets, persisted folders, the signal
to its whole process tree for cancel and pause, its exit recorded in the pod's run folder).
While it runs, its checkpoint and persisted folders are read back through an exec every
``checkpoint_every`` seconds once the relay says they changed (a pod lost without warning
resumes from there). Once the job exited, its checkpoint, persisted folders and ``run
--outputs`` are read back through an exec into MONKEY_HOME, its exit written, and the pod
deleted. The next attempt's pod gets them, as a cloud instance gets them from the bucket.

A core that restarts links again and syncs: attempts whose pod still runs are adopted (the
relay opened again from the offsets kept in the run folder: their exit, if it came
meanwhile, is replayed by the pod's agent), those whose pod is gone without an exit are
``vanished``. A pod of this home that no attempt has once a core synced (its attempt ended
while no core ran) is an orphan: deleted with its pull secret.

A pod Kubernetes disrupts (its DisruptionTarget condition: evicted for node pressure,
preempted by the scheduler, a drain) gets the kubelet's SIGTERM, which the agent takes as a
notice: the job gets SIGTERM, checkpoints, and its attempt ends ``preempted`` with the
reason, as after a spot notice: it runs again in a new pod without using a retry. A
container OOMKilled ends its attempt with its code (137) and ``OOMKilled, limit 16Gi``.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import socket
import threading
import time

from monkey.client_agent.common import write_atomic
from monkey.client_agent.rundir import (
    ABANDONED,
    EVENTS,
    POD_START,
    POD_TAKEN,
    SETUP_LOG,
)
from monkey.drivers.agent_link import AgentLink
from monkey.drivers.k8s_api import (
    LABEL,
    POD_BLOBS,
    POD_CACHE,
    POD_CHECKPOINT,
    POD_PERSIST,
    POD_RUN,
    POD_SOCKET,
    Cluster,
    label_value,
    pod_manifest,
)
from monkey.drivers.k8s_attempt import FOLLOWED, Attempt
from monkey.drivers.k8s_inputs import fetch_results, put_inputs, read_kept
from monkey.drivers.k8s_pods import (
    capacity_of,
    disruption_of,
    manifest_cpus,
    pod_rows,
    status_of,
)
from monkey.drivers.k8s_serve import (
    CoreConn,
    events_of,
    has_exit,
    read_json,
    resolve_files,
)
from monkey.models import MonkeyError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any


log = logging.getLogger("monkey.kubernetes")

VERSION = 1
# Variables of a job's start that name the submitting machine's folders or software: the
# pod has its own (its run folder's are set to the pod's).
_LOCAL_ONLY = {"CUDA_VISIBLE_DEVICES", "PYTHONPATH", "PATH", "VIRTUAL_ENV", "CONDA_PREFIX",
               "CONDA_DEFAULT_ENV", "LD_LIBRARY_PATH", "CUDA_HOME", "HOME"}  # fmt: skip
# A start's fields the pod's agent gets otherwise (or not at all).
_NOT_FORWARDED = {"op", "id", "image", "image_auth", "slots", "blobs_dir", "pod_blobs",
                  "manifest", "base", "changes", "removed", "outputs", "run_dir",
                  "persist_dir"}  # fmt: skip
_RELINKS = 30  # tries (a second apart) to reach a running pod's agent again
CHECKPOINT_EVERY = 30.0  # seconds between read-backs of a running job's kept folders
OOM_WAIT = 3.0  # seconds a SIGKILL nobody asked for waits for the watch to say OOMKilled


class ClusterAgent:
    """The agent protocol over a cluster: one per provider, in the core."""

    def __init__(
        self,
        name: str,
        home_id: str,
        options: dict[str, Any],
        pods_file: str | None = None,
        logins: Callable[[str], dict[str, Any] | None] | None = None,
    ) -> None:
        self.name = name
        self.logins = logins  # the registry login to pull an image (the entry's default one)
        self.pods_file = pods_file  # where the pods the watch sees are kept, for listings
        self.kept_rows: list[dict[str, Any]] | None = None
        self.options = options
        self.home_id = home_id
        self.selector = f"{LABEL}/home={label_value(home_id)}"
        self.schedule_timeout = float(options.get("schedule_timeout", 60))
        self.beat = max(0.2, float(os.environ.get("MONKEY_HEARTBEAT", "5")))
        self.checkpoint_every = float(options.get("checkpoint_every", CHECKPOINT_EVERY))
        self.lock = threading.RLock()
        self.attempts: dict[tuple[str, int], Attempt] = {}
        self.pods: dict[str, dict[str, Any]] = {}  # by name, as the watch last saw them
        self.listed = threading.Event()  # the watch's first listing is in
        self.subscribers: list[CoreConn] = []
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
        conn = CoreConn(self, mine)
        threading.Thread(target=conn.serve, name=f"k8s-{self.name}-link", daemon=True).start()
        return AgentLink(theirs)

    def close(self) -> None:
        self.closed.set()
        with self.lock:
            for conn in list(self.subscribers):
                conn.close()
            links = [a.link for a in self.attempts.values() if a.link is not None]
            if self._cluster is not None:
                self._cluster.close()
        for link in links:
            link.close()

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
        local_env = req.get("env") or {}
        env = {k: str(v) for k, v in local_env.items() if k not in _LOCAL_ONLY}
        env.update(MONKEY_RUN_DIR=POD_RUN, MONKEY_CHECKPOINT_DIR=POD_CHECKPOINT)
        with self.lock:
            files = resolve_files(self.manifests, req)
        forwarded = {k: v for k, v in req.items() if k not in _NOT_FORWARDED}
        blobs_dir = f"{POD_CACHE}/blobs" if self.options.get("cache_claim") else POD_BLOBS
        forwarded.update(run_dir=POD_RUN, blobs_dir=blobs_dir, env=env, isolation="none",
                         files=files or [])  # fmt: skip
        if req.get("persist"):
            forwarded["persist_dir"] = POD_PERSIST
        kept = {"checkpoint": str(local_env.get("MONKEY_CHECKPOINT_DIR") or "")}
        if req.get("persist_dir"):
            kept["persist"] = str(req["persist_dir"])
        start = {"pod": pod, "start": forwarded, "blobs": list(req.get("pod_blobs") or []),
                 "blobs_dir": req["blobs_dir"], "kept": kept,
                 "outputs": [str(o) for o in req.get("outputs") or []]}  # fmt: skip
        resources = req.get("resources") or {}
        secret = None
        auths = (req.get("image_auth") or {}).get("auths")
        if not image_fields and self.logins is not None:  # the entry's image: its login here
            auths = (self.logins(image) or {}).get("auths")
        cluster = self.cluster
        if auths:
            secret = f"{pod}-pull"
            cluster.pull_secret(secret, auths, labels)
        manifest = pod_manifest(
            pod,
            labels,
            image,
            int(resources.get("cpus") or req.get("cpus") or 1),
            resources.get("memory"),
            int(resources.get("gpus") or 0),
            self.options,
            secret,
            self.beat,
        )
        att = Attempt(juid, n, run_dir, pod, image, time.time(), secret, start=start)
        write_atomic(os.path.join(run_dir, POD_START), json.dumps(start).encode())
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
        att.setup_line(f"pod {pod} created in namespace {cluster.namespace} ({image})")
        with self.lock:
            self._emit(att, "started", pid=0, pod=pod, gpus=[], cpus=manifest_cpus(manifest))
            att.started = True
            seen = self.pods.get(pod)
        if seen is not None:
            self._follow(att, seen)
        elif att.gone:  # deleted before this start was answered: it will not be seen again
            self._changed("DELETED", {"metadata": {"name": pod}})
        return {"pid": 0}

    def signal(self, req: dict[str, Any]) -> dict[str, Any]:
        """The signal to the job's whole process tree, by the agent in its pod; before that
        agent runs, the pod is deleted (SIGTERM, then SIGKILL after the grace asked)."""
        with self.lock:
            att = self.attempts.get((req["juid"], int(req["attempt"])))
        if att is None or att.ended or att.ending is not None:
            return {"running": False}
        sig = str(req.get("signal", "TERM")).upper().removeprefix("SIG")
        grace = 0 if sig in ("KILL", "9") else int(float(req.get("grace", 10)))
        att.signalled = 9 if grace == 0 else 15
        link = att.link
        if link is not None:
            try:
                return link.request("signal", juid=att.juid, attempt=att.n,
                                    signal=req.get("signal", "TERM"),
                                    grace=req.get("grace", 10))  # fmt: skip
            except MonkeyError as exc:
                log.warning("%s: signal through pod %s: %s", self.name, att.pod, exc)
        att.setup_line(f"pod {att.pod} deleted (SIG{sig}, grace {grace}s)")
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
                status = "exited" if has_exit(run_dir) else "unknown"
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

    def _adopt(self, juid: str, n: int, run_dir: str) -> Attempt | None:
        """The attempt a core before this one started, when its run folder says it started
        and has no exit: followed again from its pod, or ended ``vanished`` without one."""
        events = events_of(run_dir)
        if not events or any(e.get("type") == "exit" for e in events):
            return None
        started = next((e for e in events if e.get("type") == "started"), None)
        if started is None:
            return None
        pod_name = str(started.get("pod") or "")
        with self.lock:
            pod = self.pods.get(pod_name)
            image = pod["spec"]["containers"][0]["image"] if pod else ""
            att = Attempt(juid, n, run_dir, pod_name, image, started.get("ts") or time.time())
            att.seq = max(int(e.get("seq") or 0) for e in events)
            att.started = True
            att.secret = f"{pod_name}-pull"
            att.start = read_json(os.path.join(run_dir, POD_START))
            att.taken = read_json(os.path.join(run_dir, POD_TAKEN))
            att.scheduled = bool(pod and pod["spec"].get("nodeName"))
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
        self._keep_pods()

    def _keep_pods(self) -> None:
        """Write the pods as the watch sees them for `list providers --monkey-instances`
        (when what it shows of them changed)."""
        if self.pods_file is None:
            return
        with self.lock:
            rows = pod_rows(list(self.pods.values()))
            if rows == self.kept_rows:
                return
            self.kept_rows = rows
            try:
                write_atomic(self.pods_file, json.dumps({"pods": rows}).encode())
            except OSError as exc:
                log.warning("%s: %s", self.name, exc)

    def _changed(self, kind: str, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        with self.lock:
            if kind == "DELETED":
                self.pods.pop(name, None)
            else:
                self.pods[name] = pod
            att = next((a for a in self.attempts.values() if a.pod == name), None)
        if self.listed.is_set():
            self._keep_pods()
        if att is not None and not att.started and kind == "DELETED":
            att.gone = True  # before its creation's answer: start() ends it
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
                    att.setup_line(f"pod {name} was deleted from outside monkey")
                    self._end(att, {"code": None, "signal": None, "reason": "vanished"})
            return
        self._follow(att, pod)

    def _follow(self, att: Attempt, pod: dict[str, Any]) -> None:
        """Act on what POD does now: its phase on the job, its agent, its end."""
        kind, line, details = status_of(pod)
        disrupted = disruption_of(pod)
        if disrupted and not att.disrupted:
            att.disrupted = disrupted
            att.setup_line(f"pod {att.pod}: {disrupted}")
        if pod["spec"].get("nodeName") and not att.scheduled:
            att.scheduled = True
            att.setup_line(f"pod {att.pod} scheduled on node {pod['spec']['nodeName']}")
        if kind in ("pending", "creating"):
            if line != att.phase:
                att.phase = line
                att.setup_line(line or kind)
                self._emit(att, "heartbeat", phase=line)
            return
        if kind in ("image", "failed"):
            self._fail(att, line or kind)
            return
        if att.phase is not None:
            att.phase = None
            self._emit(att, "heartbeat")
        if kind == "running":
            with self.lock:
                boot = att.link is None and not att.booting and att.ending is None
                att.booting = att.booting or boot
            if boot:
                threading.Thread(target=self._boot, args=(att,), daemon=True).start()
            return
        if kind == "ended" and att.container_end is None:
            oom = ""
            if details.get("reason") == "OOMKilled":
                limits = pod["spec"]["containers"][0].get("resources", {}).get("limits", {})
                oom = f"OOMKilled, limit {limits['memory']}" if "memory" in limits else "OOMKilled"
                att.setup_line(f"pod {att.pod}: {oom}")
            att.container_end = (details.get("exitCode"), oom)
            att.container_ended.set()
        if kind == "ended" and att.ending is None:  # the agent's container ended first
            code, oom = att.container_end or (details.get("exitCode"), "")
            detail = {"detail": oom} if oom else {}
            if not oom and not att.disrupted and att.signalled is None:
                att.setup_line(f"pod {att.pod} ended (exit {code}) before its job's exit "
                                 f"came: {self._container_log(att)}")  # fmt: skip
            if att.signalled is not None:
                ending = {"code": code, "signal": att.signalled, "reason": "killed"}
            elif att.disrupted:  # as a spot notice: queued again without using a retry
                ending = {"code": code, "signal": None, "reason": "preempted",
                          "detail": att.disrupted}  # fmt: skip
            else:
                ending = {"code": code, "signal": None, "reason": "exited", **detail}
            att.ending = ending
            threading.Thread(target=self._finish, args=(att, None), daemon=True).start()

    def _container_log(self, att: Attempt) -> str:
        """The last line the pod's container (monkey's agent) wrote, or why not."""
        try:
            data = b"".join(self.cluster.log(att.pod, follow=False))
        except MonkeyError as exc:
            return str(exc)
        lines = data.decode(errors="replace").strip().splitlines()
        return lines[-1][-300:] if lines else "it wrote nothing"

    # -- the agent in the pod ----------------------------------------------------------------

    def _boot(self, att: Attempt) -> None:
        """Put the agent and the job's inputs in the pod (unless an earlier core did), open
        the relay and hand the job to the agent there (or take it back, adopted)."""
        fresh = not att.taken
        try:
            if fresh or not self._pod_ready(att):
                self._put_inputs(att)
                fresh = True
            self._open_link(att, fresh)
            att.relinks = 0
            att.kept_at = time.time()
        except Exception as exc:  # noqa: BLE001  (the attempt ends on any failure here)
            if not isinstance(exc, MonkeyError):
                log.exception("%s: starting pod %s's agent", self.name, att.pod)
            if not fresh and att.relinks < _RELINKS and not self.closed.is_set():
                # A relay lost (the API server, the network): tried again while the pod runs;
                # a pod that ended meanwhile is the watch's to end.
                att.relinks += 1
                threading.Timer(1.0, self._unlinked, (att, str(exc))).start()
                return
            if att.signalled is not None:
                self._end(att, {"code": None, "signal": att.signalled, "reason": "killed"})
            elif not att.disrupted:
                self._fail(att, str(exc))
        finally:
            att.booting = False

    def _pod_ready(self, att: Attempt) -> bool:
        status, _out, _err = self.cluster.exec(att.pod, ["sh", "-c", f"test -S {POD_SOCKET}"])
        return status == 0

    def _put_inputs(self, att: Attempt) -> None:
        said = put_inputs(self.cluster, att.pod, att.image, att.start,
                          self.options.get("cache_claim"))  # fmt: skip
        att.setup_line(said)

    def _open_link(self, att: Attempt, fresh: bool) -> None:
        from monkey.drivers.k8s_link import PodLink

        offsets = {}
        for name in FOLLOWED:
            try:
                offsets[name] = os.path.getsize(os.path.join(att.run_dir, name))
            except OSError:
                offsets[name] = 0
        offsets[SETUP_LOG] = int(att.taken.get(SETUP_LOG, 0))
        kept = [k for k, v in (att.start.get("kept") or {}).items() if v]
        link = PodLink(
            self.cluster,
            att.pod,
            offsets,
            lambda msg: self._pushed(att, msg),
            lambda why: self._unlinked(att, why),
            kept,
        )
        att.kept_changed = att.kept_changed or not fresh  # (changes while it was not linked)
        att.link = link
        if fresh:
            link.request("sync", attempts=[])
            att.take(0)
            reply = link.request("start", timeout=600, **att.start["start"])
            if reply.get("withdrawn"):
                raise MonkeyError(str(reply.get("error") or "withdrawn"))
            return
        item = {"juid": att.juid, "attempt": att.n, "run_dir": POD_RUN,
                "offset": int(att.taken.get(EVENTS, 0))}  # fmt: skip
        status = link.request("sync", attempts=[item])["attempts"][0]["status"]
        if status == "unknown":
            raise MonkeyError(f"the agent in pod {att.pod} never started the job")

    def _unlinked(self, att: Attempt, why: str) -> None:
        """The relay ended: open it again while the pod runs and the job has not exited."""
        att.link = None
        if att.ending is not None or att.ended or self.closed.is_set():
            return
        log.warning("%s: the link to pod %s ended: %s", self.name, att.pod, why)
        with self.lock:
            pod = self.pods.get(att.pod)
            boot = pod is not None and status_of(pod)[0] == "running" and not att.booting
            att.booting = att.booting or boot
        if boot:
            threading.Thread(target=self._boot, args=(att,), daemon=True).start()

    def _pushed(self, att: Attempt, msg: dict[str, Any]) -> None:
        """A push of the pod's agent: a file's new bytes, or an event of the job."""
        if msg.get("push") == "file":
            att.file(str(msg["name"]), int(msg["at"]), base64.b64decode(msg["data"]))
            return
        if msg.get("push") == "kept":  # read back at the next checkpoint_every
            att.kept_changed = True
            return
        if msg.get("push") != "event" or (msg.get("juid"), msg.get("attempt")) != (
            att.juid,
            att.n,
        ):
            return  # a notice: the pod's own, told by the watch
        event = dict(msg["event"])
        kind = event.pop("type", None)
        for key in ("seq", "ts", "ran"):  # "ran": from the pod's start, not the attempt's
            event.pop(key, None)
        if kind == "exit":
            with self.lock:
                first = att.ending is None
                if first:
                    att.ending = event
            if first:
                threading.Thread(target=self._finish, args=(att, msg["offset"]),
                                 daemon=True).start()  # fmt: skip
            return
        if kind != "started" and kind is not None:
            self._emit(att, kind, **event)
        att.take(int(msg["offset"]))

    def _finish(self, att: Attempt, offset: int | None) -> None:
        """The job exited (OFFSET: its exit event's in the pod), or its pod's container ended
        (None): bring back its kept folders and outputs while the pod runs, write its exit,
        delete the pod."""
        assert att.ending is not None
        ending = dict(att.ending)
        if offset is not None:
            self._fetch(att)
            if att.disrupted and ending.get("reason") in ("preempted", "killed", "exited"):
                if att.signalled is None:
                    ending.update(reason="preempted", detail=att.disrupted)
            elif att.signalled is None and (ending.get("signal") == 9 or ending.get("code") == 137):
                # A SIGKILL nobody asked for (or a shell's 137 for one): the container's memory
                # limit, when the watch says so (its end may come after the agent told of the
                # job's)
                att.container_ended.wait(OOM_WAIT)
                code, oom = att.container_end or (None, "")
                if oom:
                    ending.update(code=code, signal=None, reason="exited", detail=oom)
        self._end(att, ending)
        if offset is not None:
            att.take(offset)
        link = att.link
        if link is not None:
            link.close()
        try:
            self.cluster.delete_pod(att.pod, 0)
        except MonkeyError as exc:
            log.warning("%s: %s", self.name, exc)

    def _fetch(self, att: Attempt) -> None:
        with att.fetching:
            said = fetch_results(self.cluster, att.pod, att.start, att.run_dir)
        for line in said:
            att.setup_line(line)

    def _keep(self, att: Attempt) -> None:
        """Read the running job's checkpoint and persisted folders back into MONKEY_HOME (as
        the SSH and cloud transports do every ``checkpoint_every``; here only once its relay
        said they changed, so a pod whose job saves nothing costs no request): a pod lost
        without warning (its node gone, deleted by someone) resumes from them in a new pod."""
        try:
            with att.fetching:
                if att.ending is None:  # its exit's read-back, after this one, is the last
                    read_kept(self.cluster, att.pod, att.start)
        except (MonkeyError, OSError, ValueError) as exc:
            att.kept_changed = True  # tried again at the next checkpoint_every
            log.info("%s: reading pod %s's checkpoint back: %s", self.name, att.pod, exc)
        finally:
            att.keeping = False

    def _fail(self, att: Attempt, why: str, reason: str = "setup") -> None:
        """End ATT as a failed set-up (WHY, one line; REASON ``given_up``: no node took it
        in time, the core may hand the job to another of its providers): its pod deleted,
        not retried."""
        with self.lock:
            if att.ending is not None:
                return
            att.ending = {"code": None, "signal": None, "reason": reason, "error": why}
        att.setup_line(why)
        if att.link is not None:
            att.link.close()
        try:
            self.cluster.delete_pod(att.pod, 0)
        except MonkeyError as exc:
            log.warning("%s: %s", self.name, exc)
        self._end(att, att.ending)

    def _end(self, att: Attempt, ending: dict[str, Any]) -> None:
        with self.lock:
            if att.ended:
                return
            att.ended = True
        att.ending = ending
        self._emit(att, "exit", **ending)
        try:  # the start handed to the pod holds the job's environment: not kept past its end
            os.unlink(os.path.join(att.run_dir, POD_START))
        except OSError:
            pass
        if att.secret:
            try:
                self.cluster.delete_secret(att.secret)
            except MonkeyError as exc:
                log.warning("%s: %s", self.name, exc)

    def _beating(self) -> None:
        """Heartbeats of the attempts whose agent does not run yet (their phase), the
        schedule timeout, and the read-backs of the running jobs' kept folders."""
        while not self.closed.wait(min(self.beat, 0.5)):
            now = time.time()
            with self.lock:
                live = [
                    a
                    for a in self.attempts.values()
                    if a.started and not a.ended and a.ending is None and a.link is None
                ]
                due = [
                    a
                    for a in self.attempts.values()
                    if a.link is not None and a.ending is None and not a.keeping
                    and a.kept_changed and now - a.kept_at >= self.checkpoint_every
                ]  # fmt: skip
            for att in due:
                att.kept_at, att.keeping, att.kept_changed = now, True, False
                threading.Thread(target=self._keep, args=(att,), daemon=True).start()
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

    def _emit(self, att: Attempt, kind: str, /, **fields: Any) -> None:
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
