"""Why Slurm is ending the allocation an agent runs in (stdlib only), read from the batch
step's output file: before it signals the step, slurmstepd writes there a line
``*** JOB 42 ON node1 CANCELLED AT 2026-12-07T19:13:39 DUE TO PREEMPTION ***`` (or ``DUE TO
JOB REQUEUE``, ``TIME LIMIT``, ``NODE FAILURE``: Slurm's own doing, a preemption to resume
from), and a plain ``... CANCELLED AT 2026-12-07T19:13:39 ***`` when a person cancelled it
(``scancel`` by its user or an admin): an end to take as it is, not to resume from."""

from __future__ import annotations

import os
import re

_TAIL = 8192  # bytes of the output file looked at: the line is among its last
_CANCELLED = re.compile(rb"\*\*\* (?:JOB|STEP) .*? CANCELLED AT (\S+)(.*?)\*\*\*")
_DUE_TO = re.compile(rb"DUE TO (.*?)(?: on \S+)?\s*$", re.IGNORECASE)
PREEMPTION = "Slurm is ending the allocation"
CANCELLED = "Slurm: the allocation was cancelled (scancel by its user or an admin)"


def log_size(log_path: str | None) -> int:
    """The size of the output file LOG_PATH now (0: none): what a requeued allocation's
    earlier runs wrote there (the file is appended to) is not about this one."""
    try:
        return os.stat(log_path).st_size if log_path else 0
    except OSError:
        return 0


def slurm_ending(log_path: str | None, since: int = 0) -> tuple[str, bool]:
    """(the detail to report, whether a person cancelled the allocation) for the SIGTERM
    Slurm just sent, as the output file LOG_PATH says past its byte SINCE; a preemption
    when it cannot tell."""
    found = None
    if log_path:
        try:
            with open(log_path, "rb") as f:
                f.seek(max(since, os.fstat(f.fileno()).st_size - _TAIL))
                found = list(_CANCELLED.finditer(f.read()))
        except OSError:
            pass
    if not found:
        return f"{PREEMPTION} (requeue, preemption or time limit)", False
    due = _DUE_TO.search(found[-1].group(2).strip())
    if due is None:
        return CANCELLED, True
    return f"{PREEMPTION} (due to {due.group(1).decode(errors='replace').lower()})", False
