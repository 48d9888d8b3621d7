"""The one-shot CLI: `monkey COMMAND ...`. Each command is a few lines of glue over the API.

The same parsers serve the interactive shell (monkey/shell/repl.py). This module imports
only what a command needs, so `monkey list jobs` stays fast.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from monkey.models import MonkeyError, State
from monkey.shell.common import (
    Parser,
    ParserClass,
    UsageError,
    check_jobs,
    follow,
    job_argument,
    make_parser,
    monkey,
    print_error,
    print_json,
    queue_options,
    suggest,
    write_all,
)
from monkey.shell.routing import NotRemote, route, shell_remote, take_remote

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from monkey.config import Home

VERSION = "0.1.0"


# -- parsers --------------------------------------------------------------------------


def run_parser(cls: ParserClass = Parser) -> argparse.ArgumentParser:
    p = make_parser(cls, "run", "Snapshot the code, queue CMD and print the job id.")
    p.add_argument(
        "--provider",
        "-p",
        default="local",
        help="where to run (default: local); P1,P2: the first that can hold it, the next "
        "when one gives it up (a pod no node takes)",
    )
    p.add_argument("--name", "-n", help="a readable name (default: the script's name)")
    p.add_argument("--cpus", type=int, default=1, help="CPU slots the job takes (default 1)")
    p.add_argument("--gpus", type=int, default=0, help="GPUs the job takes (default 0)")
    p.add_argument("--memory", help="memory the job needs, e.g. 8G")
    p.add_argument("--host", help="run on this host of the provider (ssh providers)")
    p.add_argument(
        "--time",
        metavar="LIMIT",
        help="time limit of each attempt, with its unit: "
        "90s, 30m, 2h, 1d or HH:MM:SS (a bare number is refused: write 5m for 5 "
        "minutes); then SIGTERM, SIGKILL after a grace, and the job fails",
    )
    p.add_argument(
        "--image",
        metavar="REF",
        help="run in this OCI image (e.g. pytorch/pytorch:2.4.0-cuda12.1-cudnn9-runtime, "
        "ghcr.io/lab/env@sha256:...), pinned to its digest now; no root or daemon needed",
    )
    p.add_argument(
        "--outputs",
        action="append",
        default=[],
        metavar="GLOB",
        help="files to fetch back from a remote host when the job ends, into "
        "MONKEY_HOME/runs/JOB/ATTEMPT/work/ (repeatable)",
    )
    p.add_argument("--retries", type=int, default=0, help="re-runs after a failure or loss")
    queue_options(p)
    p.add_argument(
        "--dataset",
        "-d",
        action="append",
        default=[],
        metavar="PATH[:NAME]",
        help="checksum and ship PATH; the job finds it at $MONKEY_DATASET_NAME",
    )
    p.add_argument(
        "--env",
        "-e",
        action="append",
        default=[],
        metavar="K=V",
        help="set a variable for the job (secret-looking names are never stored)",
    )
    p.add_argument(
        "--workdir", "-w", help="folder to snapshot and run in; its job.yml applies (default: .)"
    )
    p.add_argument(
        "--follow",
        "-f",
        action="store_true",
        help="stream the job's output and exit with its exit code",
    )
    spec = p.add_mutually_exclusive_group()
    spec.add_argument(
        "--job-yml", metavar="FILE", help="apply this job.yml (default: the workdir's)"
    )
    spec.add_argument("--no-job-yml", action="store_true", help="ignore the workdir's job.yml")
    p.add_argument("--json", action="store_true", help="print the job as JSON")
    p.add_argument(
        "--yes",
        "-y",
        action="store_true",
        help="store a working folder or dataset over 2 GB without asking",
    )
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD", help="the command to run")
    p.set_defaults(func=cmd_run)
    return p


def list_parser(cls: ParserClass = Parser) -> argparse.ArgumentParser:
    p = make_parser(cls, "list", "List jobs, providers, instances or sweeps.")
    sub = p.add_subparsers(dest="what", required=True, metavar="{jobs,providers,instances,sweeps}")
    jobs = sub.add_parser("jobs", help="jobs, newest first", description="Jobs, newest first.")
    for flag, text in (
        ("--running", "dispatching or running"),
        ("--queued", "queued or paused"),
        ("--finished", "ended in any way"),
        ("--failed", "failed or lost"),
    ):
        jobs.add_argument(flag, action="store_true", help=f"only jobs {text}")
    jobs.add_argument("--provider", "-p", help="only jobs of this provider")
    jobs.add_argument("--tag", metavar="TAG", help="only jobs tagged TAG (`job tag`)")
    jobs.add_argument("--limit", "-l", type=int, default=50, help="at most N jobs (default 50)")
    jobs.add_argument("--all", "-a", action="store_true", help="every job (no --limit)")
    who = jobs.add_mutually_exclusive_group()
    who.add_argument(
        "--mine", action="store_true", help="only my jobs (through a remote: its token's user's)"
    )
    who.add_argument("--owner", metavar="NAME", help="only the jobs NAME submitted")
    jobs.add_argument("--json", action="store_true", help="print JSON")
    jobs.set_defaults(func=_command_in("listing_commands", "cmd_list_jobs"))
    prov = sub.add_parser(
        "providers",
        help="configured providers and their capacity",
        description="Configured providers and their capacity.",
    )
    prov.add_argument("--json", action="store_true", help="print JSON")
    prov.add_argument(
        "--monkey-instances",
        action="store_true",
        help="the cloud instances monkey created: state, size, spot, address, "
        "jobs, age and estimated cost so far",
    )
    prov.add_argument(
        "--all",
        "-a",
        action="store_true",
        help="with --monkey-instances: the terminated ones too, with why they ended",
    )
    prov.set_defaults(func=_command_in("listing_commands", "cmd_list_providers"))
    inst = sub.add_parser(
        "instances",
        help="the machines and pods monkey holds",
        description="The cloud instances monkey created and the pods it runs on Kubernetes "
        "clusters (each cluster listed now): state, node or address, jobs, age, cost.",
    )
    inst.add_argument("--json", action="store_true", help="print JSON")
    inst.add_argument(
        "--all", "-a", action="store_true", help="the terminated instances too, with why"
    )
    inst.set_defaults(func=_command_in("listing_commands", "cmd_list_instances"))
    sweeps = sub.add_parser(
        "sweeps", help="sweeps, newest first", description="Sweeps, newest first."
    )
    sweeps.add_argument("--json", action="store_true", help="print JSON")
    sweeps.set_defaults(func=_command_in("sweep_commands", "cmd_list_sweeps"))
    return p


def info_parser(cls: ParserClass = Parser) -> argparse.ArgumentParser:
    p = make_parser(cls, "info", "Show everything known about a job.")
    sub = p.add_subparsers(dest="what", required=True, metavar="{job}")
    job = sub.add_parser("job", help="one job in full", description="One job in full.")
    job_argument(job)
    job.add_argument("--json", action="store_true", help="print JSON")
    job.add_argument(
        "--files", action="store_true", help="list its code files with sizes and digests"
    )
    job.set_defaults(func=_command_in("info_commands", "cmd_info_job"))
    return p


def logs_parser(cls: ParserClass = Parser) -> argparse.ArgumentParser:
    p = make_parser(
        cls,
        "logs",
        "Print a job's output, stdout and stderr in the order they were "
        "written (all attempts, oldest first, each marked).",
    )
    job_argument(p, count="?", default="last", help="job id, unique prefix, or `last` (default)")
    p.add_argument(
        "--follow",
        "-f",
        action="store_true",
        help="keep printing until the job ends; exit with its exit code",
    )
    stream = p.add_mutually_exclusive_group()
    stream.add_argument("--stdout", action="store_true", help="only the output stream")
    stream.add_argument("--stderr", action="store_true", help="only the error stream")
    p.add_argument(
        "--tail",
        "-t",
        type=int,
        metavar="N",
        help="only the last N lines (with --follow: start from them)",
    )
    p.add_argument("--attempt", "-a", type=int, help="only this attempt")
    p.add_argument(
        "--setup",
        action="store_true",
        help="what preparing the job's environment printed (job.yml `run`)",
    )
    p.set_defaults(func=cmd_logs)
    return p


def job_parser(cls: ParserClass = Parser) -> argparse.ArgumentParser:
    p = make_parser(
        cls, "job", "Control jobs: cancel, pause, resume, retry, priority; note and tag them."
    )
    sub = p.add_subparsers(
        dest="action",
        required=True,
        metavar="{cancel,pause,resume,retry,priority,note,tag,untag}",
    )
    texts = {
        "cancel": "stop jobs for good (SIGTERM, then SIGKILL after a grace period)",
        "pause": "hold jobs; running ones are stopped gracefully",
        "resume": "re-queue paused jobs; they continue from their checkpoint",
        "retry": "run finished jobs again as a new attempt",
    }
    for action, text in texts.items():
        a = sub.add_parser(action, help=text, description=text[0].upper() + text[1:] + ".")
        job_argument(a, "jobs", "+", help="job ids, prefixes, or `last`")
        a.set_defaults(func=cmd_job)
    text = "change the priority of a queued or paused job (higher starts first)"
    a = sub.add_parser("priority", help=text, description=text[0].upper() + text[1:] + ".")
    job_argument(a, "job", help="a job id, a prefix, or `last`")
    a.add_argument("priority", type=int, metavar="N", help="the new priority, e.g. 10 or -5")
    a.set_defaults(func=cmd_job_priority)
    text = "write a note on a job (what it tried, what it showed), or remove it"
    a = sub.add_parser("note", help=text, description=text[0].upper() + text[1:] + ".")
    job_argument(a, "job", help="a job id, a prefix, or `last`")
    note_arguments(a)
    a.set_defaults(func=_command_in("info_commands", "cmd_job_note"))
    for action, text in (
        ("tag", "tag a job (`list jobs --tag TAG` finds it)"),
        ("untag", "remove tags from a job"),
    ):
        a = sub.add_parser(action, help=text, description=text[0].upper() + text[1:] + ".")
        job_argument(a, "job", help="a job id, a prefix, or `last`")
        a.add_argument("tags", nargs="+", metavar="TAG", help="letters, digits, . _ - : +")
        a.set_defaults(func=_command_in("info_commands", "cmd_job_tag"))
    return p


def note_arguments(p: argparse.ArgumentParser) -> None:
    """A note's TEXT, or --clear: of `job note` and `sweep note`."""
    p.add_argument("text", nargs="?", metavar="TEXT", help="the note (quote it; up to 10 KB)")
    p.add_argument("--clear", action="store_true", help="remove the note")


