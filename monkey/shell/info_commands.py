"""`monkey info job`: everything known about a job, as a table of facts, its attempts and
its last events (or JSON)."""

from __future__ import annotations

import argparse
import json
import sys
import time

from monkey.facade.waiting import tries_text
from monkey.models import State, format_duration, run_time
from monkey.shell.common import monkey, print_json
from monkey.shell.listing_commands import CORE_MOVES, core_absent_line

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


AFTER_SHOWN = 10  # `info job` lists this many of the jobs it runs after


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def cmd_info_job(args: argparse.Namespace) -> int:
    from monkey.shell.table import printable, render, state_text, use_colour

    m = monkey()
    if args.files:
        if args.json:
            print_json([f.as_dict() for f in m.files(args.job)])
        else:
            from monkey.shell.rerun_commands import print_files

            print_files(m, args.job)
        return 0
    info = m.info(args.job)
    if args.json:
        print_json(info)
        return 0
    colour = use_colour(sys.stdout)
    res = info["resources"]
    git = info["git"] or {}
    core = info["core"]
    if core["since"] and State(info["state"]) in CORE_MOVES:
        print(core_absent_line(core["since"]), file=sys.stderr)
    until = time.time() if core["running"] else min(time.time(), core["since"] or time.time())
    fields = [
        ("job", info["job"]),
        ("name", info["name"]),
        *([("tags", " ".join(info["tags"]))] if info.get("tags") else []),
        *note_fields(info.get("note")),
        (
            "state",
            state_text(info["state"], colour)
            + _unreachable_note(info)
            + (f" ({info['phase']})" if info.get("phase") and info["state"] == "running" else "")
            + (f" ({info['reason']})" if info["reason"] else "")
            + (f" [{info['request']} requested]" if info["request"] else "")
            + "".join(f"; {why['text']}" for why in info.get("why") or []),
        ),
        ("command", info["command"]),
        ("provider", info["provider"] + (f" on {info['instance']}" if info["instance"] else "")),
        *(
            [("machine", ", ".join(f"{k} {v}" for k, v in info["instance_extra"].items() if v))]
            if info.get("instance_extra")
            else []
        ),
        *[
            ("pending", ", ".join(f"{k} {v}" for k, v in p.items() if v))
            for p in info.get("pending_instances", [])
        ],
        (
            "resources",
            f"cpus {res['cpus']}, gpus {res['gpus']}"
            + (f", memory {res['memory']}" if res.get("memory") else ""),
        ),
        (
            "time limit",
            f"{format_duration(res['time'])} per attempt" if res.get("time") else "none",
        ),
        *(
            [("image", f"{info['image']['ref']} @ {info['image']['digest']}")]
            if info.get("image")
            else []
        ),
        ("retries", str(info["retries"])),
        ("tries", tries_text(info)),
        ("workdir", info["workdir"]),
        *(
            [("runs in", git["subdir"] + "/ (sub-folder of the workdir)")]
            if git.get("subdir")
            else []
        ),
        ("snapshot", info["snapshot"] or "-"),
        (
            "git",
            (f"{git.get('commit') or '-'}" + (" (uncommitted changes)" if git.get("dirty") else ""))
            if git
            else "not a git repository",
        ),
        ("python", info["python"]),
        ("created", _when(info["created_at"])),
        ("started", _when(info["started_at"])),
        ("finished", _when(info["finished_at"])),
        ("exit code", "-" if info["exit_code"] is None else str(info["exit_code"])),
        ("checkpoints", info["checkpoint_dir"]),
    ]
    if info.get("cost"):
        from monkey.store.cost import dollars

        cost = info["cost"]
        fields.append(
            (
                "cost",
                f"{dollars(cost['total'])} estimated"
                + (
                    f", {dollars(cost['preempted'])} of it on preempted attempts"
                    if cost["preempted"]
                    else ""
                ),
            )
        )
    if info.get("sweep"):
        fields.append(("sweep", info["sweep"]))
    after = sorted(info.get("after") or [], key=lambda d: d["met"])  # those waited for first
    for dep in after[:AFTER_SHOWN]:
        need = "to end" if dep["any"] else "to succeed"
        now = dep["state"] or "removed"
        fields.append(
            ("after", f"{dep['job']} ({'done' if dep['met'] else 'waiting ' + need}: {now})")
        )
    if len(after) > AFTER_SHOWN:  # a whole sweep: the rest counted
        rest = after[AFTER_SHOWN:]
        done = sum(d["met"] for d in rest)
        fields.append(("after", f"{len(rest)} more, {done} of them done (--json lists them)"))
    if info.get("notifications"):  # its `monkey notify` messages
        from monkey.shell.notify_commands import notified

        fields += [("notified", notified(note)) for note in info["notifications"]]
    if info.get("rerun_of"):
        from monkey.shell.tracking_commands import fmt

        rerun = info["rerun_of"]
        changes = rerun["changes"]
        shown = [f"{k} {fmt(a)} -> {fmt(b)}" for k, (a, b) in changes.get("params", {}).items()]
        shown += [
            f"{k} {fmt(v[0])} -> {fmt(v[1])}"
            for k, v in changes.items()
            if k in ("provider", "name")
        ]
        shown += [f"{k} {fmt(a)} -> {fmt(b)}" for k, (a, b) in changes.get("resources", {}).items()]
        fields.append(("rerun of", rerun["job"] + (f" ({', '.join(shown)})" if shown else "")))
    if info.get("params"):
        from monkey.tracking.ingest import flatten

        fields += [
            (f"param {k}", json.dumps(v) if isinstance(v, (list, dict)) else str(v))
            for k, v in flatten(info["params"]).items()
        ]
    for name, st in (info.get("metrics") or {}).items():
        step = "" if st["step"] is None else f" (step {st['step']})"
        fields.append(
            (
                f"metric {name}",
                f"last {_number(st['last'])}{step} · best {_number(st['best'])} "
                f"({st['goal']}) · {st['count']} points",
            )
        )
    for ds in info["datasets"]:
        fields.append((f"dataset {ds['name']}", f"{ds['digest'][:16]} ({ds['source']})"))
    if info.get("spec"):
        from monkey.shell.jobspec_commands import spec_fields

        fields += spec_fields(info["spec"])
    for key, value in info["env"].items():
        fields.append((f"env {key}", value if len(value) < 80 else value[:77] + "..."))
    width = max(len(k) for k, _ in fields)
    for key, value in fields:  # the state alone may hold colours; the rest is escaped
        print(f"{key.ljust(width)}  {value if key == 'state' else printable(value)}")
    last = info.get("last_output")
    if last:
        print(
            f"\nlast output of attempt {last['attempt']}"
            + (f" ({last['reason']})" if last["reason"] else "")
            + ":"
        )
        for line in last["lines"] or ["(it printed nothing)"]:
            print(f"  {line}")
    if info["attempts_detail"]:
        from monkey.store.cost import dollars

        print()
        cloud = any(a["size"] for a in info["attempts_detail"])  # size, capacity and cost too
        render(
            ["ATTEMPT", "INSTANCE", "STARTED", "RUNTIME", "EXIT", "REASON"]
            + (["SIZE", "CAPACITY", "COST"] if cloud else []),
            [
                [
                    str(a["n"]),
                    a["instance"],
                    _when(a["started_at"]),
                    run_time((a["ended_at"] or until) - a["started_at"])
                    if a["started_at"]
                    else "-",
                    "-" if a["exit_code"] is None else str(a["exit_code"]),
                    a["reason"]
                    or (
                        ("unreachable" if info.get("unreachable_since") else "running")
                        if a["state"] == "live"
                        else "-"
                    ),
                ]
                + (
                    [a["size"] or "-", "spot" if a["spot"] else "on-demand", dollars(a["cost"])]
                    if cloud
                    else []
                )
                for a in info["attempts_detail"]
            ],
        )
    print()
    render(
        ["TIME", "EVENT", "DETAIL"],
        [
            [
                _when(e["ts"]),
                f"{e['old'] or e['kind']} -> {e['new']}" if e["new"] else e["kind"],
                _event_detail(e),
            ]
            for e in info["events"][-30:]
        ],
    )
    return 0


