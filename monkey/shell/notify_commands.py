"""`monkey notify add|list|remove|test`: where word of your jobs goes (Slack, a signed
webhook, email), and on which events."""

from __future__ import annotations

import argparse
import os
import sys

from monkey.models import MonkeyError
from monkey.shell.common import ParserClass, UsageError, make_parser, monkey, print_json

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

EPILOG = """\
Example: monkey notify add team slack https://hooks.slack.com/services/T000/B000/XXXX;
monkey notify add me email me@example.org --smtp smtp.example.org:587 --user me@example.org
--password-env SMTP_PASSWORD --name 'train-*'; monkey run --notify team -- python train.py
(that job's end, whatever the rules). Events: succeeded, failed, lost, preempted,
cancelled, timeout (time limit reached), sweep (a sweep's last job ended); default
failed,lost,preempted,timeout,sweep; or all. URLs, signing keys and passwords are kept in
MONKEY_HOME/secrets (0600), never in the database, logs or `notify list`. Plain http and
--plain SMTP reach loopback only. On a main node a plain user's targets reach public
addresses only, never its loopback, private or own addresses (checked at each send too),
unless an admin allows a range: monkey server notify-allow CIDR. Webhooks get a JSON body with the headers
X-Monkey-Timestamp, X-Monkey-Delivery (the idempotency id, the same on every retry) and
X-Monkey-Signature: sha256=HEX(HMAC-SHA256(key, timestamp + "." + body)).
"""


def notify_parser(cls: ParserClass) -> argparse.ArgumentParser:
    p = make_parser(
        cls,
        "notify",
        "Notifications of your jobs' ends: Slack, signed webhooks, email.",
    )
    p.epilog = EPILOG
    sub = p.add_subparsers(dest="action", required=True, metavar="{add,list,remove,test}")
    add = sub.add_parser(
        "add",
        help="add a target: NAME slack URL | webhook URL | email TO",
        description="Add a notification target, with rules: which events, which jobs.",
        epilog=EPILOG,
    )
    add.add_argument("name", help="the target's name (for --notify, list, remove, test)")
    add.add_argument("kind", choices=("slack", "webhook", "email"), help="the kind of target")
    add.add_argument(
        "dest",
        metavar="URL|TO",
        help="the webhook URL (- reads it from stdin: kept out of your shell's history), or "
        "email addresses (a,b)",
    )
    add.add_argument(
        "--on",
        metavar="EVENTS",
        help="events, comma-separated: succeeded, failed, lost, preempted, cancelled, "
        "timeout, sweep, idle (a cloud machine idle but billing), spend, or all "
        "(default failed,lost,preempted,timeout,sweep)",
    )
    add.add_argument(
        "--idle-after",
        metavar="DURATION",
        help="idle: tell of a machine idle this long (default 30m)",
    )
    add.add_argument(
        "--spend-over",
        metavar="USD",
        help="spend: tell when your estimated spend of the month passes USD (adds the event)",
    )
    add.add_argument("--sweep", metavar="S", help="only this sweep's jobs")
    add.add_argument("--name", dest="glob", metavar="GLOB", help="only jobs whose name matches")
    add.add_argument(
        "--secret",
        metavar="KEY|generated",
        help="webhook: the HMAC signing key (default: generated, printed once)",
    )
    add.add_argument("--smtp", metavar="HOST[:PORT]", help="email: the mail server")
    add.add_argument("--from", dest="sender", metavar="ADDR", help="email: the sender")
    add.add_argument("--user", help="email: log in as this user")
    add.add_argument(
        "--password-env",
        metavar="VAR",
        help="email: the environment variable holding --user's password (else asked)",
    )
    tls = add.add_mutually_exclusive_group()
    for flag, text in (
        ("starttls", "email: STARTTLS (default; port 587)"),
        ("ssl", "email: TLS from the start (port 465)"),
        ("plain", "email: no TLS, to a loopback server only (port 25)"),
    ):
        tls.add_argument(f"--{flag}", dest="tls", action="store_const", const=flag, help=text)
    add.add_argument(
        "--no-check", action="store_true", help="email: add without logging in to the server"
    )
    ls = sub.add_parser(
        "list",
        help="your targets, their rules and deliveries",
        description="Your targets (URLs masked), their rules, pending/sent/failed deliveries.",
    )
    ls.add_argument("--json", action="store_true", help="print JSON")
    rm = sub.add_parser(
        "remove", help="remove a target", description="Remove a target and its pending messages."
    )
    rm.add_argument("name")
    test = sub.add_parser(
        "test",
        help="send a target a test message now",
        description="Send a test message now; one line and exit 1 when it fails.",
    )
    test.add_argument("name")
    p.set_defaults(func=cmd_notify)
    return p


