"""A gate in front of moto's server that checks S3's presigned URLs and POST policies.

moto (5.2) reads only the Authorization header: it serves a presigned URL or a POST form
whatever its signature, expiry or policy says, so S3 tests that pass through moto alone
prove nothing about what workers (who hold no credentials) send. Every request reaches
moto through this gate (``MotoServer.endpoint`` is the gate's), which enforces S3's rules:

- a request signed in its query (``X-Amz-Signature``) must carry a valid SigV4 signature
  (HMAC-SHA256 over the canonical request, recomputed with the secret of a known access
  key) that has not expired;
- a multipart form POST must carry a policy signed (SigV4) by a known access key, not
  expired, whose every condition the form meets (``${filename}`` in the key replaced by
  the file's name first), and which names every form field (but ``x-amz-signature``,
  ``policy``, ``file`` and ``x-ignore-*``), as S3 requires;
- any other request (the core's own boto3 calls, signed in their Authorization header,
  and EC2's API) passes through unchanged: moto checks those when told to
  (``MotoServer.reject_credentials``).

Refusals are 403 with the reason in the body; ``refused`` lists them for assertions.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import hmac
import json
import re
import time
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from tests.gcs_gate import Refused, SignedGate, _parse_form, _parse_stamp, check_conditions


class S3Gate(SignedGate):
    """Listens on 127.0.0.1 (``address``) and forwards to BACKEND_PORT (moto)."""

    def __init__(self) -> None:
        self.secrets: dict[str, str] = {}  # access key id -> secret access key
        super().__init__()

    def trust_key(self, access_key: str, secret: str) -> None:
        """Accept signatures made with ACCESS_KEY's SECRET."""
        self.secrets[access_key] = secret

    def check(self, method: str, target: str, headers: Any, body: bytes) -> None:
        """Raise Refused unless S3 would accept the request (see the module docstring)."""
        url = urlsplit(target)
        query = parse_qsl(url.query, keep_blank_values=True)
        if any(k == "X-Amz-Signature" for k, _ in query):
            return self._check_url(method, url.path, query, headers)
        if method == "POST" and headers.get("Content-Type", "").startswith("multipart/form-data"):
            return self._check_form(url.path, headers, body)
        return None

    def _signing_key(self, credential: str, date: str) -> bytes:
        """The SigV4 key of CREDENTIAL (``AKID/DATE/REGION/s3/aws4_request``) signed at DATE."""
        access_key, _, scope = credential.partition("/")
        day, region, service, terminal = (scope.split("/") + ["", "", "", ""])[:4]
        if day != date[:8] or service != "s3" or terminal != "aws4_request" or not region:
            raise Refused(f"bad credential scope {scope!r}")
        secret = self.secrets.get(access_key)
        if secret is None:
            raise Refused(f"signed with an unknown access key {access_key!r}")
        key = ("AWS4" + secret).encode()
        for part in (day, region, service, terminal):
            key = hmac.new(key, part.encode(), hashlib.sha256).digest()
        return key

    def _verify(self, credential: str, date: str, message: bytes, signature_hex: str) -> None:
        want = hmac.new(self._signing_key(credential, date), message, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(want, signature_hex.lower()):
            raise Refused("the signature does not match")

    def _check_url(
        self, method: str, path: str, query: list[tuple[str, str]], headers: Any
    ) -> None:
        params = dict(query)
        for name in (
            "X-Amz-Algorithm",
            "X-Amz-Credential",
            "X-Amz-Date",
            "X-Amz-Expires",
            "X-Amz-SignedHeaders",
        ):
            if name not in params:
                raise Refused(f"presigned URL without {name}")
        if params["X-Amz-Algorithm"] != "AWS4-HMAC-SHA256":
            raise Refused(f"algorithm {params['X-Amz-Algorithm']}")
        expires = int(params["X-Amz-Expires"])
        if not 1 <= expires <= 604800:
            raise Refused(f"X-Amz-Expires={expires} is outside 1..604800")
        if time.time() > _parse_stamp(params["X-Amz-Date"]) + expires:
            raise Refused("the presigned URL has expired")
        names = params["X-Amz-SignedHeaders"].split(";")
        if "host" not in names:
            raise Refused("the presigned URL does not sign the host")
        canonical_headers = "".join(
            f"{n}:{' '.join((headers.get(n) or '').split())}\n" for n in names
        )
        canonical_query = "&".join(
            f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}"
            for k, v in sorted(query)
            if k != "X-Amz-Signature"
        )
        request = "\n".join(
            [
                method,
                quote(unquote(path), safe="/-_.~"),
                canonical_query,
                canonical_headers,
                params["X-Amz-SignedHeaders"],
                params.get("X-Amz-Content-Sha256", "UNSIGNED-PAYLOAD"),
            ]
        )
        scope = params["X-Amz-Credential"].partition("/")[2]
        to_sign = "\n".join(
            [
                "AWS4-HMAC-SHA256",
                params["X-Amz-Date"],
                scope,
                hashlib.sha256(request.encode()).hexdigest(),
            ]
        )
        self._verify(
            params["X-Amz-Credential"],
            params["X-Amz-Date"],
            to_sign.encode(),
            params["X-Amz-Signature"],
        )

    def _check_form(self, path: str, headers: Any, body: bytes) -> None:
        form, file_size = _parse_form(headers.get("Content-Type", ""), body)
        named = re.search(rb'name="file"; filename="([^"]*)"', body)
        values = {k.lower(): v for k, v in form.items()}
        for name in ("policy", "x-amz-signature", "x-amz-credential", "x-amz-date", "key"):
            if name not in values:
                raise Refused(f"form without {name}")
        if values.get("x-amz-algorithm") != "AWS4-HMAC-SHA256":
            raise Refused("form without x-amz-algorithm AWS4-HMAC-SHA256")
        self._verify(
            values["x-amz-credential"],
            values["x-amz-date"],
            values["policy"].encode(),
            values["x-amz-signature"],
        )
        policy = json.loads(base64.b64decode(values["policy"]))
        ends = datetime.datetime.strptime(
            policy["expiration"].split(".")[0].rstrip("Z"), "%Y-%m-%dT%H:%M:%S"
        )
        if ends.replace(tzinfo=datetime.timezone.utc).timestamp() < time.time():
            raise Refused("the policy has expired")
        values["key"] = values["key"].replace(
            "${filename}", named.group(1).decode() if named else ""
        )
        values["bucket"] = path.strip("/").split("/")[0]
        check_conditions(policy, values, file_size, {"x-amz-signature", "policy", "file"})
