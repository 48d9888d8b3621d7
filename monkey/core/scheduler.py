"""The core's loop: carry out what the store asks, against the drivers, and record every step."""

from __future__ import annotations

import json
import logging
import os
import re
import selectors
import socket
import sqlite3
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from monkey.config import Home, ProviderConfig
from monkey.core.cleanup import HostChores
from monkey.core.endings import Facts, decide
from monkey.core.endings import span as _span
from monkey.core.outage import Outage
from monkey.core.placement import Usage, place
from monkey.core.presence import Presence
from monkey.core.provisioning import LIST_EVERY, Elastic
from monkey.core.workers import Workers
from monkey.drivers import get_driver, load_providers
from monkey.drivers.agent_link import AgentError, AgentGone, AgentLink
from monkey.drivers.base import LOST_AFTER, Capacity, Driver, NotReady, lost_after
from monkey.environments import start_fields
from monkey.models import (
    REDACTED,
    Attempt,
    Ending,
    Job,
    MonkeyError,
    Request,
    Resources,
    State,
    parse_size,
)
from monkey.snapshot.blobs import BlobDamaged, BlobStore
from monkey.store import Store
from monkey.store.db import Checkpointer
from monkey.store.errors import StoreUnavailable
from monkey.tracking import ingest, sweeps
from monkey.version import code_digest, installed_elsewhere, package_version, version

log = logging.getLogger("monkey.core")
_PROBE_EVERY = 5.0  # seconds between looks for a new install while the core's own is gone

HEARTBEAT_TIMEOUT = float(os.environ.get("MONKEY_HEARTBEAT_TIMEOUT", "30"))
KILL_GRACE = float(os.environ.get("MONKEY_KILL_GRACE", "10"))
# A wedged agent must not hold the core longer than it takes to call its attempts silent.
SYNC_TIMEOUT = min(30.0, max(5.0, HEARTBEAT_TIMEOUT))
_IDLE_TICK = 1.0
_ELASTIC_SOON = 0.1  # seconds between elastic passes for jobs that fit nowhere
_PREPARE_TRIES = 3  # starts whose inputs cannot be made ready before the job fails
# Starts an agent refused for a damaged copy (there, or in the bucket) before the job fails:
# each replaces what it found, so more means copies that keep arriving damaged.
_DAMAGED_TRIES = 5
_WAITING_MAX = 1000  # queued jobs of an elastic provider looked at per pass
# An instance where an attempt that ran less than _AHEAD_RUN seconds ended within the last
# _AHEAD_WINDOW seconds (short jobs, one after the other) is handed starts ahead of its free
# slots (drivers with ``hands_ahead``), up to _AHEAD_FACTOR times its slots in all but at
# most _AHEAD_MAX more: its agent holds them and spawns the next one the moment a job ends,
# instead of the slot waiting for a round trip through the core. A start held longer than
# the agent's HOLD_LIMIT (the slots stayed taken) comes back as never started and is
# queued again.
_AHEAD_WINDOW = float(os.environ.get("MONKEY_AHEAD_WINDOW", "0.5"))
_AHEAD_RUN = 1.0
_AHEAD_FACTOR = 8
_AHEAD_MAX = 32
# While events keep coming, a pass begins no sooner than this after the one before: what
# arrives meanwhile (submissions, starts, exits) is handled and committed together, which
# costs far less than a pass each; the agents' held starts keep their slots busy meanwhile.
# A pass after a quiet spell begins at once.
_PASS_GAP = 0.003
MAX_PREEMPTIONS = 10  # a job preempted this often stays preempted (providers.yml: max_preemptions)


def bind_wake_socket(home: Home) -> socket.socket:
    """The datagram socket that clients poke after writing a request into the store."""
    path = str(home.socket_path("core"))
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    os.chmod(path, 0o600)
    sock.setblocking(False)
    return sock


