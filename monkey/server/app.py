"""The routes of `monkey server` (Starlette): every request's body bounded before it is
read (``bounds.BodyBound``), every request authenticated first (401, 429 after too many
refused tokens of one prefix from one address: see ``auth.Gate``), every answer saying the
API and monkey versions, every action recorded in the audit log. The web pages
(monkey.server.web, under /web) are routes beside these, with sessions of their own."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from monkey.config import Home
from monkey.contract import Access, methods
from monkey.models import Forbidden, MonkeyError
from monkey.remote import API, API_HEADER, VERSION_HEADER, codec
from monkey.server import audit, blobs, door, folders
from monkey.server.auth import Gate, token_prefix
from monkey.server.bounds import BodyBound
from monkey.server.calls import run_call
from monkey.server.lanes import in_bulk
from monkey.store import Store

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from monkey.api import Monkey

log = logging.getLogger("monkey.server")
MAX_BODY = 1 << 20  # bytes of a call's arguments (and of any other request's body)
MAX_FORM = 64 << 10  # bytes of a form posted to Monkey Web
CALLED = {name: rule for name, rule in methods().items() if rule.called}  # the call routes


def _version() -> str:
    from monkey import __version__

    return __version__


class Guard:
    """ASGI middleware: the versions on every answer, the token checked on every request."""

    def __init__(self, app: ASGIApp, gate: Gate, home: Home) -> None:
        self.app = app
        self.gate = gate
        self.home = home

    def _refused(self, scope: Scope, peer: str, token: str | None, status: int) -> None:
        """The refusal in the audit log (the token's first characters only)."""
        audit.record(
            self.home,
            "token refused",
            peer=peer,
            target=f"{scope['method']} {scope['path']}",
            outcome="refused",
            token=token_prefix(token),
            detail="too many refused tokens (429)" if status == 429 else None,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":  # no websocket route yet: none unauthenticated, ever
            await send({"type": "websocket.close", "code": 1008})
            return

        async def send_versioned(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [
                    *message.get("headers", []),
                    (API_HEADER.lower().encode(), str(API).encode()),
                    (VERSION_HEADER.lower().encode(), _version().encode()),
                ]
            await send(message)

        if scope["path"] in ("/web", "/favicon.ico") or scope["path"].startswith("/web/"):
            await self.app(scope, receive, send_versioned)  # pages: their own sessions
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if scope["path"] == "/" and "text/html" in headers.get("accept", ""):
            # the address `server start` prints, pasted into a browser: Monkey Web
            await RedirectResponse("/web/jobs", 303)(scope, receive, send_versioned)
            return
        peer = (scope.get("client") or ("?", 0))[0]  # forwarded only by a --trusted-proxy
        auth = headers.get("authorization", "")
        token = auth[7:].strip() if auth.lower().startswith("bearer ") else None
        wait = self.gate.retry_after(peer, token)
        if wait:
            await run_in_threadpool(self._refused, scope, peer, token, 429)
            answer: Response = JSONResponse(
                {"error": "too many refused tokens"}, 429, headers={"Retry-After": str(wait)}
            )
            await answer(scope, receive, send_versioned)
            return
        user = await run_in_threadpool(self.gate.user, token, peer)
        if user is None:
            await run_in_threadpool(self._refused, scope, peer, token, 401)
            await JSONResponse({"error": "token refused"}, 401)(scope, receive, send_versioned)
            return
        if headers.get(API_HEADER.lower()) != str(API):
            answer = JSONResponse(
                {"error": f"this server speaks API {API}; upgrade the client"}, 426
            )
            await answer(scope, receive, send_versioned)
            return
        scope.setdefault("state", {})["user"] = user
        await self.app(scope, receive, send_versioned)


_local = threading.local()


def _monkey() -> Monkey:
    """This worker thread's facade (a Store connection is not shared between threads)."""
    m = getattr(_local, "monkey", None)
    if m is None:
        from monkey.api import Monkey

        m = _local.monkey = Monkey(_local_home)
    return m


_local_home: Home | None = None


def _error(exc: Exception) -> JSONResponse:
    from monkey.submit import BlobsMissing

    if isinstance(exc, BlobsMissing):
        return JSONResponse({"error": str(exc), "missing": exc.digests}, 409)
    status = 403 if isinstance(exc, Forbidden) else 400
    return JSONResponse({"error": str(exc)}, status)


async def _body(request: Request) -> bytes:
    return await request.body()  # bounded by BodyBound (body_limit)


async def call(request: Request) -> Response:
    """``POST /api/v1/call/METHOD``: a method of the contract, its arguments checked at the
    door (400 naming what is wrong), then carried out for the caller (monkey.server.calls)."""
    method = request.path_params["method"]
    rule = CALLED.get(method)
    if rule is None:
        return JSONResponse(
            {"error": f"{method} is not available through the API of this server"}, 404
        )
    try:
        kwargs = await run_in_threadpool(door.arguments, method, await _body(request))
    except MonkeyError as exc:
        return JSONResponse({"error": str(exc)}, 400)
    user = request.state.user

    def work() -> bytes:  # encoded in the thread too: the event loop only moves bytes
        return codec.dumps(run_call(_monkey(), user, method, kwargs))

    try:
        answer = await (in_bulk(work) if rule.access is Access.SUBMITS else run_in_threadpool(work))
    except MonkeyError as exc:
        return _error(exc)
    except Exception as exc:  # a fault of the server: one line in its log, no traceback
        log.error("call %s by %s failed: %s: %.200s", method, user["name"], type(exc).__name__, exc)
        return JSONResponse({"error": f"{method}: the server failed; its log says why"}, 500)
    return Response(answer, media_type="application/json")


# The calls the audit log records (those that change something); the others only read.
AUDITED = {
    name for name, rule in CALLED.items() if rule.access not in (Access.ANYONE, Access.CALLER)
} | {"rm_select", "notify_add", "notify_remove", "notify_test"}


def audited(route: Callable[[Request], Awaitable[Response]], home: Home) -> Callable[..., Any]:
    """ROUTE (``call``), its actions recorded in the audit log once their outcome is
    known: who, from where, the method, what it names, ok / refused (403) / error."""

    async def endpoint(request: Request) -> Response:
        answer = await route(request)
        method = request.path_params["method"]
        if method in AUDITED:
            status = answer.status_code
            outcome = "ok" if status < 400 else "refused" if status == 403 else "error"
            detail = None
            if outcome != "ok":
                try:
                    detail = str(json.loads(bytes(answer.body)).get("error"))
                except (ValueError, AttributeError, RecursionError):
                    detail = f"HTTP {status}"
            await run_in_threadpool(
                audit.record,
                home,
                method,
                user=request.state.user["name"],
                peer=request.client.host if request.client else None,
                target=_named(await request.body()),
                outcome=outcome,
                detail=detail,
            )
        return answer

    return endpoint


def _named(body: bytes) -> str | None:
    """What a call's body names first (a job, a sweep, the jobs listed), for the audit."""
    try:
        sent = json.loads(body or b"{}")
        args, kwargs = sent.get("args") or [None], sent.get("kwargs") or {}
        first = args[0] if isinstance(args, list) else None
        if first is None and isinstance(kwargs, dict):
            first = next((kwargs[k] for k in ("ref", "refs", "name") if k in kwargs), None)
    except (ValueError, AttributeError, RecursionError):
        return None
    if isinstance(first, list) and all(isinstance(x, str) for x in first):
        return " ".join(first)
    return first if isinstance(first, str) else None


async def openapi(request: Request) -> Response:
    """``GET /api/v1/openapi.json``: the calls' OpenAPI document, made from the contract."""
    from monkey.server.openapi import document

    return JSONResponse(await run_in_threadpool(document))


async def logs(request: Request) -> Response:
    """A job's output: raw bytes, or with ``follow`` framed pieces (see ``_frames``)."""
    q = request.query_params
    try:
        ref = request.path_params["ref"]
        stream = q.get("stream", "both")
        if stream not in ("both", "stdout", "stderr"):
            raise MonkeyError(f"stream {stream!r}: use both, stdout or stderr")
        tail = int(q["tail"]) if "tail" in q else None
        attempt = int(q["attempt"]) if "attempt" in q else None
        start = door.follow_start(await _body(request)) if request.method == "POST" else None
    except (ValueError, MonkeyError) as exc:
        return JSONResponse({"error": f"logs: {exc}"}, 400)
    if q.get("follow"):
        try:
            juid = await run_in_threadpool(lambda: _monkey().resolve(ref))
        except MonkeyError as exc:
            return _error(exc)
        return StreamingResponse(
            _in_own_threads(_frames(juid, stream, tail, start)),
            media_type="application/octet-stream",
        )

    def first() -> tuple[bytes, Iterator[bytes]]:
        chunks = iter(
            _monkey().output_chunks(
                ref,
                stream,
                attempt=attempt,
                tail=tail,
                setup=bool(q.get("setup")),
                marks=not q.get("unmarked"),
            )
        )
        return next(chunks, b""), chunks

    try:
        head, rest = await run_in_threadpool(first)  # its errors, before the answer starts
    except MonkeyError as exc:
        return _error(exc)

    def body() -> Iterator[bytes]:
        if head:
            yield head
        yield from rest

    return StreamingResponse(body(), media_type="application/octet-stream")


_followers: Any = None  # the threads follows wait in (created in the event loop)
# Set when the server stops: each follow's stream ends (without its end-of-job frame) within
# a keep-alive, so that a stop need not wait for them; their clients resume from where they were.
STOPPING = threading.Event()
FOLLOWERS = 1000  # follows served at once


async def _in_own_threads(frames: Iterator[bytes]) -> AsyncIterator[bytes]:
    """FRAMES read in threads of their own: a follow waits in its thread between writes, and
    must not take the threads that calls run in (a hundred idle follows would stall them)."""
    import anyio

    global _followers
    if _followers is None:
        _followers = anyio.CapacityLimiter(FOLLOWERS)
    while not STOPPING.is_set():  # a stopping server ends its follows at once: they resume
        frame = await anyio.to_thread.run_sync(next, frames, None, limiter=_followers)
        if frame is None:
            return
        yield frame


def _frames(
    juid: str, stream: str, tail: int | None, start: dict[str, Any] | None
) -> Iterator[bytes]:
    """A follow as frames: ``C 0 SIZE\\n`` + where reading begins (JSON: offsets, marks),
    ``D FILE OFFSET SIZE\\n`` + bytes, ``M ATTEMPT SIZE\\n`` + its mark line, ``K\\n`` (a
    keep-alive), ``E\\n`` (the job ended), ``X SIZE\\n`` + an error line."""
    from monkey.api import Monkey

    m = Monkey(_local_home)  # its own: the pieces are read in whichever thread is free
    try:
        for piece in m.follow_pieces(juid, stream, tail=tail, start=start):
            if piece is None:
                yield b"K\n"
            elif piece[0] in ("mark", "start"):
                yield (
                    f"{'M' if piece[0] == 'mark' else 'C'} {piece[1]} {len(piece[2])}\n".encode()
                    + piece[2]
                )
            else:
                yield f"D {piece[0]} {piece[1]} {len(piece[2])}\n".encode() + piece[2]
        yield b"E\n"
    except MonkeyError as exc:
        text = str(exc).encode()
        yield f"X {len(text)}\n".encode() + text
    finally:
        m.close()


def build(home: Home) -> ASGIApp:
    """The server's ASGI application over MONKEY_HOME HOME."""
    global _local_home
    _local_home = home
    STOPPING.clear()  # an app built again in this process serves its follows
    from monkey.server.web.app import Web

    gate = Gate(_monkey)
    app = Starlette(
        routes=[
            Route("/api/v1/call/{method}", audited(call, home), methods=["POST"]),
            Route("/api/v1/openapi.json", openapi, methods=["GET"]),
            Route("/api/v1/logs/{ref}", logs, methods=["GET", "POST"]),
            *blobs.routes(home, _monkey),
            *folders.routes(_monkey),
            *Web(home, _monkey, gate).routes(),
        ]
    )
    Store(home.db).close()  # the schema migrated before the first request
    return BodyBound(Guard(app, gate, home), body_limit)


def body_limit(path: str) -> int | None:
    """The most bytes a request's body to PATH may hold (see ``bounds.BodyBound``)."""
    if path == "/api/v1/blobs":
        return None  # a pack of blobs, written to disk as it comes, each blob bounded
    if path == "/api/v1/blobs/missing":
        return blobs.MAX_QUESTION
    if path == "/web" or path.startswith("/web/"):
        return MAX_FORM
    return MAX_BODY
