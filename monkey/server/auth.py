"""Users' tokens and failed authentications: tokens are 32 random bytes shown once and kept
only as their SHA-256 digest, compared in constant time; an address that sends too many
refused tokens of one prefix is refused for a while (429): see ``Gate``."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable

from monkey.models import MonkeyError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from monkey.api import Monkey
    from monkey.store import Store

FAILURES = 10  # refused tokens a bucket (an address and a token prefix) may take per WINDOW
WINDOW = 60.0
PREFIX = 2  # characters of a refused token that name its bucket (after "mk_")
MOST = 100_000  # buckets remembered at once
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
    """Who a token belongs to, and the limit on refused tokens.

    A refusal is counted against its *bucket*: the TCP peer (scope's client, which names a
    forwarded address only from a ``--trusted-proxy``; an IPv6 peer by its /64) and the
    first PREFIX characters of the token it sent. A bucket that collected FAILURES refusals
    within WINDOW seconds is refused (429) until the oldest is WINDOW old. A request whose
    token is valid is never counted, and another user's token falls in another bucket, so
    users who share an address (every SSH tunnel arrives from 127.0.0.1) do not lock each
    other out by mistyping theirs.

    Why guessing is still bounded: only a guess that starts with a token's own prefix can be
    that token, so against any one token an address gets FAILURES guesses per WINDOW, as
    with a limit per address; all prefixes together give it 64**PREFIX times that (40,960 a
    minute), each a 2**-256 chance. The table of buckets is bounded (MOST: past it, the
    bucket refused longest ago is forgotten, so a new bucket is always counted), and the
    refusals are in the audit log (monkey.server.audit: 20 a minute per address one by one,
    the rest as a count).
    """

    def __init__(self, monkey: Callable[[], Monkey]) -> None:
        self.monkey = monkey  # the calling thread's facade
        # bucket -> its refusals' times, the bucket refused longest ago first
        self._failures: OrderedDict[tuple[str, str], deque[float]] = OrderedDict()
        self._touched: dict[str, float] = {}
        self._lock = threading.Lock()

    def retry_after(self, peer: str, token: str | None, now: float | None = None) -> int:
        """Seconds a request from PEER with TOKEN must wait (0: it may try)."""
        now = time.monotonic() if now is None else now
        key = bucket(peer, token)
        with self._lock:
            seen = self._failures.get(key)
            while seen and seen[0] <= now - WINDOW:
                seen.popleft()
            if not seen:
                self._failures.pop(key, None)  # a bucket that stopped failing is forgotten
                return 0
            if len(seen) < FAILURES:
                return 0
            return max(1, int(seen[0] + WINDOW - now) + 1)

    def user(self, token: str | None, peer: str) -> dict[str, Any] | None:
        """The user TOKEN belongs to, or None (a refusal counted in its bucket)."""
        found = None
        if token:
            mine = digest(token)
            for user in self.monkey().users():  # every digest compared: no early exit
                if hmac.compare_digest(mine, user["digest"]):
                    found = user
        now = time.monotonic()
        if found is None:
            self._count(bucket(peer, token), now)
            return None
        if now - self._touched.get(found["name"], -TOUCH_EVERY) >= TOUCH_EVERY:
            self._touched[found["name"]] = now
            self.monkey().touch_user(found["name"], time.time())
        return found

    def _count(self, key: tuple[str, str], now: float) -> None:
        with self._lock:
            seen = self._failures.pop(key, None) or deque(maxlen=FAILURES)
            seen.append(now)
            self._failures[key] = seen  # now the most recent
            while len(self._failures) > MOST:  # bounded: forget the one refused longest ago
                self._failures.popitem(last=False)


def bucket(peer: str, token: str | None) -> tuple[str, str]:
    """Where a refusal of TOKEN from PEER is counted: (the peer, an IPv6 one by its /64;
    the token's prefix)."""
    return network(peer), token_prefix(token)


def token_prefix(token: str | None) -> str:
    """The first PREFIX characters of TOKEN after ``mk_`` (all a log may show of it)."""
    if not token:
        return ""
    return token.removeprefix("mk_")[:PREFIX]


def network(peer: str) -> str:
    """PEER as a limit counts it: an IPv4 address (also IPv4-mapped), an IPv6 one's /64 (a
    host is given a /64 to pick addresses from), anything else as it is."""
    import ipaddress

    try:
        address = ipaddress.ip_address(peer)
    except ValueError:
        return peer[:64]
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        if not address.is_loopback:
            return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)
