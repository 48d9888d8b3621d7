"""The spawn path of the agent: a ``start`` checked, its run dir materialised (code, data,
datasets, the launcher's file), held until a slot frees, then the job spawned in its own
session under the wrapper shell that claims the run dir. Standard library only (see
agent.py)."""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import json
import os
import re
import selectors
import shutil
import signal
import stat
import sys
import tempfile
import time

from monkey.client_agent import engines, sandbox
from monkey.client_agent import image as image_runner
from monkey.client_agent.blobs import (
    _blob_check_file,
    blob_intact,
    check_digest,
    check_entries,
    clone_file,
    dataset_intact,
    fetch_blobs,
    remove_tree,
    tree_stamp,
)
from monkey.client_agent.common import (
    _COMPACT,
    HERE,
    RequestError,
    encode,
    log,
    make_dir,
    one_line,
    safe_relpath,
    write_atomic,
)
from monkey.client_agent.procs import boottime, free_bytes
from monkey.client_agent.rundir import (
    ABANDONED,
    ABANDONED_CLAIM,
    EVENTS,
    FOLDER_NAME,
    LAUNCH,
    OLD_PID,
    STARTED,
    STDERR,
    STDOUT,
    WORK,
    read_claim,
    record_code,
)
from monkey.client_agent.state import AgentState, Conn, Job, Pending

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# The job runs as `/bin/sh -c WRAPPER monkey-job CWD ARGV...`. It enters CWD; then the shell
# claims the run dir: it creates STARTED with O_EXCL (`set -C`) and writes its pid there, so
# that a job is known to have started even when the agent dies between the spawn and its own
# records. A sync that finds no claim makes one itself saying "abandoned" (the same O_EXCL
# create): exactly one of the two wins, and a wrapper that loses runs nothing (exit 125).
# It then joins the job's cgroup when it has one, so that every descendant, even one that
# left the session, is found at the end. `trap :` keeps the shell alive while the job
# handles TERM/INT/HUP (trapped signals are reset to default in the job). Once the job is
# over the shell ignores them, so that a signal sent to the session at that moment cannot
# stop it recording the exit code (ignoring is inherited); the code is appended to the
# claim, a line "exit CODE" (a file more per job would cost more than the append). Only
# shell built-ins run around the job: an extra process per job would double the cost of
# short jobs. The agent reads the code only once the shell has exited, so it is complete then.
# A command that cannot be run (not found: 127; a path not executable: 126) adds a line
# "spawn" before the exit line: it never started, and the core does not retry it.
WRAPPER = (
    'cd -P -- "$1" 2>/dev/null || { echo "monkey: cannot enter the job\'s folder $1" >&2; exit 126; }; shift; '
    'set -C; { echo "$$" > "$MONKEY_STARTED_FILE"; } 2>/dev/null || exit 125; set +C; '
    'if [ -n "$MONKEY_CGROUP" ]; then { echo 0 > "$MONKEY_CGROUP/cgroup.procs"; } 2>/dev/null; fi; '
    "trap : TERM INT HUP; "
    'if ! command -v "$1" >/dev/null 2>&1; then rc=127; '
    'echo "monkey: command not found: $1 (not on the job\'s PATH, or not executable)" >&2; '
    'echo spawn >> "$MONKEY_STARTED_FILE"; '
    'elif [ "${1#*/}" != "$1" ] && { [ -d "$1" ] || [ ! -x "$1" ]; }; then rc=126; '
    'echo "monkey: not executable: $1 (a folder, or a file without its x bit: chmod +x it)" >&2; '
    'echo spawn >> "$MONKEY_STARTED_FILE"; '
    'else "$@"; rc=$?; fi; '
    'trap "" TERM INT HUP; echo "exit $rc" >> "$MONKEY_STARTED_FILE"; exit "$rc"'
)
# How a wrapper's /proc/PID/cmdline starts (``_spawn``'s argv up to the job's folder).
WRAPPER_CMDLINE = b"\0".join([b"/bin/sh", b"-c", WRAPPER.encode(), b"monkey-job", b""])
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
IMAGE_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
IMAGE_NAME = re.compile(r"[A-Za-z0-9.:\[\]-]+(?:/[a-z0-9._-]+)+")
JOB_UMASK = 0o022  # the umask jobs run with (set by main: the one the agent was started with)


