"""What the dashboard does with an exception nothing expected: its traceback goes to a log
file, the user sees one line naming it and the file, and `monkey dash` exits 1."""

from __future__ import annotations

import os
import time
import traceback
from pathlib import Path

LOG_MAX = 1 << 20  # bytes the crash log keeps (the newest crashes)


def crash_log() -> Path:
    """``$XDG_CACHE_HOME/monkey/dash.log`` (default ``~/.cache``): a laptop with a remote
    selected has no MONKEY_HOME, so the same place for every dashboard."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "monkey" / "dash.log"


def record(error: BaseException) -> str:
    """Append ERROR's traceback to the crash log; the one line to show for it."""
    name = f"{type(error).__name__}: {' '.join(str(error).split())}".rstrip(": ")
    path = crash_log()
    where = f"details in {path}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() and path.stat().st_size > LOG_MAX:
            path.write_bytes(path.read_bytes()[-LOG_MAX // 2 :])
        text = "".join(traceback.format_exception(error))
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} monkey dash\n{text}")
    except OSError as exc:
        where = f"its traceback could not be written to {path} ({exc.strerror})"
    return f"the dashboard stopped on an unexpected error: {name[:300]}; {where}"
