"""The `kubernetes` provider: a cluster a lab already has, one Pod per attempt.

The cluster is one instance (named after the provider) whose capacity is its nodes'
allocatable CPUs and GPUs; the cluster's own scheduler places each pod, and says why one
waits. Its agent is ``k8s_agent.ClusterAgent``, in the core: it speaks the agent protocol
over a socket pair, creates the pods, follows them with one watch, hands each job to monkey's
own agent inside its pod (through the API server's exec channel) and keeps each attempt's
run folder (events, logs) in MONKEY_HOME, where the core reads it as it reads the local
agent's.

providers.yml::

    k8s: {type: kubernetes, kubeconfig: ~/.kube/config, context: lab, namespace: ml,
          schedule_timeout: 60, checkpoint_every: 30, image: python:3.12-slim, memory: 4G,
          node_selector: {gpu: a100}, tolerations: [{key: gpu, operator: Exists}],
          priority_class: research, service_account: monkey, queue: team-a,
          cache_claim: monkey-cache}

With ``cache_claim`` (a PersistentVolumeClaim every pod mounts at /monkey/cache, ReadWriteMany
where pods run on several nodes) the blobs of the jobs' code and datasets are kept there by
digest: each is sent to the cluster once, and a pod gets only those the claim lacks.

The `kubernetes` package (about a second to import) is loaded only when a cluster is
reached (k8s_api), never to check an entry or print a listing of what is recorded.
"""

from __future__ import annotations

import threading
import time

from monkey.drivers.base import Capacity, Driver, unknown_keys
from monkey.drivers.k8s_pods import capacity_of, node_ready, node_shapes
from monkey.drivers.transport import Transport
from monkey.models import Instance, InstanceState, MonkeyError, parse_size

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from monkey.config import Home, ProviderConfig
    from monkey.drivers.agent_link import AgentLink
    from monkey.drivers.k8s_agent import ClusterAgent
    from monkey.models import Resources

_KEYS = {
    "kubeconfig",
    "context",
    "namespace",
    "schedule_timeout",
    "checkpoint_every",
    "image",
    "memory",
    "node_selector",
    "tolerations",
    "priority_class",
    "service_account",
    "queue",
    "cache_claim",
}
_WORDS = ("kubeconfig", "context", "namespace", "image", "priority_class", "service_account",
          "queue", "cache_claim")  # fmt: skip
_TOLERATION_KEYS = {"key", "operator", "value", "effect", "tolerationSeconds"}
_NODES_EVERY = 30.0  # seconds between listings of the nodes (capacity)


