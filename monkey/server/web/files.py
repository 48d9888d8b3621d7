"""Monkey Web's data and results of a job: its datasets (name, digest, size, where the job
found them), its persisted folders (job.yml ``persist``, as `monkey pull` copies them:
``Monkey.persisted``) and the output files its attempts brought back (``run --outputs``),
each downloadable: a file as it is, a folder as a .tar.gz streamed while it is read. Any
logged-in user reads them, as the API's ``/api/v1/persisted`` lets any user; every path is
confined to the job's own folders (no ``..``, no link out)."""

from __future__ import annotations

import glob
import os
import zlib
from pathlib import Path
from urllib.parse import quote

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from monkey.client_agent import rundir
from monkey.models import MonkeyError
from monkey.server.opened import opened_file
from monkey.server.web.code import safe_path
from monkey.server.web.render import clock

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import Any

    from monkey.api import Monkey

    Web = Any  # monkey.server.web.app.Web (which imports this module)

LISTED = 200  # files listed per folder on the page (the archive holds them all)


def routes(web: Web, headers: Callable[[Response], Response]) -> list[Route]:
    """The download routes, under /web (HEADERS: adds the app's security headers)."""
    pages = FilePages(web, headers)
    return [
        Route("/jobs/{ref}/persisted/{name}.tar.gz", pages.folder),
        Route("/jobs/{ref}/persisted/{name}/{path:path}", pages.persisted_file),
        Route("/jobs/{ref}/outputs/{attempt:int}/{path:path}", pages.output_file),
        Route("/jobs/{ref}/checkpoints/{path:path}", pages.checkpoint_file),
    ]


def _files(folder: Path, most: int = LISTED) -> tuple[list[dict[str, Any]], int, int]:
    """FOLDER's regular files (links skipped) as [{path, url, size}] (at most MOST), their
    count and total bytes."""
    from monkey.facade.checkpoints import regular_files

    found = regular_files(folder)
    listed = [{"path": rel, "url": quote(rel), "size": size} for rel, size, _ in found[:most]]
    return listed, len(found), sum(size for _, size, _ in found)


def data_part(m: Monkey, juid: str) -> dict[str, Any]:
    """The job page's datasets, persisted folders and outputs."""
    job = m.get_job(juid)
    spec = m.job_spec(juid) or {}
    datasets = [
        {
            "name": d["name"],
            "digest": d["digest"],
            "size": d.get("size"),
            "where": f"$MONKEY_DATASET_{d['name']}",
            "source": d.get("source") or "",
        }
        for d in job.datasets
    ] + [
        {
            "name": d["name"],
            "digest": d.get("digest") or "",
            "size": None,
            "where": f"{d['path']}/ in its folder (job.yml data)",
            "source": "",
        }
        for d in spec.get("data", [])
    ]
    persisted = []
    for path, copy in m.persisted(juid):
        listed, count, total = _files(copy)
        name = copy.name
        persisted.append(
            {"path": path, "name": name, "files": listed, "count": count, "bytes": total}
        )
    outputs = []
    globs = m.job_outputs(juid)
    for a in m.attempts(juid) if globs else ():
        work = m.home.run_dir(juid, a.n) / rundir.WORK
        found = _outputs(work, globs)
        if found:
            outputs.append({"attempt": a.n, "files": found[:LISTED], "count": len(found)})
    saved = m.checkpoints(juid)
    checkpoints = {
        **saved,
        "files": [
            {**f, "url": quote(f["path"]), "when": clock(f["mtime"])} for f in saved["files"]
        ],
    }
    return {
        "datasets": datasets,
        "persisted": persisted,
        "outputs": outputs,
        "globs": globs,
        "checkpoints": checkpoints,
    }


def _outputs(work: Path, globs: list[str]) -> list[dict[str, Any]]:
    """The files of WORK matching GLOBS (as the agent picks outputs: regular, not links,
    never out of WORK)."""
    runs = work.parents[2]  # runs/JUID/ATTEMPT/work: none of them may be a link out
    real = work.resolve()
    if real != runs.resolve() / work.relative_to(runs) or not work.is_dir():
        return []
    seen: dict[str, int] = {}
    for pattern in globs:
        for rel in glob.glob(pattern, root_dir=work, recursive=True):
            rel = os.path.normpath(rel)
            path = work / rel
            if (
                os.path.isabs(rel)
                or ".." in rel.split(os.sep)
                or path.is_symlink()
                or not path.is_file()
                or not path.resolve().is_relative_to(real)
            ):
                continue
            seen[Path(rel).as_posix()] = path.stat().st_size
    return [{"path": p, "url": quote(p), "size": s} for p, s in sorted(seen.items())]


