"""`monkey init` (write a job.yml) and `monkey pull` (fetch a job's persisted folders)."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from monkey.models import MonkeyError


def init_parser(cls: type[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p = cls(
        prog="monkey init",
        description="Write a commented job.yml for this project.",
        epilog="On a terminal it asks; flags answer ahead.",
    )
    p.add_argument("--name", "-n", help="the project's name (default: the folder's name)")
    p.add_argument(
        "--env-type",
        choices=("pip", "conda", "none"),
        help="environment built on each worker (default: detected from "
        "requirements.txt / environment.yml)",
    )
    p.add_argument("--env-file", help="requirements or conda environment file")
    p.add_argument("--install-script", metavar="FILE", help="script run once per worker")
    p.add_argument(
        "--persist",
        action="append",
        default=None,
        metavar="DIR",
        help="folder kept across attempts (repeatable; default: output if it exists)",
    )
    p.add_argument(
        "--data",
        action="append",
        default=None,
        metavar="DIR",
        help="data folder shipped with the job (repeatable)",
    )
    p.add_argument("--yes", "-y", action="store_true", help="ask nothing; use flags and defaults")
    p.add_argument("--force", action="store_true", help="replace an existing job.yml")
    p.set_defaults(func=cmd_init)
    return p


def pull_parser(cls: type[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p = cls(
        prog="monkey pull",
        description="Fetch a job's persisted folders (job.yml `persist`).",
        epilog="Each lands at its path under DIR.",
    )
    from monkey.shell.common import job_argument

    job_argument(p)
    p.add_argument("--to", metavar="DIR", help="where to put them (default: ./JOB)")
    p.add_argument("--force", action="store_true", help="write into folders that are not empty")
    p.set_defaults(func=cmd_pull)
    return p


def _ask(
    question: str, default: str, problem: Callable[[str], str | None] = lambda answer: None
) -> str:
    """The answer (DEFAULT when empty), asked again while ``problem(answer)`` names one."""
    while True:
        try:
            answer = input(f"{question} [{default}]: ").strip() or default
        except EOFError:  # input ended: take the defaults
            answer = default
            ended = True
        else:
            ended = False
        trouble = problem(answer)
        if trouble is None:
            return answer
        if ended:
            raise MonkeyError(trouble)
        print(f"  {trouble}", file=sys.stderr)


def _outside(folder: Path, answer: str) -> str | None:
    """A line naming the first of the comma-separated ANSWER that leaves FOLDER."""
    for item in (a.strip() for a in answer.split(",")):
        if item and not (folder / item).resolve().is_relative_to(folder.resolve()):
            return f"{item!r} is outside the project; give a folder inside {folder}"
    return None


def _missing_files(folder: Path, answer: str, kind: str) -> str | None:
    """A line naming the first of the comma-separated ANSWER that is not a KIND in FOLDER."""
    for item in (a.strip() for a in answer.split(",")):
        path = folder / item
        if item and not (path.is_dir() if kind == "folder" else path.is_file()):
            return f"there is no {kind} {item!r} in {folder}; give one that exists"
    return None


def cmd_init(args: argparse.Namespace) -> int:
    from monkey import jobspec

    folder = Path.cwd()
    target = folder / jobspec.FILENAME
    if target.exists() and not args.force:
        raise MonkeyError(f"{target} exists; edit it, or pass --force to replace it")
    env_type, env_file = jobspec.detect_env(folder)
    if args.env_file:
        env_file = args.env_file
        env_type = args.env_type or ("conda" if env_file.endswith((".yml", ".yaml")) else "pip")
    elif args.env_type:
        env_type = args.env_type
        env_file = env_file if env_type != "none" else None
    name = args.name or folder.name
    persist = (
        args.persist
        if args.persist is not None
        else (["output"] if (folder / "output").is_dir() else [])
    )
    data = args.data or []
    script = args.install_script
    if not args.yes and sys.stdin.isatty():
        types = ", ".join(jobspec.ENV_TYPES)
        name = _ask("project name", name)
        env_type = _ask(
            f"environment ({types})",
            env_type,
            lambda a: None if a in jobspec.ENV_TYPES else f"answer one of {types}",
        )
        if env_type != "none":
            env_file = _ask(
                "environment file",
                env_file or "requirements.txt",
                lambda a: _missing_files(folder, a, "file"),
            )
        else:
            env_file = None
        script = (
            _ask(
                "install script run once per worker (empty: none)",
                script or "",
                lambda a: _missing_files(folder, a, "file"),
            )
            or None
        )
        persist = _ask(
            "persisted folders, comma-separated", ",".join(persist), lambda a: _outside(folder, a)
        ).split(",")
        data = _ask(
            "data folders, comma-separated",
            ",".join(data),
            lambda a: _missing_files(folder, a, "folder"),
        ).split(",")
    if env_type not in jobspec.ENV_TYPES:
        raise MonkeyError(f"environment {env_type!r} is not one of {', '.join(jobspec.ENV_TYPES)}")
    if env_type != "none" and not env_file:
        raise MonkeyError(f"env_type {env_type} needs an environment file; pass --env-file FILE")
    text = jobspec.render(
        name,
        env_type,
        env_file,
        script,
        [p.strip().strip("/") for p in persist if p.strip()],
        [d.strip().strip("/") for d in data if d.strip()],
    )
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(text)
    try:
        jobspec.load(tmp)  # nothing half-right is written: the file must load back
    except MonkeyError as exc:
        tmp.unlink()
        raise MonkeyError(str(exc).replace(str(tmp.resolve()), str(target))) from None
    os.replace(tmp, target)
    print(f"wrote {target}; `monkey run -- CMD` in this folder uses it")
    return 0


def cmd_pull(args: argparse.Namespace) -> int:
    from monkey.shell.common import monkey

    m = monkey()
    juid = m.resolve(args.job)
    folders = m.persisted(juid)
    if not folders:
        raise MonkeyError(
            f"job {juid} has no saved persisted folders (job.yml `persist`, saved while it runs)"
        )
    dest = Path(args.to or juid).expanduser()
    for rel, _saved in folders:
        target = dest / rel
        blocker = next((p for p in (dest, target) if p.exists() and not p.is_dir()), None)
        if blocker is not None:
            raise MonkeyError(f"{blocker} is a file, not a folder; choose another folder with --to")
        if target.exists() and any(target.iterdir()) and not args.force:
            raise MonkeyError(
                f"{target} is not empty; pass --force to write into it "
                "or choose another folder with --to"
            )
    for rel, saved in folders:
        try:
            shutil.copytree(saved, dest / rel, symlinks=True, dirs_exist_ok=True)
        except (OSError, shutil.Error) as exc:
            raise MonkeyError(f"cannot copy {rel} to {dest / rel}: {exc}") from None
        print(f"{rel} -> {dest / rel}")
    return 0


def spec_fields(spec: dict) -> list[tuple[str, str]]:
    """`monkey info job` lines for the job.yml a job was submitted with."""
    run = spec["env_type"] + (f" from {spec['env_file']}" if spec.get("env_file") else "")
    if spec.get("install_script"):
        run += f", then {spec['install_script']}"
    fields = [("job.yml", spec["file"]), ("environment", run)]
    for p in spec.get("persist", []):
        fields.append((f"persist {p['name']}", p["path"]))
    for d in spec.get("data", []):
        fields.append(
            (
                f"data {d['name']}",
                f"{d['path']} ({d['type']}, {d['digest'][:16]}, "
                f"{d['size']} bytes, {d['stored']} newly stored)",
            )
        )
    if spec.get("provider_options"):
        options = ", ".join(f"{k}={v}" for k, v in sorted(spec["provider_options"].items()))
        fields.append(("machine", options))
    return fields
