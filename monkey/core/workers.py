"""Driver calls off the core's loop.

A driver call may block for long (an instance booting, an SSH connect to a host that does
not answer, a large upload): each runs in a worker thread, and its outcome comes back to the
loop through a socket the core's selector watches. The outcome is then handled on the loop's
own thread, so the core alone writes the store. Calls for the same instance run one at a
time, in the order they were made.

The threads are daemon threads: a call hanging on a dead endpoint (until its own timeout,
minutes maybe) must not hold the core's process at exit. concurrent.futures' pool would:
its threads are joined when the interpreter exits, whatever ``shutdown(wait=False)`` says.
"""

from __future__ import annotations

import logging
import queue
import selectors
import socket
import threading
from collections.abc import Callable, Hashable
from typing import Any

log = logging.getLogger("monkey.core")

Outcome = tuple[Callable[[Any], None], Any]


class Workers:
    """A pool of threads for driver calls, whose outcomes the core handles in its loop."""

    def __init__(self, selector: selectors.BaseSelector, threads: int = 16) -> None:
        self._calls: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._max_threads = threads
        self._idle = threading.Semaphore(0)  # one per thread waiting for a call
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector = selector
        selector.register(self._wake_r, selectors.EVENT_READ, self)
        self._done: queue.SimpleQueue[tuple[Hashable, Outcome]] = queue.SimpleQueue()
        self._locks: dict[Hashable, threading.Lock] = {}
        self._busy: dict[Hashable, int] = {}  # calls in flight per key (loop thread only)

    def submit(
        self,
        key: Hashable,
        call: Callable[[], Any],
        then: Callable[[Any], None],
        failed: Callable[[BaseException], None],
    ) -> None:
        """Run CALL in a worker (after the calls made earlier for KEY); back in the loop,
        ``then(result)`` or ``failed(exception)``."""
        lock = self._locks.setdefault(key, threading.Lock())
        self._busy[key] = self._busy.get(key, 0) + 1

        def run() -> None:
            with lock:
                try:
                    outcome: Outcome = (then, call())
                except Exception as exc:  # noqa: BLE001 - handed to `failed` in the loop
                    outcome = (failed, exc)
            self._done.put((key, outcome))
            try:
                self._wake_w.send(b"x")
            except (BlockingIOError, OSError):
                pass  # the loop is awake already (or closing)

        self._calls.put(run)
        if not self._idle.acquire(blocking=False) and len(self._threads) < self._max_threads:
            thread = threading.Thread(
                target=self._work, daemon=True, name=f"monkey-driver-{len(self._threads)}"
            )
            thread.start()
            self._threads.append(thread)

    def _work(self) -> None:
        while (call := self._calls.get()) is not None:
            call()
            self._idle.release()

    def poke(self) -> None:
        """Wake the loop from any thread (it then reads what drivers learnt)."""
        try:
            self._wake_w.send(b"x")
        except (BlockingIOError, OSError):
            pass  # awake already (or closing)

    def busy(self, key: Hashable) -> bool:
        """Whether a call for KEY is in flight."""
        return self._busy.get(key, 0) > 0

    def drain(self) -> None:
        """Handle every outcome that came back (called by the loop when the socket wakes it)."""
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        while True:
            try:
                key, (handle, value) = self._done.get_nowait()
            except queue.Empty:
                return
            left = self._busy.get(key, 1) - 1
            if left:
                self._busy[key] = left
            else:  # no call of KEY in flight: its lock is made anew by the next one
                self._busy.pop(key, None)
                self._locks.pop(key, None)
            handle(value)

    def close(self) -> None:
        """Drop the calls not started; those in flight finish in the background (or die with
        the process), their outcomes dropped."""
        try:
            while True:
                self._calls.get_nowait()
        except queue.Empty:
            pass
        for _ in self._threads:
            self._calls.put(None)
        try:
            self._selector.unregister(self._wake_r)
        except (KeyError, ValueError):
            pass
        self._wake_r.close()
        self._wake_w.close()
