"""The core's side of the agent protocol (see docs/agent-protocol.md): stdlib only.

An :class:`AgentLink` wraps any connected socket-like object that has ``send``,
``recv``, ``fileno``, ``settimeout`` and ``close`` (a Unix socket, a paramiko Channel).
``request`` waits for its reply; ``send`` does not, and its reply comes back through
``poll`` like the events the agent pushes.
"""

from __future__ import annotations

import json
import socket
import time
from collections import deque

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class AgentError(Exception):
    """The agent refused a request (``ok: false``); the message is its error."""


class AgentGone(ConnectionError):
    """The link to the agent is closed, broken or timed out."""


_CHUNK = 1 << 18
_WOULD_BLOCK = (BlockingIOError, InterruptedError, TimeoutError, socket.timeout)


class AgentLink:
    """A request/response and push channel to one agent."""

    def __init__(self, sock: Any) -> None:
        self._sock = sock
        # Kept: once closed, a socket answers -1 and a paramiko Channel a new pipe, and the
        # core must unregister the descriptor it registered.
        self._fileno = sock.fileno()
        self._buf = bytearray()
        self._pushes: deque[dict[str, Any]] = deque()
        self._replies: dict[int, dict[str, Any]] = {}
        self._waiting: int | None = None
        self._sent: set[int] = set()
        self._next_id = 1
        self._closed = False

    def fileno(self) -> int:
        """The underlying file descriptor, to wait on with select."""
        return self._fileno

    def request(self, op: str, timeout: float = 30, **fields: Any) -> dict[str, Any]:
        """Send OP with FIELDS and return the agent's reply.

        Raises AgentError when the agent answers ``ok: false`` and AgentGone on EOF,
        a broken link or no reply within TIMEOUT seconds (the link is then closed).
        """
        self._check_open()
        rid = self._next_id
        self._next_id += 1
        deadline = time.monotonic() + timeout
        data = (json.dumps({"id": rid, "op": op, **fields}, separators=(",", ":")) + "\n").encode()
        self._waiting = rid
        try:
            self._send_all(data, deadline, op)
            while rid not in self._replies:
                self._recv_some(deadline, op)
        finally:
            self._waiting = None
        reply = self._replies.pop(rid)
        if not reply.get("ok"):
            raise AgentError(str(reply.get("error") or f"{op} failed"))
        return reply

    def send(self, op: str, timeout: float = 30, **fields: Any) -> int:
        """Send OP without waiting; its reply (with this id) comes back through ``poll``."""
        self._check_open()
        rid = self._next_id
        self._next_id += 1
        data = (json.dumps({"id": rid, "op": op, **fields}, separators=(",", ":")) + "\n").encode()
        self._sent.add(rid)
        self._send_all(data, time.monotonic() + timeout, op)
        return rid

    @property
    def closed(self) -> bool:
        """True once the link is closed or found broken; it never opens again."""
        return self._closed

    def poll(self) -> list[dict[str, Any]]:
        """Pushes and replies to ``send`` received so far, reading without blocking.

        What arrived before the link broke is returned first; the break itself shows in
        ``closed`` (check it after handling the pushes), and a poll of a closed link with
        nothing left to return raises AgentGone.
        """
        if self._closed and not self._pushes:
            raise AgentGone("the link to the agent is closed")
        if not self._closed:
            try:
                self._drain()
            except AgentGone:
                if not self._pushes:
                    raise
        pushes = list(self._pushes)
        self._pushes.clear()
        return pushes

    def close(self) -> None:
        """Close the link; the agent and its jobs keep running."""
        if not self._closed:
            self._closed = True
            try:
                self._sock.close()
            except OSError:
                pass

    def __enter__(self) -> AgentLink:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # ---- internals

    def _check_open(self) -> None:
        if self._closed:
            raise AgentGone("the link to the agent is closed")

    def _gone(self, why: str) -> AgentGone:
        self.close()
        return AgentGone(why)

    def _send_all(self, data: bytes, deadline: float, op: str) -> None:
        pos = 0
        while pos < len(data):
            self._set_timeout(deadline, op)
            try:
                sent = self._sock.send(data[pos : pos + _CHUNK])  # bytes: paramiko wants them
            except _WOULD_BLOCK:
                continue
            except OSError as e:
                raise self._gone(f"agent link broken while sending {op}: {e}") from e
            if not sent:
                raise self._gone(f"agent link closed while sending {op}")
            pos += sent
            if pos < len(data):
                self._drain()  # so that an agent pushing to us never stalls our send

    def _drain(self) -> None:
        """Read whatever is available without blocking."""
        try:
            self._sock.settimeout(0.0)
            while True:
                self._recv_once()
        except _WOULD_BLOCK:
            pass

    def _recv_some(self, deadline: float, op: str) -> None:
        self._set_timeout(deadline, op)
        try:
            self._recv_once()
        except _WOULD_BLOCK:
            pass

    def _set_timeout(self, deadline: float, op: str) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise self._gone(f"no reply from the agent to {op} in time")
        self._sock.settimeout(left)

    def _recv_once(self) -> None:
        """Read one chunk and parse its complete lines; raises AgentGone on EOF."""
        try:
            data = self._sock.recv(_CHUNK)
        except _WOULD_BLOCK:
            raise
        except OSError as e:
            raise self._gone(f"agent link broken: {e}") from e
        if not data:
            raise self._gone("the agent closed the link")
        self._buf += data
        if b"\n" in data:
            *lines, rest = self._buf.split(b"\n")
            self._buf = bytearray(rest)
            for line in lines:
                if line.strip():
                    self._dispatch(line)

    def _dispatch(self, line: bytes | bytearray) -> None:
        try:
            msg = json.loads(line)
        except ValueError:
            msg = None
        if not isinstance(msg, dict):
            raise self._gone(f"garbled line from the agent: {bytes(line[:100])!r}")
        if "push" in msg:
            self._pushes.append(msg)
        elif msg.get("id") == self._waiting:
            self._replies[msg["id"]] = msg
        elif msg.get("id") in self._sent:
            self._sent.discard(msg["id"])
            self._pushes.append(msg)


def connect_unix(path: str, timeout: float = 5.0) -> AgentLink:
    """An AgentLink over the agent's Unix socket at PATH (OSError when nobody listens)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(path)
    except OSError:
        sock.close()
        raise
    return AgentLink(sock)
