"""Blobs between a laptop's cache and a main node (see ``monkey.server.blobs``): which the
server lacks, their upload as streamed packs with a progress bar on a terminal, and the
download of those a clone or a cat needs, each checked against its digest."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from monkey.remote import RemoteError, Unreachable
from monkey.remote.client import Client
from monkey.snapshot.blobs import BlobStore

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

ASK = 10_000  # digests per question
PACK_BYTES = 256 << 20  # bytes per upload request: a dropped link loses at most one pack
PACK_BLOBS = 5_000
BAR_BYTES = 10 << 20  # uploads this large show a progress bar on a terminal
_PIECE = 1 << 20


def missing(client: Client, digests: Iterable[str]) -> list[str]:
    """Those of DIGESTS the server does not hold."""
    asked = sorted(set(digests))
    lacking: list[str] = []
    for start in range(0, len(asked), ASK):
        body = json.dumps(asked[start : start + ASK]).encode()
        lacking += json.loads(client.read(client.request("POST", "/api/v1/blobs/missing", body)))
    return lacking


def upload(client: Client, blobs: BlobStore, digests: list[str]) -> int:
    """Send DIGESTS (all in BLOBS), in this order; returns the bytes sent. A link that drops
    midway is tried once more with those the server still lacks."""
    try:
        return _send(client, blobs, digests)
    except Unreachable:
        client.close()
    left = set(missing(client, digests))
    return _send(client, blobs, [d for d in digests if d in left])


def _send(client: Client, blobs: BlobStore, lacking: list[str]) -> int:
    sizes = [(d, os.path.getsize(blobs.path(d))) for d in lacking]
    total = sum(size for _, size in sizes)
    if not sizes:
        return 0
    with _progress(total) as tick:
        for pack in _packs(sizes):
            length = sum(len(_header(d, size)) + size for d, size in pack)
            try:
                resp = client.request(
                    "POST",
                    "/api/v1/blobs",
                    _pack_body(blobs, pack, tick),
                    headers={
                        "Content-Type": "application/octet-stream",
                        "Content-Length": str(length),
                        # a pack beyond the user's storage quota is refused before it is sent
                        "Expect": "100-continue",
                    },
                )
            except RemoteError:
                client.close()  # the request may be half-sent
                raise
            client.read(resp)
    return total


def _header(digest: str, size: int) -> bytes:
    return f"{digest} {size}\n".encode()


def _packs(sizes: list[tuple[str, int]]) -> Iterator[list[tuple[str, int]]]:
    pack: list[tuple[str, int]] = []
    held = 0
    for digest, size in sizes:
        if pack and (held + size > PACK_BYTES or len(pack) >= PACK_BLOBS):
            yield pack
            pack, held = [], 0
        pack.append((digest, size))
        held += size
    if pack:
        yield pack


def _pack_body(
    blobs: BlobStore, pack: list[tuple[str, int]], tick: Callable[[int], None]
) -> Iterator[bytes]:
    """The pack's bytes, read from the files as they are sent."""
    for digest, size in pack:
        yield _header(digest, size)
        sent = 0
        with open(blobs.path(digest), "rb") as f:
            while piece := f.read(_PIECE):
                sent += len(piece)
                if sent > size:
                    break
                yield piece
                tick(len(piece))
        if sent != size:  # the cache's file changed: the server would refuse the pack
            raise RemoteError(
                f"blob {digest} in {blobs.root} changed while it was sent; run the command again"
            )


@contextmanager
def _progress(total: int) -> Iterator[Callable[[int], None]]:
    """A progress bar for TOTAL bytes on a terminal (nothing elsewhere); yields its tick."""
    if total < BAR_BYTES or not sys.stderr.isatty():
        yield lambda n: None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    with Progress(
        TextColumn("uploading"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as bar:
        task = bar.add_task("upload", total=total)
        yield lambda n: bar.advance(task, n)


def download(client: Client, blobs: BlobStore, digests: Iterable[str]) -> None:
    """Fetch those of DIGESTS that BLOBS lacks from the server, each checked against its
    digest before it is kept."""
    for digest in sorted(set(digests)):
        if BlobStore.has(blobs, digest):
            continue
        resp = client.request("GET", f"/api/v1/blobs/{digest}")
        receiver = blobs.receiver(digest)
        try:
            while piece := resp.read(_PIECE):
                receiver.write(piece)
        except OSError as exc:
            receiver.abort()
            client.close()
            raise Unreachable(
                f"{client.remote.name}: the connection dropped while fetching blob {digest} "
                f"({exc}); run the command again"
            ) from None
        except BaseException:
            receiver.abort()
            raise
        receiver.finish()


class FetchingBlobs(BlobStore):
    """A laptop's blob cache that fetches a blob it lacks from the server when it is asked
    for (each checked against its digest): the code of a job as ``clone``, ``cat`` and
    ``info --files`` read it, only the blobs they need."""

    def __init__(self, root: os.PathLike[str], client: Client) -> None:
        super().__init__(root)  # type: ignore[arg-type]
        self.client = client
        self._used: set[str] = set()

    def _fetch(self, digest: str) -> None:
        if super().has(digest):
            if digest not in self._used:  # used now: the cache's trim keeps it longer
                self._used.add(digest)
                now = time.time_ns()
                try:
                    os.utime(self.path(digest), ns=(now, now))
                except OSError:
                    pass
            return
        try:
            download(self.client, self, [digest])
        except RemoteError as exc:
            if exc.status != 404:
                raise

    def has(self, digest: str) -> bool:
        self._fetch(digest)
        return super().has(digest)

    def verify(self, digest: str) -> bool | None:
        self._fetch(digest)
        return super().verify(digest)

    def read_bytes(self, digest: str) -> bytes:
        self._fetch(digest)
        return super().read_bytes(digest)

    def copy_out(self, digest: str, target: str) -> None:
        self._fetch(digest)
        super().copy_out(digest, target)
