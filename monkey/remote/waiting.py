"""``Job.wait()`` for a job of a main node: its state polled through the API, riding out a
server restart or a dropped link (see ``monkey.remote.facade.Link``)."""

from __future__ import annotations

import time

from monkey.models import TERMINAL, State
from monkey.remote.client import Unreachable
from monkey.remote.facade import Link, RemoteMonkey

# Seconds a poll waits for its answer: a link down is noticed then, not at READ_TIMEOUT.
POLL_SILENCE = 15.0


def wait_for(
    remote: RemoteMonkey, juid: str, timeout: float | None = None, poll: float = 1.0
) -> State:
    """Block until job JUID ends (a retry pending is not an end) or is paused; return its
    state. The server is asked every POLL seconds; while it cannot be reached (it restarts,
    the link is down) the asks back off, one line saying so and one when it is back, up to
    ``facade.RESUME_FOR`` seconds (then Unreachable: the job goes on there)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    link = Link(remote, juid, "waiting", f"monkey info {juid}")
    while True:
        left = None if deadline is None else deadline - time.monotonic()
        try:
            state = remote.client.call_within(POLL_SILENCE, "get_job", juid).state
        except Unreachable:
            if left is not None and left <= 0:
                raise TimeoutError(
                    f"job {juid}: {remote.name} out of reach after {timeout}s"
                ) from None
            link.down(most=left)
            continue
        link.up()
        if state in TERMINAL or state == State.PAUSED:
            return state
        if left is not None and left < 0:
            raise TimeoutError(f"job {juid} still {state.value} after {timeout}s")
        time.sleep(poll if left is None else max(0.0, min(poll, left)))
