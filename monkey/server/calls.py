"""How the server carries out a call of the contract (monkey.contract) for a user: the
access rule checked, then the facade's method, or the server's own implementation
(``SERVED``) given the caller. The arguments were checked at the door (monkey.server.door)."""

from __future__ import annotations

from monkey.contract import Access, methods
from monkey.models import Forbidden, MonkeyError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from monkey.api import Monkey


def run_call(m: Monkey, user: dict[str, Any], method: str, kwargs: dict[str, Any]) -> Any:
    """Contract METHOD(**KWARGS) on behalf of USER; Forbidden when USER may not."""
    access = methods()[method].access
    if access is Access.ADMIN and not user["admin"]:
        raise Forbidden(f"{method.replace('_', ' ')} is for admins of this server; ask one")
    if access is Access.JOB:
        juid = m.resolve(kwargs["ref"])
        verb = _VERBS.get(method, method)
        why = refusal(user, juid, m.job_owners([juid]).get(juid), verb)
        if why:
            raise Forbidden(why)
        kwargs = {**kwargs, "ref": juid}
    elif access is Access.SWEEP:
        _check_sweep(m, user, kwargs["ref"], kwargs.get("action", _VERBS.get(method, "act on")))
    elif access is Access.JOBS:
        kwargs = {**kwargs, "refs": _own_jobs(m, user, method, kwargs["refs"])}
    served = SERVED.get(method)
    m = m.acting_for(user["name"])  # owns what it submits; the events of what it steers
    result = served(m, user, **kwargs) if served is not None else getattr(m, method)(**kwargs)
    return getattr(result, "juid", result) if access is Access.SUBMITS else result  # an id


# What a refusal says the caller may not do, by method (else the method's name).
_VERBS = {
    "set_priority": "change the priority of",
    "note": "write the note of",
    "tag": "change the tags of",
    "sweep_note": "write the note of",
    "sweep_tag": "change the tags of",
}


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


STEER = "cancel, pause, resume or retry"  # what the owner of a job may do to it


def refusal(user: dict[str, Any], juid: str, owner: str | None, verb: str) -> str | None:
    """Why USER may not VERB job JUID, which OWNER submitted (None: they may): only its
    owner or an admin may steer a job."""
    if user["admin"] or owner == user["name"]:
        return None
    return (
        f"job {juid} belongs to {owner or 'nobody recorded'}; only its owner or an admin "
        f"may {verb} it"
    )


def _check_sweep(m: Monkey, user: dict[str, Any], ref: str, doing: str) -> None:
    """Forbidden unless USER is an admin or owns every job of the sweep REF names."""
    if user["admin"]:
        return
    sid, owners = m.sweep_owners(ref)
    others = sorted({o or "nobody recorded" for o in owners} - {user["name"]})
    if others:
        raise Forbidden(
            f"sweep {sid} has jobs of {', '.join(others)}; only their owner or an admin may "
            f"{doing} it"
        )


def _own_jobs(m: Monkey, user: dict[str, Any], method: str, refs: list[str]) -> list[str]:
    """The ids of the jobs REFS lists; Forbidden unless USER is an admin or owns each."""
    juids = list(dict.fromkeys(m.resolve(r) for r in refs))
    if not user["admin"]:
        owners = m.job_owners(juids)
        for juid in juids:
            why = refusal(user, juid, owners.get(juid), method)
            if why:
                raise Forbidden(why)
    return juids


def whoami(m: Monkey, user: dict[str, Any]) -> dict[str, Any]:
    """The caller's name, whether an admin, and how many users the server has."""
    return {"name": user["name"], "admin": user["admin"], "users": m.user_count()}


def provider_add(m: Monkey, user: dict[str, Any], words: list[str], name: str) -> Any:
    """`monkey provider add WORDS` run by the main node as its own command."""
    from monkey.server.provider_add import provider_add as add

    return add(m.home, user["name"], words, name)


