"""The facade methods the API allows (`POST /api/v1/call/METHOD`), and who may call them:
any user, admins only, or, for a method that acts on a job, its owner or an admin."""

from __future__ import annotations

from typing import NamedTuple

from monkey.models import Forbidden, MonkeyError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from monkey.api import Monkey


class Call(NamedTuple):
    admin: bool = False  # admins only
    acts: bool = False  # acts on the job named by the first argument: its owner or an admin
    submits: bool = False  # records jobs owned by the caller
    sweep: bool = False  # acts on the sweep the first argument names: its jobs' owner or admin
    jobs: bool = False  # acts on the jobs the first argument lists: their owner or an admin


CALLS: dict[str, Call] = {
    "whoami": Call(),
    "resolve": Call(),
    "get_job": Call(),
    "info": Call(),
    "job_listing": Call(),
    "provider_status": Call(),
    "monkey_instances": Call(),
    "metrics": Call(),
    "search": Call(),
    "cancel": Call(acts=True),
    "pause": Call(acts=True),
    "resume": Call(acts=True),
    "retry": Call(acts=True),
    "set_priority": Call(acts=True),
    "provider_kind": Call(),
    "sweep_status": Call(),
    "run": Call(submits=True),
    "sweep": Call(submits=True),
    "rerun": Call(submits=True),
    "rerun_sweep": Call(submits=True),
    "check_provider": Call(admin=True),  # it records what it finds, as the core would
    "provider_add": Call(admin=True),  # the main node's own command (monkey.server.provider_add)
    "sweeps": Call(),
    "sweep_analysis": Call(),
    "costs": Call(),
    "compare": Call(),
    "diff": Call(),
    "select_jobs": Call(),
    "plot_data": Call(),  # the client draws the plot and writes it
    "report_data": Call(),  # the client renders the report and writes it
    "export_jobs": Call(),
    "export_rows": Call(),  # the client writes the export
    "sweep_control": Call(sweep=True),
    "rm_select": Call(),
    "rm": Call(jobs=True),
    "du": Call(),
    "du_hosts": Call(),
    "gc": Call(admin=True),
    "verify": Call(admin=True),
    "instances": Call(),
    "create_instance": Call(admin=True),
    "delete_instance": Call(admin=True),
    "quotas": Call(),
    "set_quota": Call(admin=True),
    "remove_quota": Call(admin=True),
    # `monkey notify`: the calling user's own targets (their secrets stay on the server)
    "notify_add": Call(),
    "notify_list": Call(),
    "notify_remove": Call(),
    "notify_test": Call(),
    "notify_allow": Call(admin=True),  # ranges plain users' targets may reach
    # what the dashboard reads (monkey.tui): any user
    "jobs": Call(),
    "jobs_changed": Call(),
    "latest_metrics": Call(),
    "live_attempts": Call(),
    "core_status": Call(),
    "metric_names": Call(),
    "provider_configs": Call(),
    "dashboard_state": Call(),
    "web_link": Call(),  # a one-time Monkey Web login link for the caller (`monkey web`)
}


def run_call(
    m: Monkey, user: dict[str, Any], method: str, args: list[Any], kwargs: dict[str, Any]
) -> Any:
    """Facade METHOD(*ARGS, **KWARGS) on behalf of USER; Forbidden when USER may not;
    KeyError when METHOD is not allowed."""
    rule = CALLS[method]
    if rule.admin and not user["admin"]:
        raise Forbidden(f"{method.replace('_', ' ')} is for admins of this server; ask one")
    if method == "whoami":
        return {"name": user["name"], "admin": user["admin"], "users": m.store.count_users()}
    if method == "provider_add":
        from monkey.server.provider_add import provider_add

        return provider_add(m.home, user["name"], *args, **kwargs)
    if method == "provider_configs":
        return _provider_configs(m)
    if method == "web_link":
        return _web_link(m, user, *args, **kwargs)
    if method == "dashboard_state":
        return _dashboard_state(m, *args, **kwargs)
    if method == "job_listing":  # owners are shown on a server with several users
        kwargs = {**kwargs, "owners": m.store.count_users() > 1}
    if method == "rm_select" and not user["admin"]:  # `rm --failed`: the user's own jobs
        kwargs = {**kwargs, "owner": user["name"]}
    if rule.acts:
        if not args or not isinstance(args[0], str):
            raise MonkeyError(f"{method}: name the job")
        juid = m.resolve(args[0])
        owner = m.store.job_owners([juid]).get(juid)
        if owner != user["name"] and not user["admin"]:
            verb = "change the priority of" if method == "set_priority" else method
            raise Forbidden(
                f"job {juid} belongs to {owner or 'nobody recorded'}; only its owner "
                f"or an admin may {verb} it"
            )
        args = [juid, *args[1:]]
    if rule.sweep:
        _check_sweep(m, user, method, args)
    if rule.jobs:
        args = [_own_jobs(m, user, method, args), *args[1:]]
    if method in ("run", "sweep"):
        kwargs = _gathered_only(method, kwargs)
    if method == "rerun_sweep" and kwargs.get("in_place") and not user["admin"]:
        _check_sweep(m, user, method, args)
    m.actor = user["name"]  # owns what it submits; the events of the jobs it steers name it
    try:
        result = getattr(m, method)(*args, **kwargs)
    finally:
        m.actor = None
    return getattr(result, "juid", result) if rule.submits else result  # a Job handle: its id


