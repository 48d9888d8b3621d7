"""The core's loop: carry out what the store asks, against the drivers, and record every step."""

from __future__ import annotations

import logging
import os
import re
import selectors
import socket
import time
from collections.abc import Callable

from monkey.config import Home, ProviderConfig
from monkey.core.cleanup import HostChores
from monkey.core.dispatch import AHEAD_RUN, KILL_GRACE, Dispatch
from monkey.core.elapsed import Elapsed
from monkey.core.endings import Facts, decide
from monkey.core.endings import span as _span
from monkey.core.links import HEARTBEAT_TIMEOUT, Links
from monkey.core.notifier import Notifier
from monkey.core.outage import Outage
from monkey.core.presence import Presence
from monkey.core.provisioning import LIST_EVERY, Elastic
from monkey.core.room import Room
from monkey.core.start_streaks import StartStreaks
from monkey.core.workers import Workers
from monkey.drivers import driver_class, get_driver, load_providers
from monkey.drivers.agent_link import AgentGone, AgentLink
from monkey.drivers.base import LOST_AFTER, Driver, lost_after
from monkey.models import (
    RETRY_DELAY_MAX,
    Attempt,
    Ending,
    Job,
    MonkeyError,
    Request,
    Resources,
    State,
    can_transition,
    wall_span,
)
from monkey.snapshot.blobs import BlobStore
from monkey.store import Store
from monkey.store.db import Checkpointer
from monkey.store.deps import HOLD
from monkey.store.errors import IllegalTransition, StoreUnavailable
from monkey.tracking import ingest, sweeps
from monkey.version import code_digest, installed_elsewhere, package_version, version

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

log = logging.getLogger("monkey.core")
_PROBE_EVERY = 5.0  # seconds between looks for a new install while the core's own is gone

_IDLE_TICK = 1.0
_ELASTIC_SOON = 0.1  # seconds between elastic passes for jobs that fit nowhere
# Starts an agent refused for a damaged copy (there, or in the bucket) before the job fails:
# each replaces what it found, so more means copies that keep arriving damaged.
_DAMAGED_TRIES = 5
# While events keep coming, a pass begins no sooner than this after the one before: what
# arrives meanwhile (submissions, starts, exits) is handled and committed together, which
# costs far less than a pass each; the agents' held starts keep their slots busy meanwhile.
# A pass after a quiet spell begins at once.
_PASS_GAP = 0.003
MAX_PREEMPTIONS = 10  # a job preempted this often stays preempted (providers.yml: max_preemptions)
# Seconds a provider that gave a job up (no room for it there) is avoided for that job.
GIVEN_UP_COOLDOWN = 600.0


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


