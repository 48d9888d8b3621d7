"""Watching the instance metadata service for a spot or preemption notice (stdlib only).

``kind`` "ec2": IMDSv2 (a session token, renewed before it expires), ``spot/instance-action``
polled every ``every`` seconds (404 until AWS schedules the interruption, then
``{"action", "time"}``) and ``events/recommendations/rebalance`` (an early warning).
``kind`` "gce": ``instance/preempted`` and ``instance/maintenance-event`` long-polled with
``wait_for_change`` (the server answers when the value changes: no polling at all).

A watcher runs in daemon threads and calls ``on_notice(info)`` once per notice, from its
thread, with ``info`` = {"kind": "spot-interrupt"|"rebalance"|"preempted"|"maintenance",
"deadline": epoch seconds (when the machine goes), "detail": text}. A metadata service that
cannot be reached is retried quietly (it may come up after the agent).
"""

from __future__ import annotations

import calendar
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

GCE_NOTICE = 30.0  # seconds GCE leaves a preempted machine
EC2_NOTICE = 120.0  # and AWS, when the notice carries no time
_TOKEN_TTL = 21600


class Watcher:
    """Threads that poll (EC2) or long-poll (GCE) the metadata at URL for notices."""

    def __init__(
        self, kind: str, url: str, on_notice: Callable[[dict[str, Any]], None], every: float = 1.0
    ) -> None:
        if kind not in ("ec2", "gce"):
            raise ValueError(f"unknown metadata kind {kind!r}")
        self.kind, self.url, self.every = kind, url.rstrip("/"), every
        self.on_notice = on_notice
        self.stopped = threading.Event()
        self.seen: set[str] = set()
        self._token = ("", 0.0)
        targets = (
            [self._ec2]
            if kind == "ec2"
            else [
                lambda: self._gce("instance/preempted", "preempted"),
                lambda: self._gce("instance/maintenance-event", "maintenance"),
            ]
        )
        self.threads = [
            threading.Thread(target=t, daemon=True, name=f"notice-{kind}") for t in targets
        ]
        for thread in self.threads:
            thread.start()

    def stop(self) -> None:
        self.stopped.set()

    def _notice(self, kind: str, deadline: float, detail: str) -> None:
        if kind not in self.seen:
            self.seen.add(kind)
            self.on_notice({"kind": kind, "deadline": deadline, "detail": detail})

    # -- EC2 -------------------------------------------------------------------------------

    def _ec2(self) -> None:
        while not self.stopped.wait(self.every):
            try:
                action = self._ec2_get("/latest/meta-data/spot/instance-action")
                if action is not None:
                    doc = json.loads(action)
                    self._notice(
                        "spot-interrupt",
                        _epoch(doc.get("time")) or time.time() + EC2_NOTICE,
                        f"spot {doc.get('action', 'terminate')} at {doc.get('time')}",
                    )
                if "rebalance" not in self.seen:
                    if (
                        self._ec2_get("/latest/meta-data/events/recommendations/rebalance")
                        is not None
                    ):
                        self._notice(
                            "rebalance", time.time() + EC2_NOTICE, "rebalance recommendation"
                        )
            except (OSError, ValueError):
                self._token = ("", 0.0)

    def _ec2_get(self, path: str) -> str | None:
        """The value at PATH, or None when it is not there (404)."""
        token, until = self._token
        if time.monotonic() >= until:
            request = urllib.request.Request(
                self.url + "/latest/api/token",
                method="PUT",
                headers={"X-aws-ec2-metadata-token-ttl-seconds": str(_TOKEN_TTL)},
            )
            with urllib.request.urlopen(request, timeout=2) as reply:
                token = reply.read().decode()
            self._token = (token, time.monotonic() + _TOKEN_TTL / 2)
        request = urllib.request.Request(
            self.url + path, headers={"X-aws-ec2-metadata-token": token}
        )
        try:
            with urllib.request.urlopen(request, timeout=2) as reply:
                return reply.read().decode()
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    # -- GCE -------------------------------------------------------------------------------

    def _gce(self, path: str, kind: str) -> None:
        etag = ""
        while not self.stopped.is_set():
            query = "?wait_for_change=true&timeout_sec=60" + (f"&last_etag={etag}" if etag else "")
            request = urllib.request.Request(
                f"{self.url}/computeMetadata/v1/{path}{query}",
                headers={"Metadata-Flavor": "Google"},
            )
            try:
                with urllib.request.urlopen(request, timeout=75) as reply:
                    value = reply.read().decode().strip()
                    etag = reply.headers.get("ETag", "")
            except (OSError, ValueError):
                self.stopped.wait(max(self.every, 1.0))
                continue
            if (kind == "preempted" and value == "TRUE") or (
                kind == "maintenance" and value.startswith("TERMINATE")
            ):
                self._notice(kind, time.time() + GCE_NOTICE, f"{path} = {value}")


def _epoch(text: Any) -> float | None:
    """Epoch seconds of "2026-11-21T10:00:00Z", or None."""
    try:
        return float(calendar.timegm(time.strptime(str(text), "%Y-%m-%dT%H:%M:%SZ")))
    except ValueError:
        return None
