"""Which machine a command line goes to: `--remote NAME` anywhere before `--` (or
$MONKEY_REMOTE, or `monkey remote use`), and which commands work through a remote yet."""

from __future__ import annotations

import argparse
import os

from monkey.shell.common import UsageError


class NotRemote(UsageError):
    """A command that cannot go through a remote yet (exit 2, printed as it is)."""


# The facade methods (monkey.contract) each command calls, by command or (command,
# subcommand): a command works through a remote when every one of them crosses one. () is
# a command of this machine's own settings and files; a command not here does not work
# through a remote (the main node's own `server` commands).
USES: dict[str | tuple[str, str], tuple[str, ...]] = {
    **dict.fromkeys(("remote", "completion", "init"), ()),
    "run": ("run",),
    "rerun": ("rerun", "rerun_sweep"),
    "clone": ("clone",),
    "cat": ("files", "cat"),
    "pull": ("persisted",),
    "logs": ("output_chunks", "follow"),
    "job": ("cancel", "pause", "resume", "retry", "set_priority", "note", "tag"),
    "kill": ("cancel",),
    "info": ("info",),
    "metrics": ("metrics",),
    "search": ("search",),
    "sweep": (
        "sweep",
        "sweeps",
        "sweep_status",
        "sweep_control",
        "sweep_analysis",
        "sweep_note",
        "sweep_tag",
    ),
    "dash": ("dashboard_state", "jobs_changed"),
    "web": ("web_link",),
    "compare": ("compare",),
    "diff": ("diff",),
    "plot": ("plot",),
    "report": ("report",),
    "export": ("export",),
    "rm": ("rm_select", "rm"),
    "du": ("du",),
    "gc": ("gc",),
    "verify": ("verify",),
    "create": ("create_instance",),
    "delete": ("delete_instance",),
    "notify": ("notify_add", "notify_list", "notify_remove", "notify_test"),
    "provider": ("provider_add", "check_provider"),  # add: the main node runs it itself
    "daemon": ("start_core", "core_status"),
    ("list", "jobs"): ("job_listing",),
    ("list", "providers"): ("provider_status",),
    ("list", "sweeps"): ("sweeps",),
    ("server", "quota"): ("quotas", "set_quota", "remove_quota"),
    ("server", "notify-allow"): ("notify_allow",),
}


def remote_ready(name: str, args: argparse.Namespace) -> bool:
    """Whether command NAME (parsed into ARGS) works through a remote: every facade method
    it calls crosses one (monkey.contract)."""
    from monkey.contract import Crossing, methods

    sub = getattr(args, "what", None) or getattr(args, "action", None)
    uses = USES.get((name, sub) if isinstance(sub, str) and (name, sub) in USES else name)
    if uses is None:
        return False
    rules = methods()
    return all(rules[m].crossing is not Crossing.LOCAL for m in uses)


def route(name: str, args: argparse.Namespace) -> None:
    """NotRemote when a remote is selected and command NAME (parsed into ARGS) does not work
    through one: the one check of the one-shot CLI and of the `monkey>` shell. With no
    remote selected it reads no rule (monkey.contract stays unloaded)."""
    from monkey.remote.settings import selected

    remote = selected()
    if remote is None or remote_ready(name, args):
        return
    sub = getattr(args, "what", None) or getattr(args, "action", None)
    grouped = name in ("list", "server", "sweep", "provider", "daemon")
    words = f"{name} {sub}" if isinstance(sub, str) and grouped else name
    raise NotRemote(
        f"monkey {words} does not work through a remote yet; run it on the main "
        f"node (remote {remote})"
    )


def shell_remote() -> str | None:
    """The remote a `monkey>` shell opened now talks to (None: this machine), kept in
    $MONKEY_REMOTE for the session so that `remote use` in another terminal does not move
    it; MonkeyError naming the fix when that remote is not set up."""
    from monkey.remote import settings

    name = settings.selected()
    if name is not None:
        settings.get(name)  # its settings and token are here (the server is not asked)
        os.environ["MONKEY_REMOTE"] = name
    return name


def take_remote(argv: list[str]) -> list[str]:
    """ARGV without `--remote NAME` (before any `--`); NAME goes to $MONKEY_REMOTE, where
    every command's facade looks (see monkey.remote.settings.selected)."""
    out, i = [], 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            out += argv[i:]
            break
        if word == "--remote" or word.startswith("--remote="):
            if word == "--remote":
                if i + 1 >= len(argv):
                    raise UsageError(
                        "monkey: --remote needs a NAME (see `monkey remote list`; "
                        "`local` for this machine)"
                    )
                value, i = argv[i + 1], i + 2
            else:
                value, i = word.partition("=")[2], i + 1
            os.environ["MONKEY_REMOTE"] = value
            continue
        out.append(word)
        i += 1
    return out


def on_main_node(name: str, args: argparse.Namespace) -> bool:
    """Whether command NAME (parsed into ARGS) goes to the selected remote as its words, for
    the main node to run as its own command: `provider add` reads the files, keys and
    credentials of the machine it runs on, and writes its providers.yml."""
    if name != "provider" or args.action != "add":
        return False
    from monkey.remote.settings import selected

    return selected() is not None
