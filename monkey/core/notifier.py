"""The core's notifier: a thread that turns the outbox into deliveries and sends them.

Why an outbox table filled by ``Store._event`` (and not a cursor over ``events``): the row is
written in the transaction of the state change itself, by the one function every ending goes
through, and only while some target exists; the notifier then needs no bookkeeping of where
it stopped, and jobs removed, events of other kinds or a history from before the first
target cost it nothing. (An SQLite trigger would do the same, but this store's migrations
run statement by statement, and a trigger hides the write from whoever reads ``_event``.)

The thread works on its own connection, in short transactions, never on the core's loop: a
receiver that answers slowly, or not at all, delays only other messages (each send has a
TIMEOUT). Per target, deliveries go in the order they were made: the oldest pending one is
tried, with back-off after a failure (1 s, doubling, at most 10 min), and the next waits for
it; a receiver down for hours gets everything within 10 minutes of its return. A delivery
is marked sent after its receiver answered 2xx: a core killed mid-send sends it again after
its restart, with the same idempotency id. One that the receiver refuses for good (an HTTP
4xx other than 408/425/429, an SMTP login refused) is given up after GIVE_UP tries, so a
target that was set up wrong does not hold back its later messages forever."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from fnmatch import fnmatchcase

from monkey.config import Home
from monkey.core.alerts import WATCH_EVERY, alert_deliveries
from monkey.core.elapsed import Elapsed
from monkey.models import format_duration
from monkey.store.notify import NOTIFY_STATES

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from monkey.store import Store

log = logging.getLogger("monkey.notify")

EVERY = 0.5  # seconds between looks at the outbox and the deliveries due
FIRST_BACKOFF, LONGEST_BACKOFF = 1.0, 600.0
GIVE_UP = 3  # tries of a delivery its receiver refuses for good
KEEP_SENT = 7 * 86400  # seconds a delivery is remembered after it was sent
OUTPUT_LINES = 10  # last lines of output in a failure's message
ENDINGS = ("succeeded", "failed", "lost", "preempted", "cancelled", "timeout", "sweep")
# A rule's events: a job's (or sweep's) ending, a machine idle but billing, spend passing a
# threshold (the last two: monkey.core.alerts).
EVENTS = (*ENDINGS, "idle", "spend")
DEFAULT_EVENTS = ("failed", "lost", "preempted", "timeout", "sweep")
JOB_EVENTS = ",".join(ENDINGS)  # `run --notify`: every ending of that job


def backoff(tries: int) -> float:
    """Seconds before the next try after TRIES failed ones."""
    return min(LONGEST_BACKOFF, FIRST_BACKOFF * 2 ** max(0, tries - 1))


def delivery_id(event: int, owner: str, target: str, what: str) -> str:
    """The idempotency id of EVENT's message of kind WHAT to OWNER's TARGET: the same
    whenever it is made."""
    return hashlib.sha256(f"{event}:{owner}:{target}:{what}".encode()).hexdigest()[:32]


def server_url(home: Home) -> str | None:
    """The main node's URL for links: $MONKEY_SERVER_URL, else that of `monkey server`'s
    last start here; None when this machine serves none."""
    url = os.environ.get("MONKEY_SERVER_URL")
    if url:
        return url.rstrip("/")
    try:
        settings = json.loads((home.root / "server" / "server.json").read_text())
    except (OSError, ValueError):
        return None
    found = settings.get("url") if isinstance(settings, dict) else None  # `server start` saves it
    return found if isinstance(found, str) and found else None


def secret_of(home: Home, target: dict[str, Any]) -> dict[str, Any]:
    """TARGET's secrets (URL, key, password) from its 0600 file."""
    return dict(json.loads((home.secrets / target["secret"]).read_text()))


# -- messages -------------------------------------------------------------------------


