"""A stored file's bytes, sent from a descriptor opened before the answer begins: a file
removed meanwhile (a GC reclaiming an unused blob) is still sent whole, never cut short
after its length was promised."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO
from urllib.parse import quote

from starlette.responses import Response, StreamingResponse

_CHUNK = 1 << 16


def opened_file(path: Path, *, download_as: str | None = None) -> Response | None:
    """PATH's bytes as an octet stream (an attachment named DOWNLOAD_AS if given); None
    when PATH is not a regular file."""
    try:
        file = open(path, "rb")  # noqa: SIM115 - closed by the stream (or when collected)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None
    info = os.fstat(file.fileno())
    if not stat.S_ISREG(info.st_mode):
        file.close()
        return None
    headers = {"Content-Length": str(info.st_size)}
    if download_as is not None:
        headers["Content-Disposition"] = f"attachment; filename*=UTF-8''{quote(download_as)}"
    return StreamingResponse(_chunks(file), media_type="application/octet-stream", headers=headers)


def _chunks(file: BinaryIO) -> Iterator[bytes]:
    with file:
        while chunk := file.read(_CHUNK):
            yield chunk
