"""`monkey list jobs` and `monkey list providers`: the tables (or JSON) of jobs and of
providers with their hosts, quotas and the core. `list jobs` is benchmarked: this module
imports only what it needs, and the store straight, without the facade."""

from __future__ import annotations

import argparse
import sys
import time

from monkey.models import DISK_WAIT, TERMINAL, State
from monkey.shell.common import UsageError, monkey, print_json

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


_FILTERS = {
    "running": (State.DISPATCHING, State.RUNNING),
    "queued": (State.QUEUED, State.PAUSED),
    "finished": tuple(TERMINAL),
    "failed": (State.FAILED, State.LOST),
}


# States that only a running core moves on (a job queued, starting or running).


CORE_MOVES = (State.QUEUED, State.DISPATCHING, State.RUNNING)


def core_absent_line(since: float) -> str:
    """The one line a listing prints while no core runs (SINCE: when one last ran here)."""
    same_day = time.localtime(since)[:3] == time.localtime()[:3]
    when = time.strftime("%H:%M" if same_day else "%Y-%m-%d %H:%M", time.localtime(since))
    from monkey.remote.settings import selected

    fix = "the main node restarts it" if selected() else "monkey daemon start"
    return f"core not running since {when}; states as of then; {fix}"


def cmd_list_jobs(args: argparse.Namespace) -> int:
    from monkey.models import run_time
    from monkey.shell.table import STATE_COLOURS, ago, render

    if args.limit < 1:
        raise UsageError("monkey list jobs: --limit must be at least 1")
    states: set[State] | None = None
    for flag, members in _FILTERS.items():
        if getattr(args, flag):
            states = (states or set()) | set(members)
    limit = None if args.all else args.limit
    listing = _job_listing(states, args.provider, limit, args.owner, args.mine, args.tag)
    jobs, runtimes, total = listing["jobs"], listing["runtimes"], listing["total"]
    absent, owners = listing["core_since"], listing["owners"]
    waiting_on = listing.get("waiting_on") or {}
    tags = listing.get("tags") or {}
    waits = listing.get("provider_waits") or {}  # why a provider's queued jobs wait for it
    now = time.time()
    if args.json:
        print_json(
            {
                "jobs": [
                    {
                        **j.to_json(),
                        "runtime": runtimes.get(j.juid),
                        **({"owner": owners.get(j.juid)} if owners else {}),
                        "tags": tags.get(j.juid, []),
                        **({"waiting_on": waiting_on[j.juid]} if j.juid in waiting_on else {}),
                        **({"held": j.held} if j.held else {}),
                        **(
                            {"waiting": waits[j.provider]}
                            if j.state == State.QUEUED and j.provider in waits
                            else {}
                        ),
                    }
                    for j in jobs
                ],
                "core": {"running": absent is None, "since": absent or None},
                "total": total,
                "providers_down": waits,
            }
        )
        return 0
    if not jobs:
        print(
            "no jobs"
            + (
                " match"
                if states or args.provider or args.owner or args.mine or args.tag
                else " yet; try `monkey run -- CMD`"
            )
        )
        return 0
    if absent and any(j.state in CORE_MOVES for j in jobs):  # a core ran there, none runs now
        print(core_absent_line(absent), file=sys.stderr)
    rows, colours = [], []
    for j in jobs:
        shown = j.shown_state
        if shown == State.QUEUED.value and waits.get(j.provider, "").startswith(DISK_WAIT):
            shown = DISK_WAIT
        rank = f" ({j.priority:+d})" if j.priority and j.state in _FILTERS["queued"] else ""
        rows.append(
            [
                j.juid,
                j.name,
                shown + rank,  # a queued job's priority beside its state, when not 0
                j.provider,
                str(j.attempts),
                ago(now - j.created_at),
                run_time(runtimes.get(j.juid)),
                "-" if j.exit_code is None else str(j.exit_code),
                j.command,
            ]
        )
        colours.append([None, None, STATE_COLOURS.get(shown)] + [None] * 6)
    headers = ["JOB", "NAME", "STATE", "PROVIDER", "TRIES", "AGE", "RUNTIME", "EXIT", "COMMAND"]
    if owners:  # a server with several users: whose each job is, after its name
        headers.insert(2, "OWNER")
        for row, colour, j in zip(rows, colours, jobs):
            row.insert(2, owners.get(j.juid) or "-")
            colour.insert(2, None)
        render(headers, rows, colours=colours, flex=9, shrink={1: 8, 2: 6, 4: 8}, drop=(5, 8, 4))
    else:
        render(headers, rows, colours=colours, flex=8, shrink={1: 8, 3: 8}, drop=(4, 7, 3))
    if total > len(jobs):
        print(f"{len(jobs)} of {total:,} jobs; --all or --limit N", file=sys.stderr)
    for provider, why in waits.items():
        print(f"{provider}: {why}", file=sys.stderr)
    return 0


def _job_listing(
    states: set[State] | None,
    provider: str | None,
    limit: int | None,
    owner: str | None = None,
    mine: bool = False,
    tag: str | None = None,
) -> dict[str, Any]:
    """`list jobs`' data: from the selected remote, or straight from this machine's store
    (without loading the facade: `monkey list jobs` is benchmarked); only OWNER's jobs, or
    with MINE this machine's user's (the remote's: its token's user's); only those tagged
    TAG."""
    from monkey.remote.settings import selected

    if selected():
        return monkey().job_listing(states, provider, limit, owner=owner, mine=mine, tag=tag)
    from monkey.config import Home
    from monkey.facade.listing import job_listing
    from monkey.store import Store
    from monkey.store.db import local_user

    home = Home().ensure()
    owner = local_user() if mine else owner
    return job_listing(home, Store(home.db), states, provider, limit, owner=owner, tag=tag)


def cmd_list_instances(args: argparse.Namespace) -> int:
    """`monkey list instances`: the machines monkey made and the pods it runs."""
    from monkey.shell.instance_commands import print_monkey_instances

    return print_monkey_instances(monkey().monkey_instances(ended=args.all, pods=True), args.json)


def cmd_list_providers(args: argparse.Namespace) -> int:
    from monkey.shell.table import render

    m = monkey()
    if args.monkey_instances:
        from monkey.shell.instance_commands import print_monkey_instances

        return print_monkey_instances(m.monkey_instances(ended=args.all, pods=True), args.json)
    if args.all:
        raise UsageError(
            "--all goes with --monkey-instances: monkey list providers --monkey-instances --all"
        )
    status = m.provider_status()
    out, pid = status["providers"], status["core"]["pid"]
    if args.json:
        print_json(status)
        return 0
    render(
        ["PROVIDER", "TYPE", "SLOTS", "GPUS", "RUNNING", "QUEUED"],
        [
            [
                p["name"],
                p["type"],
                str(p.get("slots", "-")),
                str(p.get("gpus", "-")),
                str(p["running"]),
                str(p["queued"]),
            ]
            for p in out
        ],
    )
    from monkey.shell.provider_commands import print_hosts

    print_hosts(out)
    if status.get("quotas"):
        from monkey.shell.server_commands import print_quota_use

        print_quota_use(status["quotas"])
    for p in out:
        print(f"{p['name']}: isolation {p['isolation']}")
        if p.get("images"):
            print(f"{p['name']}: images {p['images']}")
        if p.get("detail"):  # a kind's own line (a Slurm partition's state)
            print(f"{p['name']}: {p['detail']}")
        error = p.get("error")
        if error:
            print(error if error.startswith(f"{p['name']}:") else f"{p['name']}: {error}")
    print(f"core: {f'running (pid {pid})' if pid else 'not running'}")
    return 0
