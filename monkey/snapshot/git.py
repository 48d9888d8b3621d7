"""Git provenance of a job's folder: the work tree holding it, commit, branch, diff and
untracked files."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

from monkey.models import MonkeyError, Record
from monkey.snapshot.blobs import BlobStore
from monkey.snapshot.walk import _existing

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_GIT_TIMEOUT = 60.0
_MAX_UNTRACKED = 100


def _git_top(start: str) -> str | None:
    """The nearest folder from START (a real path) up holding a ``.git``, or None."""
    here = start
    while True:
        try:
            os.lstat(here + "/.git" if here != "/" else "/.git")
            return here
        except OSError:
            pass
        if here == "/":
            return None
        here = here[: here.rindex("/")] or "/"


class Folder(Record):
    """A folder's real path and the top of the git work tree holding it (None: outside
    one), found once for `repository_root`, `snapshot_dir` and `git_info`."""

    __slots__ = ("path", "top")

    def __init__(self, path: str, top: str | None) -> None:
        self.path = path
        self.top = top


def locate(folder: str | os.PathLike[str] | None = None) -> Folder:
    """FOLDER's real path (default: the current folder's, which `os.getcwd` gives free of
    symlinks already) and git top; MonkeyError when it is not an existing folder."""
    if folder is None:
        path = os.getcwd()
    else:
        path = _existing(folder, "workdir", "pass an existing folder with --workdir")
        if not os.path.isdir(path):
            raise MonkeyError(
                f"workdir {folder} is not a folder; pass an existing folder with --workdir"
            )
    return Folder(path, _git_top(path))


def repository_root(folder: Folder) -> tuple[Folder, str]:
    """(the top of the git work tree holding FOLDER, FOLDER's POSIX path relative to it);
    (FOLDER, "") outside a repository or at its top."""
    top = None if "GIT_DIR" in os.environ or "GIT_WORK_TREE" in os.environ else folder.top
    if top is None or top == folder.path:
        return folder, ""
    return Folder(top, top), os.path.relpath(folder.path, top).replace(os.sep, "/")


class GitQuery:
    """Git provenance of a job's folder, asked when created: its git processes (two, three
    when GIT_DIR/GIT_WORK_TREE are set, none outside a repository) run while the caller
    walks and stores the code, and ``result`` reads their answers. ``cancel`` stops them
    (a submission that fails leaves no git process behind); it is a no-op after ``result``.
    Never raises on git problems."""

    def __init__(self, workdir: Path | Folder, exclude: Sequence[str] = ()) -> None:
        if isinstance(workdir, Folder):
            wd, top = workdir.path, workdir.top
        else:
            wd = os.path.realpath(workdir)
            top = _git_top(wd)
        custom = "GIT_DIR" in os.environ or "GIT_WORK_TREE" in os.environ
        if custom:
            top = None
        self.top = top
        self._procs: list[Any] | None = None
        self._deadline = time.monotonic() + _GIT_TIMEOUT
        if top is None and not custom:
            return
        env = dict(os.environ, GIT_OPTIONAL_LOCKS="0", GIT_TERMINAL_PROMPT="0", LC_ALL="C")
        base = ["git", "-C", wd]
        commands = [
            [
                *base,
                "status",
                "--porcelain=v2",
                "--branch",
                "-z",
                "--untracked-files=normal",
                "--no-renames",
            ],
            [
                *base,
                "diff",
                "HEAD",
                "--binary",
                "--no-color",
                "--no-ext-diff",
                "--no-textconv",
                "--src-prefix=a/",
                "--dst-prefix=b/",
            ],
        ]
        # Paths outside the work tree make git fail: then there is no diff, never a leak.
        left_out = [
            p for p in exclude if top is None or (p + "/").startswith(top.rstrip("/") + "/")
        ]
        if left_out:
            commands[1] += ["--", *(f":(exclude,literal){p}" for p in left_out)]
        if top is None:
            commands.append([*base, "rev-parse", "--show-toplevel"])
        self._procs = _start_all(commands, env)

    def cancel(self) -> None:
        """Stop the git processes still running (after a failed submission)."""
        procs, self._procs = self._procs, None
        for proc in procs or ():
            if proc.poll() is None:
                proc.kill()
            proc.communicate()

    def result(self, blobs: BlobStore) -> tuple[dict[str, Any], list[tuple[str, int]]]:
        """The provenance, and the blobs newly stored for it.

        Inside a work tree: ``{"commit", "branch", "dirty", "diff", "root", "untracked"}``
        where ``dirty`` means tracked files differ from HEAD, ``diff`` is the digest of a
        blob holding ``git diff HEAD --binary`` (None when clean or without commits; the
        absolute paths ``exclude`` are left out of it, e.g. a job.yml holding secrets) and
        ``untracked`` lists up to 100 untracked, non-ignored paths (relative to ``root``;
        folders end in ``/``). ``({}, [])`` outside a repository or without git."""
        procs, self._procs = self._procs, None
        if procs is None:
            return {}, []
        outputs = _collect(procs, self._deadline)
        top = self.top
        if outputs[0] is None:
            return {}, []
        if top is None:
            if outputs[2] is None:
                return {}, []
            top = os.fsdecode(outputs[2].strip())
        return _parse(outputs[0], outputs[1], top, blobs)


def _parse(
    status: bytes, diff: bytes | None, top: str, blobs: BlobStore
) -> tuple[dict[str, Any], list[tuple[str, int]]]:
    info: dict[str, Any] = {
        "commit": None,
        "branch": None,
        "dirty": False,
        "diff": None,
        "root": top,
        "untracked": [],
    }
    fields = status.split(b"\0")
    i = 0
    while i < len(fields):
        field = fields[i]
        i += 1
        if field.startswith(b"# branch.oid "):
            oid = field[13:].decode(errors="replace")
            info["commit"] = None if oid == "(initial)" else oid
        elif field.startswith(b"# branch.head "):
            head = os.fsdecode(field[14:])
            info["branch"] = None if head == "(detached)" else head
        elif field[:2] == b"? ":
            if len(info["untracked"]) < _MAX_UNTRACKED:
                info["untracked"].append(os.fsdecode(field[2:]))
        elif field[:2] in (b"1 ", b"u "):
            info["dirty"] = True
        elif field[:2] == b"2 ":
            info["dirty"] = True
            i += 1  # a rename record is followed by its original path
    new: list[tuple[str, int]] = []
    if info["commit"] and diff:
        try:
            digest, fresh = blobs.put_bytes(diff)
        except OSError:
            digest, fresh = None, False
        info["diff"] = digest
        if fresh and digest is not None:
            new.append((digest, len(diff)))
    return info, new


def _start_all(commands: list[list[str]], env: dict[str, str]) -> list[Any] | None:
    """Start COMMANDS at once; None when git is not installed."""
    import subprocess  # (only here: a folder outside git costs a command nothing)

    procs: list[subprocess.Popen[bytes]] = []
    try:
        for cmd in commands:
            procs.append(
                subprocess.Popen(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    env=env,
                )
            )
    except OSError:  # git is not installed
        for proc in procs:
            proc.kill()
            proc.wait()
        return None
    return procs


def _collect(procs: list[Any], deadline: float) -> list[bytes | None]:
    """Each process's stdout, or None where it failed or outlived DEADLINE."""
    import subprocess

    outputs: list[bytes | None] = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            out = None
        outputs.append(out if proc.returncode == 0 else None)
    return outputs
