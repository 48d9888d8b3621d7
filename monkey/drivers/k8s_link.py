"""The core's link to monkey's agent inside one pod: an exec through the API server running
the relay (monkey/client_agent/pod.py), which joins the exec's stdin and stdout to the
agent's socket and sends the run folder's logs along (no inbound port on the pod, and the
core may be outside the cluster). The agent protocol's lines go both ways; replies are
matched to requests by id, pushes (events, files) go to a callback."""

from __future__ import annotations

import itertools
import json
import threading

from monkey.drivers.k8s_api import BOOT, POD_AGENT, POD_RUN, POD_SOCKET, Cluster
from monkey.models import MonkeyError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

_STDIN, _STDOUT, _STDERR, _STATUS = 0, 1, 2, 3


class PodLink:
    """An open relay to the agent of POD; ON_PUSH gets each push (``{"push": "kept"}`` once
    one of the folders KEPT, under /monkey, changed), ON_CLOSE the reason once the relay ends
    (the pod stopped, the API server dropped it, ``close``)."""

    def __init__(
        self,
        cluster: Cluster,
        pod: str,
        offsets: dict[str, int],
        on_push: Callable[[dict[str, Any]], None],
        on_close: Callable[[str], None],
        kept: list[str] | None = None,
    ) -> None:
        self.pod = pod
        self.on_push = on_push
        self.on_close = on_close
        self.ids = itertools.count(1)
        self.waiting: dict[int, tuple[threading.Event, list[dict[str, Any]]]] = {}
        self.lock = threading.Lock()
        self.closed = False
        argv = ["python3", "-I", "-c", BOOT.format("pod"), POD_AGENT, POD_SOCKET, POD_RUN,
                *(f"{name}={at}" for name, at in offsets.items()),
                *(f"kept:{folder}=0" for folder in kept or [])]  # fmt: skip
        self.ws = cluster.open_exec(pod, argv, True)
        self.sock = self.ws.sock
        self.err = b""
        first = self._read_until_ok(60)
        if first is not None:
            self.ws.close()
            raise MonkeyError(f"cannot reach monkey's agent in pod {pod}: {first}")
        self.reader = threading.Thread(target=self._reading, name=f"k8s-link-{pod}", daemon=True)
        self.reader.start()

    def _frames(self, timeout: float | None) -> tuple[int, bytes] | None:
        """The next data frame (channel, bytes); None once the websocket closed."""
        from websocket import ABNF

        self.sock.settimeout(timeout)
        while True:
            opcode, frame = self.sock.recv_data_frame(True)
            if opcode == ABNF.OPCODE_CLOSE:
                return None
            if opcode in (ABNF.OPCODE_BINARY, ABNF.OPCODE_TEXT) and len(frame.data) > 1:
                return frame.data[0], frame.data[1:]

    def _read_until_ok(self, timeout: float) -> str | None:
        """Wait for the relay's ``ok`` line; None when it came, else why not (one line)."""
        from websocket import WebSocketException

        self.buf = b""
        try:
            while not self.buf.startswith(b"ok\n"):
                got = self._frames(timeout)
                if got is None:
                    break
                channel, data = got
                if channel == _STDOUT:
                    self.buf += data
                elif channel == _STDERR:
                    self.err += data
                elif channel == _STATUS:
                    self.err += b" " + data
        except (OSError, ValueError, WebSocketException) as exc:
            return f"no answer from its relay ({exc})"
        if self.buf.startswith(b"ok\n"):
            self.buf = self.buf[3:]
            return None
        said = self.err.decode(errors="replace").strip().splitlines()
        return said[0][:300] if said else "its relay ended"

    def _reading(self) -> None:
        from websocket import WebSocketException

        why = "the relay ended"
        try:
            while True:
                lines = self.buf.split(b"\n")
                self.buf = lines.pop()
                for line in lines:
                    if line.strip():
                        self._handle(json.loads(line))
                got = self._frames(None)
                if got is None:
                    break
                channel, data = got
                if channel == _STDOUT:
                    self.buf += data
                elif channel in (_STDERR, _STATUS):
                    self.err += data
        except (OSError, ValueError, WebSocketException) as exc:
            why = f"the relay broke ({exc})"
        finally:
            self._closed(why)

    def _handle(self, msg: dict[str, Any]) -> None:
        if "id" in msg:
            with self.lock:
                waiter = self.waiting.pop(int(msg["id"]), None)
            if waiter is not None:
                waiter[1].append(msg)
                waiter[0].set()
            return
        self.on_push(msg)

    def _closed(self, why: str) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
            waiters = list(self.waiting.values())
            self.waiting.clear()
        for event, _ in waiters:
            event.set()
        try:
            self.ws.close()
        except (OSError, ValueError):
            pass
        self.on_close(why)

    def request(self, op: str, timeout: float = 60, **fields: Any) -> dict[str, Any]:
        """Send OP and wait for its reply; MonkeyError when it says no or the link ends."""
        from websocket import ABNF, WebSocketException

        rid = next(self.ids)
        event = threading.Event()
        box: list[dict[str, Any]] = []
        with self.lock:
            if self.closed:
                raise MonkeyError(f"the link to pod {self.pod} is closed")
            self.waiting[rid] = (event, box)
        data = (json.dumps({"id": rid, "op": op, **fields}) + "\n").encode()
        try:
            self.sock.send(bytes([_STDIN]) + data, opcode=ABNF.OPCODE_BINARY)
        except (OSError, ValueError, WebSocketException) as exc:
            self._closed(f"the relay broke ({exc})")
        if not event.wait(timeout) or not box:
            raise MonkeyError(f"the agent in pod {self.pod} gave no answer to {op}")
        reply = box[0]
        if not reply.get("ok"):
            raise MonkeyError(str(reply.get("error")))
        return reply

    def close(self) -> None:
        self._closed("closed")