def note_fields(note: dict[str, Any] | None) -> list[tuple[str, str]]:
    """A note as `info job` and `sweep status` show it: its lines, then who wrote it when."""
    if not note:
        return []
    lines = note["text"].splitlines()
    by = f" by {note['by']}" if note.get("by") else ""
    return [("note" if i == 0 else "", line) for i, line in enumerate(lines)] + [
        ("", f"({_when(note['at'])}{by})")
    ]


def cmd_job_note(args: argparse.Namespace) -> int:
    """`job note JOB TEXT` (or --clear)."""
    if (args.text is None) == (not args.clear):
        from monkey.shell.common import UsageError

        raise UsageError(
            f"monkey job note: give the note's TEXT or --clear, not {'both' if args.clear else 'neither'}"
        )
    done = monkey().note(args.job, None if args.clear else args.text)
    print(f"{done['id']} note " + ("removed" if done["note"] is None else "saved"))
    return 0


def cmd_job_tag(args: argparse.Namespace) -> int:
    """`job tag JOB TAG...` and `job untag JOB TAG...`."""
    m = monkey()
    add = args.tags if args.action == "tag" else []
    done = m.tag(args.job, add=add, remove=args.tags if args.action == "untag" else [])
    print(f"{done['id']} tags: {' '.join(done['tags']) or '(none)'}")
    return 0


def _event_detail(e: dict[str, Any]) -> str:
    """An event's DETAIL cell: its attempt, detail and who acted ("cancel (by ana)")."""
    text = (f"attempt {e['attempt']}: " if e["attempt"] else "") + (e["detail"] or "")
    if e.get("actor"):
        text = f"{text} (by {e['actor']})" if text else f"by {e['actor']}"
    return text


def _unreachable_note(info: dict[str, Any]) -> str:
    """ ", but lab/h1 is unreachable since 12:41:05 (lost at 12:51:05 if it stays so)"."""
    since = info.get("unreachable_since")
    if since is None or State(info["state"]) not in (State.RUNNING, State.DISPATCHING):
        return ""
    clock = time.strftime("%H:%M:%S", time.localtime(since))
    lost = time.strftime("%H:%M:%S", time.localtime(since + (info.get("lost_after") or 0)))
    return f", but {info['instance']} is unreachable since {clock} (lost at {lost} if it stays so)"


def _number(value: float | None) -> str:
    """A metric's value as `compare` shows it: 4 significant digits."""
    return "-" if value is None else f"{value:.4g}"
