"""A failed job's error line for the jobs list: the last line of its stderr that names an
exception (``FloatingPointError: loss diverged at step 458``), else its last line; read
from the log's last few KB only (a page of 50 failed jobs reads at most 50 of them)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from monkey.logfiles import open_log

TAIL = 16 << 10  # bytes read from the end of a log
LONGEST = 200  # characters of the line shown
_EXCEPTION = re.compile(r"^\s*[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit|Fault)\b")


def error_line(stderr: Path) -> str | None:
    """The line of the log STDERR (its last TAIL bytes) that says why the job failed:
    the last one naming an exception, else the last non-empty one; None without a log."""
    try:
        with open_log(stderr) as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(max(0, size - TAIL))
            text = f.read(TAIL).decode("utf-8", "replace")
    except OSError:
        return None
    lines = [line.strip() for line in text.replace("\r", "\n").split("\n") if line.strip()]
    if size > TAIL:
        lines = lines[1:]  # the first may be cut
    named = [line for line in lines if _EXCEPTION.match(line)]
    found = named or lines
    return found[-1][:LONGEST] if found else None
