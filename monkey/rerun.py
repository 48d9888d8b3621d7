"""Any run, again: rerun a job (or a sweep's cells) from its record alone, clone its code.

A rerun copies the record of a job — code snapshot, datasets and job.yml by digest, env
(secret values stay in their 0600 file, which the new job refers to), git provenance,
Python, packages — into a new job, with parameters rewritten in its command (``--set``)
and, optionally, another provider or other resources. Nothing is hashed or copied: the
blobs are in the store already and the core materialises them by digest. The new job
records ``rerun_of`` and what changed (table ``job_reruns``).

Parameters are found where they were given: ``--lr 0.1``, ``--lr=0.1``, ``lr=0.1`` in the
command, and the cells of a sweep (whose command template is rendered again). ``-`` and
``_`` are the same in names (``--batch-size`` is ``batch_size``).
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from monkey.models import TERMINAL, MonkeyError, State
from monkey.models import Job as JobRecord
from monkey.params import command_params, norm, scalar
from monkey.submit import check_priority

TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess
    from typing import Any

    from monkey.config import Home
    from monkey.snapshot.blobs import BlobStore
    from monkey.snapshot.manifest import FileEntry
    from monkey.store import Store
    from monkey.submit import Submitter

FAILED_CELLS = (State.FAILED, State.LOST)  # what `rerun --sweep S --failed` picks


# -- parameters -------------------------------------------------------------------------


def parse_sets(items: Mapping[str, Any] | Iterable[str] | None) -> dict[str, str]:
    """``["lr=0.2", ...]`` (or a mapping) as name -> value text."""
    if items is None:
        return {}
    if isinstance(items, Mapping):
        return {str(k): str(v) for k, v in items.items()}
    out: dict[str, str] = {}
    for item in [items] if isinstance(items, str) else items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise MonkeyError(f"--set {item!r} is not PARAM=VALUE; write e.g. --set lr=0.2")
        out[name.strip()] = value
    return out


def rerun_name(name: str) -> str:
    """A rerun's default name: it says it is one (``sw-3`` -> ``sw-3-rerun``, then
    ``sw-3-rerun2``...)."""
    found = re.fullmatch(r"(.*)-rerun(\d*)", name)
    if found is None:
        return f"{name}-rerun"
    return f"{found.group(1)}-rerun{int(found.group(2) or 1) + 1}"


def apply_sets(
    job: JobRecord, sets: Mapping[str, str], template: list[str] | None
) -> tuple[list[str], dict[str, Any], dict[str, list[Any]]]:
    """JOB's (argv, params) with SETS applied, and name -> [old, new] of what changed.

    A parameter of the job's sweep cell is changed in its params and the command rendered
    again from the sweep's TEMPLATE; any other is rewritten where the command gives it.
    An unknown name is one MonkeyError listing the known ones."""
    from monkey.tracking.sweepspec import PLACEHOLDER, render

    argv, params = list(job.argv), dict(job.params)
    by_norm = {norm(k): k for k in params}
    placeholders = {m.group(1) for a in template or () for m in PLACEHOLDER.finditer(a)}
    changed: dict[str, list[Any]] = {}
    rest: dict[str, tuple[str | None, str]] = {}
    for name, text in sets.items():
        key = by_norm.get(norm(name))
        if key is not None:
            value = scalar(text)
            if params[key] != value:
                changed[key] = [params[key], value]
            params[key] = value
            if key in placeholders:
                continue
        rest[name] = (key, text)
    if template is not None and any(k in placeholders for k in changed):
        argv = render(template, params)  # first: the other parameters are rewritten in it
    if template is not None and len(argv) == len(job.argv) == len(template):
        # a word the sets did not touch stays as it was typed: `--l2 0` is not re-rendered
        # `--l2 0.0` from a value the script's log_params recorded as a float
        argv = [
            new if any(m.group(1) in changed for m in PLACEHOLDER.finditer(word)) else old
            for word, new, old in zip(template, argv, job.argv)
        ]
    given = command_params(argv)
    for name, (key, text) in rest.items():
        hit = given.get(norm(name))
        if hit is None:
            if key is not None:
                continue  # a parameter the command does not show (e.g. given through params=)
            known = sorted({*params, *(shown for shown, _ in given.values())})
            raise MonkeyError(
                f"job {job.juid} has no parameter {name!r}; its parameters: "
                + (
                    ", ".join(known)
                    if known
                    else "none (its command gives no --NAME VALUE or NAME=VALUE)"
                )
            )
        shown, places = hit
        for index, form in places:
            old = argv[index]
            if form in ("eq", "kv"):
                argv[index] = f"{old.partition('=')[0]}={text}"
                old = old.partition("=")[2]
            else:
                argv[index] = text
            if key is None and old != text:
                changed[shown] = [scalar(old), scalar(text)]
    return argv, params, changed


# -- blobs ------------------------------------------------------------------------------


def _pieces(
    blobs: BlobStore, job: JobRecord, spec: dict[str, Any] | None, git: bool
) -> Iterable[tuple[str, str]]:
    """(what, digest) of every blob the job needs, manifests before their files."""
    from monkey.snapshot.manifest import load_manifest

    def manifest(label: str, digest: str) -> Iterable[tuple[str, str]]:
        yield f"{label} (its file list)", digest
        if blobs.has(digest):
            for f in load_manifest(blobs, digest):
                yield f"{label} file {f.path}", f.digest

    if job.snapshot:
        yield from manifest("code", job.snapshot)
    for ds in job.datasets:
        yield from manifest(f"dataset {ds['name']}", ds["digest"])
    for entry in (spec or {}).get("data", []):
        if entry.get("digest"):
            yield from manifest(f"job.yml data folder {entry.get('path')}", entry["digest"])
    if git and job.git.get("diff"):
        yield "git diff of its uncommitted changes", job.git["diff"]


def check_blobs(
    blobs: BlobStore,
    job: JobRecord,
    spec: dict[str, Any] | None,
    git: bool = False,
    verify: bool = True,
) -> None:
    """MonkeyError naming JOB and the first piece of it missing from the blob store;
    BlobDamaged naming the first whose bytes no longer match its digest (with VERIFY)."""
    from monkey.snapshot.blobs import BlobDamaged

    what = "code (its file list)"
    try:
        for what, digest in _pieces(blobs, job, spec, git):
            ok = blobs.verify(digest) if verify else (blobs.has(digest) or None)
            if ok is None:
                raise MonkeyError(
                    f"job {job.juid} cannot be run again: its {what} (blob {digest[:12]}) is "
                    f"missing from {blobs.root} (deleted or damaged); submit it again from its "
                    "source with `monkey run`"
                )
            if not ok:
                raise BlobDamaged(digest, blobs.root, what, job.juid)
    except BlobDamaged as exc:
        raise exc.about(what, job.juid) from None


# -- writing files out ------------------------------------------------------------------


def _safe(rel: str) -> str:
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if rel.startswith("/") or not parts or ".." in parts or "\0" in rel:
        raise MonkeyError(f"refusing to write {rel!r}: not a path inside the folder")
    return "/".join(parts)


def write_files(blobs: BlobStore, files: list[FileEntry], base: Path) -> None:
    """Write manifest FILES under BASE byte for byte with their modes; a link entry (a link
    that left the project) becomes that link again. Paths with '..', absolute paths and
    writes through a symlink leading out of BASE are refused; a blob whose bytes do not
    match its digest is BlobDamaged naming the file."""
    from monkey.snapshot.blobs import BlobDamaged

    real_base = os.path.realpath(base)
    for f in files:
        rel = _safe(f.path)
        target = os.path.join(base, rel)
        parent = os.path.dirname(target)
        os.makedirs(parent, exist_ok=True)
        if os.path.commonpath([os.path.realpath(parent), real_base]) != real_base:
            raise MonkeyError(f"refusing to write {rel}: a symlink leads it out of {base}")
        if os.path.lexists(target) and not os.path.isdir(target) or os.path.islink(target):
            os.unlink(target)
        try:
            if stat.S_ISLNK(f.mode):
                os.symlink(os.fsdecode(blobs.read_bytes(f.digest)), target)
                continue
            blobs.copy_out(f.digest, target)  # checks the bytes against the digest
        except BlobDamaged as exc:
            raise exc.about(f.path) from None
        os.chmod(target, f.mode & 0o777)


def _git(*args: str) -> subprocess.CompletedProcess[bytes]:
    import subprocess

    env = dict(os.environ, GIT_TERMINAL_PROMPT="0", LC_ALL="C")
    return subprocess.run(
        ["git", *args], capture_output=True, env=env, check=False, stdin=subprocess.DEVNULL
    )


def _git_checkout(job: JobRecord, blobs: BlobStore, tmp: Path) -> tuple[str, str | None]:
    """Clone the job's repository into TMP at its commit with its diff applied; returns
    (the code's folder inside TMP, a note when that could not be done)."""
    import shutil

    from monkey.snapshot.blobs import BlobDamaged

    git = job.git
    root, commit = git.get("root"), git.get("commit")
    rel = os.path.relpath(job.workdir, root) if root else "."
    rel = "." if rel.startswith("..") else rel
    if not root or not commit:
        return ".", None
    if (
        not os.path.isdir(root)
        or _git("-C", root, "cat-file", "-e", f"{commit}^{{commit}}").returncode
    ):
        return ".", (
            f"its repository {root} (commit {commit[:12]}) is gone; wrote the files "
            "without git history"
        )
    done = _git("clone", "-q", "--no-checkout", "--no-hardlinks", root, os.fspath(tmp))
    if done.returncode == 0:
        done = _git("-C", os.fspath(tmp), "checkout", "-q", "-b", f"monkey-{job.juid}", commit)
    if done.returncode:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        return ".", (
            f"git could not clone {root} ({done.stderr.decode(errors='replace').strip()}); "
            "wrote the files without git history"
        )
    note = None
    if git.get("diff"):
        patch = tmp / ".git" / "monkey-uncommitted.patch"
        try:
            patch.write_bytes(blobs.read_bytes(git["diff"]))
        except BlobDamaged as exc:
            raise exc.about("git diff of its uncommitted changes") from None
        applied = _git(
            "-C", os.fspath(tmp), "apply", "--binary", "--whitespace=nowarn", os.fspath(patch)
        )
        patch.unlink()
        if applied.returncode:
            note = "its uncommitted diff does not apply to its commit; the files are as the job saw them"
    return rel, note


# -- the API ----------------------------------------------------------------------------


class Reruns:
    """rerun, rerun_sweep, clone, files and cat (``monkey.api.Monkey`` delegates to it)."""

    def __init__(
        self, home: Home, store: Store, submitter: Submitter, wake: Callable[[str | None], None]
    ) -> None:
        self.home = home
        self.store = store
        self.submitter = submitter
        self._wake = wake  # Monkey.wake: the one door to the core

    def _blobs(self) -> BlobStore:
        return self.submitter.blobs()

    def _job_spec(self, juid: str) -> dict[str, Any] | None:
        return self.store.job_spec(juid)

    def _job_record(self, ref: str) -> JobRecord:
        job = self.store.get_job(self.store.resolve(ref))
        assert job is not None
        return job

    def _rerun_cells(
        self,
        jobs: list[JobRecord],
        sets: dict[str, str],
        *,
        provider: str | None,
        cpus: int | None,
        gpus: int | None,
        memory: str | None,
        time: str | int | None,
        names: list[str],
        sweep: str | None,
        held: bool,
        after: dict[str, bool] | None = None,
        priority: int = 0,
        notify: dict[str, str] | None = None,
    ) -> list[str]:
        """Record one rerun of each of JOBS in one transaction, once their blobs are checked;
        their new juids. Called under the blob store's lease (no gc deletes them meanwhile),
        taken before any transaction (gc takes it, then writes)."""
        self.submitter.check_room()
        self.submitter.check_joins(sweep)
        blobs = self._blobs()
        templates: dict[str, list[str] | None] = {}
        planned = []
        owner = self.submitter.owner
        owners = self.store.job_owners([j.juid for j in jobs]) if owner is not None else {}
        for job, name in zip(jobs, names):
            secrets = self.store.secrets_ref(job.juid)
            if owner is not None and secrets and owners.get(job.juid) != owner:
                raise MonkeyError(
                    f"job {job.juid} carries secret env values of {owners.get(job.juid)}; only "
                    "they may run it again (submit your own with `monkey run --env`)"
                )
            spec = self.store.job_spec(job.juid)
            check_blobs(blobs, job, spec, verify=False)  # their bytes: checked at the start
            if job.sweep not in templates:
                found = self.store.get_sweep(job.sweep) if job.sweep else None
                templates[job.sweep or ""] = found["spec"].get("command") if found else None
            argv, params, changed = apply_sets(job, sets, templates.get(job.sweep or ""))
            # where it may run: as asked, else as the job was (every provider it allowed)
            asked = provider or ",".join(job.resources.providers or [job.provider])
            where, resources = self.submitter.placed(
                asked,
                job.resources.cpus if cpus is None else cpus,
                job.resources.gpus if gpus is None else gpus,
                job.resources.memory if memory is None else memory,
                job.resources.host if asked == job.provider else None,
                job.resources.time if time is None else time,
            )
            changes: dict[str, Any] = {}
            if changed:
                changes["params"] = changed
            if where != job.provider:
                changes["provider"] = [job.provider, where]
                if spec is not None:  # this provider's machine options from the job.yml
                    spec = {**spec, "provider_options": spec.get("providers", {}).get(where, {})}
            moved = {
                k: [v, resources.to_json().get(k)]
                for k, v in job.resources.to_json().items()
                if resources.to_json().get(k) != v
            }
            if moved:
                changes["resources"] = moved
            if name not in (job.name, rerun_name(job.name)):  # a name given, not the default
                changes["name"] = [job.name, name]
            fields: dict[str, Any] = {
                "provider": where,
                "resources": resources,
                "env": job.env,
                "snapshot": job.snapshot,
                "workdir": job.workdir,
                "datasets": job.datasets,
                "git": job.git,
                "python": job.python,
                "retries": job.retries,
                "secrets": secrets,
                "spec": spec,
                "outputs": self.store.outputs(job.juid),
                "packages": self.store.job_packages(job.juid),
                "image": self.store.job_image(job.juid),  # its digest: a moved tag changes nothing
            }
            planned.append((job.juid, (argv, name, params), fields, changes))
        juids = []
        with self.store.tx() as db:
            for of, cell, fields, changes in planned:
                [juid] = self.store.create_jobs(
                    [cell],
                    sweep=sweep,
                    held=held,
                    owner=owner,
                    after=after,
                    priority=priority,
                    notify=notify,
                    **fields,
                )
                self.store.record_rerun(db, juid, of, changes)
                juids.append(juid)
        return juids

    def rerun(
        self,
        ref: str,
        *,
        set: Mapping[str, Any] | Iterable[str] | None = None,
        provider: str | None = None,
        cpus: int | None = None,
        gpus: int | None = None,
        memory: str | None = None,
        time: str | int | None = None,
        name: str | None = None,
        start_core: bool = True,
        after: str | Iterable[str] | None = None,
        after_any: str | Iterable[str] | None = None,
        priority: int = 0,
        notify: str | Iterable[str] | None = None,
    ) -> str:
        """Queue job REF again from its record alone: the same code, data, job.yml, env and
        command, with parameters rewritten by ``set`` ({"lr": 0.2} or ["lr=0.2"]) and
        optionally another provider or resources (``time``, ``after``, ``after_any``,
        ``priority``: as ``run``'s). Returns the new job's id at once."""
        job = self._job_record(ref)
        deps = self.submitter.dependencies(after, after_any)
        targets = None
        if notify:  # `rerun --notify NAME`: as run's
            from monkey.submit import job_targets

            targets = job_targets(self.store, self.submitter.acting_user(), notify)
        if start_core:
            self.home.socket_path("core")
        with self._blobs().lease():
            [juid] = self._rerun_cells(
                [job],
                parse_sets(set),
                provider=provider,
                cpus=cpus,
                gpus=gpus,
                memory=memory,
                time=time,
                names=[name or rerun_name(job.name)],
                sweep=None,
                held=False,
                after=deps,
                priority=check_priority(priority),
                notify=targets,
            )
        if start_core:
            self._wake(f"job {juid}")
        return juid

    def rerun_sweep(
        self,
        ref: str,
        *,
        failed: bool = False,
        cells: Iterable[int] | None = None,
        set: Mapping[str, Any] | Iterable[str] | None = None,
        in_place: bool = False,
        provider: str | None = None,
        cpus: int | None = None,
        gpus: int | None = None,
        memory: str | None = None,
        time: str | int | None = None,
        name: str | None = None,
        start_core: bool = True,
        after: str | Iterable[str] | None = None,
        after_any: str | Iterable[str] | None = None,
        priority: int = 0,
    ) -> str:
        """Rerun cells of sweep REF (all; ``failed`` ones; or ``cells``, numbered from 1 in
        the order of `sweep status`) as a new sweep, or as new jobs of the same sweep with
        ``in_place`` (``after``, ``after_any``: as ``run``'s, for each). Returns the sweep id
        the reruns belong to."""
        from monkey.tracking import sweeps

        sid = self.store.resolve_sweep(ref)
        deps = self.submitter.dependencies(after, after_any)
        sweep = self.store.get_sweep(sid)
        assert sweep is not None
        if sweep["state"] in (sweeps.SUBMITTING, sweeps.INTERRUPTED):
            raise MonkeyError(
                f"sweep {sid} is {sweep['state']}: its cells were never all "
                "written; submit it again with `monkey sweep`"
            )
        jobs = self.store.list_jobs(sweep=sid, newest_first=False)
        picked = list(enumerate(jobs, start=1))
        if cells is not None:
            wanted = list(dict.fromkeys(cells))
            bad = [k for k in wanted if not 1 <= k <= len(jobs)]
            if bad:
                raise MonkeyError(
                    f"sweep {sid} has cells 1 to {len(jobs)}; no cell {', '.join(map(str, bad))}"
                )
            picked = [(k, jobs[k - 1]) for k in wanted]
        if failed:
            picked = [(k, j) for k, j in picked if j.state in FAILED_CELLS]
        if not picked:
            raise MonkeyError(
                f"sweep {sid} has no {'failed or lost ' if failed else ''}cells "
                "to rerun; see `monkey sweep status " + sid + "`"
            )
        live = [j.juid for _, j in picked if in_place and j.state not in TERMINAL]
        if live:
            raise MonkeyError(
                f"sweep {sid}: cell {live[0]} has not ended; rerun ended cells "
                "in place, or cancel it first"
            )
        sets = parse_sets(set)
        if start_core:
            self.home.socket_path("core")
        with self._blobs().lease(), self.store.tx():  # the lease first, as gc takes it
            if in_place:
                target, label = sid, None
            else:
                spec = dict(sweep["spec"], rerun_of=sid, cells=len(picked))
                spec["parameters"] = {  # a parameter set to one value has that value only
                    k: {"values": [scalar(sets[k])]} if k in sets else v
                    for k, v in spec.get("parameters", {}).items()
                }
                target = self.store.create_sweep(name or "", spec)
                label = name or target
            names = [j.name if label is None else f"{label}-{k}" for k, j in picked]
            self._rerun_cells(
                [j for _, j in picked],
                sets,
                provider=provider,
                cpus=cpus,
                gpus=gpus,
                memory=memory,
                time=time,
                names=names,
                sweep=target,
                held=True,
                after=deps,
                priority=check_priority(priority),
            )
            if in_place:
                self.store.set_sweep_state(sid, sweeps.ACTIVE_SWEEP)
        record = self.store.get_sweep(target)
        assert record is not None
        sweeps.advance(self.store, record)
        if start_core:
            self._wake(f"sweep {target}")
        return target

    # -- the code as the job saw it -------------------------------------------------------

    def files(self, ref: str) -> list[FileEntry]:
        """The job's code files (path, digest, mode, size), sorted by path."""
        from monkey.snapshot.blobs import BlobDamaged
        from monkey.snapshot.manifest import load_manifest

        job = self._job_record(ref)
        if not job.snapshot:
            return []
        blobs = self._blobs()
        if not blobs.has(job.snapshot):
            check_blobs(blobs, job, None)
        try:
            return load_manifest(blobs, job.snapshot)
        except BlobDamaged as exc:
            raise exc.about("code (its file list)", job.juid) from None

    def cat(self, ref: str, path: str) -> bytes:
        """One code file of the job, as the job saw it (checked against its digest)."""
        return self.code_blob(ref, path).read_bytes()

    def code_blob(self, ref: str, path: str) -> Path:
        """Where one code file of the job is stored, its bytes checked against its digest
        (BlobDamaged when they are wrong): what a download streams from."""
        from monkey.snapshot.blobs import BlobDamaged

        job = self._job_record(ref)
        want = "/".join(p for p in path.split("/") if p not in ("", "."))
        for f in self.files(job.juid):
            if f.path == want:
                blobs = self._blobs()
                if not blobs.has(f.digest):
                    check_blobs(blobs, job, None, verify=False)
                try:
                    blobs.check(f.digest)
                except BlobDamaged as exc:
                    raise exc.about(f.path, job.juid) from None
                return blobs.path(f.digest)
        raise MonkeyError(
            f"job {job.juid} has no code file {path!r}; `monkey info job "
            f"{job.juid} --files` lists them"
        )

    def clone(
        self, ref: str, to: str | os.PathLike[str] | None = None, with_data: bool = False
    ) -> dict[str, Any]:
        """Write the job's code as it was into folder TO (default: ./JOB), in a git clone at
        its commit with its uncommitted diff applied when it ran in a repository; with
        ``with_data`` its datasets too, under ``datasets/NAME``. Returns {"path", "files",
        "code", "datasets", "note"}; nothing is left behind on failure."""
        import shutil
        import tempfile

        from monkey.snapshot.blobs import BlobDamaged

        job = self._job_record(ref)
        spec = self._job_spec(job.juid)
        blobs = self._blobs()
        check_blobs(blobs, job, spec if with_data else None, git=True, verify=False)  # copies check
        dest = Path(to if to is not None else job.juid).expanduser().absolute()
        if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
            raise MonkeyError(f"{dest} exists and is not empty; choose another folder with --to")
        if not dest.parent.is_dir():
            raise MonkeyError(
                f"folder {dest.parent} does not exist; create it or choose another with --to"
            )
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
        try:
            try:
                rel, note = _git_checkout(job, blobs, tmp)
                code = tmp / rel
                files, datasets = self._write_clone(job, spec, blobs, tmp, code, dest, with_data)
            except BlobDamaged as exc:
                raise exc.about(None, job.juid) from None
            if dest.exists():
                dest.rmdir()
            os.rename(tmp, dest)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return {
            "path": os.fspath(dest),
            "code": os.fspath(dest / rel),
            "files": len(files),
            "datasets": datasets,
            "note": note,
        }

    @staticmethod
    def _write_clone(
        job: JobRecord,
        spec: dict[str, Any] | None,
        blobs: BlobStore,
        tmp: Path,
        code: Path,
        dest: Path,
        with_data: bool,
    ) -> tuple[list[FileEntry], list[dict[str, str]]]:
        """Write the job's code files into CODE (and its data under TMP with WITH_DATA);
        (its files, [{name, path}] of its datasets as they will be under DEST)."""
        from monkey.snapshot.manifest import load_manifest

        files = load_manifest(blobs, job.snapshot) if job.snapshot else []
        write_files(blobs, files, code)
        datasets = []
        if with_data:
            for ds in job.datasets:
                where = Path("datasets") / ds["name"]
                write_files(blobs, load_manifest(blobs, ds["digest"]), tmp / where)
                datasets.append({"name": ds["name"], "path": os.fspath(dest / where)})
            for entry in (spec or {}).get("data", []):
                if entry.get("digest"):
                    write_files(
                        blobs, load_manifest(blobs, entry["digest"]), code / _safe(entry["path"])
                    )
        return files, datasets
