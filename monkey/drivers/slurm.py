"""The `slurm` provider: hands work to a Slurm cluster's own scheduler.

Slurm places, queues and accounts; monkey keeps what it adds everywhere else. An
*allocation* is one Slurm batch job made for one monkey attempt: an elastic instance that
lives as long as that attempt. ``create_node`` submits the batch script (``batch_script``)
with ``sbatch``; the script starts monkey's agent (stdlib python3, copied to ``workdir``)
inside the allocation, listening on a Unix socket; the core reaches it there like the local
agent, and sends it the job's ``start`` as on any other instance, so logs, events, metrics,
checkpoints and set-up work as elsewhere. Once its job ended the allocation takes no other
(its capacity drops to 0) and ``finish`` releases it with ``scancel`` at once. Jobs that
wait together get their allocations from one sbatch, a job array (``create_nodes``: one task
per job, ``ARRAYID_TASK``; a sweep's held cells included, ``%max_parallel`` at once).
A job's resources size its allocation: ``--cpus-per-task``, ``--mem``, ``--gres=gpu:N``.

State is followed with one ``squeue`` call per listing for all of the provider's
allocations (the core's inventory, in a worker, every few seconds), never one per job; an
allocation's agent is known reached as soon as its socket appears. A job's exit comes from
the agent's exit record in its run directory.

Sharing: without ``login``, MONKEY_HOME (runs, blobs, checkpoints) and ``workdir`` must be
on a filesystem the allocation's node shares with this machine, and Slurm's commands run
here. With ``login: {host, user, key, port, trust_new_host}`` every Slurm command runs on
that host over SSH and nothing of MONKEY_HOME is assumed shared: blobs, the agent's code and
run folders go under ``workdir`` (on the cluster's shared filesystem) through the login
host, the core reaches an allocation's agent with ``srun --overlap`` from there, and logs,
outputs and checkpoints come back as from SSH hosts (``slurm_login``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shlex
import shutil
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from monkey.drivers.agent_link import connect_unix
from monkey.drivers.base import Capacity, Driver, unknown_keys
from monkey.drivers.slurm_commands import (
    Runner,
    Size,
    mem_megabytes,
    partitions,
    pending_jobs,
    slurm_command,
    slurm_time,
)
from monkey.drivers.transport import Transport
from monkey.models import Instance, InstanceState, MonkeyError, Resources, parse_size

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from monkey.config import Home, ProviderConfig
    from monkey.drivers.agent_link import AgentLink
    from monkey.drivers.slurm_login import LoginHost

log = logging.getLogger("monkey.slurm")

_AGENT_SRC = Path(__file__).resolve().parents[1] / "client_agent"
_KEYS = {
    "partition",
    "account",
    "qos",
    "time",
    "gres",
    "constraint",
    "extra_args",
    "workdir",
    "signal",
    "requeue",
    "python",
    "max_instances",
    "idle_timeout",
    "login",
}
# Values that go into `#SBATCH` lines as they are: no spaces, quotes or newlines.
_WORD = re.compile(r"[A-Za-z0-9_.:,=+/@%-]+")
_SIGNAL = re.compile(r"(B:)?[A-Z0-9]+@\d+")
_WATCH_EVERY = 0.05  # seconds between looks for the sockets of allocations starting
_WATCH_LOGIN_EVERY = 0.25  # the same through a login host (one round trip each)
_SOCKET_MAX = 100
# Slurm's job states as instance states; anything else (finished) is TERMINATED.
_STATES = {
    "PENDING": InstanceState.PENDING,
    "CONFIGURING": InstanceState.PENDING,
    "REQUEUED": InstanceState.PENDING,
    "REQUEUE_HOLD": InstanceState.PENDING,
    "REQUEUE_FED": InstanceState.PENDING,
    "RESV_DEL_HOLD": InstanceState.PENDING,
    "RUNNING": InstanceState.RUNNING,
    "SUSPENDED": InstanceState.RUNNING,
    "SIGNALING": InstanceState.RUNNING,
    "STAGE_OUT": InstanceState.RUNNING,
    "COMPLETING": InstanceState.STOPPING,
    "STOPPED": InstanceState.STOPPING,
}
# Run by the batch shell on Slurm's warning signal: the agent takes it as a preemption
# notice (its jobs get SIGTERM, checkpoint, and end `preempted`). argv: the agent's socket,
# the seconds left, what happens.
NOTICE = (
    "import json, socket, sys; s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); "
    's.sendall(json.dumps({"id": 1, "op": "notice", "kind": "slurm", "lead": float(sys.argv[2]), '
    '"detail": sys.argv[3]}).encode() + b"\\n"); s.recv(65536)'
)
# Seconds between Slurm's SIGTERM (a requeue, a preemption) and its SIGKILL: KillWait,
# 30 s unless the cluster says otherwise; the agent's jobs get them to checkpoint.
_KILL_WAIT = 30
# An allocation for a job with a time limit (`run --time`) gets this much more than the
# limit from Slurm, beyond the warning signal's lead: the agent's own limit comes first.
_TIME_MARGIN = 60
_QUEUED = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "CONFIGURING"}
# Slurm's final states that mean "ended from outside" (sacct): the attempt resumes.
_PREEMPTED_STATES = {"PREEMPTED", "TIMEOUT", "NODE_FAIL", "BOOT_FAIL", "DEADLINE"}
_AGENT_BOOT = (
    "import sys; sys.path.insert(0, sys.argv.pop(1)); "
    "from monkey.client_agent.agent import main; main()"
)


@dataclass
class _Alloc:
    """An allocation this driver made or listed."""

    job_id: str
    size: Size
    created: float  # monotonic: compared with a listing's start only
    reached: bool = False
    used: bool = False  # a job was placed on it: it takes no other
    number: str | None = None  # Slurm's own job id of an array task (srun --jobid)


class SlurmDriver(Driver):
    """Allocations made with sbatch, each running monkey's agent for one attempt."""

    kind = "slurm"
    elastic = True
    batches = True  # waiting jobs and held sweep cells get one job array
    releases_on_finish = True

    # -- the kind's rules -------------------------------------------------------------------

    @classmethod
    def validate(cls, where: str, name: str, entry: dict[str, Any]) -> None:
        """Slurm option values are single words; extra_args a list of sbatch options;
        ``login`` a host reached over SSH."""
        unknown_keys(where, name, entry, _KEYS)
        if "login" in entry:
            from monkey.drivers.slurm_login import validate_login

            validate_login(where, name, entry["login"])
        for key in ("partition", "account", "qos", "time", "gres", "constraint", "python"):
            value = entry.get(key)
            if value is not None and not (isinstance(value, str) and _WORD.fullmatch(value)):
                raise MonkeyError(
                    f"{where}: provider {name!r}: {key} must be one word "
                    f"(letters, digits, _.:,=+/@%-), got {value!r}"
                )
        signal = entry.get("signal")
        if signal is not None and not (isinstance(signal, str) and _SIGNAL.fullmatch(signal)):
            raise MonkeyError(
                f"{where}: provider {name!r}: signal must look like B:USR1@120 "
                f"(sbatch --signal), got {signal!r}"
            )
        extra = entry.get("extra_args", [])
        if not isinstance(extra, list) or not all(
            isinstance(a, str) and a.startswith("-") and "\n" not in a for a in extra
        ):
            raise MonkeyError(
                f"{where}: provider {name!r}: extra_args must be a list of sbatch "
                "options, each one line starting with '-' (e.g. --nice=10)"
            )
        for key in ("max_instances", "idle_timeout"):
            value = entry.get(key)
            if value is not None and (
                not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0
            ):
                raise MonkeyError(
                    f"{where}: provider {name!r}: {key} must be a number >= 0, got {value!r}"
                )
        if entry.get("requeue") is not None and not isinstance(entry["requeue"], bool):
            raise MonkeyError(f"{where}: provider {name!r}: requeue must be true or false")
        workdir = entry.get("workdir")
        if workdir is not None and not (isinstance(workdir, str) and workdir):
            raise MonkeyError(f"{where}: provider {name!r}: workdir must be a folder path")

    @classmethod
    def never_fits(cls, config: ProviderConfig, resources: Resources) -> str | None:
        if resources.host:
            return f"provider {config.name!r} is a Slurm cluster; --host is for ssh providers"
        return None  # the cluster decides: a request it refuses is reported by sbatch

    @classmethod
    def describe(cls, config: ProviderConfig, instances: list[dict[str, Any]]) -> dict[str, Any]:
        """The partition's nodes by state and its pending jobs (one sinfo, one squeue)."""
        partition = config.options.get("partition")
        live = sum(1 for i in instances if i.get("state") not in ("terminated", None))
        login = None
        try:
            run: Runner = slurm_command
            if config.options.get("login"):
                from monkey.config import Home
                from monkey.drivers.slurm_login import LoginHost

                login = LoginHost(
                    config.name, config.options["login"], config.options.get("workdir"), Home()
                )
                run = login.run
            parts = partitions(run)
            if partition is None:
                partition = next((p for p, i in parts.items() if i["default"]), None)
            info = parts.get(str(partition))
            if info is None:
                return {
                    "slots": 0,
                    "gpus": 0,
                    "error": f"no partition {partition!r} "
                    f"(partitions: {', '.join(sorted(parts)) or 'none'})",
                }
            pending = pending_jobs(str(partition), run)
        except MonkeyError as exc:
            return {"slots": 0, "gpus": 0, "error": str(exc)}
        finally:
            if login is not None:
                login.close()
        state = "up" if info["up"] else "down"
        return {
            "slots": info["idle_cpus"],
            "gpus": 0,
            "allocations": live,
            "detail": f"partition {partition} ({state}): {info['idle']} idle, {info['mixed']} mixed, "
            f"{info['allocated']} allocated nodes; {pending} pending jobs",
        }

    # -- provisioning -----------------------------------------------------------------------

    def __init__(self, config: ProviderConfig, home: Home) -> None:
        super().__init__(config, home)
        options = config.options
        self.login: LoginHost | None = None
        if options.get("login"):
            from monkey.drivers.slurm_login import LoginHost

            self.login = LoginHost(self.name, options["login"], options.get("workdir"), home)
        # With a login host: resolved there at first contact (``_ready``).
        self.workdir = Path(
            os.path.expanduser(str(options.get("workdir") or home.root / "slurm" / self.name))
        )
        self.job_name = f"monkey-{home.home_id()}-{self.name}"
        self._allocs: dict[str, _Alloc] = {}
        self._released: set[str] = set()  # scancelled: not listed while Slurm winds them up
        self._lock = threading.Lock()
        self._installed: str | None = None
        self._closed = threading.Event()
        self.transport = SlurmTransport(self)
        self._watcher: threading.Thread | None = None

    @property
    def idle_timeout(self) -> float:
        """An allocation is released as soon as its attempt ended (``finish``); one that
        came up while no job waited (a sweep's cell not released yet) is kept this long
        for one (default 30 s)."""
        return float(self.config.options.get("idle_timeout", 30))

    @property
    def boot_timeout(self) -> float:
        """Allocations may wait in Slurm's queue as long as Slurm keeps them."""
        return float("inf")

    def size_for(self, resources: Resources) -> str | None:
        return str(Size.of(resources))

    def size_slots(self, size: str | None) -> int:
        return Size.parse(size).cpus

    def instance_id(self, job_id: str) -> str:
        return f"{self.name}/{job_id}"

    def _job_id(self, instance: str) -> str:
        return instance.rsplit("/", 1)[-1]

    def _socket_parts(self) -> tuple[str, str]:
        """The agent's socket path around the job id: under workdir, or under /tmp when
        workdir is too deep for a Unix socket's path."""
        prefix, suffix = f"{self.workdir}/alloc/", "/agent.sock"
        if len(prefix) + len(suffix) + 20 <= _SOCKET_MAX:  # ARRAYID_TASK
            return prefix, suffix
        tag = hashlib.blake2s(str(self.workdir).encode(), digest_size=6).hexdigest()
        return f"/tmp/monkey-{os.getuid()}/slurm-{tag}-", ".sock"

    def socket_path(self, job_id: str) -> str:
        """Where the allocation JOB_ID's agent listens."""
        prefix, suffix = self._socket_parts()
        return f"{prefix}{job_id}{suffix}"

    def batch_script(self, size: Size, array: str | None = None) -> str:
        """The sbatch script of one allocation, or with ARRAY (sbatch's ``--array`` value) of
        an array of them, one per task: sbatch options, then the agent, which serves the
        allocation's attempt; a pre-timeout/preemption signal reaches it as SIGTERM. An
        array task's allocation is named ``ARRAYID_TASK``, as squeue and scancel name it."""
        opts = self.config.options
        out = "%A_%a" if array else "%j"
        lines = [
            "#!/bin/bash",
            f"#SBATCH --job-name={self.job_name}",
            f"#SBATCH --output={self.workdir}/logs/{out}.out",
            "#SBATCH --open-mode=append",
            "#SBATCH --nodes=1",
            "#SBATCH --ntasks=1",
        ]
        if array:
            lines.append(f"#SBATCH --array={array}")
        signal_spec = str(opts.get("signal", "B:USR1@120"))
        warn, lead = signal_spec.removeprefix("B:").split("@")
        for key in ("partition", "account", "qos", "time", "constraint"):
            if key == "time" and size.time:  # the job's own limit, and room to enforce it
                lines.append(f"#SBATCH --time={slurm_time(size.time + int(lead) + _TIME_MARGIN)}")
            elif opts.get(key):
                lines.append(f"#SBATCH --{key}={opts[key]}")
        lines.append(f"#SBATCH --cpus-per-task={size.cpus}")
        if size.memory:
            lines.append(f"#SBATCH --mem={mem_megabytes(size.memory)}M")
        gres = [str(opts["gres"])] if opts.get("gres") else []
        if size.gpus:
            gres.append(f"gpu:{size.gpus}")
        if gres:
            lines.append(f"#SBATCH --gres={','.join(gres)}")
        lines.append(f"#SBATCH --signal={signal_spec}")
        lines.append("#SBATCH --requeue" if opts.get("requeue", True) else "#SBATCH --no-requeue")
        lines += [f"#SBATCH {arg}" for arg in opts.get("extra_args", [])]
        root = shlex.quote(str(self.workdir / "alloc"))
        logs = shlex.quote(str(self.workdir / "logs"))  # the --output folder
        prefix, suffix = self._socket_parts()
        # The allocation's name: its job id, or for an array task ARRAYID_TASK.
        me = '"${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"' if array else '"$SLURM_JOB_ID"'
        sock = f"{shlex.quote(prefix)}{me}{shlex.quote(suffix)}"
        code = shlex.quote(str(self.workdir / "agent" / self._agent_version()))
        idle = shlex.quote(os.environ.get("MONKEY_AGENT_IDLE_TIMEOUT", "600"))
        beat = shlex.quote(os.environ.get("MONKEY_HEARTBEAT", "5"))
        python = str(opts.get("python", "python3"))  # one word (validate)
        lines += [
            "# monkey: this allocation runs monkey's agent, which runs one attempt of a monkey",
            "# job; its logs, events and exit code are in the attempt's run directory.",
            f"root={root}/{me}",
            f"sock={sock}",
            'mkdir -p "$root"',
            '(umask 077 && mkdir -p "$(dirname "$sock")")  # private: maybe /tmp/monkey-UID',
            f"{python} -I -c {shlex.quote(_AGENT_BOOT)} {code} --root \"$root\" --socket \"$sock\" \\",
            f"    --idle-timeout {idle} --heartbeat {beat} --term-notice {_KILL_WAIT} \\",
            f"    --slurm-log {logs}/{me}.out &  # where Slurm says why it ends the allocation",
            "agent=$!",
            f"# Slurm's warning {lead}s before the time limit, and its SIGTERM on a requeue or a",
            "# preemption: the agent's jobs get SIGTERM (checkpoint, then exit), as on a spot",
            "# notice, and end `preempted`; monkey resumes them as their next attempt. A",
            "# scancel's SIGTERM stops them too, and they end `failed` (retried as a failure).",
            f"notice={shlex.quote(NOTICE)}",
            f"trap '{python} -I -c \"$notice\" \"$sock\" {lead} \"Slurm: time limit of allocation "
            f"{me[1:-1]} in {lead}s\"' {warn}",
            "trap 'kill -TERM \"$agent\" 2>/dev/null' TERM",
            'wait "$agent"; code=$?',
            'while kill -0 "$agent" 2>/dev/null; do wait "$agent"; code=$?; done',
            'exit "$code"',
            "",
        ]  # fmt: skip
        return "\n".join(lines)

    def _agent_version(self) -> str:
        from monkey.version import agent_digest

        return agent_digest()

    def _command(self, argv: list[str], stdin: str | None = None, what: str = "") -> str:
        """A Slurm command's stdout, run here or on the login host."""
        if self.login is not None:
            return self.login.run(argv, stdin, what)
        return slurm_command(argv, stdin, what)

    def _install_agent(self) -> None:
        """Copy client_agent to WORKDIR/agent/<digest>/ unless that version is there (with a
        login host: the SSH driver installs it there at contact)."""
        version = self._agent_version()
        if self._installed == version:
            return
        if self.login is not None:
            self.workdir = Path(self.login.workdir())
            self._command(["mkdir", "-p", str(self.workdir / "logs")])
            self._installed = version
            return
        final = self.workdir / "agent" / version
        if not (final / "monkey" / "client_agent" / "agent.py").exists():
            tmp = final.with_name(f".tmp-{version}-{os.getpid()}-{threading.get_ident()}")
            (tmp / "monkey" / "client_agent").mkdir(parents=True, exist_ok=True)
            (tmp / "monkey" / "__init__.py").write_bytes(b"")
            for src in _AGENT_SRC.glob("*.py"):
                shutil.copy2(src, tmp / "monkey" / "client_agent" / src.name)
            try:
                tmp.rename(final)
            except OSError:
                shutil.rmtree(tmp, ignore_errors=True)  # installed meanwhile
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        self._installed = version

    def create_node(
        self, size: str | None = None, options: Mapping[str, Any] | None = None
    ) -> Instance:
        """Submit one allocation of SIZE; PENDING until Slurm starts it (OPTIONS unused)."""
        return self.create_nodes(size, 1)[0]

    def create_nodes(
        self, size: str | None, count: int, throttle: int | None = None
    ) -> list[Instance]:
        """Submit COUNT allocations of SIZE with one sbatch: a job array of COUNT tasks
        (``--array=0-N``, ``%THROTTLE`` running at once), or a plain job when COUNT is 1.
        Each task is one allocation (Slurm accounts per task); all PENDING at first."""
        wanted = Size.parse(size)
        self._install_agent()
        array = None
        if count > 1:
            array = f"0-{count - 1}" + (f"%{throttle}" if throttle and throttle < count else "")
        out = self._command(
            ["sbatch", "--parsable"],
            stdin=self.batch_script(wanted, array),
            what=f"provider {self.name!r}: sbatch",
        )
        job_id = out.strip().split(";")[0]
        if not job_id.isdigit():
            raise MonkeyError(
                f"provider {self.name!r}: sbatch answered {out.strip()!r}, not a job id"
            )
        ids = [f"{job_id}_{task}" for task in range(count)] if array else [job_id]
        now = time.time()
        with self._lock:
            for one in ids:
                self._allocs[one] = _Alloc(one, wanted, time.monotonic())
            self._watch()
        return [
            Instance(
                self.instance_id(one),
                self.name,
                one,
                InstanceState.PENDING,
                size=str(wanted),
                launched_at=now,
                extra={"job_id": one},
            )
            for one in ids
        ]

    def list_nodes(self) -> list[Instance]:
        """The provider's allocations as Slurm has them now: ONE squeue call, and one
        ``sacct -c`` when some left the queue (their final state, where accounting works).

        An allocation Slurm requeued (its restart count > 0: a requeue, a preemption) is
        listed STOPPED and ``preempted``: its attempt resumes from its checkpoint as the
        next attempt, in a new allocation (a requeued job would wait Slurm's start delay),
        and the core cancels it. One that ended TIMEOUT, PREEMPTED or NODE_FAIL is
        listed TERMINATED and ``preempted`` too. One this driver released (``scancel``) is
        not listed: the core recorded it ended."""
        began = time.monotonic()
        if self.login is not None:
            self._install_agent()  # the workdir, as the login host resolves it
        out = self._command(
            [
                "squeue",
                "-h",
                "-r",
                f"--name={self.job_name}",
                "-O",
                "JobArrayID:|,State:|,RestartCnt:|,Reason:|,NodeList:|,NumCPUs:|,JobID:",
            ],
            what=f"provider {self.name!r}: squeue",
        )
        nodes: list[Instance] = []
        seen = set()
        for line in out.splitlines():
            parts = line.strip().split("|")
            if len(parts) != 7:
                continue
            job_id, state, restarts, reason, nodelist, cpus, number = (p.strip() for p in parts)
            seen.add(job_id)
            if job_id in self._released:
                continue
            inst_state = _STATES.get(state, InstanceState.TERMINATED)
            extra: dict[str, Any] = {
                "job_id": job_id,
                "slurm_state": state,
                "node_list": nodelist,
                "reason": reason if state == "PENDING" else "",
            }
            if restarts.isdigit() and int(restarts) > 0 and inst_state != InstanceState.TERMINATED:
                inst_state = InstanceState.STOPPED
                extra.update(
                    preempted=True,
                    restarts=int(restarts),
                    preempted_why="Slurm requeued the allocation (requeue or preemption)",
                )
            with self._lock:
                alloc = self._allocs.get(job_id)
                if alloc is None and inst_state != InstanceState.TERMINATED:
                    # Made by an earlier core of this home: followed again.
                    alloc = self._allocs[job_id] = _Alloc(job_id, Size(int(cpus or 1)), began)
                    self._watch()
                if alloc is not None:
                    alloc.number = number
            size = str(alloc.size) if alloc else None
            nodes.append(
                Instance(
                    self.instance_id(job_id),
                    self.name,
                    job_id,
                    inst_state,
                    address=nodelist or None,
                    size=size,
                    extra=extra,
                )
            )
        with self._lock:
            self._released &= seen
            gone = [j for j, a in self._allocs.items() if j not in seen and a.created < began]
            for job_id in gone:
                del self._allocs[job_id]  # finished: gone from Slurm's queue
        return nodes + self._finished(gone)

    def _finished(self, job_ids: list[str]) -> list[Instance]:
        """Allocations gone from the queue as accounting (``sacct -c``) last saw them;
        none when it cannot say (no accounting: the agent's exit records tell)."""
        if not job_ids:
            return []
        try:
            out = self._command(
                ["sacct", "-c", "-n", "-P", "-j", ",".join(job_ids), "-o", "JobID,State,ExitCode"],
                what="sacct",
            )
        except MonkeyError as exc:
            log.debug("no accounting for %s: %s", job_ids, exc)
            return []
        last: dict[str, tuple[str, str]] = {}
        for line in out.splitlines():  # one line per run of the job, oldest first
            parts = line.split("|")
            if len(parts) == 3 and parts[0] in job_ids:
                last[parts[0]] = (parts[1].split()[0] if parts[1] else "", parts[2])
        return [
            Instance(
                self.instance_id(job_id),
                self.name,
                job_id,
                InstanceState.TERMINATED,
                extra={
                    "job_id": job_id,
                    "slurm_state": state,
                    "exit_code": code,
                    "preempted": state in _PREEMPTED_STATES,
                    "preempted_why": f"Slurm ended the allocation ({state})",
                },
            )
            for job_id, (state, code) in last.items()
        ]

    def destroy_node(self, instance: str) -> None:
        """scancel the allocation (its agent and anything left in it)."""
        job_id = self._job_id(instance)
        try:
            self._command(["scancel", job_id], what=f"scancel {job_id}")
        except MonkeyError as exc:
            if "Invalid job id" not in str(exc):
                raise
        with self._lock:
            self._allocs.pop(job_id, None)
            self._released.add(job_id)

    def instances(self) -> list[Capacity]:
        """Allocations whose agent is up; one already given its attempt holds nothing more."""
        caps = []
        with self._lock:
            allocs = list(self._allocs.values())
        for alloc in allocs:
            if not alloc.reached and self.login is None:  # else the watcher's round trips tell
                alloc.reached = os.path.exists(self.socket_path(alloc.job_id))
            if not alloc.reached:
                continue
            size = alloc.size
            caps.append(
                Capacity(
                    self.instance_id(alloc.job_id),
                    0 if alloc.used else size.cpus,
                    [] if alloc.used else [str(i) for i in range(size.gpus)],
                    parse_size(size.memory) if size.memory else None,
                    {"size": str(size)},
                )
            )
        return caps

    def _watch(self) -> None:
        """Start the thread that wakes the core as soon as an allocation's agent is up
        (called with the lock held: one thread per driver)."""
        if self._watcher is None:
            self._watcher = threading.Thread(
                target=self._watching, name=f"slurm-{self.name}", daemon=True
            )
            self._watcher.start()

    def _watching(self) -> None:
        """Every _WATCH_EVERY s, look for the sockets of allocations not reached yet; a new
        one wakes the core, which places a job there at once (not at its next pass). An
        allocation's entry (its folder, or its socket under /tmp) appears in the sockets'
        folder first: that folder is read only when it changed, and only the allocations
        seen there are looked at until their socket is up. Through a login host: one
        round trip every _WATCH_LOGIN_EVERY s asks which sockets exist."""
        if self.login is not None:
            return self._watching_login()
        prefix, suffix = self._socket_parts()
        folder, head = os.path.split(prefix)
        tail = "" if suffix.startswith("/") else suffix  # a folder per allocation, or its socket
        changed, seen = None, set()
        while not self._closed.wait(_WATCH_EVERY):
            with self._lock:
                waiting = {a.job_id: a for a in self._allocs.values() if not a.reached}
                if not waiting:
                    self._watcher = None  # started again by the next allocation
                    return
            try:
                mtime = os.stat(folder).st_mtime_ns
            except OSError:
                continue
            if mtime != changed:
                changed, names = mtime, set(os.listdir(folder))
                seen |= {j for j in waiting if f"{head}{j}{tail}" in names}
            up = [waiting[j] for j in seen & waiting.keys() if os.path.exists(self.socket_path(j))]
            seen &= waiting.keys()
            for alloc in up:
                alloc.reached = True
                seen.discard(alloc.job_id)
            if up:
                self.wake()

    def _watching_login(self) -> None:
        assert self.login is not None
        while not self._closed.wait(_WATCH_LOGIN_EVERY):
            with self._lock:
                waiting = {
                    self.socket_path(a.job_id): a for a in self._allocs.values() if not a.reached
                }
                if not waiting:
                    self._watcher = None  # started again by the next allocation
                    return
            try:
                up = self.login.existing(list(waiting))
            except MonkeyError as exc:  # the login host is away: the listing says so
                log.debug("%s: %s", self.name, exc)
                continue
            for path in up:
                waiting[path].reached = True
            if up:
                self.wake()

    def close(self) -> None:
        self._closed.set()
        if self.login is not None:
            self.login.close()

    def _number(self, job_id: str) -> str:
        """Slurm's own job id of allocation JOB_ID (an array task has one of its own)."""
        if "_" not in job_id:
            return job_id
        with self._lock:
            alloc = self._allocs.get(job_id)
            number = alloc.number if alloc else None
        if not number:
            number = self._command(
                ["squeue", "-h", "-j", job_id, "-O", "JobID"], what="squeue"
            ).strip()
            if alloc is not None:
                alloc.number = number
        return number


