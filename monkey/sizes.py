"""Sizes on disk: of a file, of a folder's files, and of a file deleted (what it freed).
Apparent sizes; links are not followed; a file that is gone counts 0."""

from __future__ import annotations

import os
from pathlib import Path


def file_size(path: Path) -> int:
    """The bytes of the file PATH (0 if gone)."""
    try:
        return path.lstat().st_size
    except OSError:
        return 0


def tree_size(path: Path) -> tuple[int, int]:
    """(bytes, files) under PATH."""
    total = count = 0
    for folder, _dirs, names in os.walk(path):
        for name in names:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
                count += 1
            except OSError:
                pass
    return total, count


def unlink_size(path: Path) -> int:
    """Delete the file PATH; the bytes it held (0 if already gone)."""
    try:
        size = path.lstat().st_size
        path.unlink()
    except OSError:
        return 0
    return size
