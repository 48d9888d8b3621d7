"""The core's links to agents: connect (off the loop) and sync, fence stale jobs, ping,
drop and poll links, recover at start-up, and the health pass that reconnects silent ones.

A mixin of ``monkey.core.scheduler.Core``, which holds the state named below."""

from __future__ import annotations

import logging
import selectors
import time

from monkey.core.endings import span
from monkey.drivers.agent_link import AgentError, AgentGone, AgentLink
from monkey.models import Attempt, Job, MonkeyError, env_seconds, wall_span

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from monkey.config import ProviderConfig
    from monkey.core.elapsed import Elapsed
    from monkey.core.presence import Presence
    from monkey.core.workers import Workers
    from monkey.drivers.base import Driver
    from monkey.store import Store

log = logging.getLogger("monkey.core")

HEARTBEAT_TIMEOUT = env_seconds("MONKEY_HEARTBEAT_TIMEOUT", 30.0)
# A wedged agent must not hold the core longer than it takes to call its attempts silent.
SYNC_TIMEOUT = min(30.0, max(5.0, HEARTBEAT_TIMEOUT))


class Links:
    """The core's links to the instances' agents (see Core.__init__ for each field)."""

    store: Store
    workers: Workers
    selector: selectors.BaseSelector
    presence: Presence
    providers: dict[str, ProviderConfig]
    drivers: dict[str, Driver]
    links: dict[tuple[str, str], AgentLink]
    linked_at: dict[tuple[str, str], float]
    retry_at: dict[tuple[str, str], float]
    link_errors: dict[tuple[str, str], str]
    contact: dict[tuple[str, str], float]
    pinged: dict[tuple[str, str], float]
    adrift: dict[tuple[str, str], set[tuple[str, int]]]
    releasing: set[tuple[str, str]]
    finishing: set[tuple[str, int]]
    followed: dict[tuple[str, str], list[tuple[str, int]]]
    starting: dict[tuple[tuple[str, str], int], tuple[str, int, str | None]]
    signalled: dict[tuple[str, int], tuple[str, str]]
    started_at: float
    elapsed: Elapsed
    shifted: bool
    start_links: set[tuple[str, str]]

    if TYPE_CHECKING:  # the core's own, called from here

        def driver(self, provider: str) -> Driver: ...
        def _forget_given(self, key: tuple[str, str]) -> None: ...
        def _never_started(self, att: Attempt, why: str | None = ...) -> None: ...
        def _handle_pushes(self, key: tuple[str, str], pushes: list[dict[str, Any]]) -> None: ...
        def _judge(self, key: tuple[str, str], job: Job, att: Attempt, now: float) -> None: ...
        def _fail_queued(self, provider: str, why: str, now: float) -> None: ...
        def _follow(self, key: tuple[str, str], attempts: list[tuple[str, int]]) -> None: ...
        def came_to_nothing(self, provider: str, why: str) -> None: ...

    def connect(self, key: tuple[str, str]) -> None:
        """Link to the instance's agent, off the loop: the driver connects (starting the
        agent when needed) and the agent answers a sync of the attempts live there. Nothing
        happens while linked, while a connect is on its way, before the retry time, or
        while the instance is being released."""
        if (
            key in self.links
            or key in self.releasing
            or self.workers.busy(key)
            or time.monotonic() < self.retry_at.get(key, 0)
        ):
            return
        try:
            drv = self.driver(key[0])
        except MonkeyError as exc:
            self._link_failed(key, exc)
            return
        live = self.store.live_attempts(key[1])
        adrift = self.store.adrift_attempts(key[1])
        attempts = [
            {"juid": a.juid, "attempt": a.n, "run_dir": a.run_dir, "offset": a.events_offset}
            for a in live + adrift
        ]

        def call() -> tuple[AgentLink, dict[str, Any], list[dict[str, Any]]]:
            link = drv.transport.connect(key[1])
            try:
                reply = link.request(
                    "sync",
                    timeout=SYNC_TIMEOUT,
                    attempts=attempts,
                    **drv.transport.sync_fields(key[1]),
                )
                return link, reply, link.request("jobs", timeout=SYNC_TIMEOUT)["jobs"]
            except BaseException:
                link.close()
                raise

        def then(result: tuple[AgentLink, dict[str, Any], list[dict[str, Any]]]) -> None:
            self._linked(key, live, *result, adrift=adrift)

        self.workers.submit(key, call, then, lambda exc: self._link_failed(key, exc))

    def _linked(
        self,
        key: tuple[str, str],
        live: list[Attempt],
        link: AgentLink,
        reply: dict[str, Any],
        running: list[dict[str, Any]],
        adrift: list[Attempt] | None = None,
    ) -> None:
        """A connect came back: keep the link, settle what its sync said and stop what the
        agent RUNNING for this home that the store has ended meanwhile (ADRIFT: the attempts
        lost while it was out of reach that the sync named)."""
        if key in self.links or key[0] not in self.providers:
            link.close()  # linked meanwhile, or the provider is gone
            return
        self.links[key] = link
        self.start_links.discard(key)
        self.linked_at[key] = self.contact[key] = time.monotonic()
        self.retry_at.pop(key, None)
        self.link_errors.pop(key, None)
        for att in live:  # reached again: what its agent recorded is adopted below
            job = self.store.get_job(att.juid)
            if job is not None and job.unreachable_since is not None:
                self.store.set_unreachable(
                    att.juid,
                    att.n,
                    None,
                    f"{key[1]} reached again after "
                    f"{span(self.elapsed.since((att.juid, att.n), job.unreachable_since))}",
                )
        self._forget_given(key)
        self.selector.register(link.fileno(), selectors.EVENT_READ, key)
        by_id = {(a.juid, a.n): a for a in live}
        self.adrift[key] = {(a.juid, a.n) for a in adrift or []}
        for status in reply.get("attempts", []):
            synced = by_id.get((status["juid"], status["attempt"]))
            if synced is not None and status["status"] == "unknown":
                self._never_started(synced, f"the agent of {key[1]} does not know it")
            elif (status["juid"], status["attempt"]) in self.adrift[key] and status[
                "status"
            ] == "unknown":
                self.adrift[key].discard((status["juid"], status["attempt"]))
                self.store.settle_adrift(status["juid"], status["attempt"], None, None, None)
        self._fence(key, link, running)
        self._pump(key, link)

    def _fence(self, key: tuple[str, str], link: AgentLink, running: list[dict[str, Any]]) -> None:
        """Kill the agent's jobs of this home whose attempt the store ended while the instance
        was out of reach (lost, then retried elsewhere): a job runs exactly once."""
        drv = self.drivers.get(key[0])
        for job in running:
            juid, n = job.get("juid"), job.get("attempt")
            if drv is None or not isinstance(juid, str) or not isinstance(n, int):
                continue
            if job.get("run_dir") != drv.transport.run_dir(key[1], juid, n):
                continue  # another MONKEY_HOME's job
            att = self.store.get_attempt(juid, n)
            if att is not None and att.state != "live":
                log.warning("%s: stopping stale %s attempt %d", key[1], juid, n)
                link.send("signal", juid=juid, attempt=n, signal="KILL", grace=0)
                self.store.add_event(
                    juid,
                    "fenced",
                    f"still ran on {key[1]} when reached again, "
                    f"after it had ended ({att.reason}); stopped",
                    attempt=n,
                )

    def ping(self, now: float) -> None:
        """Tell the agents of cloud instances the core is there (``ping_every``), however
        quiet their links: one left without a request for `orphan_timeout` while it runs no
        job powers its machine off. Each ping names the attempts there the core still awaits
        (live or adrift), as a sync does: the agent forgets the ended ones it does not name
        (fetched), and leaves the others in the bucket before it powers off. NOW: the
        monotonic clock."""
        for key, link in list(self.links.items()):
            drv = self.drivers.get(key[0])
            every = drv.ping_every if drv is not None else None
            if (
                every is None
                or now - max(self.pinged.get(key, 0.0), self.linked_at.get(key, 0.0)) < every
            ):
                continue
            self.pinged[key] = now
            self.send_ping(key, link)

    def send_ping(self, key: tuple[str, str], link: AgentLink) -> None:
        """Ping the agent of KEY now, naming the attempts there the core still awaits."""
        awaited = self.store.live_attempts(key[1]) + self.store.adrift_attempts(key[1])
        try:
            link.send(
                "ping", timeout=5, attempts=[{"juid": a.juid, "attempt": a.n} for a in awaited]
            )
        except (AgentGone, OSError):
            self.drop_link(key)

    def _link_failed(self, key: tuple[str, str], exc: BaseException) -> None:
        """Try again in a second; the log says why once per change, not once per retry."""
        why = str(exc)
        if self.link_errors.get(key) != why:
            self.link_errors[key] = why
            expected = isinstance(exc, (MonkeyError, AgentGone, AgentError, OSError))
            log.error(
                "cannot reach the agent of %s: %s", key[1], why, exc_info=None if expected else exc
            )
        self.retry_at[key] = time.monotonic() + 1.0
        if key in self.start_links:  # a job waits to start there
            self.start_links.discard(key)
            self.came_to_nothing(key[0], f"cannot reach the agent of {key[1]}: {why}")

    def drop_link(self, key: tuple[str, str]) -> None:
        link = self.links.pop(key, None)
        if link is None:
            return
        # Starts without a reply are settled by the next sync, not by this link's ids.
        self.starting = {k: v for k, v in self.starting.items() if k[0] != key}
        # A signal sent over it may have died with its agent (and the SIGKILL deadline with
        # it): it is sent again once linked; an agent that has it already ignores a repeat.
        self.signalled = {k: w for k, w in self.signalled.items() if w != key}
        try:
            self.selector.unregister(link.fileno())
        except (KeyError, ValueError, OSError):
            pass
        link.close()
        if key not in self.releasing:
            log.warning("lost the link to %s; will reconnect", key[1])

    def release(self, key: tuple[str, str]) -> None:
        """The instance's agent is going away by monkey's doing: its link ends quietly."""
        self.releasing.add(key)

    def _poll_link(self, key: tuple[str, str]) -> None:
        link = self.links.get(key)
        if link is not None:
            self._pump(key, link)
        if link is not None and link.closed:
            self.connect(key)

    def _pump(self, key: tuple[str, str], link: AgentLink) -> None:
        """Handle what LINK received; a link found broken is dropped at once (the closed
        socket leaves the selector, so nothing would ever poll it again), and the caller
        or the next health check connects anew."""
        try:
            pushes = link.poll()
        except AgentGone:
            pushes = []
        if pushes:
            self.contact[key] = time.monotonic()
        self._handle_pushes(key, pushes)
        if link.closed:
            self.drop_link(key)

    def recover(self) -> None:
        """Re-attach to every attempt that was live when the core last stopped; the time
        no core ran does not count towards any instance's time out of reach."""
        if not self.shifted and self.presence.previous is not None:
            absent = wall_span(self.presence.previous, self.started_at)
            self.store.shift_unreachable(absent or 0.0)  # unknown (a stepped clock): none
        self.shifted = True
        instances = {(a.instance, a.juid) for a in self.store.live_attempts()}
        providers: set[tuple[str, str]] = set()
        for instance, juid in instances:
            job = self.store.get_job(juid)
            if job is not None:
                providers.add((job.provider, instance))
        for key in sorted(providers):
            self.connect(key)

    # -- health -------------------------------------------------------------------------

    def check_health(self, now: float) -> None:
        """Fail jobs queued for providers no longer configured; reconnect dropped links and
        links gone silent; judge the attempts on instances out of reach (``_judge``)."""
        for provider in self.store.queued_providers():
            if provider not in self.providers:
                self._fail_queued(provider, f"provider {provider!r} is no longer configured", now)
        for key, link in list(self.links.items()):
            if link.closed:  # broken by a request: nothing polls it any more
                self.drop_link(key)
        live: dict[tuple[str, str], list[tuple[str, int]]] = {}
        mono = time.monotonic()
        attempts = self.store.live_attempts()
        if self.releasing:  # released: forgotten once its link and attempts are gone
            held = {k[1] for k in self.links} | {a.instance for a in attempts}
            self.releasing = {k for k in self.releasing if k[1] in held}
        for att in attempts:
            job = self.store.get_job(att.juid)
            if job is None or (att.juid, att.n) in self.finishing:
                continue  # exited: no heartbeat comes while its results come back
            key = (job.provider, att.instance)
            live.setdefault(key, []).append((att.juid, att.n))
            # Silence since the link's last word (heartbeats come every few seconds while a
            # job runs), on the monotonic clock: a step of the wall clock is no silence.
            heard = max(self.contact.get(key, 0.0), self.linked_at.get(key, 0.0))
            silence = mono - heard if att.heartbeat_at is not None and heard else 0.0
            if silence > HEARTBEAT_TIMEOUT and key in self.links:
                # Heartbeats stopped on a link that looks open (a half-open connection,
                # a wedged agent): test it by connecting anew.
                log.warning("no heartbeat from %s for %.0fs; reconnecting", key[1], silence)
                self.drop_link(key)
            if key not in self.links:
                self.connect(key)
                self._judge(key, job, att, now)
        for key in set(self.followed) | set(live):
            self._follow(key, live.get(key, []))
        self._reach_adrift()

    def _reach_adrift(self) -> None:
        """Keep trying to reach the fixed hosts (not elastic machines: their listing says
        when they are back, or gone) that hold attempts lost while out of reach."""
        for key in self.store.adrift_instances():
            key = (key[0], key[1])
            config = self.providers.get(key[0])
            if key in self.links or config is None:
                continue
            try:
                if self.driver(key[0]).elastic:
                    continue
            except MonkeyError:
                continue
            self.connect(key)
