"""`monkey registry ...`: the container registries this home pulls jobs' images from
(logins and CAs; see ``monkey.images``)."""

from __future__ import annotations

import argparse
import sys

from monkey.models import MonkeyError
from monkey.shell.common import ParserClass, make_parser, print_json


def registry_parser(cls: ParserClass) -> argparse.ArgumentParser:
    p = make_parser(
        cls,
        "registry",
        "Logins to the container registries jobs' images come from: login, list, logout.",
    )
    p.epilog = (
        "Logins are kept in MONKEY_HOME/secrets/registries.json (0600) and reach a worker "
        "only for a pull, never a job's environment or record. Without a login here, "
        "~/.docker/config.json is used when it has one. On a main node, an admin logs in "
        "there: its logins serve every user's jobs."
    )
    sub = p.add_subparsers(dest="action", required=True, metavar="{login,list,logout}")
    login = sub.add_parser(
        "login",
        help="check a login against HOST and keep it",
        description="Log in to a registry (checked against it before it is kept).",
    )
    login.add_argument("host", help="the registry, e.g. ghcr.io or 10.0.0.5:5000")
    login.add_argument("--username", "-u", required=True)
    login.add_argument(
        "--password-stdin",
        action="store_true",
        help="read the password (or token) from stdin rather than a prompt",
    )
    login.add_argument(
        "--ca-file",
        metavar="CA.crt",
        help="trust this CA for HOST (a registry with a self-signed certificate)",
    )
    ls = sub.add_parser("list", help="registries with a login or CA", description="List them.")
    ls.add_argument("--json", action="store_true", help="print JSON")
    out = sub.add_parser(
        "logout", help="forget HOST's login and CA", description="Forget a registry's login."
    )
    out.add_argument("host")
    p.set_defaults(func=cmd_registry)
    return p


def cmd_registry(args: argparse.Namespace) -> int:
    from monkey.config import Home
    from monkey.images import Registries

    home = Home().ensure()
    registries = Registries(home)
    if args.action == "login":
        password = _password(args)
        registries.login(args.host, args.username, password, ca=args.ca_file)
        print(f"logged in to {args.host} as {args.username}")
        return 0
    if args.action == "logout":
        if not registries.logout(args.host):
            raise MonkeyError(f"no login or CA for {args.host}; see `monkey registry list`")
        print(f"forgot {args.host}")
        return 0
    rows = registries.listing()
    if args.json:
        print_json(rows)
        return 0
    if not rows:
        print("no registry logins; add one: monkey registry login HOST --username USER")
        return 0
    from monkey.shell.table import render

    render(
        ["REGISTRY", "USER", "CA"],
        [[r["host"], r["username"] or "-", "yes" if r["ca"] else "-"] for r in rows],
    )
    return 0


def _password(args: argparse.Namespace) -> str:
    if args.password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    elif sys.stdin.isatty():
        import getpass

        password = getpass.getpass(f"password of {args.username} on {args.host}: ")
    else:
        raise MonkeyError(
            "monkey registry login: no terminal to ask the password on; pipe it with "
            "--password-stdin"
        )
    if not password:
        raise MonkeyError("monkey registry login: the password is empty")
    return password
