"""What every part of the agent shares: its log line, the error a refused request raises,
and small file helpers. Standard library only (see agent.py)."""

from __future__ import annotations

import json
import os
import sys
import time
from _thread import get_ident  # (builtin: costs no import, unlike threading)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class RequestError(Exception):
    """A request the agent refuses; the message goes back to the client."""


def log(msg: str) -> None:
    """One line to stderr with a timestamp."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    sys.stderr.write(f"{stamp} agent[{os.getpid()}] {msg}\n")
    sys.stderr.flush()


def read_small(path: str) -> bytes | None:
    """The first 4 KiB of a file (with one read: no buffered file object), or None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)


def write_atomic(path: str, data: bytes) -> None:
    """Write a file (0600) through a temporary name (this thread's own: two threads may
    write the same file) and rename."""
    tmp = f"{path}.{get_ident()}.tmp"
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600), "wb") as f:
        f.write(data)
    os.rename(tmp, path)


def make_dir(path: str) -> bool:
    """Make the folder PATH (0700, with its missing parents); False when it was there.
    One mkdir in the usual case, not makedirs' stat of each parent."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        if not os.path.isdir(path):
            raise
        return False
    except FileNotFoundError:
        os.makedirs(path, 0o700, exist_ok=True)
    return True


def safe_relpath(rel: Any) -> str:
    """RELPATH normalised, or RequestError when absolute, empty or with '..'."""
    if not isinstance(rel, str) or not rel or rel.startswith("/") or "\0" in rel:
        raise RequestError(f"unsafe path {rel!r}")
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        raise RequestError(f"unsafe path {rel!r}")
    return "/".join(parts)


def one_line(e: BaseException) -> str:
    """An exception as one line of text."""
    text = str(e) if isinstance(e, RequestError) else f"{type(e).__name__}: {e}"
    return " ".join(text.split())


_COMPACT = json.JSONEncoder(separators=(",", ":"))  # json.dumps would make one per call


def encode(obj: dict[str, Any]) -> bytes:
    """One protocol line."""
    return (_COMPACT.encode(obj) + "\n").encode()


HERE = os.path.dirname(os.path.abspath(__file__))  # the agent's code: reported in hello


def trace() -> str:
    """The exception being handled, with its traceback, for the log (the traceback module is
    imported only then: it would cost every agent's start a few milliseconds)."""
    import traceback

    return traceback.format_exc()
