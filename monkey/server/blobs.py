"""Blobs over the API: which of a submission's blobs the server lacks, their upload (a
streamed pack, each blob re-hashed and refused when its bytes do not match its digest)
and their download (for clone, cat and pull on a laptop).

The pack a client uploads is, for each blob, a line ``DIGEST SIZE\\n`` and then SIZE
bytes. It is read as it arrives and written to temporary files in the blob store, never
held in memory; a blob is put in place only once whole and right, so a client that
drops, stalls or is cut off, or a server killed midway, leaves no blob half-written."""

from __future__ import annotations

import json
import os
import re
import threading
import time

import anyio
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from monkey.config import Home
from monkey.models import MonkeyError, whole_number
from monkey.server.lanes import in_bulk
from monkey.server.opened import opened_file
from monkey.snapshot.blobs import BlobStore, Receiver

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from monkey.api import Monkey

_DIGEST = re.compile(rb"[0-9a-f]{64}")
MAX_ASKED = 20_000  # digests in one question (the client asks in batches)
MAX_QUESTION = MAX_ASKED * 70  # bytes of that question (bounded by monkey.server.bounds)
STALL = 120.0  # seconds without a byte of an upload: the client is gone
_FLUSH = 1 << 20  # bytes gathered before a write in a worker thread


def max_blob() -> int:
    """The largest blob an upload may hold (MONKEY_SERVER_MAX_BLOB bytes, default 1 TiB)."""
    try:
        return int(os.environ.get("MONKEY_SERVER_MAX_BLOB", 1 << 40))
    except ValueError:
        raise MonkeyError("MONKEY_SERVER_MAX_BLOB must be a whole number of bytes") from None


class BadPack(MonkeyError):
    """An upload that is not a pack of blobs (400)."""


class OverQuota(MonkeyError):
    """An upload beyond its user's storage quota (413)."""


class Room:
    """What is left of a user's storage quota for one upload: ``take`` each blob's
    announced size before its bytes are read. What the user's other uploads under way
    have taken counts too (IN_FLIGHT: user -> bytes, shared by the server's uploads), so
    two at once cannot both fit into the same room; ``close`` gives it back."""

    _lock = threading.Lock()

    def __init__(self, user: str, used: int, limit: int, in_flight: dict[str, int]) -> None:
        self.user, self.used, self.limit = user, used, limit
        self.in_flight = in_flight
        self.taken = 0

    def take(self, size: int) -> None:
        """Count SIZE bytes more; OverQuota when they do not fit."""
        with self._lock:
            others = self.in_flight.get(self.user, 0) - self.taken
            if self.used + others + self.taken + size > self.limit:
                from monkey.facade.storage import over_quota

                held = self.used + others
                raise OverQuota(over_quota(self.user, held, self.limit, self.taken + size))
            self.taken += size
            self.in_flight[self.user] = self.in_flight.get(self.user, 0) + size

    def close(self) -> None:
        """The upload is over (its blobs recorded, or none): give its bytes back."""
        with self._lock:
            left = self.in_flight.get(self.user, 0) - self.taken
            if left > 0:
                self.in_flight[self.user] = left
            else:
                self.in_flight.pop(self.user, None)
            self.taken = 0


class Unpacker:
    """Reads a pack piece by piece into the blob store (``feed``, then ``close``); each
    blob's size is taken from ROOM (a storage quota) before its bytes are read."""

    def __init__(self, blobs: BlobStore, room: Room | None = None) -> None:
        self.blobs = blobs
        self.room = room
        self.limit = max_blob()
        self.head = bytearray()
        self.current: Receiver | None = None
        self.left = 0  # bytes of the current blob still to come
        self.skipping = False  # a blob the store has already: its bytes are read, not kept
        self.stored = self.present = self.bytes = 0
        self.received: list[tuple[str, int]] = []  # (digest, size) newly stored

    def feed(self, data: bytes) -> None:
        view, i = memoryview(data), 0
        while i < len(data):
            if self.left == 0 and self.current is None and not self.skipping:
                nl = data.find(b"\n", i)
                if nl < 0:
                    self.head += data[i:]
                    if len(self.head) > 100:
                        raise BadPack("an upload's blob header is too long; upgrade the client")
                    return
                self._begin(bytes(self.head) + data[i:nl])
                self.head.clear()
                i = nl + 1
                continue
            take = min(self.left, len(data) - i)
            if self.current is not None:
                self.current.write(view[i : i + take])
            i += take
            self.left -= take
            self.bytes += take
            if self.left == 0:
                self._end()

    def _begin(self, line: bytes) -> None:
        digest, _, size = line.partition(b" ")
        if not _DIGEST.fullmatch(digest) or not size.isdigit() or len(size) > 19:
            raise BadPack(f"an upload's blob header {line[:80]!r} is not `DIGEST SIZE`")
        self.left = int(size)
        if self.left > self.limit:
            raise BadPack(
                f"blob {digest.decode()} holds {self.left} bytes, over this server's limit of "
                f"{self.limit} (MONKEY_SERVER_MAX_BLOB on the main node)"
            )
        if self.room is not None:
            self.room.take(self.left)
        name = digest.decode()
        if self.blobs.has(name):
            self.skipping = True
        else:
            self.current = self.blobs.receiver(name)
        if self.left == 0:
            self._end()

    def _end(self) -> None:
        if self.current is not None:
            receiver, self.current = self.current, None
            if receiver.finish():
                self.stored += 1
                self.received.append((receiver.digest, receiver.size))
            else:
                self.present += 1
        else:
            self.present += 1
        self.skipping = False

    def close(self) -> None:
        """The pack ended: BadPack when it stopped inside a blob or a header."""
        if self.current is not None or self.left or self.head:
            self.abort()
            raise BadPack("the upload ended inside a blob; send it again")

    def abort(self) -> None:
        if self.current is not None:
            self.current.abort()
            self.current = None


