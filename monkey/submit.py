"""One submission path for run, sweep and rerun: check the options, store the code, data
and environment the jobs share (``Submitter.prepare``), and record the jobs
(``Submitter.record``). ``monkey.api.Monkey`` and the sweeps and reruns it delegates to
submit through here."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from monkey.config import Home, ProviderConfig
from monkey.drivers import driver_class
from monkey.models import (
    REDACTED,
    Forbidden,
    MonkeyError,
    Record,
    Resources,
    dumps,
    is_secret,
    later_pattern,
    parse_duration,
    parse_size,
)
from monkey.store import Store
from monkey.store.errors import NEARLY_FULL, DiskFull, disk_full, free_bytes, is_no_space

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from monkey.snapshot.blobs import BlobStore

# Variables that define the software environment a job was submitted from.
CAPTURED_ENV = (
    "PATH",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
    "CONDA_DEFAULT_ENV",
    "PYTHONPATH",
    "LD_LIBRARY_PATH",
    "CUDA_HOME",
)


def captured_env() -> dict[str, str]:
    """This machine's software environment: the CAPTURED_ENV variables it has."""
    return {k: v for k in CAPTURED_ENV if (v := os.environ.get(k)) is not None}


MAX_RETRIES = 1000  # attempts of one job beyond the first; more is a typo, not a plan
_ENV_NAME = later_pattern(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PYTHONS = later_pattern(r"^python[0-9.]*$")


# The fields ``gather`` reads on the submitting machine (and a client sends to a server).
GATHERED = (
    "provider",
    "env",
    "snapshot",
    "workdir",
    "datasets",
    "git",
    "python",
    "retries",
    "spec",
    "outputs",
    "packages",
)
_DIGEST = later_pattern(r"[0-9a-f]{64}")


class BlobsMissing(MonkeyError):
    """Blobs a submission needs that the server does not hold (HTTP 409): the client
    uploads them and submits again."""

    def __init__(self, digests: list[str]) -> None:
        super().__init__(
            f"{len(digests)} blob(s) of this submission are not on the server "
            f"(e.g. {digests[0]}); submit again to upload them"
        )
        self.digests = digests


class Submission(Record):
    """What the jobs of one submission share: ``fields`` for ``Store.create_jobs``, the
    job.yml's name, the secret environment values and, once written, their file's name."""

    __slots__ = ("name", "fields", "secrets", "secrets_ref", "joined")

    def __init__(
        self,
        name: str | None,
        fields: dict[str, Any],
        secrets: dict[str, str],
        secrets_ref: str | None = None,
    ) -> None:
        self.name = name
        self.fields = fields
        self.secrets = secrets
        self.secrets_ref = secrets_ref
        self.joined: str | None = None  # the sweep it may add jobs to, once checked

    def __repr__(self) -> str:  # never the secret values
        return f"Submission(name={self.name!r}, secrets={sorted(self.secrets)!r})"


class Submitter:
    """Prepares and records the submissions of one MONKEY_HOME; PROVIDERS gives
    providers.yml as it is now (a long-lived Monkey sees `provider add`)."""

    # (the packages listing, its blob's digest and size): stored once per listing in a
    # process, e.g. a sweep script's runs
    _packages_memo: tuple[dict[str, str], str, int] | None = None

    def __init__(
        self,
        home: Home,
        store: Store,
        providers: Callable[[], dict[str, ProviderConfig]],
        owner: str | None = None,
    ) -> None:
        self.home = home
        self.store = store
        self._providers = providers
        self._blob_store: BlobStore | None = None
        self.owner = owner  # who submits (None: this machine's user)

    def acting_user(self) -> str:
        """Who submits and steers: ``owner``, or this machine's user."""
        from monkey.store.db import local_user

        return self.owner or local_user()

    @property
    def providers(self) -> dict[str, ProviderConfig]:
        return self._providers()

    def blobs(self) -> BlobStore:
        """The blob store of this MONKEY_HOME (one per Monkey: it keeps its real path)."""
        if self._blob_store is None:
            from monkey.snapshot.blobs import BlobStore

            self._blob_store = BlobStore(self.home.blobs)
        return self._blob_store

    def dependencies(
        self, after: str | Iterable[str] | None, after_any: str | Iterable[str] | None = None
    ) -> dict[str, bool]:
        """The jobs named by AFTER (each must succeed) and AFTER_ANY (each must end), as
        ``Store.create_jobs`` takes them: job id -> whether any ending will do. Each is a job
        (an id, a unique prefix, `last`) or a sweep (its id or name: all its jobs, each of
        which need only end: a sweep's runs fail or stop early as a matter of course), given
        as a list or one text of them separated by commas."""
        deps: dict[str, bool] = {}
        for refs, any_end in ((after, False), (after_any, True)):
            words = [refs] if isinstance(refs, str) else list(refs or ())
            for ref in (r.strip() for word in words for r in str(word).split(",")):
                if not ref:
                    raise MonkeyError(
                        "--after/--after-any: an empty job id; give JOB[,JOB...], e.g. "
                        "--after 26-11-21-001,last"
                    )
                try:
                    named, whole_sweep = self._dependency(ref)
                except MonkeyError as exc:
                    option = "--after-any" if any_end else "--after"
                    raise MonkeyError(f"{option} {ref}: {exc}") from None
                for juid in named:  # a sweep's runs need only end: some fail or stop early
                    ended = any_end or whole_sweep
                    deps[juid] = ended and deps.get(juid, True)  # success wins over any end
        self._check_waits(list(deps))
        return deps

    def check_room(self) -> None:
        """DiskFull when MONKEY_HOME's disk is (nearly) full: a job recorded there would find
        no room for its run, so the submission is refused before anything is written."""
        free = free_bytes(self.home.root)
        if 0 <= free < NEARLY_FULL:
            raise DiskFull(self.home.root, free)

    def _check_waits(self, juids: list[str]) -> None:
        """Forbidden when, on a main node, a job of JUIDS is another user's and the
        submitting user no admin: a job waiting for it would hold it (its owner could not
        remove it while the waiting job is queued or paused)."""
        if self.owner is None or not juids:
            return
        others = {j: o for j, o in self.store.job_owners(juids).items() if o != self.owner}
        if others and not self.store.is_admin(self.owner):
            juid, owner = min(others.items())
            raise Forbidden(
                f"--after/--after-any: job {juid} belongs to {owner or 'nobody recorded'}; "
                "a job may wait only for jobs of your own (an admin may wait for any)"
            )

    def _dependency(self, ref: str) -> tuple[list[str], bool]:
        """The jobs REF names (one job, or every job of a sweep), and whether a sweep."""
        if ref == "last" or all(c in "0123456789-" for c in ref):
            return [self.store.resolve(ref)], False
        sid = self.store.resolve_sweep(ref)
        juids = [row[0] for row in self.store.sweep_jobs_brief(sid)]
        if not juids:
            raise MonkeyError(f"sweep {sid} has no jobs to wait for")
        return juids, True

    def prepare(
        self,
        *,
        provider: str = "local",
        cpus: int = 1,
        gpus: int = 0,
        memory: str | None = None,
        host: str | None = None,
        time: str | int | None = None,
        image: str | None = None,
        gathered: dict[str, Any] | None = None,
        **local: Any,
    ) -> Submission:
        """Check the options and store the code, data and environment the jobs of one
        submission share (done once for a whole sweep). GATHERED: what a client gathered
        on its own machine and sent with its blobs (see ``gather`` and ``accept``), instead
        of LOCAL's folders and files of this machine (see ``gather``). IMAGE: the OCI image
        the jobs run in (over the job.yml's `image:`), pinned here to its digest."""
        self.check_room()
        provider, resources = self.placed(provider, cpus, gpus, memory, host, time)
        resolving = None
        if image is not None:
            from monkey.images import parse
            from monkey.images import resolving as resolution

            parse(image)  # a bad reference is refused before the code is stored
            if gathered is None:  # the registry is asked while the code is snapshot
                resolving = resolution(self.home, image)
        try:
            if gathered is None:
                options = driver_class(self.providers[provider].type).job_options
                sub = self.gather(provider, options, **local)
            else:
                retries = local.pop("retries", 0)  # a sweep's own, over the gathered one
                given = sorted(k for k, v in local.items() if v not in (None, (), [], False))
                if given:
                    raise MonkeyError(
                        f"{', '.join(given)}: the client gathers these on its own machine; "
                        "send them with the code it gathered, not beside it"
                    )
                sub = self.accept(gathered, provider)
                if retries:
                    sub.fields["retries"] = check_retries(retries)
        except BaseException:
            if resolving is not None:
                resolving.cancel()
            raise
        sub.fields["resources"] = resources
        text = image or sub.fields.pop("image", None)  # given, else the job.yml's
        sub.fields.pop("image", None)  # (the job.yml's, when one was given)
        if resolving is None and text:  # a client's submission once checked, or the job.yml's
            from monkey.images import resolving as resolution

            resolving = resolution(self.home, text)
        if resolving is not None:
            pinned = resolving.result()
            sub.fields["image"] = pinned
            # in an image, the image's PATH, PYTHONPATH... apply, not this machine's (those
            # the user named with --env or job.yml stay)
            machine = captured_env()
            sub.fields["env"] = {k: v for k, v in sub.fields["env"].items() if machine.get(k) != v}
        return sub

    def gather(
        self,
        provider: str,
        job_options: frozenset[str],
        *,
        outputs: str | Iterable[str] = (),
        retries: int = 0,
        datasets: str | os.PathLike[str] | Iterable[str | os.PathLike[str]] = (),
        env: dict[str, str] | str | Iterable[str] | None = None,
        workdir: str | os.PathLike[str] | None = None,
        job_yml: str | os.PathLike[str] | bool | None = None,
        yes: bool = False,
        captured: bool = True,
    ) -> Submission:
        """Read this machine's side of a submission to PROVIDER (whose kind takes
        JOB_OPTIONS from a job.yml): the code, datasets, job.yml, git state, installed
        packages and environment, stored in this Submitter's blobs. The fields lack the
        resources, which ``prepare`` checks against the provider. CAPTURED: the
        environment starts from this machine's PATH, VIRTUAL_ENV... (not for a main node's
        job: its own are used, see ``accept``)."""
        from monkey import jobspec, snapshot

        # A lone string is one glob / one dataset, not a sequence of one-letter ones.
        outputs = [
            check_output_glob(g) for g in ([outputs] if isinstance(outputs, str) else outputs)
        ]
        specs = (
            [os.fspath(datasets)]
            if isinstance(datasets, (str, os.PathLike))
            else [os.fspath(d) for d in datasets]
        )
        check_retries(retries)
        root = os.path.expanduser(workdir) if workdir else os.getcwd()
        # True, like None, reads the workdir's job.yml if any (Path(True) failed)
        job_file = (
            jobspec.find(root)
            if job_yml is None or job_yml is True
            else Path(job_yml)
            if job_yml
            else None
        )
        js = jobspec.load(job_file) if job_file else None
        subdir = ""
        # Resolved and its repository found once, for the snapshot, git and the record.
        folder = snapshot.locate(js.code_root if js is not None else workdir or None)
        if js is not None:  # the file's values first, so that arguments override them
            given = [f"{k}={v}" for k, v in env.items()] if isinstance(env, dict) else env or []
            env = [*(f"{k}={v}" for k, v in js.env.items()), *given]
        elif not workdir:  # in a sub-folder of a repository: its root, run in the sub-folder
            folder, subdir = snapshot.repository_root(folder)
            outputs = [f"{subdir}/{g}" if subdir else g for g in outputs]  # from the job's folder
        plain_env, secret_env = self.split_env(env, captured)
        blobs = self.blobs()
        # The job.yml stored with the code holds no env values: they reach the job as env.
        hidden = {os.path.relpath(js.file, js.code_root): js.redacted()} if js and js.env else {}
        # git runs while the code is walked and stored; a failure below leaves no git behind
        query = snapshot.GitQuery(folder, [str(js.file)] if js and hidden else ())
        try:
            snap = snapshot.snapshot_dir(
                folder,
                blobs,
                self.store,
                js.snapshot_ignore() if js else (),
                replace=hidden,
                yes=yes,
            )
            new_blobs = list(snap.new_blobs)
            spec_record = None
            if js is not None:
                spec_record, spec_blobs = jobspec.resolve(
                    js, snap.files, blobs, self.store, provider, job_options
                )
                new_blobs += spec_blobs
            recorded_datasets = []
            seen: set[str] = set()
            for spec in specs:
                ds = snapshot.dataset(
                    spec, blobs, self.store, yes=yes
                )  # a path as typed: from the current folder
                if ds.name in seen:
                    raise MonkeyError(f"two datasets are named {ds.name}; name them with PATH:NAME")
                seen.add(ds.name)
                new_blobs += ds.new_blobs
                recorded_datasets.append(
                    {
                        "name": ds.name,
                        "digest": ds.digest,
                        "single": ds.single,
                        "size": ds.size,
                        "source": spec,
                    }
                )
            git, git_blobs = query.result(blobs)
        finally:
            query.cancel()
        if subdir:  # the job runs in this folder of its code (as `cd SUBDIR && CMD`)
            git = {**git, "subdir": subdir}
        new_blobs += git_blobs
        packages = self.packages(blobs)
        new_blobs.append(packages)
        return Submission(
            name=js.name if js is not None else None,
            fields={
                "provider": provider,
                "env": {**plain_env, **{k: REDACTED for k in secret_env}},
                "snapshot": snap.digest,
                "workdir": folder.path,
                "datasets": recorded_datasets,
                "git": git,
                "python": sys.version.split()[0],
                "retries": retries,
                "blobs": self.blobs().stamped(new_blobs),
                "spec": spec_record,
                "outputs": outputs,
                "packages": packages[0],
                **({"image": js.image} if js is not None and js.image else {}),
            },
            secrets=secret_env,
        )

    def accept(self, gathered: dict[str, Any], provider: str) -> Submission:
        """The submission a client gathered on its machine (``gather``'s fields, name and
        secrets, sent over the API), checked as if it had been gathered here; BlobsMissing
        when a blob it needs has not been uploaded (the client sends those and asks again)."""
        try:
            fields = dict(gathered["fields"])
            name, secrets = gathered.get("name"), dict(gathered.get("secrets") or {})
            extra = sorted(set(fields) - set(GATHERED)) + sorted(
                str(k)[:80] for k in gathered if k not in ("fields", "name", "secrets")
            )
            lacking = sorted(set(GATHERED) - set(fields) - {"provider"})
        except (KeyError, TypeError, ValueError):
            raise MonkeyError("the gathered submission is malformed; upgrade the client") from None
        if extra or lacking:
            raise MonkeyError(
                f"the gathered submission has {extra or 'no'} unknown and lacks {lacking or 'no'}"
                " fields; upgrade the client"
            )
        fields["provider"] = provider
        try:
            check_gathered(fields, name, secrets)
        except MonkeyError as exc:
            raise MonkeyError(f"gathered {exc}; fix it, or upgrade the client") from None
        # The job runs here: on this machine's PATH, VIRTUAL_ENV..., not the laptop's (a
        # laptop's venv is not here); a value the user named with --env or job.yml wins.
        fields["env"] = {**captured_env(), **fields["env"]}
        blobs = self.blobs()
        named, listed = blobs_needed(fields, blobs)
        missing = sorted(d for d in named | listed if not blobs.has(d))
        if missing:
            raise BlobsMissing(missing)
        fields["blobs"] = []  # recorded as they were uploaded (or before)
        return Submission(name=name, fields=fields, secrets=secrets)

    def check_joins(self, sweep: str | None) -> None:
        """Forbidden unless the submitting user may add jobs to SWEEP: on a main node (an
        ``owner`` set) SWEEP is a sweep's id (not one to come, which would be another's)
        and every job already in it is theirs, or they are an admin. On this machine's own
        (no owner) its user owns everything, and a sweep may be any label."""
        if sweep is None or self.owner is None:
            return
        if self.store.get_sweep(sweep) is None:
            raise MonkeyError(
                f"no sweep has the id {sweep!r}; give the id of a sweep of yours "
                "(`monkey list sweeps`), or start one with `monkey sweep`"
            )
        others = self.store.sweep_owners(sweep) - {self.owner}
        if others and not self.store.is_admin(self.owner):
            names = ", ".join(sorted(o or "nobody recorded" for o in others))
            raise Forbidden(
                f"sweep {sweep} has jobs of {names}; only their owner or an admin may add "
                "jobs to it (submit without the sweep, or start your own with `monkey sweep`)"
            )

    def record(
        self, sub: Submission, cells: list[tuple[list[str], str, dict[str, Any]]], **fields: Any
    ) -> list[str]:
        """Record one job per (argv, name, params) cell in one transaction; the secret values
        go to a 0600 file first, removed again when nothing refers to it."""
        if fields.get("sweep") != sub.joined:  # a sweep's batches: its first one checks
            self.check_joins(fields.get("sweep"))
            sub.joined = fields.get("sweep")
        secrets_ref = sub.secrets_ref
        if sub.secrets and secrets_ref is None:
            secrets_ref = self._write_secrets(sub.secrets)
        try:
            juids = self.store.create_jobs(
                cells, secrets=secrets_ref, owner=self.owner, **sub.fields, **fields
            )
        except BaseException:
            if secrets_ref is not None and secrets_ref != sub.secrets_ref:
                (self.home.secrets / secrets_ref).unlink(missing_ok=True)
            raise
        sub.secrets_ref = secrets_ref
        return juids

    def placed(
        self,
        provider: str,
        cpus: int,
        gpus: int,
        memory: str | None,
        host: str | None = None,
        time: str | int | None = None,
    ) -> tuple[str, Resources]:
        """(the provider the job goes to, the resources asked), checked. PROVIDER names one
        provider, or several in order (``a,b``): the job goes to the first that could ever
        hold it, and one that gives it up before it ran hands it to the next."""
        names = list(dict.fromkeys(n.strip() for n in provider.split(",")))
        for name in names:
            if name not in self.providers:
                configured = ", ".join(sorted(self.providers))
                raise MonkeyError(
                    f"unknown provider {name!r}; configured: {configured} (add it to "
                    f"{self.home.providers_file})"
                )
        if host and len(names) > 1:
            raise MonkeyError(
                f"--host names a host of one provider; give one --provider with it, not {provider}"
            )
        for label, value, low in (("--cpus", cpus, 1), ("--gpus", gpus, 0)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise MonkeyError(f"{label} must be a whole number >= {low}, got {value!r}")
        if memory is not None:
            parse_size(memory)  # refuse "lots" now, not when placing
        resources = Resources(
            cpus=cpus,
            gpus=gpus,
            memory=memory,
            host=host,
            time=parse_duration(time) if time is not None else None,
            providers=names if len(names) > 1 else None,
        )
        reasons = []
        for name in names:
            config = self.providers[name]
            why = driver_class(config.type).never_fits(config, resources)
            if not why:
                return name, resources
            reasons.append(why)
        raise MonkeyError("; ".join(reasons))

    @staticmethod
    def split_env(
        env: dict[str, str] | str | Iterable[str] | None, captured: bool = True
    ) -> tuple[dict[str, str], dict[str, str]]:
        """(plain, secret) values of ENV, checked; with CAPTURED, the plain ones start from
        this machine's software environment (CAPTURED_ENV: PATH, VIRTUAL_ENV...)."""
        given: dict[str, str] = {}
        if isinstance(env, dict):
            given = {str(k): str(v) for k, v in env.items()}
        elif env:
            for item in [env] if isinstance(env, str) else env:
                key, sep, value = item.partition("=")
                if not sep:
                    raise MonkeyError(f"--env {item!r} is not KEY=VALUE; write e.g. --env SEED=1")
                given[key] = value
        for key, value in given.items():
            if not _ENV_NAME.match(key):
                raise MonkeyError(f"--env name {key!r} is not a valid variable name")
            if "\0" in value:
                raise MonkeyError(
                    f"--env {key}: the value contains a NUL byte (\\0), which no "
                    "program can receive; remove it"
                )
        plain = captured_env() if captured else {}
        secret: dict[str, str] = {}
        for key, value in given.items():
            (secret if is_secret(key, value) else plain)[key] = value
        return plain, secret

    def _write_secrets(self, values: dict[str, str]) -> str:
        ref = os.urandom(16).hex() + ".json"
        path = self.home.secrets / ref
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(dumps(values))
        except OSError as exc:
            path.unlink()
            if is_no_space(exc):
                raise disk_full(self.home.secrets) from None
            raise
        return ref

    def packages(self, blobs: BlobStore) -> tuple[str, int]:
        """(digest, size) of the listing of this Python's installed packages (what `diff`
        compares), stored in BLOBS."""
        from monkey.tracking.packages import as_text, installed

        packages = installed(self.home.private)
        memo = self._packages_memo
        if memo is not None and memo[0] is packages and blobs.has(memo[1]):
            return memo[1], memo[2]
        data = as_text(packages)
        digest, _ = blobs.put_bytes(data)
        self._packages_memo = (packages, digest, len(data))
        return digest, len(data)


def wake(home: Home, queued: str | None = None) -> None:
    """Tell the core there is work, starting it when it is not running; MonkeyError when
    it cannot start. QUEUED names what was just recorded (e.g. "job 26-11-21-001"), which
    stays queued for the core's next start, as the error says."""
    from monkey.core import daemon

    try:
        daemon.wake(home)
    except MonkeyError as exc:
        if queued is None:
            raise
        raise MonkeyError(f"{queued} is queued, but {exc}") from None


def parse_command(cmd: str | Sequence[str]) -> list[str]:
    """A job's command as argv (a string is split as a shell would); MonkeyError for none."""
    import shlex

    try:
        argv = shlex.split(cmd) if isinstance(cmd, str) else [str(a) for a in cmd]
    except ValueError as exc:
        raise MonkeyError(f"command {cmd!r}: {exc} (it is split as a shell would)") from None
    if not argv:
        raise MonkeyError("no command given; put it after `--`, e.g. monkey run -- python train.py")
    if any("\0" in arg for arg in argv):
        raise MonkeyError(
            f"command {argv!r} contains a NUL byte (\\0), which no program can receive; remove it"
        )
    return argv


MAX_PRIORITY = 1_000_000  # either way: room for any scheme, and always an SQLite integer


def check_priority(priority: Any) -> int:
    """PRIORITY as a job's priority; MonkeyError when it is not a whole number in range."""
    if (
        isinstance(priority, bool)
        or not isinstance(priority, int)
        or not -MAX_PRIORITY <= priority <= MAX_PRIORITY
    ):
        raise MonkeyError(
            f"priority {priority!r}: give a whole number from -{MAX_PRIORITY:,} to "
            f"{MAX_PRIORITY:,}, e.g. 10 or -5"
        )
    return priority


def check_retries(retries: Any) -> int:
    """RETRIES, refused unless a whole number from 0 to MAX_RETRIES."""
    if not isinstance(retries, int) or isinstance(retries, bool) or not 0 <= retries <= MAX_RETRIES:
        raise MonkeyError(
            f"--retries must be a whole number from 0 to {MAX_RETRIES}, got {retries!r}"
        )
    return retries


def blobs_needed(fields: dict[str, Any], blobs: BlobStore) -> tuple[set[str], set[str]]:
    """The blobs the jobs of a submission with FIELDS need: (those the fields name: the code's
    and data's file lists, the git diff, the packages listing, the job.yml's env file and
    install script; the files listed by those lists that are in BLOBS)."""
    from monkey.snapshot.manifest import load_manifest

    spec = fields.get("spec") or {}
    lists = [
        fields["snapshot"],
        *(d.get("digest") for d in fields["datasets"] if isinstance(d, dict)),
        *(d.get("digest") for d in spec.get("data") or () if isinstance(d, dict)),
    ]
    single = [
        fields["packages"],
        (fields.get("git") or {}).get("diff"),
        spec.get("env_file_digest"),
        spec.get("install_script_digest"),
    ]
    named = {d for d in [*lists, *single] if isinstance(d, str)}
    bad = sorted(d for d in named if not _DIGEST.fullmatch(d))
    if bad:
        raise MonkeyError(f"{bad[0]!r} is not a blob digest; upgrade the client")
    listed: set[str] = set()
    for digest in {d for d in lists if isinstance(d, str)}:
        if blobs.has(digest):
            files = {f.digest for f in load_manifest(blobs, digest)}
            if not all(isinstance(d, str) and _DIGEST.fullmatch(d) for d in files):
                raise MonkeyError(f"blob {digest} lists a file without a valid digest")
            listed |= files
    return named, listed - named


MAX_OUTPUTS = 100  # --outputs globs of one submission


def check_gathered(fields: dict[str, Any], name: Any, secrets: dict[str, Any]) -> None:
    """The FIELDS (``GATHERED``), job NAME and SECRETS a client sent, checked as strictly as
    a submission gathered here is made: MonkeyError naming the first wrong field. Values
    are normalised in FIELDS."""
    from monkey import specrecord as sr

    fields["retries"] = check_retries(fields["retries"])
    outputs = fields["outputs"]
    if not isinstance(outputs, list) or len(outputs) > MAX_OUTPUTS:
        raise MonkeyError(f"outputs: give a list of at most {MAX_OUTPUTS} globs")
    fields["outputs"] = [
        check_output_glob(sr.check_text(g, f"outputs[{i}]")) for i, g in enumerate(outputs)
    ]
    for label, values in (("env", fields["env"]), ("secrets", secrets)):
        if not isinstance(values, dict) or len(values) > sr.MAX_ITEMS:
            raise MonkeyError(f"{label}: give at most {sr.MAX_ITEMS} NAME=VALUE pairs of text")
        for key, value in values.items():
            if not isinstance(key, str) or not sr.ENV_NAME.fullmatch(key):
                raise MonkeyError(f"{label}: {str(key)[:80]!r} is not a variable name")
            if not isinstance(value, str) or "\0" in value or len(value) > sr.MAX_VALUE:
                raise MonkeyError(f"{label}.{key}: give text without NUL, at most 128 KiB")
    for key in ("snapshot", "packages"):
        sr.check_digest(fields[key], key)
    sr.check_text(fields["workdir"], "workdir")
    sr.check_text(fields["python"], "python", 64)
    if name is not None:
        sr.check_text(name, "name", 1000)
    fields["spec"] = sr.check_spec(fields["spec"])
    fields["datasets"] = sr.check_datasets(fields["datasets"], "datasets")
    fields["git"] = sr.check_git(fields["git"], "git") if fields["git"] != {} else {}


def check_output_glob(pattern: str) -> str:
    """An --outputs glob, refused when it could reach outside the job's folder."""
    parts = pattern.split("/")
    if not pattern or pattern.startswith("/") or ".." in parts or "\0" in pattern:
        raise MonkeyError(
            f"--outputs {pattern!r}: give a glob relative to the job's folder, "
            "e.g. --outputs 'results/*.csv'"
        )
    return pattern


def default_name(argv: list[str]) -> str:
    """A readable name: the script or module a Python command runs, else the program."""
    first = Path(argv[0]).name
    if _PYTHONS.match(first):
        args = argv[1:]
        if "-m" in args and args.index("-m") + 1 < len(args):
            return args[args.index("-m") + 1]
        scripts = [a for a in args if a.endswith(".py")]
        if scripts and "-c" not in args:
            return Path(scripts[0]).stem
    return first


def job_targets(
    store: Store, owner: str, names: str | Iterable[str] | None, sweep: bool = False
) -> dict[str, str] | None:
    """`run --notify NAMES`: OWNER's targets for these jobs, name -> events (every ending
    of a job; for a sweep's jobs, failures and the sweep's end); MonkeyError for a name that
    is none of OWNER's targets."""
    if not names:
        return None
    words = [n.strip() for n in (names.split(",") if isinstance(names, str) else names)]
    known = {t["name"] for t in store.notify_targets(owner)}
    for word in words:
        if word not in known:
            raise MonkeyError(
                f"--notify {word}: you have no such target; add it with `monkey notify add "
                f"{word} ...` (see `monkey notify list`)"
            )
    from monkey.core.notifier import DEFAULT_EVENTS, JOB_EVENTS

    events = ",".join(DEFAULT_EVENTS) if sweep else JOB_EVENTS
    return {w: events for w in words if w}
