"""Monkey Web's remembered choices per user (the jobs list's columns and sort), one small JSON
file per user under MONKEY_HOME/server/web/prefs (0600, named by the SHA-256 of the
user's name)."""

from __future__ import annotations

import hashlib
import json

from monkey.config import Home, write_private
from monkey.server.websession import folder

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def _path(home: Home, user: str) -> Any:
    return folder(home, "prefs") / hashlib.sha256(user.encode()).hexdigest()


def load(home: Home, user: str) -> dict[str, Any]:
    """USER's remembered choices ({} when none, or when the file is unreadable)."""
    try:
        prefs = json.loads(_path(home, user).read_text())
    except (OSError, ValueError):
        return {}
    return prefs if isinstance(prefs, dict) else {}


def remember(home: Home, user: str, key: str, value: Any) -> None:
    """Keep VALUE as USER's choice KEY (written only when it changed)."""
    prefs = load(home, user)
    if prefs.get(key) == value:
        return
    prefs[key] = value
    write_private(_path(home, user), json.dumps(prefs).encode())
