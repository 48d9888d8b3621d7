"""Reading a job's log files (one per attempt) by byte offset, in bounded pieces.

Memory stays bounded whatever a log's size: output is read in pieces of at most CHUNK bytes,
and a tail is found by reading backwards from the end in blocks. Bytes pass through untouched
(no decoding); a line is what ends with b"\\n" (or the last bytes, unterminated)."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from monkey.client_agent import rundir
from monkey.models import MonkeyError

TYPE_CHECKING = False
if TYPE_CHECKING:
    import logging
    from typing import Any, BinaryIO

CHUNK = 1 << 20  # largest piece read or yielded at once
BLOCK = 64 << 10  # step when searching for line ends


def open_log(path: str | os.PathLike[str]) -> BinaryIO:
    """PATH opened for reading; FileNotFoundError also when it is a link: a job may make its
    log a link to any file of the machine that reads it, which is never read for it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise FileNotFoundError(errno.ENOENT, "a link, not a log", str(path)) from None
    return open(fd, "rb")


def log_size(path: str | os.PathLike[str]) -> int | None:
    """The size of the log PATH; None when there is none, or a link (see ``open_log``)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    return info.st_size if stat.S_ISREG(info.st_mode) else None


class LogCursor:
    """Where a reader stands in each of a job's log files; ``read`` yields what they gained.

    A file seen for the first time is read from its start, or, with ``first_bytes``, from the
    first line start within its last ``first_bytes`` bytes."""

    def __init__(self, first_bytes: int | None = None) -> None:
        self.first_bytes = first_bytes
        self.offsets: dict[Path, int] = {}

    def read(
        self, paths: Sequence[Path], limit: int | None = None
    ) -> Iterator[tuple[Path, int, bytes]]:
        """(file, offset, piece) for the new bytes of each file in turn, pieces of at most CHUNK
        bytes; at most ``limit`` bytes per file (None: up to its end).

        Each file is read up to its size taken before any is read, the last file's first: a
        byte of an earlier file (stdout) written before a byte read of a later one (stderr)
        is then read too, in this call, so the two never come out in the wrong order."""
        sizes = {}
        for path in reversed(paths):
            size = log_size(path)
            if size is not None:
                sizes[path] = size
        for path in paths:
            if path not in sizes:
                continue
            size = sizes[path]
            try:
                fh = open_log(path)
            except FileNotFoundError:
                continue
            with fh:
                if path not in self.offsets:
                    start = 0 if self.first_bytes is None else max(0, size - self.first_bytes)
                    self.offsets[path] = _line_start(fh, start, size)
                pos = self.offsets[path]
                left = size - pos if limit is None else min(limit, size - pos)
                fh.seek(pos)
                while left > 0:
                    piece = fh.read(min(CHUNK, left))
                    if not piece:
                        break
                    self.offsets[path] = pos + len(piece)
                    left -= len(piece)
                    yield path, pos, piece
                    pos += len(piece)

    def skip_to_tail(self, paths: Sequence[Path], lines: int) -> None:
        """Place the cursor so that reading on yields only the last ``lines`` lines of the
        files' bytes taken together (a tail may span attempts)."""
        if lines < 0:
            raise MonkeyError(f"a tail must be 0 lines or more, not {lines}")
        need, last = lines, True  # a newline ending the very last line does not start one
        for path in reversed(paths):
            try:
                fh = open_log(path)
            except FileNotFoundError:
                continue
            with fh:
                size = fh.seek(0, 2)
                if need and size:
                    found, start = _newlines_back(fh, size, need, skip_last=last)
                    need, last = need - found, False
                    self.offsets[path] = start if not need else 0
                else:
                    self.offsets[path] = size


def _newlines_back(
    fh: BinaryIO, end: int, need: int, skip_last: bool, floor: int = 0
) -> tuple[int, int]:
    """Search fh[floor:end] backwards for up to ``need`` newlines: (how many were found, the
    offset just after the last one found, or ``floor``)."""
    pos = end
    if skip_last and end > floor:
        fh.seek(end - 1)
        if fh.read(1) == b"\n":
            pos -= 1
    found = 0
    while pos > floor:
        start = max(floor, pos - BLOCK)
        fh.seek(start)
        block = fh.read(pos - start)
        count = block.count(b"\n")
        if found + count < need:
            found += count
        else:
            i = len(block)
            while True:
                i = block.rindex(b"\n", 0, i)
                found += 1
                if found == need:
                    return found, start + i + 1
        pos = start
    return found, floor