class KubernetesDriver(Driver):
    """A Kubernetes cluster: one instance, one pod per attempt."""

    kind = "kubernetes"

    @classmethod
    def validate(cls, where: str, name: str, entry: dict[str, Any]) -> None:
        """Text options are text; schedule_timeout and checkpoint_every seconds > 0; memory a size;
        node_selector a map of labels; tolerations a list of Kubernetes tolerations."""
        unknown_keys(where, name, entry, _KEYS)

        def bad(text: str) -> MonkeyError:
            return MonkeyError(f"{where}: provider {name!r}: {text}")

        for key in _WORDS:
            value = entry.get(key)
            if value is not None and not (isinstance(value, str) and value and "\n" not in value):
                raise bad(f"{key} must be text, got {value!r}")
        for key, meaning in (
            ("schedule_timeout", "how long a pod may wait for a node before its job is given up"),
            ("checkpoint_every", "how often a running job's checkpoint is read back from its pod"),
        ):
            seconds = entry.get(key)
            if seconds is not None and (
                isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds <= 0
            ):
                raise bad(f"{key} must be seconds > 0 ({meaning}), got {seconds!r}")
        if entry.get("memory") is not None:
            try:
                parse_size(str(entry["memory"]))
            except (MonkeyError, ValueError):
                raise bad(
                    f"memory must be a size like 4G or 512M, got {entry['memory']!r}"
                ) from None
        selector = entry.get("node_selector")
        if selector is not None and not (
            isinstance(selector, dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in selector.items())
        ):
            raise bad("node_selector must map node labels to values, e.g. {gpu: a100}")
        tolerations = entry.get("tolerations")
        if tolerations is not None and not (
            isinstance(tolerations, list)
            and all(isinstance(t, dict) and t and set(t) <= _TOLERATION_KEYS for t in tolerations)
        ):
            raise bad(
                "tolerations must be a list of {key, operator, value, effect}, e.g. "
                "[{key: gpu, operator: Exists, effect: NoSchedule}]"
            )

    @classmethod
    def never_fits(cls, config: ProviderConfig, resources: Resources) -> str | None:
        """--host; or a job no ready node of the cluster could ever hold (as its nodes were
        last listed, by provider add or the core: read from MONKEY_HOME, no API call). A pod
        that fits a node but waits is the scheduler's to explain."""
        if resources.host:
            return f"provider {config.name!r} is a Kubernetes cluster; --host is for ssh providers"
        from monkey.config import Home

        shapes = read_shapes(Home(), config.name)
        if not shapes:
            return None
        memory = parse_size(resources.memory) if resources.memory else 0
        if any(
            resources.cpus <= cpus and resources.gpus <= gpus and memory <= mem
            for cpus, gpus, mem in shapes
        ):
            return None
        cpus, gpus, mem = max(shapes, key=lambda s: (s[1], s[0], s[2]))
        return (
            f"provider {config.name!r}: no node of the cluster could hold a pod asking "
            f"--cpus {resources.cpus} --gpus {resources.gpus}"
            + (f" --memory {resources.memory}" if resources.memory else "")
            + f" (the largest allocatable: {cpus} CPUs, {gpus} nvidia.com/gpu, "
            f"{mem / (1 << 30):.1f}G memory; see monkey provider check {config.name})"
        )

    def default_image(self) -> str | None:
        """The entry's ``image``: what a job without one runs in."""
        return self.config.options.get("image") or None

    @classmethod
    def describe(cls, config: ProviderConfig, instances: list[dict[str, Any]]) -> dict[str, Any]:
        """The cluster's nodes (``hosts``: each one's state, allocatable CPUs, GPUs and
        memory, and monkey's pods on it) and a line of their sums (one listing of the nodes
        and one of this home's pods)."""
        from monkey.config import Home

        try:
            where, nodes, pods = look(config, Home())
        except MonkeyError as exc:
            return {"slots": 0, "gpus": 0, "error": str(exc)}
        cap = capacity_of(config.name, nodes)
        ready = sum(1 for n in nodes if node_ready(n))
        live = [p for p in pods if p.get("status", {}).get("phase") in ("Pending", "Running")]
        running = sum(1 for p in live if p["status"]["phase"] == "Running")
        pending = len(live) - running
        return {
            "slots": cap.slots,
            "gpus": len(cap.gpus),
            "hosts": [
                {
                    "instance": f"{config.name}/{node['host']}",
                    "host": node["host"],
                    "state": "ready" if node["error"] is None else "not ready",
                    "slots": node["slots"],
                    "gpus": node["gpus"],
                    "memory": node["memory"],
                    "running": node["pods"],
                    "error": node["error"],
                }
                for node in node_reports(config.name, nodes, live)
            ],
            "detail": f"{where}: {ready} of {len(nodes)} nodes ready, {cap.slots} CPUs and "
            f"{len(cap.gpus)} GPUs allocatable; {running} pods of monkey's running"
            + (f", {pending} pending" if pending else ""),
        }

    def __init__(self, config: ProviderConfig, home: Home) -> None:
        super().__init__(config, home)
        self.transport = KubernetesTransport(self)
        self._agent: ClusterAgent | None = None
        self._capacity: Capacity | None = None
        self._listed_at = 0.0
        self._listing: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def agent(self) -> ClusterAgent:
        with self._lock:
            if self._agent is None:
                from monkey.drivers.k8s_agent import ClusterAgent

                self._agent = ClusterAgent(
                    self.name,
                    self.home.home_id(),
                    self.config.options,
                    pods_file(self.home, self.name),
                    self._login,
                )
            return self._agent

    def instances(self) -> list[Capacity]:
        """The cluster as one instance of its nodes' allocatable CPUs and GPUs, listed in a
        thread every 30 s (none until the first listing came back)."""
        now = time.monotonic()
        with self._lock:
            if now - self._listed_at >= _NODES_EVERY and self._listing is None:
                self._listing = threading.Thread(
                    target=self._list_nodes, name=f"k8s-{self.name}-nodes", daemon=True
                )
                self._listing.start()
            return [self._capacity] if self._capacity is not None else []

    def list_nodes(self) -> list[Instance]:
        """The cluster, RUNNING while its API server answers (one listing of its nodes, which
        refreshes its capacity); MonkeyError in one line when it cannot be reached."""
        nodes = self.agent.cluster.nodes()
        capacity = capacity_of(self.name, nodes)
        keep_shapes(self.home, self.name, nodes)
        with self._lock:
            self._capacity, self._listed_at = capacity, time.monotonic()
        return [
            Instance(
                self.name, self.name, self.name, InstanceState.RUNNING, extra={"nodes": len(nodes)}
            )
        ]

    def clean_cache(self, keep: list[str] | None, grace: float) -> dict[str, int] | None:
        """`gc` in the cluster's cache claim (see k8s_cache): the blobs there that neither
        KEEP nor another home's gc names, unused for GRACE seconds, and partial uploads;
        what was freed, as an SSH host says it (None when KEEP is None: no gc asked)."""
        import json

        from monkey.drivers.k8s_api import POD_CACHE
        from monkey.drivers.k8s_cache import runs_dir
        from monkey.drivers.ssh_remote import CLEAN

        if keep is None:
            return None
        request = json.dumps({"runs": [], "gc": True, "keep": keep}).encode()
        args = [POD_CACHE, runs_dir(self.home.home_id()), str(grace)]
        return dict(json.loads(self._in_claim(CLEAN, args, request)))

    def cache_usage(self) -> dict[str, Any]:
        """What the cluster's cache claim holds, as an SSH host's usage says it."""
        import json

        from monkey.drivers.k8s_api import POD_CACHE
        from monkey.drivers.k8s_cache import runs_dir
        from monkey.drivers.ssh_remote import USAGE

        return dict(json.loads(self._in_claim(USAGE, [POD_CACHE, runs_dir(self.home.home_id())])))

    def _login(self, image: str) -> dict[str, Any] | None:
        """What `registry login` keeps for IMAGE's registry (its auths and CA), or None."""
        from monkey.images import Registries, parse

        try:
            return Registries(self.home).pull_auth(parse(image).host)
        except MonkeyError:
            return None

    def _in_claim(self, script: str, args: list[str], data: bytes = b"") -> bytes:
        from monkey.drivers.k8s_cache import run_in_claim

        options = self.config.options
        auths = (self._login(options["image"]) or {}).get("auths") if options.get("image") else None
        cluster = self.agent.cluster
        return run_in_claim(cluster, options, self.home.home_id(), script, args, data, auths)

    def _list_nodes(self) -> None:
        try:
            nodes = self.agent.cluster.nodes()
            capacity = capacity_of(self.name, nodes)
            keep_shapes(self.home, self.name, nodes)
        except MonkeyError as exc:
            capacity = None
            self.agent.error = str(exc)
        with self._lock:
            fresh = self._capacity is None and capacity is not None
            if capacity is not None:
                self._capacity = capacity
            self._listed_at = time.monotonic()
            self._listing = None
        if fresh:
            self.wake()

    def close(self) -> None:
        with self._lock:
            agent = self._agent
        if agent is not None:
            agent.close()


