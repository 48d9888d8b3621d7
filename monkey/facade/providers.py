"""The providers half of the ``Monkey`` facade: what `list providers` shows (each provider's
jobs, hosts or instances, errors, and quotas), the quota entries, `provider check`, and the
instances monkey made or is asked to create or delete (the core carries those out)."""

from __future__ import annotations

import time
from collections.abc import Callable

from monkey.config import Home, ProviderConfig
from monkey.drivers import driver_class
from monkey.models import MonkeyError, State
from monkey.store import Store
from monkey.submit import wake

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from monkey.drivers.ssh import SSHDriver


class Providers:
    """The providers of MONKEY_HOME HOME (CONFIGS: providers.yml as it is now), its STORE."""

    def __init__(
        self, home: Home, store: Store, configs: Callable[[], dict[str, ProviderConfig]]
    ) -> None:
        self.home, self.store, self._configs = home, store, configs

    @property
    def providers(self) -> dict[str, ProviderConfig]:
        return self._configs()

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
        from monkey.drivers.base import isolation_of

        out = []
        users = self.store.count_users()
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
            info["isolation"] = isolation_of(cfg.options, users, self._why_no_sandbox(cfg, users))
            if cfg.type == "local":
                info["images"] = _images_here(cfg.options)
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

    def _check_local(self, config: ProviderConfig) -> dict[str, Any]:
        """`provider check`'s report of this machine (a `local` provider)."""
        from monkey.client_agent.procs import mem_total
        from monkey.drivers.base import isolation_of
        from monkey.drivers.local import local_capacity

        cap = local_capacity(config)
        why = self._why_no_sandbox(config, users := self.store.count_users())
        return {
            "instance": config.name,
            "host": "this machine",
            "error": None,
            "slots": cap.slots,
            "gpus": cap.gpus,
            "memory": mem_total(),
            "workdir": str(self.home.root),
            "isolation": isolation_of(config.options, users, why),
            "images": _images_here(config.options),
        }

    @staticmethod
    def _why_no_sandbox(config: ProviderConfig, users: int) -> str | None:
        """Why this machine cannot make a job's sandbox ("" when it can) for a `local`
        provider whose jobs may need one (probed only then); None for the other kinds."""
        if config.type != "local":
            return None
        mode = config.options.get("isolation", "auto")
        if mode == "none" or (mode == "auto" and users <= 1):
            return ""  # not used
        from monkey.client_agent.sandbox import bwrap

        return bwrap()[1]

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
        share: float | str | None = None,
        storage: int | str | None = None,
    ) -> dict[str, Any]:
        """Set the limits given (``unlimited`` lifts a wider entry's) and the fair-share
        weight SHARE for USER (None: everyone's default) on PROVIDER (None: all), and the
        bytes of blobs STORAGE ("50G") the user's uploads and jobs may hold (all providers'
        entry only); returns the entry. The core applies them at its next pass."""
        from monkey.core.daemon import ping
        from monkey.facade.quotas import check_target, parse_limit, parse_share, parse_storage
        from monkey.store.quotas import ANY

        user, provider = user or ANY, provider or ANY
        given = {"jobs": jobs, "gpus": gpus, "spend": spend}
        limits = {k: parse_limit(k, str(v)) for k, v in given.items() if v is not None}
        if share is not None:
            limits["share"] = parse_share(str(share))
        if storage is not None:
            if provider != ANY:
                raise MonkeyError(
                    "--storage limits what a user stores on this main node, whatever the "
                    "provider; leave out --provider"
                )
            limits["storage"] = parse_storage(str(storage))
        if not limits:
            raise MonkeyError(
                "give a limit to set: --jobs N, --gpus N, --spend USD_PER_HOUR, --share W "
                "or --storage SIZE"
            )
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
        if config.type == "local":
            return [self._check_local(config)]
        if config.type == "kubernetes":
            from monkey.drivers.kubernetes import check_cluster

            return check_cluster(config, self.home)
        if config.type != "ssh":
            raise MonkeyError(
                f"provider {name!r} is {config.type!r}; `provider check` checks ssh, local "
                "and kubernetes providers"
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
        self, now: float | None = None, ended: bool = False, pods: bool = False
    ) -> list[dict[str, Any]]:
        """The machines monkey created (of elastic providers) and has not seen terminated
        (with ENDED, the terminated ones too, each with ``ended``: why, as recorded): id,
        provider, state (the agent's reach once running), size, spot, address, the jobs live
        on it, age and idle time in seconds, estimated $/hour and $ spent so far (None:
        unknown); then each Kubernetes provider's pods of this home: with PODS as its cluster
        lists them now (``kubernetes.pod_rows``: one listing per cluster), else as the
        core's watch last saw them (no call to the cluster)."""
        now = time.time() if now is None else now
        out = self._made(now, ended)
        if not pods:
            return out + self._pods(now)
        from monkey.drivers.kubernetes import pod_rows

        for _name, cfg in sorted(self.providers.items()):
            if cfg.type == "kubernetes":
                out += pod_rows(cfg, self.home, now)
        return out

    def _made(self, now: float, ended: bool) -> list[dict[str, Any]]:
        """The machines of elastic providers (see ``monkey_instances``)."""
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
                    # how long it has run no job (None: busy, ended, or not yet known)
                    "idle": None
                    if row["idle_since"] is None or row["terminated_at"] or jobs.get(row["id"])
                    else max(0.0, now - row["idle_since"]),
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

    def _pods(self, now: float) -> list[dict[str, Any]]:
        """Monkey's pods of each kubernetes provider, as the core's watch last saw them:
        the pod, its phase, the node as its address, its requests as its size."""
        from monkey.drivers.kubernetes import read_pods

        out = []
        for name, cfg in self.providers.items():
            if cfg.type != "kubernetes":
                continue
            for pod in read_pods(self.home, name):
                size = f"{pod.get('cpus') or '?'} CPU" + (
                    f", {pod['gpus']} GPU" if pod.get("gpus") else ""
                )
                created = pod.get("created")
                out.append(
                    {
                        "id": pod.get("pod"),
                        "provider": name,
                        "state": pod.get("phase"),
                        "size": size,
                        "spot": False,
                        "address": pod.get("node"),
                        "jobs": [pod["job"]] if pod.get("job") else [],
                        "age": None if created is None else max(0.0, now - created),
                        "idle": None,
                        "price": None,
                        "cost": None,
                    }
                )
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
        wake(self.home, f"{what} (request {rid})")
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


def _images_here(options: dict[str, Any]) -> str:
    """The engine that runs jobs' images on this machine for a provider with OPTIONS (its
    `engine`), or "none: why"."""
    from monkey.client_agent.sandbox import image_engine

    engine, why = image_engine(options.get("engine", "auto"))
    return engine or f"none: {why}"