def cmd_job_priority(args: argparse.Namespace) -> int:
    m = monkey()
    juid = m.resolve(args.job)
    print(f"{juid} priority {m.set_priority(juid, args.priority)}")
    return 0


def kill_parser(cls: ParserClass = Parser) -> argparse.ArgumentParser:
    p = make_parser(cls, "kill", "Same as `job cancel`.")
    sub = p.add_subparsers(dest="what", required=True, metavar="{job}")
    job = sub.add_parser("job", help="cancel jobs", description="Cancel jobs.")
    job_argument(job, "jobs", "+", help="job ids, prefixes, or `last`")
    job.set_defaults(func=cmd_job, action="cancel")
    return p


def daemon_parser(cls: ParserClass = Parser) -> argparse.ArgumentParser:
    p = make_parser(
        cls, "daemon", "Run the core: start (background), stop, status, run (foreground)."
    )
    p.add_argument("action", choices=("start", "stop", "status", "run"))
    p.add_argument(
        "--all", action="store_true", help="stop: also stop the local agent when it runs no job"
    )
    p.set_defaults(func=cmd_daemon)
    return p


def completion_parser(cls: ParserClass = Parser) -> argparse.ArgumentParser:
    p = make_parser(
        cls, "completion", 'Print a completion script: eval "$(monkey completion bash)".'
    )
    p.add_argument("shell", choices=("bash", "zsh"))
    p.set_defaults(func=cmd_completion)
    return p