def look(
    config: ProviderConfig, home: Home
) -> tuple[str, list[dict[str, Any]], list[dict[str, Any]]]:
    """What cluster CONFIG holds now: ("CONTEXT, namespace NS", its nodes, the pods of HOME
    in the namespace), one listing of each; the nodes' shapes are remembered
    (``never_fits``). MonkeyError in one line when it cannot be reached."""
    from monkey.drivers.k8s_api import LABEL, Cluster, label_value

    options = config.options
    cluster = Cluster(options.get("kubeconfig"), options.get("context"),
                      options.get("namespace"))  # fmt: skip
    try:
        nodes = cluster.nodes()
        pods = cluster.pods(f"{LABEL}/home={label_value(home.home_id())}")
    finally:
        cluster.close()
    keep_shapes(home, config.name, nodes)
    return f"{cluster.context}, namespace {cluster.namespace}", nodes, pods


def node_reports(
    name: str, nodes: list[dict[str, Any]], pods: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """One report per node of cluster NAME (instance, host: the node, error: why it takes no
    pod, slots, gpus, memory: allocatable, pods: how many of PODS it runs, isolation: pod,
    images: its container runtime)."""
    from monkey.drivers.k8s_api import GPU, amount

    on: dict[str, int] = {}
    for pod in pods:
        node = pod.get("spec", {}).get("nodeName")
        if node:
            on[node] = on.get(node, 0) + 1
    out = []
    for node in nodes:
        allocatable = node.get("status", {}).get("allocatable", {})
        error = None
        if node.get("spec", {}).get("unschedulable"):
            error = "cordoned (unschedulable)"
        elif not node_ready(node):
            error = "not ready"
        runtime = node.get("status", {}).get("nodeInfo", {}).get("containerRuntimeVersion")
        host = node["metadata"]["name"]
        out.append(
            {
                "instance": name,
                "host": host,
                "error": error,
                "slots": int(amount(allocatable.get("cpu", 0))),
                "gpus": [str(i) for i in range(int(amount(allocatable.get(GPU, 0))))],
                "memory": int(amount(allocatable.get("memory", 0))) or None,
                "pods": on.get(host, 0),
                "isolation": "pod",
                "images": f"the cluster's ({runtime})" if runtime else "the cluster's",
            }
        )
    return out


def check_cluster(config: ProviderConfig, home: Home) -> list[dict[str, Any]]:
    """`monkey provider check` of a cluster: one report per node (``node_reports``: its
    state, allocatable CPUs, GPUs and memory, monkey's live pods on it), or one report
    saying why the cluster cannot be reached."""
    try:
        where, nodes, pods = look(config, home)
    except MonkeyError as exc:
        return [{"instance": config.name, "host": str(config.options.get("context") or "-"),
                 "error": str(exc), "slots": 0, "gpus": [], "memory": None}]  # fmt: skip
    if not nodes:
        return [{"instance": config.name, "host": where, "error": "the cluster lists no node",
                 "slots": 0, "gpus": [], "memory": None}]  # fmt: skip
    live = [p for p in pods if p.get("status", {}).get("phase") in ("Pending", "Running")]
    return node_reports(config.name, nodes, live)


def pod_rows(config: ProviderConfig, home: Home, now: float) -> list[dict[str, Any]]:
    """`monkey list instances`' rows of cluster CONFIG: HOME's pods there (id: the pod,
    provider, state: its phase, node, jobs: its job, age in seconds), or one row saying why
    the cluster cannot be reached (state ``unreachable``, ``error``)."""
    import calendar

    try:
        _where, _nodes, pods = look(config, home)
    except MonkeyError as exc:
        return [_pod_row(config.name, config.name, "unreachable", None, [], None, str(exc))]
    rows = []
    for pod in pods:
        meta, status = pod["metadata"], pod.get("status") or {}
        try:
            made = calendar.timegm(time.strptime(meta["creationTimestamp"], "%Y-%m-%dT%H:%M:%SZ"))
            age: float | None = max(0.0, now - made)
        except (KeyError, ValueError):
            age = None
        job = (meta.get("labels") or {}).get("monkey.dev/job")
        phase = str(status.get("phase") or "unknown").lower()
        if meta.get("deletionTimestamp"):
            phase = "terminating"
        node = pod.get("spec", {}).get("nodeName")
        row = _pod_row(meta["name"], config.name, phase, node, [job] if job else [], age)
        row["size"] = _requested(pod)
        rows.append(row)
    return sorted(rows, key=lambda r: r["id"])


def _requested(pod: dict[str, Any]) -> str:
    """A pod's requests as a size: ``1 CPU``, ``4 CPU, 1 GPU`` (``pod``: none stated)."""
    asked: dict[str, Any] = {}
    for c in pod.get("spec", {}).get("containers") or []:
        asked.update(((c.get("resources") or {}).get("requests")) or {})
    if "cpu" not in asked:
        return "pod"
    gpus = asked.get("nvidia.com/gpu")
    return f"{asked['cpu']} CPU" + (f", {gpus} GPU" if gpus and str(gpus) != "0" else "")


def _pod_row(
    pod: str,
    provider: str,
    state: str,
    node: str | None,
    jobs: list[str],
    age: float | None,
    error: str | None = None,
) -> dict[str, Any]:
    row: dict[str, Any] = {"id": pod, "provider": provider, "state": state, "size": "pod",
                           "spot": False, "address": None, "node": node, "jobs": jobs,
                           "age": age, "idle": None, "price": None, "cost": None}  # fmt: skip
    if error is not None:
        row["error"] = error
    return row


def keep_shapes(home: Home, name: str, nodes: list[dict[str, Any]]) -> None:
    """Remember the shapes of cluster NAME's nodes in MONKEY_HOME (for ``never_fits``)."""
    import json
    import os

    from monkey.config import write_private

    path = home.private / f"kubernetes-{name}.json"
    try:
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        write_private(tmp, json.dumps({"shapes": node_shapes(nodes)}).encode())
        os.replace(tmp, path)
    except OSError:
        pass


def pods_file(home: Home, name: str) -> str:
    """Where the core keeps cluster NAME's pods of this home as its watch last saw them."""
    return str(home.private / f"kubernetes-{name}-pods.json")


def read_pods(home: Home, name: str) -> list[dict[str, Any]]:
    """The pods of cluster NAME as the core's watch last saw them (``pod_rows``): none when
    no core followed the cluster."""
    import json

    try:
        with open(pods_file(home, name)) as f:
            rows = json.load(f)["pods"]
        return [r for r in rows if isinstance(r, dict)]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def read_shapes(home: Home, name: str) -> list[tuple[int, int, int]]:
    """The node shapes of cluster NAME as last listed; none when never listed."""
    import json

    try:
        data = json.loads((home.private / f"kubernetes-{name}.json").read_text())
        return [(int(c), int(g), int(m)) for c, g, m in data["shapes"]]
    except (OSError, ValueError, KeyError, TypeError):
        return []


class KubernetesTransport(Transport):
    """The cluster's agent (in the core); the attempts' run folders, checkpoints and saved
    persisted folders are MONKEY_HOME's, carried into each pod and back by that agent."""

    quick = True

    def __init__(self, driver: KubernetesDriver) -> None:
        self.driver = driver
        self.home = driver.home

    def connect(self, instance: str) -> AgentLink:
        return self.driver.agent.connect()

    def blobs_dir(self, instance: str) -> str:
        return str(self.home.blobs)

    def run_dir(self, instance: str, juid: str, attempt: int) -> str:
        return str(self.home.run_dir(juid, attempt))

    def prepare(self, instance: str, blobs: list[str]) -> dict[str, Any]:
        """The blobs the pod needs: the cluster's agent puts them in it (from MONKEY_HOME)."""
        return {"pod_blobs": blobs}

    def start_fields(
        self, instance: str, juid: str, attempt: int, outputs: list[str]
    ) -> dict[str, Any]:
        """The job's outputs globs: the cluster's agent brings those files back from its pod."""
        return {"outputs": outputs} if outputs else {}

    def checkpoint_dir(self, instance: str, juid: str) -> str:
        path = self.home.checkpoint_dir(juid)
        path.mkdir(parents=True, exist_ok=True)
        return str(path)

    def close(self) -> None:
        self.driver.close()
