"""The client of a main node (`monkey server`): its settings (``settings``), the HTTPS
connection (``client``), the codec both sides share (``codec``) and ``RemoteMonkey``, the
facade over it (``facade``). Standard library only: a one-shot command through a remote
loads neither the server's stack nor ``cryptography``.

The protocol: ``POST /api/v1/call/METHOD`` with a JSON body {"args": [...], "kwargs": {...}}
calls an allowed facade method; ``GET /api/v1/logs/JOB`` streams a job's output (``follow``
in framed pieces that say where each comes from, so a client resumes exactly). Every
request carries ``Authorization: Bearer TOKEN`` and ``X-Monkey-API``; every answer
``X-Monkey-API`` and ``X-Monkey-Version``."""

from __future__ import annotations

from monkey.models import MonkeyError

API = 1  # the protocol's version: a client and a server of different APIs refuse each other
API_HEADER = "X-Monkey-API"
VERSION_HEADER = "X-Monkey-Version"
UPGRADE = "pip install -U monkey-runner"
LOOPBACK = ("127.0.0.1", "::1", "localhost")


class RemoteError(MonkeyError):
    """A refusal by the server or the network, as one line for the user."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class Unreachable(RemoteError):
    """The server could not be reached, or the connection dropped."""


def split_url(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of a remote's URL; MonkeyError naming the fix when it is not one."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
        parts = parts._replace(netloc="")
    if parts.scheme not in ("https", "http") or not parts.hostname or parts.path not in ("", "/"):
        raise MonkeyError(
            f"{url!r} is not a server URL; give https://HOST:PORT, as "
            "`monkey server start` printed it, or ssh://USER@HOST[:PORT] to go through SSH"
        )
    if parts.scheme == "http" and parts.hostname not in LOOPBACK:
        raise MonkeyError(
            f"{url}: plain http is for loopback only (the token would cross the "
            "network in clear); use https://"
        )
    return parts.scheme, parts.hostname, port or (8443 if parts.scheme == "https" else 8080)
