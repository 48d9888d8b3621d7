"""Where a user's remotes are kept: ``$XDG_CONFIG_HOME/monkey/remotes.json`` (default
``~/.config/monkey``) holds each remote's URL and pinned certificate fingerprint and the
default remote; each token sits in its own 0600 file beside it (``NAME.token``).

Which remote a command talks to: ``--remote NAME`` (the CLI puts it in ``MONKEY_REMOTE``),
else ``MONKEY_REMOTE``, else the default set by `monkey remote use`; ``local`` (either
way) means this machine's MONKEY_HOME."""

from __future__ import annotations

import json
import os
from pathlib import Path

from monkey.models import MonkeyError, later_pattern

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

LOCAL = "local"  # MONKEY_REMOTE=local: this machine, whatever the default
_NAME = later_pattern(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$")


class Remote:
    """One remote: NAME, its URL, its pinned fingerprint (or None), its token."""

    def __init__(self, name: str, url: str, fingerprint: str | None, token: str) -> None:
        self.name = name
        self.url = url
        self.fingerprint = fingerprint
        self.token = token


def folder() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "monkey"


def settings_file() -> Path:
    return folder() / "remotes.json"


def token_file(name: str) -> Path:
    return folder() / f"{name}.token"


def check_name(name: str) -> str:
    if name == LOCAL or not _NAME.match(name):
        raise MonkeyError(
            f"{name!r} cannot name a remote: use letters, digits, '.', '_' or '-' "
            f"(up to 40, not {LOCAL!r}), e.g. lab"
        )
    return name


def load() -> dict[str, Any]:
    """{"default": NAME or None, "remotes": {NAME: {"url", "fingerprint"}}}."""
    try:
        data = json.loads(settings_file().read_text())
    except FileNotFoundError:
        return {"default": None, "remotes": {}}
    except (OSError, ValueError) as exc:
        raise MonkeyError(f"{settings_file()} cannot be read ({exc}); fix or remove it") from None
    return {"default": data.get("default"), "remotes": dict(data.get("remotes") or {})}


def save(data: dict[str, Any]) -> None:
    """Write the settings (a private folder, the file replaced whole)."""
    where = folder()
    where.mkdir(parents=True, exist_ok=True, mode=0o700)
    staged = where / f".remotes.json.{os.getpid()}"
    fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(staged, settings_file())


def write_token(name: str, token: str) -> None:
    """Keep NAME's token in its own file, readable by this user only."""
    folder().mkdir(parents=True, exist_ok=True, mode=0o700)
    path = token_file(name)
    staged = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    os.replace(staged, path)


def selected() -> str | None:
    """The name of the remote commands talk to now, or None for this machine. Costs a
    file read (one-shot commands call it)."""
    name = os.environ.get("MONKEY_REMOTE")
    if name is None:
        try:
            with open(settings_file(), "rb") as f:
                name = json.loads(f.read()).get("default")
        except (OSError, ValueError):
            return None
    return None if not name or name == LOCAL else name


def get(name: str) -> Remote:
    """Remote NAME with its token; MonkeyError naming the fix when it is not set up."""
    entry = load()["remotes"].get(name)
    if entry is None:
        raise MonkeyError(
            f"no remote {name!r}; add it with `monkey remote add {name} "
            "https://HOST:8443 --token T` (see `monkey remote list`)"
        )
    try:
        token = token_file(name).read_bytes().decode("ascii").strip()
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "it holds no token"
        raise MonkeyError(
            f"remote {name}: its token file {token_file(name)} cannot be read "
            f"({why}); add the remote again with its token"
        ) from None
    return Remote(name, entry["url"], entry.get("fingerprint"), token)