def _mtime(path: os.PathLike[str]) -> tuple[int, int, int]:
    """What changes when a file is edited or replaced (mtime alone may not, within a tick)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return (0, 0, 0)
    return (st.st_mtime_ns, st.st_size, st.st_ino)


class Core:
    """The scheduler: dispatches queued jobs, follows live attempts, applies requests."""

    def __init__(self, home: Home) -> None:
        self.home = home
        self.store = Store(home.db)
        self.checkpointer = Checkpointer(home.db)
        self.providers: dict[str, ProviderConfig] = load_providers(home)
        self.providers_mtime = _mtime(home.providers_file)
        self.drivers: dict[str, Driver] = {}
        self.links: dict[tuple[str, str], AgentLink] = {}
        self.selector = selectors.DefaultSelector()
        self.wake_sock = bind_wake_socket(home)
        self.selector.register(self.wake_sock, selectors.EVENT_READ, None)
        # Attempts a cancel or pause was sent for, with the link it went over.
        self.signalled: dict[tuple[str, int], tuple[str, str]] = {}
        # Per request id: the attempt a `start` was sent for, and the code list it named.
        self.starting: dict[tuple[tuple[str, str], int], tuple[str, int, str | None]] = {}
        self.manifests: dict[str, list[Any]] = {}
        self.blobs = BlobStore(home.blobs)  # every blob a start sends is checked here first
        # What this core gave each instance's agent since linking to it: the code lists it
        # holds, and the last one sent per workdir (the base of the next one's delta).
        self.given: dict[tuple[str, str], set[str]] = {}
        self.last_given: dict[tuple[tuple[str, str], str], str] = {}
        self.next_health = 0.0
        self.restart = False  # stopped because monkey was reinstalled: start a new core
        self.seen_code: str | None = None  # a new digest of the code on disk, seen once
        self.probe_at = 0.0  # the next look for an install elsewhere, this one being gone
        self.retry_at: dict[tuple[str, str], float] = {}  # no new connect before (per link)
        self.linked_at: dict[tuple[str, str], float] = {}  # when each link was (re)made
        self.pinged: dict[tuple[str, str], float] = {}  # the last ping sent over each link
        # The last time this core heard from each instance's agent (the time before it
        # started never counts as silence: see check_health).
        self.contact: dict[tuple[str, str], float] = {}
        # Per instance: its attempts lost while out of reach, named in the sync of the link
        # made since (their exits, when their agent recorded one, are adopted as late exits).
        self.adrift: dict[tuple[str, str], set[tuple[str, int]]] = {}
        self.started_at = time.time()
        self.presence = Presence(home)  # tells clients this core runs; knows the last one's end
        self.shifted = False  # the unreachable clocks moved past the time no core ran
        self.link_errors: dict[tuple[str, str], str] = {}  # the last connect error logged
        # Instances whose agent goes away by monkey's doing (released after their attempt,
        # destroyed): their link is dropped quietly and not made again.
        self.releasing: set[tuple[str, str]] = set()
        self.finishing: set[tuple[str, int]] = set()  # attempts whose results are coming
        self.prepare_failures: dict[str, int] = {}  # per job: starts failed in a row
        # Per fixed provider: why it cannot be reached or trusted yet, as recorded (None:
        # it can; absent: not known since this core started, a stale record is cleared).
        self.not_ready: dict[str, str | None] = {}
        self.damaged_tries: dict[str, int] = {}  # per job: starts refused for a damaged copy
        self.followed: dict[tuple[str, str], list[tuple[str, int]]] = {}  # told drivers
        self.workers = Workers(self.selector)
        self.elastic = Elastic(self)
        self.chores = HostChores(self)  # what rm, gc and du --hosts ask of SSH hosts
        self.waiting: dict[str, list[Resources]] = {}  # per provider: jobs placed nowhere
        self.on_demand: dict[str, list[Resources]] = {}  # those of them that need on-demand
        self.stopping = False
        self.to_send: list[Callable[[], None]] = []  # starts to send once the pass committed
        self.passes = 0  # passes so far: a job read in this pass is still as read
        # Fixed providers found without a free slot, until something frees room: a job
        # queued meanwhile (a wake) cannot start there, so its pass does not look.
        self.full: set[str] = set()
        # Per instance: when its last attempt ended (monotonic) and how long it had run.
        self.ended_at: dict[tuple[str, str], tuple[float, float]] = {}
        self.pass_began = 0.0  # monotonic time of the last pass that handled events
        self.outage = Outage(home.core_status)
        # What the next pass must look at: requests and providers.yml after a client's wake,
        # the queue after anything that can free capacity or add jobs (not after a job's
        # start or heartbeat). The health pass each second looks at everything anyway.
        self.woken = True
        self.dirty = True
        self.ready_at: float | None = None  # when the next queued job's back-off ends
        self.elastic_at = 0.0  # the last elastic pass

    # -- main loop ----------------------------------------------------------------------

    def run(self) -> None:
        """Recover live attempts, then serve until ``stop()``.

        While the store cannot be written (a full disk), retry with back-off; the links are
        dropped then, and recovered afterwards, since what they said was not recorded."""
        recovered = False
        while not self.stopping:
            try:
                if not recovered:
                    self.recover()
                    recovered = True
                    self._pass([])
                gap = self.pass_began + _PASS_GAP - time.monotonic()
                if gap > 0:
                    time.sleep(gap)
                ready = self.selector.select(self.timeout())
                if self.stopping:  # told to stop: what woke it is synced by the next core
                    break
                self._pass(ready)
                failure = self.store.take_failure()  # some callers catch MonkeyError
            except StoreUnavailable as exc:
                failure = self.store.take_failure() or exc
            if failure is None:
                self.outage.over()
                continue
            recovered = False
            for key in list(self.links):
                self.drop_link(key)
            self.outage.wait(failure, lambda: self.stopping)
        self.close()

    def _pass(self, ready: list[tuple[selectors.SelectorKey, int]]) -> None:
        """Handle what woke the loop, then decide (``tick``), in one transaction (a
        ``batch``: a pass that starts and ends many jobs commits once; one that writes
        nothing takes no lock). The starts it decided are sent once that is committed, so
        an agent never runs an attempt the store may not hold."""
        self.passes += 1
        if ready:
            self.pass_began = time.monotonic()
        try:
            with self.store.batch():
                for key, _ in ready:
                    if key.data is None:
                        self._drain_wakes()
                    elif key.data is self.workers:
                        self.workers.drain()
                        self.changed()
                    else:
                        self._poll_link(key.data)
                if not self.stopping:  # a core told to stop starts nothing more
                    self.tick()
        finally:
            to_send, self.to_send = self.to_send, []
        for send in to_send:
            send()

    def changed(self) -> None:
        """Something that may free room happened: dispatch again, trying every provider."""
        self.dirty = True
        self.full.clear()

    def stop(self) -> None:
        self.stopping = True

    def close(self) -> None:
        self.presence.touch(force=True)  # clients say "not running since" this moment
        for link in list(self.links.values()):
            link.close()
        self.links.clear()
        self.workers.close()
        self.selector.close()
        self.wake_sock.close()
        self.outage.close()
        self.checkpointer.close()
        self.store.close()

    def timeout(self) -> float:
        """Until the next queued job's back-off ends. Jobs ready now that the last pass left
        queued fit nowhere: an exit, a worker's outcome or a request wakes the loop when that
        changes (or the idle tick), so they must not make it spin."""
        wait = _IDLE_TICK if self.ready_at is None else min(_IDLE_TICK, self.ready_at - time.time())
        return max(wait, 0.001)

    def tick(self) -> None:
        """One pass: configuration, what drivers learnt, requests, dispatch, health."""
        now = time.time()
        health = now >= self.next_health
        if health:
            self.full.clear()
            if self.reinstalled():
                return
        if self.woken or health:
            self.reload_providers()
        for name, drv in list(self.drivers.items()):
            for inst, reach, extra in drv.changes():
                self.changed()
                self.store.record_instance(inst, reach=reach, extra=extra)
                if reach == "up":  # back: its agent may run attempts ended meanwhile
                    self.connect((name, inst.id))
                    if not drv.elastic:
                        self._not_ready(name, None)
        if self.woken or health:
            self.apply_requests()
            self.elastic.requests(now)
        self.woken = False
        placed_nowhere = False
        if self.dirty or health or (self.ready_at is not None and self.ready_at <= now):
            self.dirty = False
            self.dispatch_ready(now)
            self.ready_at = self.store.next_not_before(now)
            placed_nowhere = any(self.waiting.values()) or any(self.on_demand.values())
        if health:
            self.next_health = now + 1.0
            self.presence.touch()
            self.check_health(now)
            self.chores.tick()
            self.ping(now)
        if health or (placed_nowhere and now - self.elastic_at >= _ELASTIC_SOON):
            # Machines for jobs that fit nowhere are asked for at once, not at the next pass.
            self.elastic_at = now
            self.elastic.tick(now, self.waiting, self.on_demand)
        if health:
            sweeps.tick(self.store, self.home)

    def reinstalled(self) -> bool:
        """Whether monkey was reinstalled (``pip install``, a ``git pull`` in an editable
        checkout) since this core loaded it, the same new code found on two health passes in
        a row (not a half-written install); the core then stops with ``restart`` set, and
        ``daemon.run_foreground`` starts a core on the new code, which re-attaches to the
        running jobs and replaces outdated agents. No command is needed for it."""
        try:
            now = code_digest.__wrapped__()
        except OSError:  # uninstalled: wait for the install that follows, here or elsewhere
            now, probe = "gone", time.monotonic()
            if self.seen_code == now and (probe < self.probe_at or not installed_elsewhere()):
                self.probe_at = max(self.probe_at, probe + _PROBE_EVERY)
                return False
        if now == code_digest():
            self.seen_code = None
            return False
        if now != self.seen_code:
            self.seen_code = now
            return False
        log.info("monkey was reinstalled (%s -> %s): restarting the core on it; jobs keep "
                 "running", version(), "elsewhere" if now == "gone" else f"{package_version()}+{now}")
        self.restart = True
        self.stop()
        return True

    def reload_providers(self) -> None:
        """Take edits of providers.yml into account; a broken file keeps the last good one.
        Providers whose entry changed get a new driver and new links (jobs go on)."""
        mtime = _mtime(self.home.providers_file)
        if mtime == self.providers_mtime:
            return
        self.providers_mtime = mtime
        try:
            providers = load_providers(self.home)
        except MonkeyError as exc:
            log.error("providers.yml not reloaded, keeping the last good one: %s", exc)
            return
        for name in list(self.drivers):
            if providers.get(name) != self.providers.get(name):
                for key in [k for k in self.links if k[0] == name]:
                    self.drop_link(key)
                self.drivers.pop(name).close()
        self.providers = providers
        self.changed()
        log.info("providers.yml reloaded: %s", ", ".join(sorted(providers)))

    def _drain_wakes(self) -> None:
        self.woken = self.dirty = True
        while True:
            try:
                self.wake_sock.recv(64)
            except (BlockingIOError, InterruptedError):
                return

    # -- links to agents ----------------------------------------------------------------

    def driver(self, provider: str) -> Driver:
        drv = self.drivers.get(provider)
        if drv is None:
            config = self.providers.get(provider)
            if config is None:
                raise MonkeyError(f"provider {provider!r} is not configured")
            drv = self.drivers[provider] = get_driver(config, self.home)
            drv.wake = self.workers.poke  # news from its threads wake the loop
        return drv

    def connect(self, key: tuple[str, str]) -> None:
        """Link to the instance's agent, off the loop: the driver connects (starting the
        agent when needed) and the agent answers a sync of the attempts live there. Nothing
        happens while linked, while a connect is on its way, before the retry time, or
        while the instance is being released."""
        if key in self.links or key in self.releasing or self.workers.busy(key) \
                or time.time() < self.retry_at.get(key, 0):
            return
        try:
            drv = self.driver(key[0])
        except MonkeyError as exc:
            self._link_failed(key, exc)
            return
        live = self.store.live_attempts(key[1])
        adrift = self.store.adrift_attempts(key[1])
        attempts = [{"juid": a.juid, "attempt": a.n, "run_dir": a.run_dir,
                     "offset": a.events_offset} for a in live + adrift]  # fmt: skip

        def call() -> tuple[AgentLink, dict[str, Any], list[dict[str, Any]]]:
            link = drv.connect(key[1])
            try:
                reply = link.request("sync", timeout=SYNC_TIMEOUT, attempts=attempts,
                                     **drv.sync_fields(key[1]))
                return link, reply, link.request("jobs", timeout=SYNC_TIMEOUT)["jobs"]
            except BaseException:
                link.close()
                raise

        self.workers.submit(key, call, lambda result: self._linked(key, live, *result, adrift=adrift),
                            lambda exc: self._link_failed(key, exc))  # fmt: skip

    def _linked(self, key: tuple[str, str], live: list[Attempt], link: AgentLink,
                reply: dict[str, Any], running: list[dict[str, Any]],
                adrift: list[Attempt] | None = None) -> None:
        """A connect came back: keep the link, settle what its sync said and stop what the
        agent RUNNING for this home that the store has ended meanwhile (ADRIFT: the attempts
        lost while it was out of reach that the sync named)."""
        if key in self.links or key[0] not in self.providers:
            link.close()  # linked meanwhile, or the provider is gone
            return
        self.links[key] = link
        self.linked_at[key] = self.contact[key] = now = time.time()
        self.retry_at.pop(key, None)
        self.link_errors.pop(key, None)
        for att in live:  # reached again: what its agent recorded is adopted below
            job = self.store.get_job(att.juid)
            if job is not None and job.unreachable_since is not None:
                self.store.set_unreachable(att.juid, att.n, None, f"{key[1]} reached again after "
                                           f"{_span(now - job.unreachable_since)}")
        self._forget_given(key)
        self.selector.register(link.fileno(), selectors.EVENT_READ, key)
        by_id = {(a.juid, a.n): a for a in live}
        self.adrift[key] = {(a.juid, a.n) for a in adrift or []}
        for status in reply.get("attempts", []):
            att = by_id.get((status["juid"], status["attempt"]))
            if att is not None and status["status"] == "unknown":
                self._never_started(att)
            elif (status["juid"], status["attempt"]) in self.adrift[key] and status["status"] == "unknown":
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
            if job.get("run_dir") != drv.run_dir(key[1], juid, n):
                continue  # another MONKEY_HOME's job
            att = self.store.get_attempt(juid, n)
            if att is not None and att.state != "live":
                log.warning("%s: stopping stale %s attempt %d", key[1], juid, n)
                link.send("signal", juid=juid, attempt=n, signal="KILL", grace=0)
                self.store.add_event(juid, "fenced", f"still ran on {key[1]} when reached again, "
                                     f"after it had ended ({att.reason}); stopped", attempt=n)

    def ping(self, now: float) -> None:
        """Tell the agents of cloud instances the core is there (``ping_every``), however
        quiet their links: one left without a request for `orphan_timeout` while it runs no
        job powers its machine off."""
        for key, link in list(self.links.items()):
            drv = self.drivers.get(key[0])
            every = drv.ping_every if drv is not None else None
            if every is None or now - max(self.pinged.get(key, 0.0), self.linked_at.get(key, 0.0)) < every:
                continue
            self.pinged[key] = now
            try:
                link.send("ping", timeout=5)
            except (AgentGone, OSError):
                self.drop_link(key)

    def _link_failed(self, key: tuple[str, str], exc: BaseException) -> None:
        """Try again in a second; the log says why once per change, not once per retry."""
        why = str(exc)
        if self.link_errors.get(key) != why:
            self.link_errors[key] = why
            expected = isinstance(exc, (MonkeyError, AgentGone, AgentError, OSError))
            log.error("cannot reach the agent of %s: %s", key[1], why,
                      exc_info=None if expected else exc)  # fmt: skip
        self.retry_at[key] = time.time() + 1.0

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
            self.contact[key] = time.time()
        self._handle_pushes(key, pushes)
        if link.closed:
            self.drop_link(key)

    def recover(self) -> None:
        """Re-attach to every attempt that was live when the core last stopped; the time
        no core ran does not count towards any instance's time out of reach."""
        if not self.shifted and self.presence.previous is not None:
            self.store.shift_unreachable(self.started_at - self.presence.previous)
        self.shifted = True
        instances = {(a.instance, a.juid) for a in self.store.live_attempts()}
        providers: set[tuple[str, str]] = set()
        for instance, juid in instances:
            job = self.store.get_job(juid)
            if job is not None:
                providers.add((job.provider, instance))
        for key in sorted(providers):
            self.connect(key)

    # -- events from agents -------------------------------------------------------------

    def _handle_pushes(self, key: tuple[str, str], pushes: list[dict[str, Any]]) -> None:
        for push in pushes:
            if "id" in push:
                self._on_reply(key, push)
                continue
            if push.get("push") == "notice":
                self.elastic.on_notice(key, push)
            if push.get("push") != "event":
                continue
            event = push["event"]
            juid, n, offset = push["juid"], push["attempt"], push["offset"]
            kind = event.get("type")
            if (juid, n) in self.adrift.get(key, ()):
                if kind == "exit":
                    self._late_exit(key, juid, n, event)
                continue
            if kind == "exit":
                self.changed()
                self.on_exit(key, juid, n, event, offset)
            elif kind == "heartbeat":
                ingest.on_heartbeat(self.store, juid, n, offset, event)
            elif kind == "metrics":
                ingest.on_metrics(self.store, juid, n, offset, event)
            elif kind == "started":
                self.store.attempt_started(juid, n, event.get("pid", 0), event["ts"])
            elif kind == "preempt-notice":
                self.store.add_event(juid, "preempt-notice", f"{event.get('detail')}; the "
                                     f"instance goes in {event['deadline'] - event['ts']:.0f}s",
                                     attempt=n)  # fmt: skip

    def _late_exit(self, key: tuple[str, str], juid: str, n: int, event: dict[str, Any]) -> None:
        """An attempt lost while its instance was out of reach ended there meanwhile (or was
        fenced just now): record how, and bring back what it wrote."""
        self.adrift[key].discard((juid, n))
        code, sig = event.get("code"), event.get("signal")
        how = f"exit {code}" if code is not None else f"killed by signal {sig}"
        when = time.strftime("%H:%M:%S", time.localtime(event.get("ts") or time.time()))
        self.store.settle_adrift(juid, n, code, sig, f"ended on {key[1]} at {when} ({how}), "
                                 "after it had been declared lost")
        drv = self.drivers.get(key[0])
        if drv is not None:
            outputs = self.store.outputs(juid)
            self._transport(key, drv, lambda: drv.finish(key[1], juid, n, outputs, False),
                            lambda _: None, lambda exc: log.error("fetching results of %s attempt "
                                                                 "%d failed: %s", juid, n, exc),
                            lane=(*key, juid, str(n)))  # fmt: skip

    def _on_reply(self, key: tuple[str, str], reply: dict[str, Any]) -> None:
        """The agent's answer to a `start` sent without waiting."""
        started = self.starting.pop((key, reply["id"]), None)
        if started is None or reply.get("ok"):
            return
        self.changed()
        juid, n, manifest = started
        error = str(reply.get("error"))
        if reply.get("withdrawn"):  # held for a slot that stayed taken, or signalled: nothing ran
            att = self.store.get_attempt(juid, n)
            if att is not None and att.state == "live":
                self._never_started(att)
            return
        if "damaged blob" in error:  # the agent removed its copy there: send a good one
            log.warning("%s: %s", key[1], error)
            drv = self.drivers.get(key[0])
            if drv is not None:
                drv.forget_blobs(key[1])
                bad = re.search(r"damaged blob ([0-9a-f]{64}) in the bucket", error)
                if bad:  # the bucket's copy: stored again from the checked local one
                    drv.bucket_damaged(bad.group(1))
            att = self.store.get_attempt(juid, n)
            tries = self.damaged_tries[juid] = self.damaged_tries.get(juid, 0) + 1
            if att is not None and att.state == "live" and tries < _DAMAGED_TRIES:
                self._never_started(att)
                return
            self.damaged_tries.pop(juid, None)  # copies that keep arriving damaged: it fails
        if "unknown manifest" in error or "being preempted" in error:
            # The agent lost its cached lists: start the job again, with the full list.
            self._forget_given(key)
            att = self.store.get_attempt(juid, n)
            if att is not None:
                self._never_started(att)
            return
        if manifest:  # the agent may not have kept it
            self.given.get(key, set()).discard(manifest)
        if error.startswith("disk full at "):  # the agent's own words: say which machine
            error = f"disk full on {key[1]} at {error[len('disk full at '):]}"
        self.store.end_attempt(juid, n, final=State.FAILED, exit_code=None, signal=None,
                               reason=f"could not start: {error}")

    def _forget_given(self, key: tuple[str, str]) -> None:
        """Assume the instance's agent holds no code list."""
        self.given[key] = set()
        self.last_given = {k: v for k, v in self.last_given.items() if k[0] != key}

    def on_exit(self, key: tuple[str, str], juid: str, n: int, event: dict[str, Any],
                offset: int) -> None:
        """Bring the attempt's results back (off the loop), then close it: a reader that
        sees the job end must find its logs complete."""
        att = self.store.get_attempt(juid, n)
        if att is None or att.state != "live" or (juid, n) in self.finishing:
            return  # closed already (an exit replayed by a sync), or being closed
        # How long it ran (never reported started: taken as not short).
        ran = (event.get("ts") or time.time()) - att.started_at if att.started_at else _AHEAD_RUN
        self.ended_at[key] = (time.monotonic(), ran)
        self.finishing.add((juid, n))
        try:
            drv = self.driver(key[0])
        except MonkeyError:
            self._close_attempt(key, juid, n, event, offset)
            return

        job = self.store.get_job(juid)
        read = self.passes

        def fetched(exc: BaseException | None) -> None:
            if exc is None and drv.releases_on_finish:
                self.elastic.terminated(key[0], key[1], "released after its attempt")
            if exc is not None:
                log.error("fetching results of %s attempt %d failed: %s", juid, n, exc)
            self._close_attempt(key, juid, n, event, offset, job if self.passes == read else None)

        outputs, current = self.store.outputs(juid), job is not None and job.attempts == n
        if drv.releases_on_finish:
            self.release(key)
        self.changed()  # its slot is free: the next start need not wait for the results
        # On a lane of its own: neither a start there nor another attempt's results wait
        # for these.
        self._transport(key, drv, lambda: drv.finish(key[1], juid, n, outputs, current),
                        lambda _: fetched(None), fetched, lane=(*key, juid, str(n)))  # fmt: skip

    def _close_attempt(self, key: tuple[str, str], juid: str, n: int, event: dict[str, Any],
                       offset: int, job: Job | None = None) -> None:
        """End the attempt as its exit EVENT says and decide the job's next state (JOB: as
        read in this pass; read again when None)."""
        self.finishing.discard((juid, n))
        job = job or self.store.get_job(juid)
        if job is None:
            return
        why = Ending.of(event)
        drv = self.drivers.get(key[0])
        remote = drv is not None and drv.kind != "local"
        config = self.providers.get(job.provider)
        facts = Facts(
            retries_done=self.store.auto_retries(juid) if job.retries else 0,
            preemptions=self.store.auto_retries(juid, "preempt") if why == Ending.PREEMPTED else 0,
            max_preemptions=int(config.options.get("max_preemptions", MAX_PREEMPTIONS)) if config else MAX_PREEMPTIONS,
            remote=remote, host=key[1],
            note=self.outage.job_note(self.home.run_dir(juid, n)) if event.get("code") != 0 else "",
        )  # fmt: skip
        end = decide(job, event, facts)
        # The agent's time of the exit: a job that ended while the core was down did not
        # run until the core came back.
        self.store.end_attempt(juid, n, final=end.final, exit_code=event.get("code"),
                               signal=event.get("signal"), reason=end.reason,
                               requeue_after=end.requeue, offset=offset, now=event.get("ts"),
                               requeue_kind=end.requeue_kind, adrift=why == Ending.SILENT)
        self.signalled.pop((juid, n), None)

    def _judge(self, key: tuple[str, str], job: Job, att: Attempt, now: float) -> None:
        """The instance KEY of JOB's live attempt ATT is not linked: once a connect failed,
        or nothing came from it for the heartbeat timeout, the job shows it `unreachable`
        (since this core last heard from it, or started: the time no core ran is not
        silence); past the provider's ``lost_after`` the attempt is lost. A cloud's or
        Slurm's own listing ends it sooner when it says the machine is gone."""
        since = job.unreachable_since
        if since is None:
            heard = self.contact.get(key, self.started_at)
            why = self.link_errors.get(key)
            if why is None and now - heard <= HEARTBEAT_TIMEOUT:
                return  # a connect is on its way
            why = why or f"nothing from its agent for {_span(now - heard)}"
            self.store.set_unreachable(att.juid, att.n, heard, f"{key[1]} unreachable ({why}); "
                                       f"lost after {_span(self._lost_after(key[0]))} out of reach")
            return
        limit = self._lost_after(key[0])
        if now - since <= limit or (now - since <= 2 * LIST_EVERY and self._on_spot(key)):
            return  # (a spot machine's listing says first whether it was reclaimed)
        log.warning("%s attempt %d: %s unreachable for %.0fs: lost", att.juid, att.n, key[1], now - since)
        self.on_exit(key, att.juid, att.n, {"reason": Ending.SILENT.value, "silence": now - since,
                                            "lost_after": limit, "ts": now}, att.events_offset)

    def _lost_after(self, provider: str) -> float:
        config = self.providers.get(provider)
        return (lost_after(config.options) if config else None) or LOST_AFTER

    def needs_on_demand(self, job: Job) -> bool:
        """Whether the job's provider asks on-demand capacity for it now (``fallback:
        on_demand_after: N`` and N preemptions since the user last re-queued it)."""
        config = self.providers.get(job.provider)
        fallback = config.options.get("fallback") if config else None
        if not fallback:
            return False
        return self.store.auto_retries(job.juid, "preempt") >= int(fallback["on_demand_after"])

    def _on_spot(self, key: tuple[str, str]) -> bool:
        """Whether the instance KEY is a spot/preemptible machine of an elastic provider."""
        return any(r["id"] == key[1] and r["spot"] for r in self.store.instances(key[0], live=True))

    def _never_started(self, att: Attempt) -> None:
        job = self.store.get_job(att.juid)
        if job is None:
            return
        if job.state == State.DISPATCHING:
            # A cancel or pause asked meanwhile takes effect now; otherwise the job waits
            # for its next start (no retry used: nothing ran).
            final = {Request.CANCEL.value: State.CANCELLED,
                     Request.PAUSE.value: State.PAUSED}.get(job.request or "", State.QUEUED)
            self.store.end_attempt(att.juid, att.n, final=final, exit_code=None,
                                   signal=None, reason="never started")
        else:
            self.on_exit((job.provider, att.instance), att.juid, att.n,
                         {"reason": Ending.VANISHED.value}, att.events_offset)

    # -- requests and dispatch ----------------------------------------------------------

    def apply_requests(self) -> None:
        """Signal live attempts whose job the user asked to cancel or pause."""
        for job in self.store.requested_jobs():
            if job.state not in (State.RUNNING, State.DISPATCHING):
                continue
            key = (job.juid, job.attempts)
            if key in self.signalled:
                continue
            att = self.store.get_attempt(job.juid, job.attempts)
            if att is None or att.state != "live":
                continue
            where = (job.provider, att.instance)
            link = self.links.get(where)
            if link is None:  # asked again once linked
                self.connect(where)
                continue
            try:
                link.send("signal", juid=job.juid, attempt=att.n, signal="TERM", grace=KILL_GRACE)
            except AgentGone as exc:
                log.error("cannot signal %s: %s", job.juid, exc)
                self.drop_link(where)
                continue
            self.signalled[key] = where

    def usage(self) -> dict[str, Usage]:
        """What the live attempts take of each instance. An attempt that exited takes
        nothing while its results come back: its processes are gone."""
        used: dict[str, Usage] = {}
        for instance, cpus, gpus, memory, juid, n in self.store.live_usage():
            if (juid, n) in self.finishing:
                continue
            u = used.setdefault(instance, Usage())
            u.slots += max(1, cpus or 1)
            u.gpus.update(g for g in gpus.split(",") if g)
            if memory is not None:
                u.memory += parse_size(memory)
        return used

    def dispatch_ready(self, now: float) -> None:
        """Place and start every queued job that fits somewhere now."""
        usage: dict[str, Usage] | None = None
        self.waiting = {}
        for provider in self.providers:
            if provider in self.full or not self.store.has_ready(provider, now):
                continue
            try:
                drv = self.driver(provider)
                capacities = drv.instances()
            except NotReady as exc:  # the jobs wait, saying why, and start once it is
                self._not_ready(provider, str(exc))
                continue
            except MonkeyError as exc:
                self._fail_queued(provider, str(exc), now)
                continue
            if not drv.elastic:
                self._not_ready(provider, None)
            if usage is None:
                usage = self.usage()
            if self.elastic.noticed:  # machines about to go take no new job
                capacities = [c for c in capacities if c.instance not in self.elastic.noticed]
            slots: dict[str, int] = {}  # the real slots, told to agents handed starts ahead
            if drv.hands_ahead:
                slots = {c.instance: c.slots for c in capacities}
                capacities = self._ahead(provider, capacities)
            free = sum(max(0, c.slots - usage.get(c.instance, Usage()).slots) for c in capacities)
            if free <= 0 and not drv.elastic:
                self.full.add(provider)
                continue
            # An elastic provider also learns which jobs fit nowhere: machines are made for them.
            limit = _WAITING_MAX if drv.elastic else free + 2
            waiting = self.waiting[provider] = []
            on_demand = self.on_demand[provider] = []
            spot: set[str] | None = None
            for job in self.store.ready_jobs(now, limit=limit, provider=provider):
                where, unplaced = capacities, waiting
                if drv.elastic and self.needs_on_demand(job):
                    if spot is None:
                        spot = {r["id"] for r in self.store.instances(provider, live=True) if r["spot"]}
                    where, unplaced = [c for c in capacities if c.instance not in spot], on_demand
                if drv.batches:  # a machine made for one job's size takes only such a job
                    size = drv.size_for(job.resources)
                    where = [c for c in where if c.extra.get("size", size) == size]
                placement = place(job.resources, where, usage, pinned=job.resources.host)
                if placement is None:
                    unplaced.append(job.resources)
                    continue
                self.start(job, drv, placement.instance, placement.gpus,
                           any(c.gpus for c in capacities if c.instance == placement.instance),
                           slots.get(placement.instance))
                if not drv.elastic and all(usage.get(c.instance, Usage()).slots >= c.slots
                                           for c in capacities):  # fmt: skip
                    break  # full: the jobs after this one wait for an exit

    def _ahead(self, provider: str, capacities: list[Capacity]) -> list[Capacity]:
        """CAPACITIES with more slots on instances where short attempts just ended (see
        _AHEAD_RUN): the starts beyond the real slots are held by the agent until one frees."""
        now = time.monotonic()
        ended = self.ended_at.get
        return [replace(c, slots=min(_AHEAD_FACTOR * c.slots, c.slots + _AHEAD_MAX))
                if (e := ended((provider, c.instance))) and now - e[0] < _AHEAD_WINDOW
                and e[1] < _AHEAD_RUN else c for c in capacities]  # fmt: skip

    def _not_ready(self, provider: str, why: str | None) -> None:
        """Record why PROVIDER cannot be reached or trusted yet (None: it can again), shown
        by `info job` and `list providers` for the jobs waiting for it."""
        if provider in self.not_ready and self.not_ready[provider] == why:
            return
        self.not_ready[provider] = why
        if why is not None:
            log.warning("%s: jobs wait: %s", provider, why)
        self.store.set_provider_error(provider, why)

    def _fail_queued(self, provider: str, why: str, now: float) -> None:
        for job in self.store.ready_jobs(now, limit=100, provider=provider):
            att = self.store.begin_attempt(job, provider, "")
            if att is not None:
                self.store.end_attempt(job.juid, att.n, final=State.FAILED, exit_code=None,
                                       signal=None, reason=why)

    def start(self, job: Job, drv: Driver, instance: str, gpus: list[str],
              has_gpus: bool, slots: int | None = None) -> None:
        """Open an attempt; off the loop, make its checkpoint and blobs ready on the instance;
        then ask the instance's agent to start it (with SLOTS, the instance's: when it
        does not fit there yet, the agent holds it until it does)."""
        key = (job.provider, instance)
        # Linked first: a connect syncs the attempts live there, and this one must not be
        # among them before the agent has been asked to start it.
        if key not in self.links:
            self.connect(key)
            return
        if time.time() < self.retry_at.get(key, 0):
            return  # a start there just failed: not again at once
        n = job.attempts + 1
        run_dir = drv.run_dir(instance, job.juid, n)
        att = self.store.begin_attempt(job, instance, run_dir, ",".join(gpus))
        if att is None:
            return
        try:
            spec = self.start_spec(job, drv, instance, run_dir, gpus, has_gpus)
            if slots is not None:
                spec.update(slots=slots, cpus=max(1, job.resources.cpus))
        except (MonkeyError, OSError) as exc:
            self._start_failed(key, att, exc)
            return
        blobs = spec.pop("_blobs")
        outputs = self.store.outputs(job.juid)
        checked = list(dict.fromkeys([*blobs, *(d["digest"] for d in job.datasets)]))
        hashed = self.blobs.unchecked(checked, self.store.blob_stamps)

        def call() -> tuple[str, dict[str, Any]]:
            for digest in checked:  # the source of every copy: never a damaged one
                try:
                    self.blobs.check(digest)
                except BlobDamaged as exc:
                    raise exc.about(self._blob_role(job, digest), job.juid) from None
            checkpoint = drv.checkpoint_dir(instance, job.juid)
            return checkpoint, {**drv.prepare(instance, blobs),
                                **drv.start_fields(instance, job.juid, n, outputs)}

        opened = self.passes
        def then(ready: tuple[str, dict[str, Any]]) -> None:
            if hashed:  # a later core need not hash them again (only a saving: never fatal)
                try:
                    self.store.add_blobs(self.blobs.stamped(hashed))
                except (MonkeyError, OSError, sqlite3.Error) as exc:
                    log.warning("could not record the check of %d blobs: %s", len(hashed), exc)
            self._send_start(key, att, spec, *ready, job=job if self.passes == opened else None)

        self._transport(key, drv, call, then, lambda exc: self._start_failed(key, att, exc),
                        slow=bool(hashed))

    def _blob_role(self, job: Job, digest: str) -> str | None:
        """What blob DIGEST is to JOB: the path of a code or dataset file, or a file list."""
        lists = [("code", job.snapshot)] if job.snapshot else []
        lists += [(f"dataset {ds['name']}", ds["digest"]) for ds in job.datasets]
        for label, listed in lists:
            if listed == digest:
                return f"{label} (its file list)"
            try:
                for f in self._manifest(listed):
                    if f[1] == digest:
                        return f[0] if label == "code" else f"{label} file {f[0]}"
            except (MonkeyError, OSError, ValueError):
                continue
        return None

    def _transport(self, key: tuple[str, str], drv: Driver, call: Callable[[], Any],
                   then: Callable[[Any], None], failed: Callable[[BaseException], None],
                   lane: tuple[str, ...] | None = None, slow: bool = False) -> None:
        """Run a transport CALL for the instance KEY in a worker, after the calls made
        earlier on the same LANE (default: KEY itself), or here when the driver's transport
        is quick, the call not SLOW (blobs to hash) and nothing else is under way on it
        (the order stays)."""
        lane = lane or key
        if slow or not drv.quick_transport or self.workers.busy(lane):
            self.workers.submit(lane, call, then, failed)
            return
        try:
            result = call()
        except Exception as exc:  # noqa: BLE001 - handed to `failed`, as a worker would
            failed(exc)
            return
        then(result)

    def _send_start(self, key: tuple[str, str], att: Attempt, spec: dict[str, Any],
                    checkpoint: str, blob_fields: dict[str, Any], job: Job | None = None) -> None:
        """Ask the agent to start the attempt, now that its inputs are on the instance or
        BLOB_FIELDS (the driver's: presigned URLs, never logged nor stored) fetch them.
        JOB: the job as the same pass opened the attempt (read again when None)."""
        job = job or self.store.get_job(att.juid)
        link = self.links.get(key)
        if job is None or job.state != State.DISPATCHING or job.attempts != att.n:
            return
        if link is None or job.request:
            # Not asked: nothing ran. A cancel or pause takes effect; else it is queued again.
            self._never_started(att)
            return
        spec["env"]["MONKEY_CHECKPOINT_DIR"] = checkpoint

        def send() -> None:
            if self.links.get(key) is not link:
                return  # dropped in the same pass: the next sync finds it never started
            try:
                # Not waiting for the reply lets the core go on while the agent spawns; a
                # refusal comes back through poll, the start itself as a `started` event.
                rid = link.send("start", **spec, **blob_fields)
            except AgentGone as exc:
                # The agent may or may not have started it: the next sync decides.
                log.error("dispatch of %s to %s interrupted: %s", att.juid, key[1], exc)
                self.drop_link(key)
                return
            self.starting[(key, rid)] = (att.juid, att.n, spec.get("manifest"))
            following = self.followed.get(key, [])
            if (att.juid, att.n) not in following:  # a health pass may have added it already
                self._follow(key, [*following, (att.juid, att.n)])

        self.prepare_failures.pop(att.juid, None)
        self.to_send.append(send)  # sent once the pass that opened the attempt is committed

    def _follow(self, key: tuple[str, str], attempts: list[tuple[str, int]]) -> None:
        """Tell the instance's driver which attempts live there, when that changed."""
        if self.followed.get(key, []) == attempts:
            return
        drv = self.drivers.get(key[0])
        if drv is not None:
            drv.follow(key[1], attempts)
        if attempts:
            self.followed[key] = attempts
        else:
            self.followed.pop(key, None)

    def _start_failed(self, key: tuple[str, str], att: Attempt, exc: BaseException) -> None:
        """The attempt's inputs could not be made ready: it never reached the agent. The
        job waits a second and tries again; the third failure in a row fails it (a cause
        that lasts must not spin through attempts). An instance that cannot be reached
        (NotReady) is the provider's problem, never the job's: it just waits."""
        log.error("cannot prepare %s attempt %d on %s: %s", att.juid, att.n, key[1], exc)
        if isinstance(exc, BlobDamaged):  # it will not heal by itself: never run it
            self.prepare_failures.pop(att.juid, None)
            self.store.end_attempt(att.juid, att.n, final=State.FAILED, exit_code=None,
                                   signal=None, reason=str(exc))
            return
        self.retry_at[key] = time.time() + 1.0
        if isinstance(exc, NotReady):
            self._never_started(att)
            return
        failures = self.prepare_failures[att.juid] = self.prepare_failures.get(att.juid, 0) + 1
        if failures < _PREPARE_TRIES:
            self._never_started(att)
            return
        self.prepare_failures.pop(att.juid, None)
        self.store.end_attempt(att.juid, att.n, final=State.FAILED, exit_code=None, signal=None,
                               reason=f"cannot prepare its inputs on {key[1]}: {exc}")

    def _manifest(self, digest: str) -> list[Any]:
        files = self.manifests.get(digest)
        if files is None:
            files = json.loads(self.blobs.read_bytes(digest))["files"]  # checked against its digest
            if len(self.manifests) > 256:
                self.manifests.clear()
            self.manifests[digest] = files
        return files

    def start_spec(self, job: Job, drv: Driver, instance: str, run_dir: str, gpus: list[str],
                   has_gpus: bool) -> dict[str, Any]:
        """The agent's `start` request for the job's next attempt."""
        env = drv.job_env({k: v for k, v in job.env.items() if v != REDACTED})
        env.update(self._secrets(job))
        env.update(
            MONKEY_JUID=job.juid,
            MONKEY_ATTEMPT=str(job.attempts),
            MONKEY_RUN_DIR=run_dir,
            MONKEY_PROVIDER=job.provider,
        )  # MONKEY_CHECKPOINT_DIR: once the checkpoint is on the instance
        if gpus or has_gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        code, blobs = self._code_fields((job.provider, instance), job)
        spec_fields: dict[str, Any] = {}
        spec = self.store.job_spec(job.juid)
        if spec is not None:
            spec_fields, spec_blobs = start_fields(spec, self._manifest,
                                                   drv.persist_dir(instance, job.juid))
            blobs += spec_blobs
        datasets = []
        for ds in job.datasets:
            ds_files = [f[:3] for f in self._manifest(ds["digest"])]
            blobs += [f[1] for f in ds_files]
            datasets.append({"digest": ds["digest"], "env": f"MONKEY_DATASET_{ds['name']}",
                             "files": ds_files, "single": ds.get("single", False)})
        return {
            "juid": job.juid, "attempt": job.attempts, "run_dir": run_dir, "argv": job.argv,
            "env": env, **code, "blobs_dir": drv.blobs_dir(instance),
            "datasets": datasets, "_blobs": blobs, **spec_fields,
            **({"time_limit": job.resources.time, "grace": KILL_GRACE} if job.resources.time else {}),
            **({"cwd": job.git["subdir"]} if job.git.get("subdir") else {}),
        }  # fmt: skip

    def _code_fields(self, key: tuple[str, str], job: Job) -> tuple[dict[str, Any], list[str]]:
        """The `start` fields naming the job's code for the instance KEY, and its blobs: the
        manifest's digest alone when the agent holds that list, else a delta against the
        last list of the same workdir it was given, else the full list."""
        if not job.snapshot:
            return {"files": []}, []
        files = [f[:3] for f in self._manifest(job.snapshot)]
        blobs = [f[1] for f in files]
        given = self.given.setdefault(key, set())
        base = self.last_given.get((key, job.workdir))
        fields: dict[str, Any] = {"manifest": job.snapshot}
        if job.snapshot not in given:
            fields["files"] = files
            if base is not None and base in given:
                old = {f[0]: f[:3] for f in self._manifest(base)}
                changes = [f for f in files if old.pop(f[0], None) != f]
                if len(changes) + len(old) < len(files):
                    del fields["files"]
                    fields.update(base=base, changes=changes, removed=list(old))
        given.add(job.snapshot)
        self.last_given[(key, job.workdir)] = job.snapshot
        return fields, blobs

    def _secrets(self, job: Job) -> dict[str, str]:
        ref = self.store.secrets_ref(job.juid)
        if not ref:
            return {}
        try:
            return json.loads((self.home.secrets / ref).read_text())
        except (OSError, ValueError) as exc:
            log.error("secrets of %s unreadable: %s", job.juid, exc)
            return {}

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
            beat = att.heartbeat_at
            silence = now - max(beat, self.linked_at.get(key, 0.0)) if beat is not None else 0.0
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
