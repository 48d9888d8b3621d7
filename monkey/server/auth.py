"""Users' tokens and failed authentications: tokens are 32 random bytes shown once and kept
only as their SHA-256 digest, compared in constant time; an address that fails too often is
refused for a while (429)."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable

from monkey.models import MonkeyError
from monkey.store import Store

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

FAILURES = 10  # refused tokens an address may send per WINDOW
WINDOW = 60.0
TOUCH_EVERY = 60.0  # seconds between two records of a user's last use
_NAME = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}$", re.IGNORECASE)


def new_token() -> str:
    """32 random bytes, URL-safe; the prefix keeps it from starting with "-" (a command line
    would read `--token -x...` as a missing value) and names it in a leaked-secret scan."""
    return "mk_" + secrets.token_urlsafe(32)


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def check_name(name: str) -> str:
    if not _NAME.match(name):
        raise MonkeyError(
            f"{name!r} cannot name a user: use letters, digits, '_', '.' or '-' "
            "(up to 32, starting with a letter), e.g. alice"
        )
    return name


def add_user(store: Store, name: str, admin: bool = False) -> str:
    """Create user NAME; returns its token (shown once, never stored)."""
    token = new_token()
    store.add_user(check_name(name), digest(token), admin)
    return token


def rotate(store: Store, name: str) -> str:
    """A new token for NAME; the old one is refused from now on."""
    token = new_token()
    if not store.set_user_digest(name, digest(token)):
        raise MonkeyError(f"no user {name!r}; see `monkey server user list`")
    return token


class Gate:
    """Who a token belongs to, and the per-address limit on refused tokens."""

    def __init__(self, store: Callable[[], Store]) -> None:
        self.store = store  # the calling thread's store
        self._failures: dict[str, deque[float]] = {}
        self._touched: dict[str, float] = {}
        self._lock = threading.Lock()

    def retry_after(self, address: str, now: float | None = None) -> int:
        """Seconds ADDRESS must wait (0: it may try)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            seen = self._failures.get(address)
            while seen and seen[0] <= now - WINDOW:
                seen.popleft()
            if not seen:
                self._failures.pop(address, None)  # an address that stopped failing is forgotten
                return 0
            if len(seen) < FAILURES:
                return 0
            return max(1, int(seen[0] + WINDOW - now) + 1)

    def user(self, token: str | None, address: str) -> dict[str, Any] | None:
        """The user TOKEN belongs to, or None (a failure counted against ADDRESS)."""
        found = None
        if token:
            mine = digest(token)
            for user in self.store().users():  # every digest compared: no early exit
                if hmac.compare_digest(mine, user["digest"]):
                    found = user
        now = time.monotonic()
        if found is None:
            with self._lock:
                self._failures.setdefault(address, deque()).append(now)
            return None
        if now - self._touched.get(found["name"], -TOUCH_EVERY) >= TOUCH_EVERY:
            self._touched[found["name"]] = now
            self.store().touch_user(found["name"], time.time())
        return found
