"""Which machine a command line goes to: `--remote NAME` anywhere before `--` (or
$MONKEY_REMOTE, or `monkey remote use`), and which commands work through a remote yet."""

from __future__ import annotations

import argparse
import os

from monkey.shell.common import UsageError


class NotRemote(UsageError):
    """A command that cannot go through a remote yet (exit 2, printed as it is)."""


def remote_ready(name: str, args: argparse.Namespace) -> bool:
    """Whether command NAME (parsed into ARGS) works through a remote."""
    if name in ("remote", "completion", "init"):  # this machine's own settings and files
        return True
    if name == "list":
        return args.what in ("jobs", "providers", "sweeps")
    if name == "provider":  # add: run by the main node as its own command (on_main_node)
        return True
    if name == "server":  # the main node's quotas and notify ranges (set: its admins)
        return args.action in ("quota", "notify-allow")
    return name in (
        *("logs", "job", "kill", "metrics", "search", "info", "sweep", "dash", "web"),
        *("run", "rerun", "clone", "cat", "pull"),
        *("compare", "diff", "plot", "report", "export"),
        *("rm", "du", "gc", "verify", "create", "delete"),
        "notify",
    )


def route(name: str, args: argparse.Namespace) -> None:
    """NotRemote when a remote is selected and command NAME (parsed into ARGS) does not work
    through one: the one check of the one-shot CLI and of the `monkey>` shell."""
    if remote_ready(name, args):
        return
    sub = getattr(args, "what", None) or getattr(args, "action", None)
    grouped = name in ("list", "server", "sweep", "provider", "daemon")
    check_remote(f"{name} {sub}" if isinstance(sub, str) and grouped else name)


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


def check_remote(words: str) -> None:
    """NotRemote when a remote is selected: WORDS (the command) does not work through one."""
    from monkey.remote.settings import selected

    remote = selected()
    if remote:
        raise NotRemote(
            f"monkey {words} does not work through a remote yet; run it on the main "
            f"node (remote {remote})"
        )


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
