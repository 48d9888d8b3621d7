"""The logs half of the ``Monkey`` facade: a job's output so far (all attempts or one,
stdout and stderr interleaved as written, a tail found from the end) and followed as it is
written, with where each piece comes from so a reader elsewhere resumes exactly."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from monkey.client_agent import rundir
from monkey.config import Home
from monkey.logfiles import LOGS, Follower, LogCursor
from monkey.models import TERMINAL, Attempt, MonkeyError, State
from monkey.store import Store

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class Logs:
    """The run folders' logs of MONKEY_HOME HOME's jobs, recorded in STORE."""

    def __init__(self, home: Home, store: Store) -> None:
        self.home, self.store = home, store

    def log_paths(
        self, ref: str, stderr: bool = False, attempt: int | None = None, setup: bool = False
    ) -> list[Path]:
        """The job's log files, one per attempt, oldest first (``setup``: the set-up logs)."""
        juid = self.store.resolve(ref)
        name = rundir.SETUP_LOG if setup else rundir.STDERR if stderr else rundir.STDOUT
        attempts = self.store.attempts(juid)
        if attempt is not None:
            attempts = [a for a in attempts if a.n == attempt]
            if not attempts:
                raise MonkeyError(f"job {juid} has no attempt {attempt}")
        return [self.home.run_dir(juid, a.n) / name for a in attempts if a.run_dir]

    def log_chunks(
        self,
        ref: str,
        stderr: bool = False,
        attempt: int | None = None,
        tail: int | None = None,
        setup: bool = False,
    ) -> Iterator[bytes]:
        """The job's output so far, attempts oldest first, in pieces of at most 1 MB; with
        ``tail``, only its last ``tail`` lines (found from the end: a huge log costs nothing)."""
        paths = self.log_paths(ref, stderr, attempt, setup)
        cursor = LogCursor()
        if tail is not None:
            cursor.skip_to_tail(paths, tail)
        return (piece for _, _, piece in cursor.read(paths))

    def logs(
        self, ref: str, stderr: bool = False, attempt: int | None = None, tail: int | None = None
    ) -> bytes:
        """The job's output so far, all attempts (or one), or its last ``tail`` lines."""
        return b"".join(self.log_chunks(ref, stderr, attempt, tail))

    def setup_logs(self, ref: str, attempt: int | None = None) -> bytes:
        """What preparing the job's environment printed (job.yml `run`), all attempts."""
        return b"".join(self.log_chunks(ref, attempt=attempt, setup=True))

    def output_chunks(
        self,
        ref: str,
        stream: str = "both",
        attempt: int | None = None,
        tail: int | None = None,
        setup: bool = False,
        marks: bool = True,
    ) -> Iterator[bytes]:
        """What the job printed so far, attempts oldest first, each marked when it has several
        (``── attempt 2 on HOST, after preempted ──``): stdout and stderr in the order they
        were written (``stream`` "stdout" or "stderr": one of them; ``setup``: the set-up
        log instead); with ``tail``, only the last ``tail`` lines of it all, unmarked."""
        from monkey.logfiles import (
            Segment,
            interleaved,
            log_size,
            read_segments,
            tail_segments,
        )

        juid = self.store.resolve(ref)
        attempts = [a for a in self.store.attempts(juid) if a.run_dir]
        shown = attempts if attempt is None else [a for a in attempts if a.n == attempt]
        if attempt is not None and not shown:
            raise MonkeyError(f"job {juid} has no attempt {attempt}")
        pieces: list[tuple[int, Segment | None]] = []
        for a in shown:
            folder = self.home.run_dir(juid, a.n)
            if setup or stream != "both":
                path = folder / (rundir.SETUP_LOG if setup else rundir.stream_log(stream))
                size = log_size(path) or 0
                segments = [(path, 0, size)] if size else []
            else:
                segments = interleaved(
                    folder / rundir.STDOUT, folder / rundir.STDERR, folder / rundir.ORDER
                )
            pieces += [(a.n, seg) for seg in segments] or (
                [(a.n, None)] if tail is None and not setup else []
            )
        if tail is not None:
            kept = tail_segments(
                [seg for _, seg in pieces if seg is not None], tail
            )  # no None with a tail
            pieces = [(n, seg) for (n, _), seg in zip(pieces[len(pieces) - len(kept) :], kept)]
        marked = None
        for n, seg in pieces:
            if marks and tail is None and len(shown) > 1 and n != marked:
                marked = n
                yield _attempt_mark(attempts, n)
            if seg is not None:
                yield from read_segments([seg])

    def store_follower(self) -> Follower:
        """A ``Follower`` woken by every write to the store (a job's state changed)."""
        follower = Follower()
        follower.watch(self.home.db.parent, (self.home.db.name, f"{self.home.db.name}-wal"))
        return follower

    def follow(
        self,
        ref: str,
        stderr: bool = False,
        tail: int | None = None,
        poll: float = 1.0,
        stream: str | None = None,
    ) -> Iterator[bytes]:
        """Yield the job's output as it is written, across attempts, until the job ends;
        with ``tail``, start from its last ``tail`` lines. ``stream`` "both" follows the
        set-up log, stdout and stderr together (each attempt after the first marked);
        "stdout" or "stderr" one of them (default: ``stderr`` picks).

        Woken by writes to the job's run folder and to the store (``monkey.logfiles.Follower``:
        inotify, no CPU while nothing is written), and at least every ``poll`` seconds. Keeps
        a core serving meanwhile (starting it again if it dies): without one the job would
        never end."""
        for piece in self.follow_pieces(
            ref, stream or ("stderr" if stderr else "stdout"), tail=tail, poll=poll
        ):
            if piece is not None and piece[0] != "start":
                yield piece[2]

    def follow_pieces(
        self,
        ref: str,
        stream: str = "both",
        tail: int | None = None,
        poll: float = 1.0,
        start: dict[str, Any] | None = None,
    ) -> Iterator[tuple[str, int, bytes] | None]:
        """``follow``'s output with where each piece comes from, so that a reader on another
        machine can resume exactly: (file, offset, piece) where file is "ATTEMPT/NAME" in
        the job's run folder, or ("mark", N, line) for the line that starts attempt N; None
        after each wait with nothing new (a reader's keep-alive). First ("start", 0, JSON):
        where reading begins, {"offsets": {file: offset}, "marked": [N...]} (a tail skips
        bytes and marks); START, that dict as a reader last had it, resumes a follow."""
        from monkey.core.daemon import Keeper

        names = LOGS if stream == "both" else (rundir.stream_log(stream),)
        juid = self.store.resolve(ref)
        keeper = Keeper(self.home)
        cursor = LogCursor()

        def paths(attempts: list[Attempt]) -> list[Path]:
            return [self.home.run_dir(juid, a.n) / name for a in attempts for name in names]

        def key(path: Path) -> str:
            return f"{path.parent.name}/{path.name}"

        marked = {1}
        if start is not None:
            known = {key(p): p for p in paths([a for a in self.store.attempts(juid) if a.run_dir])}
            cursor.offsets.update(
                {known[k]: int(v) for k, v in start.get("offsets", {}).items() if k in known}
            )
            marked.update(int(n) for n in start.get("marked", []))
        elif tail is not None:
            attempts = [a for a in self.store.attempts(juid) if a.run_dir]
            cursor.skip_to_tail(paths(attempts), tail)
            marked.update(a.n for a in attempts)
        begin = {
            "offsets": {key(p): n for p, n in cursor.offsets.items()},
            "marked": sorted(marked),
        }
        yield "start", 0, json.dumps(begin).encode()
        follower = None
        try:
            while True:
                job = self.store.get_job(juid)
                assert job is not None
                # Read after looking at the state, so output written before the end is never
                # missed.
                finished = job.state in TERMINAL or job.state == State.PAUSED
                if not finished:
                    keeper.check()
                attempts = [a for a in self.store.attempts(juid) if a.run_dir]
                for a in attempts:
                    if a.n not in marked and stream == "both":
                        marked.add(a.n)
                        yield "mark", a.n, _attempt_mark(attempts, a.n)
                    for path, offset, piece in cursor.read(paths([a])):
                        yield key(path), offset, piece
                if finished:
                    return
                if follower is None:  # only a follow that has to wait pays for watchdog
                    follower = self.store_follower()
                    continue  # read again: a write before the watch began is not missed
                if follower.watch(self.home.runs / juid, LOGS, recursive=True):  # once it exists
                    continue  # read again before waiting, as above
                follower.wait(poll)
                yield None
        finally:
            if follower is not None:
                follower.close()


def _attempt_mark(attempts: list[Attempt], n: int) -> bytes:
    """The line that starts attempt N's output: ``── attempt 2 on HOST, after preempted ──``."""
    i = next(i for i, a in enumerate(attempts) if a.n == n)
    after = attempts[i - 1].reason if i else None
    return (
        f"── attempt {n} on {attempts[i].instance}"
        + (f", after {after}" if after else "")
        + " ──\n"
    ).encode()