def _of(module: str, name: str) -> Any:
    """NAME of monkey.shell.MODULE, which is imported only now (a command pays only for
    its own module)."""
    return getattr(__import__(f"monkey.shell.{module}", fromlist=[name]), name)


def _command_in(module: str, name: str) -> Callable[[argparse.Namespace], int]:
    """The command function NAME of monkey.shell.MODULE, imported when it runs."""
    return lambda args: _of(module, name)(args)


def _elsewhere(module: str, builder: str) -> Callable[..., argparse.ArgumentParser]:
    """The parser builder BUILDER of monkey.shell.MODULE, imported when first called."""
    return lambda cls=Parser: _of(module, builder)(cls)


# Commands kept in their own modules: name -> (module, parser builder).
_MODULES = {
    "dash": ("dash_commands", "dash_parser"),
    "web": ("web_commands", "web_parser"),
    "init": ("jobspec_commands", "init_parser"),
    "pull": ("jobspec_commands", "pull_parser"),
    "search": ("tracking_commands", "search_parser"),
    "metrics": ("tracking_commands", "metrics_parser"),
    "plot": ("tracking_commands", "plot_parser"),
    "report": ("tracking_commands", "report_parser"),
    "sweep": ("sweep_commands", "sweep_parser"),
    "compare": ("tracking_commands", "compare_parser"),
    "diff": ("tracking_commands", "diff_parser"),
    "export": ("tracking_commands", "export_parser"),
    "provider": ("provider_commands", "provider_parser"),
    "create": ("instance_commands", "create_parser"),
    "delete": ("instance_commands", "delete_parser"),
    "rerun": ("rerun_commands", "rerun_parser"),
    "clone": ("rerun_commands", "clone_parser"),
    "cat": ("rerun_commands", "cat_parser"),
    "rm": ("disk_commands", "rm_parser"),
    "gc": ("disk_commands", "gc_parser"),
    "du": ("disk_commands", "du_parser"),
    "verify": ("disk_commands", "verify_parser"),
    "notify": ("notify_commands", "notify_parser"),
    "registry": ("registry_commands", "registry_parser"),
}

