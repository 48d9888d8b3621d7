"""Monkey Web's rerun form on a job page: the job's parameters as fields (and its provider,
CPUs, GPUs, memory, time limit, name), posted with the session's CSRF token and queued by
the API's own ``rerun`` call (as `monkey rerun JOB --set K=V`: any user may rerun a job
they see, and owns the new one; a job carrying another user's secret env values is
refused by the call itself); then the new job's page. A refused value shows its one-line
error on the form, the values typed kept, nothing queued."""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from monkey.models import Forbidden, MonkeyError, whole_number
from monkey.server.calls import run_call
from monkey.server.door import check

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from monkey.api import Monkey

    Web = Any  # monkey.server.web.app.Web (which imports this module)

PARAM = "p:"  # a parameter field's name prefix
FIELDS = ("provider", "cpus", "gpus", "memory", "time", "name")


def routes(
    web: Web, headers: Callable[[Response], Response], job_page: Callable[..., dict[str, Any]]
) -> list[Route]:
    """The rerun form's route, under /web (HEADERS: adds the app's security headers;
    JOB_PAGE: ``views.job_page``, the job page's values shown again with an error)."""
    return [Route("/jobs/{ref}/rerun", RerunPage(web, headers, job_page).post, methods=["POST"])]


def text(value: Any) -> str:
    """A parameter's value as a field shows it (and `--set` takes it back)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def limit_text(seconds: int | None) -> str:
    """A time limit as `--time` takes it, in its largest whole unit."""
    if not seconds:
        return ""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def form_values(m: Monkey, info: dict[str, Any], user: dict[str, Any]) -> dict[str, Any]:
    """The rerun form as the job page first shows it, and the clone lines: {"params":
    [(name, value)], "provider", "providers", "cpus", "gpus", "memory", "time", "name",
    "refused" (why USER may not rerun it, or None)}."""
    res = info["resources"]
    refused = None
    if m.carries_secrets(info["job"]) and info.get("owner") != user["name"]:
        refused = (
            f"it carries secret env values of {info.get('owner')}; only they may run it "
            "again (submit your own with `monkey run --env`)"
        )
    try:
        providers = sorted(m.providers)
    except MonkeyError:
        providers = [info["provider"]]
    return {
        "params": [(k, text(v)) for k, v in sorted(info.get("params", {}).items())],
        "provider": info["provider"],
        "providers": providers if info["provider"] in providers else [info["provider"], *providers],
        "cpus": text(res.get("cpus")),
        "gpus": text(res.get("gpus")),
        "memory": text(res.get("memory")),
        "time": limit_text(res.get("time")),
        "name": text(info.get("name")),
        "refused": refused,
    }


def call_args(form: dict[str, str], shown: dict[str, Any]) -> dict[str, Any]:
    """The ``rerun`` call's keyword arguments from FORM: the parameters and fields changed
    from SHOWN (the form as first shown); MonkeyError naming a field that is not a number."""
    before = dict(shown["params"])
    sets = {
        k[len(PARAM) :]: v
        for k, v in form.items()
        if k.startswith(PARAM) and before.get(k[len(PARAM) :]) != v
    }
    kwargs: dict[str, Any] = {"set": sets} if sets else {}
    for field in FIELDS:
        value = form.get(field, "").strip()
        if value == shown[field] or (not value and field != "name"):
            continue
        if field in ("cpus", "gpus"):
            number = whole_number(value)
            if number is None:
                raise MonkeyError(f"{field} {value!r} is not a whole number; write e.g. 2")
            kwargs[field] = number
        else:
            kwargs[field] = value or None
    return kwargs


class RerunPage:
    def __init__(
        self,
        web: Web,
        headers: Callable[[Response], Response],
        job_page: Callable[..., dict[str, Any]],
    ) -> None:
        self.web, self.headers, self.job_page = web, headers, job_page

    async def post(self, request: Request) -> Response:
        web = self.web
        session = await web.form_session(request)
        if isinstance(session, Response):
            return session
        form = await posted(request)
        ref = request.path_params["ref"]
        user = session["user"]
        try:
            data = await run_in_threadpool(lambda: self.job_page(web.monkey(), ref, user))
        except MonkeyError as exc:
            return web.page("error.html", 404, session, title=f"Job {ref}", message=str(exc))
        juid = data["info"]["job"]
        status = 400
        try:
            kwargs = call_args(form, data["rerun"])
            new = await run_in_threadpool(
                lambda: run_call(web.monkey(), user, "rerun", check("rerun", [juid], kwargs))
            )
            return self.headers(RedirectResponse(f"/web/jobs/{new}", 303))
        except Forbidden as exc:
            error, status = str(exc), 403
        except MonkeyError as exc:
            error = str(exc)
        typed = {
            **data["rerun"],
            "params": [(k, form.get(PARAM + k, v)) for k, v in data["rerun"]["params"]],
            **{f: form.get(f, data["rerun"][f]) for f in FIELDS},
        }
        return web.page(
            "job.html", status, session, **{**data, "rerun": typed, "rerun_error": error}
        )


async def posted(request: Request) -> dict[str, Any]:
    """The posted form: each field's first value, ``datasets`` as the list of all ticked
    (bounded by monkey.server.bounds, as the other forms)."""
    from urllib.parse import parse_qsl

    body = await request.body()
    fields: dict[str, Any] = {"datasets": []}
    for key, value in parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True):
        if key == "datasets":
            fields["datasets"].append(value)
        else:
            fields.setdefault(key, value)
    return fields
