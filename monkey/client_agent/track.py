"""The in-job API: ``monkey.log``, ``log_params``, ``summary``, ``flush``, ``checkpoint_dir``
and ``preempted``, and the one writer of the metrics file the agent tails.

Standard library only and cheap to import: it runs inside the user's training script, and
it is shipped with the agent to every worker. There a job that finds no ``monkey`` of its
own imports this module as ``monkey`` (see ``shim.py``); it is always importable as
``monkey_track`` too. The full package's ``monkey.log`` is this module's.
``log`` only appends a tuple to a list; a daemon thread writes what has been logged to the
metrics file every ``FLUSH_EVERY`` seconds. The file holds one JSON value per line:

- ``{"columns": {"names": [...], "n": B, "s": B, "v": B, "t": B}}``: a batch of at most
  ``BATCH`` points as columns, each B the base64 of a little-endian array: ``n`` uint16
  indexes into ``names``, ``s`` int64 steps (``NO_STEP`` for none), ``v`` float64 values,
  ``t`` int64 wall-clock nanoseconds. Columns cost a tenth of JSON numbers to write and
  to read, which is what lets a million points reach SQLite in a few seconds.
- ``[[name, step, value, wall_ns], ...]``: the same as plain JSON (for jobs written in
  other languages; monkey reads both).
- ``{"params": {...}}`` and ``{"summary": {...}}``. Under monkey the file is ``$MONKEY_RUN_DIR/metrics.jsonl``, which
the agent tails; elsewhere ``./monkey-metrics.jsonl`` (or ``$MONKEY_METRICS_FILE``).
What is buffered is written at normal exit, on an uncaught exception and on SIGTERM; a
SIGKILL loses at most the last ``FLUSH_EVERY`` seconds; a forked child writes each point
as it is logged (see ``_after_fork``).
"""

from __future__ import annotations

import atexit
import base64
import json
import math
import os
import signal
import sys
import threading
import time
from array import array
from collections.abc import Mapping
from operator import itemgetter
from pathlib import Path

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["checkpoint_dir", "flush", "log", "log_params", "preempted", "summary"]

FLUSH_EVERY = 0.5
FILE_NAME = "metrics.jsonl"
BATCH = 50_000
NO_STEP = -(1 << 63)

_points: list[tuple[str, int | None, float, int]] = []
_append = _points.append
_now = time.time_ns
_lock = threading.Lock()  # one writer at a time: the flusher, atexit or a signal handler
_wake = threading.Event()
_state: dict[str, Any] = {"started": False, "signal": 0}
_NAME, _STEP, _VALUE, _WALL = (itemgetter(i) for i in range(4))


def metrics_path() -> str:
    """Where this process writes its metrics: the run directory under monkey."""
    run_dir = os.environ.get("MONKEY_RUN_DIR")
    if run_dir:
        return os.path.join(run_dir, FILE_NAME)
    return os.environ.get("MONKEY_METRICS_FILE") or "monkey-metrics.jsonl"


def checkpoint_dir() -> Path:
    """The job's checkpoint folder, kept across attempts; ./checkpoints outside monkey,
    made with a ``.gitignore`` of ``*`` (as a virtualenv's), so that neither git nor a later
    job's code snapshot takes in what a run outside monkey saved there."""
    given = os.environ.get("MONKEY_CHECKPOINT_DIR")
    path = Path(given or "checkpoints")
    if not given and not path.exists():
        path.mkdir(parents=True, exist_ok=True)
        with open(path / ".gitignore", "w", encoding="utf-8") as f:
            f.write("# made by monkey.checkpoint_dir() outside a job: not code\n*\n")
    path.mkdir(parents=True, exist_ok=True)
    return path


