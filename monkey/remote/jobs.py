"""``RemoteJob``: the ``Job`` handle of a job on a main node, its fields read through the API
and its ``wait()`` polling the server, riding out a restart or a dropped link."""

from __future__ import annotations

import time

from monkey.handles import Job
from monkey.models import TERMINAL, State
from monkey.remote.client import Unreachable
from monkey.remote.facade import Link

# Seconds a poll waits for its answer: a link down is noticed then, not at READ_TIMEOUT.
POLL_SILENCE = 15.0

TYPE_CHECKING = False
if TYPE_CHECKING:
    from monkey.models import Job as JobRecord
    from monkey.remote.facade import RemoteMonkey


class RemoteJob(Job):
    """A handle on one job of a main node (``RemoteMonkey.job``)."""

    monkey: RemoteMonkey  # type: ignore[assignment]

    @property
    def record(self) -> JobRecord:
        return self.monkey.client.call_within(POLL_SILENCE, "get_job", self.juid)

    def wait(self, timeout: float | None = None, poll: float = 1.0) -> State:
        """Block until the job ends (a retry pending is not an end) or is paused; return its
        state. The server is asked every ``poll`` seconds; while it cannot be reached (it
        restarts, the link is down) the asks back off, one line saying so and one when it
        is back, up to ``RESUME_FOR`` seconds (then Unreachable: the job goes on there)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        link = Link(self.monkey, self.juid, "waiting", f"monkey info {self.juid}")
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            try:
                state = self.status
            except Unreachable:
                if left is not None and left <= 0:
                    raise TimeoutError(
                        f"job {self.juid}: {self.monkey.name} out of reach after {timeout}s"
                    ) from None
                link.down(most=left)
                continue
            link.up()
            if state in TERMINAL or state == State.PAUSED:
                return state
            if left is not None and left < 0:
                raise TimeoutError(f"job {self.juid} still {state.value} after {timeout}s")
            time.sleep(poll if left is None else max(0.0, min(poll, left)))

    def logs(self, stderr: bool = False, tail: int | None = None) -> str:
        """The job's output so far (all attempts), or its last ``tail`` lines."""
        stream = "stderr" if stderr else "stdout"
        chunks = self.monkey.output_chunks(self.juid, stream=stream, tail=tail)
        return b"".join(chunks).decode(errors="replace")