def confined(base: Path, rel: str) -> Path | None:
    """BASE/REL when it is a regular file inside BASE (no link anywhere on the way)."""
    clean = safe_path(rel)
    if clean is None:
        return None
    path = base / clean
    for part in (path, *path.parents):
        if part == base:
            break
        if part.is_symlink():
            return None
    if not path.is_file() or not path.resolve().is_relative_to(base.resolve()):
        return None
    return path


def gzipped(pieces: Iterator[bytes]) -> Iterator[bytes]:
    """PIECES gzip-compressed as they come (a tar stream becomes a .tar.gz)."""
    packer = zlib.compressobj(6, zlib.DEFLATED, 31)  # 31: the gzip format
    try:
        for piece in pieces:
            out = packer.compress(piece)
            if out:
                yield out
        yield packer.flush()
    finally:
        close = getattr(pieces, "close", None)
        if close is not None:
            close()


class FilePages:
    def __init__(self, web: Web, headers: Callable[[Response], Response]) -> None:
        self.web, self.headers = web, headers

    async def _persisted(self, request: Request) -> tuple[Any, Path | None, str]:
        """(the session or a response, the saved copy of the persisted folder named in
        the URL or None, the job's id or an error)."""
        session = await self.web.session(request)
        if session is None:
            return self.web.to_login(request), None, ""
        ref, name = request.path_params["ref"], request.path_params["name"]
        try:
            juid, folders = await run_in_threadpool(
                lambda: (self.web.monkey().resolve(ref), self.web.monkey().persisted(ref))
            )
        except MonkeyError as exc:
            return session, None, str(exc)
        copy = next((c for _, c in folders if c.name == name), None)
        if copy is None:
            return session, None, f"job {juid} has no saved persisted folder {name!r}"
        return session, copy, juid

    async def folder(self, request: Request) -> Response:
        """A persisted folder as a .tar.gz, streamed while it is read."""
        from monkey.server.folders import tar_stream

        session, copy, said = await self._persisted(request)
        if isinstance(session, Response):
            return session
        if copy is None:
            return self._error(session, request, said, 404)
        name = f"{said}-{copy.name}.tar.gz"
        return self.headers(
            StreamingResponse(
                gzipped(tar_stream([(copy.name, copy)])),
                media_type="application/gzip",
                headers={"Content-Disposition": f"attachment; filename*=UTF-8''{quote(name)}"},
            )
        )

    async def persisted_file(self, request: Request) -> Response:
        session, copy, said = await self._persisted(request)
        if isinstance(session, Response):
            return session
        if copy is None:
            return self._error(session, request, said, 404)
        return self._send(session, request, copy, request.path_params["path"])

    async def output_file(self, request: Request) -> Response:
        session = await self.web.session(request)
        if session is None:
            return self.web.to_login(request)
        ref, n = request.path_params["ref"], request.path_params["attempt"]
        try:
            juid = await run_in_threadpool(lambda: self.web.monkey().resolve(ref))
        except MonkeyError as exc:
            return self._error(session, request, str(exc), 404)
        globs = await run_in_threadpool(lambda: self.web.monkey().job_outputs(juid))
        work = self.web.home.run_dir(juid, n) / rundir.WORK
        rel = safe_path(request.path_params["path"])
        wanted = await run_in_threadpool(lambda: {f["path"] for f in _outputs(work, globs)})
        if rel is None or rel not in wanted:  # only the outputs, never the rest of its folder
            return self._error(
                session,
                request,
                f"attempt {n} of job {juid} brought back no output "
                f"{request.path_params['path']!r}; its page lists them",
                400 if rel is None else 404,
            )
        return self._send(session, request, work, rel)

    async def checkpoint_file(self, request: Request) -> Response:
        """A file of the job's checkpoint_dir() (MONKEY_HOME's copy)."""
        session = await self.web.session(request)
        if session is None:
            return self.web.to_login(request)
        try:
            juid = await run_in_threadpool(
                lambda: self.web.monkey().resolve(request.path_params["ref"])
            )
        except MonkeyError as exc:
            return self._error(session, request, str(exc), 404)
        return self._send(
            session, request, self.web.home.checkpoint_dir(juid), request.path_params["path"]
        )

    def _send(self, session: dict[str, Any], request: Request, base: Path, rel: str) -> Response:
        path = confined(base, rel)
        if path is None:
            return self._error(
                session,
                request,
                f"no file {rel!r} here: a path is relative to the folder, without `..` "
                "or links out",
                400 if safe_path(rel) is None else 404,
            )
        answer = opened_file(path, download_as=path.name)
        if answer is None:
            return self._error(session, request, f"no file {rel!r} here (it is gone)", 404)
        return self.headers(answer)

    def _error(
        self, session: dict[str, Any], request: Request, message: str, status: int
    ) -> Response:
        ref = request.path_params["ref"]
        return self.web.page("error.html", status, session, title=f"Job {ref}", message=message)
