"""A Kubernetes cluster as the `kubernetes` provider reaches it: the official `kubernetes`
client (imported here only, when a cluster is used: it costs about a second), raw JSON
objects in and out (the API's own shapes, no model classes), and its failures as one line.

``Cluster`` loads a kubeconfig's context, checks access (SelfSubjectAccessReview), lists
nodes, creates and deletes pods and their pull secrets, streams a pod's log, and watches the
pods carrying a label selector (``watch``: list, then watch from the list's resourceVersion
with bookmarks; a ``410 Gone`` lists again).
"""

from __future__ import annotations

import base64
import json
import os
import re
import threading

from monkey.models import MonkeyError, parse_size

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import Any

GPU = "nvidia.com/gpu"
LABEL = "monkey.dev"  # the prefix of monkey's labels: monkey.dev/home, /job, /attempt, /owner
_LABEL_VALUE = re.compile(r"[^A-Za-z0-9._-]+")
RUN_FOLDER = "/monkey"  # the pod's emptyDir: monkey's agent, the job's blobs and run folder
POD_AGENT = f"{RUN_FOLDER}/agent"  # the agent's code (monkey/client_agent/), put by an exec
POD_ROOT = f"{RUN_FOLDER}/root"  # the agent's root
POD_SOCKET = f"{RUN_FOLDER}/agent.sock"
POD_RUN = f"{RUN_FOLDER}/run"  # the attempt's run folder (one attempt per pod)
POD_BLOBS = f"{RUN_FOLDER}/blobs"  # the blobs of the job's code and datasets
POD_CACHE = f"{RUN_FOLDER}/cache"  # the entry's cache_claim: blobs kept across pods, by digest
POD_CHECKPOINT = f"{RUN_FOLDER}/checkpoint"  # the job's checkpoint, carried across pods
POD_PERSIST = f"{RUN_FOLDER}/persist"  # job.yml's saved persisted folders, the same way
POD_READY = f"{RUN_FOLDER}/ready"  # made once all that is in: the agent starts
# Runs a module of the agent's code ($1) with the image's python3.
BOOT = "import sys; sys.path.insert(0, sys.argv.pop(1)); from monkey.client_agent.{} import main; sys.exit(main())"
# The pod's command: wait for the agent's code (put through an exec, which checked that the
# image has python3), then become monkey's agent. Needs sh and sleep in the image.
WAIT_FOR_AGENT = f'while [ ! -e {POD_READY} ]; do sleep 0.1; done; cd {RUN_FOLDER} && exec python3 -I -c "$0" "$@"'
GRACE = 30  # seconds from the kubelet's SIGTERM to its SIGKILL (the pod's default)


def default_kubeconfig() -> str:
    """The kubeconfig kubectl reads: the first file of KUBECONFIG, else ~/.kube/config."""
    listed = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0]
    return os.path.abspath(os.path.expanduser(listed or "~/.kube/config"))


def docker_entry(entry: dict[str, Any]) -> dict[str, Any]:
    """An auth.json entry (``auth``: base64 of user:password) as a pull secret's, with the
    username and password spelled out too, as kubectl writes one and every runtime reads."""
    out = dict(entry)
    if isinstance(entry.get("auth"), str) and entry["auth"]:
        try:
            user, sep, password = base64.b64decode(entry["auth"]).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return out
        if sep:
            out = {"username": user, "password": password, **out}
    return out


def label_value(text: str) -> str:
    """TEXT as a label value: letters, digits, '.', '_' and '-', at most 63, alphanumeric at
    both ends."""
    return _LABEL_VALUE.sub("-", text)[:63].strip("._-") or "x"


