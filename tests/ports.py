"""Ports for the tests' servers (sshd, slurmd, the registry, the main node...): free when
picked and below the kernel's ephemeral range, so that no outgoing connection of another
test (an SSH client, an HTTP request) is given the port between the pick and the server's
bind. (A port picked by binding port 0 was in that range: under a full suite's load slurmd
once found its port taken and every Slurm test failed to start.)"""

from __future__ import annotations

import random
import socket

_LOWEST = 10_000
_pick = random.Random()  # its own seed: xdist's workers never draw the same sequence
_given: set[tuple[str, int]] = set()


def _ephemeral_start() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(address: str = "127.0.0.1") -> int:
    """A port nothing listens on at ADDRESS, never one given before in this process."""
    top = max(_ephemeral_start(), _LOWEST + 1000)
    for _ in range(1000):
        port = _pick.randrange(_LOWEST, top)
        if (address, port) in _given:
            continue
        with socket.socket() as s:
            try:
                s.bind((address, port))
            except OSError:
                continue
        _given.add((address, port))
        return port
    raise RuntimeError(f"no free port on {address} below the ephemeral range")