class SlurmTransport(Transport):
    """The allocations' agents: their Unix sockets on this machine, MONKEY_HOME shared with
    them; or, through a login host, relays started with srun and files moved over the
    login host's SSH connection (its ``SSHTransport``)."""

    def __init__(self, slurm: SlurmDriver) -> None:
        self.slurm = slurm
        self.home = slurm.home
        self.login = slurm.login  # None: no login host
        self._followed: dict[str, list[tuple[str, int]]] = {}

    def connect(self, instance: str) -> AgentLink:
        job_id = self.slurm._job_id(instance)
        if self.login is not None:
            return self.login.connect(
                self.slurm._number(job_id),
                self.slurm.socket_path(job_id),
                str(self.slurm.workdir / "alloc" / job_id),
            )
        try:
            return connect_unix(self.slurm.socket_path(job_id))
        except OSError as exc:
            raise MonkeyError(
                f"allocation {job_id}: its agent is not reachable ({exc}); "
                f"see {self.slurm.workdir}/logs/{job_id}.out"
            ) from None

    # Through a login host, files live under workdir on the cluster and are moved as on an
    # SSH host (the login host's connection); without one, MONKEY_HOME is shared.

    def blobs_dir(self, instance: str) -> str:
        if self.login is not None:
            return self.login.pool.blobs_dir(self.login.instance)
        return str(self.home.blobs)

    def run_dir(self, instance: str, juid: str, attempt: int) -> str:
        """The attempt's run directory (MONKEY_HOME's, or the login host's under workdir);
        the allocation is then used."""
        with self.slurm._lock:
            alloc = self.slurm._allocs.get(self.slurm._job_id(instance))
            if alloc is not None:
                alloc.used = True
        if self.login is not None:
            return self.login.pool.run_dir(self.login.instance, juid, attempt)
        return str(self.home.run_dir(juid, attempt))

    def finish(
        self, instance: str, juid: str, attempt: int, outputs: list[str], current: bool
    ) -> None:
        """The allocation served its attempt: released now (``scancel``), so that Slurm gives
        its CPUs to the next allocation at once; results are on the shared filesystem, or
        brought back through the login host first."""
        try:
            if self.login is not None:
                self.login.pool.finish(self.login.instance, juid, attempt, outputs, current)
        finally:
            self.slurm.destroy_node(instance)

    def checkpoint_dir(self, instance: str, juid: str) -> str:
        if self.login is not None:
            return self.login.pool.checkpoint_dir(self.login.instance, juid)
        path = self.home.checkpoint_dir(juid)
        path.mkdir(parents=True, exist_ok=True)
        return str(path)

    def persist_dir(self, instance: str, juid: str) -> str:
        if self.login is not None:
            return self.login.pool.persist_dir(self.login.instance, juid)
        return super().persist_dir(instance, juid)

    def job_env(self, env: dict[str, str]) -> dict[str, str]:
        return self.login.pool.job_env(env) if self.login is not None else env

    def forget_blobs(self, instance: str) -> None:
        if self.login is not None:
            self.login.pool.forget_blobs(self.login.instance)

    def prepare(self, instance: str, blobs: list[str]) -> dict[str, Any]:
        if self.login is not None:
            self.login.pool.prepare(self.login.instance, blobs)
        return {}

    def follow(self, instance: str, attempts: list[tuple[str, int]]) -> None:
        """Through a login host, its thread streams the logs of every allocation's attempts."""
        if self.login is None:
            return
        self._followed = {**self._followed, instance: list(attempts)}
        if not attempts:
            self._followed = {k: v for k, v in self._followed.items() if v}
        self.login.pool.follow(
            self.login.instance, [a for live in self._followed.values() for a in live]
        )
