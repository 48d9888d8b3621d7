"""A per-instance metadata service on loopback that a test controls: EC2 IMDSv2 (token,
``spot/instance-action``, the rebalance recommendation) and GCE (``instance/preempted`` and
``instance/maintenance-event``, long-polled with ``wait_for_change``).

``Metadata(address, port)`` serves one instance; ``interrupt(seconds)`` schedules a spot
interruption as AWS announces it, ``rebalance()`` a recommendation, ``preempt()`` a GCE
preemption. ``requests`` counts what it answered (the agent's polling)."""

from __future__ import annotations

import json
import secrets
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse


class Metadata:
    """One instance's metadata service at http://ADDRESS:PORT (PORT 0: a free one)."""

    def __init__(self, address: str, port: int = 0) -> None:
        self.cond = threading.Condition()
        self.action: dict[str, str] | None = None
        self.rebalanced = False
        self.preempted = False
        self.tokens: set[str] = set()
        self.requests = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def reply(
                self, code: int, body: str = "", headers: dict[str, str] | None = None
            ) -> None:
                data = body.encode()
                self.send_response(code)
                for key, value in {"Content-Length": str(len(data)), **(headers or {})}.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

            def do_PUT(self) -> None:  # noqa: N802 - http.server's name
                owner.requests += 1
                if self.path != "/latest/api/token" or not self.headers.get(
                    "X-aws-ec2-metadata-token-ttl-seconds"
                ):
                    return self.reply(400)
                token = secrets.token_hex(16)
                owner.tokens.add(token)
                self.reply(200, token)

            def do_GET(self) -> None:  # noqa: N802
                owner.requests += 1
                url = urlparse(self.path)
                if url.path.startswith("/latest/"):
                    if self.headers.get("X-aws-ec2-metadata-token") not in owner.tokens:
                        return self.reply(401)  # IMDSv2 only
                    value = owner.ec2(url.path)
                    return self.reply(404) if value is None else self.reply(200, value)
                if url.path.startswith("/computeMetadata/v1/"):
                    if self.headers.get("Metadata-Flavor") != "Google":
                        return self.reply(403)
                    query = {k: v[-1] for k, v in parse_qs(url.query).items()}
                    value = owner.gce(url.path[len("/computeMetadata/v1/") :], query)
                    if value is None:
                        return self.reply(404)
                    return self.reply(200, value, {"Metadata-Flavor": "Google", "ETag": value})
                self.reply(404)

        self.server = ThreadingHTTPServer((address, port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://{address}:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def ec2(self, path: str) -> str | None:
        with self.cond:
            if path == "/latest/meta-data/spot/instance-action" and self.action:
                return json.dumps(self.action)
            if path == "/latest/meta-data/events/recommendations/rebalance" and self.rebalanced:
                return json.dumps({"noticeTime": _iso(time.time())})
        return None

    def gce(self, path: str, query: dict[str, str]) -> str | None:
        def value() -> str | None:
            if path == "instance/preempted":
                return "TRUE" if self.preempted else "FALSE"
            if path == "instance/maintenance-event":
                return "TERMINATE_ON_HOST_MAINTENANCE" if self.preempted else "NONE"
            return None

        with self.cond:
            current = value()
            if current is not None and query.get("wait_for_change") == "true":
                deadline = time.time() + float(query.get("timeout_sec", 60))
                last = query.get("last_etag", current)
                while value() == last and time.time() < deadline:
                    self.cond.wait(deadline - time.time())
                current = value()
            return current

    def interrupt(self, seconds: float = 120, action: str = "terminate") -> None:
        """AWS schedules a spot interruption SECONDS from now."""
        with self.cond:
            self.action = {"action": action, "time": _iso(time.time() + seconds)}
            self.cond.notify_all()

    def rebalance(self) -> None:
        with self.cond:
            self.rebalanced = True
            self.cond.notify_all()

    def preempt(self) -> None:
        """GCE preempts the instance."""
        with self.cond:
            self.preempted = True
            self.cond.notify_all()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))
