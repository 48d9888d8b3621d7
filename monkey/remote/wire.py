"""HTTP/1.1 on one socket: the part of it the client of a main node speaks (requests with a
body given whole or in pieces, answers sized by Content-Length, chunked or ended by a close,
kept-alive connections).

The standard library's http.client imports the email package to parse headers, which costs
more at every command's start than the rest of a remote `monkey list jobs` together; the
server (uvicorn, h11) is the strict side of this conversation, and this side only talks to it.
"""

from __future__ import annotations

import io
import socket

from monkey.models import whole_number

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

MAX_LINE = 65536  # a status or header line longer than this is no server's answer
MAX_HEADERS = 100


class Disconnected(ConnectionError):
    """The server closed the connection before answering (a kept-alive connection it had
    timed out: the request did not reach it)."""


class BadAnswer(OSError):
    """An answer that is not HTTP/1.1 (a wrong port, a broken stream)."""


class Response(io.RawIOBase):
    """An answer's status line and headers, and its body as a raw stream (``Answer``
    buffers it)."""

    def __init__(self, file: io.BufferedReader, method: str) -> None:
        super().__init__()
        self._file = file
        line = file.readline(MAX_LINE + 1)
        if not line:
            raise Disconnected("the server closed the connection")
        version, _, rest = line.decode("latin-1").rstrip("\r\n").partition(" ")
        code = rest.partition(" ")[0]
        status = whole_number(code)
        if not version.startswith("HTTP/1.") or status is None or len(line) > MAX_LINE:
            raise BadAnswer(f"not an HTTP answer: {line[:60]!r}")
        self.status = status
        self.headers: dict[str, str] = {}
        for _ in range(MAX_HEADERS + 1):
            line = file.readline(MAX_LINE + 1)
            if line in (b"\r\n", b"\n"):
                break
            name, colon, value = line.decode("latin-1").partition(":")
            if not colon or len(line) > MAX_LINE:
                raise BadAnswer(f"a malformed header line: {line[:60]!r}")
            self.headers[name.strip().lower()] = value.strip()
        else:
            raise BadAnswer("too many header lines")
        close = self.headers.get("connection", "").lower() == "close"
        self.will_close = version == "HTTP/1.0" or close
        self._chunked = "chunked" in self.headers.get("transfer-encoding", "").lower()
        self._left: int | None = None  # bytes left of the body (of its chunk when chunked)
        length = self.headers.get("content-length")
        if method == "HEAD" or self.status in (204, 304) or self.status < 200:
            self._left = 0
        elif self._chunked:
            self._left = self._next_chunk()
        elif length is not None:
            self._left = whole_number(length)
            if self._left is None:
                raise BadAnswer(f"a malformed Content-Length: {length!r}")
        else:  # ended by the server closing the connection
            self.will_close = True

    def getheader(self, name: str, default: str | None = None) -> str | None:
        return self.headers.get(name.lower(), default)

    @property
    def done(self) -> bool:
        """Whether the whole body was read (the connection can carry the next request)."""
        return self._left == 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        if self._left == 0:
            return 0
        view = memoryview(buffer)
        if self._left is not None:
            view = view[: self._left]
        got = self._file.readinto1(view) if len(view) else 0
        if self._left is None:
            return got
        if not got:
            raise BadAnswer("the server closed the connection in the middle of an answer")
        self._left -= got
        if self._left == 0 and self._chunked:
            if self._file.readline(MAX_LINE) not in (b"\r\n", b"\n"):
                raise BadAnswer("a malformed chunk end")
            self._left = self._next_chunk()
        return got

    def _next_chunk(self) -> int:
        """The size of the next chunk; 0 at the last one, whose trailers are read."""
        line = self._file.readline(MAX_LINE + 1)
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise BadAnswer(f"a malformed chunk size: {line[:60]!r}") from None
        if size == 0:
            for _ in range(MAX_HEADERS + 1):
                if self._file.readline(MAX_LINE + 1) in (b"\r\n", b"\n", b""):
                    break
        return size


class Answer(io.BufferedReader):
    """An answer as a file of its body (read(N) reads N bytes unless the body ends first;
    read1, readline), with its ``status`` and ``getheader(NAME)``."""

    raw: Response

    @property
    def status(self) -> int:
        return self.raw.status

    def getheader(self, name: str, default: str | None = None) -> str | None:
        return self.raw.getheader(name, default)


def given_value(headers: Mapping[str, str], name: str) -> str | None:
    """The value of header NAME in HEADERS, whatever its case, lowered."""
    return next((v.lower() for k, v in headers.items() if k.lower() == name), None)


class Connection:
    """One kept-alive connection over SOCK (plain or TLS) to HOST."""

    def __init__(self, sock: socket.socket, host: str) -> None:
        self.sock = sock
        self.host = host
        self._file = sock.makefile("rb")
        self._last: Response | None = None
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass

    @property
    def reusable(self) -> bool:
        """Whether the last answer was read whole and the server keeps the connection."""
        last = self._last
        return last is None or (last.done and not last.will_close)

    def request(
        self,
        method: str,
        path: str,
        headers: Mapping[str, str],
        body: bytes | Iterable[bytes] | None = None,
    ) -> Answer:
        """Send a request and read its answer's status and headers. A BODY in pieces is sent chunked unless
        HEADERS give its Content-Length. With ``Expect: 100-continue`` in HEADERS, BODY is sent
        only once the server says so: an answer instead (a refusal) comes back unsent."""
        given = {k.lower() for k in headers}
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self.host}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        chunked = False
        if isinstance(body, bytes):
            lines.append(f"Content-Length: {len(body)}")
        elif body is None:
            if method in ("POST", "PUT"):
                lines.append("Content-Length: 0")
        elif "content-length" not in given:
            chunked = True
            lines.append("Transfer-Encoding: chunked")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        if isinstance(body, bytes):
            self.sock.sendall(head + body)
        else:
            self.sock.sendall(head)
            if given_value(headers, "expect") == "100-continue":
                first = Response(self._file, method)
                if first.status != 100:  # the server refused the body before reading it
                    first.will_close = True  # the body it expected never came
                    self._last = first
                    return Answer(first)
            for piece in body or ():
                if chunked and piece:
                    self.sock.sendall(b"%x\r\n%b\r\n" % (len(piece), piece))
                elif not chunked:
                    self.sock.sendall(piece)
            if chunked:
                self.sock.sendall(b"0\r\n\r\n")
        self._last = Response(self._file, method)
        return Answer(self._last)

    def close(self) -> None:
        self._file.close()
        self.sock.close()
