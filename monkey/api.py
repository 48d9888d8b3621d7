"""The Monkey facade: the one door for the shell, the dashboard and user scripts."""

from __future__ import annotations

import os
import platform
import re
import secrets as _secrets
import shlex
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from monkey.client_agent import rundir
from monkey.config import Home, ProviderConfig
from monkey.core.presence import absent_since
from monkey.drivers import driver_class, load_providers
from monkey.logfiles import LOGS, Follower, LogCursor
from monkey.models import (
    LIVE,
    REDACTED,
    TERMINAL,
    Attempt,
    MonkeyError,
    Request,
    Resources,
    State,
    dumps,
    is_secret,
    is_secret_name,  # noqa: F401 (the dashboard imports it from here)
    parse_duration,
    parse_size,
)
from monkey.models import Job as JobRecord
from monkey.rerun import RerunAPI
from monkey.store import Store
from monkey.store.errors import disk_full, is_no_space
from monkey.tracking.facade import TrackingAPI

# Variables that define the software environment a job was submitted from.
CAPTURED_ENV = (
    "PATH", "VIRTUAL_ENV", "CONDA_PREFIX", "CONDA_DEFAULT_ENV", "PYTHONPATH",
    "LD_LIBRARY_PATH", "CUDA_HOME",
)  # fmt: skip
MAX_RETRIES = 1000  # attempts of one job beyond the first; more is a typo, not a plan
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PYTHONS = re.compile(r"^python[0-9.]*$")


@dataclass
class Submission:
    """What the jobs of one submission share: ``fields`` for ``Store.create_jobs``, the
    job.yml's name, the secret environment values and, once written, their file's name."""

    name: str | None
    fields: dict[str, Any]
    secrets: dict[str, str]
    secrets_ref: str | None = None


class Job:
    """A handle on one job; its fields are read fresh from the store on each access."""

    def __init__(self, monkey: Monkey, juid: str) -> None:
        self.monkey = monkey
        self.juid = juid

    def __repr__(self) -> str:
        return f"<Job {self.juid} {self.status.value}>"

    @property
    def record(self) -> JobRecord:
        job = self.monkey.store.get_job(self.juid)
        assert job is not None
        return job

    @property
    def status(self) -> State:
        return self.record.state

    @property
    def exit_code(self) -> int | None:
        return self.record.exit_code

    def attempts(self) -> list[Attempt]:
        return self.monkey.store.attempts(self.juid)

    def wait(self, timeout: float | None = None, poll: float = 1.0) -> State:
        """Block until the job ends (a retry pending is not an end); return its state.

        Woken by each write to the store (see ``monkey.logfiles.Follower``), and at least
        every ``poll`` seconds. Keeps a core serving meanwhile (starting it again if it dies):
        without one the job would never end."""
        from monkey.core.daemon import Keeper

        keeper = Keeper(self.monkey.home)
        deadline = None if timeout is None else time.monotonic() + timeout
        follower = None
        try:
            while True:
                state = self.status
                if state in TERMINAL or state == State.PAUSED:
                    return state
                keeper.check()
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left < 0:
                    raise TimeoutError(f"job {self.juid} still {state.value} after {timeout}s")
                if follower is None:
                    follower = self.monkey.store_follower()
                    continue  # look again: a change before the watch began is not missed
                follower.wait(poll if left is None else min(poll, left))
        finally:
            if follower is not None:
                follower.close()

    def logs(self, stderr: bool = False, tail: int | None = None) -> str:
        """The job's output so far (all attempts), or its last ``tail`` lines."""
        return self.monkey.logs(self.juid, stderr=stderr, tail=tail).decode(errors="replace")

    def cancel(self) -> State:
        return self.monkey.cancel(self.juid)

    def rerun(self, **options: Any) -> Job:
        """Queue this job again from its record (see ``Monkey.rerun``)."""
        return self.monkey.rerun(self.juid, **options)


