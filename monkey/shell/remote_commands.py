"""`monkey remote ...`: the main nodes this machine talks to (settings in the user's config
folder; see ``monkey.remote.settings``)."""

from __future__ import annotations

import argparse

from monkey.models import MonkeyError
from monkey.shell.common import ParserClass, UsageError, make_parser, print_json


def remote_parser(cls: ParserClass) -> argparse.ArgumentParser:
    p = make_parser(
        cls,
        "remote",
        "The main nodes (`monkey server`) this machine sends commands to: add, use, list, "
        "remove, prune.",
    )
    p.epilog = (
        "A command talks to: --remote NAME, else $MONKEY_REMOTE, else the remote `monkey "
        "remote use` chose; `local` (or `monkey remote use --local`) means this machine. "
        "Each remote's blob cache ($XDG_CACHE_HOME/monkey/remotes/NAME) keeps at most "
        "$MONKEY_REMOTE_CACHE_MAX of blobs (default 5G)."
    )
    sub = p.add_subparsers(dest="action", required=True, metavar="{add,use,list,remove,prune}")
    add = sub.add_parser(
        "add",
        help="add a main node (checks the token and certificate once)",
        description="Add a main node; it is reached once to check both.",
    )
    add.add_argument("name", help="a short name for it, e.g. lab")
    add.add_argument(
        "url",
        help="https://HOST:PORT, as `monkey server start` printed it; or "
        "ssh://USER@HOST[:PORT] through an SSH tunnel to the server on 127.0.0.1:8443 there "
        "(?server=HOST:PORT for another address)",
    )
    add.add_argument("--token", required=True, help="your token on it (`monkey server user add`)")
    add.add_argument(
        "--fingerprint",
        metavar="SHA256:...",
        help="pin its self-signed certificate (`monkey server status` prints it)",
    )
    add.add_argument(
        "--trust-on-first-use",
        action="store_true",
        help="ssh:// only: accept the SSH host key if known_hosts has none for it, and "
        "record it (rather than adding it with ssh-keyscan first)",
    )
    use = sub.add_parser(
        "use",
        help="send commands to NAME from now on (`local` or --local: this machine)",
        description="Choose the remote commands go to.",
    )
    use.add_argument("name", nargs="?", help="a remote, or `local` for this machine")
    use.add_argument("--local", action="store_true", help="back to this machine's MONKEY_HOME")
    ls = sub.add_parser(
        "list", help="the remotes, the one in use marked", description="List remotes."
    )
    ls.add_argument("--json", action="store_true", help="print JSON")
    rm = sub.add_parser(
        "remove",
        help="forget a remote, its token and its cache",
        description="Forget a remote; its blob cache on this machine is deleted.",
    )
    rm.add_argument("name")
    prune = sub.add_parser(
        "prune",
        help="empty the blob cache of NAME, or of every remote (removed ones' too)",
        description="Empty blob caches now, to free their disk space (they refill as "
        "commands need; what the main node holds is never uploaded again).",
    )
    prune.add_argument("name", nargs="?", help="a remote (default: every cache here)")
    p.set_defaults(func=cmd_remote)
    return p


def cmd_remote(args: argparse.Namespace) -> int:
    from monkey.remote import settings

    data = settings.load()
    if args.action == "add":
        return _add(args, data)
    if args.action == "use":
        if args.name == settings.LOCAL and not args.local:  # `remote use local`
            args.name, args.local = None, True
        if args.local == bool(args.name):
            raise UsageError("monkey remote use: give NAME, or --local for this machine")
        if args.name and args.name not in data["remotes"]:
            raise MonkeyError(
                f"no remote {args.name!r}; add it: monkey remote add {args.name} URL --token T"
            )
        data["default"] = args.name
        settings.save(data)
        print(
            f"commands now go to {args.name}" if args.name else "commands now run on this machine"
        )
        return 0
    if args.action == "remove":
        return _remove(args.name, data)
    if args.action == "prune":
        return _prune(args.name, data)
    return _list(args, data)