async def _pieces(request: Request) -> AsyncIterator[bytes]:
    """The request's body as it arrives; TimeoutError when the client sends nothing for
    STALL seconds (other requests are served meanwhile)."""
    stream = request.stream().__aiter__()
    while True:
        with anyio.fail_after(STALL):
            try:
                piece = await stream.__anext__()
            except StopAsyncIteration:
                return
        if piece:
            yield piece


def routes(home: Home, monkey: Callable[[], Monkey]) -> list[Route]:
    """The blob routes of the server over HOME (MONKEY: this thread's facade)."""
    blobs = BlobStore(home.blobs)
    in_flight: dict[str, int] = {}  # user -> bytes their uploads under way announced

    def record(unpacker: Unpacker, user: str) -> None:
        """The blobs received, with the stamps of bytes hashed as they came (see
        ``BlobStore.stamped``): a core need not hash them again; USER uploaded them."""
        if unpacker.received:
            monkey().record_uploads(user, blobs.stamped(unpacker.received), time.time())

    def room(user: str, announced: int | None) -> Room | None:
        """USER's room under their storage quota (None: no quota); OverQuota when the
        upload's ANNOUNCED bytes (its Content-Length) cannot fit."""
        room = monkey().storage_room(user, blobs)
        if room is None:
            return None
        found = Room(user, *room, in_flight)
        if announced:
            found.take(announced)  # the whole, then each blob as its header comes
            found.close()
        return found

    async def missing(request: Request) -> Response:
        """``POST /api/v1/blobs/missing`` with a JSON list of digests: those not stored."""
        data = bytearray()
        async for piece in _pieces(request):
            data += piece
        try:
            asked = json.loads(data)
            if not isinstance(asked, list) or not all(
                isinstance(d, str) and _DIGEST.fullmatch(d.encode()) for d in asked
            ):
                raise ValueError("not a list of digests")
        except ValueError as exc:
            return JSONResponse({"error": f"blobs missing: a malformed request ({exc})"}, 400)
        lacking = await in_bulk(lambda: [d for d in asked if not blobs.has(d)])
        return JSONResponse(lacking)

    async def upload(request: Request) -> Response:
        """``POST /api/v1/blobs``: a pack of blobs (see the module's docstring). Beyond the
        user's storage quota it is refused (413) before its bytes are read: the whole, by
        its Content-Length, then each blob by the size its header announces."""
        user = request.state.user["name"]
        length = whole_number(request.headers.get("content-length") or "")
        try:
            quota = await run_in_threadpool(room, user, length)
        except OverQuota as exc:
            return JSONResponse({"error": str(exc)}, 413, headers={"Connection": "close"})
        unpacker = Unpacker(blobs, quota)
        try:
            return await _unpack(request, unpacker, user)
        finally:
            if quota is not None:
                quota.close()

    async def _unpack(request: Request, unpacker: Unpacker, user: str) -> Response:
        """Read the pack into UNPACKER as it arrives; the blobs received are USER's."""
        pending = bytearray()
        try:
            async for piece in _pieces(request):
                pending += piece
                if len(pending) >= _FLUSH:
                    chunk, pending = bytes(pending), bytearray()
                    await in_bulk(unpacker.feed, chunk)
            await in_bulk(unpacker.feed, bytes(pending))
            unpacker.close()
            await run_in_threadpool(record, unpacker, user)
        except (ClientDisconnect, TimeoutError):
            await run_in_threadpool(unpacker.abort)
            await run_in_threadpool(record, unpacker, user)
            return Response(status_code=400)  # nobody reads it
        except MonkeyError as exc:
            await run_in_threadpool(unpacker.abort)
            await run_in_threadpool(record, unpacker, user)
            status = 413 if isinstance(exc, OverQuota) else 400
            return JSONResponse({"error": str(exc)}, status, headers={"Connection": "close"})
        return JSONResponse(
            {"stored": unpacker.stored, "present": unpacker.present, "bytes": unpacker.bytes}
        )

    async def download(request: Request) -> Response:
        """``GET /api/v1/blobs/DIGEST``: the blob's bytes (the client checks them)."""
        digest = request.path_params["digest"]
        try:
            path = blobs.path(digest)
        except MonkeyError as exc:
            return JSONResponse({"error": str(exc)}, 400)
        answer = opened_file(path)
        if answer is None:
            return JSONResponse({"error": f"blob {digest} is not on this server"}, 404)
        return answer

    return [
        Route("/api/v1/blobs/missing", missing, methods=["POST"]),
        Route("/api/v1/blobs", upload, methods=["POST"]),
        Route("/api/v1/blobs/{digest}", download, methods=["GET"]),
    ]
