"""Disk housekeeping of MONKEY_HOME: `monkey rm` (delete jobs), `monkey gc` (blobs no job
references, run folders of deleted jobs, code copies left behind, environments and dataset
copies no job uses), `monkey du` (usage).

Consistency when interrupted (even by SIGKILL): `rm` deletes a job's rows in one
transaction, then its run folder; a folder left behind is a deleted job's and `gc` removes
it. `gc` removes a blob's row from the store before its file; a file left without a row is
unreferenced and the next `gc` removes it. A blob any existing job names (its code and the
files its file list names, datasets, job.yml data folders, git diff, packages, set-up
files: every digest written in its records) is never deleted, so `rerun` of every job that
remains keeps working. Blobs younger than the grace period are kept too.

gc and submissions: a submitter holds the blob store's lease (shared) from its first blob
written or reused until its jobs are committed; gc decides and deletes under the lease held
exclusively. So whatever the interleaving, and whichever is killed when, an accepted job
has all its blobs. A blob's partial file (``.tmp-<pid>-...``) whose writer is gone, or
older than the grace period, is removed by gc and counted by `du`.

The local worker's environments (``envs/<key>/``, built by launcher.py) and dataset copies
(``datasets/<digest>/``, built by the agent) go when no remaining job uses them: an
environment whose key no job's attempt recorded (``setup.json``) nor its spec gives, a copy
of a dataset no job names, older than the grace period; an environment whose lock a job
holds (building it) is left alone. Each is first renamed aside (``.gc-NAME``), so a gc
killed midway leaves no half-deleted folder under a name a worker would reuse; the next
gc deletes what was set aside.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from monkey.drivers import BUCKET_FILES, HOST_FOLDERS
from monkey.models import TERMINAL, MonkeyError, State
from monkey.sizes import file_size, tree_size, unlink_size

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Protocol

    from monkey.config import Home
    from monkey.models import Job
    from monkey.snapshot.blobs import BlobStore
    from monkey.store import Store

    class Facade(Protocol):
        """What these functions use of the ``Monkey`` facade (its Disk part passes it)."""

        home: Home
        store: Store

        def _blobs(self) -> BlobStore: ...

        def wake(self, queued: str | None = None) -> None: ...


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_age(text: str) -> float:
    """Seconds in an age like ``30d``, ``12h``, ``90m``, ``2w`` or ``45s``; a bare ``0``
    is no time at all (any other bare number needs its unit)."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text or "")
    if not found or (not found.group(2) and float(found.group(1)) != 0):
        raise MonkeyError(f"{text!r} is not an age; give a number and a unit, e.g. 30d, 12h, 90m")
    return float(found.group(1)) * _UNITS.get(found.group(2), 0.0)


def select_jobs(
    m: Facade,
    refs: Iterable[str],
    sweep: str | None = None,
    older_than: str | None = None,
    failed: bool = False,
) -> list[Job]:
    """The jobs named by REFS (ids, prefixes, `last`), in SWEEP, ended longer than
    OLDER_THAN ago and/or failed; the filters narrow each other."""
    refs = list(refs)
    if not (refs or sweep or older_than or failed):
        raise MonkeyError("monkey rm: name jobs, or give --sweep S, --older-than AGE or --failed")
    sid = m.store.resolve_sweep(sweep) if sweep else None
    if refs:
        found = (m.store.get_job(m.store.resolve(r)) for r in refs)
        jobs = [j for j in found if j is not None]  # None: removed since resolve
    else:
        jobs = m.store.list_jobs(sweep=sid)
    if sid and refs:
        jobs = [j for j in jobs if j.sweep == sid]
    if older_than:
        cut = time.time() - parse_age(older_than)
        jobs = [j for j in jobs if (j.finished_at or j.created_at) < cut]
    if failed:
        jobs = [j for j in jobs if j.state == State.FAILED]
    return list({j.juid: j for j in jobs}.values())