class Core(Links, Dispatch):
    """The scheduler: dispatches queued jobs, follows live attempts, applies requests."""

    def __init__(self, home: Home) -> None:
        self.home = home
        self.store = Store(home.db)
        self.checkpointer = Checkpointer(home.db)
        self.notifier = Notifier(home)  # sends `monkey notify` messages off the loop
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
        # Times of the core's own (these four, monotonic): no new connect before (per link),
        # when each link was (re)made, the last ping sent over each link, and the last time
        # this core heard from each instance's agent (the time before it started never counts
        # as silence: see check_health).
        self.retry_at: dict[tuple[str, str], float] = {}
        self.linked_at: dict[tuple[str, str], float] = {}
        self.pinged: dict[tuple[str, str], float] = {}
        self.contact: dict[tuple[str, str], float] = {}
        self.elapsed = Elapsed()  # time since stored wall times (out of reach, idle since...)
        # Per instance: its attempts lost while out of reach, named in the sync of the link
        # made since (their exits, when their agent recorded one, are adopted as late exits).
        self.adrift: dict[tuple[str, str], set[tuple[str, int]]] = {}
        self.started_at = time.time()
        self.started_mono = time.monotonic()
        self.presence = Presence(home)  # tells clients this core runs; knows the last one's end
        self.shifted = False  # the unreachable clocks moved past the time no core ran
        self.link_errors: dict[tuple[str, str], str] = {}  # the last connect error logged
        # Instances whose agent goes away by monkey's doing (released after their attempt,
        # destroyed): their link is dropped quietly and not made again.
        self.releasing: set[tuple[str, str]] = set()
        self.finishing: set[tuple[str, int]] = set()  # attempts whose results are coming
        self.prepare_failures: dict[str, int] = {}  # per job: starts failed in a row
        self.start_streaks = StartStreaks()  # per provider: starts in a row that came to nothing
        self.start_links: set[tuple[str, str]] = set()  # instances a start waits to link to
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
        self.doom_checked = 0.0  # when cancel_doomed last looked (0: never: look at all)
        # Fixed providers found without a free slot, until something frees room: a job
        # queued meanwhile (a wake) cannot start there, so its pass does not look.
        self.full: set[str] = set()
        # Per instance: when its last attempt ended (monotonic) and how long it had run.
        self.ended_at: dict[tuple[str, str], tuple[float, float]] = {}
        self.pass_began = 0.0  # monotonic time of the last pass that handled events
        self.outage = Outage(home.core_status)
        self.room = Room(home.runs)  # whether this machine's disk has room for local starts
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
        self.notifier.close()
        self.store.close()

    def timeout(self) -> float:
        """Until the next queued job's back-off ends. Jobs ready now that the last pass left
        queued fit nowhere: an exit, a worker's outcome or a request wakes the loop when that
        changes (or the idle tick), so they must not make it spin."""
        wait = _IDLE_TICK if self.ready_at is None else min(_IDLE_TICK, self.ready_at - time.time())
        return max(wait, 0.001)

    def tick(self) -> None:
        """One pass: configuration, what drivers learnt, requests, dispatch, health. NOW (the
        wall clock) is what stored times are compared with; the passes' own pace is kept on
        the monotonic clock."""
        now, mono = time.time(), time.monotonic()
        health = mono >= self.next_health
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
        if self.woken or health or self.dirty:  # a job ended, or was cancelled or removed
            self.cancel_doomed()
        self.woken = False
        placed_nowhere = False
        if self.dirty or health or (self.ready_at is not None and self.ready_at <= now):
            self.dirty = False
            if self.ready_at is not None and now + RETRY_DELAY_MAX < self.ready_at < HOLD:
                ended = self.store.end_absurd_backoffs(now)
                log.warning("the wall clock stepped back: %d back-offs end now", ended)
            self.dispatch_ready(now)
            self.ready_at = self.store.next_not_before(now)
            placed_nowhere = any(self.waiting.values()) or any(self.on_demand.values())
        if health:
            self.next_health = mono + 1.0
            self.presence.touch()
            self.check_health(now)
            self.chores.tick()
            self.ping(mono)
            self.elapsed.prune()
        if health or (placed_nowhere and mono - self.elastic_at >= _ELASTIC_SOON):
            # Machines for jobs that fit nowhere are asked for at once, not at the next pass.
            self.elastic_at = mono
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
        log.info(
            "monkey was reinstalled (%s -> %s): restarting the core on it; jobs keep running",
            version(),
            "elsewhere" if now == "gone" else f"{package_version()}+{now}",
        )
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
        for name in set(providers) | set(self.providers):  # an edit is tried again at once
            if providers.get(name) != self.providers.get(name) and self.start_streaks.forget(name):
                self._not_ready(name, None)
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
                self.started_on(key[0])
            elif kind == "preempt-notice":
                self.store.add_event(
                    juid,
                    "preempt-notice",
                    f"{event.get('detail')}; the "
                    f"instance goes in {event['deadline'] - event['ts']:.0f}s",
                    attempt=n,
                )

    def replay(
        self, key: tuple[str, str], juid: str, n: int, events: list[tuple[int, dict[str, Any]]]
    ) -> None:
        """Events of an attempt on the machine KEY, gone, that its agent left in the bucket
        (each with the offset after it in events.jsonl), handled as if it had pushed them."""
        if any(a.juid == juid and a.n == n for a in self.store.adrift_attempts(key[1])):
            self.adrift.setdefault(key, set()).add((juid, n))  # its exit is a late one
        self._handle_pushes(
            key,
            [
                {"push": "event", "juid": juid, "attempt": n, "offset": end, "event": event}
                for end, event in events
            ],
        )

    def _late_exit(self, key: tuple[str, str], juid: str, n: int, event: dict[str, Any]) -> None:
        """An attempt lost while its instance was out of reach ended there meanwhile (or was
        fenced just now): record how, and bring back what it wrote."""
        self.adrift[key].discard((juid, n))
        code, sig = event.get("code"), event.get("signal")
        how = f"exit {code}" if code is not None else f"killed by signal {sig}"
        when = time.strftime("%H:%M:%S", time.localtime(event.get("ts") or time.time()))
        self.store.settle_adrift(
            juid,
            n,
            code,
            sig,
            f"ended on {key[1]} at {when} ({how}), after it had been declared lost",
        )
        drv = self.drivers.get(key[0])
        if drv is not None:
            outputs = self.store.outputs(juid)
            self._transport(
                key,
                drv,
                lambda: drv.transport.finish(key[1], juid, n, outputs, False),
                lambda _: None,
                lambda exc: log.error("fetching results of %s attempt %d failed: %s", juid, n, exc),
                lane=(*key, juid, str(n)),
            )

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
                # a slot taken by a job running there is no fault of the provider's
                taken = any(a.pid and a.juid != juid for a in self.store.live_attempts(key[1]))
                self._never_started(att, None if taken else f"withdrawn by its agent: {error}")
            return
        if "damaged blob" in error:  # the agent removed its copy there: send a good one
            log.warning("%s: %s", key[1], error)
            drv = self.drivers.get(key[0])
            if drv is not None:
                drv.transport.forget_blobs(key[1])
                bad = re.search(r"damaged blob ([0-9a-f]{64}) in the bucket", error)
                if bad:  # the bucket's copy: stored again from the checked local one
                    drv.transport.bucket_damaged(bad.group(1))
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
        if error.startswith("disk full at "):  # the agent's own words
            drv = self.drivers.get(key[0])
            if drv is not None and drv.kind == "local":  # this machine's: the job waits
                att = self.store.get_attempt(juid, n)
                self._not_ready(key[0], self.room.ran_out())
                if att is not None and att.state == "live":
                    self._never_started(att)
                return
            error = f"disk full on {key[1]} at {error[len('disk full at ') :]}"  # say where
        self.store.end_attempt(
            juid,
            n,
            final=State.FAILED,
            exit_code=None,
            signal=None,
            reason=f"could not start: {error}",
        )

    def _forget_given(self, key: tuple[str, str]) -> None:
        """Assume the instance's agent holds no code list."""
        self.given[key] = set()
        self.last_given = {k: v for k, v in self.last_given.items() if k[0] != key}

    def on_exit(
        self, key: tuple[str, str], juid: str, n: int, event: dict[str, Any], offset: int
    ) -> None:
        """Bring the attempt's results back (off the loop), then close it: a reader that
        sees the job end must find its logs complete."""
        att = self.store.get_attempt(juid, n)
        if att is None or att.state != "live" or (juid, n) in self.finishing:
            return  # closed already (an exit replayed by a sync), or being closed
        # How long it ran (never reported started, or unknown: taken as not short).
        ran = event.get("ran")
        if ran is None:
            ran = wall_span(att.started_at, event.get("ts") or time.time())
        ran = AHEAD_RUN if ran is None else ran
        self.ended_at[key] = (time.monotonic(), ran)
        self.finishing.add((juid, n))
        try:
            drv = self.driver(key[0])
        except MonkeyError:
            self._close_attempt(key, juid, n, event, offset)
            return

        job, outputs = self.store.job_with_outputs(juid)
        read = self.passes

        def fetched(exc: BaseException | None) -> None:
            if exc is None and drv.releases_on_finish:
                self.elastic.terminated(key[0], key[1], "released after its attempt")
            if exc is not None:
                log.error("fetching results of %s attempt %d failed: %s", juid, n, exc)
            self._close_attempt(key, juid, n, event, offset, job if self.passes == read else None)

        current = job is not None and job.attempts == n
        if drv.releases_on_finish:
            self.release(key)
        self.changed()  # its slot is free: the next start need not wait for the results
        # On a lane of its own: neither a start there nor another attempt's results wait
        # for these.
        self._transport(
            key,
            drv,
            lambda: drv.transport.finish(key[1], juid, n, outputs, current),
            lambda _: fetched(None),
            fetched,
            lane=(*key, juid, str(n)),
        )

    def _close_attempt(
        self,
        key: tuple[str, str],
        juid: str,
        n: int,
        event: dict[str, Any],
        offset: int,
        job: Job | None = None,
    ) -> None:
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
        elsewhere, nowhere = self.elsewhere(job) if why == Ending.GIVEN_UP else (None, "")
        facts = Facts(
            retries_done=self.store.auto_retries(juid) if job.retries else 0,
            preemptions=self.store.auto_retries(juid, "preempt") if why == Ending.PREEMPTED else 0,
            max_preemptions=int(config.options.get("max_preemptions", MAX_PREEMPTIONS))
            if config
            else MAX_PREEMPTIONS,
            remote=remote,
            host=key[1],
            note=self.outage.job_note(self.home.run_dir(juid, n)) if event.get("code") != 0 else "",
            elsewhere=elsewhere,
            nowhere=nowhere,
        )
        end = decide(job, event, facts)
        if job.state == State.DISPATCHING and not can_transition(job.state, end.final):
            now = self.store.get_job(juid)  # (JOB may be as read before its `started` came)
            if now is not None and now.state == State.DISPATCHING:
                # Its `started` never came (late, or reordered by a watch): its exit proves it
                self.store.attempt_started(juid, n, 0, event.get("ts") or time.time())
        try:
            # The agent's time of the exit: a job that ended while the core was down did not
            # run until the core came back.
            self.store.end_attempt(
                juid,
                n,
                final=end.final,
                exit_code=event.get("code"),
                signal=event.get("signal"),
                reason=end.reason,
                requeue_after=end.requeue,
                offset=offset,
                now=event.get("ts"),
                ran=event.get("ran"),
                requeue_kind=end.requeue_kind,
                adrift=why == Ending.SILENT,
                move_to=end.move_to,
            )
        except IllegalTransition as exc:  # a late event of a job that moved on: never fatal
            log.warning("%s attempt %d: its exit is ignored: %s", juid, n, exc)
        self.signalled.pop((juid, n), None)
        link = self.links.get(key)
        if link is not None and drv is not None and drv.ping_every is not None:
            # fetched: its agent need not keep it for the bucket, nor stay up for it
            self.send_ping(key, link)

    def elsewhere(self, job: Job) -> tuple[str | None, str]:
        """(the provider JOB goes to now that its own gave it up, or None and why none): the
        first of the providers it allows (``run -p a,b``) that could ever hold it and has
        not given it up within the last GIVEN_UP_COOLDOWN seconds."""
        allowed = job.resources.providers or [job.provider]
        cooling = self.store.gave_up(job.juid, time.time() - GIVEN_UP_COOLDOWN)
        reasons = []
        for name in allowed:
            if name == job.provider:
                continue
            config = self.providers.get(name)
            if config is None:
                reasons.append(f"{name} is no longer in providers.yml")
            elif name in cooling:
                reasons.append(f"{name} gave it up too")
            elif why := driver_class(config.type).never_fits(config, job.resources):
                reasons.append(why)
            else:
                return name, ""
        if not reasons:
            return None, ""
        return None, f"; no other provider of {','.join(allowed)} can hold it: " + "; ".join(
            reasons
        )

    def _judge(self, key: tuple[str, str], job: Job, att: Attempt, now: float) -> None:
        """The instance KEY of JOB's live attempt ATT is not linked: once a connect failed,
        or nothing came from it for the heartbeat timeout, the job shows it `unreachable`
        (since this core last heard from it, or started: the time no core ran is not
        silence); past the provider's ``lost_after`` the attempt is lost, once this core
        tried the instance itself (a stored time may hold a step of the wall clock, or the
        hours before a restart). A cloud's or Slurm's own listing ends it sooner when it says
        the machine is gone."""
        since = job.unreachable_since
        quiet = time.monotonic() - self.contact.get(key, self.started_mono)
        why = self.link_errors.get(key)
        if why is None and quiet <= HEARTBEAT_TIMEOUT:
            return  # a connect is on its way (whatever a stored out-of-reach time says)
        if since is None:
            why = why or f"nothing from its agent for {_span(quiet)}"
            heard = now - quiet
            self.store.set_unreachable(
                att.juid,
                att.n,
                heard,
                f"{key[1]} unreachable ({why}); "
                f"lost after {_span(self._lost_after(key[0]))} out of reach",
            )
            self.elapsed.since((att.juid, att.n), heard)  # counted from now on, as it was
            return
        limit = self._lost_after(key[0])
        silence = self.elapsed.since((att.juid, att.n), since)
        if silence <= limit or (silence <= 2 * LIST_EVERY and self._on_spot(key)):
            return  # (a spot machine's listing says first whether it was reclaimed)
        log.warning(
            "%s attempt %d: %s unreachable for %.0fs: lost", att.juid, att.n, key[1], silence
        )
        self.on_exit(
            key,
            att.juid,
            att.n,
            {"reason": Ending.SILENT.value, "silence": silence, "lost_after": limit, "ts": now},
            att.events_offset,
        )

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

    def _never_started(self, att: Attempt, why: str | None = "never started") -> None:
        """The attempt never ran. Unless a cancel or pause was asked, its start counts as
        one that came to nothing because of WHY (None: not the provider's doing)."""
        job = self.store.get_job(att.juid)
        if job is None:
            return
        if job.state == State.DISPATCHING:
            # A cancel or pause asked meanwhile takes effect now; otherwise the job waits
            # for its next start (no retry used: nothing ran).
            final = {Request.CANCEL.value: State.CANCELLED, Request.PAUSE.value: State.PAUSED}.get(
                job.request or "", State.QUEUED
            )
            self.store.end_attempt(
                att.juid, att.n, final=final, exit_code=None, signal=None, reason="never started"
            )
            if final == State.QUEUED and why is not None:
                self.came_to_nothing(
                    job.provider, f"{att.juid} attempt {att.n} on {att.instance}: {why}"
                )
        else:
            self.on_exit(
                (job.provider, att.instance),
                att.juid,
                att.n,
                {"reason": Ending.VANISHED.value},
                att.events_offset,
            )

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