def preempted() -> bool:
    """Whether a spot/preemption notice is stopping this job (its SIGTERM says "save and
    exit": the job is re-queued and its checkpoint folder restored). ``MONKEY_PREEMPTED=1``
    in the environment, or the agent's ``preempted`` mark in the run folder."""
    if os.environ.get("MONKEY_PREEMPTED") == "1":
        return True
    run_dir = os.environ.get("MONKEY_RUN_DIR")
    if not run_dir:
        return False
    return os.path.exists(os.path.join(run_dir, "preempted"))


def log(name: str | Mapping[str, Any], value: Any = None, step: int | None = None) -> None:
    """Record ``value`` of metric ``name`` (at ``step``), or every item of a dict."""
    try:  # free unless it raises: then the message names the metric and the value
        if step is not None:
            step = int(step)
        if name.__class__ is str:
            _append((name, step, float(value), _now()))
        else:
            _log_many(name, value, step)
    except (TypeError, ValueError) as exc:
        raise _bad_call(name, value, step, exc) from None
    if _state["started"] is not True:
        _after_log()


def _log_many(values: Any, value: Any, step: int | None) -> None:
    if not isinstance(values, Mapping):
        raise TypeError(f"monkey.log: name must be a string or a dict, got {type(values).__name__}")
    if value is not None:
        raise TypeError("monkey.log({...}) takes no value; pass step= by name")
    wall = _now()
    for key, item in values.items():
        if not isinstance(key, str) or not key:
            raise TypeError(f"monkey.log: metric names must be non-empty strings, got {key!r}")
        _append((key, step, float(item), wall))


def _bad_call(name: Any, value: Any, step: Any, exc: Exception) -> Exception:
    """EXC (a TypeError or ValueError) reworded to say which part of the call is wrong."""
    if str(exc).startswith("monkey.log"):
        return exc
    kind = TypeError if isinstance(exc, TypeError) else ValueError
    if step is not None and not isinstance(step, int):
        return kind(f"monkey.log: step must be a whole number, got {step!r}")
    for key, item in name.items() if isinstance(name, Mapping) else [(name, value)]:
        try:
            float(item)
        except (TypeError, ValueError):
            return kind(f"monkey.log: the value of {key!r} must be a number, got {item!r}")
    return kind(f"monkey.log: {exc}")