def cmd_notify(args: argparse.Namespace) -> int:
    m = monkey()
    if args.action == "add":
        return _add(m, args)
    if args.action == "remove":
        m.notify_remove(args.name)
        print(f"notify target {args.name} removed")
        return 0
    if args.action == "test":
        m.notify_test(args.name)
        print(f"test message sent to {args.name}")
        return 0
    rows = m.notify_list()
    if args.json:
        print_json(rows)
        return 0
    if not rows:
        print("no notify targets; add one: monkey notify add NAME slack|webhook URL | email TO")
        return 0
    from monkey.shell.table import render

    render(
        ["NAME", "KIND", "TARGET", "EVENTS", "JOBS", "PENDING", "SENT", "FAILED", "LAST ERROR"],
        [
            [
                r["name"],
                r["kind"],
                r["shown"],
                events_text(r),
                _jobs(r),
                str(r["pending"]),
                str(r["sent"]),
                str(r["failed"]),
                r["last_error"] or "-",
            ]
            for r in rows
        ],
    )
    return 0


def events_text(row: dict[str, Any]) -> str:
    """A target's events as `notify list` shows them: ``failed,idle>30m,spend>$100.00``."""
    from monkey.core.alerts import IDLE_AFTER
    from monkey.models import format_duration
    from monkey.store.cost import dollars

    def one(event: str) -> str:
        if event == "idle":
            return f"idle>{format_duration(row.get('idle_after', IDLE_AFTER))}"
        if event == "spend" and row.get("spend_over") is not None:
            return f"spend>{dollars(row['spend_over'])}"
        return event

    return ",".join(one(e) for e in row["events"])


def _jobs(row: dict[str, Any]) -> str:
    parts = ([f"sweep {row['sweep']}"] if row["sweep"] else []) + (
        [f"name {row['glob']}"] if row["glob"] else []
    )
    return ", ".join(parts) or "all mine"


def _add(m: Any, args: argparse.Namespace) -> int:
    options: dict[str, Any] = {
        "events": args.on,
        "sweep": args.sweep,
        "glob": args.glob,
        "idle_after": args.idle_after,
        "spend_over": args.spend_over,
    }
    if args.kind == "email":
        password = None
        if args.user:
            password = _password(args)
        options.update(
            smtp=args.smtp,
            sender=args.sender,
            user=args.user,
            password=password,
            tls=args.tls or "starttls",
            check=not args.no_check,
        )
    else:
        wrong = [
            flag
            for flag, value in (
                ("--smtp", args.smtp),
                ("--from", args.sender),
                ("--user", args.user),
                ("--password-env", args.password_env),
                ("--" + (args.tls or ""), args.tls),
            )
            if value
        ]
        if wrong:
            raise UsageError(f"monkey notify add: {wrong[0]} is for email targets, not {args.kind}")
        if args.secret is not None:
            options["secret"] = args.secret
    dest = args.dest
    if dest == "-" and args.kind != "email":  # the URL is a secret: not on the command line
        dest = sys.stdin.readline().strip()
        if not dest:
            raise MonkeyError("notify add: no URL on stdin; pipe it in, e.g. < hook-url.txt")
    row = m.notify_add(args.name, args.kind, dest, **options)
    print(
        f"notify target {row['name']} added: {row['kind']} {row['shown']}, on "
        f"{events_text(row)} ({_jobs(row)})"
    )
    if row.get("key"):
        print(
            f"signing key (shown this once; receivers check X-Monkey-Signature with it): "
            f"{row['key']}"
        )
    return 0


def _password(args: argparse.Namespace) -> str:
    """--user's password: from --password-env's variable, else asked on the terminal."""
    if args.password_env:
        value = os.environ.get(args.password_env)
        if not value:
            raise MonkeyError(
                f"--password-env {args.password_env}: no such variable here (or it is empty); "
                f"export {args.password_env}=... first"
            )
        return value
    if not sys.stdin.isatty():
        raise MonkeyError(
            "--user needs its password: --password-env VAR names a variable holding it"
        )
    import getpass

    return getpass.getpass(f"SMTP password of {args.user}: ")


def notified(note: dict[str, Any]) -> str:
    """A `monkey notify` message of a job as `info job` shows it."""
    text = f"{note['target']} ({note['what']}): {note['state']}"
    if note["state"] != "sent" and note["tries"]:
        text += f" after {note['tries']} tries, last: {note['last_error']}"
    return text