class Monkey(RerunAPI, TrackingAPI):
    """Submit, inspect and control jobs. Every UI goes through this class."""

    def __init__(self, home: str | os.PathLike[str] | Home | None = None) -> None:
        self.home = (home if isinstance(home, Home) else Home(home)).ensure()
        self.store = Store(self.home.db)
        self._providers: dict[str, ProviderConfig] | None = None
        self._providers_stamp: tuple[int, int] | None = None

    @property
    def providers(self) -> dict[str, ProviderConfig]:
        """providers.yml, read again when it changed (a long-lived Monkey sees `provider add`)."""
        try:
            st = self.home.providers_file.stat()
            stamp: tuple[int, int] | None = (st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            stamp = None
        if self._providers is None or stamp != self._providers_stamp:
            self._providers = load_providers(self.home)
            self._providers_stamp = stamp
        return self._providers

    # -- submit -------------------------------------------------------------------------

    def run(
        self,
        cmd: str | Sequence[str],
        *,
        provider: str = "local",
        name: str | None = None,
        cpus: int = 1,
        gpus: int = 0,
        memory: str | None = None,
        host: str | None = None,
        time: str | int | None = None,
        outputs: str | Iterable[str] = (),
        retries: int = 0,
        datasets: str | os.PathLike[str] | Iterable[str | os.PathLike[str]] = (),
        env: dict[str, str] | str | Iterable[str] | None = None,
        workdir: str | os.PathLike[str] | None = None,
        sweep: str | None = None,
        params: dict[str, Any] | None = None,
        start_core: bool = True,
        job_yml: str | os.PathLike[str] | bool | None = None,
        yes: bool = False,
    ) -> Job:
        """Snapshot the code and data, record the job, and wake the core. Returns at once.

        ``job_yml``: the job.yml to apply; None reads ``job.yml`` of the workdir when there is
        one, False ignores it. Arguments given here override the file. ``time``: the limit
        of each attempt, with its unit ("90s", "30m", "2h", "1d", "HH:MM:SS"; an int is
        seconds; a bare number as text is refused, as Slurm would read minutes); past it the
        job gets SIGTERM, then SIGKILL, and fails. ``yes``: store a working folder or dataset over 2 GB without
        asking (see `monkey.snapshot.snapshot_dir`)."""
        try:
            argv = shlex.split(cmd) if isinstance(cmd, str) else [str(a) for a in cmd]
        except ValueError as exc:
            raise MonkeyError(f"command {cmd!r}: {exc} (it is split as a shell would)") from None
        if not argv:
            raise MonkeyError("no command given; put it after `--`, e.g. monkey run -- python train.py")
        if any("\0" in arg for arg in argv):
            raise MonkeyError(f"command {argv!r} contains a NUL byte (\\0), which no program can "
                              "receive; remove it")
        if start_core:  # a socket folder that cannot be used refuses before anything is written
            self.home.socket_path("core")
        with self._blobs().lease():  # no gc deletes a blob the job counts on till it is recorded
            sub = self._submission(
                provider=provider, cpus=cpus, gpus=gpus, memory=memory, host=host, time=time,
                outputs=outputs, retries=retries, datasets=datasets, env=env, workdir=workdir,
                job_yml=job_yml, yes=yes,
            )  # fmt: skip
            if params is None and sweep is None:  # a plain run: the flags in its command
                from monkey.rerun import command_values

                params = command_values(argv)
            [juid] = self._record(sub, [(argv, name or sub.name or _default_name(argv), params or {})],
                                  sweep=sweep)  # fmt: skip
        if start_core:
            self.wake(queued=f"job {juid}")
        return Job(self, juid)

    def _submission(
        self,
        *,
        provider: str = "local",
        cpus: int = 1,
        gpus: int = 0,
        memory: str | None = None,
        host: str | None = None,
        time: str | int | None = None,
        outputs: str | Iterable[str] = (),
        retries: int = 0,
        datasets: str | os.PathLike[str] | Iterable[str | os.PathLike[str]] = (),
        env: dict[str, str] | str | Iterable[str] | None = None,
        workdir: str | os.PathLike[str] | None = None,
        job_yml: str | os.PathLike[str] | bool | None = None,
        yes: bool = False,
    ) -> Submission:
        """Check the options and store the code, data and environment the jobs of one
        submission share (done once for a whole sweep)."""
        from monkey import jobspec, snapshot

        resources = self._resources(provider, cpus, gpus, memory, host, time)
        # A lone string is one glob / one dataset, not a sequence of one-letter ones.
        outputs = [_check_output_glob(g) for g in ([outputs] if isinstance(outputs, str) else outputs)]
        one = isinstance(datasets, (str, os.PathLike))
        datasets = [os.fspath(d) for d in ([datasets] if one else datasets)]
        if not isinstance(retries, int) or not 0 <= retries <= MAX_RETRIES:
            raise MonkeyError(f"--retries must be a whole number from 0 to {MAX_RETRIES}, got {retries!r}")
        root = os.path.expanduser(workdir) if workdir else os.getcwd()
        job_file = jobspec.find(root) if job_yml is None else (Path(job_yml) if job_yml else None)
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
        plain_env, secret_env = self._split_env(env)
        blobs = self._blobs()
        # The job.yml stored with the code holds no env values: they reach the job as env.
        hidden = {os.path.relpath(js.file, js.code_root): js.redacted()} if js and js.env else {}
        snap = snapshot.snapshot_dir(folder, blobs, self.store, js.snapshot_ignore() if js else (),
                                     replace=hidden, yes=yes)
        new_blobs = list(snap.new_blobs)
        spec_record = None
        if js is not None:
            spec_record, spec_blobs = jobspec.resolve(
                js, snap.files, blobs, self.store, provider,
                driver_class(self.providers[provider].type).job_options)
            new_blobs += spec_blobs
        recorded_datasets = []
        seen: set[str] = set()
        for spec in datasets:
            ds = snapshot.dataset(spec, blobs, self.store, yes=yes)  # a path as typed: from the current folder
            if ds.name in seen:
                raise MonkeyError(f"two datasets are named {ds.name}; name them with PATH:NAME")
            seen.add(ds.name)
            new_blobs += ds.new_blobs
            recorded_datasets.append(
                {"name": ds.name, "digest": ds.digest, "single": ds.single, "size": ds.size,
                 "source": spec}
            )  # fmt: skip
        git, git_blobs = snapshot.git_info(folder, blobs, [str(js.file)] if hidden else ())
        if subdir:  # the job runs in this folder of its code (as `cd SUBDIR && CMD`)
            git = {**git, "subdir": subdir}
        new_blobs += git_blobs
        packages = self._packages(blobs)
        new_blobs.append(packages)
        return Submission(
            name=js.name if js is not None else None,
            fields={
                "provider": provider, "resources": resources,
                "env": {**plain_env, **{k: REDACTED for k in secret_env}},
                "snapshot": snap.digest, "workdir": folder.path,
                "datasets": recorded_datasets, "git": git, "python": platform.python_version(),
                "retries": retries, "blobs": self._blobs().stamped(new_blobs), "spec": spec_record,
                "outputs": outputs, "packages": packages[0],
            },
            secrets=secret_env,
        )  # fmt: skip

    def _record(self, sub: Submission, cells: list[tuple[list[str], str, dict[str, Any]]],
                **fields: Any) -> list[str]:
        """Record one job per (argv, name, params) cell in one transaction; the secret values
        go to a 0600 file first, removed again when nothing refers to it."""
        secrets_ref = sub.secrets_ref
        if sub.secrets and secrets_ref is None:
            secrets_ref = self._write_secrets(sub.secrets)
        try:
            juids = self.store.create_jobs(cells, secrets=secrets_ref, **sub.fields, **fields)
        except BaseException:
            if secrets_ref != sub.secrets_ref:
                (self.home.secrets / secrets_ref).unlink(missing_ok=True)
            raise
        sub.secrets_ref = secrets_ref
        return juids

    def _resources(self, provider: str, cpus: int, gpus: int, memory: str | None,
                   host: str | None = None, time: str | int | None = None) -> Resources:
        config = self.providers.get(provider)
        if config is None:
            names = ", ".join(sorted(self.providers))
            raise MonkeyError(
                f"unknown provider {provider!r}; configured: {names} (add it to {self.home.providers_file})"
            )
        for label, value, low in (("--cpus", cpus, 1), ("--gpus", gpus, 0)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise MonkeyError(f"{label} must be a whole number >= {low}, got {value!r}")
        if memory is not None:
            parse_size(memory)  # refuse "lots" now, not when placing
        resources = Resources(cpus=cpus, gpus=gpus, memory=memory, host=host,
                              time=parse_duration(time) if time is not None else None)
        why = driver_class(config.type).never_fits(config, resources)
        if why:
            raise MonkeyError(why)
        return resources

    @staticmethod
    def _split_env(env: dict[str, str] | str | Iterable[str] | None) -> tuple[dict[str, str], dict[str, str]]:
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
                raise MonkeyError(f"--env {key}: the value contains a NUL byte (\\0), which no "
                                  "program can receive; remove it")
        plain = {k: v for k in CAPTURED_ENV if (v := os.environ.get(k)) is not None}
        secret: dict[str, str] = {}
        for key, value in given.items():
            (secret if is_secret(key, value) else plain)[key] = value
        return plain, secret

    def _write_secrets(self, values: dict[str, str]) -> str:
        ref = _secrets.token_hex(16) + ".json"
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

    def wake(self, queued: str | None = None) -> None:
        """Tell the core there is work, starting it when it is not running; MonkeyError when
        it cannot start. QUEUED names what was just recorded (e.g. "job 26-11-21-001"), which
        stays queued for the core's next start, as the error says."""
        from monkey.core import daemon

        try:
            daemon.wake(self.home)
        except MonkeyError as exc:
            if queued is None:
                raise
            raise MonkeyError(f"{queued} is queued, but {exc}") from None

    # -- read ---------------------------------------------------------------------------

    def job(self, ref: str) -> Job:
        return Job(self, self.store.resolve(ref))

    def jobs(
        self,
        state: State | str | Iterable[State | str] | None = None,
        provider: str | None = None,
        limit: int | None = None,
    ) -> list[JobRecord]:
        """Job records, newest first."""
        states = None
        if state is not None:
            items = [state] if isinstance(state, (str, State)) else list(state)
            try:
                states = [State(s) for s in items]
            except ValueError:
                allowed = ", ".join(s.value for s in State)
                raise MonkeyError(f"unknown state in {items!r}; use one of {allowed}") from None
        return self.store.list_jobs(states=states, provider=provider, limit=limit)

    def info(self, ref: str) -> dict[str, Any]:
        """Everything known about a job: record, attempts, events."""
        juid = self.store.resolve(ref)
        job = self.store.get_job(juid)
        assert job is not None
        waiting = self.store.provider_error(job.provider) if job.state == State.QUEUED else None
        now = time.time()
        record = job.to_json()
        machines = self.store.instances(job.provider, live=job.state == State.QUEUED)
        absent = absent_since(self.home)
        return {
            **record,
            # No core: the states are as of ``since``, when the last one was last known to run.
            "core": {"running": absent is None, "since": absent or None},
            # How long the job's instance may stay out of reach before its attempt is lost.
            "lost_after": self._lost_after(job.provider) if job.unreachable_since else None,
            "rerun_of": self.store.rerun_of(juid),  # {"job", "changes"} or None
            "waiting": waiting,  # why a queued job's provider has no machine for it yet
            # What the provider says of the job's machine (a Slurm job id, its node list)...
            "instance_extra": next((m["extra"] for m in machines if m["id"] == record.get("instance")), None),
            # ... and of the machines still being made while it is queued (Slurm's pending reason).
            "pending_instances": [{"id": m["id"], **m["extra"]} for m in machines
                                  if job.state == State.QUEUED and m["state"] == "pending"],
            "checkpoint_dir": str(self.home.checkpoint_dir(juid)),
            "spec": self.store.job_spec(juid),
            # estimated $ (total, and the part spent on preempted/lost attempts); None: unknown
            "cost": self.costs([juid], now).get(juid),
            "attempts_detail": [{**a.as_dict(), "cost": a.cost(now)} for a in self.store.attempts(juid)],
            "events": self.store.events(juid),
            "last_output": self._last_output(job),
        }

    def _lost_after(self, provider: str) -> float:
        from monkey.drivers.base import LOST_AFTER, lost_after

        config = self.providers.get(provider)
        return (lost_after(config.options) if config else None) or LOST_AFTER

    def _last_output(self, job: JobRecord, lines: int = 10) -> dict[str, Any] | None:
        """For a job that did not succeed: its last ended attempt's number, why it ended and
        the last LINES lines it printed (stdout and stderr as written); else None."""
        if job.state in (State.SUCCEEDED, State.CANCELLED):
            return None
        ended = [a for a in self.store.attempts(job.juid) if a.ended_at and a.run_dir]
        if not ended or ended[-1].exit_code == 0:
            return None
        a = ended[-1]
        text = b"".join(self.output_chunks(job.juid, attempt=a.n, tail=lines, marks=False))
        return {"attempt": a.n, "reason": a.reason,
                "lines": text.decode(errors="replace").splitlines()}

    def monkey_instances(self, now: float | None = None, ended: bool = False) -> list[dict[str, Any]]:
        """The machines monkey created (of elastic providers) and has not seen terminated
        (with ENDED, the terminated ones too, each with ``ended``: why, as recorded): id,
        provider, state (the agent's reach once running), size, spot, address, the jobs live
        on it, age in seconds, estimated $/hour and $ spent so far (None: unknown)."""
        now = time.time() if now is None else now
        elastic = {name for name, cfg in self.providers.items() if driver_class(cfg.type).elastic}
        jobs: dict[str, list[str]] = {}
        for att in self.store.live_attempts():
            jobs.setdefault(att.instance, []).append(att.juid)
        out = []
        for row in self.store.instances(live=not ended):
            if row["provider"] not in elastic:
                continue
            launched = row["launched_at"]
            price = row["price"]
            state = row["reach"] if row["state"] == "running" and row["reach"] else row["state"]
            end = row["terminated_at"] or now
            out.append({
                "id": row["id"], "provider": row["provider"], "state": state,
                "size": row["size"], "spot": row["spot"], "address": row["address"],
                "jobs": jobs.get(row["id"], []), "age": None if launched is None else end - launched,
                "price": price,
                "cost": None if price is None or launched is None else price * (end - launched) / 3600,
            })  # fmt: skip
            if ended:
                events = self.store.instance_events(row["id"]) if row["state"] == "terminated" else []
                out[-1]["ended"] = events[-1]["detail"] if events else None
        return out

    # -- instances on request: `monkey create|delete instance` -----------------------------

    def create_instance(self, provider: str, size: str | None = None, spot: bool | None = None,
                        host: str | None = None, timeout: float = 300) -> dict[str, Any]:
        """Have the core create a cloud instance of PROVIDER (SIZE, SPOT: default the
        entry's), or claim an SSH host (HOST: default one not reached yet), before any job
        needs it; it then takes jobs and idles out as usual. The request as it ended
        (``instance``: its id); MonkeyError when it failed or is still under way."""
        config = self.providers.get(provider)
        if config is None:
            names = ", ".join(sorted(self.providers))
            raise MonkeyError(f"no provider {provider!r} (configured: {names}); add one with "
                              "`monkey provider add`")
        kind = driver_class(config.type)
        if kind.batches:
            raise MonkeyError(f"provider {provider!r} ({config.type}) gets one allocation per job "
                              "when it starts; there is no instance to create ahead")
        if not kind.elastic and config.type != "ssh":
            raise MonkeyError(f"provider {provider!r} ({config.type}) runs jobs on this machine; "
                              "there is no instance to create")
        if kind.elastic and host is not None:
            raise MonkeyError(f"--host is for SSH providers; {provider!r} ({config.type}) "
                              "creates its instances (use --size, --spot)")
        if not kind.elastic and (size is not None or spot is not None):
            raise MonkeyError(f"provider {provider!r} is a set of SSH hosts: --size and --spot "
                              "are for cloud providers (choose a host with --host)")
        rid = self.store.add_instance_request("create", provider, host, size, spot)
        return self._await_request(rid, f"creating an instance of {provider}", timeout)

    def delete_instance(self, ref: str, force: bool = False, timeout: float = 300) -> dict[str, Any]:
        """Have the core terminate a cloud instance, or release an SSH host (its agent stops
        once idle); REF is an instance id or a unique prefix. One that runs jobs only with
        FORCE (they end lost and are retried while retries remain)."""
        live = [r for r in self.store.instances(live=True) if r["provider"] in self.providers]
        found = [r for r in live if r["id"] == ref] or [r for r in live if r["id"].startswith(ref)]
        if len(found) != 1:
            known = ", ".join(r["id"] for r in live) or "none"
            why = "matches several instances" if found else "is no live instance"
            raise MonkeyError(f"{ref!r} {why} (live: {known}); see `monkey list providers`")
        row = found[0]
        rid = self.store.add_instance_request("delete", row["provider"], row["id"], force=force)
        return self._await_request(rid, f"deleting {row['id']}", timeout)

    def _await_request(self, rid: int, what: str, timeout: float) -> dict[str, Any]:
        """Wake the core and wait until it carried out request RID."""
        self.wake(f"{what} (request {rid})")
        deadline = time.monotonic() + timeout
        while True:
            req = self.store.instance_request(rid)
            assert req is not None
            if req["state"] == "done":
                return req
            if req["state"] == "failed":
                raise MonkeyError(f"{what}: {req['detail']}")
            if time.monotonic() > deadline:
                raise MonkeyError(f"{what}: still under way after {timeout:.0f}s; the core goes "
                                  "on with it (see `monkey list providers`)")
            time.sleep(0.1)

    def costs(self, juids: list[str], now: float | None = None) -> dict[str, Any]:
        """juid -> estimated cost ``{"total", "preempted"}`` in $, for jobs with any known."""
        from monkey.store.cost import job_costs

        return dict(job_costs(self.store.db, juids, time.time() if now is None else now))

    def log_paths(self, ref: str, stderr: bool = False, attempt: int | None = None,
                  setup: bool = False) -> list[Path]:
        """The job's log files, one per attempt, oldest first (``setup``: the set-up logs)."""
        juid = self.store.resolve(ref)
        name = rundir.SETUP_LOG if setup else rundir.STDERR if stderr else rundir.STDOUT
        attempts = self.store.attempts(juid)
        if attempt is not None:
            attempts = [a for a in attempts if a.n == attempt]
            if not attempts:
                raise MonkeyError(f"job {juid} has no attempt {attempt}")
        return [self.home.run_dir(juid, a.n) / name for a in attempts if a.run_dir]

    def log_chunks(self, ref: str, stderr: bool = False, attempt: int | None = None,
                   tail: int | None = None, setup: bool = False) -> Iterator[bytes]:
        """The job's output so far, attempts oldest first, in pieces of at most 1 MB; with
        ``tail``, only its last ``tail`` lines (found from the end: a huge log costs nothing)."""
        paths = self.log_paths(ref, stderr, attempt, setup)
        cursor = LogCursor()
        if tail is not None:
            cursor.skip_to_tail(paths, tail)
        return (piece for _, _, piece in cursor.read(paths))

    def logs(self, ref: str, stderr: bool = False, attempt: int | None = None,
             tail: int | None = None) -> bytes:
        """The job's output so far, all attempts (or one), or its last ``tail`` lines."""
        return b"".join(self.log_chunks(ref, stderr, attempt, tail))

    def setup_logs(self, ref: str, attempt: int | None = None) -> bytes:
        """What preparing the job's environment printed (job.yml `run`), all attempts."""
        return b"".join(self.log_chunks(ref, attempt=attempt, setup=True))

    def persisted(self, ref: str) -> list[tuple[str, Path]]:
        """The job's last saved persisted folders (job.yml `persist`) as (path, saved copy)."""
        juid = self.store.resolve(ref)
        base = self.home.checkpoint_dir(juid).parent / "persist"
        spec = self.store.job_spec(juid) or {}
        return [(p["path"], base / p["name"]) for p in spec.get("persist", [])
                if (base / p["name"]).is_dir()]

    def output_chunks(self, ref: str, stream: str = "both", attempt: int | None = None,
                      tail: int | None = None, setup: bool = False,
                      marks: bool = True) -> Iterator[bytes]:
        """What the job printed so far, attempts oldest first, each marked when it has several
        (``── attempt 2 on HOST, after preempted ──``): stdout and stderr in the order they
        were written (``stream`` "stdout" or "stderr": one of them; ``setup``: the set-up
        log instead); with ``tail``, only the last ``tail`` lines of it all, unmarked."""
        from monkey.logfiles import interleaved, read_segments, tail_segments

        juid = self.store.resolve(ref)
        attempts = [a for a in self.store.attempts(juid) if a.run_dir]
        shown = attempts if attempt is None else [a for a in attempts if a.n == attempt]
        if attempt is not None and not shown:
            raise MonkeyError(f"job {juid} has no attempt {attempt}")
        pieces = []
        for a in shown:
            folder = self.home.run_dir(juid, a.n)
            if setup or stream != "both":
                path = folder / (rundir.SETUP_LOG if setup else rundir.stream_log(stream))
                size = path.stat().st_size if path.exists() else 0
                segments = [(path, 0, size)] if size else []
            else:
                segments = interleaved(folder / rundir.STDOUT, folder / rundir.STDERR,
                                       folder / rundir.ORDER)
            pieces += [(a.n, seg) for seg in segments] or ([(a.n, None)] if tail is None and not setup else [])
        if tail is not None:
            kept = tail_segments([seg for _, seg in pieces], tail)
            pieces = [(n, seg) for (n, _), seg in zip(pieces[len(pieces) - len(kept):], kept)]
        marked = None
        for n, seg in pieces:
            if marks and tail is None and len(shown) > 1 and n != marked:
                marked = n
                yield self._attempt_mark(attempts, n)
            if seg is not None:
                yield from read_segments([seg])

    @staticmethod
    def _attempt_mark(attempts: list[Attempt], n: int) -> bytes:
        """The line that starts attempt N's output: ``── attempt 2 on HOST, after preempted ──``."""
        i = next(i for i, a in enumerate(attempts) if a.n == n)
        after = attempts[i - 1].reason if i else None
        return (f"── attempt {n} on {attempts[i].instance}" + (f", after {after}" if after else "")
                + " ──\n").encode()

    def store_follower(self) -> Follower:
        """A ``Follower`` woken by every write to the store (a job's state changed)."""
        follower = Follower()
        follower.watch(self.home.db.parent, (self.home.db.name, f"{self.home.db.name}-wal"))
        return follower

    def follow(self, ref: str, stderr: bool = False, tail: int | None = None,
               poll: float = 1.0, stream: str | None = None) -> Iterator[bytes]:
        """Yield the job's output as it is written, across attempts, until the job ends;
        with ``tail``, start from its last ``tail`` lines. ``stream`` "both" follows the
        set-up log, stdout and stderr together (each attempt after the first marked);
        "stdout" or "stderr" one of them (default: ``stderr`` picks).

        Woken by writes to the job's run folder and to the store (``monkey.logfiles.Follower``:
        inotify, no CPU while nothing is written), and at least every ``poll`` seconds. Keeps
        a core serving meanwhile (starting it again if it dies): without one the job would
        never end."""
        from monkey.core.daemon import Keeper

        stream = stream or ("stderr" if stderr else "stdout")
        names = LOGS if stream == "both" else (rundir.stream_log(stream),)
        juid = self.store.resolve(ref)
        keeper = Keeper(self.home)
        cursor = LogCursor()

        def paths(attempts: list[Attempt]) -> list[Path]:
            return [self.home.run_dir(juid, a.n) / name for a in attempts for name in names]

        marked = {1}
        if tail is not None:
            attempts = [a for a in self.store.attempts(juid) if a.run_dir]
            cursor.skip_to_tail(paths(attempts), tail)
            marked.update(a.n for a in attempts)
        follower = None
        try:
            while True:
                job = self.store.get_job(juid)
                assert job is not None
                # Read after looking at the state, so output written before the end is never
                # missed.
                finished = job.state in TERMINAL or job.state == State.PAUSED
                if not finished:
                    keeper.check()
                attempts = [a for a in self.store.attempts(juid) if a.run_dir]
                for a in attempts:
                    if a.n not in marked and stream == "both":
                        marked.add(a.n)
                        yield self._attempt_mark(attempts, a.n)
                    for _, _, piece in cursor.read(paths([a])):
                        yield piece
                if finished:
                    return
                if follower is None:  # only a follow that has to wait pays for watchdog
                    follower = self.store_follower()
                    continue  # read again: a write before the watch began is not missed
                if follower.watch(self.home.runs / juid, LOGS, recursive=True):  # once it exists
                    continue  # read again before waiting, as above
                follower.wait(poll)
        finally:
            if follower is not None:
                follower.close()

    # -- dashboard ----------------------------------------------------------------------

    def search(self, text: str, limit: int = 50) -> list[dict[str, Any]]:
        """Jobs whose command or output holds TEXT, newest first (see monkey.search)."""
        from monkey.search import search

        return search(self.home, self.store, text, limit)

    def jobs_changed(self, since: float) -> list[JobRecord]:
        """Jobs whose record changed at or after ``since`` (epoch seconds), newest first."""
        return self.store.jobs_updated_since(since)

    def latest_metrics(self, refs: list[str]) -> dict[str, dict[str, float | None]]:
        """Job id -> metric name -> its last logged value, for the given job ids."""
        return self.store.latest_metric_values(refs)

    def live_attempts(self) -> list[dict[str, Any]]:
        """Live attempts with their job, instance and last heartbeat CPU (%) and RSS (bytes)."""
        return self.store.live_attempt_figures()

    def instances(self) -> list[dict[str, Any]]:
        """Instances the core has recorded (id, provider, kind, host, state, extra)."""
        return self.store.instances()

    def core_status(self) -> int | None:
        """PID of the core serving this MONKEY_HOME, or None when it is down."""
        from monkey.core import daemon

        return daemon.status(self.home)

    def start_core(self) -> int:
        """Start the core in the background (when it is down); returns its PID."""
        from monkey.core import daemon

        return daemon.start(self.home)

    # -- control ------------------------------------------------------------------------

    def _control(self, ref: str, request: Request) -> State:
        juid = self.store.resolve(ref)
        target = State.CANCELLED if request == Request.CANCEL else State.PAUSED
        for _ in range(20):
            job = self.store.get_job(juid)
            assert job is not None
            if job.state in (State.QUEUED, State.PAUSED):
                if job.state == target:
                    return target
                if self.store.transition(juid, job.state, target, kind="user",
                                         detail=request.value):
                    return target
            elif job.state in LIVE:
                if self.store.set_request(juid, request.value, LIVE):
                    self.wake()
                    return job.state
            else:
                raise MonkeyError(
                    f"job {juid} already {job.state.value}; nothing to {request.value}"
                )
        raise MonkeyError(f"job {juid} kept changing state; try again")

    def cancel(self, ref: str) -> State:
        """Cancel a job: queued/paused at once; running gets SIGTERM, then SIGKILL."""
        return self._control(ref, Request.CANCEL)

    def pause(self, ref: str) -> State:
        """Hold a queued job, or stop a running one gracefully and hold it."""
        return self._control(ref, Request.PAUSE)

    def resume(self, ref: str) -> State:
        """Re-queue a paused job; it continues from its checkpoint directory."""
        juid = self.store.resolve(ref)
        job = self.store.get_job(juid)
        assert job is not None
        if job.state != State.PAUSED:
            raise MonkeyError(f"job {juid} is {job.state.value}, not paused; only paused jobs resume")
        if not self.store.transition(juid, State.PAUSED, State.QUEUED, kind="user",
                                     detail="resume", not_before=0.0, request=None):
            raise MonkeyError(f"job {juid} changed state meanwhile; try again")
        self.wake()
        return State.QUEUED

    def retry(self, ref: str) -> State:
        """Re-queue a finished job as a new attempt (its checkpoint directory is kept)."""
        juid = self.store.resolve(ref)
        job = self.store.get_job(juid)
        assert job is not None
        if job.state not in TERMINAL:
            raise MonkeyError(
                f"job {juid} is {job.state.value}; only finished jobs can be retried"
                + (" (resume paused ones)" if job.state == State.PAUSED else "")
            )
        if not self.store.transition(juid, job.state, State.QUEUED, kind="user", detail="retry",
                                     not_before=0.0, request=None):
            raise MonkeyError(f"job {juid} changed state meanwhile; try again")
        self.wake()
        return State.QUEUED


def _check_output_glob(pattern: str) -> str:
    """An --outputs glob, refused when it could reach outside the job's folder."""
    parts = pattern.split("/")
    if not pattern or pattern.startswith("/") or ".." in parts or "\0" in pattern:
        raise MonkeyError(f"--outputs {pattern!r}: give a glob relative to the job's folder, "
                          "e.g. --outputs 'results/*.csv'")
    return pattern


def _default_name(argv: list[str]) -> str:
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