def install_job_code(root: str, digest: str) -> str:
    """ROOT/jobcode/DIGEST/, made once per agent version from this agent's files: what the
    agent hands its jobs, so that nothing a job runs lives where monkey is installed (a
    reinstall elsewhere removes that folder while jobs and agents run). It holds
    ``launcher.py`` (with ``image.py``, ``pull.py``, ``layers.py`` and ``engines.py``) and ``python/``, the folder first on every job's PYTHONPATH, with
    ``monkey/__init__.py`` (shim.py) and ``monkey_track.py`` (track.py): ``import monkey``
    gives a job the in-job API on any worker (see shim.py)."""
    final = os.path.join(root, "jobcode", digest)
    if os.path.isfile(os.path.join(final, "launcher.py")):
        return final
    tmp = f"{final}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    for folder in (os.path.dirname(final), tmp, f"{tmp}/python", f"{tmp}/python/monkey"):
        make_dir(folder)  # 0700
    for src, dest in (
        ("shim.py", "python/monkey/__init__.py"),
        ("track.py", "python/monkey_track.py"),
        ("launcher.py", "launcher.py"),
        ("image.py", "image.py"),  # the launcher's, for jobs in images
        ("pull.py", "pull.py"),  # image.py's, for their pulls
        ("layers.py", "layers.py"),  # pull.py's, to unpack each layer
        ("engines.py", "engines.py"),  # the launcher's, for jobs in Docker, Podman, Apptainer
    ):
        shutil.copyfile(os.path.join(HERE, src), os.path.join(tmp, dest))
    try:
        os.rename(tmp, final)
    except OSError:  # another agent of this version made it meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def job_env(run_dir: str, cgroup: str) -> dict[str, str]:
    """The variables WRAPPER reads, for a job run in RUN_DIR (in CGROUP when not "")."""
    return {"MONKEY_STARTED_FILE": os.path.join(run_dir, STARTED), "MONKEY_CGROUP": cgroup}


def _not_spawned(run_dir: str, what: str, e: OSError) -> RequestError:
    """The refusal of a start in RUN_DIR that failed (WHAT: how) with E. Out of space, its
    copy of the code goes (nothing half-copied stays) and the refusal says "disk full at
    RUN_DIR (N bytes free)": a core waits for room then, and fails no job for it."""
    if e.errno not in (errno.ENOSPC, errno.EDQUOT):
        return RequestError(f"{what}: {e}")
    remove_tree(os.path.join(run_dir, WORK))
    return RequestError(f"disk full at {run_dir} ({free_bytes(run_dir)} bytes free)")