def quantity(value: float) -> str:
    """A number of bytes as a Kubernetes quantity (16Gi, 512Mi, or bytes)."""
    for suffix, factor in (("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
        if value >= factor and value % factor == 0:
            return f"{int(value // factor)}{suffix}"
    return str(int(value))


def amount(text: Any) -> float:
    """A Kubernetes quantity ("500m", "4", "16Gi", "2G") as a number (cores, bytes)."""
    text = str(text)
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "Pi": 1 << 50,
             "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "m": 1e-3}  # fmt: skip
    for suffix, factor in units.items():
        if text.endswith(suffix):
            try:
                return float(text[: -len(suffix)]) * factor
            except ValueError:
                return 0.0
    try:
        return float(text)
    except ValueError:
        return 0.0


class Cluster:
    """One context of a kubeconfig: its API server, user and namespace."""

    def __init__(
        self,
        kubeconfig: str | None = None,
        context: str | None = None,
        namespace: str | None = None,
    ) -> None:
        from kubernetes import client, config

        self.kubeconfig = kubeconfig or default_kubeconfig()
        if not os.path.isfile(self.kubeconfig):
            raise MonkeyError(
                f"no kubeconfig at {self.kubeconfig}; give one with --kubeconfig or KUBECONFIG"
            )
        contexts, current = _contexts(self.kubeconfig)
        names = [c["name"] for c in contexts]
        chosen = context or current
        if chosen is None or chosen not in names:
            said = f"no context {chosen!r}" if chosen else "no current-context"
            raise MonkeyError(
                f"kubeconfig {self.kubeconfig} has {said}; pick one with --context "
                f"(contexts: {', '.join(names) or 'none'})"
            )
        self.context = chosen
        entry = next(c for c in contexts if c["name"] == chosen).get("context")
        given = entry.get("namespace") if isinstance(entry, dict) else None
        self.namespace = namespace or (given if isinstance(given, str) else "") or "default"
        try:
            api = config.new_client_from_config(self.kubeconfig, context=self.context)
            # The client's exec (kubernetes.stream) swaps its ApiClient's request method
            # while it connects: a client of its own, one connect at a time, keeps the
            # watch and the logs of other threads off the websocket path.
            self._exec_api = config.new_client_from_config(self.kubeconfig, context=self.context)
        except config.ConfigException as exc:
            raise MonkeyError(f"kubeconfig {self.kubeconfig}: {exc}") from None
        api.configuration.retries = 1
        self.server = api.configuration.host
        self.api = api
        self.core = client.CoreV1Api(api)
        self.authz = client.AuthorizationV1Api(api)
        self._exec_core = client.CoreV1Api(self._exec_api)
        self._exec_lock = threading.Lock()

    def close(self) -> None:
        self.api.close()
        self._exec_api.close()

    def _call(self, what: str, call: Callable[[], Any]) -> Any:
        """CALL's JSON answer; one-line MonkeyError (the API's own message) when it fails."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            resp = call()
            return json.loads(resp.data) if resp.data else {}
        except ApiException as exc:
            raise MonkeyError(f"{what}: {_said(exc)}") from None
        except (HTTPError, OSError) as exc:
            raise MonkeyError(
                f"{what}: cannot reach the API server at {self.server} ({_reason(exc)})"
            ) from None

    def can(self, verb: str, resource: str) -> bool:
        """Whether this user may VERB RESOURCE in the namespace (``kubectl auth can-i``)."""
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {
                "resourceAttributes": {
                    "namespace": self.namespace,
                    "verb": verb,
                    "resource": resource,
                }
            },
        }
        out = self._call(
            f"checking access to {resource}",
            lambda: self.authz.create_self_subject_access_review(review, _preload_content=False),
        )
        return bool(out.get("status", {}).get("allowed"))

    def nodes(self) -> list[dict[str, Any]]:
        return list(
            self._call("listing nodes", lambda: self.core.list_node(_preload_content=False))[
                "items"
            ]
        )

    def pods(self, selector: str) -> list[dict[str, Any]]:
        """The pods of the namespace carrying the labels SELECTOR names (one listing)."""
        return list(
            self._call(
                "listing pods",
                lambda: self.core.list_namespaced_pod(
                    self.namespace, label_selector=selector, _preload_content=False
                ),
            )["items"]
        )

    def create_pod(self, pod: dict[str, Any]) -> dict[str, Any]:
        name = pod["metadata"]["name"]
        return dict(
            self._call(
                f"creating pod {name}",
                lambda: self.core.create_namespaced_pod(
                    self.namespace, pod, _preload_content=False
                ),
            )
        )

    def delete_pod(self, name: str, grace: int | None = None) -> bool:
        """Delete pod NAME (with GRACE seconds to stop); False when it was gone already."""
        from kubernetes import client

        body = client.V1DeleteOptions(grace_period_seconds=grace) if grace is not None else None
        try:
            self._call(
                f"deleting pod {name}",
                lambda: self.core.delete_namespaced_pod(
                    name, self.namespace, body=body, _preload_content=False
                ),
            )
        except MonkeyError as exc:
            if "not found" in str(exc):
                return False
            raise
        return True

    def pull_secret(self, name: str, auths: dict[str, Any], labels: dict[str, str]) -> None:
        """Create secret NAME of type dockerconfigjson holding AUTHS (a registry login, as
        auth.json holds it), each entry as `kubectl create secret docker-registry` writes
        it: username, password and auth. (A registry's CA cannot be in it: the nodes'
        container runtime must trust it; see README.)"""
        entries = {host: docker_entry(entry) for host, entry in auths.items()}
        data = base64.b64encode(json.dumps({"auths": entries}).encode()).decode()
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "labels": labels},
            "type": "kubernetes.io/dockerconfigjson",
            "data": {".dockerconfigjson": data},
        }
        self._call(
            f"creating secret {name}",
            lambda: self.core.create_namespaced_secret(
                self.namespace, secret, _preload_content=False
            ),
        )

    def delete_secret(self, name: str) -> None:
        try:
            self._call(
                f"deleting secret {name}",
                lambda: self.core.delete_namespaced_secret(
                    name, self.namespace, _preload_content=False
                ),
            )
        except MonkeyError as exc:
            if "not found" not in str(exc):
                raise

    def log(self, name: str, follow: bool) -> Iterator[bytes]:
        """The bytes of pod NAME's log, as they come (FOLLOW: until its container ends)."""
        from kubernetes.client.exceptions import ApiException

        try:
            resp = self.core.read_namespaced_pod_log(
                name, self.namespace, follow=follow, _preload_content=False
            )
        except ApiException as exc:
            raise MonkeyError(f"reading the log of pod {name}: {_said(exc)}") from None
        try:
            yield from resp.stream(65536, decode_content=False)
        finally:
            resp.release_conn()

    def exec(
        self, name: str, argv: list[str], stdin: bytes = b"", timeout: float = 300
    ) -> tuple[int, bytes, bytes]:
        """Run ARGV in pod NAME's container through the API server (pods/exec), with STDIN;
        (exit code, stdout, stderr). MonkeyError when the exec cannot be made."""
        from websocket import WebSocketException

        ws = self.open_exec(name, argv, bool(stdin))
        try:
            try:
                for at in range(0, len(stdin), 1 << 20):
                    ws.write_stdin(stdin[at : at + (1 << 20)])
            except (OSError, WebSocketException):
                pass  # the command ended without reading it all: its status says why
            ws.run_forever(timeout=timeout)
            if ws.is_open():
                raise MonkeyError(f"exec in pod {name}: no end within {timeout:.0f}s")
            code = ws.returncode
            out, err = ws.read_stdout() or b"", ws.read_stderr() or b""  # "" when none came
            return int(code if code is not None else -1), bytes(out), bytes(err)
        except (OSError, ValueError, KeyError, TypeError, WebSocketException) as exc:
            raise MonkeyError(f"exec in pod {name}: {_reason(exc)}") from None
        finally:
            ws.close()

    def open_exec(self, name: str, argv: list[str], stdin: bool) -> Any:
        """A websocket running ARGV in pod NAME's container (the client's WSClient: its
        ``sock`` carries v4.channel.k8s.io frames). MonkeyError when it cannot be opened."""
        from kubernetes.client.exceptions import ApiException
        from kubernetes.stream import stream

        try:
            with self._exec_lock:
                return stream(
                    self._exec_core.connect_get_namespaced_pod_exec,
                    name,
                    self.namespace,
                    command=argv,
                    container="job",
                    stdin=stdin,
                    stdout=True,
                    stderr=True,
                    tty=False,
                    _preload_content=False,
                    binary=True,
                )
        except ApiException as exc:
            raise MonkeyError(f"exec in pod {name}: {_reason(exc)}") from None
        except (OSError, ValueError) as exc:
            raise MonkeyError(f"exec in pod {name}: {_reason(exc)}") from None

    def watch(
        self, selector: str, on_list: Callable[[list[dict[str, Any]]], None],
        on_event: Callable[[str, dict[str, Any]], None], stop: Callable[[], bool],
    ) -> None:  # fmt: skip
        """Follow the pods matching SELECTOR until STOP() says so: ON_LIST with every pod
        (first, and again after a 410 Gone), then ON_EVENT(type, pod) for each change.
        Raises MonkeyError when the API cannot be reached (the caller tries again)."""
        from kubernetes.watch.watch import iter_resp_lines

        def listing() -> dict[str, Any]:
            listed = self._call(
                "listing pods",
                lambda: self.core.list_namespaced_pod(
                    self.namespace, label_selector=selector, _preload_content=False
                ),
            )
            on_list(listed["items"])
            return listed

        def opened(version: str) -> Any:
            return self.core.list_namespaced_pod(
                self.namespace,
                label_selector=selector,
                watch=True,
                resource_version=version,
                allow_watch_bookmarks=True,
                timeout_seconds=300,
                _preload_content=False,
            )

        version = listing()["metadata"]["resourceVersion"]
        while not stop():
            resp = self._call_raw(opened, version)
            try:
                for line in iter_resp_lines(resp):
                    if stop():
                        return
                    if not line:
                        continue
                    event = json.loads(line)
                    obj = event.get("object") or {}
                    if event.get("type") == "ERROR":
                        if obj.get("code") == 410:  # expired: list again
                            version = listing()["metadata"]["resourceVersion"]
                            break
                        raise MonkeyError(f"watching pods: {obj.get('message')}")
                    version = obj.get("metadata", {}).get("resourceVersion") or version
                    if event.get("type") != "BOOKMARK":
                        on_event(event["type"], obj)
            except (OSError, ValueError) as exc:
                raise MonkeyError(f"watching pods: {_reason(exc)}") from None
            finally:
                resp.release_conn()

    def _call_raw(self, call: Callable[[str], Any], version: str) -> Any:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            return call(version)
        except ApiException as exc:
            raise MonkeyError(f"watching pods: {_said(exc)}") from None
        except (HTTPError, OSError) as exc:
            raise MonkeyError(
                f"watching pods: cannot reach the API server at {self.server} ({_reason(exc)})"
            ) from None


def _said(exc: Any) -> str:
    """The API's message of an ApiException (its Status), else its HTTP status."""
    try:
        message = json.loads(exc.body)["message"]
    except (TypeError, ValueError, KeyError):
        message = ""
    if exc.status == 401:
        return f"unauthorized (401): the kubeconfig's credentials were refused{': ' + message if message else ''}"
    return f"{message or exc.reason} ({exc.status})"


def _reason(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None)
    return str(reason or exc).splitlines()[0][:200]


def pod_manifest(
    name: str,
    labels: dict[str, str],
    image: str,
    cpus: int,
    memory: str | None,
    gpus: int,
    options: dict[str, Any],
    pull_secret: str | None,
    heartbeat: float = 5.0,
) -> dict[str, Any]:
    """The Pod of one attempt: restartPolicy Never, monkey's agent in the job's image (it
    waits for its code, put through an exec, then serves the core through the same channel;
    its SIGTERM is a notice to the job, GRACE seconds before the kubelet's SIGKILL), CPUS,
    MEMORY and GPUS as requests and limits, an emptyDir at /monkey, and the entry's OPTIONS
    (node_selector, tolerations, priority_class, service_account, queue; cache_claim: that
    claim at /monkey/cache)."""
    resources: dict[str, str] = {"cpu": str(max(1, cpus))}
    memory = memory or options.get("memory")
    if memory:
        resources["memory"] = quantity(parse_size(str(memory)))
    if gpus:
        resources[GPU] = str(gpus)
    if options.get("queue"):
        labels = {**labels, "kueue.x-k8s.io/queue-name": str(options["queue"])}
    agent = ["--root", POD_ROOT, "--socket", POD_SOCKET, "--idle-timeout", "3600",
             "--heartbeat", f"{heartbeat:g}", "--term-notice", str(GRACE), "--term-kind",
             "kubernetes"]  # fmt: skip
    container: dict[str, Any] = {
        "name": "job",
        "image": image,
        "command": ["sh", "-c", WAIT_FOR_AGENT, BOOT.format("agent"), POD_AGENT, *agent],
        "resources": {"requests": dict(resources), "limits": dict(resources)},
        "volumeMounts": [{"name": "monkey", "mountPath": RUN_FOLDER}],
    }
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": GRACE,
        "containers": [container],
        "volumes": [{"name": "monkey", "emptyDir": {}}],
    }
    if options.get("cache_claim"):
        container["volumeMounts"].append({"name": "cache", "mountPath": POD_CACHE})
        claim = {"claimName": str(options["cache_claim"])}
        spec["volumes"].append({"name": "cache", "persistentVolumeClaim": claim})
    if options.get("node_selector"):
        spec["nodeSelector"] = dict(options["node_selector"])
    if options.get("tolerations"):
        spec["tolerations"] = list(options["tolerations"])
    if options.get("priority_class"):
        spec["priorityClassName"] = options["priority_class"]
    if options.get("service_account"):
        spec["serviceAccountName"] = options["service_account"]
    if pull_secret:
        spec["imagePullSecrets"] = [{"name": pull_secret}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": spec,
    }


def _contexts(path: str) -> tuple[list[dict[str, Any]], str | None]:
    """The contexts of the kubeconfig at PATH and its current-context; MonkeyError in one
    line when it is not a readable kubeconfig."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        said = " ".join(str(exc).split())[:200]
        raise MonkeyError(
            f"kubeconfig {path} is not readable YAML ({said}); fix it or give another "
            "with --kubeconfig"
        ) from None
    if not isinstance(doc, dict):
        raise MonkeyError(
            f"kubeconfig {path} is not a kubeconfig (no contexts); give another with --kubeconfig"
        )
    contexts = [
        c
        for c in doc.get("contexts") or []
        if isinstance(c, dict) and isinstance(c.get("name"), str)
    ]
    current = doc.get("current-context")
    return contexts, current if isinstance(current, str) and current else None
