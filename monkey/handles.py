"""Handles on what the ``Monkey`` facade submitted: ``Job``, a job read fresh from the store."""

from __future__ import annotations

import time

from monkey.models import TERMINAL, Attempt, State
from monkey.models import Job as JobRecord

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Protocol

    from monkey.config import Home
    from monkey.logfiles import Follower
    from monkey.store import Store

    class Owner(Protocol):
        """What a handle needs of the facade that made it (``monkey.api.Monkey``)."""

        home: Home
        store: Store

        def store_follower(self) -> Follower: ...
        def get_job(self, ref: str) -> JobRecord: ...
        def logs(
            self,
            ref: str,
            stderr: bool = False,
            attempt: int | None = None,
            tail: int | None = None,
        ) -> bytes: ...
        def cancel(self, ref: str) -> State: ...
        def rerun(self, ref: str, *args: Any, **options: Any) -> Job: ...


class Job:
    """A handle on one job; its fields are read fresh from the store on each access."""

    def __init__(self, monkey: Owner, juid: str) -> None:
        self.monkey = monkey
        self.juid = juid

    def __repr__(self) -> str:
        return f"<Job {self.juid} {self.status.value}>"

    @property
    def record(self) -> JobRecord:
        return self.monkey.get_job(self.juid)

    @property
    def status(self) -> State:
        return self.record.state

    @property
    def exit_code(self) -> int | None:
        return self.record.exit_code

    def attempts(self) -> list[Attempt]:
        return self.monkey.store.attempts(self.juid)

    def wait(self, timeout: float | None = None, poll: float = 1.0) -> State:
        """Block until the job ends (a retry pending is not an end); return its state.

        Woken by each write to the store (see ``monkey.logfiles.Follower``), and at least
        every ``poll`` seconds. Keeps a core serving meanwhile (starting it again if it dies):
        without one the job would never end. A main node's job is polled through its API,
        riding out a restart or a dropped link (``RemoteMonkey.wait_job``)."""
        wait_job = getattr(self.monkey, "wait_job", None)
        if wait_job is not None:  # a main node's job (monkey.remote.facade.RemoteMonkey)
            return wait_job(self.juid, timeout, poll)
        from monkey.core.daemon import Keeper

        keeper = Keeper(self.monkey.home)
        deadline = None if timeout is None else time.monotonic() + timeout
        follower = None
        try:
            while True:
                state = self.status
                if state in TERMINAL or state == State.PAUSED:
                    return state
                keeper.check()
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left < 0:
                    raise TimeoutError(f"job {self.juid} still {state.value} after {timeout}s")
                if follower is None:
                    follower = self.monkey.store_follower()
                    continue  # look again: a change before the watch began is not missed
                follower.wait(poll if left is None else min(poll, left))
        finally:
            if follower is not None:
                follower.close()

    def logs(self, stderr: bool = False, tail: int | None = None) -> str:
        """The job's output so far (all attempts), or its last ``tail`` lines."""
        return self.monkey.logs(self.juid, stderr=stderr, tail=tail).decode(errors="replace")

    def cancel(self) -> State:
        return self.monkey.cancel(self.juid)

    def rerun(self, **options: Any) -> Job:
        """Queue this job again from its record (see ``Monkey.rerun``)."""
        return self.monkey.rerun(self.juid, **options)
