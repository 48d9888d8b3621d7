"""`monkey web [JOB]`: Monkey Web in a browser, logged in by a one-time link. On this
machine: the server of MONKEY_HOME (started when none runs: plain HTTP on 127.0.0.1, as
Jupyter does, so no certificate warning); through a remote: the main node's pages."""

from __future__ import annotations

import argparse
import os
import sys

from monkey.models import MonkeyError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from monkey.config import Home


def web_parser(cls: type[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p = cls(
        prog="monkey web",
        description=(
            "Open Monkey Web in a browser (every job, its live output and charts), logged in "
            "by a one-time link; with JOB, that job's page; --sweep S, a sweep's; --compare "
            "A B..., those jobs side by side."
        ),
        epilog=(
            "The link is printed too (it works once, within 2 minutes). On this machine it "
            "opens the server of MONKEY_HOME, started on 127.0.0.1 (plain HTTP) when none "
            "runs; through a remote, the main node's pages as the remote's user. `monkey dash` "
            "is the terminal dashboard."
        ),
    )
    from monkey.shell.common import job_argument

    job_argument(p, count="?", help="open this job's page (id, unique prefix, or `last`)")
    p.add_argument("-j", dest="job", metavar="JOB", help="same as --juid")
    p.add_argument("--sweep", metavar="S", help="open this sweep's page (id, prefix or name)")
    p.add_argument(
        "--compare",
        nargs="+",
        metavar="JOB",
        help="open the compare page of these jobs (two or more)",
    )
    p.add_argument("--no-browser", action="store_true", help="only print the link (it works once)")
    p.set_defaults(func=cmd_web)
    return p


def cmd_web(args: argparse.Namespace) -> int:
    from monkey.remote.settings import selected

    given = [
        o for o, v in (("JOB", args.job), ("--sweep", args.sweep), ("--compare", args.compare)) if v
    ]
    if len(given) > 1:
        raise MonkeyError(f"give one of JOB, --sweep or --compare, not {' and '.join(given)}")
    if args.compare is not None and len(args.compare) < 2:
        raise MonkeyError("--compare needs two jobs or more: monkey web --compare A B")
    pinned = None
    if selected():
        url, pinned = _remote_link(args)
    else:
        url = _local_link(args)
    print(url)
    print("(the link logs you in once, within 2 minutes; then log in with your token)")
    if pinned:  # a self-signed certificate: the browser warns before the page
        print(
            f"certificate: {pinned} (self-signed: the browser says the connection is not "
            "private; proceed only if the certificate it shows has this SHA-256 fingerprint)"
        )
    if not args.no_browser and _can_open():
        import webbrowser

        webbrowser.open(url)
    return 0


def _page(args: argparse.Namespace, job: Callable[[str], str], sweep: Callable[[str], str]) -> str:
    """The page ARGS ask for, its job and sweep references resolved by JOB and SWEEP (an
    unknown one: one line, nothing opened)."""
    from urllib.parse import quote, urlencode

    if args.sweep:
        return f"/web/sweeps/{quote(sweep(args.sweep))}"
    if args.compare:
        return "/web/compare?" + urlencode([("job", job(ref)) for ref in args.compare])
    return f"/web/jobs/{quote(job(args.job))}" if args.job else "/web/jobs"


def _remote_link(args: argparse.Namespace) -> tuple[str, str | None]:
    """The one-time link on the selected main node, and the fingerprint its certificate
    is pinned to (None: one from a public authority, or plain HTTP)."""
    from monkey.remote.facade import RemoteMonkey

    m = RemoteMonkey()
    try:
        page = _page(args, m.resolve, lambda ref: m.sweep_status(ref)["id"])
        path = m.web_link(page)
        return m.remote.url.rstrip("/") + path, m.remote.fingerprint
    finally:
        m.close()


def _local_link(args: argparse.Namespace) -> str:
    from urllib.parse import urlencode

    from monkey.config import Home
    from monkey.server import service, websession
    from monkey.store import Store

    home = Home().ensure()
    store = Store(home.db)
    try:
        page = _page(args, store.resolve, store.resolve_sweep)  # before anything starts
    finally:
        store.close()
    settings = service.saved_settings(home)
    started = service.status(home) is None
    if started:
        if not settings:  # a first start: this machine's own view, plain HTTP on loopback
            settings = service.configure(
                home, bind=f"127.0.0.1:{_free_port()}", no_tls=True, personal=True
            )
        admin = service.first_admin(home)  # whom the link logs in (no token is shown)
        service.start(home)
        settings = service.saved_settings(home)
        if settings.get("personal"):
            print(
                f"Monkey Web for this machine's jobs at {service.url(settings)} (on 127.0.0.1: "
                "yours only; the link below logs you in); it stops with `monkey daemon stop`",
                file=sys.stderr,
            )
        else:  # a main node's server, configured before: its usual welcome
            print("\n".join(service.welcome(home, settings, admin)), file=sys.stderr)
    user = _local_user(home)
    secret = websession.issue_link(home, user)
    base = service.url(settings).replace("://0.0.0.0:", "://127.0.0.1:")
    if settings.get("tls", True) and not settings.get("cert"):
        print(
            "the server's certificate is self-signed: the browser warns once; its fingerprint "
            "is in `monkey server status`",
            file=sys.stderr,
        )
    return f"{base}/web/login?{urlencode({'once': secret, 'next': page})}"


def _local_user(home: Home) -> str:
    """Who a local link logs in: the user named after this machine's user, else the first
    admin (whoever can read MONKEY_HOME owns this node)."""
    from monkey.store import Store
    from monkey.store.db import local_user

    store = Store(home.db)
    try:
        users = store.users()
    finally:
        store.close()
    me = local_user()
    for u in users:
        if u["name"] == me:
            return me
    admins = [u["name"] for u in users if u["admin"]]
    if not admins:
        raise MonkeyError(
            "this main node has no admin; add one: monkey server user add NAME --admin"
        )
    return admins[0]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _can_open() -> bool:
    """Whether a graphical browser can be opened (never a text one in this terminal)."""
    if sys.platform in ("darwin", "win32"):
        return True
    return bool(
        os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY") or os.environ.get("BROWSER")
    )
