"""Jobs in a sandbox: bubblewrap (``bwrap``) with unprivileged user, mount and PID
namespaces. Standard library only (see agent.py).

What a sandboxed job sees is what is its own: the system read-only (``/`` bound
read-only), its own ``/tmp`` and ``/proc`` (a new PID namespace: no other job's processes,
no ``/proc/PID/environ`` but its own), a minimal ``/dev`` with the GPUs' ``/dev/nvidia*``
passed through, and the network as any job. The agent's root (MONKEY_HOME for the
``local`` provider) is hidden under an empty tmpfs, in which only the job's own folders
are bound again at their own paths, so every path the agent hands the job (its run
folder, its checkpoint folder, the code the agent gives every job, its datasets) holds:
the run folder, the checkpoint and persisted folders and the environments' folder
read-write, the job code and datasets read-only. The agent's HOME (the server user's SSH
keys and cloud credentials) is hidden the same way but for the software jobs run
(``home_software``). No capability is kept (``--cap-drop
ALL``: a job started by root cannot remount what is hidden).

The wrapper shell that claims the run folder stays outside (its pid is the claim's, it
joins the job's cgroup) and runs ``bwrap``; inside, ``INNER`` enters the job's folder,
checks the command as the wrapper does and execs it. The job stays in the wrapper's
session and process group (no ``--new-session``): the session is the agent's own new one
with no controlling terminal, so no terminal can be reached, and the agent's signals
reach every process inside. ``bwrap``'s own monitor process would die of a TERM and take
the sandbox with it (``--die-with-parent``) before the job could save a checkpoint, so
the agent sends every signal but KILL to the job's processes one by one, skipping
``bwrap``'s (``is_monitor``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from monkey.client_agent import engines
from monkey.client_agent.common import read_small
from monkey.client_agent.image import ISOLATED, binds, nvidia_devices

# Inside the sandbox: enter the job's folder, check the command (not found: 127, not
# executable: 126, each marked "spawn" in the claim as the wrapper does), exec it.
INNER = (
    'cd -P -- "$1" 2>/dev/null || { echo "monkey: cannot enter the job\'s folder $1" >&2; exit 126; }; shift; '
    'if ! command -v "$1" >/dev/null 2>&1; then '
    'echo "monkey: command not found: $1 (not on the job\'s PATH, or not executable)" >&2; '
    'echo spawn >> "$MONKEY_STARTED_FILE"; exit 127; '
    'elif [ "${1#*/}" != "$1" ] && { [ -d "$1" ] || [ ! -x "$1" ]; }; then '
    'echo "monkey: not executable: $1 (a folder, or a file without its x bit: chmod +x it)" >&2; '
    'echo spawn >> "$MONKEY_STARTED_FILE"; exit 126; fi; exec "$@"'
)
# How INNER's /proc/PID/cmdline starts: a sandbox whose job has yet to exec.
INNER_CMDLINE = b"\0".join([b"/bin/sh", b"-c", INNER.encode(), b"monkey-job", b""])
# Variables of the agent's environment a sandboxed job never gets.
HIDDEN_VARS = ("MONKEY_HOME", "MONKEY_CGROUP")
_PROBE_TIMEOUT = 10.0

_found: tuple[str, str] | None = None  # (bwrap's path or "", why not) once probed


def _common(bwrap: str) -> list[str]:
    """The options every sandbox has, before its folders."""
    return [
        bwrap,
        *ISOLATED,
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        "--tmpfs",
        "/tmp",
    ]


def bwrap() -> tuple[str, str]:
    """(the path of a bwrap that works here, "") or ("", why no sandbox can be made), found
    once per agent: ``MONKEY_BWRAP`` (a path) or ``bwrap`` on PATH, probed by running
    ``/bin/true`` in a sandbox as jobs get."""
    global _found
    if _found is None:
        _found = _probe(os.environ.get("MONKEY_BWRAP") or shutil.which("bwrap") or "")
    return _found


def _probe(path: str) -> tuple[str, str]:
    if not path:
        return "", "bubblewrap (bwrap) is not installed on this machine"
    if not os.access(path, os.X_OK):
        return "", f"bubblewrap is not at {path} (MONKEY_BWRAP), or not executable"
    try:
        proc = subprocess.run(
            [*_common(path), "--", "/bin/true"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=_PROBE_TIMEOUT,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return "", f"bubblewrap at {path} cannot run: {e}"
    if proc.returncode != 0:
        said = proc.stderr.decode(errors="replace").strip().splitlines()
        why = said[0] if said else f"exit {proc.returncode}"
        return (
            "",
            f"bubblewrap at {path} cannot make a sandbox here ({why}; are unprivileged user namespaces off?)",
        )
    return path, ""


def choose_engine(wanted: str = "auto") -> tuple[str, str]:
    """(the engine of engines.ENGINES that runs jobs' images here for a provider's WANTED
    engine, "") or ("", why none can). auto: in a Slurm allocation, pyxis where its srun
    has it, else apptainer, as the cluster's admins set them up; elsewhere (and then)
    monkey's own unprivileged runner (it pulls by itself: pull.py) where bubblewrap works,
    else the first of docker, podman and apptainer this worker has."""
    if wanted == "auto" and "SLURM_JOB_ID" in os.environ:
        found = next((e for e in ("pyxis", "apptainer") if engines.cli(e)), "")
        if found:
            return found, ""
    if wanted in ("auto", "bwrap"):
        path, why = bwrap()
        if path:
            return "bwrap", ""
        if wanted == "auto":
            found = next((e for e in ("docker", "podman", "apptainer") if engines.cli(e)), "")
            if found:
                return found, ""
        return "", why
    if wanted not in engines.ENGINES:
        return "", f"no engine {wanted!r} (auto, {', '.join(engines.ENGINES)})"
    if not engines.cli(wanted):
        return "", f"{wanted} is not installed on this worker"
    return wanted, ""


def image_engine(wanted: str = "auto") -> tuple[str, str]:
    """(the engine that runs jobs' images here for WANTED, in words, "") or ("", why none
    can)."""
    engine, why = choose_engine(wanted)
    return (engines.LABELS[engine], "") if engine else ("", why)


def engines_found() -> list[str]:
    """The engines of engines.ENGINES whose command this worker has (bwrap: one that works)."""
    return [e for e in engines.ENGINES if (bwrap()[0] if e == "bwrap" else engines.cli(e))]


def is_monitor(pid: int, path: str) -> bool:
    """Whether PID runs bwrap at PATH (its monitor, or its init in the sandbox)."""
    cmd = read_small(f"/proc/{pid}/cmdline")
    return cmd is not None and cmd.startswith(path.encode() + b"\0")


def home_software(environ: dict[str, str], package: str) -> tuple[str, list[str]]:
    """(the agent's HOME, the folders of software under it a job may need) from the agent's
    own ENVIRON, never a job's: HOME holds the server user's keys and credentials (~/.ssh,
    ~/.aws...), so a sandbox hides it but for the python the agent runs on (its prefix and
    base prefix), PACKAGE (the folder that holds monkey) and the folders of PATH's and
    PYTHONPATH's entries (a PATH entry's parent: ~/miniconda3 for ~/miniconda3/bin, the entry
    itself when its parent is HOME). ("", []) when HOME is unset, / or not a folder."""
    home = os.path.normpath(environ.get("HOME") or "/")
    if home == "/" or not os.path.isabs(home) or not os.path.isdir(home):
        return "", []
    found = [sys.prefix, sys.base_prefix, package]
    for entry in environ.get("PATH", "").split(os.pathsep):
        if os.path.isabs(entry):
            parent = os.path.dirname(os.path.normpath(entry))
            found.append(entry if parent == home else parent)
    found += [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if os.path.isabs(p)]
    inside = os.path.join(home, "")
    keep = {os.path.normpath(p) for p in found if os.path.normpath(p).startswith(inside)}
    return home, sorted(keep)


def argv(
    path: str,
    hidden: list[str],
    cwd: str,
    command: list[str],
    writable: list[str],
    readable: list[str],
    env: dict[str, str],
) -> list[str]:
    """The command that runs COMMAND in CWD in a sandbox made with the bwrap at PATH: the
    folders of HIDDEN covered (each by an empty read-only tmpfs), the folders of WRITABLE
    then READABLE bound again in them (those that exist, each at its own path), the GPUs'
    devices passed through, HIDDEN_VARS of ENV unset."""
    out = _common(path)
    for dev in nvidia_devices():
        out += ["--dev-bind", dev, dev]
    covered: list[str] = []  # one tmpfs per folder not inside another one
    for folder in sorted(hidden, key=len):
        if not any(folder == c or folder.startswith(os.path.join(c, "")) for c in covered):
            covered.append(folder)
    hidden = covered
    for folder in hidden:
        out += ["--tmpfs", folder]
    out += binds(writable, readable)
    for folder in reversed(hidden):  # the tmpfs alone: what is bound in it stays as bound
        out += ["--remount-ro", folder]
    for name in HIDDEN_VARS:
        if name in env:
            out += ["--unsetenv", name]
    return [*out, "--", "/bin/sh", "-c", INNER, "monkey-job", cwd, *command]
