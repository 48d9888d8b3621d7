"""A job's output, followed live across attempts, with search."""

from __future__ import annotations

import codecs
import time
from pathlib import Path

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Input, Log, Static
from textual.worker import get_current_worker

from monkey.api import LIVE, MonkeyError
from monkey.client_agent import rundir
from monkey.logfiles import LOGS, Follower, LogCursor
from monkey.tui.shared import SharedMonkey

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

POLL = 1.0  # seconds between looks at the log files when nothing is written (a new attempt)
FIRST_TAIL = 2 << 20  # at open, show at most this much of an attempt's existing output
MAX_READ = 4 << 20  # at most this much per file per look, so a flood never stalls a look
MAX_LINES = 50_000


class LogPane(Vertical):
    """Tails stdout (or stderr) of every attempt of a job; `/` searches, `n`/`N` jump."""

    BINDINGS = [
        Binding("e", "stream", "stdout/stderr"),
        Binding("slash", "search", "Search"),
        Binding("n", "next_match", "Next match"),
        Binding("N", "previous_match", "Previous match", show=False),
        Binding("f", "follow", "Follow"),
        Binding("escape", "close_search", "Close search", show=False),
    ]

    class Output(Message):
        """Text read from the log files by the tail worker."""

        def __init__(self, text: str, generation: int, again: bool = False) -> None:
            super().__init__()
            self.text = text
            self.generation = generation
            self.again = again  # the whole output again (a main node's job re-queued)

    class Trouble(Message):
        """Why the output cannot be followed (a main node out of reach for long)."""

        def __init__(self, text: str, generation: int) -> None:
            super().__init__()
            self.text = text
            self.generation = generation

    class Empty(Message):
        """Nothing in this stream yet; ``other`` bytes in the other one (stdout/stderr)."""

        def __init__(self, other: int, generation: int) -> None:
            super().__init__()
            self.other = other
            self.generation = generation

    def __init__(self, shared: SharedMonkey, juid: str, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.shared = shared
        self.juid = juid
        self.stderr = False
        self.generation = 0
        self.query_text = ""
        self.matches: list[int] = []
        self.match_index = -1
        self.other = 0  # bytes in the other stream while this one is empty
        self.follower: Follower | None = None  # the tail worker's, woken to stop it

    def compose(self) -> ComposeResult:
        yield Static(id="log-status")
        yield Log(max_lines=MAX_LINES, id="log-view")
        yield Input(
            placeholder="search the log: Enter finds, Esc closes", id="log-search", classes="hidden"
        )

    @property
    def view(self) -> Log:
        return self.query_one("#log-view", Log)

    def on_mount(self) -> None:
        self._restart()

    def on_unmount(self) -> None:
        if self.follower is not None:
            self.follower.wake()  # the worker, cancelled, ends now rather than at its next look

    def _restart(self) -> None:
        old = self.follower
        self.generation += 1
        self.view.clear()
        self.matches, self.match_index = [], -1
        self.other = 0
        tail = self._tail_remote if self.shared.remote else self._tail
        tail(self.juid, self.stderr, self.generation)  # cancels the old worker
        if old is not None:
            old.wake()  # which then ends at once
        self._show_status()

    def _show_status(self, extra: str = "") -> None:
        stream = "stderr" if self.stderr else "stdout"
        follow = "following" if self.view.auto_scroll else "paused (f follows)"
        if not self.view.line_count and not extra:
            extra = f"{stream} is empty"
            if self.other:
                extra += (
                    f"; {'stdout' if self.stderr else 'stderr'} has {self.other} bytes: press e"
                )
        self.query_one("#log-status", Static).update(
            f"{stream} of {self.juid}, all attempts · {follow}" + (f" · {extra}" if extra else "")
        )

    @work(thread=True, exclusive=True, group="tail")
    def _tail(self, juid: str, stderr: bool, generation: int) -> None:
        """Read new bytes of each attempt's log by offset and post them, woken by writes to
        the job's run folder and the store (and every POLL seconds); ends when cancelled."""
        worker = get_current_worker()
        monkey = self.shared.fresh()
        cursor = LogCursor(first_bytes=FIRST_TAIL)
        self.follower = follower = monkey.store_follower()
        decoders: dict[Path, codecs.IncrementalDecoder] = {}
        shown, other_seen = 0, -1
        other_name = rundir.STDOUT if stderr else rundir.STDERR
        try:
            while not worker.is_cancelled:
                parts = []
                paths = monkey.log_paths(juid, stderr=stderr)
                for path, offset, data in cursor.read(paths, limit=MAX_READ):
                    if path not in decoders:
                        decoders[path] = codecs.getincrementaldecoder("utf-8")("replace")
                        parts.append(_attempt_header(path, offset, len(cursor.offsets) > 1))
                    parts.append(decoders[path].decode(data))
                text = "".join(parts)
                shown += len(text)
                if text and not worker.is_cancelled:
                    self.post_message(self.Output(text, generation))
                elif not shown:  # say where the output is, e.g. a job that writes only stderr
                    other = sum(_size(p.with_name(other_name)) for p in paths)
                    if other != other_seen:
                        other_seen = other
                        self.post_message(self.Empty(other, generation))
                if (
                    not follower.watch(monkey.home.runs / juid, LOGS, recursive=True)
                    and not worker.is_cancelled
                ):
                    follower.wait(POLL)  # (read once more first when the watch just began)
        finally:
            follower.close()
            monkey.store.close()

    @work(thread=True, exclusive=True, group="tail")
    def _tail_remote(self, juid: str, stderr: bool, generation: int) -> None:
        """As ``_tail``, through a main node's follow stream (which resumes after a dropped
        link) from the last MAX_LINES lines, until the job ends; then looks every POLL
        seconds whether it ran again (a retry) to follow it afresh. Ends when cancelled
        (the stream has a keep-alive each second)."""
        worker = get_current_worker()
        monkey = self.shared.fresh()
        again = False
        try:
            while not worker.is_cancelled:
                decoders: dict[str, codecs.IncrementalDecoder] = {}
                pieces = monkey.follow(juid, stderr=stderr, tail=MAX_LINES, poll=POLL, files=True)
                for piece in pieces:
                    if worker.is_cancelled:
                        pieces.close()
                        return
                    if piece is None or piece[0] == "mark":  # a keep-alive (marks: not asked)
                        continue
                    name, offset, data = piece
                    head = ""
                    if name not in decoders:
                        decoders[name] = codecs.getincrementaldecoder("utf-8")("replace")
                        head = _attempt_header(Path(name), offset, len(decoders) > 1)
                    text = head + decoders[name].decode(data)
                    if text or again:
                        self.post_message(self.Output(text, generation, again))
                        again = False
                self._wait_to_run_again(monkey, juid, generation)
                again = True
        except MonkeyError as exc:
            if not worker.is_cancelled:
                self.post_message(self.Trouble(str(exc), generation))
        finally:
            self.shared.close(monkey)

    def _wait_to_run_again(self, monkey: Any, juid: str, generation: int) -> None:
        """Return once job JUID ran again since its follow ended (a retry may run and end
        between two looks: its attempts are counted) or the worker is cancelled. A main
        node out of reach meanwhile is said in the status line and looked at again."""
        worker = get_current_worker()
        ended: int | None = None
        while not worker.is_cancelled:
            try:
                job = monkey.get_job(juid)
            except MonkeyError as exc:
                self.post_message(self.Trouble(str(exc), generation))
            else:
                if job.state in LIVE or ended not in (None, job.attempts):
                    return
                ended = job.attempts
            time.sleep(POLL)

    @on(Trouble)
    def _on_trouble(self, message: Trouble) -> None:
        if message.generation == self.generation:
            self._show_status(message.text)

    @on(Output)
    def _on_output(self, message: Output) -> None:
        if message.generation == self.generation:
            if message.again:
                self.view.clear()
            empty = not self.view.line_count
            self.view.write(message.text)
            if empty:
                self._show_status()

    @on(Empty)
    def _on_empty(self, message: Empty) -> None:
        if message.generation == self.generation:
            self.other = message.other
            self._show_status()

    # -- keys ---------------------------------------------------------------------------

    def action_stream(self) -> None:
        self.stderr = not self.stderr
        self._restart()

    def action_follow(self) -> None:
        log = self.view
        log.auto_scroll = not log.auto_scroll
        if log.auto_scroll:
            log.scroll_end(animate=False)
        self._show_status()

    def action_search(self) -> None:
        box = self.query_one("#log-search", Input)
        box.remove_class("hidden")
        box.focus()

    @on(Input.Submitted, "#log-search")
    def _on_search(self, event: Input.Submitted) -> None:
        event.stop()
        self.query_text = event.value
        needle = event.value.lower()
        self.matches = [
            i for i, line in enumerate(self.view.lines) if needle and needle in line.lower()
        ]
        self.match_index = -1
        self.view.focus()
        if not needle:
            self._show_status()
        elif not self.matches:
            self._show_status(f"no line contains {event.value!r}")
        else:
            self.action_next_match()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "close_search":  # otherwise Esc goes on to the screen: back
            return self.query_one("#log-search", Input).has_focus
        return True

    def action_close_search(self) -> None:
        self.query_one("#log-search", Input).add_class("hidden")
        self.view.focus()

    def _jump(self, step: int) -> None:
        if not self.matches:
            self._show_status(
                f"no matches for {self.query_text!r}" if self.query_text else "press / to search"
            )
            return
        self.match_index = (self.match_index + step) % len(self.matches)
        line = self.matches[self.match_index]
        log = self.view
        log.auto_scroll = False
        log.scroll_to(y=max(0, line - 2), animate=False)
        self._show_status(
            f"match {self.match_index + 1}/{len(self.matches)} "
            f"for {self.query_text!r} at line {line + 1}: {log.lines[line][:60]}"
        )

    def action_next_match(self) -> None:
        self._jump(1)

    def action_previous_match(self) -> None:
        self._jump(-1)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _attempt_header(path: Path, offset: int, later: bool) -> str:
    """A line marking where an attempt's output begins (or that its start is cut)."""
    lines = []
    if later:
        lines.append(f"──── attempt {path.parent.name} ────\n")
    if offset:
        lines.append(f"[{offset} earlier bytes not shown; `monkey logs` prints them]\n")
    return "".join(lines)
