"""The note and tags of a job or a sweep, set from its page's form on Monkey Web (its owner
or an admin, under the API's own rule), under /web."""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from monkey.models import Forbidden, MonkeyError
from monkey.server.calls import run_call
from monkey.server.door import check
from monkey.server.web.rerun_form import posted

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    Web = Any  # monkey.server.web.app.Web (which imports this module)


def routes(web: Web, headers: Callable[[Response], Response]) -> list[Route]:
    """The note forms' routes, under /web (HEADERS: adds the app's security headers)."""
    forms = Annotate(web, headers)
    return [
        Route("/jobs/{ref}/notes", forms.job_notes, methods=["POST"]),
        Route("/sweeps/{ref}/notes", forms.sweep_notes, methods=["POST"]),
    ]


class Annotate:
    """The note forms of one Monkey Web (WEB)."""

    def __init__(self, web: Web, headers: Callable[[Response], Response]) -> None:
        self.web, self.headers = web, headers

    async def job_notes(self, request: Request) -> Response:
        """A job's note and tags from its page's form (its owner or an admin)."""
        return await self._annotate(request, "job", self.web._job_page, "jobs")

    async def sweep_notes(self, request: Request) -> Response:
        """A sweep's note and tags from its page's form (the owner of all its runs or an
        admin)."""
        return await self._annotate(request, "sweep", self.web._sweep_page, "sweeps")

    async def _annotate(
        self, request: Request, kind: str, page: Callable[..., Any], where: str
    ) -> Response:
        """The note (blank: none) and tags (separated by spaces) a form sets on the job or
        sweep (KIND) of the URL, checked whole before anything is written, each written
        by ``run_call`` under the API's own rule; then back to its page."""
        session = await self.web.form_session(request)
        if isinstance(session, Response):
            return session
        form = await posted(request)
        ref = request.path_params["ref"]
        user = session["user"]

        def write() -> None:
            from monkey.facade import notes

            m = self.web.monkey()
            text = form.get("note", "").strip() or None
            tags = notes.check_tags(form.get("tags", "").replace(",", " ").split())
            if text is not None:
                text = notes.check_note(text)
            if len(tags) > notes.TAGS_MAX:
                raise MonkeyError(f"{len(tags)} tags: at most {notes.TAGS_MAX}")
            key = m.resolve(ref) if kind == "job" else m.sweep_id(ref)
            got = m.annotations(kind, key)
            now, said = got["tags"], (got["note"] or {}).get("text")
            prefix = "" if kind == "job" else "sweep_"
            if text != said:
                run_call(m, user, prefix + "note", check(prefix + "note", [key, text], {}))
            add, remove = [t for t in tags if t not in now], [t for t in now if t not in tags]
            if add or remove:
                run_call(m, user, prefix + "tag", check(prefix + "tag", [key, add, remove], {}))

        error, status = "", 0
        try:
            await run_in_threadpool(write)
        except Forbidden as exc:
            error, status = str(exc), 403
        except MonkeyError as exc:
            error, status = str(exc), 400
        await self.web._audit(
            f"{kind} note",
            user["name"],
            (request.client.host if request.client else "?") or "?",
            error or "from Monkey Web",
            outcome="refused" if status == 403 else "error" if status else "ok",
            target=ref,
        )
        if status:
            return await page(request, session, error, status)
        return self.headers(RedirectResponse(f"/web/{where}/{ref}#notes", 303))
