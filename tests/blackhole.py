"""A blackholed endpoint on 127.0.0.1: it accepts TCP connections and never answers.

A client's connect succeeds at once and its request is sent, then its read waits until the
client's own read timeout. The blackhole keeps every connection open and records what it
was sent, so a test can tell that a caller is still hanging on it (see ``hanging``).
"""

from __future__ import annotations

import selectors
import socket
import threading


class Blackhole:
    """A listening socket on 127.0.0.1 (a free port) served by a thread that reads and never writes."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.setblocking(False)
        self.port = self._listener.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._lock = threading.Lock()
        self._received: dict[socket.socket, bytes] = {}  # open connections: what each sent
        self._closed: list[bytes] = []  # what connections the client closed had sent
        self._stop_r, self._stop_w = socket.socketpair()
        self._thread = threading.Thread(target=self._serve, daemon=True, name="blackhole")
        self._thread.start()

    def _serve(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self._listener, selectors.EVENT_READ)
        sel.register(self._stop_r, selectors.EVENT_READ)
        while True:
            for key, _ in sel.select():
                sock = key.fileobj
                if sock is self._stop_r:
                    for conn in list(self._received):
                        conn.close()
                    sel.close()
                    return
                if sock is self._listener:
                    conn, _addr = self._listener.accept()
                    conn.setblocking(False)
                    with self._lock:
                        self._received[conn] = b""
                    sel.register(conn, selectors.EVENT_READ)
                    continue
                try:
                    data = sock.recv(65536)  # type: ignore[union-attr]
                except OSError:
                    data = b""
                with self._lock:
                    if data:
                        self._received[sock] += data  # type: ignore[index]
                        continue
                    self._closed.append(self._received.pop(sock))  # type: ignore[arg-type]
                sel.unregister(sock)
                sock.close()  # type: ignore[union-attr]

    def hanging(self) -> int:
        """How many connections are open and have sent a request (never answered)."""
        with self._lock:
            return sum(1 for sent in self._received.values() if sent)

    def closed(self) -> int:
        """How many connections their client gave up on (a timeout) and closed."""
        with self._lock:
            return len(self._closed)

    def stop(self) -> None:
        """Close the listener and every connection."""
        self._stop_w.send(b"x")
        self._thread.join(timeout=10)
        self._listener.close()
        self._stop_r.close()
        self._stop_w.close()
