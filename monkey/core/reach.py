"""Where a plain user's notifications may go from a main node (issue 41, finding 6).

A webhook, Slack or SMTP target is a connection the main node makes on a user's behalf, so
a plain user's target may not reach what listens on the main node's own network: loopback,
link-local, private (RFC 1918, ULA), unspecified, multicast or reserved addresses, or one
of the main node's own addresses; an IPv4 address inside an IPv6 one (mapped, 6to4, Teredo)
is judged as that IPv4 address. An admin allows ranges (`monkey server notify-allow CIDR`).
Admins' targets are not restricted, nor anyone's on a home without users (one person's
machine), nor this machine's own user's (who owns MONKEY_HOME anyway).

A name is resolved once per send and the connection made to an address that was checked
(see ``monkey.core.deliver``): a DNS answer that changes between the check and the
connection cannot lead it elsewhere."""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass

from monkey.models import MonkeyError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from monkey.store import Store

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class Refused(MonkeyError):
    """A target's address is one a plain user's notifications may not reach."""


@dataclass(frozen=True)
class Reach:
    """The rule for one user's targets: ``allowed`` ranges an admin opened."""

    allowed: tuple[Network, ...] = ()

    def why_not(self, address: Address) -> str | None:
        """Why ADDRESS may not be reached ("a loopback address"...), or None."""
        if any(address in net for net in self.allowed if net.version == address.version):
            return None
        inner = _embedded_v4(address)
        if inner is not None:
            return self.why_not(inner)
        for kind in ("loopback", "unspecified", "link_local", "multicast", "private"):
            if getattr(address, f"is_{kind}"):
                return f"{'an' if kind[0] == 'u' else 'a'} {kind.replace('_', '-')} address"
        if address.is_reserved or not address.is_global:
            return "not a public address"
        if _own(address):
            return "this main node's own address"
        return None


def _embedded_v4(address: Address) -> ipaddress.IPv4Address | None:
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    if int(address) > 1 and address in ipaddress.IPv6Network("::/96"):  # IPv4-compatible
        return ipaddress.IPv4Address(int(address))
    return None


def _own(address: Address) -> bool:
    """Whether ADDRESS is one of this machine's: a socket can be bound to it."""
    family = socket.AF_INET if address.version == 4 else socket.AF_INET6
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        try:
            s.bind((str(address), 0))
        except OSError:
            return False
    return True


def reach_for(store: Store, owner: str) -> Reach | None:
    """The rule for OWNER's targets; None: OWNER's targets may go anywhere (an admin, this
    machine's own user, or a home without users)."""
    from monkey.store.db import local_user

    users = {u["name"]: u for u in store.users()}
    if not users:
        return None
    user = users.get(owner)
    if (user is not None and user["admin"]) or (user is None and owner == local_user()):
        return None
    return Reach(tuple(ipaddress.ip_network(c) for c in store.notify_allowed()))


def resolve(host: str, port: int, reach: Reach | None) -> list[tuple[int, Any]]:
    """HOST's addresses at PORT, as (family, socket address) to connect to: every one
    checked against REACH (Refused naming the rule and the fix when one may not be
    reached); OSError when HOST has no address."""
    found = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)
    out: list[tuple[int, Any]] = []
    for family, _type, _proto, _name, sockaddr in found:
        address = str(sockaddr[0])
        if (family, sockaddr) in out:
            continue
        if reach is not None:
            ip = ipaddress.ip_address(address.partition("%")[0])
            why = reach.why_not(ip)
            if why is not None:
                cidr = f"{ip}/{ip.max_prefixlen}"
                raise Refused(
                    f"{host} is {ip}, {why}: a plain user's notifications may not reach "
                    "this main node's own network; an admin may allow it: monkey server "
                    f"notify-allow {cidr}"
                )
        out.append((family, sockaddr))
    return out


def connect(addresses: list[tuple[int, Any]], timeout: float) -> socket.socket:
    """A TCP connection to the first of ADDRESSES (from ``resolve``) that answers."""
    error: OSError | None = None
    for family, sockaddr in addresses:
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(sockaddr)
        except OSError as exc:
            sock.close()
            error = exc
            continue
        return sock
    raise error or OSError("no address")


def parse_cidr(text: str) -> str:
    """TEXT as a normalised range (``127.0.0.1/32``); MonkeyError naming the fix."""
    try:
        return str(ipaddress.ip_network(text.strip(), strict=False))
    except ValueError:
        raise MonkeyError(
            f"{text!r} is not an address range; give CIDR, e.g. 10.0.0.0/8 or 127.0.0.1/32"
        ) from None
