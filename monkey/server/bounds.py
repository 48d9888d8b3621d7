"""The bound on every request's body, applied before a route reads a byte of it: a
Content-Length over the route's limit is answered 413 at once, and a chunked body is
counted as it arrives and cut off (413) at the limit, so no body (a login form posted by
anyone, an API call) is ever held whole beyond its bound. The connection is closed after a
413: the rest of the body is never read."""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable


MAX_HEADERS = 16 << 10  # bytes of a request's line and headers


class TooLarge(Exception):
    """A body that went over its route's limit while it was read."""


class BodyBound:
    """ASGI middleware: LIMIT(path) is the most bytes a request's body to PATH may hold
    (None: the route bounds it itself, as the blob upload writes each blob to disk)."""

    def __init__(self, app: ASGIApp, limit: Callable[[str], int | None]) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if sum(len(k) + len(v) + 4 for k, v in scope["headers"]) > MAX_HEADERS:
            # h11 bounds headers that arrive in pieces (h11_max_incomplete_event_size);
            # this, those that came in one read
            await _refuse(scope, send, MAX_HEADERS, 431, "its headers")
            return
        limit = self.limit(scope["path"])
        if limit is None:
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length", b"0")
        if not length.isdigit() or int(length) > limit:  # (h11 refuses a malformed one)
            await _refuse(scope, send, limit)
            return
        read = 0
        started = cut = False
        unread = int(length) > 0 or b"transfer-encoding" in dict(scope["headers"])

        async def bounded_receive() -> Message:
            nonlocal read, cut, unread
            message = await receive()
            if message["type"] == "http.request":
                read += len(message.get("body", b""))
                unread = bool(message.get("more_body"))
                if read > limit:
                    cut = True
                    raise TooLarge
            return message

        async def watched_send(message: Message) -> None:
            nonlocal started
            if cut:  # the route's answer to its cut-off body: the 413 goes instead
                return
            if message["type"] == "http.response.start":
                started = True
                if unread:  # answered before the body was read (a token refused): the rest
                    # of it is not read either, the connection closes after the answer
                    message["headers"] = [*message.get("headers", []), (b"connection", b"close")]
            await send(message)

        try:
            await self.app(scope, bounded_receive, watched_send)
        except TooLarge:
            pass
        if cut and not started:
            await _refuse(scope, send, limit)


async def _refuse(scope: Scope, send: Send, limit: int, status: int = 413, what: str = "") -> None:
    """STATUS (413: a body over LIMIT; 431: WHAT over it) with one line: HTML for Monkey
    Web's pages, JSON for the API; the connection closed after it."""
    web = scope["path"].startswith("/web")
    if what:
        said = f"a request may carry at most {_size(limit)} in {what}"
    elif web:
        said = f"a form of Monkey Web may carry at most {_size(limit)}"
    else:
        said = f"a request to {scope['path']} may carry at most {_size(limit)}"
    if web:
        body, kind = f"<!doctype html><title>Too large</title><p>{said}</p>\n", b"text/html"
    else:
        body, kind = json.dumps({"error": said}) + "\n", b"application/json"
    data = body.encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", kind + b"; charset=utf-8"),
                (b"content-length", str(len(data)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": data})


def _size(limit: int) -> str:
    return f"{limit >> 20} MiB" if limit >= 1 << 20 else f"{limit >> 10} KiB"
