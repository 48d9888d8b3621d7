"""`monkey server ...`: run the main node's HTTPS API, and manage its users."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from monkey.models import MonkeyError
from monkey.shell.common import ParserClass, make_parser, print_json

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

EPILOG = """\
The first start makes a self-signed certificate (unless --cert/--key) and an admin user
named after you, and prints a ready `monkey remote add` line with its token. Plain HTTP
(--no-tls) is allowed on loopback only. Keep it up across reboots with a systemd user unit:
`monkey server install-service` writes ~/.config/systemd/user/monkey-server.service; then
systemctl --user enable --now monkey-server (and `loginctl enable-linger` to run logged out).
"""


def server_parser(cls: ParserClass) -> argparse.ArgumentParser:
    p = make_parser(
        cls,
        "server",
        "Run this machine as a main node: an HTTPS API beside the core "
        "that laptops reach with `monkey remote add`.",
    )
    p.epilog = EPILOG
    sub = p.add_subparsers(
        dest="action",
        required=True,
        metavar="{start,run,stop,status,user,quota,audit,notify-allow,install-service}",
    )
    for action, text in (
        ("start", "start in the background (and the core beside it)"),
        ("run", "serve in the foreground"),
    ):
        a = sub.add_parser(action, help=text, description=text[0].upper() + text[1:] + ".")
        a.add_argument(
            "--bind",
            metavar="HOST:PORT",
            help="where to listen (default 127.0.0.1:8443, or the last start's)",
        )
        a.add_argument("--cert", metavar="PEM", help="serve this certificate (with --key)")
        a.add_argument("--key", metavar="PEM", help="the certificate's private key")
        a.add_argument("--no-tls", action="store_true", help="plain HTTP: loopback only")
        a.add_argument(
            "--trusted-proxy",
            action="append",
            metavar="CIDR",
            help="a reverse proxy in front of the server (address or network, repeatable; "
            "none: no proxy): its X-Forwarded-For names the client; kept for the next start",
        )
    sub.add_parser(
        "stop", help="stop the server (the core goes on)", description="Stop the server."
    )
    st = sub.add_parser(
        "status",
        help="whether it runs, its URL and fingerprint",
        description="Whether the server runs, its URL and certificate fingerprint.",
    )
    st.add_argument("--json", action="store_true", help="print JSON")
    svc = sub.add_parser(
        "install-service",
        help="write a systemd user unit that keeps it up",
        description="Write ~/.config/systemd/user/monkey-server.service.",
    )
    svc.add_argument("--print", action="store_true", help="print the unit instead of writing it")
    user = sub.add_parser(
        "user",
        help="add, list, remove users; rotate a token",
        description="The server's users and their tokens.",
    )
    us = user.add_subparsers(dest="user_action", required=True, metavar="{add,list,remove,token}")
    add = us.add_parser("add", help="add a user; prints its token once", description="Add a user.")
    add.add_argument("name")
    add.add_argument("--admin", action="store_true", help="may act on every job")
    ls = us.add_parser(
        "list", help="users: name, admin, created, last used", description="List users."
    )
    ls.add_argument("--json", action="store_true", help="print JSON")
    rm = us.add_parser(
        "remove", help="remove a user; its token is refused at once", description="Remove a user."
    )
    rm.add_argument("name")
    tok = us.add_parser(
        "token",
        help="a new token for a user; the old one is refused at once",
        description="Rotate a user's token.",
    )
    tok.add_argument("name")
    _quota_parser(sub)
    allow = sub.add_parser(
        "notify-allow",
        help="let plain users' notify targets reach an address range (or list them)",
        description="Plain users' notify targets (webhook, Slack, SMTP) may reach public "
        "addresses only, never this main node's loopback, link-local, private or own "
        "addresses; let them reach CIDR too, remove a range with --remove, or list them.",
    )
    allow.add_argument("cidr", nargs="?", metavar="CIDR", help="e.g. 10.1.0.0/16 or ::1/128")
    allow.add_argument("--remove", action="store_true", help="remove CIDR from the list")
    audit = sub.add_parser(
        "audit",
        help="the audit log: refused tokens, logins, admin actions, actions on jobs",
        description="The server's audit log (MONKEY_HOME/server/audit.jsonl and its rotated "
        "files), newest last: when, who, from where, what, on what, and the outcome.",
    )
    audit.add_argument("--user", metavar="U", help="this user's events only")
    audit.add_argument("--since", metavar="AGE", help="events of the last AGE only (90m, 12h, 7d)")
    audit.add_argument("--json", action="store_true", help="print JSON lines")
    p.set_defaults(func=cmd_server)
    return p


def cmd_server(args: argparse.Namespace) -> int:
    if args.action == "quota":  # through the facade: on a remote's main node too
        return _quota(args)
    if args.action == "notify-allow":
        return _notify_allow(args)
    from monkey.config import Home
    from monkey.server import service

    home = Home().ensure()
    if args.action in ("start", "run"):
        running = service.status(home)
        if running:  # its settings stay as it runs with them
            raise MonkeyError(
                f"a server is already running for {home.root} (pid {running}); "
                "`monkey server stop` first to start it with other settings"
                if args.action == "run"
                or args.bind
                or args.cert
                or args.no_tls
                or args.trusted_proxy
                else f"the server is already running (pid {running}); see `monkey server status`"
            )
        settings = service.configure(
            home, args.bind, args.cert, args.key, args.no_tls, args.trusted_proxy, personal=False
        )
        if args.action == "run":
            lines = service.welcome(home, settings, service.first_admin(home))
            print("\n".join([*lines, "serving in the foreground (Ctrl-C stops it)"]), flush=True)
            return service.serve(home)
        pid = service.start(home)  # then the admin: a token is never shown for a server that failed
        print(f"server running (pid {pid})")
        print("\n".join(service.welcome(home, settings, service.first_admin(home))))
        return 0
    if args.action == "stop":
        stopped = service.stop(home)
        print(f"server stopped (pid {stopped})" if stopped else "server was not running")
        return 0
    if args.action == "status":
        return _status(home, args.json)
    if args.action == "install-service":
        return _install_service(home, args.print)
    if args.action == "audit":
        return _audit(home, args)
    return _user(home, args)


def _audit(home: object, args: argparse.Namespace) -> int:
    import json

    from monkey.config import Home
    from monkey.housekeeping import parse_age
    from monkey.server import audit

    assert isinstance(home, Home)
    since = time.time() - parse_age(args.since) if args.since else None
    events = audit.read(home, args.user, since)
    if args.json:
        for event in events:
            print(json.dumps(event, ensure_ascii=False))
        return 0
    if not events:
        print(
            "no events"
            + (" of that user" if args.user else "")
            + (" in that time" if since else "")
        )
        return 0
    from monkey.shell.table import render

    render(
        ["TIME", "USER", "FROM", "ACTION", "TARGET", "OUTCOME", "DETAIL"],
        [
            [
                time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e["at"])),
                e.get("user") or "-",
                e.get("peer") or "-",
                str(e.get("action")),
                e.get("target") or "-",
                str(e.get("outcome")),
                " ".join(x for x in (e.get("token"), e.get("detail")) if x) or "-",
            ]
            for e in events
        ],
    )
    return 0


def _status(home: object, as_json: bool) -> int:
    from monkey.config import Home
    from monkey.server import service
    from monkey.server.tls import fingerprint

    assert isinstance(home, Home)
    pid = service.status(home)
    files = service.Files(home)
    try:
        import json

        settings = json.loads(files.settings.read_text())
    except (OSError, ValueError):
        settings = None
    info: dict[str, Any] = {
        "running": bool(pid),
        "pid": pid,
        "url": service.url(settings) if settings else None,
        "fingerprint": None,
    }
    if settings and settings.get("tls", True):
        cert = Path(settings["cert"]) if settings.get("cert") else files.cert
        if cert.exists():
            info["fingerprint"] = fingerprint(cert)
    from monkey.core import daemon
    from monkey.server.supervise import restarts

    core, again = daemon.status(home), restarts(home)
    info["core"] = {"pid": core, "restarts": int(again["count"]), "last_restart": again["last_at"]}
    if as_json:
        print_json(info)
    elif pid:
        print(f"server running (pid {pid}) at {info['url']}")
    else:
        print("server not running; start it: monkey server start")
    if not as_json and info["fingerprint"]:
        print(f"certificate: {info['fingerprint']}")
    if not as_json:
        import time

        line = f"core: {'running (pid ' + str(core) + ')' if core else 'not running'}"
        if again["count"]:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(again["last_at"]))
            line += f"; restarted by the server {int(again['count'])} time(s), last at {when}"
        print(line)
    return 0 if pid else 3


def _install_service(home: object, only_print: bool) -> int:
    import os

    from monkey.config import Home
    from monkey.server.service import systemd_unit

    assert isinstance(home, Home)
    unit = systemd_unit(home)
    if only_print:
        print(unit, end="")
        return 0
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    path = Path(base) / "systemd" / "user" / "monkey-server.service"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(unit)
    print(
        f"wrote {path}\nnow: systemctl --user daemon-reload && systemctl --user enable --now "
        "monkey-server\n(and `loginctl enable-linger` to keep it up while you are logged out)"
    )
    return 0


def _ready_line(home: object, name: str, token: str) -> None:
    """The `monkey remote add` line for NAME's laptop (on stderr: stdout's last line is the
    token, for scripts)."""
    import sys

    from monkey.config import Home
    from monkey.server.service import remote_add_line

    assert isinstance(home, Home)
    print(f"on {name}'s laptop: {remote_add_line(home, token)}", file=sys.stderr)


def _user(home: object, args: argparse.Namespace) -> int:
    from monkey.config import Home
    from monkey.store import Store

    assert isinstance(home, Home)
    store = Store(home.db)
    if args.user_action in ("add", "token", "remove"):
        try:
            done = _user_change(home, store, args)
        except MonkeyError as exc:
            _audit_admin(home, f"user {args.user_action}", args.name, str(exc))
            raise
        _audit_admin(home, f"user {args.user_action}", args.name)
        return done
    users = [{k: v for k, v in u.items() if k != "digest"} for u in store.users()]
    if args.json:
        print_json(users)
        return 0
    from monkey.shell.table import render

    def when(ts: float | None) -> str:
        return "-" if ts is None else time.strftime("%Y-%m-%d %H:%M", time.localtime(ts))

    render(
        ["USER", "ADMIN", "CREATED", "LAST USED"],
        [
            [u["name"], "yes" if u["admin"] else "no", when(u["created_at"]), when(u["last_used"])]
            for u in users
        ],
    )
    return 0


def _notify_allow(args: argparse.Namespace) -> int:
    from monkey.shell.common import UsageError, monkey

    if args.remove and not args.cidr:
        raise UsageError("monkey server notify-allow --remove: name the range, e.g. 10.0.0.0/8")
    ranges = monkey().notify_allow(args.cidr, args.remove)
    if args.cidr:
        from monkey.core.reach import parse_cidr

        done = "removed from" if args.remove else "added to"
        print(f"{parse_cidr(args.cidr)} {done} the ranges plain users' notify targets may reach")
    elif not ranges:
        print(
            "plain users' notify targets reach public addresses only; allow a range: "
            "monkey server notify-allow CIDR"
        )
    for cidr in ranges if not args.cidr else []:
        print(cidr)
    return 0


def _user_change(home: object, store: object, args: argparse.Namespace) -> int:
    """`server user add|token|remove NAME`."""
    from monkey.config import Home
    from monkey.server import auth, websession
    from monkey.store import Store

    assert isinstance(home, Home) and isinstance(store, Store)
    if args.user_action == "add":
        token = auth.add_user(store, args.name, args.admin)
        print(
            f"user {args.name} added{' (admin)' if args.admin else ''}; its token, shown only now:"
        )
        print(token)
        _ready_line(home, args.name, token)
        return 0
    if args.user_action == "token":
        token = auth.rotate(store, args.name)
        websession.end_user_sessions(home, args.name)  # its web sessions too
        print(f"a new token for {args.name} (the old one is refused from now on), shown only now:")
        print(token)
        _ready_line(home, args.name, token)
        return 0
    if not store.remove_user(args.name):
        raise MonkeyError(f"no user {args.name!r}; see `monkey server user list`")
    websession.end_user_sessions(home, args.name)
    print(f"user {args.name} removed; its token is refused from now on")
    return 0


def _audit_admin(home: object, action: str, target: str, error: str | None = None) -> None:
    """An admin command run on the main node itself, in the audit log (its ERROR: failed)."""
    from monkey.config import Home
    from monkey.server import audit
    from monkey.store.db import local_user

    assert isinstance(home, Home)
    outcome = "error" if error else "ok"
    audit.record(
        home, action, user=local_user(), peer="local", target=target, outcome=outcome, detail=error
    )


def _quota_parser(sub: Any) -> None:
    quota = sub.add_parser(
        "quota",
        help="set, list, remove users' quotas (jobs, GPUs, $/h, share per provider; storage)",
        description="Quotas: the most concurrent jobs, GPUs and estimated $/hour a user's "
        "jobs may take on a provider (a job over quota waits, saying why), and the user's "
        "fair-share weight there; and the bytes of blobs a user's uploads and jobs may hold "
        "(--storage: a blob counts for each user holding it; an upload counts for the gc "
        "grace, then only while a job uses it). The most specific entry that sets a value "
        "wins: user and provider, user, default and provider, default.",
    )
    qs = quota.add_subparsers(dest="quota_action", required=True, metavar="{set,list,remove}")
    st = qs.add_parser(
        "set", help="set a user's (or the default) limits", description="Set quota limits."
    )
    for a in (
        st,
        qs.add_parser("remove", help="remove a quota entry", description="Remove a quota entry."),
    ):
        who = a.add_mutually_exclusive_group(required=True)
        who.add_argument("user", nargs="?", help="a user of this server")
        who.add_argument("--default", action="store_true", help="everyone without their own")
        a.add_argument("--provider", metavar="P", help="on this provider only (default: all)")
    st.add_argument("--jobs", metavar="N", help="most concurrent jobs (unlimited lifts it)")
    st.add_argument("--gpus", metavar="N", help="most GPUs of running jobs")
    st.add_argument(
        "--spend", metavar="USD_PER_HOUR", help="most estimated $/hour of running jobs (clouds)"
    )
    st.add_argument(
        "--share",
        metavar="W",
        help="fair-share weight (default 1): a user with 2 gets twice the slots of one with 1",
    )
    st.add_argument(
        "--storage",
        metavar="SIZE",
        help="most bytes of blobs the user's uploads and jobs hold on this main node (50G; "
        "all providers' entry only); an upload beyond it is refused",
    )
    ls = qs.add_parser("list", help="the quota entries", description="List quota entries.")
    ls.add_argument("--json", action="store_true", help="print JSON")


def _limit_text(value: float | None, spend: bool = False) -> str:
    from monkey.store.quotas import UNLIMITED

    if value is None:
        return "-"
    if value == UNLIMITED:
        return "unlimited"
    from monkey.core.quota import usd

    return f"{usd(value)}/h" if spend else str(int(value))


def _share_text(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def _quota(args: argparse.Namespace) -> int:
    from monkey.shell.common import monkey

    m = monkey()
    action = args.quota_action
    user = None if getattr(args, "default", False) else args.__dict__.get("user")
    if action == "set":
        q = m.set_quota(
            user, args.provider, args.jobs, args.gpus, args.spend, args.share, args.storage
        )
        print(f"quota {_entry_name(q)}: {_limits_line(q)}")
        return 0
    if action == "remove":
        m.remove_quota(user, args.provider)
        print(
            f"quota of {'the default' if user is None else user} on "
            f"{args.provider or 'all providers'} removed"
        )
        return 0
    quotas = m.quotas()
    if args.json:
        print_json(quotas)
        return 0
    if not quotas:
        print("no quotas; set one: monkey server quota set USER|--default --jobs N")
        return 0
    from monkey.shell.table import render

    storage = any(q.get("storage") is not None for q in quotas)  # its column once one is set
    render(
        ["USER", "PROVIDER", "JOBS", "GPUS", "SPEND", "SHARE", *(["STORAGE"] if storage else [])],
        [
            [
                "(default)" if q["user"] == "*" else q["user"],
                "(all)" if q["provider"] == "*" else q["provider"],
                _limit_text(q["jobs"]),
                _limit_text(q["gpus"]),
                _limit_text(q["spend"], spend=True),
                _share_text(q.get("share")),
                *([_storage_text(q.get("storage"))] if storage else []),
            ]
            for q in quotas
        ],
    )
    return 0


def _entry_name(q: dict[str, Any]) -> str:
    who = "default" if q["user"] == "*" else q["user"]
    return f"{who} on {'all providers' if q['provider'] == '*' else q['provider']}"


def _limits_line(q: dict[str, Any]) -> str:
    said = [
        f"{name} {_limit_text(q[name], name == 'spend')}"
        for name in ("jobs", "gpus", "spend")
        if q[name] is not None
    ]
    if q.get("share") is not None:
        said.append(f"share {_share_text(q['share'])}")
    if q.get("storage") is not None:
        said.append(f"storage {_storage_text(q['storage'])}")
    return ", ".join(said)


def _storage_text(value: float | None) -> str:
    from monkey.models import human_size
    from monkey.store.quotas import UNLIMITED

    if value is None:
        return "-"
    return "unlimited" if value == UNLIMITED else human_size(value)


def print_quota_use(rows: list[dict[str, Any]]) -> None:
    """`list providers`' section: each user's use of each provider against their quota."""
    from monkey.shell.table import render

    def cell(u: dict[str, Any], spend: bool = False) -> str:
        from monkey.core.quota import usd

        used = usd(u["used"]) if spend else str(int(u["used"]))
        if u["limit"] is None:
            return used
        return f"{used}/{_limit_text(u['limit'], spend)}"

    print()
    render(
        ["QUOTA USER", "PROVIDER", "JOBS", "GPUS", "SPEND", "HELD"],
        [
            [
                r["user"] or "(no owner)",
                r["provider"],
                cell(r["jobs"]),
                cell(r["gpus"]),
                cell(r["spend"], spend=True),
                str(r["held"]),
            ]
            for r in rows
        ],
    )
