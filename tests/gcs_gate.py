"""A gate in front of fake-gcs-server that checks what Google checks and the fake does not.

fake-gcs-server (v1.54) stores whatever reaches it: it verifies no V4 signature, neither of
signed URLs nor of POST policies, and no policy condition. Tests that only pass because of
that would prove nothing about workers that hold no credentials, so every request reaches
the fake through this gate, which enforces GCS's rules for what workers send:

- a request signed in its query (``X-Goog-Signature``) must carry a valid V4 signature
  (RSA-SHA256 over the canonical request, by a trusted service account) that has not expired;
- a multipart form POST must carry a policy signed by a trusted service account, not
  expired, whose every condition the form meets, and which names every form field
  (but ``x-goog-signature``, ``policy``, ``file`` and ``x-ignore-*``), as GCS requires;
- any other request is refused unless it is a JSON API call (``/storage/v1/``,
  ``/upload/storage/v1/``, ``/download/storage/v1/``, ``/upload/resumable/``): those are
  the core's own authenticated client, which the emulator serves without tokens.

Refusals are 403 with the reason in the body; ``refused`` lists them for assertions.
"""

from __future__ import annotations

import base64
import datetime
import email.parser
import email.policy
import hashlib
import http.client
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit

_API = ("/storage/v1/", "/upload/storage/v1/", "/download/storage/v1/", "/upload/resumable/")
_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "upgrade"}


class Refused(Exception):
    """Why the gate refuses a request."""


class SignedGate:
    """Listens on 127.0.0.1 (``address``: host:port) and forwards accepted requests to
    BACKEND_PORT on 127.0.0.1, Host header unchanged."""

    def __init__(self) -> None:
        self.keys: dict[str, Any] = {}  # service-account email -> RSA public key
        self.refused: list[str] = []
        self.backend_port = 0
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def trust(self, key_file: str) -> None:
        """Accept signatures by the service account of the JSON KEY_FILE."""
        from cryptography.hazmat.primitives.serialization import load_pem_private_key

        account = json.loads(open(key_file).read())
        private = load_pem_private_key(account["private_key"].encode(), password=None)
        self.keys[account["client_email"]] = private.public_key()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -- checks

    def check(self, method: str, target: str, headers: Any, body: bytes) -> None:
        """Raise Refused unless GCS would accept the request."""
        url = urlsplit(target)
        query = parse_qsl(url.query, keep_blank_values=True)
        if any(k == "X-Goog-Signature" for k, _ in query):
            return self._check_url(method, url.path, query, headers)
        if method == "POST" and headers.get("Content-Type", "").startswith("multipart/form-data"):
            return self._check_form(url.path, headers, body)
        if not url.path.startswith(_API):
            raise Refused(f"{method} {url.path}: neither signed nor an authenticated API call")
        return None

    def _verify(self, credential: str, date: str, message: bytes, signature_hex: str) -> None:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import padding

        email_, _, scope = credential.partition("/")
        if scope != f"{date[:8]}/auto/storage/goog4_request":
            raise Refused(f"bad credential scope {scope!r}")
        key = self.keys.get(email_)
        if key is None:
            raise Refused(f"signed by an unknown service account {email_!r}")
        try:
            key.verify(bytes.fromhex(signature_hex), message, padding.PKCS1v15(), hashes.SHA256())
        except (InvalidSignature, ValueError):
            raise Refused("the signature does not match") from None

    def _check_url(
        self, method: str, path: str, query: list[tuple[str, str]], headers: Any
    ) -> None:
        params = dict(query)
        for name in (
            "X-Goog-Algorithm",
            "X-Goog-Credential",
            "X-Goog-Date",
            "X-Goog-Expires",
            "X-Goog-SignedHeaders",
        ):
            if name not in params:
                raise Refused(f"signed URL without {name}")
        if params["X-Goog-Algorithm"] != "GOOG4-RSA-SHA256":
            raise Refused(f"algorithm {params['X-Goog-Algorithm']}")
        signed_at = _parse_stamp(params["X-Goog-Date"])
        if time.time() > signed_at + int(params["X-Goog-Expires"]):
            raise Refused("the signed URL has expired")
        names = params["X-Goog-SignedHeaders"].split(";")
        canonical_headers = "".join(
            f"{n}:{' '.join((headers.get(n) or '').split())}\n" for n in names
        )
        canonical_query = "&".join(
            f"{quote(k, safe='')}={quote(v, safe='')}"
            for k, v in sorted(query)
            if k != "X-Goog-Signature"
        )
        request = "\n".join(
            [
                method,
                path,
                canonical_query,
                canonical_headers,
                params["X-Goog-SignedHeaders"],
                "UNSIGNED-PAYLOAD",
            ]
        )
        scope = params["X-Goog-Credential"].partition("/")[2]
        to_sign = "\n".join(
            [
                "GOOG4-RSA-SHA256",
                params["X-Goog-Date"],
                scope,
                hashlib.sha256(request.encode()).hexdigest(),
            ]
        )
        self._verify(
            params["X-Goog-Credential"],
            params["X-Goog-Date"],
            to_sign.encode(),
            params["X-Goog-Signature"],
        )

    def _check_form(self, path: str, headers: Any, body: bytes) -> None:
        form, file_size = _parse_form(headers.get("Content-Type", ""), body)
        for name in ("policy", "x-goog-signature", "x-goog-credential", "x-goog-date", "key"):
            if name not in form:
                raise Refused(f"form without {name}")
        if form.get("x-goog-algorithm") != "GOOG4-RSA-SHA256":
            raise Refused("form without x-goog-algorithm GOOG4-RSA-SHA256")
        self._verify(
            form["x-goog-credential"],
            form["x-goog-date"],
            form["policy"].encode(),
            form["x-goog-signature"],
        )
        policy = json.loads(base64.b64decode(form["policy"]))
        ends = datetime.datetime.strptime(policy["expiration"], "%Y-%m-%dT%H:%M:%SZ")
        if ends.replace(tzinfo=datetime.timezone.utc).timestamp() < time.time():
            raise Refused("the policy has expired")
        values = {k.lower(): v for k, v in form.items()}
        values["bucket"] = path.strip("/").split("/")[0]
        check_conditions(policy, values, file_size, {"x-goog-signature", "policy", "file"})


