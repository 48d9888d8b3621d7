"""`monkey dash`: open the full-screen dashboard."""

from __future__ import annotations

import argparse
import os
import sys

from monkey.models import MonkeyError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# A dashboard restarted onto reinstalled code opens on this job ("": on the table).
REOPEN = "MONKEY_DASH_JOB"


def dash_parser(cls: type[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p = cls(
        prog="monkey dash",
        description=(
            "Open the dashboard of live jobs, logs, metrics and instances (? lists the keys)."
        ),
    )
    from monkey.shell.common import job_argument

    job_argument(p, count="?", help="open on this job (id, unique prefix, or `last`)")
    p.set_defaults(func=cmd_dash)
    return p


def cmd_dash(args: argparse.Namespace) -> int:
    from monkey.shell.common import monkey as facade
    from monkey.shell.common import print_error

    juid = None
    reopen = os.environ.pop(REOPEN, None)
    if reopen is not None:
        args.job = reopen or None
    monkey = None
    if args.job:
        monkey = facade()  # this machine's, or the selected main node's
        try:
            juid = monkey.job(args.job).juid
        except BaseException:
            _close(monkey)
            raise
    if not (
        sys.stdin.isatty() and sys.__stderr__ is not None and sys.__stderr__.isatty()
    ):  # Textual draws on stderr
        if monkey is not None:
            _close(monkey)
        raise MonkeyError(
            "the dashboard needs a terminal; use `monkey list jobs` or "
            "`monkey info job JOB` in scripts"
        )
    from monkey.tui.app import DashApp

    monkey = monkey or facade()
    app = DashApp(monkey, job=juid)
    try:
        app.run()
    finally:
        _close(monkey)
    if app.crash:
        print_error(app.crash)
        return 1
    if app.restart and "monkey.shell.repl" in sys.modules:  # the shell restarts at `dash`
        print(f"{app.restart}; type `dash` to open the new dashboard", file=sys.stderr)
    elif app.restart:
        from monkey.version import restart

        print(f"{app.restart}; restarting the dashboard", file=sys.stderr)
        restart({REOPEN: app.reopen or ""})
    return 0


def _close(monkey: Any) -> None:
    """Close this machine's store, or the connection to a main node."""
    store = getattr(monkey, "store", None)  # a RemoteMonkey has none
    if store is not None:
        store.close()
    else:
        monkey.close()