# Options of run and sweep that read files of the machine they run on: a client gathers
# them on its own machine and sends what it found (``gathered``).
_LOCAL_OPTIONS = ("datasets", "env", "workdir", "job_yml", "yes", "outputs", "start_core")


def _gathered_only(method: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """KWARGS of a run or sweep through the API: the code and data gathered by the client,
    never files of the server; a sweep file as its content."""
    if not isinstance(kwargs.get("gathered"), dict):
        raise MonkeyError(f"{method}: the client sends no gathered code; upgrade the client")
    given = sorted(k for k in _LOCAL_OPTIONS if k in kwargs)
    if given:
        raise MonkeyError(f"{method}: {', '.join(given)} are gathered by the client, not sent")
    if method == "sweep" and not isinstance(kwargs.get("file"), (dict, type(None))):
        raise MonkeyError("sweep: send the sweep file's content, not its path")
    return kwargs


def _check_sweep(m: Monkey, user: dict[str, Any], method: str, args: list[Any]) -> None:
    """Forbidden unless USER is an admin or owns every job of the sweep ARGS[0] names."""
    if not args or not isinstance(args[0], str):
        raise MonkeyError(f"{method.replace('_', ' ')}: name the sweep")
    if user["admin"]:
        return
    sid = m.store.resolve_sweep(args[0])
    juids = [j.juid for j in m.store.list_jobs(sweep=sid)]
    others = sorted(
        {o or "nobody recorded" for o in m.store.job_owners(juids).values()} - {user["name"]}
    )
    if others:
        raise Forbidden(
            f"sweep {sid} has jobs of {', '.join(others)}; only their owner or an admin may "
            f"{args[1] if len(args) > 1 else 'act on'} it"
        )


def _own_jobs(m: Monkey, user: dict[str, Any], method: str, args: list[Any]) -> list[str]:
    """The ids of the jobs ARGS[0] lists; Forbidden unless USER is an admin or owns each."""
    refs = args[0] if args else None
    if not isinstance(refs, list) or not all(isinstance(r, str) for r in refs):
        raise MonkeyError(f"{method}: list the jobs")
    juids = list(dict.fromkeys(m.resolve(r) for r in refs))
    if not user["admin"]:
        owners = m.store.job_owners(juids)
        for juid in juids:
            if owners.get(juid) != user["name"]:
                raise Forbidden(
                    f"job {juid} belongs to {owners.get(juid) or 'nobody recorded'}; only its "
                    f"owner or an admin may {method} it"
                )
    return juids


def _web_link(m: Monkey, user: dict[str, Any], page: str = "/web/jobs") -> str:
    """The path of a one-time link that logs USER in to Monkey Web and opens PAGE."""
    from urllib.parse import urlencode

    from monkey.server.websession import issue_link

    if not isinstance(page, str) or not page.startswith("/web/"):
        raise MonkeyError(f"web link: {page!r} is not a page of Monkey Web (/web/...)")
    secret = issue_link(m.home, user["name"])
    return f"/web/login?{urlencode({'once': secret, 'next': page})}"


def _provider_configs(m: Monkey) -> dict[str, list[Any]]:
    """Provider name -> [type, options] as providers.yml gives them, secrets redacted (the
    options of a provider may hold a password or a key that no user of the API may see)."""
    return {name: [cfg.type, _redacted(cfg.options)] for name, cfg in m.providers.items()}


def _dashboard_state(m: Monkey, now: float | None = None) -> dict[str, Any]:
    """What the dashboard reads at each poll besides the jobs, in one answer: the providers
    (or the problem reading them), the core's pid, live attempts, recorded instances and
    the instances monkey created (see monkey.tui.app)."""
    try:
        providers, problem = _provider_configs(m), None
    except MonkeyError as exc:  # the rest is still worth showing
        providers, problem = {}, str(exc)
    return {
        "providers": providers,
        "problem": problem,
        "core": m.core_status(),
        "live": m.live_attempts(),
        "instances": m.instances(),
        "created": m.monkey_instances(now) if providers else [],
    }


def _redacted(value: Any) -> Any:
    """VALUE with the values of secret-named keys (at any depth) replaced by REDACTED."""
    from monkey.models import REDACTED, is_secret_name

    if isinstance(value, dict):
        return {k: REDACTED if is_secret_name(str(k)) else _redacted(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_redacted(v) for v in value]
    return value