def check_conditions(
    policy: dict[str, Any], values: dict[str, str], file_size: int, free: set[str]
) -> None:
    """Raise Refused unless the form VALUES (lower-case names, with ``bucket``) and its file
    of FILE_SIZE bytes meet every condition of the POST POLICY, and every field but FREE
    is one a condition names (S3 and GCS check forms alike)."""
    covered = {"bucket"}
    for cond in policy["conditions"]:
        if isinstance(cond, dict):
            [(name, want)] = cond.items()
            cond = ["eq", f"${name}", want]
        op, *args = cond
        if op == "content-length-range":
            if not args[0] <= file_size <= args[1]:
                raise Refused(f"file of {file_size} bytes out of {args}")
            continue
        name = args[0].lstrip("$").lower()
        covered.add(name)
        have = values.get(name)
        if (
            have is None
            or (op == "eq" and have != args[1])
            or (op == "starts-with" and not have.startswith(args[1]))
        ):
            raise Refused(f"the form's {name}={have!r} does not meet {cond}")
    stray = sorted(k for k in values if k not in covered | free and not k.startswith("x-ignore-"))
    if stray:
        raise Refused(f"form fields not in the policy: {stray}")


def _parse_stamp(stamp: str) -> float:
    parsed = datetime.datetime.strptime(stamp, "%Y%m%dT%H%M%SZ")
    return parsed.replace(tzinfo=datetime.timezone.utc).timestamp()


def _parse_form(content_type: str, body: bytes) -> tuple[dict[str, str], int]:
    """The text fields of a multipart form and the size of its ``file`` part."""
    parser = email.parser.BytesParser(policy=email.policy.HTTP)
    message = parser.parsebytes(f"Content-Type: {content_type}\r\n\r\n".encode() + body)
    fields: dict[str, str] = {}
    size = -1
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True) or b""
        if name == "file":
            size = len(payload)
        elif name:
            fields[name] = payload.decode()
    if size < 0:
        raise Refused("form without a file")
    return fields, size


def _handler(gate: SignedGate) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def handle_one(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                gate.check(self.command, self.path, self.headers, body)
            except (Refused, ValueError, KeyError) as exc:
                gate.refused.append(f"{self.command} {self.path.split('?')[0]}: {exc}")
                return self.reply(403, {"Content-Type": "text/plain"}, f"gate: {exc}".encode())
            backend = http.client.HTTPConnection("127.0.0.1", gate.backend_port, timeout=60)
            try:
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                backend.request(self.command, self.path, body=body or None, headers=headers)
                reply = backend.getresponse()
                data = reply.read()
                kept = {
                    k: v
                    for k, v in reply.getheaders()
                    if k.lower() not in _HOP and k.lower() != "content-length"
                }
                self.reply(reply.status, kept, data, reply.getheader("Content-Length"))
            finally:
                backend.close()

        def reply(
            self, status: int, headers: dict[str, str], data: bytes, length: str | None = None
        ) -> None:
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            head = self.command == "HEAD" and length is not None
            self.send_header("Content-Length", length if head else str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = do_PATCH = handle_one  # noqa: N815

    return Handler
