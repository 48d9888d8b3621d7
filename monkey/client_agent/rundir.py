"""The run directory: one per attempt (absolute ``run_dir``, chosen by the core). Every file
name in it is named here once, for the agent and for the rest of monkey (the core, the
drivers, the API and the dashboard import this module: it loads nothing but ``os``, ``json``
and ``re``); what each file holds is in docs/agent-protocol.md. Here too: the claim, the exit
record, the events file's readers and the tail offsets. Standard library only (see agent.py).

launcher.py and track.py are shipped alone into a job's environment and import nothing of
the agent: they keep their own copy of the names they write (``setup.*``, ``metrics.jsonl``,
``preempted``), which tests/test_rundir.py checks against this layout."""

from __future__ import annotations

import json
import os
import re
import stat

from monkey.client_agent.common import (
    RequestError,
    encode,
    log,
    read_small,
    safe_relpath,
    write_atomic,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# The layout: a run dir's files are os.path.join(run_dir, NAME).
STDOUT = "stdout.log"  # the job's stdout, opened O_APPEND
STDERR = "stderr.log"  # the job's stderr, opened O_APPEND
ORDER = "output.order"  # the order the two logs were written in
EVENTS = "events.jsonl"  # events, appended by the agent only
STARTED = "started"  # the wrapper's claim: its pid, or ABANDONED_CLAIM written by a sync
ABANDONED_CLAIM = b"abandoned\n"
METRICS = "metrics.jsonl"  # written by the job (monkey.log, track.FILE_NAME), tailed by the agent
# monkey.log's file outside a job (track.metrics_path): never part of a code snapshot
OUTSIDE_METRICS = "monkey-metrics.jsonl"
WORK = "work"  # the materialised code: the job's working directory
CODE_RECORD = "code.json"  # the code copy made in work/, deleted when the attempt ends
LAUNCH = "launch.json"  # what launcher.py is to do
SETUP_LOG = "setup.log"  # launcher.py: the environment's set-up output
SETUP_RECORD = "setup.json"  # launcher.py: the environment's key, reuse and time
PULL = "pull.json"  # image.py: {"bytes", "total", "done"} of the job's image pull
SETUP_FAILED = "setup.failed"  # launcher.py: one line, when the set-up failed
RESULTS = "results.json"  # the run dir's copy of a start's ``results`` (0600), for adoption
RESULTS_SEQ = "results.seq"  # the number of the attempt's last manifest upload
PREEMPTED = "preempted"  # the run dir's mark of a job told to stop by a notice
SIGNALLED = "signalled"  # the run dir's mark of the signal the job got and its SIGKILL deadline
# kubernetes: the core's cluster agent keeps, in the attempt's run folder in MONKEY_HOME, the
# start it hands the agent in the pod (0600: the job's environment) and how far it took the
# pod's events.jsonl and setup.log, for a core that adopts the pod.
POD_START = "pod-start.json"
POD_TAKEN = "pod-taken.json"
ABANDONED = "abandoned"  # the mark of older agents for a run dir reported never started
OLD_EXIT = "exit"  # the exit code, in run dirs of earlier agents
OLD_PID = "pid"  # the started record, in run dirs of earlier agents
LOGS = (SETUP_LOG, STDOUT, STDERR)  # the logs a user reads
# What an ended attempt leaves in its provider's bucket when its agent powers the machine off
# before the core fetched it (see results.leave): all the core would have read of the run dir.
LEFT = (EVENTS, STDOUT, STDERR, ORDER, SETUP_LOG)
PERSIST = "persist"  # beside the attempts' folders: the job's saved persisted folders
# A persisted or data folder's name (job.yml ``persist``/``data``): one path component,
# the name of its saved copy in PERSIST
FOLDER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")

TAIL_CHUNK = 4 << 20  # bytes of metrics.jsonl/stdout.log read for one metrics event
_SCRAPED = re.compile(rb'^[ \t]*\{\s*"(?:experiment|monkey)"\s*:', re.M)
_TAIL_MARK = re.compile(rb'"type":"metrics","log":\[\d+,(\d+)\],"out":\[\d+,(\d+)\]')


def stream_log(stream: str) -> str:
    """The log file of the job's STREAM: STDOUT for "stdout", STDERR for "stderr"."""
    return f"{stream}.log"


def saved_folder(job_dir: str, name: str) -> str | None:
    """JOB_DIR/PERSIST/NAME, the saved copy of persisted folder NAME, when NAME is a folder
    name and that path is a folder reached through no link (a job may have made any of them
    a link out); else None."""
    if not isinstance(name, str) or not FOLDER_NAME.fullmatch(name):
        return None
    path = os.path.join(job_dir, PERSIST, name)
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            return None
    except OSError:
        return None
    runs, juid = os.path.split(os.path.normpath(job_dir))
    if os.path.realpath(path) != os.path.join(os.path.realpath(runs), juid, PERSIST, name):
        return None  # the job's folder or PERSIST is a link
    return path


def record_code(run_dir: str, work: str, rels: list[str]) -> None:
    """Write CODE_RECORD: the files materialised under WORK with the size and mtime they
    were made with, so that ``reclaim_code`` deletes them, and only them, at the end."""
    files = []
    for rel in rels:
        try:
            st = os.lstat(os.path.join(work, rel))
        except OSError:
            continue
        files.append([rel, st.st_size, st.st_mtime_ns])
    if not files:
        return  # nothing to reclaim
    write_atomic(os.path.join(run_dir, CODE_RECORD), encode({"work": work, "files": files}))


def reclaim_code(run_dir: str) -> int:
    """Delete the attempt's code copy (files of CODE_RECORD the job left unchanged, and the
    folders they leave empty), then the record; the bytes freed. What the job wrote or
    changed stays: outputs, logs, persisted folders. Redone safely after an interruption."""
    record = os.path.join(run_dir, CODE_RECORD)
    try:
        with open(record, "rb") as f:
            rec = json.loads(f.read())
        work = os.path.realpath(rec["work"])
        files = rec["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return 0
    if os.path.commonpath([work, os.path.realpath(run_dir)]) != os.path.realpath(run_dir):
        return 0
    freed, parents = 0, set()
    for rel, size, mtime in files:
        try:
            path = os.path.join(work, safe_relpath(rel))
            st = os.lstat(path)
            if (st.st_size, st.st_mtime_ns) != (size, mtime):
                continue  # changed by the job: kept
            os.unlink(path)
        except (OSError, RequestError):
            continue
        freed += st.st_size if stat.S_ISREG(st.st_mode) else 0
        parents.add(os.path.dirname(path))
    for folder in sorted(parents, key=len, reverse=True):
        while len(folder) > len(work):
            try:
                os.rmdir(folder)
            except OSError:
                break
            folder = os.path.dirname(folder)
    try:
        os.unlink(record)
    except OSError:
        pass
    return freed


def read_claim(run_dir: str) -> bytes | None:
    """The content of run_dir/started (the wrapper's pid or ABANDONED_CLAIM), or None."""
    try:
        with open(os.path.join(run_dir, STARTED), "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def recorded_exit(run_dir: str) -> tuple[str, int | None] | None:
    """The file holding the job's exit code, and the code (None when unreadable): the
    claim's "exit CODE" line, else the ``exit`` file of an earlier agent's wrapper; None
    when neither has it."""
    claim = os.path.join(run_dir, STARTED)
    path, text = (
        claim,
        next(
            (
                line[5:]
                for line in (read_small(claim) or b"").split(b"\n")
                if line.startswith(b"exit ")
            ),
            None,
        ),
    )
    if text is None:
        path = os.path.join(run_dir, OLD_EXIT)
        text = read_small(path)
        if text is None:
            return None
    try:
        return path, int(text)
    except ValueError:
        return path, None


def read_exit_code(run_dir: str) -> int | None:
    """The job's exit code (see ``recorded_exit``), or None when absent or unreadable."""
    found = recorded_exit(run_dir)
    return found[1] if found else None


def first_event(path: str) -> dict[str, Any] | None:
    """The first event of an events file, or None (none yet, or not whole)."""
    data = read_small(path) or b""
    end = data.find(b"\n")
    try:
        return json.loads(data[:end]) if end > 0 else None
    except ValueError:
        return None


def last_event(path: str) -> dict[str, Any] | None:
    """The last complete event of an events file (a torn tail is cut off), or None."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return None
    try:
        size = os.fstat(fd).st_size
        start = max(0, size - (1 << 16))
        tail = os.pread(fd, size - start, start)
        while start > 0 and tail.count(b"\n") < 2:  # a heartbeat line is short; be safe
            start = max(0, start - (1 << 20))
            tail = os.pread(fd, size - start, start)
        cut = tail.rfind(b"\n") + 1
        if start + cut < size:
            log(f"{path}: cutting a torn last line of {size - start - cut} bytes")
            os.ftruncate(fd, start + cut)
        lines = tail[:cut].splitlines()
        return json.loads(lines[-1]) if lines else None
    finally:
        os.close(fd)


def read_lines_after(path: str, offset: int) -> list[tuple[int, bytes]]:
    """Complete lines after byte OFFSET, each with the offset just after it."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return []
    out = []
    pos = 0
    while (end := data.find(b"\n", pos)) >= 0:
        out.append((offset + end + 1, data[pos:end]))
        pos = end + 1
    return out


def read_new(path: str, offset: int, final: bool) -> tuple[int, bytes]:
    """Complete lines of PATH from OFFSET (about TAIL_CHUNK bytes, never half a line;
    FINAL also takes an unterminated last line) and the offset after them."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read(TAIL_CHUNK)
            while len(data) >= TAIL_CHUNK and b"\n" not in data[-TAIL_CHUNK:]:
                more = f.read(TAIL_CHUNK)  # a line longer than a chunk: read on to its end
                if not more:
                    break
                data += more
            at_eof = not f.read(1)
    except FileNotFoundError:
        return offset, b""
    if not (final and at_eof):
        data = data[: data.rfind(b"\n") + 1]
    return offset + len(data), data


def scrape(data: bytes) -> bytes:
    """The lines of DATA that are {"experiment": ...} or {"monkey": ...} JSON objects."""
    out = []
    for match in _SCRAPED.finditer(data):
        end = data.find(b"\n", match.start())
        out.append(data[match.start() : end if end >= 0 else len(data)].strip() + b"\n")
    return b"".join(out)


def tail_offsets(events_path: str) -> list[int]:
    """[metrics.jsonl, stdout.log] offsets after the last metrics event of a job."""
    try:
        with open(events_path, "rb") as f:
            end = f.seek(0, os.SEEK_END)
            while end > 0:
                start = max(0, end - (1 << 20))
                f.seek(start)
                block = f.read(end - start + 200)  # overlap: a mark cut by the block edge
                found = list(_TAIL_MARK.finditer(block))
                if found:
                    return [int(found[-1].group(1)), int(found[-1].group(2))]
                end = start
    except FileNotFoundError:
        pass
    return [0, 0]
