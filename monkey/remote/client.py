"""The HTTPS connection to a main node: TLS checked against the pinned fingerprint (or a
certificate authority), the token sent only once the certificate is right, one-line errors
for everything a user can meet (server down, token refused, certificate changed, another
version), and the calls and streams ``RemoteMonkey`` makes."""

from __future__ import annotations

import json
import socket
import ssl
from urllib.parse import quote, urlencode

from monkey.models import MonkeyError
from monkey.remote import (
    API,
    API_HEADER,
    UPGRADE,
    VERSION_HEADER,
    RemoteError,
    Unreachable,
    codec,
    split_url,
)
from monkey.remote.settings import Remote
from monkey.remote.wire import Answer, Connection, Disconnected

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

CONNECT_TIMEOUT = 5.0  # seconds: a server that is down or unreachable is one line, quickly
READ_TIMEOUT = 120.0  # a call's answer; a follow's stream gets keep-alives every second


def fingerprint(der: bytes) -> str:
    """A certificate's SHA-256 fingerprint as monkey prints it: ``SHA256:`` + 64 hex digits."""
    import hashlib

    return "SHA256:" + hashlib.sha256(der).hexdigest()


def normal_fingerprint(text: str) -> str:
    """TEXT (``SHA256:AB:CD...``, ``sha256:abcd...`` or bare hex) in monkey's form; MonkeyError
    when it is not a SHA-256 fingerprint."""
    body = text.strip()
    if body.lower().startswith("sha256:"):
        body = body[7:]
    body = body.replace(":", "").lower()
    if len(body) != 64 or any(c not in "0123456789abcdef" for c in body):
        raise MonkeyError(
            f"{text!r} is not a SHA-256 fingerprint; copy the `SHA256:...` line that "
            "`monkey server status` prints on the server"
        )
    return "SHA256:" + body


