"""The orphan watch: an instance monkey created powers itself off (its cloud then terminates
it) when no core has looked after it for a while. Standard library only (see agent.py)."""

from __future__ import annotations

import subprocess
import time

from monkey.client_agent.common import RequestError, log, one_line

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

# How an orphaned cloud instance powers itself off (its cloud then terminates it).
DEFAULT_SHUTDOWN = "sudo -n shutdown -h now || shutdown -h now || poweroff"
SHUTDOWN_RETRY = 300.0  # seconds before a shutdown that left the machine up is tried again


class OrphanWatch:
    """Powers off a cloud instance monkey created once it is orphaned: no job and no request
    from its core for ``timeout`` seconds (the core's laptop sleeps, its main node died), so
    that it stops billing (EC2 terminates it: it was launched with shutdown behaviour
    ``terminate``; GCE stops it, and the core deletes it when it comes back).

    Only the core arms it, in a sync, start or ping carrying ``orphan: {timeout, command}``,
    and only for instances it created: an agent on this machine, an SSH host or a Slurm
    node is never armed and never shuts anything down."""

    def __init__(self) -> None:
        self.timeout = 0.0  # 0: not armed
        self.command = DEFAULT_SHUTDOWN
        self.contact = time.monotonic()  # the core's last request
        self.idle_since: float | None = time.monotonic()  # no job since (None: one runs)
        self.tried_at: float | None = None  # the last shutdown tried (monotonic)

    @property
    def armed(self) -> bool:
        return self.timeout > 0

    def arm(self, spec: Any) -> None:
        """Take the core's ``orphan`` field (None: leave things as they are)."""
        if spec is None:
            return
        if not isinstance(spec, dict):
            raise RequestError("orphan must be an object {timeout, command}")
        timeout, command = spec.get("timeout"), spec.get("command") or DEFAULT_SHUTDOWN
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0:
            raise RequestError(f"orphan timeout must be a number of seconds, got {timeout!r}")
        if not isinstance(command, str):
            raise RequestError("orphan command must be a shell command line")
        if (float(timeout), command) != (self.timeout, self.command):
            log(
                f"orphan watch: powering the machine off after {timeout:g}s with no job and no "
                f"request from the core ({command})"
                if timeout
                else "orphan watch: off"
            )
        self.timeout, self.command = float(timeout), command

    def deadline(self) -> float | None:
        """When the machine is orphaned if nothing happens (None: not armed, or a job runs)."""
        if not self.armed or self.idle_since is None:
            return None
        since = max(self.contact, self.idle_since)
        if self.tried_at is not None and self.tried_at >= since:
            return self.tried_at + SHUTDOWN_RETRY
        return since + self.timeout

    def check(
        self, busy: bool, now: float, leave: Callable[[str], str | None] | None = None
    ) -> None:
        """Note whether a job runs (BUSY); run the shutdown command once the machine has
        been orphaned for long enough. An open connection that says nothing is no contact
        (the link of a core on a laptop that sleeps stays open). LEAVE(why) first puts what
        the core has not fetched in the bucket, or says why the machine must stay up."""
        if busy:
            self.idle_since = None
            return
        if self.idle_since is None:
            self.idle_since = now
        due = self.deadline()
        if due is None or now < due:
            return
        self.tried_at = now
        why = (
            f"no job for {now - self.idle_since:.0f}s and no word from the core for "
            f"{now - self.contact:.0f}s (orphan_timeout {self.timeout:g}s)"
        )
        held = leave(why) if leave is not None else None
        if held:
            log(
                f"not powering the machine off: {held}; looking again in {SHUTDOWN_RETRY:.0f}s "
                "or once the core is back"
            )
            return
        log(
            f"orphaned: no job for {now - self.idle_since:.0f}s and no request from the core "
            f"for {now - self.contact:.0f}s (orphan_timeout {self.timeout:g}s): powering the "
            f"machine off so that its cloud terminates it: {self.command}"
        )
        try:
            done = subprocess.run(
                ["/bin/sh", "-c", self.command],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=120,
                start_new_session=True,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            log(
                f"the shutdown command failed: {one_line(e)}; trying again in {SHUTDOWN_RETRY:.0f}s"
            )
            return
        said = " ".join((done.stdout + done.stderr).decode(errors="replace").split())[:500]
        if done.returncode:
            log(
                f"the shutdown command exited {done.returncode}: {said or 'no output'}; trying "
                f"again in {SHUTDOWN_RETRY:.0f}s"
            )
        else:
            log("the shutdown command succeeded" + (f": {said}" if said else ""))
