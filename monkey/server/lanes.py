"""The threads the server's blocking work runs in. Bulk work (recording a submission,
unpacking and hashing uploads, checking which blobs are stored) takes at most BULK threads
at once: twenty laptops submitting 5,000-file projects keep two threads busy, and a
`list jobs` or a log read never queues for the interpreter behind all of them."""

from __future__ import annotations

import anyio

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

BULK = 2
_bulk: anyio.CapacityLimiter | None = None


async def in_bulk(func: Callable[..., Any], *args: Any) -> Any:
    """FUNC(*ARGS) in one of the bulk threads (waiting for one to be free)."""
    global _bulk
    if _bulk is None:  # made in the event loop it serves
        _bulk = anyio.CapacityLimiter(BULK)
    return await anyio.to_thread.run_sync(func, *args, limiter=_bulk)