PARSERS: dict[str, Callable[..., argparse.ArgumentParser]] = {
    "run": run_parser,
    "list": list_parser,
    "info": info_parser,
    "logs": logs_parser,
    "job": job_parser,
    "kill": kill_parser,
    "daemon": daemon_parser,
    **{name: _elsewhere(module, builder) for name, (module, builder) in _MODULES.items()},
}

# Commands of the one-shot CLI only (the shell completes by itself).
ONE_SHOT: dict[str, Callable[..., argparse.ArgumentParser]] = {
    "completion": completion_parser,
    # the main node's server (run on it)
    "server": _elsewhere("server_commands", "server_parser"),
    # the remotes commands go to (the shell has it too: see SHELL_TOO)
    "remote": _elsewhere("remote_commands", "remote_parser"),
}
# One-shot commands the `monkey>` shell has too.
SHELL_TOO = ("remote",)

OVERVIEW = """\
usage: monkey [COMMAND [ARGS]]

monkey runs your experiments on any compute and remembers everything.
With no command it opens the interactive `monkey>` shell.

commands:
  run [OPTIONS] -- CMD...    snapshot the code and queue CMD (prints the job id)
  list jobs|providers|sweeps jobs (newest first), configured providers, or sweeps
  list instances             the cloud instances monkey made and the pods it runs
  info job JOB               everything known about a job
  logs [-f] JOB              a job's output; -f follows it, --setup its set-up
  search WORDS...            jobs whose command or output holds WORDS, newest first
  job cancel|pause|resume|retry JOB...
  job note JOB TEXT          a note on a job (--clear removes it); job tag|untag JOB TAG...
  kill job JOB...            same as `job cancel`
  daemon start|stop|status|run   (status: versions; stop --all: idle agent too)
  completion bash|zsh        a completion script: eval "$(monkey completion bash)"
  provider add ssh NAME      add SSH hosts: --host [USER@]HOST[:PORT]... (repeatable)
  provider add aws NAME      add an EC2 region: creates its VPC, key pair and bucket
  provider add gcp NAME      add a GCE project: creates its firewall rule, key and bucket
  provider add slurm NAME    add a Slurm partition (--login USER@HOST from a laptop)
  provider add kubernetes NAME   add a kubeconfig context: one pod per job, in its image
  provider check NAME        connect to a provider's hosts and report each
  create instance --provider P   create (cloud) or claim (SSH) an instance ahead of jobs
  delete instance ID         terminate (cloud) or release (SSH) an instance
  dash [JOB]                 the full-screen dashboard
  web [JOB]                  Monkey Web in a browser (a one-time login link)
  init                       write a commented job.yml for this project
  pull JOB [--to DIR]        fetch a job's persisted folders (job.yml `persist`)
  metrics JOB [--plot]       a job's metrics (--name N, --json, --csv)
  plot JOB... -m M -o F.png  a PNG comparing metric M across jobs (or --jobs, --name, --since)
  sweep [OPTIONS] -- CMD     a hyper-parameter sweep (--grid, --random, --file)
  sweep status|cancel|pause|resume|retry SWEEP
  sweep note SWEEP TEXT      a note on a sweep (--clear); sweep tag|untag SWEEP TAG...
  compare JOB...|--sweep S   parameters and final/best metrics, ranked
  diff JOB_A JOB_B           what differs between two jobs
  report SWEEP -o F.html     a self-contained HTML report of a sweep (or --jobs, --name, --since)
  export [JOB...] --to F.db  jobs, params, metrics, output as a SQLite file (--sweep, --since, --csv DIR)
  rerun JOB [--set P=V]...   queue a job again from its record (--sweep S [--failed])
  clone JOB [--to DIR]       write a job's code as it was (git commit + diff applied)
  cat JOB PATH               one of a job's code files as it saw it
  rm JOB...|--sweep S|--older-than 30d|--failed   delete ended jobs and their files
  gc                         free blobs no job needs and folders of deleted jobs
  du                         disk used by jobs, blobs, environments
  verify [JOB...]            check stored code and data against their digests
  notify add|list|remove|test   word of your jobs' ends: Slack, signed webhooks, email
  server start|run|stop|status   this machine as a main node: the HTTPS API (--bind HOST:PORT)
  server user add|list|remove|token   the server's users and their tokens
  remote add|use|list|remove     main nodes this machine sends commands to (--remote NAME)
  registry login|list|logout     logins to the registries of jobs' images (run --image REF)

JOB is a job id (26-11-21-001), a unique prefix of one, or `last`; also as --juid JOB.
`monkey COMMAND --help` describes a command. State lives in $MONKEY_HOME (~/.monkey).
`monkey --remote NAME COMMAND` (or $MONKEY_REMOTE) sends a command to a main node.
"""