def remove_jobs(m: Facade, jobs: list[Job]) -> tuple[int, int]:
    """Delete JOBS (all ended) and their run folders and secrets; (jobs, bytes freed).
    A job not ended is refused, and nothing is deleted."""
    live = [j for j in jobs if j.state not in TERMINAL]
    if live:
        j = live[0]
        raise MonkeyError(
            f"job {j.juid} is {j.state.value}; cancel it first (`monkey job cancel "
            f"{j.juid}`) or leave it out"
        )
    waiting = m.store.dependents(j.juid for j in jobs)
    if waiting:
        job, dep = waiting[0]
        raise MonkeyError(
            f"job {job} waits for job {dep} (run --after); cancel it first (`monkey job "
            f"cancel {job}`) or leave {dep} out"
        )
    # Their folders on SSH hosts and in buckets: the core's to delete.
    m.store.owe_job_folders((j.juid for j in jobs), HOST_FOLDERS, BUCKET_FILES)
    m.store.delete_jobs(j.juid for j in jobs)
    freed = 0
    for j in jobs:
        freed += _remove(m.home.runs / j.juid)
        m.home.secrets_file(j.juid).unlink(missing_ok=True)
    return len(jobs), freed


def _remove(path: Path) -> int:
    """Delete the folder PATH; the bytes it held."""
    if not path.exists():
        return 0
    size, _ = tree_size(path)
    for folder, _dirs, _files in os.walk(path):  # read-only folders (datasets, persisted)
        try:
            os.chmod(folder, 0o700)
        except OSError:
            pass
    shutil.rmtree(path, ignore_errors=True)
    return size


@dataclass
class GcReport:
    """What `gc` freed."""

    blobs: int = 0
    blob_bytes: int = 0
    runs: int = 0
    run_bytes: int = 0
    code_bytes: int = 0
    envs: int = 0
    env_bytes: int = 0
    datasets: int = 0
    dataset_bytes: int = 0
    images: int = 0
    image_bytes: int = 0
    kept: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return (
            self.blob_bytes
            + self.run_bytes
            + self.code_bytes
            + self.env_bytes
            + self.dataset_bytes
            + self.image_bytes
        )


def gc(m: Facade, grace: float = 3600.0, image_keep: float = 7 * 86400.0) -> GcReport:
    """Remove run folders of deleted jobs, code copies of ended attempts left behind by an
    agent that died, blobs no job needs (older than GRACE seconds), and the images of this
    machine's worker no job used for IMAGE_KEEP seconds nor waits to run in."""
    from monkey.client_agent.rundir import CODE_RECORD, reclaim_code

    report = GcReport()
    jobs = {j.juid: j for j in m.store.list_jobs()}
    specs = m.store.job_specs()
    env_keys = _env_keys(specs)
    if m.home.runs.is_dir():
        for entry in sorted(os.scandir(m.home.runs), key=lambda e: e.name):
            if not entry.is_dir(follow_symlinks=False):
                continue
            job = jobs.get(entry.name)
            if job is None and m.store.get_job(entry.name) is None:  # not one created since
                report.run_bytes += _remove(Path(entry.path))
                report.runs += 1
                continue
            if job is not None and job.state in TERMINAL:
                for attempt in Path(entry.path).glob(f"*/{CODE_RECORD}"):
                    report.code_bytes += reclaim_code(str(attempt.parent))
            if entry.name in specs:
                env_keys.update(_recorded_env_keys(Path(entry.path)))
    cut = time.time() - grace
    from monkey.snapshot.blobs import BlobStore
    from monkey.snapshot.manifest import needed_blobs

    blobs = BlobStore(m.home.blobs)
    with blobs.lease(exclusive=True, waiting="gc"):  # no submission under way
        needed = needed_blobs(m.store, blobs)
        report.envs, report.env_bytes = _gc_envs(m.home.agent_root / "envs", env_keys, cut)
        report.datasets, report.dataset_bytes = _gc_datasets(
            m.home.agent_root / "datasets", needed, cut
        )
        _gc_blobs(m, needed, cut, report)
        _gc_path_caches(m)
    m.store.forget_uploads(cut)
    live = {
        image["digest"]
        for j in jobs.values()
        if j.state not in TERMINAL and (image := m.store.job_image(j.juid))
    }
    report.images, report.image_bytes = _gc_images(
        m.home.agent_root / "images", live, time.time() - image_keep
    )
    return report