def kinds_of(row: dict[str, Any]) -> set[str]:
    """The rule names an ending matches: its state, and ``timeout`` for a time limit."""
    kinds = {row["new"]}
    if row["new"] == "failed" and "time limit" in (row["detail"] or ""):
        kinds.add("timeout")
    return kinds


def _last_lines(home: Home, juid: str, attempt: int | None) -> list[str]:
    """The last OUTPUT_LINES lines attempt ATTEMPT of JUID printed (stdout and stderr as
    written), read from its run directory as `monkey logs` does."""
    if attempt is None:
        return []
    from monkey.client_agent import rundir
    from monkey.logfiles import interleaved, read_segments, tail_segments

    folder = home.run_dir(juid, attempt)
    try:
        segments = interleaved(
            folder / rundir.STDOUT, folder / rundir.STDERR, folder / rundir.ORDER
        )
        text = b"".join(read_segments(tail_segments(segments, OUTPUT_LINES)))
    except OSError:
        return []
    return [line[:500] for line in text.decode(errors="replace").splitlines()]


def message(store: Store, home: Home, row: dict[str, Any], url: str | None) -> dict[str, Any]:
    """The message of an ending (an outbox row): what a person needs to act on it."""
    from monkey.store.cost import dollars, job_costs

    juid, state, now = row["juid"], row["new"], time.time()
    what = "timeout" if "timeout" in kinds_of(row) else state
    duration = store.runtimes([juid], now).get(juid)
    cost = job_costs(store.db, [juid], now).get(juid)
    output = _last_lines(home, juid, row["attempt"]) if state in ("failed", "lost") else []
    reason = row["detail"] or ""
    if row["requeued"]:  # a preempted or lost job queued again
        reason = f"{reason}; queued again" if reason else "queued again"
    title = f"Job {juid} ({row['name']}) {state}" + (f": {reason}" if reason else "")
    fields = [("Job", f"{juid} {row['name']}"), ("State", state)]
    fields += [("Reason", reason)] if reason else []
    fields += [("Duration", format_duration(duration))] if duration is not None else []
    fields += [("Cost", dollars(cost["total"]))] if cost else []
    fields += [("Provider", row["provider"]), ("Owner", row["owner"] or "-")]
    fields += [("Sweep", row["sweep"])] if row["sweep"] else []
    link = f"{url}/web/jobs/{juid}" if url else None
    return {
        "event": what,
        "text": title,
        "title": title,
        "fields": fields,
        "output": output,
        "url": link,
        "ts": row["ts"],
        "job": {
            "id": juid,
            "name": row["name"],
            "state": state,
            "reason": reason or None,
            "owner": row["owner"],
            "provider": row["provider"],
            "sweep": row["sweep"],
            "attempt": row["attempt"],
            "exit_code": row["exit_code"] if state in ("failed", "succeeded") else None,
            "duration": duration,
            "cost": cost["total"] if cost else None,
            "url": link,
        },
        "footer": f"monkey · {row['provider']} · attempt {row['attempt'] or '-'}",
    }


def _message_or_less(
    store: Store, home: Home, row: dict[str, Any], url: str | None
) -> dict[str, Any]:
    """``message``; when part of it cannot be read (a damaged log file, a value the store
    cannot sum), the message without its output, duration and cost, rather than an outbox
    stuck on one row."""
    try:
        return message(store, home, row, url)
    except Exception:  # noqa: BLE001 - logged; the message goes with what is known
        log.exception("notification of %s: sent without output, duration or cost", row["juid"])
        title = f"Job {row['juid']} ({row['name']}) {row['new']}"
        return {
            "event": row["new"],
            "text": title,
            "title": title,
            "fields": [("Job", row["juid"]), ("State", row["new"])],
            "output": [],
            "url": f"{url}/web/jobs/{row['juid']}" if url else None,
            "ts": row["ts"],
            "job": {"id": row["juid"], "name": row["name"], "state": row["new"]},
        }