def _line_start(fh: BinaryIO, pos: int, end: int) -> int:
    """The first line start at or after ``pos`` (``end`` when no line starts there)."""
    while 0 < pos < end:
        fh.seek(pos - 1)
        block = fh.read(min(BLOCK, end - pos + 1))
        i = block.find(b"\n")
        if i >= 0:
            return pos + i
        if len(block) < 2:  # the file shrank under us
            return end
        pos += len(block) - 1
    return pos


# A piece of one log file: (path, start offset, end offset).
Segment = tuple[Path, int, int]


def interleaved(stdout: Path, stderr: Path, order: Path) -> list[Segment]:
    """The pieces of STDOUT and STDERR in the order they were written, by the agent's marks
    in ORDER (lines "STDOUT_SIZE STDERR_SIZE"; see the agent); without marks, all of stdout
    and then all of stderr. Within the time between two marks, stdout comes first.

    Lines stay whole: a piece that the other file's piece follows ends at its last line end,
    and the rest of its line (a partial write, or a write seen half done) comes with its
    file's next piece, after the other file's lines (``_whole_lines``)."""
    sizes = [log_size(stdout) or 0, log_size(stderr) or 0]
    marks: list[tuple[int, int]] = []
    try:
        with open_log(order) as fh:
            text = fh.read()
        for line in text.split(b"\n"):  # damaged lines are skipped
            o, _, e = line.partition(b" ")
            if o.isdigit() and e.isdigit() and len(line) < 40:  # ASCII digits, int() takes
                marks.append((int(o), int(e)))
    except FileNotFoundError:
        pass
    files = (stdout, stderr)
    pieces: list[list[int]] = []  # [file index, start, end]
    done = [0, 0]
    for mark in [*marks, (sizes[0], sizes[1])]:
        for i in (0, 1):
            end = min(mark[i], sizes[i])  # a fetched copy may lag behind the marks
            if end <= done[i]:
                continue
            if pieces and pieces[-1][0] == i:
                pieces[-1][2] = end  # one piece while one file grew
            else:
                pieces.append([i, done[i], end])
            done[i] = end
    return [(files[i], start, end) for i, start, end in _whole_lines(files, pieces)]