def web_link(m: Monkey, user: dict[str, Any], page: str = "/web/jobs") -> str:
    """The path of a one-time link that logs USER in to Monkey Web and opens PAGE."""
    from urllib.parse import urlencode

    from monkey.server.websession import issue_link

    if not page.startswith("/web/"):
        raise MonkeyError(f"web link: {page!r} is not a page of Monkey Web (/web/...)")
    secret = issue_link(m.home, user["name"])
    return f"/web/login?{urlencode({'once': secret, 'next': page})}"


def provider_configs(m: Monkey, user: dict[str, Any] | None = None) -> dict[str, list[Any]]:
    """Provider name -> [type, options] as providers.yml gives them, secrets redacted (the
    options of a provider may hold a password or a key that no user of the API may see)."""
    return {name: [cfg.type, _redacted(cfg.options)] for name, cfg in m.providers.items()}


def dashboard_state(
    m: Monkey, user: dict[str, Any], now: float | None = None, owners_of: list[str] | None = None
) -> dict[str, Any]:
    """What the dashboard reads at each poll besides the jobs, in one answer: the providers
    (or the problem reading them), the core's pid, live attempts, recorded instances and
    the instances monkey created (see monkey.tui.app); who the caller is, and of the jobs
    OWNERS_OF lists, their owners and why the caller may not steer those of others."""
    owners = m.job_owners(owners_of) if owners_of else {}
    steer = {j: why for j, o in owners.items() if (why := refusal(user, j, o, STEER))}
    try:
        providers, problem = provider_configs(m), None
    except MonkeyError as exc:  # the rest is still worth showing
        providers, problem = {}, str(exc)
    return {
        "providers": providers,
        "problem": problem,
        "core": m.core_status(),
        "live": m.live_attempts(),
        "instances": m.instances(),
        "created": m.monkey_instances(now) if providers else [],
        "me": user["name"],
        "owners": owners,
        "refused": steer,
    }


def job_listing(m: Monkey, user: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """`monkey list jobs`: with the owners when the server has several users."""
    return m.job_listing(**{**kwargs, "owners": m.user_count() > 1})


def rm_select(m: Monkey, user: dict[str, Any], **kwargs: Any) -> Any:
    """`rm --failed` and the like: a plain user's selection holds their own jobs only."""
    return m.rm_select(**(kwargs if user["admin"] else {**kwargs, "owner": user["name"]}))


def run(m: Monkey, user: dict[str, Any], **kwargs: Any) -> Any:
    """A job of the caller, from the code and data its client gathered."""
    return m.run(**_gathered_only("run", kwargs))


def sweep(m: Monkey, user: dict[str, Any], **kwargs: Any) -> Any:
    """A sweep of the caller, from the code and data its client gathered."""
    return m.sweep(**_gathered_only("sweep", kwargs))


def rerun_sweep(m: Monkey, user: dict[str, Any], ref: str, **kwargs: Any) -> Any:
    """A sweep's cells again; in place only for the sweep's owner (or an admin)."""
    if kwargs.get("in_place"):
        _check_sweep(m, user, ref, "rerun in place")
    return m.rerun_sweep(ref, **kwargs)


def sweep_analysis(
    m: Monkey, user: dict[str, Any], ref: str, status: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A sweep's analysis, from the sweep's status as the server reads it (a status a
    client sends is not trusted)."""
    return m.sweep_analysis(ref)


# The server's own implementations of the contract's methods marked ``served``.
SERVED: dict[str, Callable[..., Any]] = {
    f.__name__: f
    for f in (
        whoami,
        provider_add,
        web_link,
        provider_configs,
        dashboard_state,
        job_listing,
        rm_select,
        run,
        sweep,
        rerun_sweep,
        sweep_analysis,
    )
}


def _redacted(value: Any) -> Any:
    """VALUE with the values of secret-named keys (at any depth) replaced by REDACTED."""
    from monkey.models import REDACTED, is_secret_name

    if isinstance(value, dict):
        return {k: REDACTED if is_secret_name(str(k)) else _redacted(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_redacted(v) for v in value]
    return value
