"""The SSH transport: a pool of machines reached over SSH (paramiko), one agent per host.

Per host: one transport shared by every channel; the agent is installed once per version
under ``WORKDIR/agent/<digest>/`` and started detached; the core's link to it is an exec
channel relaying to the agent's Unix socket. A thread per host keeps its connection
(reconnecting with back-off, reporting reach through ``changes()``) and, for the attempts
the core says are live there (``follow``), appends new stdout/stderr bytes to the local run
folders (from the local size, so nothing is lost or doubled across reconnects) and pulls
checkpoints periodically. The driver never reads nor writes the store: the core hands it
what it needs and records what it reports.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import shlex
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

from monkey.client_agent import rundir
from monkey.config import Home, ProviderConfig
from monkey.drivers import ssh_remote
from monkey.drivers.agent_link import AgentLink
from monkey.drivers.base import Capacity, NotReady, images_of, sandbox_of
from monkey.drivers.ssh_files import append_chunks, mirror, send_blobs, share_blobs
from monkey.drivers.ssh_hosts import (
    HostKeys,
    HostSpec,
    Unreachable,
    host_specs,
    open_transport,
)
from monkey.drivers.ssh_io import (
    Host,
    checked_rel,
    clear,
    drain,
    finish_channel,
    push_tree,
    read_exactly,
    remove_tree,
    sftp_makedirs,
    ssh_errors,
)
from monkey.drivers.transport import Transport
from monkey.models import Instance, InstanceState, MonkeyError
from monkey.version import AGENT_SRC, agent_digest, agent_files

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, ClassVar

    import paramiko

log = logging.getLogger("monkey.ssh")

# Folders of a job kept across attempts, under runs/<juid>/ on both sides: the checkpoint
# and job.yml's saved persisted folders. They follow the job from host to host.
_KEPT = ("checkpoint", "persist")
_LOG_NAMES = (rundir.STDOUT, rundir.STDERR, rundir.ORDER, rundir.SETUP_LOG)  # kept in step
_PUMP_EVERY = 0.25

_BACKOFF_MAX = 0.5
# Paths of the machine a job was submitted from; they mean nothing on another host.
_LOCAL_ONLY_ENV = frozenset(
    {
        "PATH",
        "VIRTUAL_ENV",
        "CONDA_PREFIX",
        "CONDA_DEFAULT_ENV",
        "PYTHONPATH",
        "LD_LIBRARY_PATH",
        "CUDA_HOME",
    }
)

logging.getLogger("paramiko").setLevel(logging.WARNING)


class SSHTransport(Transport):
    """Jobs on configured SSH hosts; run folders and blobs live under each host's workdir.

    Hosts can also come and go at run time (``add_host``, ``remove_host``): a cloud kind
    keeps one of these as the transport to its running instances. The pool of hosts is
    also the ``ssh`` kind's provisioning (see monkey.drivers.ssh.SSHDriver)."""

    kind = "ssh"
    # Whether each host runs an agent of its own (a Slurm login host does not: it only
    # carries Slurm's commands, files and relays to the agents inside allocations).
    runs_agent: ClassVar[bool] = True

    def __init__(self, config: ProviderConfig, home: Home) -> None:
        self.name = config.name
        self.config = config
        self.home = home
        # Called (from any thread) when ``changes()`` has news; its driver sets it.
        self.wake: Callable[[], None] = lambda: None
        opts = config.options
        self.timeout = float(opts.get("connect_timeout", 10))
        self.checkpoint_every = float(opts.get("checkpoint_every", 30))
        self.shared_fs: str | None = opts.get("shared_fs")
        self.host_keys = HostKeys(home, bool(opts.get("trust_on_first_use", False)))
        # Replaced, never changed in place, so readers iterate without a lock.
        self.hosts: dict[str, Host] = {}
        self.hosts_lock = threading.Lock()
        for spec in host_specs(config):
            instance = f"{self.name}/{spec.name}"
            self.hosts[instance] = Host(instance, spec)
        self.by_alias = {h.spec.name: h.spec for h in self.hosts.values()}
        self.tag = hashlib.blake2s(
            f"{socket.gethostname()}:{home.root}".encode(), digest_size=6
        ).hexdigest()
        # Per instance: the attempts live there, as the core last said (replaced, not changed).
        self.followed: dict[str, list[tuple[str, int]]] = {}
        self._changes: queue.SimpleQueue[tuple[Instance, str | None, dict[str, Any] | None]] = (
            queue.SimpleQueue()
        )
        self.closing = threading.Event()
        self.idle = os.environ.get("MONKEY_AGENT_IDLE_TIMEOUT", "600")
        self.heartbeat = os.environ.get("MONKEY_HEARTBEAT", "5")

    # -- the contract -------------------------------------------------------------------

    def instances(self) -> list[Capacity]:
        """The hosts reached; NotReady (the jobs wait, saying why) while none is and each
        one tried failed: unreachable, or refused for its key, user or configuration."""
        up = self.reached()
        hosts = self.hosts.values()
        if not up and hosts and all(h.tried and h.error for h in hosts):
            why = "; ".join(h.error or "" for h in hosts)
            raise NotReady(why) if any(h.waits for h in hosts) else MonkeyError(why)
        return up

    def reached(self) -> list[Capacity]:
        """Capacities of the hosts reached; the others are contacted by their own threads,
        so an unreachable one never stalls the caller."""
        hosts = self.hosts.values()
        for host in hosts:
            self._start_pump(host)
        return [h.capacity for h in hosts if h.up and h.capacity]

    def list_nodes(self) -> list[Instance]:
        """Every host: RUNNING once reached, UNKNOWN before or while unreachable."""
        return [
            Instance(
                h.instance,
                self.name,
                h.spec.name,
                InstanceState.RUNNING if h.up else InstanceState.UNKNOWN,
                address=h.spec.label,
                extra={"kind": self.kind},
            )
            for h in self.hosts.values()
        ]

    def add_host(self, instance: str, spec: HostSpec, node: Instance | None = None) -> None:
        """Serve INSTANCE, reached as SPEC, from now on (NODE: what its provider says of
        it, recorded with it). A host served already keeps its connection unless SPEC
        changed (a new address)."""
        with self.hosts_lock:
            old = self.hosts.get(instance)
            if old is not None and old.spec == spec:
                old.node = node
                return
            host = Host(instance, spec)
            host.node = node
            self.hosts = {**self.hosts, instance: host}
            self.by_alias = {**self.by_alias, spec.name: spec}
        if old is not None:
            self._retire(old)

    def remove_host(self, instance: str) -> None:
        """Stop serving INSTANCE: its thread ends and its connection closes (the agent and
        its jobs are left alone)."""
        with self.hosts_lock:
            host = self.hosts.get(instance)
            if host is None:
                return
            self.hosts = {k: v for k, v in self.hosts.items() if k != instance}
        self._retire(host)

    def _retire(self, host: Host) -> None:
        host.removed = True
        with host.lock:
            self._drop(host)

    def connect(self, instance: str) -> AgentLink:
        host = self._host(instance)
        if not host.tried:
            self._contact(host)
            self._start_pump(host)
        if not host.up:
            raise MonkeyError(
                f"{instance} is down ({host.error or 'connection lost'}); "
                "reconnecting in the background"
            )
        with ssh_errors(host):
            return self._open_link(host)

    def blobs_dir(self, instance: str) -> str:
        if self.shared_fs:
            return f"{self.shared_fs}/blobs"
        return f"{self._host(instance).workdir}/blobs"

    def run_dir(self, instance: str, juid: str, attempt: int) -> str:
        return f"{self._runs(self._host(instance))}/{juid}/{attempt}"

    def checkpoint_dir(self, instance: str, juid: str) -> str:
        """The host's copy of the job's checkpoint (and persisted folders), first made equal
        to MONKEY_HOME's, so that a job resumes on any host."""
        host = self._host(instance)
        remote = [f"{self._runs(host)}/{juid}/{name}" for name in _KEPT]
        with host.lock, ssh_errors(host):
            [(head, _)] = self._helper(host, ("mkdirs", [remote]))
            for name, path, made in zip(_KEPT, remote, head["made"]):
                local = self.home.runs / juid / name
                if not made or (local.is_dir() and any(local.iterdir())):
                    push_tree(self._sftp(host), str(local), path)
        return remote[0]

    def persist_dir(self, instance: str, juid: str) -> str:
        return f"{self.runs_dir(instance)}/{juid}/persist"

    def runs_dir(self, instance: str) -> str:
        """This MONKEY_HOME's run folders on the host."""
        return self._runs(self._host(instance))

    def job_env(self, env: dict[str, str]) -> dict[str, str]:
        """Without the submitting machine's software paths: the host has its own."""
        return {k: v for k, v in env.items() if k not in _LOCAL_ONLY_ENV}

    def prepare(self, instance: str, blobs: list[str]) -> dict[str, Any]:
        """Send the blobs the host lacks: ask which are missing, then stream only those
        (with ``shared_fs``, put them into the shared folder instead)."""
        host = self._host(instance)
        wanted = [b for b in dict.fromkeys(blobs) if b not in host.synced]
        if not wanted:
            return {}
        if self.shared_fs:
            share_blobs(self.home.blobs, Path(self.shared_fs or ""), wanted)
            host.synced.update(wanted)
            return {}
        missing = self.missing(instance, wanted)
        if missing:
            with ssh_errors(host):
                self._send_blobs(host, f"{host.workdir}/blobs", missing)
        host.synced.update(wanted)
        return {}

    def missing(self, instance: str, blobs: list[str]) -> list[str]:
        """The BLOBS the host's blobs folder lacks, asked in one round trip unless all are
        known there; the ones found there are remembered."""
        host = self._host(instance)
        wanted = [b for b in dict.fromkeys(blobs) if b not in host.synced]
        if not wanted:
            return []
        with ssh_errors(host):
            out = self._exec(
                host,
                ssh_remote.MISSING,
                [self.blobs_dir(instance)],
                "".join(f"{b}\n" for b in wanted).encode(),
            )
        missing = out.decode().split()
        host.synced.update(set(wanted) - set(missing))
        return missing

    def clean(
        self, instance: str, runs: list[str], keep: list[str] | None, grace: float
    ) -> dict[str, int]:
        """Delete this home's folders of the deleted jobs RUNS on INSTANCE and, unless KEEP
        is None, the blobs there that neither KEEP nor another home's gc names, unused for
        GRACE seconds, and partial uploads; what was freed (see ssh_remote.CLEAN)."""
        host = self.ensure_up(instance)
        if self.shared_fs:
            keep = None  # the shared folder is every host's: not one host's to collect
        request = {"runs": runs, "gc": keep is not None, "keep": keep or []}
        with ssh_errors(host):
            out = self._exec(
                host,
                ssh_remote.CLEAN,
                [host.workdir, self._runs(host), str(grace)],
                json.dumps(request).encode(),
            )
        if keep is not None:
            host.synced = set()  # what it holds is asked again at the next start
        return json.loads(out)

    def host_usage(self, instance: str) -> dict[str, Any]:
        """What monkey keeps on INSTANCE's host (see ssh_remote.USAGE)."""
        host = self.ensure_up(instance)
        with ssh_errors(host):
            return json.loads(self._exec(host, ssh_remote.USAGE, [host.workdir, self._runs(host)]))

    def forget_blobs(self, instance: str) -> None:
        self._host(instance).synced.clear()

    def follow(self, instance: str, attempts: list[tuple[str, int]]) -> None:
        self.followed = {**self.followed, instance: list(attempts)}

    def finish(
        self, instance: str, juid: str, attempt: int, outputs: list[str], current: bool
    ) -> None:
        host = self._host(instance)
        if not host.up:
            raise MonkeyError(
                f"{instance} is down; the logs of {juid} attempt {attempt} stay there"
            )
        # One round trip for the common case: the logs' tails and the kept folders' listings.
        kept = [("listing", [f"{self._runs(host)}/{juid}/{name}"]) for name in _KEPT]
        with host.lock, ssh_errors(host):
            call, local = self._tail_call(host, [(juid, attempt)])
            results = self._helper(host, call, *(kept if current else []))
            if append_chunks(local, results[0][1]):
                self._fetch_logs(host, [(juid, attempt)])
            for name, (listing, _) in zip(_KEPT, results[1:]):
                self._pull_kept(host, juid, name, listing)
            self._fetch_outputs(host, juid, attempt, outputs)

    def _fetch_outputs(self, host: Host, juid: str, attempt: int, globs: list[str]) -> None:
        """Bring the files of `run --outputs` back into the attempt's local work folder."""
        if not globs:
            return
        work = f"{self._runs(host)}/{juid}/{attempt}/{rundir.WORK}"
        local = self.home.run_dir(juid, attempt) / rundir.WORK
        with host.lock:
            [(head, _)] = self._helper(host, ("matches", [work, globs]))
            for rel in head["files"]:
                dst = local / checked_rel(rel)
                clear(dst.parent, local)
                dst.parent.mkdir(parents=True, exist_ok=True)
                self._sftp(host).get(f"{work}/{rel}", str(dst))

    def close(self) -> None:
        self.closing.set()
        for host in self.hosts.values():
            with host.lock:
                self._drop(host)

    # -- status ---------------------------------------------------------------------------

    def check(self) -> list[dict[str, Any]]:
        """Contact every host now; one report per host (error None when usable)."""
        report = []
        for host in self.hosts.values():
            self._contact(host)
            cap = host.capacity if host.up else None
            report.append(
                {
                    "instance": host.instance,
                    "host": host.spec.label,
                    "error": host.error,
                    "slots": cap.slots if cap else None,
                    "gpus": cap.gpus if cap else [],
                    "memory": cap.memory if cap else None,
                    "workdir": host.workdir or None,
                    "isolation": cap.extra.get("isolation") if cap else None,
                    "images": cap.extra.get("images") if cap else None,
                }
            )
        return report

    def bytes_sent(self) -> int:
        """Blob bytes sent to all hosts by this driver (for benchmarks and tests)."""
        return sum(h.bytes_sent for h in self.hosts.values())

    # -- connection ---------------------------------------------------------------------

    def _runs(self, host: Host) -> str:
        """This MONKEY_HOME's run folders on the host (several homes may share a host)."""
        return f"{host.workdir}/runs/{self.tag}"

    def _host(self, instance: str) -> Host:
        host = self.hosts.get(instance)
        if host is None:
            raise MonkeyError(f"provider {self.name!r} has no host {instance!r}")
        return host

    def _contact(self, host: Host) -> None:
        """Connect, install and start the agent, learn capacity."""
        with host.lock:
            if host.up or host.removed:
                return  # another thread connected it while this one waited, or it is gone
            host.tried = True
            self._drop(host)
            try:
                host.transport = open_transport(
                    host.spec, self.host_keys, self.timeout, self.by_alias
                )
                sftp = self._sftp(host)
                home = sftp.normalize(".")
                wd = host.spec.workdir
                host.workdir = home + wd[1:] if wd == "~" or wd.startswith("~/") else wd
                self._install_agent(host)
                want = agent_digest()
                hello: dict[str, Any] = {"digest": want}
                if self.runs_agent:
                    with self._open_link(host) as link:
                        hello = link.request("hello", timeout=self.timeout)
                        if hello.get("digest") != want:  # a reinstall: jobs keep running
                            log.info("%s: replacing an outdated agent", host.instance)
                            link.request("shutdown", timeout=self.timeout)
                if hello.get("digest") != want:
                    with self._open_link(host) as link:  # the relay starts the installed one
                        hello = link.request("hello", timeout=self.timeout)
            except Unreachable as exc:
                self._failed(host, str(exc), transient=True)
                return
            except MonkeyError as exc:
                self._failed(host, str(exc), transient=False, waits=isinstance(exc, NotReady))
                return
            except Exception as exc:  # noqa: BLE001 - OSError, EOFError, paramiko's, agent's
                self._failed(host, f"{host.spec.name}: {type(exc).__name__}: {exc}", transient=True)
                return
            spec = host.spec
            gpus = (
                spec.gpus
                if spec.gpus is not None
                else [str(g["index"]) for g in hello.get("gpus", [])]
            )
            host.capacity = Capacity(
                host.instance,
                int(spec.cpus or hello.get("cpus") or 1),
                gpus,
                spec.memory if spec.memory is not None else hello.get("memory"),
                {
                    "host": spec.label,
                    "workdir": host.workdir,
                    "isolation": sandbox_of(hello),
                    "images": images_of(hello, self.config.options),
                },
            )
            host.error, host.failures = None, 0
            self._record(host, "up")
            log.info("%s: connected, %d cpus, gpus %s", host.instance, host.capacity.slots, gpus)

    def _fixed(self, host: Host) -> bool:
        """Whether a host refused for its key may be accepted now: known_hosts changed."""
        if host.transient or not host.error:
            return False
        try:
            self.host_keys.refresh()
        except MonkeyError:
            pass
        return self.host_keys.stamp != host.keys_seen

    def _failed(self, host: Host, error: str, transient: bool, waits: bool = False) -> None:
        """Record why HOST is not usable; WAITS: its jobs wait for it (it cannot be reached
        or trusted yet) rather than fail (a wrong user, key or python: the configuration's)."""
        self._drop(host)
        changed = error != host.error
        host.error, host.transient, host.waits = error, transient, transient or waits
        host.keys_seen = self.host_keys.stamp
        host.failures += 1
        # An unreachable host is retried soon; keys, users and config do not fix themselves.
        delay = min(_BACKOFF_MAX, 0.25 * 2 ** min(host.failures - 1, 8)) if transient else 10.0
        host.next_try = time.monotonic() + delay
        if changed:  # once per change, not once per retry
            log.warning("%s: %s", host.instance, error)
            self._record(host, "unreachable" if transient else "error")

    def _drop(self, host: Host) -> None:
        for closable in (
            host.helper,
            host.sftp,
            host.transport,
            getattr(host.transport, "jump", None),
        ):
            if closable is not None:
                try:
                    closable.close()
                except Exception:  # noqa: BLE001 - closing a dead connection may fail any way
                    pass
        host.helper = host.helper_out = host.sftp = host.transport = None

    def _record(self, host: Host, state: str) -> None:
        """Record the host's reach; a cloud instance keeps the state its provider reported."""
        cap = host.capacity
        extra = {
            **(host.node.extra if host.node else {}),
            "error": host.error,
            "workdir": host.workdir,
        }
        if cap is not None:
            extra.update(slots=cap.slots, gpus=cap.gpus, memory=cap.memory)
        if host.node is not None:
            inst = host.node
        else:
            inst = Instance(
                host.instance,
                self.name,
                host.spec.name,
                InstanceState.RUNNING if state == "up" else InstanceState.UNKNOWN,
                address=host.spec.label,
                extra={"kind": self.kind},
            )
        self._changes.put((inst, state, extra))
        self.wake()

    def changes(self) -> list[tuple[Instance, str | None, dict[str, Any] | None]]:
        found = []
        while True:
            try:
                found.append(self._changes.get_nowait())
            except queue.Empty:
                return found

    def _sftp(self, host: Host) -> paramiko.SFTPClient:
        if host.sftp is None:
            if host.transport is None:
                raise MonkeyError(f"{host.instance} is not connected")
            import paramiko

            host.sftp = paramiko.SFTPClient.from_transport(host.transport)
        return host.sftp

    def _helper(
        self, host: Host, *calls: tuple[str, list[Any]]
    ) -> list[tuple[dict[str, Any], list[bytes | None]]]:
        """One round trip to the host's file helper: per call, its result and files' bytes."""
        with host.lock, ssh_errors(host):
            if host.helper is None or host.helper.closed:
                host.helper = self._run(host, ssh_remote.HELPER, [])
                host.helper_out = host.helper.makefile("rb")
            try:
                host.helper.sendall(json.dumps(calls).encode() + b"\n")
                results = []
                for head in json.loads(read_exactly(host.helper_out, None)):
                    sizes = head.get("sizes", [])
                    results.append(
                        (
                            head,
                            [read_exactly(host.helper_out, n) if n >= 0 else None for n in sizes],
                        )
                    )
            except BaseException:
                host.helper.close()  # a half-read reply would garble the next one
                host.helper = None
                raise
        for (op, _), (head, _) in zip(calls, results):
            if not head.get("ok"):
                raise MonkeyError(f"{host.instance}: {op} failed: {head.get('error')}")
        return results

    def _exec(self, host: Host, script: str, args: list[str], data: bytes = b"") -> bytes:
        """Run a stdlib script with the host's python3; its stdout, or MonkeyError."""
        channel = self._run(host, script, args)
        try:
            if data:
                channel.sendall(data)
            channel.shutdown_write()
            return finish_channel(channel, host)
        finally:
            channel.close()

    def _run(
        self, host: Host, script: str, args: list[str], prefix: list[str] | tuple[str, ...] = ()
    ) -> paramiko.Channel:
        """An exec channel running the stdlib SCRIPT with the host's python (under PREFIX)."""
        # -I: the login folder (and PYTHON* variables) never reach the script's sys.path.
        return self._open_command(host, [*prefix, host.spec.python, "-I", "-c", script, *args])

    def _open_command(self, host: Host, argv: list[str]) -> paramiko.Channel:
        with host.lock, ssh_errors(host):
            if host.transport is None:
                raise MonkeyError(f"{host.instance} is not connected")
            channel = host.transport.open_session(timeout=self.timeout)
            channel.exec_command(shlex.join(argv))
        return channel

    def ensure_up(self, instance: str) -> Host:
        """INSTANCE's host, connected now if it was not (its thread started); MonkeyError
        (Unreachable when worth retrying) with its last error while it cannot be reached."""
        host = self._host(instance)
        if not host.up and time.monotonic() >= host.next_try:
            self._contact(host)
        self._start_pump(host)
        if not host.up:
            error = host.error or f"{instance} is not connected"
            raise Unreachable(error) if host.transient else MonkeyError(error)
        return host

    def run_command(
        self, instance: str, argv: list[str], stdin: str = "", timeout: float = 60.0
    ) -> tuple[int, str, str]:
        """Run ARGV (each word quoted) on INSTANCE's host: exit code, stdout, stderr."""
        host = self.ensure_up(instance)
        with ssh_errors(host):
            channel = self._open_command(host, argv)
            try:
                channel.settimeout(timeout)
                if stdin:
                    channel.sendall(stdin.encode())
                channel.shutdown_write()
                code, out, err = drain(channel)
                return code, out.decode(errors="replace"), err.decode(errors="replace")
            except TimeoutError:
                raise MonkeyError(
                    f"{instance}: {argv[0]} gave no answer in {timeout:.0f}s"
                ) from None
            finally:
                channel.close()

    def _install_agent(self, host: Host) -> None:
        """Copy client_agent to WORKDIR/agent/<digest>/ unless that version is there."""
        sftp = self._sftp(host)
        base = f"{host.workdir}/agent"
        final = f"{base}/{agent_digest()}"
        try:
            sftp.stat(f"{final}/monkey/client_agent/agent.py")
            return
        except FileNotFoundError:
            pass
        tmp = f"{base}/.tmp-{agent_digest()}-{os.getpid()}-{threading.get_ident()}"
        sftp_makedirs(sftp, f"{tmp}/monkey/client_agent")
        with sftp.open(f"{tmp}/monkey/__init__.py", "wb") as fh:
            fh.write(b"")
        for name in agent_files():
            sftp.put(str(AGENT_SRC / name), f"{tmp}/monkey/client_agent/{name}")
        try:
            sftp.posix_rename(tmp, final)
        except OSError:
            sftp.stat(f"{final}/monkey/client_agent/agent.py")  # installed meanwhile
            remove_tree(sftp, tmp)
        log.info("%s: installed the agent in %s", host.instance, final)

    def open_relay(self, instance: str, sock: str, root: str, prefix: list[str]) -> AgentLink:
        """An AgentLink to the agent listening on SOCK (its run root ROOT) somewhere the host
        reaches by running the relay under PREFIX (e.g. ``srun --jobid=J``); connects first."""
        host = self.ensure_up(instance)
        with ssh_errors(host):
            return self._open_link(host, sock, root, prefix)

    def _open_link(
        self,
        host: Host,
        sock: str | None = None,
        root: str | None = None,
        prefix: list[str] | tuple[str, ...] = (),
    ) -> AgentLink:
        """An AgentLink over an exec channel relaying to the agent's socket."""
        root = root or host.workdir
        code = f"{host.workdir}/agent/{agent_digest()}"
        channel = self._run(
            host,
            ssh_remote.RELAY,
            [
                sock or f"{root}/private/agent.sock",
                root,
                code,
                self.idle,
                self.heartbeat,
            ],
            prefix,
        )
        channel.settimeout(self.timeout + 15)
        first = b""
        try:
            while not first.endswith(b"\n"):
                chunk = channel.recv(1)
                if not chunk:
                    break
                first += chunk
        except TimeoutError:
            pass
        if first != b"ok\n":
            channel.settimeout(2)
            try:
                err = finish_channel(channel, host, check=False, stderr=True)
            except TimeoutError:
                err = b"no answer from the relay"
            finally:
                channel.close()
            raise MonkeyError(
                f"{host.instance}: cannot reach the agent: {err.decode(errors='replace').strip()}"
            )
        return AgentLink(channel)

    # -- the per-host thread ------------------------------------------------------------

    def _start_pump(self, host: Host) -> None:
        if host.thread is None:
            host.thread = threading.Thread(
                target=self._pump, args=(host,), daemon=True, name=f"ssh-{host.instance}"
            )
            host.thread.start()

    def _pump(self, host: Host) -> None:
        last_checkpoint = time.monotonic()
        while not host.removed:
            if host.tried and self.closing.wait(_PUMP_EVERY):
                return
            try:
                if not host.up:
                    if time.monotonic() < host.next_try and not self._fixed(host):
                        continue
                    self._contact(host)  # and, when back, fetch the logs at once
                    if not host.up:
                        continue
                live = self.followed.get(host.instance) or []
                if live:
                    self._fetch_logs(host, live)
                if time.monotonic() - last_checkpoint >= self.checkpoint_every:
                    last_checkpoint = time.monotonic()
                    for juid, _ in live:  # a live attempt is its job's newest
                        for name in _KEPT:
                            self._pull_kept(host, juid, name)
            except Exception as exc:  # noqa: BLE001 - the thread must survive any failure
                if self.closing.is_set():
                    return
                log.warning("%s: %s", host.instance, exc)
                with host.lock:
                    if host.transport is not None and not host.transport.is_active():
                        self._failed(host, f"{host.spec.name}: connection lost", transient=True)

    # -- transfers ----------------------------------------------------------------------

    def _tail_call(
        self, host: Host, attempts: list[tuple[str, int]]
    ) -> tuple[tuple[str, list[Any]], list[Path]]:
        """The helper call reading the attempts' logs past their local sizes, and the files."""
        remote, local = [], []
        for juid, n in dict.fromkeys(attempts):  # each file once: twice would append it twice
            folder = self.home.run_dir(juid, n)
            folder.mkdir(parents=True, exist_ok=True)
            for name in _LOG_NAMES:
                path = folder / name
                have = path.stat().st_size if path.exists() else 0
                remote.append([f"{self._runs(host)}/{juid}/{n}/{name}", have])
                local.append(path)
        return ("tail", [remote]), local

    def fetch_logs(self, instance: str, attempts: list[tuple[str, int]]) -> None:
        """Bring the ATTEMPTS' logs on INSTANCE up to date in MONKEY_HOME now."""
        self._fetch_logs(self._host(instance), attempts)

    def _fetch_logs(self, host: Host, attempts: list[tuple[str, int]]) -> None:
        """Append the remote logs' new bytes to the local copies (from their local size, so
        a reconnect neither loses nor repeats a byte)."""
        with host.lock:
            more = True
            while more:
                call, local = self._tail_call(host, attempts)
                [(_, chunks)] = self._helper(host, call)
                more = append_chunks(local, chunks)

    def _pull_kept(
        self, host: Host, juid: str, name: str, listing: dict[str, Any] | None = None
    ) -> None:
        """Make MONKEY_HOME's copy of a kept folder equal to the host's (regular files only)."""
        remote = f"{self._runs(host)}/{juid}/{name}"
        with host.lock:
            if listing is None:
                [(listing, _)] = self._helper(host, ("listing", [remote]))
            if listing["exists"]:
                sftp = self._sftp(host)
                mirror(
                    listing,
                    self.home.runs / juid / name,
                    lambda rel, to: sftp.get(f"{remote}/{rel}", to),
                )

    def _send_blobs(self, host: Host, target: str, digests: list[str]) -> None:
        """Stream DIGESTS into the host's blobs folder TARGET (see ``ssh_files.send_blobs``)."""
        channel = self._run(host, ssh_remote.RECEIVE, [target])
        try:
            sent = send_blobs(channel, host, self.home.blobs, digests)
        finally:
            channel.close()
        log.info("%s: sent %d blobs, %d bytes", host.instance, len(digests), sent)