def _remove(name: str, data: dict) -> int:
    from monkey.models import human_size
    from monkey.remote import settings
    from monkey.remote.cache import Cache, clear_leftovers

    if name not in data["remotes"]:
        raise MonkeyError(f"no remote {name!r}; see `monkey remote list`")
    cache = Cache(settings.check_name(name))
    freed = cache.remove()  # first: refused while a command uses it, nothing changed
    clear_leftovers()
    del data["remotes"][name]
    if data["default"] == name:
        data["default"] = None
    settings.save(data)
    settings.token_file(name).unlink(missing_ok=True)
    print(
        f"remote {name} removed"
        + (f"; its cache freed {human_size(freed)} ({cache.root})" if freed else "")
    )
    return 0


def _prune(name: str | None, data: dict) -> int:
    """Empty NAME's cache, or every cache (those of removed remotes too); the shell's
    history there stays."""
    from monkey.models import human_size
    from monkey.remote import cache, settings

    if name is not None:
        settings.check_name(name)
        if name not in data["remotes"] and name not in cache.names():
            raise MonkeyError(f"no remote {name!r} and no cache of it; see `monkey remote list`")
    caches = [name] if name is not None else cache.names()
    cache.clear_leftovers()
    busy = []
    for each in caches:
        try:
            freed = cache.Cache(each).remove(keep=(cache.SHELL_HISTORY,))
        except cache.CacheBusy:
            busy.append(each)
            continue
        print(f"{each}: freed {human_size(freed)}")
    if not caches:
        print("no cache to empty")
    if busy:
        raise MonkeyError(
            f"a command is using the cache of {', '.join(busy)} (a submission or a clone in "
            "progress); run `monkey remote prune` again once it ends"
        )
    return 0


def _list(args: argparse.Namespace, data: dict) -> int:
    from monkey.models import human_size
    from monkey.remote import cache, settings

    current = settings.selected()
    sizes = {name: cache.Cache(name).size() for name in cache.names()}
    if args.json:
        remotes = {n: {**r, "cache_bytes": sizes.get(n, 0)} for n, r in data["remotes"].items()}
        print_json({"selected": current, "remotes": remotes})
        return 0
    if not data["remotes"]:
        print("no remotes; add one: monkey remote add NAME https://HOST:8443 --token T")
    else:
        from monkey.shell.table import render

        render(
            ["", "REMOTE", "URL", "USER", "CERTIFICATE", "CACHE"],
            [
                [
                    "*" if name == current else "",
                    name,
                    r["url"],
                    r.get("user") or "-",
                    r.get("fingerprint") or "CA-verified",
                    human_size(sizes.get(name, 0)),
                ]
                for name, r in sorted(data["remotes"].items())
            ],
        )
    left = {n: s for n, s in sizes.items() if n not in data["remotes"]}
    if left:
        print(
            "caches of removed remotes: "
            + ", ".join(f"{n} ({human_size(s)})" for n, s in sorted(left.items()))
            + "; empty them: monkey remote prune"
        )
    return 0


def _add(args: argparse.Namespace, data: dict) -> int:
    from monkey.remote import settings
    from monkey.remote.client import Client, normal_fingerprint

    name = settings.check_name(args.name)
    url = args.url.rstrip("/")
    fp = normal_fingerprint(args.fingerprint) if args.fingerprint else None
    if args.trust_on_first_use and not url.startswith("ssh:"):
        raise UsageError(
            "monkey remote add: --trust-on-first-use is for an ssh:// remote's host key; "
            "pin a server's certificate with --fingerprint"
        )
    client = Client(
        settings.Remote(name, url, fp, args.token.strip()),
        user=None,
        trust_on_first_use=args.trust_on_first_use,
    )
    try:
        me = client.call("whoami")
    except MonkeyError:
        if client.tunnel is not None:
            client.tunnel.forget_trusted()
        raise
    finally:
        client.close()
    data["remotes"][name] = {"url": url, "fingerprint": fp, "user": me["name"]}
    settings.write_token(name, args.token.strip())
    settings.save(data)
    print(
        f"remote {name} added: {url} as {me['name']}"
        + (" (admin)" if me["admin"] else "")
        + f"; send commands there with `monkey remote use {name}` or --remote {name}"
    )
    return 0
