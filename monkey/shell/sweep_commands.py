"""Sweep commands: `monkey sweep` (a new sweep, or status, cancel, pause, resume, retry of
one) and `monkey list sweeps`. Parser builders take the parser class like those of cli.py;
only argparse and the standard library are imported up here."""

from __future__ import annotations

import argparse
import json
import sys
import time

from monkey.shell.common import (
    ParserClass,
    UsageError,
    make_parser,
    monkey,
    queue_options,
    suggest,
)
from monkey.shell.tracking_commands import finite_json, fmt

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


SWEEP_ACTIONS = ("status", "cancel", "pause", "resume", "retry", "note", "tag", "untag")


def sweep_parser(cls: ParserClass) -> argparse.ArgumentParser:
    p = make_parser(
        cls,
        "sweep",
        "Start a hyper-parameter sweep, or act on one: "
        "`sweep status|cancel|pause|resume|retry SWEEP`, `sweep note SWEEP TEXT|--clear`, "
        "`sweep tag|untag SWEEP TAG...`.",
    )
    p.add_argument(
        "--grid",
        "-g",
        action="append",
        default=[],
        metavar="NAME=V1,V2",
        help="values to try (a grid: every combination)",
    )
    p.add_argument("--random", "-r", type=int, metavar="N", help="N random cells instead of a grid")
    p.add_argument(
        "--uniform",
        action="append",
        default=[],
        metavar="NAME=MIN:MAX",
        help="with --random: drawn uniformly",
    )
    p.add_argument(
        "--log-uniform",
        action="append",
        default=[],
        metavar="NAME=MIN:MAX",
        help="with --random: drawn uniformly on a log scale",
    )
    p.add_argument(
        "--int",
        action="append",
        default=[],
        metavar="NAME=MIN:MAX",
        help="with --random: a whole number in [MIN, MAX]",
    )
    p.add_argument(
        "--choice",
        action="append",
        default=[],
        metavar="NAME=A,B",
        help="with --random: one of the values",
    )
    p.add_argument("--file", "-f", metavar="SWEEP.yml", help="a YAML sweep file")
    p.add_argument("--metric", "-m", help="the metric that ranks runs")
    p.add_argument(
        "--goal",
        choices=("max", "min"),
        help="whether --metric is better high or low (default: min for "
        "names like loss, error, perplexity; else max)",
    )
    p.add_argument("--max-parallel", type=int, metavar="N", help="at most N runs at once")
    p.add_argument("--retries", type=int, help="re-runs of a failed cell (default 2)")
    p.add_argument(
        "--early-terminate",
        choices=("median", "asha"),
        help="stop hopeless runs by the median rule or ASHA (needs --metric)",
    )
    p.add_argument("--seed", type=int, help="seed of --random draws")
    p.add_argument("--name", "-n", help="a readable name for the sweep")
    p.add_argument(
        "--max-cells", type=int, metavar="N", help="allow up to N runs (default cap: 10000)"
    )
    queue_options(p)
    p.add_argument(
        "--provider",
        "-p",
        default="local",
        help="where to run (default: local); P1,P2: the first that can hold it, the next "
        "when one gives it up (a pod no node takes)",
    )
    p.add_argument("--cpus", type=int, default=1, help="CPU slots per run (default 1)")
    p.add_argument("--gpus", type=int, default=0, help="GPUs per run (default 0)")
    p.add_argument("--memory", help="memory each run needs, e.g. 8G")
    p.add_argument(
        "--time",
        metavar="LIMIT",
        help="time limit of each run's attempts, with its "
        "unit: 90s, 30m, 2h, 1d or HH:MM:SS (a bare number is refused: write 5m)",
    )
    p.add_argument(
        "--image",
        metavar="REF",
        help="run every cell in this OCI image, pinned to its digest now (see `run --image`)",
    )
    p.add_argument(
        "--dataset",
        "-d",
        action="append",
        default=[],
        metavar="PATH[:NAME]",
        help="data every run gets at $MONKEY_DATASET_NAME (checksummed once)",
    )
    p.add_argument(
        "--env", "-e", action="append", default=[], metavar="K=V", help="a variable for every run"
    )
    p.add_argument("--workdir", "-w", help="folder to snapshot and run in (default: .)")
    p.add_argument(
        "--yes",
        "-y",
        action="store_true",
        help="store a working folder or dataset over 2 GB without asking",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--clear", action="store_true", help="with `sweep note SWEEP`: remove the note")
    p.add_argument(
        "cmd",
        nargs=argparse.REMAINDER,
        metavar="-- CMD | ACTION SWEEP",
        help="the command template, with {name} placeholders; or an action",
    )
    p.set_defaults(func=cmd_sweep)
    return p


def cmd_sweep(args: argparse.Namespace) -> int:
    words = args.cmd
    if words and words[0] in ("note", "tag", "untag"):
        return _sweep_notes(words, args.clear or "--clear" in words)
    if words and words[0] in SWEEP_ACTIONS:
        as_json = args.json or "--json" in words
        words = [w for w in words if w != "--json"]
        if len(words) != 2:
            raise UsageError(
                f"monkey sweep {words[0]}: name one sweep, e.g. monkey sweep {words[0]} last"
            )
        return _sweep_action(words[0], words[1], as_json)
    if words and words[0] != "--" and not (args.grid or args.random or args.file):
        hint = suggest(words[0], SWEEP_ACTIONS)
        if hint or len(words) == 2:  # `sweep stauts last`: a mistyped action, not a command
            raise UsageError(
                f"monkey sweep: unknown action {words[0]!r}{hint} (actions: "
                f"{', '.join(SWEEP_ACTIONS)}; a new sweep: --grid ... -- CMD)"
            )
    command = words[1:] if words[:1] == ["--"] else words
    if not command and not args.file:
        raise UsageError(
            "monkey sweep: no command given; write it after `--`, e.g. monkey sweep "
            "--grid lr=0.01,0.1 -- python train.py --lr {lr}"
        )
    from monkey.tracking import sweepspec

    options = sweepspec.from_options(
        command,
        grid=args.grid,
        random_count=args.random,
        uniform=args.uniform,
        log_uniform=args.log_uniform,
        ints=args.int,
        choice=args.choice,
    )
    if args.random is None and (args.uniform or args.log_uniform or args.int or args.choice):
        raise UsageError(
            "monkey sweep: --uniform/--log-uniform/--int/--choice draw random values; "
            "add --random N (how many runs)"
        )
    grid = {k: v["values"] for k, v in options["parameters"].items() if "distribution" not in v}
    dists = {k: v for k, v in options["parameters"].items() if "distribution" in v}
    m = monkey()
    sid = m.sweep(
        command or None,
        grid=grid,
        random=args.random,
        distributions=dists,
        file=args.file,
        metric=args.metric,
        goal=args.goal,
        max_parallel=args.max_parallel,
        retries=args.retries,
        early_terminate=args.early_terminate,
        seed=args.seed,
        name=args.name,
        max_cells=args.max_cells,
        provider=args.provider,
        cpus=args.cpus,
        gpus=args.gpus,
        memory=args.memory,
        time=args.time,
        image=args.image,
        datasets=args.dataset,
        env=args.env,
        workdir=args.workdir,
        yes=args.yes,
        after=args.after,
        after_any=args.after_any,
        priority=args.priority,
        **({"notify": [n for v in args.notify for n in v.split(",")]} if args.notify else {}),
    )
    if args.json:
        finite_json(m.sweep_status(sid))
    else:
        total = len(m.sweep_status(sid)["jobs"])
        print(sid)
        print(
            f"monkey: sweep {sid}: {total} runs queued; `monkey sweep status {sid}`",
            file=sys.stderr,
        )
    return 0


def _sweep_notes(words: list[str], clear: bool) -> int:
    """`sweep note SWEEP TEXT|--clear`, `sweep tag|untag SWEEP TAG...`."""
    action, rest = words[0], [w for w in words[1:] if w != "--clear"]
    if action == "note":
        if len(rest) != (1 if clear else 2):
            raise UsageError(
                "monkey sweep note: name one sweep and give the note's TEXT (quoted) or "
                "--clear, e.g. monkey sweep note last 'lr above 0.1 diverges'"
            )
        done = monkey().sweep_note(rest[0], None if clear else rest[1])
        print(f"{done['id']} note " + ("removed" if done["note"] is None else "saved"))
        return 0
    if len(rest) < 2 or clear:
        raise UsageError(
            f"monkey sweep {action}: name one sweep and its tags, e.g. "
            f"monkey sweep {action} last baseline"
        )
    tags = rest[1:]
    done = monkey().sweep_tag(
        rest[0], add=tags if action == "tag" else [], remove=tags if action == "untag" else []
    )
    print(f"{done['id']} tags: {' '.join(done['tags']) or '(none)'}")
    return 0


def _sweep_action(action: str, ref: str, as_json: bool) -> int:
    m = monkey()
    if action != "status":
        done = m.sweep_control(ref, action)
        print(f"{done['sweep']} {action}: {done['jobs']} runs")
        return 0
    st = m.sweep_status(ref)
    costs = m.costs([j["job"] for j in st["jobs"]])
    for j in st["jobs"]:
        j["cost"] = costs.get(j["job"])  # estimated $ {total, preempted}, None: unknown
    if as_json:
        finite_json(st)
        return 0
    from monkey.shell.table import STATE_COLOURS, render

    counts = ", ".join(f"{n} {s}" for s, n in sorted(st["counts"].items()))
    print(
        f"sweep {st['id']} ({st['name']}): {st['state']}, {st['done']}/{st['total']} ended"
        + (f" ({counts})" if counts else "")
    )
    if st.get("tags"):
        print(f"tags: {' '.join(st['tags'])}")
    if st.get("note"):
        from monkey.shell.info_commands import note_fields

        for key, line in note_fields(st["note"]):
            print(f"{key or '':4}  {line}")
    if st["state"] in ("submitting", "interrupted"):
        cells = st["spec"].get("cells", "?")
        print(
            f"{st['total']} of its {cells} cells written; "
            + (
                "they run once all are written"
                if st["state"] == "submitting"
                else f"its submission stopped half-way, so none will run: `monkey sweep cancel "
                f"{st['id']}` and submit it again"
            )
        )
    metric = st["spec"].get("metric")
    if metric:
        best = st["best"]
        print(
            f"metric {metric['name']} ({metric['goal']}): "
            + (
                f"best {fmt(best['value'])} by {best['job']} {json.dumps(best['params'])}"
                if best
                else f"no run has logged {metric['name']!r}"
                + ("" if st["state"] == "finished" else " yet")
                + (f" (they log: {', '.join(st['logged'])})" if st.get("logged") else "")
            )
        )
    if metric and st["best"]:
        _print_analysis(m.sweep_analysis(st["id"], st))
    if st["stopped_early"]:
        print(f"stopped early: {', '.join(st['stopped_early'])}")
    if costs:
        from monkey.store.cost import dollars

        total = sum(c["total"] for c in costs.values())
        wasted = sum(c["preempted"] for c in costs.values())
        print(
            f"cost: {dollars(total)} estimated"
            + (f", {dollars(wasted)} of it on preempted attempts" if wasted else "")
        )
    print()
    extra = (
        [dollars(costs[j["job"]]["total"]) if j["job"] in costs else "-" for j in st["jobs"]]
        if costs
        else []
    )
    render(
        ["JOB", "STATE", "TRIES"] + (["COST"] if costs else []) + ["PARAMS"],
        [
            [j["job"], j["state"], str(j["attempts"])]
            + ([extra[i]] if costs else [])
            + [json.dumps(j["params"])]
            for i, j in enumerate(st["jobs"])
        ],
        colours=[
            [None, STATE_COLOURS.get(j["state"]), None] + ([None] if costs else []) + [None]
            for j in st["jobs"]
        ],
    )
    return 0


def _print_analysis(analysis: dict[str, Any]) -> None:
    """Parameter importance as bars, and the best value over time, for `sweep status`."""
    if len(analysis["runs"]) < 2:
        return
    from monkey.tracking.sweep_analysis import too_few

    note = too_few(analysis)
    if not analysis["importance"]:
        print(f"parameter importance: {note}")
    else:
        print(f"parameter importance ({analysis['method']}):")
        width = max(map(len, analysis["importance"]), default=0)
        for name, share in analysis["importance"].items():
            print(f"  {name:<{width}}  {share:5.2f} {'#' * round(share * 30)}")
        if note:
            print(f"  {note}")
    curve = analysis["best_so_far"]
    if len(curve) > 1:
        t0 = curve[0][0]
        marks = [
            f"{fmt(v)} at {(t - t0) / 60:.1f} min"
            for i, (t, v) in enumerate(curve)
            if i == 0 or v != curve[i - 1][1]
        ]
        print(f"best so far: {' -> '.join(marks)}")


def cmd_list_sweeps(args: argparse.Namespace) -> int:
    from monkey.shell.table import ago, render

    sweeps = monkey().sweeps()
    if args.json:
        finite_json(sweeps)
        return 0
    if not sweeps:
        print("no sweeps yet; try `monkey sweep --grid lr=0.01,0.1 -- python train.py --lr {lr}`")
        return 0
    now = time.time()
    rows = []
    for s in sweeps:
        counts = s["counts"]
        total = sum(counts.values())
        done = sum(
            n
            for st, n in counts.items()
            if st in ("succeeded", "failed", "cancelled", "lost", "preempted")
        )
        metric = s["spec"].get("metric")
        rows.append(
            [
                s["id"],
                s["name"],
                s["state"],
                f"{done}/{total}",
                f"{metric['name']} ({metric['goal']})" if metric else "-",
                ago(now - s["created_at"]),
                " ".join(s["spec"]["command"]),
            ]
        )
    render(["SWEEP", "NAME", "STATE", "DONE", "METRIC", "AGE", "COMMAND"], rows, flex=6)
    return 0