# -- helpers --------------------------------------------------------------------------


# -- commands -------------------------------------------------------------------------


def early_image(text: str) -> None:
    """Start resolving a submission's image on this machine before its facade loads, so
    that the registry answers meanwhile (a main node resolves it there: nothing here)."""
    from monkey.remote.settings import selected

    if selected():
        return
    from monkey.config import Home
    from monkey.images import resolve_early

    resolve_early(Home(), text)


def cmd_run(args: argparse.Namespace) -> int:
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        raise UsageError(
            "monkey run: no command given; write it after `--`, e.g. monkey run -- python train.py"
        )
    if args.image:
        early_image(args.image)
    try:
        m = monkey()
        job = m.run(
            cmd,
            provider=args.provider,
            name=args.name,
            cpus=args.cpus,
            gpus=args.gpus,
            memory=args.memory,
            host=args.host,
            time=args.time,
            image=args.image,
            outputs=args.outputs,
            retries=args.retries,
            datasets=args.dataset,
            env=args.env,
            workdir=args.workdir,
            job_yml=False if args.no_job_yml else args.job_yml,
            yes=args.yes,
            after=args.after,
            after_any=args.after_any,
            priority=args.priority,
            notify=[n for v in args.notify or () for n in v.split(",")] or None,
        )
    finally:
        if args.image:
            from monkey.images import cancel_early

            cancel_early()  # one the submission never took (it failed first)
    if args.json:
        print_json(job.record.to_json())
    elif args.follow:
        print(f"monkey: job {job.juid} queued on {args.provider}", file=sys.stderr)
    else:
        print(job.juid)
    if args.follow:
        return follow(m, job.juid, "both")
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    m = monkey()
    juid = m.resolve(args.job)
    if args.tail is not None and args.tail < 0:
        raise UsageError("monkey logs: --tail must be >= 0")
    if args.follow:
        if args.attempt is not None or args.setup:
            raise UsageError("monkey logs: --follow cannot be combined with --attempt or --setup")
        return follow(m, juid, _stream(args), tail=args.tail)
    if args.setup and (args.stderr or args.stdout):
        raise UsageError("monkey logs: --setup cannot be combined with --stdout or --stderr")
    chunks = m.output_chunks(
        juid, _stream(args), attempt=args.attempt, tail=args.tail, setup=args.setup
    )
    if not write_all(chunks) and args.setup and args.tail != 0:
        print(
            f"monkey: job {juid} has no set-up output (its job.yml prepares no "
            "environment and persists no folder, or it has not started)",
            file=sys.stderr,
        )
    return 0


