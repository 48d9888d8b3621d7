"""The Monkey facade: the one door for the shell, the dashboard and user scripts."""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from monkey.config import Home, ProviderConfig
from monkey.delegation import Later, to
from monkey.drivers import load_providers
from monkey.handles import Job
from monkey.models import (
    LIVE,
    REDACTED,  # noqa: F401 (the dashboard imports it from here)
    TERMINAL,
    MonkeyError,
    Request,
    State,
    is_secret_name,  # noqa: F401 (the dashboard imports it from here)
)
from monkey.models import Job as JobRecord
from monkey.store import Store
from monkey.submit import Submitter, check_priority, default_name, parse_command, wake

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from monkey.contract import Api
    from monkey.facade.disk import Disk
    from monkey.facade.logs import Logs
    from monkey.facade.notes import Notes
    from monkey.facade.providers import Providers
    from monkey.facade.records import Records
    from monkey.facade.tracking import Sweeps, Tracking
    from monkey.rerun import Reruns
    from monkey.snapshot.blobs import BlobStore

    def _conforms(m: Monkey) -> Api:
        return m  # mypy checks that Monkey implements the contract


if not TYPE_CHECKING:  # mypy sees the classes themselves (imported above)
    Disk = Later("monkey.facade.disk", "Disk")
    Logs = Later("monkey.facade.logs", "Logs")
    Notes = Later("monkey.facade.notes", "Notes")
    Providers = Later("monkey.facade.providers", "Providers")
    Records = Later("monkey.facade.records", "Records")
    Sweeps = Later("monkey.facade.tracking", "Sweeps")
    Tracking = Later("monkey.facade.tracking", "Tracking")
    Reruns = Later("monkey.rerun", "Reruns")


def _states(items: list[State | str]) -> list[State]:
    """ITEMS as states; MonkeyError naming the states there are."""
    try:
        return [State(s) for s in items]
    except ValueError:
        allowed = ", ".join(s.value for s in State)
        raise MonkeyError(f"unknown state in {items!r}; use one of {allowed}") from None


