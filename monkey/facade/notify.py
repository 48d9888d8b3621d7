"""`monkey notify`: a user's notification targets (Slack, a signed webhook, email), their
rules, and a test message; `run --notify NAME`'s targets.

A target's URL, signing key and SMTP password go to a 0600 file of MONKEY_HOME/secrets
(named by the target's row); the database holds only what `notify list` shows: a masked URL,
the SMTP server and user, the rules."""

from __future__ import annotations

import json
import re
import secrets
from urllib.parse import urlsplit

from monkey.config import Home, write_private
from monkey.core.deliver import KINDS, SendError, check_url, is_loopback, mask_url
from monkey.core.notifier import DEFAULT_EVENTS, EVENTS, secret_of, test_message
from monkey.core.reach import Refused, reach_for, resolve
from monkey.models import MonkeyError, whole_number

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

    from monkey.store import Store

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_PORTS = {"starttls": 587, "ssl": 465, "plain": 25}
_HTTP = {"http": 80, "https": 443}


def parse_events(events: str | Iterable[str] | None) -> str:
    """The rule's events, comma-separated: names of EVENTS, or ``all`` (default: failures,
    losses, preemptions, time limits and finished sweeps); MonkeyError naming the choices."""
    if events is None:
        return ",".join(DEFAULT_EVENTS)
    words = events.split(",") if isinstance(events, str) else list(events)
    words = [w.strip().lower() for w in words if w.strip()]
    if words == ["all"]:  # spend, only with a threshold (see add_target)
        return ",".join(e for e in EVENTS if e != "spend")
    wrong = [w for w in words if w not in EVENTS]
    if wrong or not words:
        raise MonkeyError(
            f"--on {','.join(wrong) or '(nothing)'}: not an event; choose among "
            f"{', '.join(EVENTS)} (comma-separated), or all"
        )
    return ",".join(e for e in EVENTS if e in words)


def _watch_options(
    rule: str, idle_after: str | float | None, spend_over: str | float | None
) -> dict[str, float]:
    """The options of the idle and spend events, checked: {"idle_after": seconds,
    "spend_over": USD}, those given."""
    from monkey.models import parse_duration

    out: dict[str, float] = {}
    events = rule.split(",")
    if idle_after is not None:
        if "idle" not in events:
            raise MonkeyError("--idle-after goes with the idle event: add --on idle (or all)")
        seconds = idle_after if isinstance(idle_after, (int, float)) else None
        try:
            seconds = parse_duration(idle_after) if seconds is None else seconds
        except MonkeyError:
            seconds = -1
        if not 0 < seconds < 366 * 86400:
            raise MonkeyError(
                f"--idle-after {idle_after!r} is not a duration; give one with its unit, "
                "e.g. 30m or 2h"
            )
        out["idle_after"] = float(seconds)
    if spend_over is not None:
        try:
            usd = float(spend_over)
        except ValueError:
            usd = -1.0
        if not 0 < usd < 1e9:
            raise MonkeyError(
                f"--spend-over {spend_over!r} is not an amount; give US dollars above 0, "
                "e.g. 100 (a month's estimated spend)"
            )
        out["spend_over"] = usd
    elif "spend" in events:
        raise MonkeyError(
            "--on spend needs its threshold: --spend-over USD (a month's estimated spend)"
        )
    return out


def _smtp(server: str | None, tls: str) -> tuple[str, int]:
    if not server:
        raise MonkeyError("an email target needs --smtp HOST[:PORT], its mail server")
    host, sep, port = server.rpartition(":") if ":" in server.strip("[]") else (server, "", "")
    host = host.strip("[]")
    if not host or (sep and not 0 < (whole_number(port) or 0) < 65536):
        raise MonkeyError(f"--smtp {server!r}: give HOST[:PORT], e.g. smtp.example.org:587")
    if tls == "plain" and not is_loopback(host):
        raise MonkeyError(
            f"--plain sends the mail and password unencrypted, allowed to loopback only, not "
            f"{host}; use --starttls (default) or --ssl"
        )
    return host, int(port) if sep else _PORTS[tls]


def _addresses(text: str) -> list[str]:
    out = [a.strip() for a in text.split(",") if a.strip()]
    bad = [a for a in out if not re.fullmatch(r"[^@\s,<>]+@[^@\s,<>]+", a)]
    if bad or not out:
        raise MonkeyError(f"{text!r} is not an email address; give TO like me@example.org")
    return out


