"""A Slurm cluster's login host: where the `slurm` provider runs Slurm's commands and keeps
its files when ``login:`` is set.

The login host is one SSH host of the SSH transport (its connection, verified host key, SFTP
and file helper, its thread pulling logs and checkpoints), without an agent of its own:
Slurm's commands run there, blobs, the agent's code and the run folders go under the
provider's ``workdir`` (the cluster's shared filesystem) through it, and the agent inside an
allocation is reached with ``srun --overlap --jobid=J`` running the SSH transport's relay on
the allocation's node (a Unix socket is reachable only from its own node).

paramiko is imported by the SSH transport only when a login host is used.
"""

from __future__ import annotations

from monkey.config import ProviderConfig
from monkey.drivers.ssh_transport import SSHTransport
from monkey.models import MonkeyError, whole_number

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from monkey.config import Home
    from monkey.drivers.agent_link import AgentLink
    from monkey.drivers.ssh_io import Host

LOGIN_KEYS = {"host", "user", "key", "port", "trust_new_host"}
# Prints those of its arguments that exist (the sockets of allocations whose agent is up).
_EXISTING = "import os, sys\nfor p in sys.argv[1:]:\n    os.path.exists(p) and print(p)"


def validate_login(where: str, name: str, login: Any) -> None:
    """Refuse a bad ``login:`` of a `slurm` entry with one line naming the fix."""

    def bad(what: str) -> MonkeyError:
        return MonkeyError(f"{where}: provider {name!r}: login {what}")

    if not isinstance(login, dict) or not isinstance(login.get("host"), str) or not login["host"]:
        raise bad("must look like {host: login.cluster.edu, user: me, key: ~/.ssh/id_ed25519}")
    unknown = set(login) - LOGIN_KEYS
    if unknown:
        raise bad(
            f"has unknown key {sorted(unknown)[0]!r}; allowed: {', '.join(sorted(LOGIN_KEYS))}"
        )
    for key in ("user", "key"):
        if login.get(key) is not None and not isinstance(login[key], str):
            raise bad(f"{key} must be text, got {login[key]!r}")
    port = login.get("port")
    if port is not None and (
        not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536
    ):
        raise bad(f"port must be 1-65535, got {port!r}")
    if login.get("trust_new_host") is not None and not isinstance(login["trust_new_host"], bool):
        raise bad("trust_new_host must be true or false")


def parse_login(text: str) -> dict[str, Any]:
    """``user@host[:port]`` (``provider add slurm --login``) as a ``login:`` entry."""
    user, _, hostport = text.rpartition("@")
    host, _, port = hostport.partition(":")
    if not host or (port and whole_number(port) is None):
        raise MonkeyError(f"--login {text}: give the login host as user@host or user@host:port")
    return {
        "host": host,
        **({"user": user} if user else {}),
        **({"port": int(port)} if port else {}),
    }


class LoginPool(SSHTransport):
    """The SSH transport serving the login host alone, which runs no agent."""

    runs_agent = False


class LoginHost:
    """The provider's login host: Slurm commands, files and relays to allocations."""

    def __init__(
        self, provider: str, login: dict[str, Any], workdir: str | None, home: Home
    ) -> None:
        entry = {
            "name": "login",
            "host": login["host"],
            "workdir": workdir or f"~/.monkey-slurm/{provider}",
            **{k: login[k] for k in ("user", "key", "port") if login.get(k) is not None},
        }
        options = {"hosts": [entry], "trust_on_first_use": bool(login.get("trust_new_host"))}
        self.provider = provider
        self.pool = LoginPool(ProviderConfig(provider, "ssh", options), home)
        self.instance = f"{provider}/login"

    def host(self) -> Host:
        """The connected login host; one-line MonkeyError when it cannot be reached."""
        try:
            return self.pool.ensure_up(self.instance)
        except MonkeyError as exc:
            text = str(exc).replace(
                "`trust_on_first_use: true` for this provider",
                "`trust_new_host: true` under `login:` (provider add --trust-new-host)",
            )
            raise type(exc)(f"provider {self.provider!r}: login host: {text}") from None

    def workdir(self) -> str:
        """The provider's workdir on the cluster, as the login host resolves it."""
        return self.host().workdir

    def run(self, argv: list[str], stdin: str | None = None, what: str = "") -> str:
        """A Slurm command's stdout, run on the login host; one-line MonkeyError with Slurm's
        message when it fails."""
        self.host()
        code, out, err = self.pool.run_command(self.instance, argv, stdin or "")
        if code == 127:
            raise MonkeyError(
                f"provider {self.provider!r}: {argv[0]} not found on the login host "
                "(is it a Slurm login node? is Slurm on its PATH?)"
            )
        if code != 0:
            raise MonkeyError(
                f"{what or argv[0]} failed: {' '.join(err.split()) or f'exit {code}'}"
            )
        return out

    def existing(self, paths: list[str]) -> set[str]:
        """Those of PATHS that exist on the cluster's shared filesystem (one round trip)."""
        python = self.host().spec.python
        return set(
            self.run([python, "-I", "-c", _EXISTING, *paths], what="looking for agents").split()
        )

    def connect(self, job_id: str, sock: str, root: str) -> AgentLink:
        """A link to the agent of allocation JOB_ID, through a relay srun starts in it."""
        self.host()
        prefix = ["srun", "--overlap", f"--jobid={job_id}", "--nodes=1", "--ntasks=1", "--quiet"]
        return self.pool.open_relay(self.instance, sock, root, prefix)

    def close(self) -> None:
        self.pool.close()