def _stream(args: argparse.Namespace) -> str:
    return "stderr" if args.stderr else "stdout" if args.stdout else "both"


def cmd_completion(args: argparse.Namespace) -> int:
    from monkey.shell.completion import SCRIPTS

    sys.stdout.write(SCRIPTS[args.shell])
    return 0


def _complete(words: list[str]) -> int:
    """`monkey __complete WORD...`: the candidates for the last word, one a line."""
    from monkey.shell.completion import candidates

    if len(words) > 1:
        words = expand(words)
    from monkey.shell.sweep_commands import SWEEP_ACTIONS

    actions = {"sweep": SWEEP_ACTIONS}
    for word in candidates(words, {**PARSERS, **ONE_SHOT}, list(SHORT_FORMS), recent_jobs, actions):
        print(word)
    return 0


def recent_jobs(limit: int = 50, facade: Callable[[], Any] | None = None) -> list[str]:
    """The newest job ids, newest first, to complete a JOB: through a remote the main node's
    (asked through FACADE(), default a new one), none when it is out of reach or refuses;
    else this machine's."""
    from monkey.remote.settings import selected

    if selected():
        try:
            return [j.juid for j in (facade or monkey)().job_listing(limit=limit)["jobs"]]
        except MonkeyError:
            return []
    from monkey.config import Home
    from monkey.store import Store

    return [j.juid for j in Store(Home().ensure().db).list_jobs(limit=limit)]


def cmd_job(args: argparse.Namespace) -> int:
    m = monkey()
    action = getattr(m, args.action)
    status = 0
    for ref in args.jobs:
        try:
            juid = m.resolve(ref)
            state = action(juid)
        except MonkeyError as exc:
            print_error(str(exc))
            status = 1
            continue
        done = {"cancel": State.CANCELLED, "pause": State.PAUSED}.get(args.action)
        if done is not None and state != done:
            print(f"{juid} {args.action} requested (job is {state.value})")
        else:
            print(f"{juid} {state.value}")
    return status


def cmd_daemon(args: argparse.Namespace) -> int:
    from monkey.config import Home
    from monkey.core import daemon

    home = Home().ensure()
    if args.action == "run":
        return daemon.run_foreground(home)
    if args.action == "start":
        pid: int | None = daemon.start(home)
        print(f"core running (pid {pid}) for {home.root}")
    elif args.action == "stop":
        from monkey.server import service

        if service.saved_settings(home).get("personal") and service.status(home):
            service.stop(home)  # `monkey web`'s server: it would start the core again
            print("Monkey Web stopped")
        pid = daemon.stop(home)
        print(f"core stopped (pid {pid})" if pid else "core was not running")
        agent = daemon.local_agent(home, stop_if_idle=True) if args.all else None
        if agent is not None:
            print(
                f"agent stopped (pid {agent['pid']})"
                if agent["stopping"]
                else f"agent (pid {agent['pid']}) left running: it runs jobs"
            )
    else:
        return _daemon_status(home)
    return 0


