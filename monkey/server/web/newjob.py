"""Monkey Web's new-job page (/web/new): a form (command, provider, CPUs, GPUs, memory, time
limit, name, env KEY=VALUE lines, datasets) queued by the API's own ``run`` call under its
rule, with the session's CSRF token. A browser has no working folder, so the code comes
from a job: "run again from job X" (/web/new?from=X) takes X's code snapshot, git record,
job.yml, outputs, packages listing and (those ticked) datasets, as `monkey rerun` would,
and its command to start from; without a job the command runs in an empty folder (no
code). Env values follow `run --env`: a secret-looking one goes to a 0600 file, never
the database; X's secret values are never carried (type them again). A refused value
shows its one-line error on the form, what was typed kept, nothing queued."""

from __future__ import annotations

import shlex
import sys

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from monkey.models import REDACTED, Forbidden, MonkeyError, whole_number
from monkey.server.calls import run_call
from monkey.server.door import check
from monkey.server.web.rerun_form import limit_text, posted

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from monkey.api import Monkey

    Web = Any  # monkey.server.web.app.Web (which imports this module)


def routes(web: Web, headers: Callable[[Response], Response]) -> list[Route]:
    """The new-job page's route, under /web (HEADERS: adds the app's security headers)."""
    page = NewJobPage(web, headers)
    return [Route("/new", page.handle, methods=["GET", "POST"])]


def form_for(m: Monkey, ref: str | None) -> dict[str, Any]:
    """The form as first shown: blank, or from job REF (its command, resources, name, plain
    env and datasets); {"values", "source", "datasets", "providers", "dropped"}."""
    from monkey.submit import CAPTURED_ENV

    providers = _providers(m)
    values = {
        "command": "",
        "provider": "local" if "local" in providers else (providers or [""])[0],
        "cpus": "1",
        "gpus": "0",
        "memory": "",
        "time": "",
        "name": "",
        "env": "",
    }
    if not ref:
        return {"values": values, "source": None, "datasets": [], "providers": providers}
    job = m.get_job(ref)
    shown = {k: v for k, v in job.env.items() if k not in CAPTURED_ENV and v != REDACTED}
    values.update(
        command=shlex.join(job.argv),
        provider=job.provider,
        cpus=str(job.resources.cpus),
        gpus=str(job.resources.gpus),
        memory=job.resources.memory or "",
        time=limit_text(job.resources.time),
        name=job.name,
        env="\n".join(f"{k}={v}" for k, v in sorted(shown.items())),
    )
    return {
        "values": values,
        "source": job.juid,
        "datasets": [{"name": d["name"], "digest": d["digest"]} for d in job.datasets],
        "dropped": sorted(k for k, v in job.env.items() if v == REDACTED),
        "providers": providers if job.provider in providers else [job.provider, *providers],
    }


def _providers(m: Monkey) -> list[str]:
    try:
        return sorted(m.providers)
    except MonkeyError:
        return []


def env_lines(text: str) -> dict[str, str]:
    """KEY=VALUE lines (blank lines and # comments skipped) as a mapping; MonkeyError
    naming the first line that is not one, as `run --env` does."""
    given: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise MonkeyError(f"env line {n} {line!r} is not KEY=VALUE; write e.g. SEED=1")
        given[key.strip()] = value
    return given


def gathered(m: Monkey, source: str | None, env: dict[str, str], datasets: list[str]) -> Any:
    """The ``run`` call's ``gathered`` submission: job SOURCE's code and record (its DATASETS
    named) or an empty folder's, with ENV split into plain and secret as `run --env`."""
    from monkey.snapshot.blobs import BlobStore
    from monkey.submit import CAPTURED_ENV, Submitter

    plain, secret = Submitter.split_env(env)  # checks the names; this machine's PATH, ...
    blobs = BlobStore(m.home.blobs)
    if source is None:
        snapshot = m.empty_snapshot(blobs)
        packages = m.packages_listing(blobs)[0]  # this server's Python, as `run` on it
        fields: dict[str, Any] = {
            "snapshot": snapshot,
            "workdir": "(none: a job from Monkey Web without code)",
            "datasets": [],
            "git": {},
            "python": sys.version.split()[0],
            "spec": None,
            "outputs": [],
            "packages": packages,
        }
    else:
        job = m.get_job(source)
        known = {d["name"]: d for d in job.datasets}
        unknown = sorted(set(datasets) - set(known))
        if unknown:
            raise MonkeyError(f"job {job.juid} has no dataset {unknown[0]!r}; tick its own")
        plain.update({k: v for k, v in job.env.items() if k in CAPTURED_ENV})  # as X ran
        plain.update({k: v for k, v in env.items() if k not in secret})  # typed ones win
        fields = {
            "snapshot": job.snapshot,
            "workdir": job.workdir,
            "datasets": [known[n] for n in datasets],
            "git": job.git,
            "python": job.python,
            "spec": m.job_spec(job.juid),
            "outputs": m.job_outputs(job.juid),
            "packages": m.job_packages(job.juid) or m.packages_listing(blobs)[0],
        }
    fields.update(env=plain, retries=0)
    return {"fields": fields, "name": None, "secrets": secret}


def call_kwargs(m: Monkey, form: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """The ``run`` call's arguments from the posted FORM; MonkeyError for a bad value."""
    from monkey.submit import parse_command

    argv = parse_command(str(form.get("command", "")))
    kwargs: dict[str, Any] = {"provider": str(form.get("provider") or "local")}
    for field in ("cpus", "gpus"):
        value = str(form.get(field, "")).strip() or ("1" if field == "cpus" else "0")
        number = whole_number(value)
        if number is None:
            raise MonkeyError(f"{field} {value!r} is not a whole number; write e.g. 2")
        kwargs[field] = number
    for field in ("memory", "time", "name"):
        value = str(form.get(field, "")).strip()
        if value:
            kwargs[field] = value
    source = str(form.get("from", "")).strip() or None
    picked = [str(d) for d in form.get("datasets", [])]
    kwargs["gathered"] = gathered(m, source, env_lines(str(form.get("env", ""))), picked)
    return argv, kwargs


class NewJobPage:
    def __init__(self, web: Web, headers: Callable[[Response], Response]) -> None:
        self.web, self.headers = web, headers

    async def handle(self, request: Request) -> Response:
        web = self.web
        session = await web.session(request)
        if session is None:
            return web.to_login(request)
        source = request.query_params.get("from", "").strip() or None
        if request.method == "POST":
            refused = await web._check_csrf(request, session)
            if refused:
                return refused
            form = await posted(request)
            source = str(form.get("from", "")).strip() or None
        try:
            shown = await run_in_threadpool(lambda: form_for(web.monkey(), source))
        except MonkeyError as exc:
            return web.page("error.html", 404, session, title="New job", message=str(exc))
        if request.method == "GET":
            picked = [d["name"] for d in shown["datasets"]]
            return web.page("new.html", session=session, picked=picked, **shown)
        status = 400
        try:
            argv, kwargs = await run_in_threadpool(lambda: call_kwargs(web.monkey(), form))
            juid = await run_in_threadpool(
                lambda: run_call(web.monkey(), session["user"], "run", check("run", [argv], kwargs))
            )
            return self.headers(RedirectResponse(f"/web/jobs/{juid}", 303))
        except Forbidden as exc:
            error, status = str(exc), 403
        except MonkeyError as exc:
            error = str(exc)
        typed = {k: str(form.get(k, "")) for k in shown["values"]}
        return web.page(
            "new.html",
            status,
            session,
            error=error,
            **{**shown, "values": typed, "picked": list(form.get("datasets", []))},
        )