def sweep_message(
    sweep: str, counts: dict[str, int], row: dict[str, Any], url: str | None
) -> dict[str, Any]:
    """The message of a sweep whose last job ended."""
    total = sum(counts.values())
    parts = ", ".join(f"{counts[s]} {s}" for s in NOTIFY_STATES if counts.get(s))
    title = f"Sweep {sweep} finished: {total} jobs, {parts}"
    link = f"{url}/web/sweeps/{sweep}" if url else None
    return {
        "event": "sweep",
        "text": title,
        "title": title,
        "fields": [("Sweep", sweep), ("Jobs", str(total))]
        + [(s.capitalize(), str(counts[s])) for s in NOTIFY_STATES if counts.get(s)],
        "output": [],
        "url": link,
        "ts": row["ts"],
        "sweep": {"name": sweep, "jobs": total, **counts, "owner": row["owner"], "url": link},
        "footer": "monkey",
    }


def test_message(owner: str, name: str) -> dict[str, Any]:
    """The message `monkey notify test` sends."""
    title = f"Test message from monkey to {name}"
    return {
        "event": "test",
        "text": title,
        "title": title,
        "fields": [("Target", name), ("Owner", owner)],
        "output": [],
        "url": None,
        "ts": time.time(),
        "footer": "monkey notify test",
    }


def _matches(target: dict[str, Any], row: dict[str, Any], kinds: set[str]) -> bool:
    """Whether TARGET's rules (events, sweep, name glob) take this job's ending."""
    if not kinds & set(target["events"].split(",")):
        return False
    if target["sweep"] and row["sweep"] != target["sweep"]:
        return False
    return not target["glob"] or fnmatchcase(row["name"] or "", target["glob"])


def deliveries_for(
    store: Store, home: Home, rows: list[dict[str, Any]], url: str | None
) -> list[dict[str, Any]]:
    """The deliveries outbox ROWS make: per ending, one per target whose rules take it or
    that its job was submitted with; and a sweep's message when it is its last ending."""
    from monkey.store.db import local_user

    out: list[dict[str, Any]] = []
    targets: dict[str, list[dict[str, Any]]] = {}
    # Only a sweep's last ending in the batch may be its end (asked once per batch).
    last_of_sweep = {r["sweep"]: r["event"] for r in rows if r["sweep"]}
    for row in rows:
        if row["name"] is None:  # its job was removed since
            continue
        if row["requeued"] and row["new"] == "failed":  # not over: its retry may succeed
            continue
        owner = row["owner"] or local_user()
        row = {**row, "owner": owner}
        mine = targets.setdefault(owner, store.notify_targets(owner))
        kinds = kinds_of(row)
        chosen = {t["name"] for t in mine if _matches(t, row, kinds)}
        per_job = store.job_notify(row["juid"])
        chosen |= {n for n, events in per_job.items() if kinds & set(events.split(","))}
        known = {t["name"] for t in mine}
        if chosen & known:
            body = json.dumps(_message_or_less(store, home, row, url))
            for name in sorted(chosen & known):
                out.append(_delivery(row, owner, name, kinds_of(row), body))
        if row["sweep"] and last_of_sweep[row["sweep"]] == row["event"]:
            counts = store.sweep_finished(row["sweep"], row["event"])
            if counts is None:
                continue
            names = {
                t["name"]
                for t in mine
                if "sweep" in t["events"].split(",")
                and (not t["sweep"] or t["sweep"] == row["sweep"])
            }
            names |= {n for n, events in per_job.items() if "sweep" in events.split(",")}
            body = json.dumps(sweep_message(row["sweep"], counts, row, url))
            for name in sorted(names & known):
                out.append({**_delivery(row, owner, name, {"sweep"}, body), "what": "sweep"})
    return out


def _delivery(
    row: dict[str, Any], owner: str, target: str, kinds: set[str], body: str
) -> dict[str, Any]:
    what = "sweep" if kinds == {"sweep"} else "timeout" if "timeout" in kinds else row["new"]
    return {
        "id": delivery_id(row["event"], owner, target, what),
        "owner": owner,
        "target": target,
        "juid": row["juid"],
        "what": what,
        "body": body,
    }