def add_target(
    home: Home,
    store: Store,
    owner: str,
    name: str,
    kind: str,
    dest: str,
    *,
    secret: str | None = None,
    events: str | Iterable[str] | None = None,
    sweep: str | None = None,
    glob: str | None = None,
    smtp: str | None = None,
    sender: str | None = None,
    user: str | None = None,
    password: str | None = None,
    tls: str = "starttls",
    check: bool = True,
    idle_after: str | float | None = None,
    spend_over: str | float | None = None,
) -> dict[str, Any]:
    """Add OWNER's target NAME (see `monkey notify add`); its listing row, with ``key``
    when a signing key was generated (shown this once). Nothing is stored when it fails.
    IDLE_AFTER ("30m"): how long a machine is idle before the ``idle`` event tells of it;
    SPEND_OVER (USD): the ``spend`` event's threshold for a month's spend (it adds the
    event)."""
    if not _NAME.match(name or ""):
        raise MonkeyError(
            f"{name!r} is not a target name; use letters, digits, '.', '_' or '-' (at most 64)"
        )
    if kind not in KINDS:
        raise MonkeyError(f"{kind!r} is not a target kind; choose slack, webhook or email")
    if store.notify_target(owner, name) is not None:
        raise MonkeyError(
            f"you have a target named {name} already; remove it first (monkey notify remove {name})"
        )
    rule = parse_events(events)
    watch = _watch_options(rule, idle_after, spend_over)
    if "spend_over" in watch and "spend" not in rule.split(","):
        rule = ",".join(e for e in EVENTS if e in {*rule.split(","), "spend"})
    options: dict[str, Any] = {}
    generated = None
    if kind in ("slack", "webhook"):
        if smtp or user or sender:
            raise MonkeyError(f"--smtp, --user and --from are for email targets, not {kind}")
        url = check_url(dest, "Slack webhook" if kind == "slack" else "webhook")
        parts = urlsplit(url)
        _check_reach(store, owner, parts.hostname or "", parts.port or _HTTP[parts.scheme])
        hidden: dict[str, Any] = {"url": url}
        shown = mask_url(url)
        if kind == "webhook":
            if secret in (None, "generated"):
                secret = generated = secrets.token_hex(32)
            if len(secret) < 16:
                raise MonkeyError("--secret is too short to sign with; give 16 characters or more")
            hidden["key"] = secret
        elif secret is not None:
            raise MonkeyError("--secret signs webhook messages; Slack targets take none")
    else:
        if tls not in _PORTS:
            raise MonkeyError(f"{tls!r} is not a TLS mode; choose starttls, ssl or plain")
        host, port = _smtp(smtp, tls)
        _check_reach(store, owner, host, port)
        to = _addresses(dest)
        if user and password is None:
            raise MonkeyError(
                "--user needs its password: --password-env VAR names a variable holding it"
            )
        options = {
            "to": to, "host": host, "port": port, "tls": tls, "user": user,
            "from": _addresses(sender)[0] if sender else (user if user and "@" in user else to[0]),
        }  # fmt: skip
        hidden = {"password": password} if user else {}
        shown = f"{', '.join(to)} via {host}:{port} ({tls}" + (f", user {user})" if user else ")")
        if check:
            from monkey.core.deliver import smtp_session

            try:
                with smtp_session(options, hidden, reach_for(store, owner)):
                    pass
            except SendError as exc:
                raise MonkeyError(f"{exc} (nothing was added)") from None
    options.update(watch)
    ref = f"notify-{secrets.token_hex(8)}.json"
    write_private(home.secrets / ref, json.dumps(hidden).encode())
    try:
        added = store.add_notify_target(
            {
                "owner": owner,
                "name": name,
                "kind": kind,
                "shown": shown,
                "options": json.dumps(options),
                "events": rule,
                "sweep": sweep or None,
                "glob": glob or None,
                "secret": ref,
            }  # fmt: skip
        )
    except BaseException:
        (home.secrets / ref).unlink(missing_ok=True)
        raise
    if not added:
        (home.secrets / ref).unlink(missing_ok=True)
        raise MonkeyError(f"you have a target named {name} already")
    [row] = [r for r in list_targets(store, owner) if r["name"] == name]
    return {**row, "key": generated} if generated else row


def _check_reach(store: Store, owner: str, host: str, port: int) -> None:
    """MonkeyError when a target's HOST is one OWNER's notifications may not reach (see
    ``monkey.core.reach``), or has no address while OWNER is restricted."""
    reach = reach_for(store, owner)
    if reach is None:
        return
    try:
        resolve(host, port, reach)
    except Refused as exc:
        raise MonkeyError(f"{exc} (nothing was added)") from None
    except (OSError, UnicodeError):
        raise MonkeyError(
            f"{host} has no address here; give a host name the main node can resolve "
            "(nothing was added)"
        ) from None


def list_targets(store: Store, owner: str) -> list[dict[str, Any]]:
    """OWNER's targets: name, kind, shown (masked), events, sweep, glob, idle_after and
    spend_over (when set), and their deliveries: pending, sent, failed, last_error."""
    counts = store.delivery_counts(owner)
    return [
        {
            "name": t["name"],
            "kind": t["kind"],
            "shown": t["shown"],
            "events": t["events"].split(","),
            "sweep": t["sweep"],
            "glob": t["glob"],
            **{
                k: v
                for k, v in json.loads(t["options"]).items()
                if k in ("idle_after", "spend_over")
            },
            **counts.get(t["name"], {"pending": 0, "sent": 0, "failed": 0, "last_error": None}),
        }
        for t in store.notify_targets(owner)
    ]


def remove_target(home: Home, store: Store, owner: str, name: str) -> None:
    ref = store.remove_notify_target(owner, name)
    if ref is None:
        raise MonkeyError(f"you have no target named {name!r}; see `monkey notify list`")
    (home.secrets / ref).unlink(missing_ok=True)


def test_target(home: Home, store: Store, owner: str, name: str) -> None:
    """Send OWNER's target NAME a test message now; MonkeyError in one line when it fails."""
    from monkey.core.deliver import send

    target = store.notify_target(owner, name)
    if target is None:
        raise MonkeyError(f"you have no target named {name!r}; see `monkey notify list`")
    target = {**target, "options": json.loads(target["options"])}
    try:
        hidden = secret_of(home, target)
    except (OSError, ValueError) as exc:
        raise MonkeyError(
            f"cannot read target {name}'s secret ({exc}); remove it and add it again"
        ) from None
    try:
        send(
            target,
            hidden,
            test_message(owner, name),
            f"test-{secrets.token_hex(8)}",
            reach_for(store, owner),
        )
    except SendError as exc:
        raise MonkeyError(f"notify test {name}: {exc}") from None