class Client:
    """Calls and streams to one remote, over one kept-alive connection."""

    def __init__(
        self, remote: Remote, user: str | None = None, trust_on_first_use: bool = False
    ) -> None:
        self.remote = remote
        self.user = user
        self.tunnel = None  # an ssh:// remote: connections are channels of one SSH connection
        server = remote.url
        if remote.url.startswith("ssh:"):
            from monkey.remote.tunnel import Tunnel

            self.tunnel = Tunnel(remote.name, remote.url, trust_on_first_use)
            server = self.tunnel.server_url
        self.scheme, self.host, self.port = split_url(server)
        self._open = self.tunnel.open if self.tunnel else _create_connection
        self.read_timeout = READ_TIMEOUT  # a call's answer (see call_within)
        self._conn: Connection | None = None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self.tunnel is not None:
            self.tunnel.close()

    # -- connecting -----------------------------------------------------------------------

    def _connect(self) -> Connection:
        name, url = self.remote.name, self.remote.url
        try:
            sock = self._open((self.host, self.port), CONNECT_TIMEOUT)
        except OSError as exc:
            raise self._unreachable(exc) from None
        if self.scheme == "https":
            pinned = bool(self.remote.fingerprint)
            ctx = self._context(verify=not pinned)
            try:
                sock = ctx.wrap_socket(
                    sock, server_hostname=_sni(self.host) if pinned else self.host
                )
            except ssl.SSLCertVerificationError as exc:
                sock.close()
                seen = self._peer_fingerprint()
                why = (
                    "is signed by no authority this machine trusts"
                    if exc.verify_code in (18, 19)
                    else f"cannot be verified ({exc.verify_message})"
                )  # 18, 19: self-signed
                raise RemoteError(
                    f"{name}: the certificate of {url} ({seen}) {why}; if `monkey server "
                    f"status` on the server prints that fingerprint, pin it: add --fingerprint "
                    f"{seen} to `monkey remote add`"
                ) from None
            except OSError as exc:  # ssl.SSLError is one
                sock.close()
                raise self._unreachable(exc) from None
            if self.remote.fingerprint:
                seen = fingerprint(sock.getpeercert(binary_form=True) or b"")
                if seen != self.remote.fingerprint:  # the token is not sent to another server
                    sock.close()
                    raise RemoteError(
                        f"{name}: the certificate of {url} changed: pinned "
                        f"{self.remote.fingerprint}, now {seen}; if the server's certificate "
                        f"was renewed on purpose, add the remote again with --fingerprint {seen}"
                    )
        sock.settimeout(self.read_timeout)
        return Connection(sock, f"{self.host}:{self.port}")

    def _unreachable(self, exc: OSError) -> Unreachable:
        return Unreachable(
            f"{self.remote.name}: cannot reach {self.remote.url} ({_why(exc)}); is `monkey "
            "server` running there? (`monkey server status` on it)"
        )

    def _dropped(self, exc: OSError) -> RemoteError:
        if self.scheme == "http" and self.tunnel is None:  # an https server closes plain HTTP
            seen = self._peer_fingerprint()
            if not seen.startswith("unknown"):
                name, url = self.remote.name, self.remote.url
                https = "https" + url[len("http") :].rstrip("/")
                return RemoteError(
                    f"{name}: {url} speaks HTTPS, not plain HTTP; use its https:// address: "
                    f"monkey remote add {name} {https} --fingerprint {seen} (if `monkey server "
                    "status` there prints that fingerprint)"
                )
        return Unreachable(
            f"{self.remote.name}: the connection to {self.remote.url} dropped ({_why(exc)})"
        )

    @staticmethod
    def _context(verify: bool) -> ssl.SSLContext:
        if verify:
            return ssl.create_default_context()
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE  # checked against the pinned fingerprint instead
        return ctx

    def _peer_fingerprint(self) -> str:
        """The fingerprint of the certificate the server shows (no token is sent)."""
        ctx = self._context(verify=False)
        try:
            with (
                self._open((self.host, self.port), CONNECT_TIMEOUT) as raw,
                ctx.wrap_socket(raw, server_hostname=_sni(self.host)) as tls,
            ):
                return fingerprint(tls.getpeercert(binary_form=True) or b"")
        except OSError as exc:
            return f"unknown: {_why(exc)}"
        except MonkeyError as exc:  # the tunnel's own line
            return f"unknown: {exc}"

    # -- requests -------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        body: bytes | Iterable[bytes] | None = None,
        retry: bool = True,
        headers: dict[str, str] | None = None,
    ) -> Answer:
        """Send a request and return its answer once its status is a success; RemoteError
        with the one line for anything else. A kept-alive connection the server closed
        meanwhile is opened again once (RETRY), only when the request cannot have reached it
        (a BODY given as pieces, read once, is never sent again)."""
        headers = {
            "Authorization": f"Bearer {self.remote.token}",
            API_HEADER: str(API),
            VERSION_HEADER: _version(),
            "Content-Type": "application/json",
            **(headers or {}),
        }
        retry = retry and (body is None or isinstance(body, bytes))
        if self._conn is not None and not self._conn.reusable:
            self.close()  # an answer left unread, or the server said it closes
        fresh = self._conn is None
        if self._conn is None:
            self._conn = self._connect()
        else:
            self._conn.sock.settimeout(self.read_timeout)  # a follow's stream may have set another
        try:
            resp = self._conn.request(method, path, headers, body)
        except OSError as exc:
            self.close()
            # A kept-alive connection the server had closed: the request never reached it.
            if retry and not fresh and isinstance(exc, (Disconnected, BrokenPipeError)):
                return self.request(method, path, body, retry=False, headers=headers)
            raise self._dropped(exc) from None
        self._check(resp)
        return resp

    def _check(self, resp: Answer) -> None:
        name = self.remote.name
        theirs = resp.getheader(API_HEADER)
        if theirs is None:
            self.close()
            raise RemoteError(
                f"{name}: {self.remote.url} does not answer as a monkey server "
                f"(HTTP {resp.status}); check the URL and port"
            )
        if theirs != str(API) or resp.status == 426:
            self.close()
            raise RemoteError(
                f"{name}: the server runs monkey {resp.getheader(VERSION_HEADER)} (API {theirs}) "
                f"and this client monkey {_version()} (API {API}); upgrade the older one: {UPGRADE}"
            )
        if resp.status < 400:
            return
        data = self.read(resp)
        try:
            message = json.loads(data).get("error") or ""
        except (ValueError, AttributeError):
            message = data.decode(errors="replace")[:200]
        if resp.status == 401:
            who = self.user or "NAME"
            raise RemoteError(
                f"{name}: token refused; ask an admin: monkey server user token {who}", 401
            )
        if resp.status == 429:
            wait = resp.getheader("Retry-After") or "60"
            raise RemoteError(
                f"{name}: too many refused tokens from this address; try again in {wait}s", 429
            )
        if resp.status >= 500:
            raise RemoteError(
                f"{name}: the server failed ({message or resp.status}); see its "
                "log: MONKEY_HOME/server/server.log on the main node",
                resp.status,
            )
        raise RemoteError(message or f"{name}: HTTP {resp.status}", resp.status)

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """The result of facade METHOD(*ARGS, **KWARGS) on the server."""
        body = codec.arguments(args, kwargs)
        resp = self.request("POST", f"/api/v1/call/{quote(method)}", body)
        return codec.loads(self.read(resp))

    def read(self, resp: Answer) -> bytes:
        """The whole body of RESP; Unreachable when the connection drops before its end (a
        link cut, the server killed, in the middle of an answer), as for its head."""
        try:
            return resp.read()
        except OSError as exc:
            self.close()
            raise self._dropped(exc) from None

    def call_within(self, timeout: float, method: str, *args: Any, **kwargs: Any) -> Any:
        """``call``, Unreachable when the answer does not come within TIMEOUT seconds (a
        poller's quick call: a link down is noticed then, not after READ_TIMEOUT)."""
        self.read_timeout = timeout
        try:
            return self.call(method, *args, **kwargs)
        finally:
            self.read_timeout = READ_TIMEOUT

    def stream(
        self, path: str, query: dict[str, Any], body: Any = None, read_timeout: float = READ_TIMEOUT
    ) -> Answer:
        """A streamed answer: the caller reads it to its end (or closes the client); a read
        that waits READ_TIMEOUT seconds fails (a follow's keep-alives come every second)."""
        shown = {k: v for k, v in query.items() if v is not None and v is not False}
        target = path + ("?" + urlencode(shown) if shown else "")
        if body is None:
            resp = self.request("GET", target)
        else:
            resp = self.request("POST", target, json.dumps(body).encode())
        if self._conn is not None:
            self._conn.sock.settimeout(read_timeout)
        return resp


def _create_connection(address: tuple[str, int], timeout: float) -> socket.socket:
    """socket.create_connection, an ASCII host name given as bytes: a str is encoded with
    the idna codec, whose import (unicodedata, stringprep) every command would pay."""
    host, port = address
    named = host.encode() if host.isascii() else host  # getaddrinfo takes bytes too
    return socket.create_connection((named, port), timeout)  # type: ignore[arg-type]


def _sni(host: str) -> str | None:
    """The server name a pinned connection sends for HOST: none for an address (RFC 6066),
    so no idna codec either (a checked one needs HOST, name or address, to match)."""
    return None if ":" in host or host.replace(".", "").isdigit() else host


def _version() -> str:
    from monkey import __version__

    return __version__


def _why(exc: BaseException) -> str:
    if isinstance(exc, (TimeoutError, socket.timeout)):
        return f"no answer within {CONNECT_TIMEOUT:.0f}s"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