def _daemon_status(home: Home) -> int:
    """`daemon status`: the core, and the versions of this CLI, the core and the local agent."""
    from monkey.core import daemon
    from monkey.version import version

    pid = daemon.status(home)
    if pid:
        why: str | None = daemon.condition(home)
        print(
            f"core running ({daemon.who(home)}) for {home.root}" + (f", but {why}" if why else "")
        )
    else:
        why = daemon.read_only(home)
        print("core not running" + (f"; it cannot start: {why}" if why else ""))
    mine, core, agent = version(), daemon.core_version(home), daemon.local_agent(home)
    print(f"  cli    {mine}")
    if pid:
        print(
            f"  core   {core or 'unknown (older)'}"
            + ("" if core == mine else "  (outdated: the next command restarts it)")
        )
    if agent is None:
        print("  agent  not running")
    else:
        from monkey.drivers.local import outdated

        digest = agent.get("digest") or "unknown (older)"
        print(
            f"  agent  {digest} (pid {agent['pid']})"
            + (
                ""
                if outdated(agent) is None
                else "  (outdated: the core replaces it, its jobs keep running)"
            )
        )
    return 0 if pid else 3


# -- entry point ----------------------------------------------------------------------


def user_error(exc: Exception) -> MonkeyError | None:
    """The one-line error for an exception the user can act on (a damaged database), or None."""
    if "sqlite3" not in sys.modules:  # not loaded: EXC cannot come from it
        return None
    from monkey.config import Home
    from monkey.store.db import damaged, is_damage

    return damaged(Home().db, str(exc)) if is_damage(exc) else None


# Short forms: `monkey cancel JOB` is `monkey job cancel JOB`, `monkey info JOB` is
# `monkey info job JOB`.
SHORT_FORMS = {action: ["job", action] for action in ("cancel", "pause", "resume", "retry")}


def expand(argv: list[str]) -> list[str]:
    """ARGV with a short form written out in full."""
    if argv[0] in SHORT_FORMS:
        return [*SHORT_FORMS[argv[0]], *argv[1:]]
    if (
        argv[0] == "info"
        and len(argv) > 1
        and argv[1] != "job"
        and (not argv[1].startswith("-") or argv[1].partition("=")[0] == "--juid")
    ):
        return ["info", "job", *argv[1:]]
    return argv


def dispatch(argv: list[str]) -> int:
    """Run one command line; returns the exit status. Errors raise MonkeyError."""
    argv = expand(argv)
    name = argv[0]
    builder = PARSERS.get(name) or ONE_SHOT.get(name)
    if builder is None:
        names = [*PARSERS, *ONE_SHOT, *SHORT_FORMS]
        raise UsageError(
            f"unknown command {name!r}{suggest(name, names)} "
            f"(commands: {', '.join(names)}; see monkey --help)"
        )
    args = builder().parse_args(argv[1:])
    route(name, args)
    check_jobs(args)
    return int(args.func(args) or 0)


def _failed(exc: MonkeyError) -> int:
    """Print EXC as one line; the exit status it gives."""
    print(str(exc) if isinstance(exc, NotRemote) else f"monkey: error: {exc}", file=sys.stderr)
    return 2 if isinstance(exc, UsageError) else 1


def main(argv: list[str] | None = None) -> int:
    """`monkey ARGS`: one command, or the interactive shell when there are none."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        argv = take_remote(argv)
        if not argv:
            shell_remote()
    except MonkeyError as exc:
        return _failed(exc)
    if not argv:
        from monkey.shell.repl import run_shell

        return run_shell()
    if argv[0] in ("-h", "--help", "help"):
        sys.stdout.write(OVERVIEW)
        return 0
    if argv[0] == "__complete":
        try:
            return _complete(argv[1:])
        except Exception:  # completion never prints a traceback into the user's prompt
            return 1
    if argv[0] in ("-V", "--version"):
        print(f"monkey {VERSION}")
        return 0
    try:
        return dispatch(argv)
    except MonkeyError as exc:
        return _failed(exc)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        error = user_error(exc)
        if error is None:
            raise
        print(f"monkey: error: {error}", file=sys.stderr)
        return 1