def _gc_images(root: Path, live: set[str], cut: float) -> tuple[int, int]:
    """Delete the unpacked images under ROOT (the worker's, see client_agent/image.py) last
    used before CUT whose digest no job that has not ended runs in (LIVE), and what a pull
    cut short left; (how many images, bytes freed). Under the worker's pull lock: no pull
    runs meanwhile."""
    from monkey.client_agent.image import READY

    roots = root / "roots"
    if not roots.is_dir():
        return 0, 0
    count = freed = 0
    with open(root / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for entry in sorted(os.scandir(roots), key=lambda e: e.name):
            path = Path(entry.path)
            if entry.name.startswith(".gc-") or entry.name.endswith(".tmp"):
                freed += _remove(path)  # set aside by an interrupted gc; a pull killed midway
            elif f"sha256:{entry.name}" not in live and _mtime(path / READY) <= cut:
                freed += _remove(_set_aside(path))
                count += 1
        # a pull's layers fetched ahead (a pull killed midway); the layers kept by the pulls
        # of earlier versions (skopeo's layout, then their own blobs)
        for folder in ("tmp", "oci", "blobs"):
            freed += _remove(root / folder)
    return count, freed


def gc_blobs(m: Facade, grace: float) -> GcReport:
    """The blobs part of ``gc`` alone, with its rules (GRACE seconds, the lease): what a
    main node runs on its own, so uploads no job names do not wait for an admin (see
    ``monkey.server.reclaim``); nothing while a submission holds the lease (the next turn
    does it). Uploads older than GRACE stop counting for their user."""
    from monkey.snapshot.blobs import BlobStore
    from monkey.snapshot.manifest import needed_blobs

    report = GcReport()
    cut = time.time() - grace
    blobs = BlobStore(m.home.blobs)
    with blobs.lease(exclusive=True, wait=False) as free:  # a submission under way: later
        if free:
            _gc_blobs(m, needed_blobs(m.store, blobs), cut, report)
    m.store.forget_uploads(cut)
    return report


def _gc_path_caches(m: Facade) -> None:
    """Forget the stat cache rows of files and the walk memos of folders that are gone (a
    project deleted or moved): nothing else removes them. Called under the store's exclusive
    lease, so no submission writes them meanwhile."""
    files, roots = m.store.cached_paths()
    gone_files = [f for f in files if not os.path.lexists(f)]
    gone_roots = [r for r in roots if not os.path.isdir(r)]
    if gone_files or gone_roots:
        m.store.forget_paths(gone_files, gone_roots)


def _gc_blobs(m: Facade, needed: set[str], cut: float, report: GcReport) -> None:
    """Delete the blobs no job needs, stored before CUT, the partial files of writers that
    are gone, and the damaged blobs `monkey verify` set aside. Called under the store's
    exclusive lease."""
    from monkey.snapshot.blobs import DAMAGED, TMP_PREFIX

    doomed: list[tuple[str, Path, int]] = []
    root = m.home.blobs
    for entry in sorted(os.scandir(root), key=lambda e: e.name) if root.is_dir() else []:
        path = Path(entry.path)
        if entry.name == DAMAGED:
            report.blob_bytes += _remove(path)
        elif _dead_partial(path, cut):
            report.blob_bytes += unlink_size(path)
        if not entry.is_dir(follow_symlinks=False) or len(entry.name) != 2:
            continue
        for f in path.iterdir():
            if f.name.startswith(TMP_PREFIX):
                if _dead_partial(f, cut):
                    report.blob_bytes += unlink_size(f)
                continue
            digest = entry.name + f.name
            try:
                st = f.lstat()
            except OSError:
                continue
            if st.st_mtime > cut:
                continue
            if digest not in needed:
                doomed.append((digest, f, st.st_size))
    for start in range(0, len(doomed), 1000):
        batch = doomed[start : start + 1000]
        m.store.forget_blobs(d for d, _p, _s in batch)  # the row first, then the file
        for _digest, path, size in batch:
            try:
                path.unlink()
            except OSError:
                continue
            report.blobs += 1
            report.blob_bytes += size


def _dead_partial(path: Path, cut: float) -> bool:
    """Whether PATH is a blob's partial file (``.tmp-<pid>-...``) nobody writes any more:
    its writer's process is gone, or it was last written before CUT. A submitter writes
    only under the store's lease, which gc holds exclusively: one still alive is stuck."""
    from monkey.snapshot.blobs import TMP_PREFIX, writer_gone

    if not path.name.startswith(TMP_PREFIX):
        return False
    return writer_gone(path.name) or _mtime(path) <= cut


def _env_keys(specs: dict[str, dict]) -> set[str]:
    """Keys of the environments that the jobs' specs give on this machine's python (the
    local agent's): jobs yet to run included."""
    from monkey.client_agent.launcher import env_key
    from monkey.environments import setup_fields

    keys = set()
    for spec in specs.values():
        setup = setup_fields(spec)
        if setup is not None:
            keys.add(env_key(setup))
    return keys


def _recorded_env_keys(run_dir: Path) -> set[str]:
    """Keys of the environments a job's attempts ran in (their setup.json)."""
    from monkey.client_agent.rundir import SETUP_RECORD

    keys = set()
    for record in run_dir.glob(f"*/{SETUP_RECORD}"):
        try:
            keys.add(str(json.loads(record.read_bytes())["key"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return keys


def _mtime(*paths: Path) -> float:
    """The newest modification time of PATHS that exist (0 if none)."""
    times = []
    for path in paths:
        try:
            times.append(path.lstat().st_mtime)
        except OSError:
            pass
    return max(times, default=0.0)


def _set_aside(path: Path) -> Path:
    """Rename PATH to .gc-NAME beside it (atomic): from now on it is garbage, whatever happens."""
    aside = path.with_name(f".gc-{path.name}")
    os.rename(path, aside)
    return aside


def _gc_envs(root: Path, keep: set[str], cut: float) -> tuple[int, int]:
    """Delete the environments under ROOT (and its per-owner folders) whose key is not in
    KEEP, finished before CUT and not locked by a job preparing them; (how many, bytes
    freed)."""
    from monkey.client_agent.launcher import READY

    count = freed = 0
    for entry in sorted(os.scandir(root), key=lambda e: e.name) if root.is_dir() else []:
        path = Path(entry.path)
        if entry.name.startswith(".gc-"):  # set aside by a gc that was interrupted
            freed += _remove(path)
            continue
        if entry.name.startswith("owner-") and entry.is_dir(follow_symlinks=False):
            more = _gc_envs(path, keep, cut)  # one user's, for sandboxed jobs (spawn._envs)
            count, freed = count + more[0], freed + more[1]
            continue
        if not entry.is_dir(follow_symlinks=False) or entry.name in keep:
            continue
        if _mtime(path, path / READY) > cut:
            continue
        with open(root / f"{entry.name}.lock", "ab") as lock:  # the launcher's lock of this key
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a job is preparing it
            aside = _set_aside(path)
        freed += _remove(aside)
        count += 1
    return count, freed


def _gc_datasets(root: Path, needed: set[str], cut: float) -> tuple[int, int]:
    """Delete the dataset copies under ROOT that no job names (NEEDED), made before CUT, with
    their stamps, and builds left unfinished; (how many copies, bytes freed)."""
    count = freed = 0
    for entry in sorted(os.scandir(root), key=lambda e: e.name) if root.is_dir() else []:
        path, name = Path(entry.path), entry.name
        if name.startswith(".gc-"):  # set aside by a gc that was interrupted
            freed += _remove(path)
        elif name.startswith(".tmp-"):  # `.tmp-<digest[:16]>-...`: a build, maybe running
            if _mtime(path) <= cut and not any(d.startswith(name[5:21]) for d in needed):
                freed += _remove(path)
        elif name.endswith(".stamp"):
            if not (root / name[:-6]).exists() and _mtime(path) <= cut:
                path.unlink(missing_ok=True)
        elif entry.is_dir(follow_symlinks=False) and name not in needed:
            stamp = root / f"{name}.stamp"
            if _mtime(path, stamp) > cut:
                continue
            aside = _set_aside(path)
            stamp.unlink(missing_ok=True)
            freed += _remove(aside)
            count += 1
    return count, freed


def usage(m: Facade) -> dict[str, dict[str, int]]:
    """{part: {bytes, files}} of MONKEY_HOME: runs (jobs' folders), blobs (with the partial
    files of interrupted writes among them: partial_bytes, partial_files), envs (job.yml
    environments), datasets (shared copies), images (jobs' images pulled here), and the
    database."""
    home = m.home
    out: dict[str, dict[str, int]] = {}
    for name, path in (
        ("runs", home.runs),
        ("blobs", home.blobs),
        ("envs", home.agent_root / "envs"),
        ("datasets", home.agent_root / "datasets"),
        ("images", home.agent_root / "images"),
    ):
        size, count = tree_size(path)
        out[name] = {"bytes": size, "files": count}
    partial = [p for pattern in (".tmp-*", "??/.tmp-*") for p in home.blobs.glob(pattern)]
    out["blobs"]["partial_bytes"] = sum(file_size(p) for p in partial)  # counted in its bytes too
    out["blobs"]["partial_files"] = len(partial)
    db = sum(p.stat().st_size for p in home.root.glob("monkey.db*") if p.is_file())
    out["database"] = {"bytes": db, "files": 1}
    out["runs"]["jobs"] = len(m.store.job_ids())
    return out


@dataclass
class VerifyReport:
    """What `monkey verify` found: blobs checked, and each damaged or missing one with the
    (job, what it is to that job) it affects; damaged ones were set aside."""

    blobs: int = 0
    bytes: int = 0
    jobs: int = 0
    damaged: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    missing: dict[str, list[tuple[str, str]]] = field(default_factory=dict)


def _uses(m: Facade, jobs: list[Job]) -> dict[str, list[tuple[str, str]]]:
    """{digest: [(juid, what it is to the job)]} of every blob JOBS need; a file list that
    cannot be read counts itself only (it is checked, and reported, itself)."""
    from monkey.snapshot.manifest import load_manifest

    blobs = m._blobs()
    uses: dict[str, list[tuple[str, str]]] = {}
    for job in jobs:
        spec = m.store.job_spec(job.juid) or {}
        lists = [("code", job.snapshot)] if job.snapshot else []
        lists += [(f"dataset {ds['name']}", ds["digest"]) for ds in job.datasets]
        lists += [
            (f"job.yml data folder {e.get('path')}", e["digest"])
            for e in spec.get("data", [])
            if e.get("digest")
        ]
        for label, digest in lists:
            uses.setdefault(digest, []).append((job.juid, f"{label} (its file list)"))
            try:
                files = load_manifest(blobs, digest)
            except MonkeyError:
                continue
            for f in files:
                what = f.path if label == "code" else f"{label} file {f.path}"
                uses.setdefault(f.digest, []).append((job.juid, what))
        if job.git.get("diff"):
            uses.setdefault(job.git["diff"], []).append(
                (job.juid, "git diff of its uncommitted changes")
            )
    return uses


def verify(m: Facade, refs: Iterable[str] = ()) -> VerifyReport:
    """Check every blob the jobs REFS need (none: every job's, and every blob stored)
    against its digest; set damaged ones aside (``blobs/.damaged/``, so that submitting
    the job's source again stores a good copy, and gc removes them)."""
    from monkey.snapshot.blobs import DAMAGED

    refs = list(refs)
    jobs = [m.store.get_job(m.store.resolve(r)) for r in refs] if refs else m.store.list_jobs()
    chosen = [j for j in jobs if j is not None]
    uses = _uses(m, chosen)
    digests = set(uses)
    root = m.home.blobs
    if not refs and root.is_dir():  # the whole store: blobs no job names too
        digests.update(
            p.parent.name + p.name for p in root.glob("??/*") if not p.name.startswith(".")
        )
    blobs = m._blobs()
    report = VerifyReport(jobs=len(chosen))
    bad: list[str] = []
    good: list[tuple[str, int]] = []
    for digest in sorted(digests):
        ok = blobs.verify(digest)
        if ok is None:
            report.missing[digest] = uses.get(digest, [])
            continue
        size = blobs.path(digest).stat().st_size
        report.blobs += 1
        report.bytes += size
        if ok:
            good.append((digest, size))
        else:
            bad.append(digest)
    m.store.add_blobs(blobs.stamped(good))  # a core starting their jobs need not hash them again
    if refs and (bad or report.missing):  # the jobs affected: all of them, not only those named
        uses = _uses(m, m.store.list_jobs())
        report.missing = {d: uses.get(d, []) for d in report.missing}
    if bad:
        aside = root / DAMAGED
        with blobs.lease(exclusive=True, waiting="verify"):  # no submitter reuses one meanwhile
            aside.mkdir(mode=0o700, exist_ok=True)
            for digest in bad:
                if blobs.verify(digest) is False:  # not replaced by a good copy meanwhile
                    os.replace(blobs.path(digest), aside / digest)
                    report.damaged[digest] = uses.get(digest, [])
            m.store.forget_blobs(report.damaged)
    return report
