"""The cluster agent's side of the core's link (one end of a socket pair: requests in,
replies and pushes out, as an agent's socket), and what it reads and writes in a run folder
of MONKEY_HOME."""

from __future__ import annotations

import json
import os
import socket
import threading

from monkey.client_agent.rundir import EVENTS
from monkey.models import MonkeyError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    ClusterAgent = Any  # monkey.drivers.k8s_agent.ClusterAgent (which imports this module)


def read_json(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def resolve_files(manifests: dict[str, list[Any]], req: dict[str, Any]) -> list[Any] | None:
    """A start's code files [[relpath, digest, mode]]: given, or the list its manifest names
    (or a change to one) when MANIFESTS (the lists given, by digest; kept up to date here)
    holds it; unknown: MonkeyError, and the core sends the full list again."""
    files, manifest = req.get("files"), req.get("manifest")
    if files is None and manifest:
        if req.get("base"):
            base = manifests.get(req["base"])
            if base is None:
                raise MonkeyError(f"unknown manifest {req['base']}: send the full file list")
            changes = list(req.get("changes") or [])
            dropped = set(req.get("removed") or []) | {c[0] for c in changes}
            files = sorted([f for f in base if f[0] not in dropped] + changes)
        else:
            files = manifests.get(manifest)
            if files is None:
                raise MonkeyError(f"unknown manifest {manifest}: send the full file list")
    if files is not None and manifest:
        if len(manifests) > 256:
            manifests.clear()
        manifests[manifest] = files
    return files


def events_of(run_dir: str) -> list[dict[str, Any]]:
    try:
        with open(os.path.join(run_dir, EVENTS)) as f:
            return [json.loads(line) for line in f if line.strip().endswith("}")]
    except (OSError, ValueError):
        return []


def has_exit(run_dir: str) -> bool:
    return any(e.get("type") == "exit" for e in events_of(run_dir))


class CoreConn:
    """One link from a core: requests in, replies and pushes out."""

    def __init__(self, agent: ClusterAgent, sock: socket.socket) -> None:
        self.agent = agent
        self.sock = sock
        self.wlock = threading.Lock()
        self.open = True

    def send(self, msg: dict[str, Any]) -> None:
        data = (json.dumps(msg, separators=(",", ":")) + "\n").encode()
        with self.wlock:
            try:
                self.sock.sendall(data)
            except OSError:
                self.close()

    def close(self) -> None:
        self.open = False
        with self.agent.lock:
            if self in self.agent.subscribers:
                self.agent.subscribers.remove(self)
        try:
            self.sock.close()
        except OSError:
            pass

    def serve(self) -> None:
        buf = b""
        try:
            while self.open:
                data = self.sock.recv(1 << 16)
                if not data:
                    break
                buf += data
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip():
                        self._handle(json.loads(line))
        except (OSError, ValueError):
            pass
        finally:
            self.close()

    def _handle(self, req: dict[str, Any]) -> None:
        agent, op, rid = self.agent, req.get("op"), req.get("id")
        try:
            if op == "hello":
                reply = agent.hello()
            elif op == "start":
                reply = agent.start(req)
            elif op == "signal":
                reply = agent.signal(req)
            elif op == "sync":
                reply = agent.sync(req)
            elif op == "jobs":
                reply = agent.jobs()
            elif op in ("ping", "shutdown"):
                reply = {"stopping": False}
            else:
                raise MonkeyError(f"unknown op {op!r}")
        except (MonkeyError, KeyError, TypeError, ValueError, OSError) as exc:
            self.send({"id": rid, "ok": False, "error": str(exc) or type(exc).__name__})
            return
        self.send({"id": rid, "ok": True, **reply})
        if op == "sync":
            with agent.lock:  # no event is written between the replay and the subscription
                self._replay(req)
                agent.subscribers.append(self)

    def _replay(self, req: dict[str, Any]) -> None:
        """Push every event of the named attempts after the offset the core has."""
        for item in req.get("attempts") or []:
            path = os.path.join(item["run_dir"], EVENTS)
            try:
                with open(path, "rb") as f:
                    f.seek(int(item.get("offset") or 0))
                    data = f.read()
                    start = int(item.get("offset") or 0)
            except OSError:
                continue
            for line in data.split(b"\n")[:-1]:
                start += len(line) + 1
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                self.send({"push": "event", "juid": item["juid"], "attempt": item["attempt"],
                           "offset": start, "event": event})  # fmt: skip