class Spawning(AgentState):
    """The ``start`` op of the ``Agent`` and everything until its job runs."""

    def op_start(self, req: dict[str, Any], conn: Conn | None = None) -> dict[str, Any] | None:
        """Prepare the attempt and spawn it; None when it is held for a slot (its reply
        goes to CONN once it spawns or is withdrawn)."""
        self._keep_reserve()  # given up when a disk filled: set aside again once there is room
        juid, attempt, run_dir = req["juid"], req["attempt"], req["run_dir"]
        argv, env = req["argv"], req.get("env") or {}
        if not isinstance(juid, str) or not isinstance(attempt, int):
            raise RequestError("juid must be a string and attempt an integer")
        if not isinstance(run_dir, str) or not os.path.isabs(run_dir):
            raise RequestError(f"run_dir must be an absolute path: {run_dir!r}")
        if not argv or not all(isinstance(a, str) for a in argv):
            raise RequestError("argv must be a non-empty list of strings")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise RequestError("env must map strings to strings")
        if (juid, attempt) in self.jobs or (juid, attempt) in self.held:
            raise RequestError(f"{juid}/{attempt} is already running")
        slots, cpus = req.get("slots"), req.get("cpus", 1)
        if not all(isinstance(n, int) and n >= 1 for n in (cpus, 1 if slots is None else slots)):
            raise RequestError("slots and cpus must be positive integers")
        if self.notice is not None:
            raise RequestError(f"this instance is being preempted ({self.notice['detail']})")
        monitor = self._isolation(req.get("isolation"), req.get("provider"))
        image = self._check_image(req.get("image"), juid, attempt)
        if image is not None:  # the image's own sandbox (or container) holds what the job sees
            monitor = image["bwrap"]
        self._watch(req.get("watch"))
        self.orphan.arm(req.get("orphan"))
        blobs_dir = req.get("blobs_dir") or ""
        fetch_blobs(req.get("blob_urls"), req.get("blob_packs"), blobs_dir)
        files = self._blob_paths(self._code_entries(req), blobs_dir)
        datasets = [self._check_dataset(d, blobs_dir) for d in req.get("datasets") or []]
        placed = [self._check_placed(p, blobs_dir) for p in req.get("placed") or []]
        work = os.path.join(run_dir, WORK)
        if req.get("workdir_name"):
            name = safe_relpath(req["workdir_name"])
            if "/" in name:
                raise RequestError(f"workdir_name must be one path component: {name!r}")
            work = os.path.join(work, name)
        # cwd: the folder of the code the job starts in (a run from a repository's sub-folder)
        cwd = os.path.join(work, safe_relpath(req["cwd"])) if req.get("cwd") else work
        given = env  # the start's own variables (with the path, all an image's job gets)
        env = {**self.environ, **env}
        path = env.get("PYTHONPATH")
        env["PYTHONPATH"] = f"{self.job_path}{os.pathsep}{path}" if path else self.job_path
        try:
            if not make_dir(run_dir):  # one made here is new: none of its marks can be there
                self._check_unused(run_dir)
            make_dir(cwd)
            for name, ds_files, digest, single in datasets:
                env[name] = self._materialise_dataset(digest, ds_files, single)
            for rel, blob, mode in files:
                self._copy_blob(blob, work, rel, mode)
            for rel, ds_files, digest, mount in placed:
                self._place(work, rel, ds_files, digest, mount)
            code = [rel for rel, _blob, _mode in files]
            for rel, ds_files, _digest, mount in placed:
                code += [rel] if mount else [f"{rel}/{frel}" for frel, _blob, _mode in ds_files]
            record_code(run_dir, work, code)
            envs = self._envs(monitor, req.get("owner"))
            folders = self._folders(req, run_dir, env, datasets, placed, envs)
            boxed: list[str] = []  # the job's argv in its image, when no launcher is needed
            if image is not None:
                path = given.get("PYTHONPATH")
                image.update(
                    cwd=cwd,
                    writable=folders[0],
                    readable=folders[1],
                    # and its Slurm allocation's (SLURM_JOB_ID...)
                    env=[*given, *(k for k in self.environ if k.startswith("SLURM_"))],
                    path=f"{self.job_path}{os.pathsep}{path}" if path else self.job_path,
                )
                boxed = self._image_now(req, run_dir, argv, env, image)
                if not boxed:
                    self._pull_auth(run_dir, req.get("image_auth"))
            if boxed:  # the image on this worker already, nothing to prepare: no launcher
                argv = boxed
            else:
                argv = self._launcher(req, run_dir, work, argv, envs, image)
            if monitor and image is None:
                argv = self._sandboxed(monitor, cwd, argv, env, folders)
        except OSError as e:
            raise _not_spawned(run_dir, f"materialising {run_dir} failed", e) from None
        results = self._results(req.get("results"), juid, attempt, run_dir, work)
        if results is not None:
            self._keep_results(run_dir, req["results"], work)
        limit = req.get("time_limit")
        pending = Pending(
            juid,
            attempt,
            run_dir,
            cwd,
            argv,
            env,
            None if limit is None else [float(limit), 0.0, float(req.get("grace", 10))],
            results,
            cpus if slots is None else min(cpus, slots),
            conn,
            req.get("id"),
        )
        pending.monitor = monitor
        pending.image = image is not None
        if image is not None and image["engine"] in ("docker", "podman"):
            pending.container = [image["engine_path"], "rm", "-f", engines.name(image)]
        if slots is not None:
            self.slots = slots
            if self.held or not self._fits(pending, slots):
                self.held[pending.key] = pending
                return None
        return {"pid": self._launch(pending).pid}

    @staticmethod
    def _isolation(mode: Any, provider: Any) -> str:
        """The bwrap to run the job under ("": none) for a start's ISOLATION: "sandbox" (a
        sandbox or a refusal saying why none can be made), "auto" (one when it can be
        made), "none" or absent (none)."""
        if mode in (None, "none"):
            return ""
        if mode not in ("auto", "sandbox"):
            raise RequestError(f"isolation must be auto, sandbox or none, not {mode!r}")
        path, why = sandbox.bwrap()
        if not path and mode == "sandbox":
            where = f"on provider {provider!r}" if isinstance(provider, str) else "here"
            raise RequestError(
                f"jobs {where} must run in a sandbox and cannot: {why}; install bubblewrap "
                "(apt-get install bubblewrap), or set `isolation: none` on that provider "
                "(every job then runs with the server's authority)"
            )
        return path

    def _check_image(self, image: Any, juid: str, attempt: int) -> dict[str, Any] | None:
        """The start's IMAGE checked, with where this worker keeps images and the engine
        that runs them (bubblewrap's path for monkey's own runner); None when the job has
        no image."""
        if image is None:
            return None
        if not isinstance(image, dict) or not all(
            isinstance(image.get(k), str) for k in ("ref", "name", "digest")
        ):
            raise RequestError("image must be an object with ref, name and digest")
        if not IMAGE_DIGEST.fullmatch(image["digest"]) or not IMAGE_NAME.fullmatch(image["name"]):
            raise RequestError(f"bad image name or digest: {image['name']}@{image['digest']}")
        engine, why = sandbox.choose_engine(str(image.get("engine") or "auto"))
        if not engine:
            raise RequestError(f"jobs in images cannot run on this worker: {why}")
        return {
            "ref": image["ref"],
            "name": image["name"],
            "digest": image["digest"],
            "store": os.path.join(self.root, "images"),
            "bwrap": sandbox.bwrap()[0] if engine == "bwrap" else "",
            "engine": engine,
            "engine_path": "" if engine == "bwrap" else engines.cli(engine),
            "juid": juid,
            "attempt": attempt,
        }

    @staticmethod
    def _image_now(
        req: dict[str, Any], run_dir: str, argv: list[str], env: dict[str, str], image: dict
    ) -> list[str]:
        """The argv that runs ARGV in IMAGE straight away, when this worker has the image
        unpacked, the image has ARGV's program and the job has no set-up or persisted folders
        for launcher.py to handle; else [] (the launcher pulls, prepares, runs)."""
        if req.get("setup") or req.get("persist") or image["engine"] != "bwrap":
            return []
        bundle = image_runner.ready(image)
        if not bundle:
            return []
        boxed, why, _code = image_runner.command(image, bundle, argv, env)
        if why:
            return []  # the launcher says why, and marks it never started
        image_runner.reused(image, bundle, run_dir)
        return boxed

    @staticmethod
    def _pull_auth(run_dir: str, auth: Any) -> None:
        """The pull's login and CA, for the launcher alone (it deletes the file once read)."""
        if auth is None:
            return
        if not isinstance(auth, dict):
            raise RequestError("image_auth must be an object")
        fd = os.open(
            os.path.join(run_dir, "pull-auth.json"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600
        )
        with os.fdopen(fd, "w") as f:
            json.dump(auth, f)

    def _folders(
        self,
        req: dict[str, Any],
        run_dir: str,
        env: dict[str, str],
        datasets: list[tuple[str, list, str, bool]],
        placed: list[tuple[str, list, str, bool]],
        envs: str,
    ) -> tuple[list[str], list[str]]:
        """The job's own folders (writable, readable) a sandbox or an image binds."""
        writable = [run_dir]
        job_dir = os.path.dirname(os.path.normpath(run_dir))  # the folder of all its attempts
        for folder in (env.get("MONKEY_CHECKPOINT_DIR"), req.get("persist_dir")):
            # only the job's own, beside its attempts: a path given otherwise is not bound
            if folder and os.path.dirname(os.path.normpath(folder)) == job_dir:
                os.makedirs(folder, 0o700, exist_ok=True)
                writable.append(folder)
        if req.get("setup"):  # the launcher builds or reuses the job's environment there
            os.makedirs(envs, 0o700, exist_ok=True)
            writable.append(envs)
        readable = [os.path.dirname(self.job_path)]  # launcher.py and the in-job monkey
        shared = os.path.join(self.root, "datasets")
        readable += [os.path.join(shared, digest) for _n, _f, digest, _s in datasets]
        readable += [os.path.join(shared, digest) for _r, _f, digest, mount in placed if mount]
        return writable, readable

    def _sandboxed(
        self,
        monitor: str,
        cwd: str,
        argv: list[str],
        env: dict[str, str],
        folders: tuple[list[str], list[str]],
    ) -> list[str]:
        """ARGV run in a sandbox that holds the job's own FOLDERS (see sandbox.py)."""
        home, software = sandbox.home_software(self.environ, os.path.dirname(os.path.dirname(HERE)))
        hidden = [self.root, home] if home else [self.root]
        return sandbox.argv(monitor, hidden, cwd, argv, folders[0], folders[1] + software, env)

    @staticmethod
    def _check_unused(run_dir: str) -> None:
        """Refuse a run dir with events (or an earlier agent's pid record), a claim or an
        abandoned mark."""
        if any(os.path.exists(os.path.join(run_dir, name)) for name in (EVENTS, OLD_PID)):
            raise RequestError(f"{run_dir} was already started; use sync")
        claim = read_claim(run_dir)
        if claim == ABANDONED_CLAIM or os.path.exists(os.path.join(run_dir, ABANDONED)):
            raise RequestError(f"{run_dir} was reported never started; start a new attempt")
        if claim is not None:
            raise RequestError(f"{run_dir} was already started; use sync")

    def _fits(self, pending: Pending, slots: int) -> bool:
        """Whether PENDING fits in SLOTS beside the live jobs."""
        return sum(job.cpus for job in self.jobs.values()) + pending.cpus <= slots

    def _launch(self, p: Pending) -> Job:
        """Spawn a prepared start in its cgroup, with its time limit counted from now."""
        cgroup = self.cgroups.make()
        p.env.update(job_env(p.run_dir, cgroup))
        if p.limit is not None:
            p.limit[1] = boottime() + p.limit[0]
        job = self._spawn(
            p.juid, p.attempt, p.run_dir, p.cwd, p.argv, p.env, p.limit, p.cpus, p.monitor
        )
        job.cgroup = cgroup
        job.pulling = p.image
        job.container = p.container
        if p.results is not None:
            self.results[job.key] = p.results
        return job

    def _start_held(self) -> None:
        """Spawn the held starts that fit now, first in first out."""
        while self.held and self._fits(p := next(iter(self.held.values())), self.slots):
            del self.held[p.key]
            try:
                reply: dict[str, Any] = {"id": p.rid, "ok": True, "pid": self._launch(p).pid}
            except RequestError as e:
                reply = {"id": p.rid, "ok": False, "error": one_line(e)}
            self._reply(p, reply)

    def _withdraw(self, p: Pending, why: str) -> None:
        """Give up a held start: its run dir is claimed abandoned (it can never run), and its
        client told, so that the attempt is started again later."""
        del self.held[p.key]
        try:
            self._claimed(p.run_dir)
        except OSError as e:
            log(f"{p.juid}/{p.attempt}: cannot mark its run dir abandoned: {e}")
        self._reclaim(p.run_dir)
        self._reply(
            p,
            {
                "id": p.rid,
                "ok": False,
                "withdrawn": True,
                "error": f"withdrawn before it started: {why}",
            },
        )

    def _reply(self, p: Pending, reply: dict[str, Any]) -> None:
        if p.conn is not None and p.conn in self.conns:
            self._send(p.conn, encode(reply))

    def _check_files(self, files: Any, blobs_dir: str) -> list[tuple[str, str, int]]:
        """[(relpath, blob path, mode)] after checking paths, digests and blobs."""
        return self._blob_paths(check_entries(files), blobs_dir)

    @staticmethod
    def _blob_paths(entries: list[list[Any]], blobs_dir: str) -> list[tuple[str, str, int]]:
        """[(relpath, blob path, mode)] of checked ENTRIES whose blobs are all present and
        intact; a damaged one is removed (the core sends it again) and refused."""
        out = []
        for rel, digest, mode in entries:
            blob = os.path.join(blobs_dir, digest[:2], digest[2:])
            if not blobs_dir or not os.path.isfile(blob):
                raise RequestError(f"missing blob {digest} for {rel} in {blobs_dir!r}")
            if blob_intact(blob) is False:
                for path in (blob, _blob_check_file(blob)):
                    with contextlib.suppress(OSError):
                        os.unlink(path)
                raise RequestError(
                    f"damaged blob {digest} for {rel} in {blobs_dir!r}: removed, to be sent again"
                )
            out.append((rel, blob, mode))
        return out

    def _code_entries(self, req: dict[str, Any]) -> list[list[Any]]:
        """The checked code list of a start: ``files``, or the cached list ``manifest``, or
        the cached list ``base`` with ``removed`` and ``changes`` applied; a list given in
        full or built from a delta is cached under ``manifest``."""
        digest = req.get("manifest")
        if digest is None:
            return check_entries(req.get("files") or [])
        path = self._manifest_path(check_digest(digest))
        if "files" in req:
            entries = check_entries(req["files"])
        elif req.get("base") is None:
            return check_entries(self._cached_manifest(path, digest))
        else:
            removed, changes = req.get("removed") or [], check_entries(req.get("changes") or [])
            if not isinstance(removed, list):
                raise RequestError("removed must be a list")
            base = check_digest(req["base"])
            cached = self._cached_manifest(self._manifest_path(base), base)
            merged = {e[0]: e for e in check_entries(cached)}
            for rel in removed:
                merged.pop(safe_relpath(rel), None)
            merged.update((e[0], e) for e in changes)
            entries = list(merged.values())
        if not os.path.exists(path):
            entries.sort(key=lambda e: e[0])
            try:
                os.makedirs(os.path.dirname(path), 0o700, exist_ok=True)
                write_atomic(path, _COMPACT.encode(entries).encode())
            except OSError as e:  # the job can still run; a later start gets `unknown manifest`
                log(f"cannot cache manifest {digest}: {e}")
        return entries

    def _manifest_path(self, digest: str) -> str:
        return os.path.join(self.root, "manifests", f"{digest}.json")

    @staticmethod
    def _cached_manifest(path: str, digest: str) -> Any:
        """The list cached at PATH, or RequestError ``unknown manifest`` (also when torn)."""
        try:
            with open(path, "rb") as f:
                return json.loads(f.read())
        except (OSError, ValueError):
            raise RequestError(f"unknown manifest {digest}: send the full file list") from None

    def _check_dataset(self, ds: Any, blobs_dir: str) -> tuple[str, list, str, bool]:
        """(env name, files, digest, single) of a dataset entry after checking it."""
        if not isinstance(ds, dict):
            raise RequestError(f"bad dataset entry {ds!r}")
        digest = check_digest(ds.get("digest"))
        name = ds.get("env")
        if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
            raise RequestError(f"bad dataset env name {name!r}")
        files = self._check_files(ds.get("files") or [], blobs_dir)
        single = bool(ds.get("single"))
        if single and len(files) != 1:
            raise RequestError(f"dataset {digest} is single but has {len(files)} files")
        return name, files, digest, single

    def _check_placed(self, entry: Any, blobs_dir: str) -> tuple[str, list, str, bool]:
        """(relpath, files, digest, mount) of a data folder entry after checking it."""
        if not isinstance(entry, dict):
            raise RequestError(f"bad placed entry {entry!r}")
        files = self._check_files(entry.get("files") or [], blobs_dir)
        return (
            safe_relpath(entry.get("path")),
            files,
            check_digest(entry.get("digest")),
            bool(entry.get("mount")),
        )

    def _place(self, work: str, rel: str, files: list, digest: str, mount: bool) -> None:
        """A data folder at work/REL: a copy, or a link to the worker's shared copy."""
        if mount:
            target = os.path.join(work, rel)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            if os.path.lexists(target):
                raise OSError(f"{rel} is both in the code and a data folder")
            os.symlink(self._materialise_dataset(digest, files, False), target)
            return
        for frel, blob, mode in files:
            self._copy_blob(blob, os.path.join(work, rel), frel, mode)

    def _envs(self, monitor: str, owner: Any) -> str:
        """The folder of the environments a job's set-up builds or reuses: ROOT/envs, or in a
        sandbox (MONITOR) one per OWNER, ROOT/envs/owner-DIGEST, so that no user's job can
        change an environment another user's job then runs in."""
        if not monitor:
            return os.path.join(self.root, "envs")
        tag = hashlib.sha256(str(owner).encode()).hexdigest()[:16]
        return os.path.join(self.root, "envs", f"owner-{tag}")

    def _launcher(
        self,
        req: dict[str, Any],
        run_dir: str,
        work: str,
        argv: list[str],
        envs: str,
        image: dict[str, Any] | None,
    ) -> list[str]:
        """ARGV, or ARGV behind launcher.py when the job has a set-up, persisted folders or
        an image."""
        setup, persist = req.get("setup"), req.get("persist") or []
        if not setup and not persist and image is None:
            return argv
        if setup is not None and not isinstance(setup, dict):
            raise RequestError("setup must be an object")
        for item in persist:
            if not isinstance(item, dict) or not FOLDER_NAME.fullmatch(str(item.get("name"))):
                raise RequestError(f"bad persist entry {item!r}")
            item["path"] = safe_relpath(item.get("path"))
        for key in ("env_file", "install_script"):
            if setup and setup.get(key) is not None:
                setup[key] = safe_relpath(setup[key])
        persist_dir = req.get("persist_dir") or os.path.join(run_dir, "persist")
        if not os.path.isabs(persist_dir):
            raise RequestError(f"persist_dir must be an absolute path: {persist_dir!r}")
        launch = {
            "run_dir": run_dir,
            "work": work,
            "envs": envs,
            "setup": setup,
            "persist": persist,
            "persist_dir": persist_dir,
            "package": os.path.dirname(HERE),
            **({"image": image} if image is not None else {}),
        }
        path = os.path.join(run_dir, LAUNCH)
        write_atomic(path, json.dumps(launch).encode())
        return [
            sys.executable,
            "-I",
            self.launcher,
            path,
            "--",
            *argv,
        ]  # -I: no project module shadows

    @staticmethod
    def _copy_blob(blob: str, base: str, rel: str, mode: int) -> None:
        """Copy BLOB to BASE/REL (a reflink or a copy, so the job cannot corrupt the store); with a
        symlink's MODE (S_IFLNK), make BASE/REL a link to the target that BLOB holds."""
        target = os.path.join(base, rel)
        parent = os.path.dirname(target)
        os.makedirs(parent, exist_ok=True)
        real_base = os.path.realpath(base)
        if os.path.commonpath([os.path.realpath(parent), real_base]) != real_base:
            raise OSError(f"{rel} leaves {base}")
        if os.path.islink(target):
            os.unlink(target)
        if stat.S_ISLNK(mode):  # a link out of the project: the blob holds its target
            with open(blob, "rb") as f:
                os.symlink(os.fsdecode(f.read()), target)
            return
        clone_file(blob, target)
        os.chmod(target, mode & 0o777)

    def _materialise_dataset(self, digest: str, files: list, single: bool) -> str:
        """ROOT/datasets/DIGEST built once (or its single file) for the job's env.

        The copy is shared by every job, so it is made read-only, and a stamp of each
        file's size and mtime is checked before reuse: a copy that a job changed anyway
        (root ignores modes) is rebuilt instead of being handed to the next job."""
        parent = os.path.join(self.root, "datasets")
        final = os.path.join(parent, digest)
        stamp = final + ".stamp"
        if os.path.isdir(final) and not dataset_intact(final, stamp):
            log(f"dataset {digest[:16]} was changed in place; rebuilding it")
            remove_tree(final)
        if not os.path.isdir(final):
            os.makedirs(parent, 0o700, exist_ok=True)
            tmp = tempfile.mkdtemp(prefix=f".tmp-{digest[:16]}-", dir=parent)
            try:
                os.chmod(tmp, 0o755)
                for rel, blob, mode in files:
                    self._copy_blob(blob, tmp, rel, mode & 0o555)
                write_atomic(stamp, json.dumps(tree_stamp(tmp)).encode())
                for folder, _dirs, _files in os.walk(tmp, topdown=False):
                    os.chmod(folder, 0o555)
                os.rename(tmp, final)
            except OSError:
                remove_tree(tmp)
                if not os.path.isdir(final):
                    raise
        return os.path.join(final, files[0][0]) if single else final

    def _spawn(
        self,
        juid: str,
        attempt: int,
        run_dir: str,
        cwd: str,
        argv: list[str],
        env: dict[str, str],
        limit: list[float] | None,
        cpus: int,
        monitor: str = "",
    ) -> Job:
        """Start the wrapper in a new session and track it (posix_spawn: a vfork without
        the Python-level set-up of subprocess, which costs more than the spawn itself)."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
        prefix = os.path.join(run_dir, "")
        try:
            out = os.open(prefix + STDOUT, flags, 0o600)
        except OSError as e:
            raise _not_spawned(run_dir, "cannot open its log", e) from None
        try:
            err = os.open(prefix + STDERR, flags, 0o600)
            try:
                umask = os.umask(JOB_UMASK)  # the job's files as the user would make them
                try:
                    pid = os.posix_spawn(
                        "/bin/sh",
                        ["/bin/sh", "-c", WRAPPER, "monkey-job", cwd, *argv],
                        env,
                        setsid=True,
                        file_actions=[
                            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                            (os.POSIX_SPAWN_DUP2, out, 1),
                            (os.POSIX_SPAWN_DUP2, err, 2),
                        ],
                    )
                finally:
                    os.umask(umask)
            finally:
                os.close(err)
        except OSError as e:
            raise _not_spawned(run_dir, "cannot spawn the job", e) from None
        finally:
            os.close(out)
        pidfd = os.pidfd_open(pid)  # our unreaped child: cannot fail for a lack of it
        try:
            gpus = env.get("CUDA_VISIBLE_DEVICES", "")
            job = Job(juid, attempt, run_dir, pid, pidfd, True, 0, boottime())
            # The started event holds what an agent that adopts the job needs. A sync reads
            # a torn one (an agent killed while writing it) as none, and rebuilds it from
            # the claim. No /proc/PID/stat is read here: read while the child execs, it
            # costs the agent more than the rest of the spawn (adoption checks PID by its
            # environment instead).
            self._append(
                job,
                "started",
                strict=True,
                pid=pid,
                gpus=gpus,
                cgroup=env.get("MONKEY_CGROUP", ""),
                limit=limit,
                cpus=cpus,
                **({"sandbox": monitor} if monitor else {}),
            )
        except OSError as e:
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            if env.get("MONKEY_CGROUP"):
                self.cgroups.release(env["MONKEY_CGROUP"])
            os.close(pidfd)
            raise _not_spawned(run_dir, "cannot record the job", e) from None
        # The started event is its first (seq 1, nothing tailed): op_start refused a run dir
        # with events or a claim.
        job.gpus = [g for g in gpus.split(",") if g]
        job.limit = limit
        job.cpus = cpus
        job.monitor = monitor
        self._track(job)
        return job

    def _track(self, job: Job) -> None:
        if not self.jobs:
            self.next_heartbeat = time.monotonic() + self.heartbeat
        self.jobs[job.key] = job
        self.sel.register(job.pidfd, selectors.EVENT_READ, functools.partial(self._on_exit, job))