class Monkey:
    """Submit, inspect and control jobs. Every UI goes through this class.

    ``Monkey(remote="lab")``, or ``Monkey()`` with MONKEY_REMOTE=lab, is the main node
    ``lab``'s facade instead (``monkey.remote.facade.RemoteMonkey``: the same methods, the
    jobs run there); ``Monkey(HOME)`` is always the MONKEY_HOME HOME of this machine."""

    def __new__(
        cls, home: str | os.PathLike[str] | Home | None = None, remote: str | None = None
    ) -> Monkey:
        if remote is None and home is None:
            remote = os.environ.get("MONKEY_REMOTE") or None
        if remote is not None and remote != "local" and cls is Monkey:
            if home is not None:
                raise MonkeyError("give Monkey a home (this machine) or a remote, not both")
            from monkey.remote.facade import RemoteMonkey

            return RemoteMonkey(remote)  # type: ignore[return-value]  # the same methods
        return super().__new__(cls)

    def __init__(
        self, home: str | os.PathLike[str] | Home | None = None, remote: str | None = None
    ) -> None:
        home = (home if isinstance(home, Home) else Home(home)).ensure()
        self._assemble(home, Store(home.db), None)

    def _assemble(self, home: Home, store: Store, owner: str | None) -> None:
        self.home = home
        self.store = store
        self._providers: dict[str, ProviderConfig] | None = None
        self._providers_stamp: tuple[int, int] | None = None
        # The parts it delegates to: one submission path for run, sweep and rerun; the
        # others made when first used (properties below).
        self._submitter = Submitter(self.home, self.store, lambda: self.providers, owner)

    # The parts wake the core through Monkey.wake, looked up when they call it.
    @functools.cached_property
    def _reruns(self) -> Reruns:
        from monkey.rerun import Reruns

        return Reruns(self.home, self.store, self._submitter, lambda queued: self.wake(queued))

    @functools.cached_property
    def _sweeps(self) -> Sweeps:
        from monkey.facade.tracking import Sweeps

        return Sweeps(
            self.home, self.store, self._submitter, self._control, lambda queued: self.wake(queued)
        )

    @functools.cached_property
    def _tracking(self) -> Tracking:
        from monkey.facade.tracking import Tracking

        return Tracking(self.home, self.store, self._sweeps)

    @functools.cached_property
    def _disk(self) -> Disk:
        from monkey.facade.disk import Disk

        return Disk(self)

    @functools.cached_property
    def _logs(self) -> Logs:
        from monkey.facade.logs import Logs

        return Logs(self.home, self.store)

    @functools.cached_property
    def _providers_part(self) -> Providers:
        from monkey.facade.providers import Providers

        return Providers(self.home, self.store, lambda: self.providers)

    @functools.cached_property
    def _records(self) -> Records:
        from monkey.facade.records import Records

        return Records(self.store)

    @functools.cached_property
    def _notes(self) -> Notes:
        from monkey.facade.notes import Notes

        return Notes(self.store, self.acting_user)

    def acting_for(self, user: str) -> Monkey:
        """This facade acting for USER (what `monkey server` does for each call): the same
        home and database connection, but what it submits is USER's and the events of the
        jobs it steers name USER. The caller is fixed here, never set on a shared facade."""
        view = object.__new__(type(self))
        view._assemble(self.home, self.store, user)
        view._providers, view._providers_stamp = self._providers, self._providers_stamp
        return view

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

    @property
    def actor(self) -> str | None:
        """Who acts through this facade (``acting_for``): the owner of the jobs it submits,
        named in the events of the jobs it steers. None: this machine's user."""
        return self._submitter.owner

    def close(self) -> None:
        """Release this facade's database connection (a facade made for one thread)."""
        self.store.close()

    def empty_snapshot(self, blobs: BlobStore) -> str:
        """The digest of a snapshot of no files, stored in BLOBS: the code of a job from
        Monkey Web that names none."""
        import tempfile

        from monkey.snapshot.manifest import snapshot_dir

        with tempfile.TemporaryDirectory(prefix="monkey-web-") as empty:
            return snapshot_dir(Path(empty), blobs, self.store).digest

    def packages_listing(self, blobs: BlobStore) -> tuple[str, int]:
        """(digest, size) of this Python's installed packages, stored in BLOBS: what a job
        submitted here without its own listing (Monkey Web's new job) records."""
        return self._submitter.packages(blobs)

    # -- submit -------------------------------------------------------------------------

    def provider_kind(
        self,
        provider: str = "local",
        cpus: int = 1,
        gpus: int = 0,
        memory: str | None = None,
        host: str | None = None,
        time: str | int | None = None,
    ) -> str:
        """The kind of PROVIDER (its driver type), once resources like these fit it
        (MonkeyError naming why not): what a client needs to gather a submission."""
        chosen = self._submitter.placed(provider, cpus, gpus, memory, host, time)[0]
        return self.providers[chosen].type

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
        image: str | None = None,
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
        gathered: dict[str, Any] | None = None,
        after: str | Iterable[str] | None = None,
        after_any: str | Iterable[str] | None = None,
        priority: int = 0,
        notify: str | Iterable[str] | None = None,
    ) -> Job:
        """Snapshot the code and data, record the job, and wake the core. Returns at once.

        ``job_yml``: the job.yml to apply; None reads ``job.yml`` of the workdir when there is
        one, False ignores it. Arguments given here override the file. ``time``: the limit
        of each attempt, with its unit ("90s", "30m", "2h", "1d", "HH:MM:SS"; an int is
        seconds; a bare number as text is refused, as Slurm would read minutes); past it the
        job gets SIGTERM, then SIGKILL, and fails. ``yes``: store a working folder or dataset over 2 GB without
        asking (see `monkey.snapshot.snapshot_dir`). ``gathered``: what a client gathered
        on its machine instead of this machine's workdir, datasets and env (a main node's
        API, see ``Submitter.accept``). ``after``: jobs (ids, prefixes, `last`, or sweeps: all
        their jobs) that must succeed before this one starts; if one ends otherwise, this one
        is cancelled. ``after_any``: jobs that must end, however they end. ``priority``:
        higher starts first among queued jobs (default 0; FIFO within a priority).
        ``notify``: your `monkey notify` targets (names) told of each ending of this job,
        whatever their rules. ``image``: an OCI image the job runs in (over the job.yml's
        `image:`), pinned to its digest now: `info` shows both, a rerun uses the digest."""
        argv = parse_command(cmd)
        deps = self._submitter.dependencies(after, after_any)
        targets = None
        if notify:
            from monkey.submit import job_targets

            targets = job_targets(self.store, self.acting_user(), notify)
        if start_core:  # a socket folder that cannot be used refuses before anything is written
            self.home.socket_path("core")
        with (
            self._submitter.blobs().lease()
        ):  # no gc deletes a blob the job counts on till it is recorded
            sub = self._submitter.prepare(
                provider=provider,
                cpus=cpus,
                gpus=gpus,
                memory=memory,
                host=host,
                time=time,
                image=image,
                outputs=outputs,
                retries=retries,
                datasets=datasets,
                env=env,
                workdir=workdir,
                job_yml=job_yml,
                yes=yes,
                gathered=gathered,
            )
            if params is None and sweep is None:  # a plain run: the flags in its command
                from monkey.params import command_values

                params = command_values(argv)
            [juid] = self._submitter.record(
                sub,
                [(argv, name or sub.name or default_name(argv), params or {})],
                sweep=sweep,
                after=deps,
                priority=check_priority(priority),
                notify=targets,
            )
        if start_core:
            self.wake(queued=f"job {juid}")
        return Job(self, juid)

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
    ) -> Job:
        """Queue job REF again from its record alone: the same code, data, job.yml, env and
        command, with parameters rewritten by ``set`` ({"lr": 0.2} or ["lr=0.2"]) and
        optionally another provider or resources (``time``: the time limit, as ``run``'s;
        ``after``, ``after_any``, ``priority`` as ``run``'s). Returns the new job at once (see
        ``monkey.rerun``)."""
        return Job(
            self,
            self._reruns.rerun(
                ref,
                set=set,
                provider=provider,
                cpus=cpus,
                gpus=gpus,
                memory=memory,
                time=time,
                name=name,
                start_core=start_core,
                after=after,
                after_any=after_any,
                priority=priority,
                notify=notify,
            ),
        )

    # Delegated: reruns of sweeps and the code as a job saw it (``monkey.rerun.Reruns``),
    # sweeps (``monkey.facade.tracking.Sweeps``), metrics, comparisons, plots, reports and
    # exports (``monkey.facade.tracking.Tracking``).
    rerun_sweep = to("_reruns", Reruns.rerun_sweep)
    files = to("_reruns", Reruns.files)
    cat = to("_reruns", Reruns.cat)
    code_blob = to("_reruns", Reruns.code_blob)
    clone = to("_reruns", Reruns.clone)
    sweep = to("_sweeps", Sweeps.sweep)
    sweeps = to("_sweeps", Sweeps.sweeps)
    sweep_status = to("_sweeps", Sweeps.sweep_status)
    sweep_control = to("_sweeps", Sweeps.sweep_control)
    metrics = to("_tracking", Tracking.metrics)
    metric_names = to("_tracking", Tracking.metric_names)
    compare = to("_tracking", Tracking.compare)
    diff = to("_tracking", Tracking.diff)
    plot = to("_tracking", Tracking.plot)
    plot_data = to("_tracking", Tracking.plot_data)
    chart_data = to("_tracking", Tracking.chart_data)
    sweep_analysis = to("_tracking", Tracking.sweep_analysis)
    report = to("_tracking", Tracking.report)
    report_data = to("_tracking", Tracking.report_data)
    select_jobs = to("_tracking", Tracking.select_jobs)
    export = to("_tracking", Tracking.export)
    export_jobs = to("_tracking", Tracking.export_jobs)
    export_rows = to("_tracking", Tracking.export_rows)
    note = to("_notes", Notes.note)
    tag = to("_notes", Notes.tag)
    sweep_note = to("_notes", Notes.sweep_note)
    sweep_tag = to("_notes", Notes.sweep_tag)
    rm_select = to("_disk", Disk.rm_select)
    rm = to("_disk", Disk.rm)
    gc = to("_disk", Disk.gc)
    du = to("_disk", Disk.du)
    du_hosts = to("_disk", Disk.du_hosts)
    verify = to("_disk", Disk.verify)

    def _blobs(self) -> BlobStore:
        """The blob store of this MONKEY_HOME (one per Monkey: it keeps its real path)."""
        return self._submitter.blobs()

    def wake(self, queued: str | None = None) -> None:
        """Tell the core there is work, starting it when it is not running (see
        ``monkey.submit.wake``)."""
        wake(self.home, queued)

    # -- read ---------------------------------------------------------------------------

    def job(self, ref: str) -> Job:
        return Job(self, self.store.resolve(ref))

    def resolve(self, ref: str) -> str:
        """The full id of job REF (an id, a unique prefix, or `last`)."""
        return self.store.resolve(ref)

    def get_job(self, ref: str) -> JobRecord:
        """Job REF's record as it is now."""
        job = self.store.get_job(self.store.resolve(ref))
        assert job is not None
        return job

    def job_listing(
        self,
        states: Iterable[State | str] | None = None,
        provider: str | None = None,
        limit: int | None = None,
        owners: bool = False,
        owner: str | None = None,
        mine: bool = False,
        tag: str | None = None,
    ) -> dict[str, Any]:
        """What `monkey list jobs` shows (see ``monkey.facade.listing.job_listing``): only
        OWNER's jobs, or with MINE the acting user's; only those tagged TAG."""
        from monkey.facade.listing import job_listing

        return job_listing(
            self.home,
            self.store,
            None if states is None else _states(list(states)),
            provider,
            limit,
            owners,
            self.acting_user() if mine else owner,
            tag,
        )

    def acting_user(self) -> str:
        """Who acts through this facade: ``actor``, or this machine's user."""
        return self._submitter.acting_user()

    def jobs(
        self,
        state: State | str | Iterable[State | str] | None = None,
        provider: str | None = None,
        limit: int | None = None,
    ) -> list[JobRecord]:
        """Job records, newest first."""
        states = None
        if state is not None:
            states = _states([state] if isinstance(state, (str, State)) else list(state))
        return self.store.list_jobs(states=states, provider=provider, limit=limit)

    def info(self, ref: str, metrics: bool = True) -> dict[str, Any]:
        """Everything known about a job: record, attempts, events; its metrics' summary
        unless not METRICS (a scan of every point: a second per million)."""
        juid = self.store.resolve(ref)
        job = self.store.get_job(juid)
        assert job is not None
        held = job.held  # a quota's reason, while queued
        waiting = self.store.provider_error(job.provider) if job.state == State.QUEUED else None
        waiting = "; ".join(w for w in (held, waiting) if w) or None
        now = time.time()
        record = job.to_json()
        machines = self.store.instances(job.provider, live=job.state == State.QUEUED)
        after = self.store.dependencies(juid)
        attempts = self.store.attempts(juid)
        from monkey.facade.waiting import tries, why_waiting

        try:
            config = self.providers.get(job.provider)
        except MonkeyError:  # a broken providers.yml: the capacity is not known
            config = None
        from monkey.core.presence import absent_since

        absent = absent_since(self.home)
        return {
            **record,
            # No core: the states are as of ``since``, when the last one was last known to run.
            "core": {"running": absent is None, "since": absent or None},
            # How long the job's instance may stay out of reach before its attempt is lost.
            "lost_after": self._lost_after(job.provider) if job.unreachable_since else None,
            "owner": self.store.job_owners([juid]).get(juid),  # who submitted it
            "rerun_of": self.store.rerun_of(juid),  # {"job", "changes"} or None
            "waiting": waiting,  # why a queued job's provider has no machine for it yet
            "held": held,  # why a quota holds it back ("over quota: ..."), or None
            # the jobs it runs after: [{"job", "any", "state", "met"}] (see Store.dependencies)
            "after": after,
            # the state as `list jobs` shows it (waiting, over quota, pulling, unreachable)
            "shown_state": job.shown_state,
            # why a queued job has not started, each reason as `info job` says it (see
            # monkey.facade.waiting.why_waiting)
            "why": why_waiting(self.store, job, config, after, now),
            **tries(attempts),  # "tries" that started, and attempts that "never_started"
            # What the provider says of the job's machine (a Slurm job id, its node list)...
            "instance_extra": next(
                (m["extra"] for m in machines if m["id"] == record.get("instance")), None
            ),
            # ... and of the machines still being made while it is queued (Slurm's pending reason).
            "pending_instances": [
                {"id": m["id"], **m["extra"]}
                for m in machines
                if job.state == State.QUEUED and m["state"] == "pending"
            ],
            "checkpoint_dir": str(self.home.checkpoint_dir(juid)),
            "spec": self.store.job_spec(juid),
            "image": self.store.job_image(juid),  # {"ref", "digest"}: pinned at submission
            # a researcher's note ({"text", "at", "by"} or None) and tags
            "note": self.store.note_of("job", juid),
            "tags": self.store.tags_of("job", [juid]).get(juid, []),
            # estimated $ (total, and the part spent on preempted/lost attempts); None: unknown
            "cost": self.costs([juid], now).get(juid),
            "attempts_detail": [{**a.as_dict(), "cost": a.cost(now)} for a in attempts],
            "events": self.store.events(juid),
            "last_output": self._last_output(job),
            # its `monkey notify` messages: [{"id", "target", "what", "state", "tries",
            # "last_error", "sent_at"}] (see Store.job_deliveries)
            "notifications": self.store.job_deliveries(juid),
            # each metric it logged (system series left out): last value and step, the best
            # (its sweep's goal, else guessed from the name: `loss` is minimised) and count
            "metrics": self._metric_summary(job) if metrics else {},
        }

    def checkpoints(self, ref: str) -> dict[str, Any]:
        """The files of job REF's checkpoint_dir(): {"files": [{"path", "size", "mtime"}]
        newest first (the first 200), "count", "bytes"}."""
        from monkey.facade.checkpoints import checkpoint_files

        return checkpoint_files(self.home.checkpoint_dir(self.store.resolve(ref)))

    def _metric_summary(self, job: JobRecord) -> dict[str, dict[str, Any]]:
        from monkey.tracking.compare import goal_of

        goals: dict[str, str] = {}
        if job.sweep:
            metric = (self.store.get_sweep(job.sweep) or {}).get("spec", {}).get("metric") or {}
            if metric.get("name") and metric.get("goal"):
                goals[metric["name"]] = metric["goal"]
        stats = self.store.metric_stats([job.juid])[job.juid]
        out = {}
        for name, st in sorted(stats.items()):
            if name.startswith("sys/"):
                continue
            goal = goal_of(name, goals)
            out[name] = {**st, "goal": goal, "best": st["min"] if goal == "min" else st["max"]}
        return out

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
        return {
            "attempt": a.n,
            "reason": a.reason,
            "lines": text.decode(errors="replace").splitlines(),
        }

    provider_status = to("_providers_part", Providers.provider_status)
    quotas = to("_providers_part", Providers.quotas)
    set_quota = to("_providers_part", Providers.set_quota)
    remove_quota = to("_providers_part", Providers.remove_quota)
    check_provider = to("_providers_part", Providers.check_provider)
    monkey_instances = to("_providers_part", Providers.monkey_instances)
    create_instance = to("_providers_part", Providers.create_instance)
    delete_instance = to("_providers_part", Providers.delete_instance)
    # what Monkey Web and the server read beyond the contract's calls (monkey.facade.records)
    job_spec = to("_records", Records.job_spec)
    job_outputs = to("_records", Records.job_outputs)
    job_packages = to("_records", Records.job_packages)
    attempts = to("_records", Records.attempts)
    carries_secrets = to("_records", Records.carries_secrets)
    runtimes = to("_records", Records.runtimes)
    last_job_change = to("_records", Records.last_job_change)
    sweep_id = to("_records", Records.sweep_id)
    metric_series = to("_records", Records.metric_series)
    jobs_table = to("_records", Records.jobs_table)
    annotations = to("_notes", Notes.annotations)
    sweep_jobs = to("_records", Records.sweep_jobs)
    sweep_owners = to("_records", Records.sweep_owners)
    users = to("_records", Records.users)
    user = to("_records", Records.user)
    touch_user = to("_records", Records.touch_user)
    record_uploads = to("_records", Records.record_uploads)
    storage_room = to("_records", Records.storage_room)
    user_count = to("_records", Records.user_count)

    def costs(self, juids: list[str], now: float | None = None) -> dict[str, Any]:
        """juid -> estimated cost ``{"total", "preempted"}`` in $, for jobs with any known."""
        from monkey.store.cost import job_costs

        return dict(job_costs(self.store.db, juids, time.time() if now is None else now))

    def job_owners(self, juids: list[str]) -> dict[str, str | None]:
        """juid -> who submitted it (None: not recorded), for the jobs of JUIDS (full ids)."""
        return self.store.job_owners(juids)

    def persisted(self, ref: str) -> list[tuple[str, Path]]:
        """The job's last saved persisted folders (job.yml `persist`) as (path, saved copy)."""
        from monkey.client_agent import rundir
        from monkey.specrecord import persisted_names

        juid = self.store.resolve(ref)
        job_dir = str(self.home.runs / juid)
        found = [
            (path, rundir.saved_folder(job_dir, name))
            for path, name in persisted_names(self.store.job_spec(juid))
        ]
        return [(path, Path(copy)) for path, copy in found if copy is not None]

    log_paths = to("_logs", Logs.log_paths)
    log_chunks = to("_logs", Logs.log_chunks)
    logs = to("_logs", Logs.logs)
    setup_logs = to("_logs", Logs.setup_logs)
    output_chunks = to("_logs", Logs.output_chunks)
    store_follower = to("_logs", Logs.store_follower)
    follow = to("_logs", Logs.follow)
    follow_pieces = to("_logs", Logs.follow_pieces)

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
                if self.store.transition(
                    juid,
                    job.state,
                    target,
                    kind="user",
                    detail=request.value,
                    actor=self.acting_user(),
                ):
                    return target
            elif job.state in LIVE:
                if self.store.set_request(juid, request.value, LIVE, actor=self.acting_user()):
                    self.wake()
                    return job.state
            else:
                raise MonkeyError(
                    f"job {juid} already {job.state.value}; nothing to {request.value}"
                )
        raise MonkeyError(f"job {juid} kept changing state; try again")

    def set_priority(self, ref: str, priority: int) -> int:
        """Change queued or paused job REF's priority (higher starts first); returns it."""
        juid = self.store.resolve(ref)
        if not self.store.set_priority(juid, check_priority(priority), actor=self.acting_user()):
            job = self.store.get_job(juid)
            assert job is not None
            raise MonkeyError(
                f"job {juid} is {job.state.value}; only queued or paused jobs change priority"
            )
        return priority

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
            raise MonkeyError(
                f"job {juid} is {job.state.value}, not paused; only paused jobs resume"
            )
        if not self.store.transition(
            juid,
            State.PAUSED,
            State.QUEUED,
            kind="user",
            detail="resume",
            not_before=0.0,
            request=None,
            actor=self.acting_user(),
        ):
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
        if not self.store.transition(
            juid,
            job.state,
            State.QUEUED,
            kind="user",
            detail="retry",
            not_before=0.0,
            request=None,
            actor=self.acting_user(),
        ):
            raise MonkeyError(f"job {juid} changed state meanwhile; try again")
        self.wake()
        return State.QUEUED

    # -- notifications --------------------------------------------------------------------

    def notify_add(self, name: str, kind: str, dest: str, **options: Any) -> dict[str, Any]:
        """Add your notification target NAME: ``slack`` (DEST: its incoming-webhook URL),
        ``webhook`` (DEST: an https URL; ``secret``: its signing key, generated by default
        and returned once as ``key``) or ``email`` (DEST: addresses; ``smtp`` "HOST[:PORT]",
        ``sender``, ``user``, ``password``, ``tls`` starttls|ssl|plain). Rules: ``events``
        (see `monkey notify add --on`), ``sweep``, ``glob`` (job names). Returns its
        listing row (see ``notify_list``)."""
        from monkey.facade.notify import add_target

        return add_target(self.home, self.store, self.acting_user(), name, kind, dest, **options)

    def notify_allow(self, cidr: str | None = None, remove: bool = False) -> list[str]:
        """The address ranges plain users' notify targets may reach on this main node
        (beyond public addresses; see ``monkey.core.reach``), after adding CIDR (or removing
        it with REMOVE). Admins only through a server."""
        from monkey.core.reach import parse_cidr

        if cidr is not None:
            cidr = parse_cidr(cidr)
            if not self.store.set_notify_allowed(cidr, not remove) and remove:
                raise MonkeyError(
                    f"{cidr} is not allowed; see `monkey server notify-allow` (the list)"
                )
        return self.store.notify_allowed()

    def notify_list(self) -> list[dict[str, Any]]:
        """Your targets (URLs masked, no secret), with their pending, sent and failed
        deliveries and the last error."""
        from monkey.facade.notify import list_targets

        return list_targets(self.store, self.acting_user())

    def notify_remove(self, name: str) -> None:
        """Remove your target NAME, its secrets and its undelivered messages."""
        from monkey.facade.notify import remove_target

        remove_target(self.home, self.store, self.acting_user(), name)

    def notify_test(self, name: str) -> None:
        """Send your target NAME a test message now; MonkeyError in one line on failure."""
        from monkey.facade.notify import test_target

        test_target(self.home, self.store, self.acting_user(), name)