# -- the thread -----------------------------------------------------------------------


class Notifier:
    """The core's delivery thread (see the module's docstring)."""

    def __init__(self, home: Home, every: float = EVERY) -> None:
        self.home = home
        self.every = every
        self.stopped = threading.Event()
        self.url = server_url(home)
        # Seconds between looks for idle machines and spend (MONKEY_NOTIFY_WATCH_EVERY).
        try:
            self.watch_every = float(os.environ.get("MONKEY_NOTIFY_WATCH_EVERY") or WATCH_EVERY)
        except ValueError:
            self.watch_every = WATCH_EVERY
        self._pruned = -3600.0  # the last prune (monotonic)
        self.elapsed = Elapsed()  # how long machines have been idle
        self.thread = threading.Thread(target=self._run, name="notifier", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        from monkey.store import Store

        store: Store | None = None
        busy = False
        watched = 0.0
        while not self.stopped.wait(0 if busy else self.every):
            try:
                store = store or Store(self.home.db, create=False)
                self.turn(store)
                if time.monotonic() - watched >= self.watch_every:
                    watched = time.monotonic()
                    self.elapsed.prune()
                    alerts = alert_deliveries(store, self.home, time.time(), self.url, self.elapsed)
                    store.take_outbox([], alerts)
                busy = self.deliver(store)
                if time.monotonic() - self._pruned > 3600:
                    self._pruned = time.monotonic()
                    store.prune_deliveries(time.time() - KEEP_SENT)
            except Exception:  # noqa: BLE001 - a full disk, a busy file: the next look tries again
                log.exception("notifications: will try again")
                busy = False
        if store is not None:
            store.close()

    def turn(self, store: Store) -> None:
        """Turn the outbox's rows into deliveries, a batch at a time."""
        while not self.stopped.is_set():
            rows = store.outbox()
            if not rows:
                return
            store.take_outbox(
                [r["event"] for r in rows], deliveries_for(store, self.home, rows, self.url)
            )

    def deliver(self, store: Store) -> bool:
        """Send each target's oldest pending delivery that is due; whether one was sent (more
        may be due at once)."""
        from monkey.core.deliver import SendError, send
        from monkey.core.reach import reach_for

        sent = False
        now = time.time()
        for head in store.delivery_heads():
            if self.stopped.is_set():
                break
            # Not due yet; a try set further ahead than any back-off is due now (the wall
            # clock stepped back since).
            if now < head["next_try"] <= now + LONGEST_BACKOFF:
                continue
            target = store.notify_target(head["owner"], head["target"])
            if target is None:
                store.delivery_failed(head["seq"], "the target was removed", None)
                continue
            target = {**target, "options": json.loads(target["options"])}
            try:
                hidden = secret_of(self.home, target)
            except (OSError, ValueError) as exc:  # its secret file is gone or damaged
                why = getattr(exc, "strerror", None) or "not JSON"
                store.delivery_failed(head["seq"], f"cannot read the target's secret: {why}", None)
                continue
            try:
                reach = reach_for(store, head["owner"])  # an admin's change counts at once
                send(target, hidden, json.loads(head["body"]), head["id"], reach)
            except SendError as exc:
                tries = head["tries"] + 1
                give_up = exc.permanent and tries >= GIVE_UP
                store.delivery_failed(
                    head["seq"], str(exc), None if give_up else now + backoff(tries)
                )
                log.warning(
                    "notification %s to %s of %s: try %d failed: %s%s",
                    head["id"],
                    head["target"],
                    head["owner"],
                    tries,
                    exc,
                    "; given up" if give_up else "",
                )
                continue
            store.delivery_sent(head["seq"])
            sent = True
        return sent

    def close(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=2)
