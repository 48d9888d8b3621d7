"""The main node reclaims, on its own, the blobs no job names once the gc grace has passed
(issue 41, finding 8): an upload no job uses does not wait for an admin's `monkey gc`. It
is gc's blob part with gc's rules (``monkey.housekeeping.gc_blobs``), every
MONKEY_GC_EVERY seconds (default 600) with MONKEY_GC_GRACE (default 1h, gc's)."""

from __future__ import annotations

import logging
import os
import threading

from monkey.config import Home
from monkey.models import MonkeyError

log = logging.getLogger("monkey.server")
EVERY = 600.0


def every() -> float:
    """Seconds between two turns: MONKEY_GC_EVERY, default EVERY."""
    text = os.environ.get("MONKEY_GC_EVERY")
    try:
        value = float(text) if text else EVERY
    except ValueError:
        value = -1.0
    if not 0 < value < 1e9:
        raise MonkeyError(f"MONKEY_GC_EVERY={text!r} is not a number of seconds above 0")
    return value


class Reclaimer:
    """A thread of the server that runs ``gc_blobs`` every ``every()`` seconds."""

    def __init__(self, home: Home) -> None:
        from monkey.facade.storage import grace

        self.home, self.every, self.grace = home, every(), grace()  # bad values: at start
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="reclaim", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        from monkey.api import Monkey
        from monkey.housekeeping import gc_blobs

        while not self.stopped.wait(self.every):
            try:
                m = Monkey(self.home)
                try:
                    report = gc_blobs(m, self.grace)
                finally:
                    m.close()
            except Exception:  # noqa: BLE001 - a busy store, a full disk: the next turn
                log.exception("reclaiming unused blobs: will try again")
                continue
            if report.blobs:
                log.info(
                    "reclaimed %d blobs no job uses (%d bytes)", report.blobs, report.blob_bytes
                )

    def close(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=5)