def log_params(params: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
    """Record hyper-parameters on the job (nested dicts are kept; compare flattens them)."""
    _write_record("params", {**(params or {}), **kwargs})


def summary(values: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
    """Record final values of the run (shown by compare next to metrics)."""
    _write_record("summary", {**(values or {}), **kwargs})


def flush() -> None:
    """Write every buffered point now."""
    with _lock:
        _flush_locked()
    _end_if_signalled()


def _flush_locked() -> None:
    count = len(_points)
    if count:
        batch = _points[:count]
        del _points[:count]  # appends racing with us land after COUNT: nothing is lost
        _write("".join(encode_columns(batch[i : i + BATCH]) for i in range(0, count, BATCH)))


def encode_columns(points: list[tuple[str, int | None, float, int]]) -> str:
    """One ``{"columns": ...}`` line for POINTS."""
    index: dict[str, int] = {}
    n = array("H", [index.setdefault(name, len(index)) for name in map(_NAME, points)])
    steps = list(map(_STEP, points))
    if None in steps:
        steps = [NO_STEP if step is None else step for step in steps]
    columns = [
        n,
        array("q", steps),
        array("d", map(_VALUE, points)),
        array("q", map(_WALL, points)),
    ]
    if sys.byteorder == "big":
        for column in columns:
            column.byteswap()
    n64, s64, v64, t64 = (base64.b64encode(c.tobytes()).decode() for c in columns)
    body = {"names": list(index), "n": n64, "s": s64, "v": v64, "t": t64}
    return json.dumps({"columns": body}, separators=(",", ":")) + "\n"


def _write_record(kind: str, values: dict[str, Any]) -> None:
    try:
        line = json.dumps({kind: values}, separators=(",", ":"), default=_plain)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"monkey.{'log_params' if kind == 'params' else kind}: {exc}") from None
    with _lock:
        _flush_locked()  # points logged before it stay before it
        _write(line + "\n")
    _end_if_signalled()
    if _state["started"] is not True:
        _after_log()


def _plain(value: Any) -> Any:
    """numpy scalars and the like as plain Python values."""
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    raise TypeError(f"{value!r} is not JSON serialisable")


def _write(text: str) -> None:
    path = metrics_path()
    data = text.encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    try:
        while data:
            data = data[os.write(fd, data) :]
    finally:
        os.close(fd)


def _flusher() -> None:
    while True:
        _wake.wait(FLUSH_EVERY)
        try:
            flush()
        except OSError as exc:  # a full disk must not kill the training
            os.write(2, f"monkey.log: cannot write metrics: {exc}\n".encode())


def _on_sigterm(signum: int, frame: Any) -> None:
    """Write what is buffered, then die of the signal as if we had not caught it."""
    signal.signal(signum, signal.SIG_DFL)
    if _lock.acquire(timeout=2.0):
        try:
            _flush_locked()
        finally:
            _lock.release()
        os.kill(os.getpid(), signum)
    else:  # interrupted inside a write of our own: it ends the process once written
        _state["signal"] = signum


def _end_if_signalled() -> None:
    signum = _state["signal"]
    if signum:
        with _lock:
            _flush_locked()
        os.kill(os.getpid(), signum)


def _before_fork() -> None:
    """Hold SIGTERM in the forking thread while our handler is installed: a SIGTERM that
    reaches the child before its ``_after_fork`` would find a Python handler whose flag
    the child's interpreter clears after a fork, and be lost (``Pool.terminate()`` of a
    worker the parent started a moment earlier waited for it forever, about 1% of runs
    under load). Held, it is delivered once the child has SIGTERM's default action back
    (and in the parent, to our handler, once the fork is done)."""
    if signal.getsignal(signal.SIGTERM) is _on_sigterm:
        before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        _state["held"] = signal.SIGTERM not in before


def _after_fork_in_parent() -> None:
    if _state.pop("held", False):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


def _after_fork() -> None:
    """A forked child logs on its own: the parent's buffer is the parent's to write, and
    locks held by the parent's threads at the fork are never released in the child.

    It also gets SIGTERM's default action back. A Python handler runs only when the main
    thread runs Python: a child blocked in C (a Pool worker waiting on its task queue's
    lock) whose SIGTERM lands on another thread, or just before it blocks, never runs it,
    and `Pool.terminate()` then waits for it forever. So that a SIGTERM loses nothing, a
    forked child writes each point as it is logged (``FORKED``): a Pool's workers are
    ended by one after every task."""
    global _lock, _wake
    del _points[:]
    _lock, _wake = threading.Lock(), threading.Event()
    _state["started"] = FORKED
    if signal.getsignal(signal.SIGTERM) is _on_sigterm:
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        except ValueError:  # not the main interpreter: nothing of ours to undo
            pass
    if _state.pop("held", False):  # a SIGTERM sent meanwhile ends the child now
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


os.register_at_fork(
    before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork
)


FORKED = "forked"  # _state["started"] in a forked child: every point written at once


def _after_log() -> None:
    """After a point or record was logged in a process not yet started (the flusher, the
    exit and SIGTERM hooks), or in a forked child (written now)."""
    if _state["started"] is FORKED:
        flush()
    else:
        _start()


def _start() -> None:
    _state["started"] = True
    atexit.register(flush)
    mp_util = sys.modules.get("multiprocessing.util")
    if mp_util is not None:  # a forked multiprocessing child ends in os._exit, not atexit
        mp_util.Finalize(None, flush, exitpriority=100)
    threading.Thread(target=_flusher, name="monkey-log-flush", daemon=True).start()
    if threading.current_thread() is threading.main_thread():
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _on_sigterm)
