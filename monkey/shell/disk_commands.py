"""`rm`, `gc` and `du`: MONKEY_HOME's disk (see monkey/housekeeping.py).

Parser builders take the parser class like those of cli.py; only argparse and the standard
library are imported up here.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable

from monkey.models import MonkeyError, human_size
from monkey.shell.common import ParserClass, job_argument, make_parser, monkey

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from monkey.api import Monkey


def rm_parser(cls: ParserClass) -> argparse.ArgumentParser:
    p = make_parser(
        cls,
        "rm",
        "Delete ended jobs with their logs, metrics and files (asks first "
        "on a terminal); then `monkey gc` frees the blobs no job needs.",
    )
    job_argument(p, "jobs", "*", help="job ids, unique prefixes, or `last`")
    p.add_argument("--sweep", metavar="S", help="the jobs of this sweep")
    p.add_argument("--older-than", metavar="AGE", help="jobs ended longer ago than AGE (30d, 12h)")
    p.add_argument("--failed", action="store_true", help="failed jobs only")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask")
    p.set_defaults(func=cmd_rm)
    return p


def gc_parser(cls: ParserClass) -> argparse.ArgumentParser:
    p = make_parser(
        cls,
        "gc",
        "Free the blobs, environments and dataset copies no job needs, the "
        "folders of deleted jobs and code copies left behind, and print what was freed.",
    )
    p.add_argument(
        "--grace",
        default="1h",
        metavar="AGE",
        help="keep blobs, environments and dataset copies younger than AGE "
        "(default 1h; a submission in progress is always safe: gc waits for it)",
    )
    p.add_argument(
        "--image-keep",
        default="7d",
        metavar="AGE",
        help="keep the images this machine's worker pulled that a job used within AGE "
        "(default 7d), and those of jobs not ended",
    )
    p.set_defaults(func=cmd_gc)
    return p


def verify_parser(cls: ParserClass) -> argparse.ArgumentParser:
    p = make_parser(
        cls,
        "verify",
        "Check stored code and data against their digests: every blob of "
        "the jobs named (default: the whole store); say what is damaged or missing and "
        "which jobs it affects, set damaged blobs aside, and exit 1 if any.",
    )
    job_argument(p, "jobs", "*", help="job ids, unique prefixes, or `last`")
    p.set_defaults(func=cmd_verify)
    return p


def du_parser(cls: ParserClass) -> argparse.ArgumentParser:
    p = make_parser(
        cls,
        "du",
        "Disk used by MONKEY_HOME: jobs' run folders, blobs, environments, dataset copies.",
    )
    p.add_argument("--json", action="store_true", help="print as JSON")
    p.add_argument(
        "--hosts",
        action="store_true",
        help="what each SSH host (and Kubernetes cache claim) holds instead: run "
        "folders, blobs, partial uploads and the rest, and the space free there",
    )
    p.set_defaults(func=cmd_du)
    return p


def cmd_rm(args: argparse.Namespace) -> int:
    m = monkey()
    jobs = m.rm_select(args.jobs, args.sweep, args.older_than, args.failed)
    if not jobs:
        print("no job matches")
        return 0
    if not args.yes:
        if not sys.stdin.isatty():
            raise MonkeyError(
                f"monkey rm: deleting {len(jobs)} jobs needs --yes when not asked on a terminal"
            )
        shown = ", ".join(j.juid for j in jobs[:5]) + (
            f" and {len(jobs) - 5} more" if len(jobs) > 5 else ""
        )
        answer = input(
            f"delete {len(jobs)} jobs ({shown}) with their logs, metrics and files? [y/N] "
        )
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing deleted")
            return 1
    done = m.rm([j.juid for j in jobs])
    print(
        f"deleted {done['jobs']} jobs, freed {human_size(done['freed'])}; `monkey gc` frees "
        "their blobs"
    )
    _print_hosts(done["hosts"], lambda f: f"{f['runs']} job folders ({human_size(f['run_bytes'])})")
    return 0


def _print_hosts(asked: dict[str, Any], freed: Callable[[dict[str, int]], str]) -> None:
    """Say what each host ASKED (a facade's hosts report) freed (FREED words it) and which
    are not reached yet."""
    from monkey import host_cleanup
    from monkey.facade.disk import hosts_report

    report = hosts_report(asked)
    for host, done in report.done.items():
        got = done["usage"].get("freed")
        print(
            f"{host}: freed {human_size(_freed_bytes(got))}: {freed(got)}"
            if got
            else f"{host}: nothing to free"
        )
    note = host_cleanup.owed_note(report)
    if note:
        print(note)


def _freed_bytes(freed: dict[str, int]) -> int:
    return freed["run_bytes"] + freed["blob_bytes"] + freed["partial_bytes"]


def cmd_gc(args: argparse.Namespace) -> int:
    from monkey import housekeeping

    m = monkey()
    report = m.gc(housekeeping.parse_age(args.grace), housekeeping.parse_age(args.image_keep))
    h = human_size
    print(
        f"freed {h(report['total'])}: {report['blobs']} blobs ({h(report['blob_bytes'])}), "
        f"{report['runs']} folders of deleted jobs ({h(report['run_bytes'])}), "
        f"{report['envs']} environments ({h(report['env_bytes'])}), "
        f"{report['datasets']} dataset copies ({h(report['dataset_bytes'])}), "
        f"{report['images']} images ({h(report['image_bytes'])}), "
        f"code copies left behind ({h(report['code_bytes'])})"
    )
    _print_hosts(
        report["hosts"],
        lambda f: (
            f"{f['blobs']} blobs ({h(f['blob_bytes'])}), {f['runs']} "
            f"folders of deleted jobs ({h(f['run_bytes'])}), {f['partial']} partial uploads "
            f"({h(f['partial_bytes'])})"
        ),
    )
    return 0


def cmd_du(args: argparse.Namespace) -> int:
    from monkey.shell.table import render

    m = monkey()
    if args.hosts:
        return _du_hosts(m, args.json)
    du = m.du()
    root, parts, users = du["home"], du["parts"], du.get("users") or []
    if args.json:
        print(json.dumps({"home": root, **parts, **({"users": users} if users else {})}, indent=2))
        return 0
    h = human_size
    rows = [[name, h(p["bytes"]), f"{p['files']:,}"] for name, p in parts.items()]
    rows.append(["total", h(sum(p["bytes"] for p in parts.values())), ""])
    print(f"{root}: {parts['runs']['jobs']:,} jobs")
    render(["PART", "SIZE", "FILES"], rows)
    blobs = parts["blobs"]
    if blobs["partial_files"]:
        print(
            f"blobs include {blobs['partial_files']:,} partial files "
            f"({h(blobs['partial_bytes'])}) of interrupted writes; `monkey gc` removes them"
        )
    if users:  # a main node: what each user's uploads and jobs hold, against their quota
        print()
        render(
            ["USER", "USED", "STORAGE LIMIT"],
            [
                [u["user"], h(u["used"]), "-" if u["limit"] is None else h(u["limit"])]
                for u in users
            ],
        )
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    report = monkey().verify(args.jobs)
    damaged, missing = report["damaged"], report["missing"]
    blobs = f"{report['blobs']:,} blob" + ("" if report["blobs"] == 1 else "s")
    jobs = f"{report['jobs']:,} job" + ("" if report["jobs"] == 1 else "s")
    print(
        f"checked {blobs} ({human_size(report['bytes'])}) of {jobs}: "
        f"{len(damaged)} damaged, {len(missing)} missing"
    )
    for word, found in (("damaged (set aside in blobs/.damaged)", damaged), ("missing", missing)):
        for digest, uses in sorted(found.items()):
            shown = "; ".join(f"job {juid} {what}" for juid, what in uses[:5])
            more = f" and {len(uses) - 5} more" if len(uses) > 5 else ""
            print(f"{word}: blob {digest}: {shown or 'no job uses it'}{more}")
    if damaged or missing:
        affected = sorted(
            {juid for found in (damaged, missing) for uses in found.values() for juid, _ in uses}
        )
        if affected:
            print(
                f"affected jobs: {', '.join(affected)}; submit them again from their "
                "source (`monkey run`) to store good copies",
                file=sys.stderr,
            )
        return 1
    return 0


def _du_hosts(m: Monkey, as_json: bool) -> int:
    """`du --hosts`: each SSH host measured now (the last measure of one not reached)."""
    from monkey import host_cleanup
    from monkey.facade.disk import hosts_report
    from monkey.shell.table import render

    found = m.du_hosts()
    hosts, known = found["hosts"], found["known"]
    report = hosts_report(found["asked"])
    if as_json:
        print(
            json.dumps(
                {
                    "hosts": {h: {**known.get(h, {}), "reached": h in report.done} for h in hosts},
                    "not_reached": report.pending,
                },
                indent=2,
            )
        )
        return 0
    if not hosts:
        print("no SSH host or cache claim has been used from this MONKEY_HOME")
        return 0
    h = human_size
    rows = []
    for host in hosts:
        if host not in known:
            rows.append([host, "-", "-", "-", "-", "-", "-", "not reached yet"])
            continue
        u = known[host]["usage"]
        rest = sum(u[k][0] for k in ("other_homes", "datasets", "envs", "agent"))
        when = (
            "now"
            if host in report.done
            else time.strftime("%m-%d %H:%M", time.localtime(known[host]["measured_at"]))
        )
        rows.append(
            [
                host,
                f"{u['jobs']:,}",
                h(u["runs"][0]),
                f"{h(u['blobs'][0])} ({u['blobs'][1]:,})",
                h(u["partial"][0]),
                h(rest),
                "?" if u.get("free") is None else h(u["free"]),
                when,
            ]
        )
    render(["HOST", "JOBS", "RUN FOLDERS", "BLOBS", "PARTIAL", "OTHER", "FREE", "MEASURED"], rows)
    note = host_cleanup.owed_note(report)
    if note:
        print(note.replace("cleans them", "measures them"))
    return 0
