"""Monkey Web's sessions and one-time login links, kept as files under
MONKEY_HOME/server/web (0700; each file 0600, named by the SHA-256 of its secret, so the
secrets themselves are never on disk): a session survives a server restart and ends at
logout; a link is consumed by its first use. Stdlib only: `monkey web` issues links
without loading the server."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import time
from pathlib import Path

from monkey.config import Home, write_private

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

SESSION_DAYS = 7  # a session ends this long after login
LINK_SECONDS = 120  # a one-time link must be used this soon
PRUNE_EVERY = 3600  # seconds between two prunes of expired sessions (on a login)
PRUNE_MOST = 5000  # files a prune looks at, at most


def folder(home: Home, kind: str) -> Path:
    """MONKEY_HOME/server/web/KIND (0700), made when missing."""
    root = home.root / "server"
    root.mkdir(mode=0o700, exist_ok=True)
    path = root / "web" / kind
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def _name(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def issue_link(home: Home, user: str, now: float | None = None) -> str:
    """A one-time login secret for USER (``/web/login?once=SECRET``), valid LINK_SECONDS."""
    secret = secrets.token_urlsafe(32)
    expires = (time.time() if now is None else now) + LINK_SECONDS
    body = json.dumps({"user": user, "expires": expires}).encode()
    write_private(folder(home, "links") / _name(secret), body)
    return secret


def consume_link(home: Home, secret: str, now: float | None = None) -> str | None:
    """The user a one-time link SECRET was issued for, or None; it never works again (the
    file is renamed away first, so two requests at once cannot both use it)."""
    if not secret or len(secret) > 200:
        return None
    links = folder(home, "links")
    path = links / _name(secret)
    taken = links / f"{path.name}.{secrets.token_hex(4)}.used"
    try:
        os.rename(path, taken)
    except OSError:
        return None
    try:
        record = json.loads(taken.read_text())
    except (OSError, ValueError):
        return None
    finally:
        taken.unlink(missing_ok=True)
    if record.get("expires", 0) < (time.time() if now is None else now):
        return None
    return str(record["user"])


def token_key(digest: str) -> str:
    """What a session keeps of its user's token DIGEST (a hash of it): a session whose key
    is no longer its user's was opened with a token since rotated (or a user since removed
    and added again) and ends."""
    return hashlib.sha256(f"monkey-web-session:{digest}".encode()).hexdigest()[:32]


def create_session(home: Home, user: str, key: str = "") -> tuple[str, str]:
    """A new session of USER whose token's ``token_key`` is KEY: (its id, for the cookie;
    its CSRF token, for forms). Expired sessions and links are pruned now and then."""
    sid, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(24)
    body = {"user": user, "key": key, "csrf": csrf, "expires": time.time() + SESSION_DAYS * 86400}
    write_private(folder(home, "sessions") / _name(sid), json.dumps(body).encode())
    prune_now_and_then(home)
    return sid, csrf


def session(home: Home, sid: str | None) -> dict[str, Any] | None:
    """{"user", "csrf", "expires"} of session SID while it lasts, else None."""
    if not sid or len(sid) > 200:
        return None
    path = folder(home, "sessions") / _name(sid)
    try:
        record = dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None
    if record.get("expires", 0) < time.time():
        path.unlink(missing_ok=True)
        return None
    return record


def end_session(home: Home, sid: str | None) -> None:
    """Log session SID out (nothing when it is unknown)."""
    if sid and len(sid) <= 200:
        (folder(home, "sessions") / _name(sid)).unlink(missing_ok=True)


def end_user_sessions(home: Home, user: str) -> int:
    """End every session of USER (its token rotated, or the user removed); how many."""
    gone = 0
    for path in folder(home, "sessions").iterdir():
        try:
            mine = json.loads(path.read_text()).get("user") == user
        except (OSError, ValueError):
            continue
        if mine:
            path.unlink(missing_ok=True)
            gone += 1
    return gone


def prune_now_and_then(home: Home, now: float | None = None) -> int:
    """``prune`` when it last ran PRUNE_EVERY ago or more (a stamp file's time), else
    nothing: a login pays for it at most once an hour; how many went."""
    now = time.time() if now is None else now
    stamp = folder(home, "sessions").parent / "pruned"
    try:
        if now - stamp.stat().st_mtime < PRUNE_EVERY:
            return 0
    except OSError:
        pass
    stamp.touch()
    os.utime(stamp, (now, now))
    return prune(home, now)


def prune(home: Home, now: float | None = None, most: int = PRUNE_MOST) -> int:
    """Remove expired sessions and links, looking at MOST files at most (bounded work: the
    rest wait for the next time); how many went."""
    import itertools

    now = time.time() if now is None else now
    gone = 0
    for kind in ("sessions", "links"):
        for path in itertools.islice(folder(home, kind).iterdir(), most):
            try:
                expired = json.loads(path.read_text()).get("expires", 0) < now
            except (OSError, ValueError):
                expired = True
            if expired:
                path.unlink(missing_ok=True)
                gone += 1
    return gone
