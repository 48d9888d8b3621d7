"""What Monkey Web's pages export: the jobs list and a sweep's runs table as CSV (their
columns, filters and sort), and a sweep's `monkey report`, under /web."""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from monkey.models import MonkeyError
from monkey.server.web import views

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    Web = Any  # monkey.server.web.app.Web (which imports this module)


def routes(web: Web, headers: Callable[[Response], Response]) -> list[Route]:
    """The export routes, under /web (HEADERS: adds the app's security headers)."""
    pages = Exports(web, headers)
    return [
        Route("/jobs.csv", pages.jobs_csv),
        Route("/sweeps/{ref}/runs.csv", pages.sweep_csv),
        Route("/sweeps/{ref}/report.html", pages.sweep_report),
    ]


class Exports:
    """The export pages of one Monkey Web (WEB)."""

    def __init__(self, web: Web, headers: Callable[[Response], Response]) -> None:
        self.web, self.headers = web, headers

    async def jobs_csv(self, request: Request) -> Response:
        """The jobs list as CSV: its filters, sort and chosen columns, every page."""
        from monkey.server.web.tables_csv import jobs_csv

        session = await self.web.session(request)
        if session is None:
            return self.web.to_login(request)
        q = request.query_params
        filters = {k: q.get(k, "") for k in views.FILTERS}
        try:
            columns = await run_in_threadpool(self.web._columns, session["user"]["name"], q)
            text = await run_in_threadpool(
                lambda: jobs_csv(
                    self.web.monkey(),
                    filters,
                    q.get("sort") or None,
                    bool(q.get("reverse")),
                    columns,
                )
            )
        except MonkeyError as exc:
            return self.web.page("error.html", 400, session, title="Jobs", message=str(exc))
        return self._csv_file(text, "jobs.csv")

    async def sweep_csv(self, request: Request) -> Response:
        """A sweep's runs table as CSV, with the page's columns and sort (and only the runs
        ``job`` names when given: a selection in the parallel coordinates)."""
        from monkey.server.web.tables_csv import runs_csv

        session = await self.web.session(request)
        if session is None:
            return self.web.to_login(request)
        ref, q = request.path_params["ref"], request.query_params
        try:
            data = await run_in_threadpool(
                lambda: views.sweep_page(
                    self.web.monkey(),
                    ref,
                    session["user"],
                    q.get("sort"),
                    bool(q.get("reverse")),
                    bool(q.get("constants")),
                )
            )
        except MonkeyError as exc:
            return self.web.page("error.html", 404, session, title=f"Sweep {ref}", message=str(exc))
        rows = runs_csv(data, q.getlist("job"))
        return self._csv_file(rows, f"sweep-{data['sweep']['id']}-runs.csv")

    async def sweep_report(self, request: Request) -> Response:
        """The sweep's `monkey report` (``?download=1``: as a file to keep)."""
        session = await self.web.session(request)
        if session is None:
            return self.web.to_login(request)
        ref = request.path_params["ref"]

        def render() -> tuple[str, str]:
            from monkey.facade.render import report_html

            found = self.web.monkey().report_data(ref)
            return found["status"]["id"], report_html(found)

        try:
            sid, html = await run_in_threadpool(render)
        except MonkeyError as exc:
            return self.web.page("error.html", 404, session, title=f"Sweep {ref}", message=str(exc))
        headers = {}
        if request.query_params.get("download"):
            headers["Content-Disposition"] = f'attachment; filename="report-{sid}.html"'
        return self.headers(HTMLResponse(html, headers=headers))

    def _csv_file(self, text: str, name: str) -> Response:
        """TEXT as a CSV file NAME to download."""
        return self.headers(
            Response(
                text,
                media_type="text/csv; charset=utf-8",
                headers={"Content-Disposition": f'attachment; filename="{name}"'},
            )
        )
