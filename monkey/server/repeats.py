"""The server log's guard against floods: a warning or an error like one written less than
WINDOW seconds ago is counted, not written, so no stream of requests (a bad request sent
500 times a second, a failing route hit in a loop) can grow server.log without bound. The
next one like it after the window is written with the count ("... (repeated N times since
12:41:05)"), and so is each count still pending when the server stops."""

from __future__ import annotations

import logging
import threading
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import TracebackType

WINDOW = 60.0
MOST = 1000  # kinds of message remembered at once


class Repeats(logging.Filter):
    """A handler's filter. Two records are alike when the same logger wrote the same
    message (its template, before its arguments) at the same level, with the same kind of
    exception raised from the same line, if any."""

    def __init__(self, window: float = WINDOW) -> None:
        super().__init__()
        self.window = window
        self._seen: dict[tuple[object, ...], list[float]] = {}  # key -> [written at, held]
        self._last: dict[tuple[object, ...], logging.LogRecord] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        key = _key(record)
        with self._lock:
            seen = self._seen.get(key)
            # (record.created is the wall clock's: a negative span, a clock stepped back, is
            # no repeat within the window)
            if seen is not None and 0 <= record.created - seen[0] < self.window:
                seen[1] += 1
                self._last[key] = record
                return False
            if len(self._seen) >= MOST:
                self._forget(record.created)
            held = int(seen[1]) if seen else 0
            since = seen[0] if seen else 0.0
            self._seen[key] = [record.created, 0]
            self._last.pop(key, None)
        if held:
            record.msg = f"{str(record.msg).rstrip()} (repeated {held} times since {_clock(since)})"
        return True

    def _forget(self, now: float) -> None:
        """Drop the kinds whose window has passed with nothing held (all, when none has)."""
        old = [k for k, s in self._seen.items() if now - s[0] >= self.window and not s[1]]
        for key in old or list(self._seen):
            self._seen.pop(key, None)
            self._last.pop(key, None)

    def pending(self) -> list[logging.LogRecord]:
        """A record for each kind with repeats not yet said (the last of them, its message
        saying how many), and forget them: what to write when the server stops."""
        with self._lock:
            said = []
            for key, record in self._last.items():
                held, since = int(self._seen[key][1]), self._seen[key][0]
                record.msg = (
                    f"{str(record.msg).rstrip()} (repeated {held} times since {_clock(since)})"
                )
                record.exc_info = record.exc_text = None  # its traceback was written once
                said.append(record)
                self._seen[key][1] = 0
            self._last.clear()
            return said


def install(logger: logging.Logger) -> Repeats:
    """A Repeats on each of LOGGER's handlers (the root's: uvicorn's records come too)."""
    repeats = Repeats()
    for handler in logger.handlers:
        handler.addFilter(repeats)
    return repeats


def flush(logger: logging.Logger, repeats: Repeats) -> None:
    """Write the counts REPEATS still holds through LOGGER's handlers."""
    for record in repeats.pending():
        for handler in logger.handlers:
            handler.handle(record)  # (through the filter: a fresh kind, written)


def _key(record: logging.LogRecord) -> tuple[object, ...]:
    where: tuple[object, ...] = ()
    if record.exc_info and record.exc_info[1] is not None:
        tb: TracebackType | None = record.exc_info[2]
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        where = (
            type(record.exc_info[1]).__name__,
            tb.tb_frame.f_code.co_filename if tb else None,
            tb.tb_lineno if tb else None,
        )
    return (record.name, record.levelno, str(record.msg), *where)


def _clock(at: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at))
