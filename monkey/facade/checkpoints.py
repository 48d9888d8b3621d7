"""The files of a job's checkpoint_dir() (MONKEY_HOME's copy, the one a job resumes from),
as Monkey Web's job page lists them."""

from __future__ import annotations

import os
from pathlib import Path

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

LISTED = 200  # files listed at most (newest first); the count and bytes cover them all


def checkpoint_files(folder: Path, most: int = LISTED) -> dict[str, Any]:
    """{"files": [{"path" (relative, /-separated), "size", "mtime"}] newest first (at most
    MOST), "count", "bytes"} of the regular files under FOLDER (links neither listed nor
    followed); none when FOLDER is missing or a link."""
    found: list[tuple[float, str, int]] = []
    if folder.is_dir() and not folder.is_symlink():
        for root, dirs, names in os.walk(folder):
            dirs[:] = [d for d in dirs if not Path(root, d).is_symlink()]
            for leaf in names:
                path = Path(root, leaf)
                try:
                    st = path.lstat()
                except OSError:  # gone meanwhile: a job rotating its checkpoints
                    continue
                if path.is_symlink() or not path.is_file():
                    continue
                found.append((st.st_mtime, path.relative_to(folder).as_posix(), st.st_size))
    found.sort(key=lambda f: (-f[0], f[1]))
    return {
        "files": [{"path": p, "size": s, "mtime": t} for t, p, s in found[:most]],
        "count": len(found),
        "bytes": sum(s for _, _, s in found),
    }
