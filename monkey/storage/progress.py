"""A byte counter for uploads that draws a bar on a terminal once an upload is slow."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from monkey.storage.base import ProgressFn

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# Seconds an upload runs before its bar appears (quick uploads stay silent).
SHOW_AFTER = float(os.environ.get("MONKEY_PROGRESS_AFTER", "1"))


class _Bar:
    """Counts bytes from any thread; a rich bar on stderr after SHOW_AFTER seconds."""

    def __init__(self, total: int, label: str) -> None:
        self.total, self.label = total, label
        self.sent = 0
        self.start = time.monotonic()
        self.lock = threading.Lock()
        self.progress: Any = None
        self.task: Any = None

    def __call__(self, count: int) -> None:
        with self.lock:
            self.sent += count
            if self.progress is None and time.monotonic() - self.start >= SHOW_AFTER:
                self._show()
            if self.progress is not None:
                self.progress.update(self.task, completed=self.sent)

    def _show(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        self.progress = Progress(
            "{task.description}",
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=False,
        )
        self.task = self.progress.add_task(self.label, total=self.total)
        self.progress.start()

    def close(self) -> None:
        with self.lock:
            if self.progress is not None:
                self.progress.update(self.task, completed=self.sent)
                self.progress.stop()


@contextmanager
def upload_progress(
    total: int, progress: ProgressFn | None, label: str = "uploading"
) -> Iterator[ProgressFn]:
    """The callback an upload of TOTAL bytes reports to: PROGRESS when given, else a bar
    on stderr when it is a terminal, else nothing."""
    if progress is not None:
        yield progress
        return
    if not total or not sys.stderr.isatty():
        yield lambda _count: None
        return
    bar = _Bar(total, label)
    try:
        yield bar
    finally:
        bar.close()
