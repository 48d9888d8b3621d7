"""The `local` provider: this machine, through one agent sharing MONKEY_HOME with the core."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from monkey.config import Home, ProviderConfig, first_error, open_private, python_entry
from monkey.drivers.base import Capacity, Driver, unknown_keys
from monkey.drivers.transport import Transport
from monkey.models import MonkeyError, Resources

TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess
    from typing import Any

    from monkey.drivers.agent_link import AgentLink


def detect_gpus() -> list[str]:
    """GPU indices reported by nvidia-smi, or none when it is absent."""
    # (process libraries are loaded where used: `monkey run` imports this module for its
    # rules, and a one-shot command should not pay for what only the core runs)
    import shutil
    import subprocess

    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def local_capacity(config: ProviderConfig, detect: bool = True) -> Capacity:
    """Slots and GPUs of this machine as configured (defaults: all CPUs, and the GPUs
    nvidia-smi reports unless ``detect`` is False)."""
    slots = config.options.get("slots") or os.cpu_count() or 1
    gpus = config.options.get("gpus")
    if gpus is None:
        devices = detect_gpus() if detect else []
    elif isinstance(gpus, int):
        devices = [str(i) for i in range(gpus)]
    else:
        devices = [str(g) for g in gpus]
    return Capacity(config.name, int(slots), devices)


def agent_lock_free(agent_root: Path) -> bool:
    """Whether no agent holds AGENT_ROOT's lock (probed, and released at once)."""
    try:
        fd = os.open(agent_root / "private" / "agent.lock", os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def outdated(hello: dict[str, Any]) -> str | None:
    """Why the local agent that said HELLO is not the installed one, or None when it is: it
    runs other code, or the same code from another folder (monkey installed elsewhere since:
    the files it hands its jobs may be gone)."""
    from monkey.version import AGENT_SRC, agent_digest

    digest, code = hello.get("digest"), hello.get("code")
    if digest != agent_digest():
        return f"it runs other code ({digest or 'older'}, installed {agent_digest()})"
    if not code or os.path.realpath(code) != str(AGENT_SRC):
        return f"it runs from {code or 'an older install'}, monkey is now installed in {AGENT_SRC}"
    return None


def replace_outdated(link: AgentLink, agent_root: Path, timeout: float = 15.0) -> bool:
    """Stop the agent at the end of LINK when it is not the installed agent (``outdated``;
    its jobs keep running), closing LINK; False, with LINK open, when it is current."""
    try:
        why = outdated(link.request("hello", timeout=timeout))
        if why is None:
            return False
        import logging

        logging.getLogger("monkey.local").info(
            "replacing the local agent: %s; its jobs keep running", why
        )
        link.request("shutdown", timeout=timeout)
    except BaseException:
        link.close()
        raise
    link.close()
    deadline = time.monotonic() + timeout
    while not agent_lock_free(agent_root):
        if time.monotonic() > deadline:
            raise MonkeyError(
                f"the outdated local agent did not stop within {timeout:.0f}s; "
                f"see {agent_root / 'agent.log'}"
            )
        time.sleep(0.01)
    return True


_LOCAL_KEYS = {"type", "slots", "gpus"}


class LocalDriver(Driver):
    """Runs jobs on this machine; run directories and blobs live in MONKEY_HOME itself."""

    kind = "local"
    hands_ahead = True

    @classmethod
    def validate(cls, where: str, name: str, entry: dict[str, Any]) -> None:
        """slots: a positive count; gpus: a count or a list of device ids."""
        unknown_keys(where, name, entry, _LOCAL_KEYS)
        slots = entry.get("slots")
        if slots is not None and (
            not isinstance(slots, int) or isinstance(slots, bool) or slots < 1
        ):
            raise MonkeyError(
                f"{where}: provider {name!r}: slots must be a positive integer, got {slots!r}"
            )
        gpus = entry.get("gpus")
        if gpus is not None and not (
            (isinstance(gpus, int) and not isinstance(gpus, bool) and gpus >= 0)
            or (isinstance(gpus, list) and all(isinstance(g, (int, str)) for g in gpus))
        ):
            raise MonkeyError(
                f"{where}: provider {name!r}: gpus must be a count or a list of device ids, got {gpus!r}"
            )

    @classmethod
    def never_fits(cls, config: ProviderConfig, resources: Resources) -> str | None:
        if resources.host:
            return f"provider {config.name!r} is this machine; --host is for ssh providers"
        cap = local_capacity(config, detect=bool(resources.gpus))
        if not cap.could_hold(resources):
            return (
                f"provider {config.name!r} has {cap.slots} slots and {len(cap.gpus)} GPUs; "
                f"a job asking --cpus {resources.cpus} --gpus {resources.gpus} could never "
                "run there"
            )
        return None

    @classmethod
    def describe(cls, config: ProviderConfig, instances: list[dict[str, Any]]) -> dict[str, Any]:
        cap = local_capacity(config)
        return {"slots": cap.slots, "gpus": len(cap.gpus)}

    def __init__(self, config: ProviderConfig, home: Home) -> None:
        super().__init__(config, home)
        self._capacity: Capacity | None = None
        self.transport = LocalTransport(home)

    def instances(self) -> list[Capacity]:
        if self._capacity is None:
            self._capacity = local_capacity(self.config)
        return [self._capacity]


class LocalTransport(Transport):
    """This machine's agent, over a Unix socket in MONKEY_HOME; run directories and blobs
    are MONKEY_HOME's own, so nothing is copied nor brought back."""

    quick = True

    def __init__(self, home: Home) -> None:
        self.home = home
        self.socket = str(home.socket_path("agent"))
        self._runs, self._blobs = str(home.runs), str(home.blobs)

    def connect(self, instance: str) -> AgentLink:
        """A link to the local agent, started when none runs. An agent of another version
        (a reinstall) is asked to stop, its jobs left running, and a fresh one started from
        the installed code adopts them on the core's ``sync``. (The link's module loads
        here: `monkey run` imports this module only for the kind's rules.)"""
        from monkey.drivers.agent_link import connect_unix

        try:
            link = connect_unix(self.socket)
        except OSError:
            pass
        else:
            if not replace_outdated(link, self.home.agent_root):
                return link
        log = self.home.root / "agent.log"
        offset = log.stat().st_size if log.exists() else 0
        proc = self._spawn_agent(log)
        deadline = time.monotonic() + 10
        while True:
            try:
                return connect_unix(self.socket)
            except OSError:
                # An agent exiting at once may have lost the race to another one: wait on.
                if proc.poll() not in (None, 0):
                    why = first_error(log, offset)
                    raise MonkeyError(
                        f"the local agent could not start: {why}; see {log}"
                    ) from None
                if time.monotonic() > deadline:
                    raise MonkeyError(f"the local agent did not start; see {log}") from None
                time.sleep(0.005)

    def _spawn_agent(self, log_path: Path) -> subprocess.Popen[bytes]:
        """Start a detached agent in MONKEY_HOME, isolated from the core's folder."""
        import subprocess

        idle = os.environ.get("MONKEY_AGENT_IDLE_TIMEOUT", "600")
        heartbeat = os.environ.get("MONKEY_HEARTBEAT", "5")
        with open_private(log_path) as log:
            return subprocess.Popen(
                [
                    *python_entry("monkey.client_agent.agent", "main"),
                    "--root",
                    str(self.home.agent_root),
                    "--socket",
                    self.socket,
                    "--idle-timeout",
                    idle,
                    "--heartbeat",
                    heartbeat,
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                cwd=self.home.root,
                start_new_session=True,
                close_fds=True,
            )

    def blobs_dir(self, instance: str) -> str:
        return self._blobs

    def run_dir(self, instance: str, juid: str, attempt: int) -> str:
        return f"{self._runs}/{juid}/{attempt}"  # Home.run_dir's, without Path's cost per start

    def checkpoint_dir(self, instance: str, juid: str) -> str:
        job_dir = f"{self._runs}/{juid}"  # Home.checkpoint_dir's parent; two mkdir calls,
        try:  # not makedirs' stats
            os.mkdir(job_dir, 0o700)
        except FileExistsError:
            pass  # a later attempt (a file there fails the mkdir below)
        except FileNotFoundError:  # no runs/ yet
            os.makedirs(job_dir, 0o700, exist_ok=True)
        path = f"{job_dir}/checkpoint"
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            if not os.path.isdir(path):
                raise
        return path
