"""Monkey Web's routes under /web: login with a token (or a one-time link from `monkey
web`) into a session cookie (HttpOnly, Secure, SameSite=Strict; the session a file of
MONKEY_HOME, see monkey.server.websession), a CSRF token on every form, the pages, their
live feeds (server-sent events) and the static files (cached for a year: their URLs carry
monkey's version); pages, series and files gzip-compressed for a browser that takes it."""

from __future__ import annotations

import functools
import hmac
import json
import math
import secrets
from collections.abc import AsyncIterator, Callable, Container, Iterator
from pathlib import Path
from urllib.parse import urlencode

import anyio
import jinja2
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.gzip import GZipMiddleware
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import BaseRoute, Mount, Route

from monkey.client_agent import rundir
from monkey.config import Home
from monkey.models import Forbidden, MonkeyError
from monkey.server import websession
from monkey.server.calls import run_call
from monkey.server.door import check
from monkey.server.web import annotate, code, exports, files, newjob, rerun_form, views
from monkey.server.web.render import AnsiHtml, cell
from monkey.server.web.rerun_form import posted
from monkey.tracking.series import SeriesCache

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, TypeVar

    from monkey.api import Monkey
    from monkey.server.auth import Gate

    R = TypeVar("R", bound=Response)

HERE = Path(__file__).parent
STATIC = HERE / "static"
COOKIE = "monkey_session"
LOGIN_COOKIE = "monkey_login"  # the login form's CSRF token (double submit)
TAIL = 2000  # lines of output a job page starts from
FOLLOWERS = 200  # live feeds served at once
KEEP_ALIVE = 10.0  # seconds between a quiet log feed's keep-alives
TYPES = {
    ".js": "text/javascript",
    ".css": "text/css",
    ".svg": "image/svg+xml",
    ".txt": "text/plain",
    ".md": "text/plain",
}
SECURITY = {
    "Content-Security-Policy": (
        "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
        "frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",  # a one-time link never leaves in a Referer
    "X-Frame-Options": "DENY",
}


def _version() -> str:
    from monkey import __version__

    return __version__


_templates = jinja2.Environment(
    loader=jinja2.FileSystemLoader(HERE / "templates"),
    autoescape=True,  # every user string escaped, in every template
    trim_blocks=True,
    lstrip_blocks=True,
)


class Web:
    """The pages over MONKEY_HOME HOME; MONKEY gives the calling thread's facade; GATE
    checks tokens (and refuses an address that failed too often)."""

    def __init__(self, home: Home, monkey: Callable[[], Monkey], gate: Gate) -> None:
        self.home, self.monkey, self.gate = home, monkey, gate
        self._limiter: Any = None
        self._change: tuple[float, tuple[float, int]] | None = None  # (read at, value)
        self.series = SeriesCache()  # the charts' long series, read once

    def last_change(self) -> tuple[float, int]:
        """The store's last job change, read at most every half second however many pages
        watch it (each live page asks twice a second)."""
        import time

        now = time.monotonic()
        if self._change is None or now - self._change[0] >= 0.45:
            self._change = (now, self.monkey().last_job_change())
        return self._change[1]

    def routes(self) -> list[BaseRoute]:
        return [
            Route("/favicon.ico", self.icon),  # asked by browsers unbidden: never a refused token
            Mount(
                "/web",
                routes=[
                    Route("/", self.index),
                    Route("/login", self.login, methods=["GET", "POST"]),
                    Route("/logout", self.logout, methods=["POST"]),
                    Route("/jobs", self.jobs),
                    Route("/events", self.events),
                    Route("/changed", self.changed),
                    Route("/jobs/{ref}", self.job),
                    Route("/jobs/{ref}/log", self.log_feed),
                    Route("/jobs/{ref}/output.txt", self.download),
                    Route("/jobs/{ref}/metrics", self.metrics),
                    Route("/jobs/{ref}/action", self.action, methods=["POST"]),
                    Route("/providers", self.providers),
                    Route("/compare", self.compare),
                    Route("/sweeps", self.sweeps),
                    Route("/sweeps/{ref}", self.sweep),
                    Route("/sweeps/{ref}/action", self.sweep_action, methods=["POST"]),
                    *code.routes(self, _headers),
                    *files.routes(self, _headers),
                    *rerun_form.routes(self, _headers, views.job_page),
                    *newjob.routes(self, _headers),
                    *exports.routes(self, _headers),
                    *annotate.routes(self, _headers),
                    Route("/static/{path:path}", self.static),
                ],
                # pages and series compressed (the live feeds are not: text/event-stream)
                middleware=[Middleware(GZipMiddleware, minimum_size=1000, compresslevel=6)],
            ),
        ]

    # -- sessions ---------------------------------------------------------------------

    async def session(self, request: Request) -> dict[str, Any] | None:
        """{"user": the user's record, "csrf"} of the request's session, or None."""

        def look() -> dict[str, Any] | None:
            found = websession.session(self.home, request.cookies.get(COOKIE))
            if found is None:
                return None
            user = self.monkey().user(found["user"])
            if user is None or found.get("key") != websession.token_key(user["digest"]):
                # the user removed, or its token rotated since this session was opened
                websession.end_session(self.home, request.cookies.get(COOKIE))
                return None
            return {"user": user, "csrf": found["csrf"]}

        return await run_in_threadpool(look)

    def _open_session(self, name: str) -> tuple[str, str]:
        """A session of user NAME bound to its token as it is now (("", "") when the
        user is gone)."""
        user = self.monkey().user(name)
        if user is None:
            return "", ""
        return websession.create_session(self.home, name, websession.token_key(user["digest"]))

    def to_login(self, request: Request) -> Response:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return _headers(RedirectResponse(f"/web/login?{urlencode({'next': target})}", 303))

    @staticmethod
    def _set_cookie(response: Response, sid: str) -> None:
        response.set_cookie(
            COOKIE,
            sid,
            max_age=websession.SESSION_DAYS * 86400,
            path="/web",
            httponly=True,
            secure=True,
            samesite="strict",
        )

    # -- pages ------------------------------------------------------------------------

    def page(
        self, template: str, status: int = 200, session: dict[str, Any] | None = None, **values: Any
    ) -> HTMLResponse:
        body = _templates.get_template(template).render(
            version=_version(), session=session, **values
        )
        return _headers(HTMLResponse(body, status))

    async def index(self, request: Request) -> Response:
        return _headers(RedirectResponse("/web/jobs", 303))

    async def login(self, request: Request) -> Response:
        target = _safe_next(request.query_params.get("next"))
        address = (request.client.host if request.client else "?") or "?"
        if request.method == "GET" and "once" in request.query_params:
            user = await run_in_threadpool(
                websession.consume_link, self.home, request.query_params["once"]
            )
            if user is None:
                return await self._login_form(
                    target,
                    "this link was used already or has expired; log in with your token, "
                    "or run `monkey web` again for a new link",
                    403,
                )
            sid, _ = await run_in_threadpool(self._open_session, user)
            if not sid:
                return await self._login_form(target, f"no user {user!r} any more", 403)
            await self._audit("web login", user, address, "one-time link")
            # a page that moves on by itself, rather than a redirect: a navigation started
            # elsewhere (a terminal, a chat) does not carry SameSite=Strict cookies
            answer = self.page("moving.html", target=target)
            self._set_cookie(answer, sid)
            return answer
        if request.method == "GET":
            return await self._login_form(target)
        form = await posted(request)
        given = str(form.get("csrf", ""))
        expected = request.cookies.get(LOGIN_COOKIE, "")
        if not expected or not hmac.compare_digest(given, expected):
            return await self._login_form(target, "the form had expired; log in again", 403)
        token = str(form.get("token", "")).strip()
        wait = self.gate.retry_after(address, token)
        if wait:
            await self._audit("token refused", None, address, "too many (429)", token, "refused")
            refused = await self._login_form(
                target, f"too many refused tokens from this address; try again in {wait}s", 429
            )
            refused.headers["Retry-After"] = str(wait)
            return refused
        found = await run_in_threadpool(self.gate.user, token, address)
        if found is None:
            await self._audit("token refused", None, address, None, token, "refused")
            return await self._login_form(
                target,
                "that token was refused; `monkey server user token NAME` on the main node "
                "gives a new one",
                401,
            )
        sid, _ = await run_in_threadpool(
            websession.create_session,
            self.home,
            found["name"],
            websession.token_key(found["digest"]),
        )
        await self._audit("web login", found["name"], address, "token")
        redirect = _headers(RedirectResponse(target, 303))
        self._set_cookie(redirect, sid)
        redirect.delete_cookie(LOGIN_COOKIE, path="/web/login")
        return redirect

    async def _audit(
        self,
        action: str,
        user: str | None,
        peer: str,
        detail: str | None = None,
        token: str | None = None,
        outcome: str = "ok",
        target: str | None = "/web/login",
    ) -> None:
        """An event of the pages in the audit log (a refused TOKEN: its prefix only)."""
        from monkey.server import audit
        from monkey.server.auth import token_prefix

        await run_in_threadpool(
            lambda: audit.record(
                self.home,
                action,
                user=user,
                peer=peer,
                target=target,
                outcome=outcome,
                detail=detail,
                token=token_prefix(token) if outcome == "refused" else None,
            )
        )

    async def _login_form(
        self, target: str, error: str | None = None, status: int = 200
    ) -> Response:
        csrf = secrets.token_urlsafe(24)
        answer = self.page("login.html", status, target=target, csrf=csrf, error=error)
        answer.set_cookie(
            LOGIN_COOKIE,
            csrf,
            max_age=3600,
            path="/web/login",
            httponly=True,
            secure=True,
            samesite="strict",
        )
        return answer

    async def logout(self, request: Request) -> Response:
        session = await self.form_session(request)
        if isinstance(session, Response):
            return session
        await run_in_threadpool(websession.end_session, self.home, request.cookies.get(COOKIE))
        answer = _headers(RedirectResponse("/web/login", 303))
        answer.delete_cookie(COOKIE, path="/web")
        return answer

    async def form_session(self, request: Request) -> dict[str, Any] | Response:
        """The session of a posted form, or the answer when there is none (the login page)
        or the form's CSRF token is wrong (403)."""
        session = await self.session(request)
        if session is None:
            return self.to_login(request)
        refused = await self._check_csrf(request, session)
        return refused if refused is not None else session

    async def _check_csrf(self, request: Request, session: dict[str, Any]) -> Response | None:
        form = await posted(request)
        if hmac.compare_digest(str(form.get("csrf", "")), session["csrf"]):
            return None
        return self.page(
            "error.html",
            403,
            session,
            title="Refused",
            message="this form carried no valid CSRF token (it was not sent by a page of "
            "this server, or the session changed); reload the page and try again",
        )

    async def jobs(self, request: Request) -> Response:
        session = await self.session(request)
        if session is None:
            return self.to_login(request)
        q = request.query_params
        user = session["user"]["name"]
        if not request.url.query:  # the list as the user last sorted it, in the URL
            view = await run_in_threadpool(self._remembered_view, user)
            if view:
                return _headers(RedirectResponse(f"/web/jobs?{urlencode(view)}", 303))
        filters = {k: q.get(k, "") for k in views.FILTERS}
        before = q.get("before") or None
        sort, reverse = q.get("sort") or None, bool(q.get("reverse"))
        try:
            start = max(0, int(q.get("start") or 0))
            columns = await run_in_threadpool(self._columns, user, q)
            data = await run_in_threadpool(
                lambda: views.jobs_page(
                    self.monkey(), filters, before, sort, reverse, start, columns
                )
            )
        except ValueError:
            message = f"start {q.get('start')!r}: give a whole number of jobs to skip"
            return self.page("error.html", 400, session, title="Jobs", message=message)
        except MonkeyError as exc:
            return self.page("error.html", 400, session, title="Jobs", message=str(exc))
        if sort and not q.get("fragment"):
            await run_in_threadpool(self._remember_sort, user, sort, reverse)
        shown = {"filters": filters, "before": before, "start": start, "sort": sort, **data}
        shown["reverse"] = reverse
        # the chosen columns in every link of the list, so a link shows them to anyone
        shown["view"] = [("cols", "1"), *(("col", c) for c in columns)] if columns else []
        if q.get("fragment"):
            return self.page("jobs_rows.html", session=session, **shown)
        return self.page("jobs.html", session=session, **shown)

    def _remembered_view(self, user: str) -> list[tuple[str, str]]:
        """USER's remembered columns and sort of the jobs list, as a query ([] when none)."""
        from monkey.server import webprefs

        prefs = webprefs.load(self.home, user)
        columns = [str(c) for c in prefs.get("jobs_columns") or []]
        view = [("cols", "1"), *(("col", c) for c in columns)] if columns else []
        sort = prefs.get("jobs_sort")
        if isinstance(sort, list) and len(sort) == 2 and sort[0] in (*views.JOB_SORTS, *columns):
            view += [("sort", str(sort[0]))] + ([("reverse", "1")] if sort[1] else [])
        return view

    def _remember_sort(self, user: str, sort: str, reverse: bool) -> None:
        from monkey.server import webprefs

        webprefs.remember(self.home, user, "jobs_sort", [sort, reverse])

    def _columns(self, user: str, q: Any) -> list[str]:
        """The jobs list's chosen columns: the URL's (``cols`` set: the ``col`` values),
        remembered as USER's; else the ones USER chose last."""
        from monkey.server import webprefs

        if "cols" not in q:
            return list(webprefs.load(self.home, user).get("jobs_columns") or [])
        chosen = views.check_columns(q.getlist("col"))
        webprefs.remember(self.home, user, "jobs_columns", chosen)
        return chosen

    async def job(self, request: Request) -> Response:
        session = await self.session(request)
        if session is None:
            return self.to_login(request)
        return await self._job_page(request, session)

    async def _job_page(
        self, request: Request, session: dict[str, Any], error: str | None = None, status: int = 200
    ) -> Response:
        ref = request.path_params["ref"]
        try:
            data = await run_in_threadpool(
                lambda: views.job_page(self.monkey(), ref, session["user"])
            )
        except MonkeyError as exc:
            return self.page("error.html", 404, session, title=f"Job {ref}", message=str(exc))
        return self.page("job.html", status, session, error=error, **data)

    async def action(self, request: Request) -> Response:
        """A job's action (cancel, pause, resume, retry) from its page."""
        return await self._act(
            request,
            views.ACTIONS,
            lambda what, ref: (what, [ref]),
            self._job_page,
            "jobs",
        )

    async def _act(
        self,
        request: Request,
        allowed: Container[str],
        call: Callable[[str, str], tuple[str, list[str]]],
        page: Callable[..., Any],
        where: str,
    ) -> Response:
        """A form's action on the job or sweep of the URL: logged in, its CSRF token right,
        one of ALLOWED, carried out by ``run_call`` (CALL(action, ref): the API's name and
        arguments) under the API's own rule (the owner or an admin); then back to its page
        (PAGE, with the error when it failed)."""
        session = await self.form_session(request)
        if isinstance(session, Response):
            return session
        what = str((await posted(request)).get("action", ""))
        if what not in allowed:
            return await page(request, session, f"no action {what!r} here", 400)
        ref = request.path_params["ref"]
        name, args = call(what, ref)
        error, status = "", 0
        try:
            await run_in_threadpool(
                lambda: run_call(self.monkey(), session["user"], name, check(name, args, {}))
            )
        except Forbidden as exc:
            error, status = str(exc), 403
        except MonkeyError as exc:
            error, status = str(exc), 400
        await self._audit(
            name if name != "sweep_control" else f"sweep {what}",
            session["user"]["name"],
            (request.client.host if request.client else "?") or "?",
            error or "from Monkey Web",
            outcome="refused" if status == 403 else "error" if status else "ok",
            target=ref,
        )
        if status:
            return await page(request, session, error, status)
        return _headers(RedirectResponse(f"/web/{where}/{ref}", 303))

    async def metrics(self, request: Request) -> Response:
        """A job's series for its charts (``series.job_series``): ``width`` pixels, ``x``
        (step, epoch or time), the window ``from`` .. ``to`` a zoom shows, or only the
        points logged after ``since`` (the "last" of the page's previous answer)."""
        session = await self.session(request)
        if session is None:
            return JSONResponse({"error": "log in first"}, 401)
        q = request.query_params
        try:
            width = max(50, min(4000, int(q.get("width", "1000"))))
        except ValueError:
            width = 1000
        try:
            window = (float(q["from"]), float(q["to"])) if "from" in q or "to" in q else None
            since = int(q["since"]) if q.get("since") else None
        except (KeyError, ValueError):
            message = "give from and to as numbers (the x range shown), since as a whole number"
            return _headers(JSONResponse({"error": message}, 400))
        if window is not None and not (all(map(math.isfinite, window)) and window[0] < window[1]):
            message = f"from {q['from']} to {q['to']}: give finite numbers, from below to"
            return _headers(JSONResponse({"error": message}, 400))
        ref = request.path_params["ref"]
        try:
            data = await run_in_threadpool(
                lambda: self.monkey().metric_series(
                    ref,
                    self.series,
                    width,
                    q.get("x", "step"),
                    window,
                    since,
                    q.getlist("name"),
                )
            )
        except MonkeyError as exc:
            return _headers(JSONResponse({"error": str(exc)}, 404))
        return _headers(JSONResponse(data))

    async def download(self, request: Request) -> Response:
        session = await self.session(request)
        if session is None:
            return self.to_login(request)
        ref = request.path_params["ref"]
        try:
            juid = await run_in_threadpool(lambda: self.monkey().resolve(ref))
        except MonkeyError as exc:
            return self.page("error.html", 404, session, title=f"Job {ref}", message=str(exc))

        def body() -> Iterator[bytes]:
            from monkey.api import Monkey

            m = Monkey(self.home)  # its own: the chunks are read in whichever thread is free
            try:
                yield from m.output_chunks(juid)
            finally:
                m.close()

        return _headers(
            StreamingResponse(
                body(),
                media_type="text/plain; charset=utf-8",
                headers={"Content-Disposition": f'attachment; filename="{juid}.txt"'},
            )
        )

    async def compare(self, request: Request) -> Response:
        session = await self.session(request)
        if session is None:
            return self.to_login(request)
        refs = list(dict.fromkeys(request.query_params.getlist("job")))
        try:
            data = await run_in_threadpool(lambda: views.compare_page(self.monkey(), refs))
        except MonkeyError as exc:
            return self.page("error.html", 400, session, title="Compare", message=str(exc))
        return self.page("compare.html", session=session, **data)

    async def providers(self, request: Request) -> Response:
        session = await self.session(request)
        if session is None:
            return self.to_login(request)
        try:
            data = await run_in_threadpool(lambda: views.providers_page(self.monkey()))
        except MonkeyError as exc:  # providers.yml unreadable: said, as list providers says it
            return self.page("error.html", 500, session, title="Providers", message=str(exc))
        return self.page("providers.html", session=session, **data)

    async def sweeps(self, request: Request) -> Response:
        session = await self.session(request)
        if session is None:
            return self.to_login(request)
        data = await run_in_threadpool(lambda: views.sweeps_page(self.monkey()))
        return self.page("sweeps.html", session=session, **data)

    async def sweep(self, request: Request) -> Response:
        session = await self.session(request)
        if session is None:
            return self.to_login(request)
        return await self._sweep_page(request, session)

    async def _sweep_page(
        self,
        request: Request,
        session: dict[str, Any],
        error: str | None = None,
        status: int = 200,
    ) -> Response:
        ref = request.path_params["ref"]
        q = request.query_params
        try:
            data = await run_in_threadpool(
                lambda: views.sweep_page(
                    self.monkey(),
                    ref,
                    session["user"],
                    q.get("sort"),
                    bool(q.get("reverse")),
                    bool(q.get("constants")),
                )
            )
        except MonkeyError as exc:
            return self.page("error.html", 404, session, title=f"Sweep {ref}", message=str(exc))
        return self.page("sweep.html", status, session, error=error, cell=cell, **data)

    async def sweep_action(self, request: Request) -> Response:
        """An action on every run of a sweep, from its page (the owner of all its jobs or
        an admin)."""
        return await self._act(
            request,
            views.SWEEP_ACTIONS,
            lambda what, ref: ("sweep_control", [ref, what]),
            self._sweep_page,
            "sweeps",
        )

    # -- live feeds (server-sent events) ----------------------------------------------

    async def events(self, request: Request) -> Response:
        """``changed`` whenever any job is added, changes or goes (the jobs page reloads
        its rows), a comment every 15 s to keep the connection."""
        if await self.session(request) is None:
            return JSONResponse({"error": "log in first"}, 401)

        async def feed() -> AsyncIterator[bytes]:
            last = None
            quiet = 0.0
            yield b"retry: 2000\n\n"
            while True:
                now = await run_in_threadpool(self.last_change)
                if now != last:
                    if last is not None:
                        yield f"event: changed\ndata: {now[0]}\n\n".encode()
                    last, quiet = now, 0.0
                elif quiet >= 15:
                    yield b": keep-alive\n\n"
                    quiet = 0.0
                await anyio.sleep(0.5)
                quiet += 0.5

        return _sse(feed())

    async def changed(self, request: Request) -> Response:
        """{"at": the store's last job change}: what a page's live state line polls (a
        request a second, no connection held), fetching its page again when it moves."""
        if await self.session(request) is None:
            return JSONResponse({"error": "log in first"}, 401)
        return _headers(JSONResponse({"at": list(await run_in_threadpool(self.last_change))}))

    async def log_feed(self, request: Request) -> Response:
        """The job's output as events, each {"s": "out"|"err"|"mark", "h": its HTML},
        with the byte offsets reached as the event id: a browser that reconnects sends it
        back (Last-Event-ID, or ``from`` when a hidden page reopens its feed) and the feed
        resumes there, nothing lost or doubled; ``changed`` when any job changed (what
        /web/changed says: the page's live parts follow it without polling); ``end`` when
        the job has ended."""
        if await self.session(request) is None:
            return JSONResponse({"error": "log in first"}, 401)
        ref = request.path_params["ref"]
        try:
            juid = await run_in_threadpool(lambda: self.monkey().resolve(ref))
        except MonkeyError as exc:
            return JSONResponse({"error": str(exc)}, 404)
        start = None
        try:
            given = request.headers.get("last-event-id") or request.query_params.get("from")
            start = json.loads(given or "null")  # where a reconnecting page stopped
        except ValueError:
            start = None
        if not isinstance(start, dict):
            start = None
        return _sse(self._threaded(_log_events(self.home, juid, start)))

    async def _threaded(self, events: Iterator[bytes]) -> AsyncIterator[bytes]:
        """EVENTS read in threads of their own: a follow waits in its thread between
        writes and must not take the threads the pages are served from (an empty event:
        a wait, nothing sent)."""
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(FOLLOWERS)
        try:
            while True:
                event = await anyio.to_thread.run_sync(next, events, None, limiter=self._limiter)
                if event is None:
                    return
                if event:
                    yield event
        finally:  # also when the page went away (cancelled): its store closed, its thread freed
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(events.close, limiter=self._limiter)  # type: ignore[attr-defined]

    async def icon(self, request: Request) -> Response:
        return RedirectResponse("/web/static/icon.svg", 301)

    async def static(self, request: Request) -> Response:
        """One of the files shipped in ``static/``, looked up by name (a name from the URL
        never becomes a path: `x%00`, `../`, anything else is a 404)."""
        path = _static_files().get(request.path_params["path"])
        if path is None:
            return Response("not found", 404, media_type="text/plain")
        media = TYPES.get(path.suffix, "application/octet-stream")
        return Response(
            path.read_bytes(),
            media_type=media,
            headers={
                "Cache-Control": "public, max-age=31536000, immutable",
                "X-Content-Type-Options": "nosniff",
            },
        )


@functools.cache
def _static_files() -> dict[str, Path]:
    """Name (``css/web.css``) -> path of each file shipped in ``static/``."""
    return {p.relative_to(STATIC).as_posix(): p for p in STATIC.rglob("*") if p.is_file()}


def _log_events(home: Home, juid: str, start: dict[str, Any] | None) -> Iterator[bytes]:
    """``log_feed``'s events, read from the job's files (see ``Monkey.follow_pieces``)."""
    import time

    from monkey.api import Monkey

    m = Monkey(home)
    renderers: dict[str, AnsiHtml] = {}
    cursor: dict[str, Any] = {"offsets": {}, "marked": []}
    change, looked, alive = None, 0.0, 0.0
    try:
        for piece in m.follow_pieces(juid, "both", tail=None if start else TAIL, start=start):
            if time.monotonic() - looked >= 0.5:  # the page's live parts follow its feed
                looked = time.monotonic()
                now = m.last_job_change()
                if now != change:  # as /web/changed says it, the first time too
                    change = now
                    yield f"event: changed\ndata: {json.dumps(list(now))}\n\n".encode()
            if piece is None:  # a wait (a write to the run folder wakes it: metrics)
                quiet = time.monotonic() - alive >= KEEP_ALIVE
                alive = time.monotonic() if quiet else alive
                yield b": keep-alive\n\n" if quiet else b""  # b"": nothing sent
                continue
            kind, where, data = piece
            if kind == "start":
                cursor = json.loads(data)
                continue
            if kind == "mark":
                cursor["marked"] = sorted({*cursor["marked"], where})
                body = {"s": "mark", "h": AnsiHtml().feed(data, final=True)}
            else:
                cursor["offsets"][kind] = where + len(data)
                html = renderers.setdefault(kind, AnsiHtml()).feed(data)
                if not html:
                    continue
                body = {"s": "err" if kind.endswith(rundir.STDERR) else "out", "h": html}
            yield (
                f"id: {json.dumps(cursor, separators=(',', ':'))}\ndata: {json.dumps(body)}\n\n"
            ).encode()
        try:
            state = m.get_job(juid).state.value
        except MonkeyError:  # removed while followed
            state = "gone"
        yield f"event: end\ndata: {json.dumps({'state': state})}\n\n".encode()
    except MonkeyError as exc:
        yield f"event: failure\ndata: {json.dumps({'error': str(exc)})}\n\n".encode()
    finally:
        m.close()


def _sse(events: AsyncIterator[bytes]) -> Response:
    return _headers(
        StreamingResponse(
            events,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )
    )


def _headers(response: R) -> R:
    for key, value in SECURITY.items():
        response.headers.setdefault(key, value)
    response.headers.setdefault("Cache-Control", "no-store")
    return response


def _safe_next(target: str | None) -> str:
    """TARGET when it is a page of this server (never another site's), else the jobs."""
    if target and target.startswith("/web/") and not target.startswith("//") and "\\" not in target:
        return target
    return "/web/jobs"
