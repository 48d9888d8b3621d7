"""Two machines for tests: network namespaces (the recipe of
../shared/services/netns_multihost_ssh.sh), "laptop" and "main", joined by a veth pair, so a
server listens on an address of its own that only the laptop's namespace reaches, and the
link between them can be cut and restored. Nothing is added to the root namespace."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys

import pytest

LAPTOP_IP, MAIN_IP = "10.213.7.1", "10.213.7.2"


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


class Machines:
    """The two namespaces; ``prefix(side)`` runs a command on one of them."""

    def __init__(self) -> None:
        tag = f"mk{os.getpid()}{secrets.token_hex(2)}"  # parallel sessions never share one
        self.laptop, self.main = f"{tag}-laptop", f"{tag}-main"
        self.made: list[str] = []
        for ns in (self.laptop, self.main):
            done = _ip("netns", "add", ns)
            if done.returncode != 0:
                self.close()
                why = done.stderr.strip() or "ip netns add failed"
                if os.environ.get("CI"):  # CI runs as root: namespaces must work there
                    pytest.fail(f"network namespaces cannot be created in CI: {why}")
                pytest.skip(f"network namespaces cannot be created here (root needed): {why}")
            self.made.append(ns)
        steps = [
            ("-n", self.laptop, "link", "set", "lo", "up"),
            ("-n", self.main, "link", "set", "lo", "up"),
            ("-n", self.laptop, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0")
            + ("netns", self.main),
            ("-n", self.laptop, "addr", "add", f"{LAPTOP_IP}/24", "dev", "eth0"),
            ("-n", self.main, "addr", "add", f"{MAIN_IP}/24", "dev", "eth0"),
            ("-n", self.laptop, "link", "set", "eth0", "up"),
            ("-n", self.main, "link", "set", "eth0", "up"),
        ]
        for step in steps:
            done = _ip(*step)
            if done.returncode != 0:
                self.close()
                raise RuntimeError(f"ip {' '.join(step)}: {done.stderr.strip()}")

    def prefix(self, side: str) -> list[str]:
        return ["ip", "netns", "exec", self.laptop if side == "laptop" else self.main]

    def reaches(self, address: str, port: int) -> bool:
        """Whether the laptop connects to ADDRESS:PORT."""
        code = f"import socket; socket.create_connection(({address!r}, {port}), 0.5).close()"
        done = subprocess.run(
            [*self.prefix("laptop"), sys.executable, "-c", code], capture_output=True, timeout=30
        )
        return done.returncode == 0

    def cut(self) -> None:
        """Pull the main node's cable (its end of the link goes down)."""
        _ip("-n", self.main, "link", "set", "eth0", "down")

    def restore(self) -> None:
        _ip("-n", self.main, "link", "set", "eth0", "up")

    def close(self) -> None:
        for ns in self.made:  # deleting a namespace deletes its end of the veth pair
            _ip("netns", "del", ns)
        self.made = []
