"""A job's saved persisted folders (job.yml ``persist``) over the API, for `monkey pull`
on a laptop: ``GET /api/v1/persisted/JOB`` streams them as one tar archive, each folder
under its path in the job, written as it is read (a checkpoint folder is never copied
or held in memory on the server)."""

from __future__ import annotations

import os
import tarfile
import threading

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from monkey.models import MonkeyError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from monkey.api import Monkey

_PIECE = 1 << 16


def _regular(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    """INFO when a folder or a regular file; links (a job may link out of its folder) and
    devices are left out."""
    return info if info.isdir() or info.isfile() else None


def tar_stream(folders: list[tuple[str, Path]]) -> Iterator[bytes]:
    """FOLDERS [(name in the archive, folder)] as a tar archive of their folders and regular
    files (never a link), piece by piece: a thread writes it into a pipe that this generator
    reads; closing the generator (the client went away) ends the writer at its next write."""
    read_fd, write_fd = os.pipe()

    def write() -> None:
        try:
            with os.fdopen(write_fd, "wb") as out, tarfile.open(fileobj=out, mode="w|") as tar:
                for name, folder in folders:
                    tar.add(folder, arcname=name, filter=_regular)
        except OSError:
            pass  # the reader closed the pipe: nobody wants the rest

    writer = threading.Thread(target=write, name="monkey-tar", daemon=True)
    writer.start()
    with os.fdopen(read_fd, "rb") as source:
        while piece := source.read(_PIECE):
            yield piece
    writer.join()


def routes(monkey: Callable[[], Monkey]) -> list[Route]:
    """The folder routes of the server (MONKEY: this thread's facade)."""

    async def persisted(request: Request) -> Response:
        ref = request.path_params["ref"]
        try:
            folders = await run_in_threadpool(lambda: monkey().persisted(ref))
        except MonkeyError as exc:
            return JSONResponse({"error": str(exc)}, 400)
        return StreamingResponse(tar_stream(folders), media_type="application/x-tar")

    return [Route("/api/v1/persisted/{ref}", persisted, methods=["GET"])]
