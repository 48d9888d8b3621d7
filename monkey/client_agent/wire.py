"""The agent's wire protocol: newline-delimited JSON requests and replies, and pushes, over
a Unix stream socket (see docs/agent-protocol.md). Of each client connection (``state.Conn``),
the ``Wire`` part of the ``Agent`` listens, accepts, reads requests and hands each to its op, and
writes replies and pushes without ever blocking the loop. Standard library only."""

from __future__ import annotations

import functools
import json
import os
import selectors
import socket
import struct
import time
from collections.abc import Callable

from monkey.client_agent.common import RequestError, encode, log, one_line, trace
from monkey.client_agent.state import AgentState, Conn

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MAX_LINE = 256 << 20  # longest request accepted
MAX_OUTBUF = 256 << 20  # a client this far behind is dropped (it can resync by offset)


class Wire(AgentState):
    """The connections of the ``Agent`` (its selector, listener and clients)."""

    def _open_listener(self) -> None:
        try:
            os.unlink(self.socket_path)
        except FileNotFoundError:
            pass
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            sock.bind(self.socket_path)
        finally:
            os.umask(old)
        os.chmod(self.socket_path, 0o600)
        self.socket_ino = os.stat(self.socket_path).st_ino
        sock.listen(128)
        sock.setblocking(False)
        self.listener = sock
        self.sel.register(sock, selectors.EVENT_READ, self._on_accept)

    def _on_accept(self, _mask: int) -> None:
        assert self.listener is not None
        while True:
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            try:
                creds = sock.getsockopt(
                    socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")
                )
                pid, uid, _gid = struct.unpack("3i", creds)
            except OSError as e:
                log(f"SO_PEERCRED failed: {e}")
                sock.close()
                continue
            if uid != os.getuid():
                log(f"refused a connection from uid {uid} (pid {pid})")
                sock.close()
                continue
            sock.setblocking(False)
            conn = Conn(sock)
            self.conns.add(conn)
            self.sel.register(sock, selectors.EVENT_READ, functools.partial(self._on_conn, conn))

    def _on_conn(self, conn: Conn, mask: int) -> None:
        if mask & selectors.EVENT_WRITE:
            self._flush(conn)
        if mask & selectors.EVENT_READ and conn in self.conns:
            self._read(conn)

    def _read(self, conn: Conn) -> None:
        try:
            data = conn.sock.recv(1 << 18)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            log(f"connection error: {e}")
            self._close(conn)
            return
        if not data:
            self._close(conn)
            return
        buf = conn.inbuf
        start = len(buf)
        buf += data
        if buf.find(b"\n", start) < 0:
            if len(buf) > MAX_LINE:
                log("request too long; dropping the connection")
                self._close(conn)
            return
        *lines, rest = buf.split(b"\n")
        conn.inbuf = bytearray(rest)
        for line in lines:
            if line.strip() and conn in self.conns:
                self._handle_line(conn, bytes(line))

    def _send(self, conn: Conn, data: bytes) -> None:
        """Queue DATA for CONN; it is sent at the end of this pass of the loop, with whatever
        else the pass had to say (one write, one wake-up of the reader)."""
        conn.outbuf += data
        self.unsent.add(conn)

    def _flush(self, conn: Conn) -> None:
        out = conn.outbuf
        while out:
            try:
                sent = conn.sock.send(out)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as e:
                log(f"send failed: {e}")
                self._close(conn)
                return
            del out[:sent]
        if len(out) > MAX_OUTBUF:
            log("client too far behind; dropping the connection")
            self._close(conn)
            return
        want = bool(out)
        if want != conn.writing:
            conn.writing = want
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if want else 0)
            self.sel.modify(conn.sock, events, functools.partial(self._on_conn, conn))

    def _flush_blocking(self, conn: Conn, deadline: float) -> None:
        """Best effort to send what is queued before exiting."""
        try:
            conn.sock.setblocking(True)
            while conn.outbuf and (left := deadline - time.monotonic()) > 0:
                conn.sock.settimeout(left)
                sent = conn.sock.send(conn.outbuf)
                del conn.outbuf[:sent]
        except OSError:
            pass

    def _close(self, conn: Conn) -> None:
        if conn not in self.conns:
            return
        self.conns.discard(conn)
        try:
            self.sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()

    def _handle_line(self, conn: Conn, line: bytes) -> None:
        self.orphan.contact = time.monotonic()  # any request: the core is there
        rid = op = None
        backlog: list[bytes] = []
        try:
            req = json.loads(line)
            if not isinstance(req, dict):
                raise RequestError("a request must be a JSON object")
            rid = req.get("id")
            op = req.get("op")
            handler: Callable[..., dict[str, Any]] | None = getattr(self, f"op_{op}", None)
            if not isinstance(op, str) or handler is None:
                raise RequestError(f"unknown op {op!r}")
            if op == "sync":
                result = handler(req, backlog)
            elif op == "start":
                result = handler(req, conn)
                if result is None:  # held for a slot: answered when it spawns
                    return
            else:
                result = handler(req)
            reply = {"id": rid, "ok": True, **result}
            conn.subscribed = conn.subscribed or op == "sync"
        except RequestError as e:
            reply = {"id": rid, "ok": False, "error": one_line(e)}
        except (ValueError, TypeError, KeyError) as e:  # never the request: it holds secrets
            log(f"bad request (op {op!r}): {one_line(e)}")
            reply = {"id": rid, "ok": False, "error": f"bad request: {one_line(e)}"}
        except Exception as e:
            log(f"request failed (op {op!r}):\n{trace()}")
            reply = {"id": rid, "ok": False, "error": one_line(e)}
        self._send(conn, encode(reply) + b"".join(backlog))
