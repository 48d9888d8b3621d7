"""Reading a job's log files (one per attempt) by byte offset, in bounded pieces.

Memory stays bounded whatever a log's size: output is read in pieces of at most CHUNK bytes,
and a tail is found by reading backwards from the end in blocks. Bytes pass through untouched
(no decoding); a line is what ends with b"\\n" (or the last bytes, unterminated)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

from monkey.models import MonkeyError

CHUNK = 1 << 20  # largest piece read or yielded at once
BLOCK = 64 << 10  # step when searching for line ends


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
        bytes; at most ``limit`` bytes per file (None: up to its end)."""
        for path in paths:
            try:
                fh = open(path, "rb")
            except FileNotFoundError:
                continue
            with fh:
                if path not in self.offsets:
                    size = fh.seek(0, 2)
                    start = 0 if self.first_bytes is None else max(0, size - self.first_bytes)
                    self.offsets[path] = _line_start(fh, start, size)
                pos, left = self.offsets[path], limit
                fh.seek(pos)
                while left is None or left > 0:
                    piece = fh.read(CHUNK if left is None else min(CHUNK, left))
                    if not piece:
                        break
                    self.offsets[path] = pos + len(piece)
                    left = None if left is None else left - len(piece)
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
                fh = open(path, "rb")
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


def _newlines_back(fh: BinaryIO, end: int, need: int, skip_last: bool,
                   floor: int = 0) -> tuple[int, int]:
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
    and then all of stderr. Within the time between two marks, stdout comes first."""
    sizes = []
    for path in (stdout, stderr):
        try:
            sizes.append(path.stat().st_size)
        except FileNotFoundError:
            sizes.append(0)
    marks: list[tuple[int, int]] = []
    try:
        for line in order.read_text().splitlines():
            o, _, e = line.partition(" ")
            if o.isdigit() and e.isdigit():
                marks.append((int(o), int(e)))
    except FileNotFoundError:
        pass
    segments: list[Segment] = []
    done = [0, 0]
    for mark in [*marks, (sizes[0], sizes[1])]:
        for i, path in enumerate((stdout, stderr)):
            end = min(mark[i], sizes[i])  # a fetched copy may lag behind the marks
            if end > done[i]:
                segments.append((path, done[i], end))
                done[i] = end
    return segments


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
        with open(path, "rb") as fh:
            found, cut = _newlines_back(fh, end, need, skip_last=last, floor=start)
        need, last = need - found, False
        kept.append((path, cut if not need else start, end))
    return kept[::-1]


def read_segments(segments: Sequence[Segment]) -> Iterator[bytes]:
    """The bytes of SEGMENTS in order, in pieces of at most CHUNK bytes."""
    for path, start, end in segments:
        with open(path, "rb") as fh:
            fh.seek(start)
            left = end - start
            while left > 0:
                piece = fh.read(min(CHUNK, left))
                if not piece:
                    break
                left -= len(piece)
                yield piece
