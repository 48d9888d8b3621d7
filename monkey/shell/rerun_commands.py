"""`rerun`, `clone` and `cat`: any recorded run, again (see monkey/rerun.py).

Parser builders take the parser class like those of cli.py; only argparse and the standard
library are imported up here.
"""

from __future__ import annotations

import argparse
import json
import sys

from monkey.shell.common import (
    ParserClass,
    UsageError,
    follow,
    job_argument,
    make_parser,
    monkey,
    queue_options,
)


def rerun_parser(cls: ParserClass) -> argparse.ArgumentParser:
    p = make_parser(
        cls,
        "rerun",
        "Queue a job again from its record alone (same code, data, "
        "env), with --set PARAM=VALUE overrides; or cells of a sweep with --sweep.",
    )
    job_argument(p, count="?")
    p.add_argument(
        "--set",
        "-s",
        action="append",
        default=[],
        metavar="PARAM=VALUE",
        dest="sets",
        help="change a parameter wherever the command gives it "
        "(--lr 0.1, --lr=0.1, lr=0.1, a sweep's {lr}); repeatable",
    )
    p.add_argument("--provider", "-p", help="run it elsewhere (default: where it ran)")
    p.add_argument("--cpus", type=int, help="CPU slots (default: as before)")
    p.add_argument("--gpus", type=int, help="GPUs (default: as before)")
    p.add_argument("--memory", help="memory, e.g. 8G (default: as before)")
    p.add_argument(
        "--time",
        metavar="LIMIT",
        help="time limit of each attempt, with its unit: 90s, 30m, "
        "2h, 1d or HH:MM:SS (default: as before)",
    )
    p.add_argument("--name", "-n", help="a readable name (default: as before)")
    queue_options(p)
    p.add_argument(
        "--follow",
        "-f",
        action="store_true",
        help="stream the new job's output and exit with its exit code",
    )
    p.add_argument("--sweep", metavar="SWEEP", help="rerun cells of this sweep as a new sweep")
    p.add_argument("--failed", action="store_true", help="with --sweep: only failed or lost cells")
    p.add_argument("--cells", metavar="K,..", help="with --sweep: only these cells (1 = first)")
    p.add_argument(
        "--in-place", action="store_true", help="with --sweep: add the reruns to the same sweep"
    )
    p.add_argument("--json", action="store_true", help="print the new job (or sweep) as JSON")
    p.set_defaults(func=cmd_rerun)
    return p


def clone_parser(cls: ParserClass) -> argparse.ArgumentParser:
    p = make_parser(
        cls,
        "clone",
        "Write a job's code as it was into a folder (a git clone at its "
        "commit with its uncommitted changes, when it ran in a repository).",
    )
    job_argument(p)
    p.add_argument("--to", metavar="DIR", help="the folder to create (default: ./JOB)")
    p.add_argument(
        "--with-data", action="store_true", help="also write its datasets, under DIR/datasets/NAME"
    )
    p.set_defaults(func=cmd_clone)
    return p


def cat_parser(cls: ParserClass) -> argparse.ArgumentParser:
    p = make_parser(cls, "cat", "Print one of a job's code files as the job saw it.")
    job_argument(p)
    p.add_argument("path", help="the file's path in the code (see `info job JOB --files`)")
    p.set_defaults(func=cmd_cat)
    return p


def _cells(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(k) for k in text.split(",") if k.strip()]
    except ValueError:
        raise UsageError(f"monkey rerun: --cells {text!r} is not numbers like 1,3,4") from None


def cmd_rerun(args: argparse.Namespace) -> int:
    options = dict(
        set=args.sets,
        provider=args.provider,
        cpus=args.cpus,
        gpus=args.gpus,
        memory=args.memory,
        time=args.time,
        name=args.name,
        after=args.after,
        after_any=args.after_any,
        priority=args.priority,
    )
    m = monkey()
    if args.sweep is not None:
        if args.job or args.follow:
            raise UsageError("monkey rerun --sweep: give the sweep alone (no JOB, no --follow)")
        if args.notify:
            raise UsageError("monkey rerun --sweep: --notify goes with a job rerun only (yet)")
        sid = m.rerun_sweep(
            args.sweep,
            failed=args.failed,
            cells=_cells(args.cells),
            in_place=args.in_place,
            **options,
        )
        if args.json:
            sys.stdout.write(json.dumps(m.sweep_status(sid), indent=2, default=str) + "\n")
        else:
            print(sid)
        return 0
    if args.failed or args.cells or args.in_place:
        raise UsageError("monkey rerun: --failed, --cells and --in-place go with --sweep SWEEP")
    if not args.job:
        raise UsageError(
            "monkey rerun: name the job to run again, e.g. monkey rerun last --set lr=0.2"
        )
    if args.notify:
        options["notify"] = [n for v in args.notify for n in v.split(",")]
    job = m.rerun(args.job, **options)
    if args.json:
        sys.stdout.write(json.dumps(m.info(job.juid), indent=2, default=str) + "\n")
    elif args.follow:
        print(f"monkey: job {job.juid} queued on {job.record.provider}", file=sys.stderr)
    else:
        print(job.juid)
    if args.follow:
        return follow(m, job.juid, "both")
    return 0


def cmd_clone(args: argparse.Namespace) -> int:
    done = monkey().clone(args.job, args.to, with_data=args.with_data)
    print(done["path"])
    if done["note"]:
        print(f"monkey: note: {done['note']}", file=sys.stderr)
    for ds in done["datasets"]:
        print(
            f"monkey: dataset {ds['name']} in {ds['path']} (`monkey run -d "
            f"{ds['path']}:{ds['name']}`)",
            file=sys.stderr,
        )
    return 0


def cmd_cat(args: argparse.Namespace) -> int:
    data = monkey().cat(args.job, args.path)
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()
    return 0


def print_files(m: object, ref: str) -> None:
    """`info job JOB --files`: the code files with sizes and digests."""
    from monkey.shell.table import render

    files = m.files(ref)  # type: ignore[attr-defined]
    if not files:
        print("no code files recorded")
        return
    render(
        ["PATH", "SIZE", "MODE", "DIGEST"],
        [
            [f.path, str(f.size), "link" if f.mode > 0o777 else oct(f.mode)[2:], f.digest[:16]]
            for f in files
        ],
    )
