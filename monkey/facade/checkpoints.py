"""The files of a job's checkpoint_dir() (MONKEY_HOME's copy, the one a job resumes from),
as Monkey Web's job page lists them."""

from __future__ import annotations

import os
import stat
from pathlib import Path

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

LISTED = 200  # files listed at most (newest first); the count and bytes cover them all


def regular_files(folder: Path) -> list[tuple[str, int, float]]:
    """(path relative to FOLDER, /-separated; size; mtime) of each regular file under
    FOLDER, folder by folder in name order; links neither listed nor followed, a file gone
    meanwhile (a job rotating its checkpoints) left out; none when FOLDER is missing or a
    link."""
    found: list[tuple[str, int, float]] = []
    if not folder.is_dir() or folder.is_symlink():
        return found
    for root, dirs, names in os.walk(folder):  # a linked folder is listed in dirs, not entered
        dirs.sort()
        for leaf in sorted(names):
            path = Path(root, leaf)
            try:
                st = path.lstat()
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                found.append((path.relative_to(folder).as_posix(), st.st_size, st.st_mtime))
    return found


def checkpoint_files(folder: Path, most: int = LISTED) -> dict[str, Any]:
    """{"files": [{"path" (relative, /-separated), "size", "mtime"}] newest first (at most
    MOST), "count", "bytes"} of the regular files under FOLDER (see ``regular_files``)."""
    found = sorted(regular_files(folder), key=lambda f: (-f[2], f[0]))
    return {
        "files": [{"path": p, "size": s, "mtime": t} for p, s, t in found[:most]],
        "count": len(found),
        "bytes": sum(s for _, s, _ in found),
    }
