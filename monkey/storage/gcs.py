"""The GCS storage: a `gce` provider's bucket, through google-cloud-storage (imported only
when first used).

The entry's `credentials` (a service-account JSON key) authenticates the client and signs
what workers get, who hold no credentials: V4 signed URLs (GET, PUT) and V4 signed POST
policies (``upload_form``: any key under a prefix, octet-stream only). With `storage_endpoint` set (fake-gcs-server
in tests) the client talks to that server without Google tokens, and signed URLs name it.

Keys are those of ``monkey.storage.base``; trees and blobs: see ``monkey.storage.bucket``.
"""

from __future__ import annotations

import datetime
import json
import os
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from monkey.models import MonkeyError
from monkey.storage.base import URL_EXPIRES, ProgressFn, blob_key, check_key
from monkey.storage.bucket import THREADS, BucketStorage

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from monkey.config import ProviderConfig

_CHUNK = 8 << 20  # resumable uploads in chunks of this size
_LONGEST_SIGNATURE = 7 * 24 * 3600  # a V4 signature lives at most 7 days
_GOOGLE = "https://storage.googleapis.com"


class GCSStorage(BucketStorage):
    """Keys of the module docstring of ``monkey.storage.base``, in BUCKET."""

    scheme = "gs"
    label = "GCS bucket"

    def __init__(
        self,
        bucket: str,
        *,
        credentials: str,
        project: str | None = None,
        endpoint: str | None = None,
    ) -> None:
        super().__init__(bucket)
        self.credentials = credentials
        self.project, self.endpoint = project, endpoint
        self._client: Any = None
        self._signer: Any = None

    @classmethod
    def from_entry(cls, entry: dict[str, Any]) -> GCSStorage:
        return cls(
            str(entry["bucket"]),
            credentials=str(entry["credentials"]),
            project=entry.get("project"),
            endpoint=entry.get("storage_endpoint"),
        )

    @classmethod
    def from_config(cls, config: ProviderConfig) -> GCSStorage:
        return cls.from_entry(config.options)

    def ensure_bucket(self) -> bool:
        """Create the bucket unless it exists; whether it was created."""
        with self._errors("looking up the bucket"):
            if self._gcs().lookup_bucket(self.bucket) is not None:
                return False
        with self._errors("creating the bucket"):
            self._gcs().create_bucket(self.bucket)
        return True

    # -- signed URLs and forms

    def blob_url(self, digest: str, expires: int = URL_EXPIRES) -> str:
        return self._sign(blob_key(digest), "GET", expires)

    def put_url(self, key: str, expires: int = URL_EXPIRES) -> str:
        return self._sign(key, "PUT", expires, content_type="application/octet-stream")

    def get_url(self, key: str, expires: int = URL_EXPIRES) -> str:
        return self._sign(key, "GET", expires)

    def upload_form(self, prefix: str, expires: int = URL_EXPIRES) -> dict[str, Any]:
        """A V4 signed POST policy for any key under PREFIX/ (octet-stream only).

        Built here rather than by the client's ``generate_signed_post_policy_v4``, which
        always adds an exact ``{"key": NAME}`` condition: GCS would then refuse every key
        but that one, and a worker sends many (``objects/<sha>``, manifests)."""
        import base64

        prefix = check_key(prefix) + "/"
        creds = self._service_account()
        now = datetime.datetime.now(datetime.timezone.utc)
        stamp = now.strftime("%Y%m%dT%H%M%SZ")
        fields = {
            "Content-Type": "application/octet-stream",
            "x-goog-algorithm": "GOOG4-RSA-SHA256",
            "x-goog-credential": f"{creds.signer_email}/{stamp[:8]}/auto/storage/goog4_request",
            "x-goog-date": stamp,
        }
        ends = now + datetime.timedelta(seconds=min(int(expires), _LONGEST_SIGNATURE))
        policy = json.dumps(
            {
                "conditions": [
                    {"bucket": self.bucket},
                    ["starts-with", "$key", prefix],
                    *({k: v} for k, v in fields.items()),
                ],
                "expiration": ends.strftime("%Y-%m-%dT%H:%M:%SZ"),
            },
            separators=(",", ":"),
        ).encode()
        encoded = base64.b64encode(policy)
        with self._errors("signing an upload form"):
            signature = creds.sign_bytes(encoded).hex()
        url = f"{(self.endpoint or _GOOGLE).rstrip('/')}/{self.bucket}"  # XML API: POST /BUCKET
        return {
            "url": url,
            "fields": {**fields, "policy": encoded.decode(), "x-goog-signature": signature},
        }

    # -- internals

    def _gcs(self) -> Any:
        """The client, made on first use: the service account's credentials, or none at an
        emulator `endpoint`."""
        with self._lock:
            if self._client is None:
                try:
                    from google.auth.credentials import AnonymousCredentials
                    from google.cloud import storage
                except ImportError:
                    raise MonkeyError(
                        "GCS storage needs google-cloud-storage: pip install "
                        "google-cloud-storage (or '.[gcp]' in monkey's clone)"
                    ) from None

                options = {"api_endpoint": self.endpoint} if self.endpoint else None
                creds = AnonymousCredentials() if self.endpoint else self._service_account()
                with self._errors("connecting"):
                    self._client = storage.Client(
                        project=self.project or "-", credentials=creds, client_options=options
                    )
            return self._client

    def _service_account(self) -> Any:
        if self._signer is None:
            from google.oauth2 import service_account

            try:
                self._signer = service_account.Credentials.from_service_account_file(
                    os.path.expanduser(self.credentials)
                )
            except (OSError, ValueError) as exc:
                raise MonkeyError(
                    f"GCS bucket {self.bucket}: credentials {self.credentials} is "
                    f"not a service-account JSON key ({exc}); fix `credentials:`"
                ) from None
        return self._signer

    def _blob(self, key: str) -> Any:
        return self._gcs().bucket(self.bucket).blob(key, chunk_size=_CHUNK)

    @contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        """Turn the client's failures into one line naming the bucket and the fix."""
        from google.api_core.exceptions import Forbidden, GoogleAPICallError, NotFound
        from google.auth.exceptions import GoogleAuthError
        from requests.exceptions import RequestException

        try:
            yield
        except MonkeyError:
            raise
        except NotFound:
            raise MonkeyError(
                f"GCS bucket {self.bucket}: {what} failed: not found; create it "
                "with `monkey provider add gcp`"
            ) from None
        except Forbidden as e:
            raise MonkeyError(
                f"GCS bucket {self.bucket}: {what} failed: {_said(e)}; give the "
                "service account Storage Admin rights on it"
            ) from None
        except GoogleAPICallError as e:
            raise MonkeyError(
                f"GCS bucket {self.bucket}: {what} failed: {e.code} {_said(e)}"
            ) from None
        except GoogleAuthError as e:
            first = (str(e).strip().splitlines() or ["refused"])[0]
            raise MonkeyError(
                f"GCS bucket {self.bucket}: {what} failed: credentials: {first}; "
                "fix `credentials:` in providers.yml"
            ) from None
        except RequestException as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise MonkeyError(
                f"GCS bucket {self.bucket}: {what} failed: {first}; check the "
                "network or `endpoint:`"
            ) from None

    def _upload(self, files: list[tuple[Path, str]], advance: ProgressFn, what: str) -> None:
        """Upload (path, key) pairs at once; ADVANCE gets byte counts as each file lands."""
        if not files:
            return

        def one(item: tuple[Path, str]) -> None:
            path, key = item
            self._blob(key).upload_from_filename(str(path), content_type="application/octet-stream")
            advance(path.stat().st_size)

        with self._errors(what), ThreadPoolExecutor(min(THREADS, len(files))) as pool:
            list(pool.map(one, files))

    def _list(self, prefix: str) -> Iterator[tuple[str, int]]:
        """(key, size) of every object whose key starts with PREFIX."""
        for blob in self._gcs().list_blobs(self.bucket, prefix=prefix):
            yield blob.name, int(blob.size or 0)

    def _list_dated(self, prefix: str) -> Iterator[tuple[str, int, float]]:
        """(key, size, when last written) of every object whose key starts with PREFIX."""
        for blob in self._gcs().list_blobs(self.bucket, prefix=prefix):
            yield blob.name, int(blob.size or 0), blob.updated.timestamp() if blob.updated else 0.0

    def _exists(self, key: str) -> bool:
        return bool(self._blob(key).exists())

    def _download(self, pairs: list[tuple[str, Path]], what: str) -> None:
        if not pairs:
            return
        with self._errors(what), ThreadPoolExecutor(min(THREADS, len(pairs))) as pool:
            list(
                pool.map(lambda pair: self._blob(pair[0]).download_to_filename(str(pair[1])), pairs)
            )

    def _put_bytes(self, key: str, body: bytes) -> None:
        self._blob(key).upload_from_string(body, content_type="application/json")

    def _get_bytes(self, key: str) -> bytes | None:
        from google.api_core.exceptions import NotFound

        try:
            return bytes(self._blob(key).download_as_bytes())
        except NotFound:
            return None

    def _delete_keys(self, keys: list[str], prefix: str) -> None:
        from google.api_core.exceptions import NotFound

        def one(key: str) -> None:
            try:
                self._blob(key).delete()
            except NotFound:
                pass

        if keys:
            with (
                self._errors(f"deleting {prefix}"),
                ThreadPoolExecutor(min(THREADS, len(keys))) as pool,
            ):
                list(pool.map(one, keys))

    def _sign(self, key: str, method: str, expires: int, content_type: str | None = None) -> str:
        key = check_key(key)
        with self._errors("signing a URL"):
            return (
                self._gcs()
                .bucket(self.bucket)
                .blob(key)
                .generate_signed_url(
                    version="v4",
                    method=method,
                    expiration=datetime.timedelta(seconds=int(expires)),
                    credentials=self._service_account(),
                    content_type=content_type,
                    api_access_endpoint=self.endpoint or _GOOGLE,
                )
            )


def _said(exc: Any) -> str:
    """The server's message of a client error, on one line, without the request's URL."""
    text = str(getattr(exc, "message", "") or exc)
    text = re.sub(r"^[A-Z]+ https?://\S+: ", "", text.strip())
    try:
        text = json.loads(text.split("\n", 1)[0])["error"]["message"]
    except (ValueError, KeyError, TypeError):
        pass
    return (str(text).strip().splitlines() or ["refused"])[0]
