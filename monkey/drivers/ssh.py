"""The `ssh` provider: a pool of machines reached over SSH, one agent per host.

Its rules live here; its machines are the configured hosts, served by one
:class:`~monkey.drivers.ssh_transport.SSHTransport` that is both its transport and its
pool (a host is an instance once reached; ``create_node`` claims none: the hosts are fixed).
"""

from __future__ import annotations

from monkey.drivers.base import Capacity, Driver, hosts_summary
from monkey.drivers.ssh_hosts import could_fit, validate_entry
from monkey.drivers.ssh_transport import SSHTransport
from monkey.models import Instance, Resources

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from monkey.config import Home, ProviderConfig


class SSHDriver(Driver):
    """Jobs on configured SSH hosts; run folders and blobs live under each host's workdir."""

    kind = "ssh"

    @classmethod
    def validate(cls, where: str, name: str, entry: dict[str, Any]) -> None:
        validate_entry(where, name, entry)

    @classmethod
    def never_fits(cls, config: ProviderConfig, resources: Resources) -> str | None:
        names = [str(h.get("name") or h.get("host")) for h in config.options.get("hosts") or []]
        if resources.host is not None and resources.host not in names:
            return (
                f"--host {resources.host}: provider {config.name!r} has no such host; "
                f"its hosts: {', '.join(names)}"
            )
        if not could_fit(config, resources):
            memory = f" --memory {resources.memory}" if resources.memory else ""
            return (
                f"no host of provider {config.name!r} has --cpus {resources.cpus} "
                f"--gpus {resources.gpus}{memory}; see `monkey list providers`"
            )
        return None

    @classmethod
    def describe(cls, config: ProviderConfig, instances: list[dict[str, Any]]) -> dict[str, Any]:
        """Each configured host as the core last saw it, with the jobs running there."""
        seen = {i["id"]: i for i in instances}
        hosts = []
        for entry in config.options.get("hosts") or []:
            instance = f"{config.name}/{entry.get('name') or entry['host']}"
            rec = seen.get(instance, {})
            extra = rec.get("extra", {})
            hosts.append(
                {
                    "instance": instance,
                    "host": rec.get("host") or str(entry["host"]),
                    "state": rec.get("reach") or "not contacted yet",
                    "slots": extra.get("slots"),
                    "gpus": extra.get("gpus") or [],
                    "memory": extra.get("memory"),
                    "running": rec.get("running", 0),
                    "error": extra.get("error"),
                }
            )
        return hosts_summary(hosts)

    def __init__(self, config: ProviderConfig, home: Home) -> None:
        super().__init__(config, home)
        self.pool = self.transport = SSHTransport(config, home)
        self.pool.wake = lambda: self.wake()  # the core sets this driver's wake later

    def instances(self) -> list[Capacity]:
        return self.pool.instances()

    def list_nodes(self) -> list[Instance]:
        return self.pool.list_nodes()

    def changes(self) -> list[tuple[Instance, str | None, dict[str, Any] | None]]:
        return self.pool.changes()

    def check(self) -> list[dict[str, Any]]:
        """Contact every host now; one report per host (error None when usable)."""
        return self.pool.check()
