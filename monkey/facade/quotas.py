"""Quotas of a shared main node (`monkey server quota`): setting them (limits and fair-share
weights), and each user's use of every provider against them (`monkey list providers`)."""

from __future__ import annotations

from monkey.models import MonkeyError
from monkey.store.quotas import ANY, LIMITS, UNLIMITED, limits_for

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from monkey.store import Store

_FLAGS = {"jobs": "--jobs", "gpus": "--gpus", "spend": "--spend"}


def parse_limit(name: str, text: str) -> float | None:
    """The value of --NAME TEXT: a count (jobs, gpus) or $/hour (spend) at least 0, or
    ``unlimited`` (lifts a wider entry's limit); MonkeyError naming the flag otherwise."""
    if text.strip().lower() in ("unlimited", "none"):
        return UNLIMITED
    try:
        value = float(text) if name == "spend" else int(text)
    except ValueError:
        value = -1
    if not value >= 0 or value == float("inf"):
        what = "dollars per hour, e.g. 5.50" if name == "spend" else "a whole number, e.g. 4"
        raise MonkeyError(
            f"{_FLAGS[name]} {text!r} is not a limit; give {what} (0 allows none), or unlimited"
        )
    return value


def parse_storage(text: str) -> int:
    """The value of --storage TEXT: bytes ("50G", "500M", "1T") or ``unlimited``;
    MonkeyError naming the flag otherwise."""
    from monkey.models import parse_size

    if text.strip().lower() in ("unlimited", "none"):
        return UNLIMITED
    try:
        return parse_size(text)
    except MonkeyError:
        raise MonkeyError(
            f"--storage {text!r} is not a size; give e.g. 50G or 500M (0 allows none), or unlimited"
        ) from None


def parse_share(text: str) -> float:
    """The value of --share TEXT: a fair-share weight above 0 (1 is everyone's default);
    MonkeyError naming the flag otherwise."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value <= 1_000_000:
        raise MonkeyError(
            f"--share {text!r} is not a weight; give a number above 0, e.g. 2 for twice "
            "the slots of a user with the default 1"
        )
    return value


def check_target(store: Store, providers: list[str], user: str, provider: str) -> None:
    """MonkeyError when USER (``*``: everyone) or PROVIDER (``*``: all) is unknown here."""
    from monkey.store.db import local_user

    if provider != ANY and provider not in providers:
        raise MonkeyError(
            f"no provider {provider!r}; see `monkey list providers` (or leave out --provider "
            "for all providers)"
        )
    if user != ANY and user != local_user() and user not in {u["name"] for u in store.users()}:
        raise MonkeyError(
            f"no user {user!r}; see `monkey server user list` (or --default for everyone)"
        )


def quota_rows(
    store: Store, providers: list[str], quotas: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Each user's use of each provider against the limits that bind them: [{"user",
    "provider", "jobs", "gpus", "spend": {"used", "limit"} each (limit None: none),
    "held": queued jobs a quota holds back}], for users with a limit on that provider: those
    named by an entry, the server's users and the owners of live or queued jobs."""
    if not quotas:
        return []
    use = store.quota_use()
    held = store.held_counts()
    users = {u["name"] for u in store.users()} | {q["user"] for q in quotas}
    users |= {o for o, _ in use} | {o for o, _ in held}
    users.discard(ANY)
    out = []
    for provider in providers:
        for user in sorted(users, key=lambda u: (u is None, u or "")):
            limits = limits_for(quotas, user, provider)
            if not limits:
                continue
            used = use.get((user, provider), [0, 0, 0.0, 0])
            out.append(
                {
                    "user": user,
                    "provider": provider,
                    **{
                        name: {"used": used[i], "limit": limits.get(name)}
                        for i, name in enumerate(LIMITS)
                    },
                    "held": held.get((user, provider), 0),
                }
            )
    return out
