"""The Monkey facade: the one door for the shell, the dashboard and user scripts."""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path

from monkey.client_agent import rundir
from monkey.config import Home, ProviderConfig
from monkey.core.presence import absent_since
from monkey.drivers import driver_class, load_providers
from monkey.facade.disk import Disk
from monkey.facade.tracking import Sweeps, Tracking
from monkey.handles import Job
from monkey.logfiles import LOGS, Follower, LogCursor
from monkey.models import (
    LIVE,
    REDACTED,  # noqa: F401 (the dashboard imports it from here)
    TERMINAL,
    Attempt,
    MonkeyError,
    Request,
    State,
    is_secret_name,  # noqa: F401 (the dashboard imports it from here)
)
from monkey.models import Job as JobRecord
from monkey.rerun import Reruns
from monkey.store import Store
from monkey.submit import Submitter, check_priority, default_name, parse_command, wake

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Concatenate, ParamSpec, TypeVar

    from monkey.drivers.ssh import SSHDriver
    from monkey.snapshot.blobs import BlobStore

    _P = ParamSpec("_P")
    _R = TypeVar("_R")


def _to(
    part: str, method: Callable[Concatenate[Any, _P], _R]
) -> Callable[Concatenate[Any, _P], _R]:
    """A ``Monkey`` method that calls METHOD of its part ``self.<PART>`` (a ``Reruns``,
    ``Sweeps`` or ``Tracking``), with METHOD's signature and docstring."""

    @functools.wraps(method)
    def call(self: Any, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        return method(getattr(self, part), *args, **kwargs)

    return call


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
        self.home = (home if isinstance(home, Home) else Home(home)).ensure()
        self.store = Store(self.home.db)
        self._providers: dict[str, ProviderConfig] | None = None
        self._providers_stamp: tuple[int, int] | None = None
        # The parts it delegates to: one submission path for run, sweep and rerun.
        self._submitter = Submitter(self.home, self.store, lambda: self.providers)
        # The parts wake the core through Monkey.wake, looked up when they call it.
        self._reruns = Reruns(
            self.home, self.store, self._submitter, lambda queued: self.wake(queued)
        )
        self._sweeps = Sweeps(
            self.home, self.store, self._submitter, self._control, lambda queued: self.wake(queued)
        )
        self._tracking = Tracking(self.home, self.store, self._sweeps)
        self._disk = Disk(self)
        self._sweeps.actor = self.acting_user

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
        """Who acts through this facade: the owner of the jobs it submits, named in the
        events of the jobs it steers. None: this machine's user; `monkey server` sets the
        calling user for each call."""
        return self._submitter.owner

    @actor.setter
    def actor(self, name: str | None) -> None:
        self._submitter.owner = name

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
        self._submitter.resources(provider, cpus, gpus, memory, host, time)
        return self.providers[provider].type

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
        whatever their rules."""
        argv = parse_command(cmd)
        deps = self._submitter.dependencies(after, after_any)
        targets = None
        if notify:
            from monkey.facade.notify import job_targets

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
                from monkey.rerun import command_values

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
    rerun_sweep = _to("_reruns", Reruns.rerun_sweep)
    files = _to("_reruns", Reruns.files)
    cat = _to("_reruns", Reruns.cat)
    clone = _to("_reruns", Reruns.clone)
    sweep = _to("_sweeps", Sweeps.sweep)
    sweeps = _to("_sweeps", Sweeps.sweeps)
    sweep_status = _to("_sweeps", Sweeps.sweep_status)
    sweep_control = _to("_sweeps", Sweeps.sweep_control)
    metrics = _to("_tracking", Tracking.metrics)
    metric_names = _to("_tracking", Tracking.metric_names)
    compare = _to("_tracking", Tracking.compare)
    diff = _to("_tracking", Tracking.diff)
    plot = _to("_tracking", Tracking.plot)
    plot_data = _to("_tracking", Tracking.plot_data)
    chart_data = _to("_tracking", Tracking.chart_data)
    sweep_analysis = _to("_tracking", Tracking.sweep_analysis)
    report = _to("_tracking", Tracking.report)
    report_data = _to("_tracking", Tracking.report_data)
    select_jobs = _to("_tracking", Tracking.select_jobs)
    export = _to("_tracking", Tracking.export)
    export_jobs = _to("_tracking", Tracking.export_jobs)
    export_rows = _to("_tracking", Tracking.export_rows)
    rm_select = _to("_disk", Disk.rm_select)
    rm = _to("_disk", Disk.rm)
    gc = _to("_disk", Disk.gc)
    du = _to("_disk", Disk.du)
    du_hosts = _to("_disk", Disk.du_hosts)
    verify = _to("_disk", Disk.verify)

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
    ) -> dict[str, Any]:
        """What `monkey list jobs` shows (see ``monkey.facade.listing.job_listing``): only
        OWNER's jobs, or with MINE the acting user's."""
        from monkey.facade.listing import job_listing

        return job_listing(
            self.home,
            self.store,
            None if states is None else [State(s) for s in states],
            provider,
            limit,
            owners,
            self.acting_user() if mine else owner,
        )

    def acting_user(self) -> str:
        """Who acts through this facade: ``actor``, or this machine's user."""
        from monkey.store.db import local_user

        return self.actor or local_user()

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
        held = self.store.holds([juid]).get(juid)  # a quota's reason, while queued
        waiting = self.store.provider_error(job.provider) if job.state == State.QUEUED else None
        waiting = "; ".join(w for w in (held, waiting) if w) or None
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
            "owner": self.store.job_owners([juid]).get(juid),  # who submitted it
            "rerun_of": self.store.rerun_of(juid),  # {"job", "changes"} or None
            "waiting": waiting,  # why a queued job's provider has no machine for it yet
            "held": held,  # why a quota holds it back ("over quota: ..."), or None
            # the jobs it runs after: [{"job", "any", "state", "met"}] (see Store.dependencies)
            "after": self.store.dependencies(juid),
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
            # estimated $ (total, and the part spent on preempted/lost attempts); None: unknown
            "cost": self.costs([juid], now).get(juid),
            "attempts_detail": [
                {**a.as_dict(), "cost": a.cost(now)} for a in self.store.attempts(juid)
            ],
            "events": self.store.events(juid),
            "last_output": self._last_output(job),
            # its `monkey notify` messages: [{"id", "target", "what", "state", "tries",
            # "last_error", "sent_at"}] (see Store.job_deliveries)
            "notifications": self.store.job_deliveries(juid),
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
        return {
            "attempt": a.n,
            "reason": a.reason,
            "lines": text.decode(errors="replace").splitlines(),
        }

    def provider_status(self) -> dict[str, Any]:
        """What `monkey list providers` shows: {"core": {"running", "pid"}, "providers": [{
        "name", "type", "queued", "running", what its kind describes (slots, gpus, hosts, a
        detail line), "error": why its waiting jobs get no machine}], with quotas set
        "quotas": each user's use against them (``quota_rows``)}, providers by name."""
        from monkey.core import daemon

        counts: dict[str, dict[str, int]] = {}
        for job in self.store.list_jobs(states=[State.QUEUED, State.DISPATCHING, State.RUNNING]):
            c = counts.setdefault(job.provider, {"queued": 0, "running": 0})
            c["queued" if job.state == State.QUEUED else "running"] += 1
        running: dict[str, int] = {}
        for instance, *_ in self.store.live_usage():
            running[instance] = running.get(instance, 0) + 1
        out = []
        for name, cfg in sorted(self.providers.items()):
            info: dict[str, Any] = {
                "name": name,
                "type": cfg.type,
                **counts.get(name, {"queued": 0, "running": 0}),
            }
            instances = self.store.instances(name)
            for inst in instances:
                inst["running"] = running.get(inst["id"], 0)
            info.update(driver_class(cfg.type).describe(cfg, instances))
            error = self.store.provider_error(name)
            if error:  # why the jobs waiting for it get no machine
                info["error"] = error
            out.append(info)
        pid = daemon.status(self.home)
        status: dict[str, Any] = {"core": {"running": bool(pid), "pid": pid}, "providers": out}
        quotas = self.store.quotas()
        if quotas:  # each user's use of each provider against the quotas that bind them
            from monkey.facade.quotas import quota_rows

            status["quotas"] = quota_rows(self.store, sorted(self.providers), quotas)
        return status

    def quotas(self) -> list[dict[str, Any]]:
        """The quota entries (see ``Store.quotas``)."""
        return self.store.quotas()

    def set_quota(
        self,
        user: str | None,
        provider: str | None = None,
        jobs: int | str | None = None,
        gpus: int | str | None = None,
        spend: float | str | None = None,
    ) -> dict[str, Any]:
        """Set the limits given (``unlimited`` lifts a wider entry's) for USER (None:
        everyone's default) on PROVIDER (None: all); returns the entry. The core applies
        them at its next pass."""
        from monkey.core.daemon import ping
        from monkey.facade.quotas import check_target, parse_limit
        from monkey.store.quotas import ANY

        user, provider = user or ANY, provider or ANY
        given = {"jobs": jobs, "gpus": gpus, "spend": spend}
        limits = {k: parse_limit(k, str(v)) for k, v in given.items() if v is not None}
        if not limits:
            raise MonkeyError("give a limit to set: --jobs N, --gpus N or --spend USD_PER_HOUR")
        check_target(self.store, sorted(self.providers), user, provider)
        self.store.set_quota(user, provider, limits)
        ping(self.home)
        return next(
            q for q in self.store.quotas() if (q["user"], q["provider"]) == (user, provider)
        )

    def remove_quota(self, user: str | None, provider: str | None = None) -> None:
        """Remove the entry of USER (None: the default) on PROVIDER (None: all)."""
        from monkey.core.daemon import ping
        from monkey.store.quotas import ANY

        user, provider = user or ANY, provider or ANY
        if not self.store.remove_quota(user, provider):
            who = "the default" if user == ANY else user
            where = "all providers" if provider == ANY else provider
            raise MonkeyError(f"no quota for {who} on {where}; see `monkey server quota list`")
        ping(self.home)

    def check_provider(self, name: str) -> list[dict[str, Any]]:
        """Reach every host of SSH provider NAME now (`monkey provider check`): one report per
        host ({"instance", "host", "error", "slots", "gpus", "memory"}), each host's reach
        recorded as the core would."""
        from monkey.drivers import get_driver

        config = self.providers.get(name)
        if config is None:
            raise MonkeyError(f"no provider {name!r}; see `monkey list providers`")
        if config.type != "ssh":
            raise MonkeyError(
                f"provider {name!r} is {config.type!r}; `provider check` checks ssh providers"
            )
        driver: SSHDriver = get_driver(config, self.home)  # type: ignore[assignment]  # an ssh provider's
        try:
            report = driver.check()
            for inst, reach, extra in driver.changes():
                self.store.record_instance(inst, reach=reach, extra=extra)
        finally:
            driver.close()
        return report

    def monkey_instances(
        self, now: float | None = None, ended: bool = False
    ) -> list[dict[str, Any]]:
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
            out.append(
                {
                    "id": row["id"],
                    "provider": row["provider"],
                    "state": state,
                    "size": row["size"],
                    "spot": row["spot"],
                    "address": row["address"],
                    "jobs": jobs.get(row["id"], []),
                    "age": None if launched is None else end - launched,
                    "price": price,
                    "cost": None
                    if price is None or launched is None
                    else price * (end - launched) / 3600,
                }
            )
            if ended:
                events = (
                    self.store.instance_events(row["id"]) if row["state"] == "terminated" else []
                )
                out[-1]["ended"] = events[-1]["detail"] if events else None
        return out

    # -- instances on request: `monkey create|delete instance` -----------------------------

    def create_instance(
        self,
        provider: str,
        size: str | None = None,
        spot: bool | None = None,
        host: str | None = None,
        timeout: float = 300,
    ) -> dict[str, Any]:
        """Have the core create a cloud instance of PROVIDER (SIZE, SPOT: default the
        entry's), or claim an SSH host (HOST: default one not reached yet), before any job
        needs it; it then takes jobs and idles out as usual. The request as it ended
        (``instance``: its id); MonkeyError when it failed or is still under way."""
        config = self.providers.get(provider)
        if config is None:
            names = ", ".join(sorted(self.providers))
            raise MonkeyError(
                f"no provider {provider!r} (configured: {names}); add one with "
                "`monkey provider add`"
            )
        kind = driver_class(config.type)
        if kind.batches:
            raise MonkeyError(
                f"provider {provider!r} ({config.type}) gets one allocation per job "
                "when it starts; there is no instance to create ahead"
            )
        if not kind.elastic and config.type != "ssh":
            raise MonkeyError(
                f"provider {provider!r} ({config.type}) runs jobs on this machine; "
                "there is no instance to create"
            )
        if kind.elastic and host is not None:
            raise MonkeyError(
                f"--host is for SSH providers; {provider!r} ({config.type}) "
                "creates its instances (use --size, --spot)"
            )
        if not kind.elastic and (size is not None or spot is not None):
            raise MonkeyError(
                f"provider {provider!r} is a set of SSH hosts: --size and --spot "
                "are for cloud providers (choose a host with --host)"
            )
        rid = self.store.add_instance_request("create", provider, host, size, spot)
        return self._await_request(rid, f"creating an instance of {provider}", timeout)

    def delete_instance(
        self, ref: str, force: bool = False, timeout: float = 300
    ) -> dict[str, Any]:
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
                raise MonkeyError(
                    f"{what}: still under way after {timeout:.0f}s; the core goes "
                    "on with it (see `monkey list providers`)"
                )
            time.sleep(0.1)

    def costs(self, juids: list[str], now: float | None = None) -> dict[str, Any]:
        """juid -> estimated cost ``{"total", "preempted"}`` in $, for jobs with any known."""
        from monkey.store.cost import job_costs

        return dict(job_costs(self.store.db, juids, time.time() if now is None else now))

    def log_paths(
        self, ref: str, stderr: bool = False, attempt: int | None = None, setup: bool = False
    ) -> list[Path]:
        """The job's log files, one per attempt, oldest first (``setup``: the set-up logs)."""
        juid = self.store.resolve(ref)
        name = rundir.SETUP_LOG if setup else rundir.STDERR if stderr else rundir.STDOUT
        attempts = self.store.attempts(juid)
        if attempt is not None:
            attempts = [a for a in attempts if a.n == attempt]
            if not attempts:
                raise MonkeyError(f"job {juid} has no attempt {attempt}")
        return [self.home.run_dir(juid, a.n) / name for a in attempts if a.run_dir]

    def log_chunks(
        self,
        ref: str,
        stderr: bool = False,
        attempt: int | None = None,
        tail: int | None = None,
        setup: bool = False,
    ) -> Iterator[bytes]:
        """The job's output so far, attempts oldest first, in pieces of at most 1 MB; with
        ``tail``, only its last ``tail`` lines (found from the end: a huge log costs nothing)."""
        paths = self.log_paths(ref, stderr, attempt, setup)
        cursor = LogCursor()
        if tail is not None:
            cursor.skip_to_tail(paths, tail)
        return (piece for _, _, piece in cursor.read(paths))

    def logs(
        self, ref: str, stderr: bool = False, attempt: int | None = None, tail: int | None = None
    ) -> bytes:
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
        return [
            (p["path"], base / p["name"])
            for p in spec.get("persist", [])
            if (base / p["name"]).is_dir()
        ]

    def output_chunks(
        self,
        ref: str,
        stream: str = "both",
        attempt: int | None = None,
        tail: int | None = None,
        setup: bool = False,
        marks: bool = True,
    ) -> Iterator[bytes]:
        """What the job printed so far, attempts oldest first, each marked when it has several
        (``── attempt 2 on HOST, after preempted ──``): stdout and stderr in the order they
        were written (``stream`` "stdout" or "stderr": one of them; ``setup``: the set-up
        log instead); with ``tail``, only the last ``tail`` lines of it all, unmarked."""
        from monkey.logfiles import Segment, interleaved, read_segments, tail_segments

        juid = self.store.resolve(ref)
        attempts = [a for a in self.store.attempts(juid) if a.run_dir]
        shown = attempts if attempt is None else [a for a in attempts if a.n == attempt]
        if attempt is not None and not shown:
            raise MonkeyError(f"job {juid} has no attempt {attempt}")
        pieces: list[tuple[int, Segment | None]] = []
        for a in shown:
            folder = self.home.run_dir(juid, a.n)
            if setup or stream != "both":
                path = folder / (rundir.SETUP_LOG if setup else rundir.stream_log(stream))
                size = path.stat().st_size if path.exists() else 0
                segments = [(path, 0, size)] if size else []
            else:
                segments = interleaved(
                    folder / rundir.STDOUT, folder / rundir.STDERR, folder / rundir.ORDER
                )
            pieces += [(a.n, seg) for seg in segments] or (
                [(a.n, None)] if tail is None and not setup else []
            )
        if tail is not None:
            kept = tail_segments(
                [seg for _, seg in pieces if seg is not None], tail
            )  # no None with a tail
            pieces = [(n, seg) for (n, _), seg in zip(pieces[len(pieces) - len(kept) :], kept)]
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
        return (
            f"── attempt {n} on {attempts[i].instance}"
            + (f", after {after}" if after else "")
            + " ──\n"
        ).encode()

    def store_follower(self) -> Follower:
        """A ``Follower`` woken by every write to the store (a job's state changed)."""
        follower = Follower()
        follower.watch(self.home.db.parent, (self.home.db.name, f"{self.home.db.name}-wal"))
        return follower

    def follow(
        self,
        ref: str,
        stderr: bool = False,
        tail: int | None = None,
        poll: float = 1.0,
        stream: str | None = None,
    ) -> Iterator[bytes]:
        """Yield the job's output as it is written, across attempts, until the job ends;
        with ``tail``, start from its last ``tail`` lines. ``stream`` "both" follows the
        set-up log, stdout and stderr together (each attempt after the first marked);
        "stdout" or "stderr" one of them (default: ``stderr`` picks).

        Woken by writes to the job's run folder and to the store (``monkey.logfiles.Follower``:
        inotify, no CPU while nothing is written), and at least every ``poll`` seconds. Keeps
        a core serving meanwhile (starting it again if it dies): without one the job would
        never end."""
        for piece in self.follow_pieces(
            ref, stream or ("stderr" if stderr else "stdout"), tail=tail, poll=poll
        ):
            if piece is not None and piece[0] != "start":
                yield piece[2]

    def follow_pieces(
        self,
        ref: str,
        stream: str = "both",
        tail: int | None = None,
        poll: float = 1.0,
        start: dict[str, Any] | None = None,
    ) -> Iterator[tuple[str, int, bytes] | None]:
        """``follow``'s output with where each piece comes from, so that a reader on another
        machine can resume exactly: (file, offset, piece) where file is "ATTEMPT/NAME" in
        the job's run folder, or ("mark", N, line) for the line that starts attempt N; None
        after each wait with nothing new (a reader's keep-alive). First ("start", 0, JSON):
        where reading begins, {"offsets": {file: offset}, "marked": [N...]} (a tail skips
        bytes and marks); START, that dict as a reader last had it, resumes a follow."""
        from monkey.core.daemon import Keeper

        names = LOGS if stream == "both" else (rundir.stream_log(stream),)
        juid = self.store.resolve(ref)
        keeper = Keeper(self.home)
        cursor = LogCursor()

        def paths(attempts: list[Attempt]) -> list[Path]:
            return [self.home.run_dir(juid, a.n) / name for a in attempts for name in names]

        def key(path: Path) -> str:
            return f"{path.parent.name}/{path.name}"

        marked = {1}
        if start is not None:
            known = {key(p): p for p in paths([a for a in self.store.attempts(juid) if a.run_dir])}
            cursor.offsets.update(
                {known[k]: int(v) for k, v in start.get("offsets", {}).items() if k in known}
            )
            marked.update(int(n) for n in start.get("marked", []))
        elif tail is not None:
            attempts = [a for a in self.store.attempts(juid) if a.run_dir]
            cursor.skip_to_tail(paths(attempts), tail)
            marked.update(a.n for a in attempts)
        begin = {
            "offsets": {key(p): n for p, n in cursor.offsets.items()},
            "marked": sorted(marked),
        }
        yield "start", 0, json.dumps(begin).encode()
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
                        yield "mark", a.n, self._attempt_mark(attempts, a.n)
                    for path, offset, piece in cursor.read(paths([a])):
                        yield key(path), offset, piece
                if finished:
                    return
                if follower is None:  # only a follow that has to wait pays for watchdog
                    follower = self.store_follower()
                    continue  # read again: a write before the watch began is not missed
                if follower.watch(self.home.runs / juid, LOGS, recursive=True):  # once it exists
                    continue  # read again before waiting, as above
                follower.wait(poll)
                yield None
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
