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
    from monkey.config import Home


def web_parser(cls: type[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p = cls(
        prog="monkey web",
        description=(
            "Open Monkey Web in a browser (every job, its live output and charts), logged in "
            "by a one-time link; with JOB, that job's page."
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
    p.add_argument("--no-browser", action="store_true", help="only print the link (it works once)")
    p.set_defaults(func=cmd_web)
    return p


def cmd_web(args: argparse.Namespace) -> int:
    from monkey.remote.settings import selected

    if selected():
        url = _remote_link(args.job)
    else:
        url = _local_link(args.job)
    print(url)
    print("(the link logs you in once, within 2 minutes; then log in with your token)")
    if not args.no_browser and _can_open():
        import webbrowser

        webbrowser.open(url)
    return 0


def _page(juid: str | None) -> str:
    return f"/web/jobs/{juid}" if juid else "/web/jobs"


def _remote_link(ref: str | None) -> str:
    from monkey.remote.facade import RemoteMonkey

    m = RemoteMonkey()
    try:
        juid = m.resolve(ref) if ref else None
        path = m.client.call("web_link", _page(juid))
        return m.remote.url.rstrip("/") + path
    finally:
        m.close()


def _local_link(ref: str | None) -> str:
    from urllib.parse import urlencode

    from monkey.config import Home
    from monkey.server import service, websession
    from monkey.store import Store

    home = Home().ensure()
    store = Store(home.db)
    try:
        juid = store.resolve(ref) if ref else None  # an unknown job: one line, nothing started
    finally:
        store.close()
    settings = service.saved_settings(home)
    started = service.status(home) is None
    if started:
        if not settings:  # a first start: plain HTTP on loopback, a port of its own
            settings = service.configure(home, bind=f"127.0.0.1:{_free_port()}", no_tls=True)
        admin = service.first_admin(home)
        service.start(home)
        settings = service.saved_settings(home)
        lines = service.welcome(home, settings, admin)
        print("\n".join(lines), file=sys.stderr)
    user = _local_user(home)
    secret = websession.issue_link(home, user)
    base = service.url(settings).replace("://0.0.0.0:", "://127.0.0.1:")
    if settings.get("tls", True) and not settings.get("cert"):
        print(
            "the server's certificate is self-signed: the browser warns once; its fingerprint "
            "is in `monkey server status`",
            file=sys.stderr,
        )
    return f"{base}/web/login?{urlencode({'once': secret, 'next': _page(juid)})}"


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