def _whole_lines(files: tuple[Path, Path], pieces: list[list[int]]) -> list[list[int]]:
    """PIECES ([file index, start, end]) with each piece followed by the other file's cut
    after its last line end; the cut-off rest starts that file's next piece (or, with none,
    comes last). A line of over BLOCK bytes may still be cut: finding its start would read
    back through all of it."""
    held: list[list[int] | None] = [None, None]  # a file's cut-off rest
    fds: list[int | None] = [None, None]
    out = []
    try:
        for k, (i, start, end) in enumerate(pieces):
            rest, held[i] = held[i], None
            if rest is not None:
                start = rest[1]
            if k + 1 < len(pieces) and pieces[k + 1][0] != i:
                fd = fds[i]
                if fd is None:
                    fd = fds[i] = os.open(files[i], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                cut = _line_end_before(fd, start, end)
                if cut is not None and cut < end:
                    held[i], end = [i, cut, end], cut
            if end > start:
                out.append([i, start, end])
    finally:
        for fd in fds:
            if fd is not None:
                os.close(fd)
    return out + [rest for rest in held if rest is not None]


def _line_end_before(fd: int, start: int, end: int) -> int | None:
    """The offset just after the last newline of the file's [start, end) (START with none),
    or None when its last BLOCK bytes have none and it is longer."""
    if os.pread(fd, 1, end - 1) == b"\n":
        return end
    floor = max(start, end - BLOCK)
    i = os.pread(fd, end - floor, floor).rfind(b"\n")
    if i >= 0:
        return floor + i + 1
    return start if floor == start else None


def tail_segments(segments: list[Segment], lines: int) -> list[Segment]:
    """The parts of SEGMENTS that hold the last LINES lines of them taken together (found
    from the end: a huge log costs nothing)."""
    if lines < 0:
        raise MonkeyError(f"a tail must be 0 lines or more, not {lines}")
    kept: list[Segment] = []
    need, last = lines, True  # a newline ending the very last line does not start one
    for path, start, end in reversed(segments):
        if not need:
            break
        with open_log(path) as fh:
            found, cut = _newlines_back(fh, end, need, skip_last=last, floor=start)
        need, last = need - found, False
        kept.append((path, cut if not need else start, end))
    return kept[::-1]


def read_segments(segments: Sequence[Segment]) -> Iterator[bytes]:
    """The bytes of SEGMENTS in order, in pieces of at most CHUNK bytes."""
    for path, start, end in segments:
        with open_log(path) as fh:
            fh.seek(start)
            left = end - start
            while left > 0:
                piece = fh.read(min(CHUNK, left))
                if not piece:
                    break
                left -= len(piece)
                yield piece


# Events that mean something was written (not a reader opening or closing a file: the
# follower's own reads must not wake it).
_WRITES = (
    "FileModifiedEvent",
    "FileCreatedEvent",
    "FileMovedEvent",
    "FileDeletedEvent",
    "FileClosedEvent",
)
LOGS = rundir.LOGS  # what a job's followers read


class Follower:
    """Wakes a reader when files it follows are written, instead of a fixed poll: inotify
    through watchdog on Linux (the platform's native observer elsewhere, watchdog's polling
    observer where there is none or inotify is out of instances or watches). No CPU is spent
    while nothing is written. watchdog is imported here, when a follow first has to wait,
    never by one-shot commands.

    ``watch(folder, names)`` follows the files called NAMES in FOLDER, or anywhere under it
    with ``recursive`` (a job's run folder: its attempts' logs, not their heartbeats)."""

    def __init__(self) -> None:
        import threading
        import warnings

        from watchdog.events import FileSystemEventHandler

        # watchdog warns when a folder it adds by itself (a new attempt's) is added twice
        warnings.filterwarnings("ignore", message="Callback with id", category=RuntimeWarning)
        self._changed = threading.Event()
        self._watched: dict[Path, tuple[frozenset[str], bool]] = {}
        self._observer = _observer()
        follower = self

        class Handler(FileSystemEventHandler):
            def on_any_event(self, event: Any) -> None:
                paths = (event.src_path, getattr(event, "dest_path", "") or "")
                if type(event).__name__ in _WRITES and any(
                    follower._wanted(os.fsdecode(p)) for p in paths if p
                ):
                    follower._changed.set()

        self._handler = Handler()

    def _wanted(self, path: str) -> bool:
        """Whether PATH is one of the files followed."""
        folder, name = os.path.split(path)
        for root, (names, recursive) in self._watched.items():
            if name in names and (
                folder == str(root) or recursive and folder.startswith(f"{root}{os.sep}")
            ):
                return True
        return False

    def watch(self, folder: Path, names: Iterable[str], recursive: bool = False) -> bool:
        """Follow the files called NAMES in FOLDER (anywhere under it with RECURSIVE). Whether
        it began now (read once more before waiting: a write just before was not seen); False
        when it was followed already or does not exist yet (call again later)."""
        if folder in self._watched or not folder.is_dir():
            return False
        self._watched[folder] = (frozenset(names), recursive)
        try:
            self._observer.schedule(
                self._handler, str(folder), recursive=recursive, event_filter=_event_types()
            )
            if not self._observer.is_alive():
                self._observer.start()
        except OSError:  # out of inotify instances or watches: the polling observer instead
            self._fallback()
        return True

    def _fallback(self) -> None:
        """Follow every folder with watchdog's polling observer (a look every POLL_FALLBACK
        seconds)."""
        from watchdog.observers.polling import PollingObserver

        if self._observer.is_alive():
            self._observer.stop()
        self._observer = PollingObserver(timeout=POLL_FALLBACK)
        self._observer.daemon = True
        for folder, (_, recursive) in self._watched.items():
            if folder.is_dir():
                self._observer.schedule(self._handler, str(folder), recursive=recursive)
        self._observer.start()

    def wait(self, timeout: float) -> bool:
        """Block until something followed is written (or ``wake``), at most TIMEOUT seconds;
        whether it was."""
        changed = self._changed.wait(timeout)
        self._changed.clear()
        return changed

    def wake(self) -> None:
        """End a ``wait`` now (e.g. a reader that stops)."""
        self._changed.set()

    def close(self) -> None:
        """Stop watching (the observer's thread ends)."""
        self._changed.set()
        if self._observer.is_alive():
            self._observer.stop()
            self._observer.join(timeout=5)

    def __enter__(self) -> Follower:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


POLL_FALLBACK = 0.1  # seconds between looks of the polling observer (no inotify watch left)


def _quiet_stop(record: logging.LogRecord) -> bool:
    """Drop watchdog's error for an event read as its observer stops (benign: nothing is
    followed any more), which would reach stderr through logging's last resort."""
    return "called when the thread is inactive" not in record.getMessage()


def _observer() -> Any:
    import logging  # (watchdog loads it anyway)

    from watchdog.observers import Observer

    inotify_log = logging.getLogger("watchdog.observers.inotify")
    if _quiet_stop not in inotify_log.filters:
        inotify_log.addFilter(_quiet_stop)
    observer = Observer()
    observer.daemon = True
    return observer


def _event_types() -> list[Any]:
    from watchdog import events

    return [getattr(events, name) for name in _WRITES]
