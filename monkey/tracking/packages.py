"""The installed Python packages of the environment a job is submitted from, recorded per
job so that `monkey diff` can show what changed. Listing distributions costs ~0.1 s, so the
list is cached in MONKEY_HOME and read again only when a site-packages folder changes."""

from __future__ import annotations

import json
import os
import sys
import zlib
from pathlib import Path

from monkey.config import write_private


def _site_dirs() -> list[str]:
    return sorted(
        {p for p in sys.path if p.endswith(("site-packages", "dist-packages")) and os.path.isdir(p)}
    )


def _stamp() -> list[list[object]]:
    """What changes when a package is installed or removed: each site folder's mtime."""
    return [[d, os.stat(d).st_mtime_ns] for d in _site_dirs()]


_memo: tuple[list[object], dict[str, str]] | None = None  # this process's last answer


def installed(cache_dir: Path) -> dict[str, str]:
    """{name: version} of the installed distributions (cached by site-folder mtimes, on
    disk across processes and in memory within one, e.g. a sweep script's many runs)."""
    global _memo
    stamp: list[object] = [sys.prefix, _stamp()]
    if _memo is not None and _memo[0] == stamp:
        return _memo[1]
    _memo = (stamp, _installed(cache_dir, stamp))
    return _memo[1]


def _installed(cache_dir: Path, stamp: list[object]) -> dict[str, str]:
    cache = cache_dir / f"packages-{zlib.crc32(sys.prefix.encode()):08x}.json"
    try:
        saved = json.loads(cache.read_text())
        if saved["stamp"] == stamp:
            return saved["packages"]
    except (OSError, ValueError, KeyError):
        pass
    from importlib import metadata

    packages = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            packages[name.lower()] = dist.version
    packages = dict(sorted(packages.items()))
    tmp = cache.with_suffix(".tmp")
    try:
        write_private(tmp, json.dumps({"stamp": stamp, "packages": packages}).encode())
        os.replace(tmp, cache)
    except OSError:
        pass
    return packages


def as_text(packages: dict[str, str]) -> bytes:
    """The list as `name==version` lines (the blob recorded for a job)."""
    return "".join(f"{k}=={v}\n" for k, v in packages.items()).encode()


def from_text(data: bytes) -> dict[str, str]:
    """The inverse of ``as_text``."""
    out = {}
    for line in data.decode(errors="replace").splitlines():
        name, sep, version = line.partition("==")
        if sep:
            out[name] = version
    return out
