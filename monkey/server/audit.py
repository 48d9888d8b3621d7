"""The main node's audit log: one JSON line per event a lab may have to account for — a
refused token, a login to Monkey Web, an admin's action, an action on a job through the API
or the pages — saying when, who, from where, what, on what, and the outcome (ok, refused,
error). It is MONKEY_HOME/server/audit.jsonl (0600), rotated by size (KEEP files of SIZE
bytes), appended under a file lock, so the server's threads and the main node's own
commands may write at once. A token is never written, only its first characters.

Refused tokens are recorded one by one up to BURST per address a minute; past that they
are counted, and the count is one line of its own when that address is refused again
after the minute, so a flood of refusals cannot rotate the rest of the log away.
Standard library only: `monkey server audit` reads it without loading the server."""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time
from pathlib import Path

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from monkey.config import Home

NAME = "audit.jsonl"
SIZE = 10 << 20  # bytes of a file before it is rotated
KEEP = 5  # files kept: audit.jsonl, audit.jsonl.1 ... audit.jsonl.4
BURST = 20  # refusals recorded one by one per address and WINDOW
WINDOW = 60.0
OUTCOMES = ("ok", "refused", "error")

_lock = threading.Lock()
_refusals: dict[str, list[float]] = {}  # peer -> [window start, refusals in it, not recorded]


def path(home: Home) -> Path:
    return home.root / "server" / NAME


def record(
    home: Home,
    action: str,
    *,
    user: str | None = None,
    peer: str | None = None,
    target: str | None = None,
    outcome: str = "ok",
    detail: str | None = None,
    token: str | None = None,
) -> None:
    """Append one event: ACTION (``token refused``, ``web login``, a facade method...) by
    USER from PEER on TARGET, its OUTCOME (ok, refused, error) and DETAIL (an error's
    line); TOKEN: the refused token's first characters, never more."""
    now = time.time()
    event: dict[str, Any] = {
        "at": round(now, 3),
        "user": user,
        "peer": peer,
        "action": action,
        "target": _short(target),
        "outcome": outcome,
    }
    if token is not None:
        event["token"] = f"mk_{token}…" if token else "(none)"
    if detail:
        event["detail"] = _short(detail)
    lines = []
    with _lock:
        if outcome == "refused" and peer is not None:
            burst = _throttle(peer, time.monotonic())  # a window no clock step stretches
            if burst is None:
                return
            if burst:
                lines.append(
                    {
                        **event,
                        "action": "token refused",
                        "target": None,
                        "token": None,
                        "detail": f"{burst} more refusals from this address in the minute "
                        "before, not recorded one by one",
                    }
                )
        lines.append(event)
        _append(path(home), "".join(json.dumps(e, ensure_ascii=False) + "\n" for e in lines))


def _throttle(peer: str, now: float) -> int | None:
    """None when this refusal from PEER is only counted; else how many were only counted
    in PEER's last minute (0 mostly), to be said first."""
    seen = _refusals.get(peer)
    if seen is None or now - seen[0] >= WINDOW:
        if len(_refusals) > 10_000:
            for old in [p for p, s in _refusals.items() if now - s[0] >= WINDOW and not s[2]]:
                del _refusals[old]
        said = int(seen[2]) if seen else 0
        _refusals[peer] = [now, 1, 0]
        return said
    seen[1] += 1
    if seen[1] > BURST:
        seen[2] += 1
        return None
    return 0


def _append(file: Path, text: str) -> None:
    """TEXT appended to FILE under its lock, rotating it first when it would pass SIZE."""
    file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    data = text.encode()
    while True:
        fd = os.open(file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                if os.fstat(fd).st_ino != os.stat(file).st_ino:
                    continue  # rotated by another writer meanwhile: the new file
            except FileNotFoundError:
                continue
            if os.fstat(fd).st_size and os.fstat(fd).st_size + len(data) > SIZE:
                for n in range(KEEP - 1, 0, -1):
                    older = file.with_name(f"{file.name}.{n}")
                    if older.exists():
                        os.replace(older, file.with_name(f"{file.name}.{n + 1}"))
                os.replace(file, file.with_name(f"{file.name}.1"))
                file.with_name(f"{file.name}.{KEEP}").unlink(missing_ok=True)
                continue  # the new file
            os.write(fd, data)
            return
        finally:
            os.close(fd)


def read(home: Home, user: str | None = None, since: float | None = None) -> list[dict[str, Any]]:
    """The events kept (rotated files too), oldest first; USER's only, or those at SINCE
    (a time) or later."""
    file = path(home)
    events = []
    for n in range(KEEP - 1, -1, -1):
        try:
            text = file.with_name(f"{file.name}.{n}" if n else file.name).read_text("utf-8")
        except OSError:
            continue
        for line in text.splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue  # a line cut short by a full disk
            if not isinstance(event, dict) or not isinstance(event.get("at"), (int, float)):
                continue
            if (user is None or event.get("user") == user) and (
                since is None or event["at"] >= since
            ):
                events.append(event)
    events.sort(key=lambda e: e["at"])
    return events


def _short(text: str | None, most: int = 300) -> str | None:
    if text is None:
        return None
    text = " ".join(str(text).split())
    # a lone surrogate or NUL a request carried is shown escaped, never written raw
    text = text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\0", "\\0")
    return text if len(text) <= most else text[: most - 1] + "…"
