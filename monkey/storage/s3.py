"""The S3 storage: a provider's bucket, through boto3 (imported only when first used).

Credentials are whatever boto3 resolves (the entry's ``profile``, its ``credentials``
file, the AWS_* environment, ...); monkey never reads or stores them. ``endpoint`` points
at an S3-compatible service (moto in tests). Workers get presigned URLs only. Trees and
blobs: see ``monkey.storage.bucket``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from monkey.models import MonkeyError
from monkey.storage.base import URL_EXPIRES, ProgressFn, blob_key, check_key
from monkey.storage.bucket import THREADS, BucketStorage

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from monkey.config import ProviderConfig

MULTIPART = 8 << 20  # files from this size go in parts of this size (S3's default too)


class S3Storage(BucketStorage):
    """Keys of the module docstring of ``monkey.storage.base``, in BUCKET."""

    scheme = "s3"
    label = "S3 bucket"

    def __init__(
        self,
        bucket: str,
        *,
        region: str | None = None,
        endpoint: str | None = None,
        profile: str | None = None,
        credentials: str | None = None,
        multipart: int = MULTIPART,
    ) -> None:
        super().__init__(bucket)
        self.region, self.endpoint = region, endpoint
        self.profile, self.credentials = profile, credentials
        self.multipart = multipart
        self._client: Any = None

    @classmethod
    def from_config(cls, config: ProviderConfig) -> S3Storage:
        opts = config.options
        return cls(
            str(opts["bucket"]),
            region=opts.get("region"),
            endpoint=opts.get("endpoint"),
            profile=opts.get("profile"),
            credentials=opts.get("credentials"),
        )

    def blob_url(self, digest: str, expires: int = URL_EXPIRES) -> str:
        return self._presign("get_object", blob_key(digest), expires)

    def put_url(self, key: str, expires: int = URL_EXPIRES) -> str:
        return self._presign("put_object", key, expires)

    def get_url(self, key: str, expires: int = URL_EXPIRES) -> str:
        return self._presign("get_object", key, expires)

    def upload_form(self, prefix: str, expires: int = URL_EXPIRES) -> dict[str, Any]:
        """A presigned POST policy for keys starting with PREFIX/ (octet-stream only)."""
        prefix = check_key(prefix) + "/"
        with self._errors("signing an upload form"):
            form = self._s3().generate_presigned_post(
                self.bucket,
                prefix + "${filename}",
                ExpiresIn=int(expires),
                Fields={"Content-Type": "application/octet-stream"},
                Conditions=[
                    ["starts-with", "$key", prefix],
                    {"Content-Type": "application/octet-stream"},
                ],
            )
        return {"url": form["url"], "fields": form["fields"]}

    # -- internals

    def _s3(self) -> Any:
        """The boto3 client, made on first use (boto3 costs ~200 ms to import)."""
        with self._lock:
            if self._client is None:
                import boto3
                import botocore.session
                from botocore.config import Config

                with self._errors("connecting"):
                    core = botocore.session.Session()
                    if self.credentials:
                        core.set_config_variable(
                            "credentials_file", os.path.expanduser(self.credentials)
                        )
                    session = boto3.session.Session(
                        botocore_session=core, profile_name=self.profile, region_name=self.region
                    )
                    config = Config(
                        signature_version="s3v4",
                        max_pool_connections=2 * THREADS,
                        s3={"addressing_style": "path"} if self.endpoint else {},
                    )
                    self._client = session.client("s3", endpoint_url=self.endpoint, config=config)
            return self._client

    @contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        """Turn boto3's failures into one line naming the bucket and the fix."""
        from botocore.exceptions import (
            BotoCoreError,
            ClientError,
            NoCredentialsError,
            ProfileNotFound,
        )

        try:
            yield
        except NoCredentialsError:
            raise MonkeyError(
                f"S3 bucket {self.bucket}: no AWS credentials found; set `profile` "
                "or `credentials` in providers.yml, or AWS_PROFILE"
            ) from None
        except ProfileNotFound as e:
            raise MonkeyError(
                f"S3 bucket {self.bucket}: {e}; fix `profile` in providers.yml"
            ) from None
        except ClientError as e:
            err = e.response.get("Error", {})
            code, msg = err.get("Code", "?"), err.get("Message") or ""
            hint = "; create it with `monkey provider add`" if code == "NoSuchBucket" else ""
            raise MonkeyError(
                f"S3 bucket {self.bucket}: {what} failed: {code} {msg}{hint}".rstrip()
            ) from None
        except BotoCoreError as e:
            raise MonkeyError(f"S3 bucket {self.bucket}: {what} failed: {e}") from None

    @contextmanager
    def _transfers(self) -> Iterator[Any]:
        from boto3.s3.transfer import TransferConfig, create_transfer_manager

        config = TransferConfig(
            multipart_threshold=self.multipart,
            multipart_chunksize=self.multipart,
            max_concurrency=THREADS,
        )
        with create_transfer_manager(self._s3(), config) as manager:
            yield manager

    def _upload(self, files: list[tuple[Path, str]], advance: ProgressFn, what: str) -> None:
        """Upload (path, key) pairs at once, in parts when large; ADVANCE gets byte counts."""
        if not files:
            return
        from s3transfer.subscribers import BaseSubscriber

        class Progress(BaseSubscriber):
            def on_progress(self, future: Any, bytes_transferred: int, **kwargs: Any) -> None:
                advance(bytes_transferred)

        with self._errors(what), self._transfers() as manager:
            futures = [
                manager.upload(str(path), self.bucket, key, subscribers=[Progress()])
                for path, key in files
            ]
            for future in futures:
                future.result()

    def _exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self._s3().head_object(Bucket=self.bucket, Key=key)
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise
        return True

    def _list(self, prefix: str) -> Iterator[tuple[str, int]]:
        """(key, size) of every object whose key starts with PREFIX."""
        pages = (
            self._s3().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        )
        for page in pages:
            for obj in page.get("Contents", []):
                yield obj["Key"], obj["Size"]

    def _list_dated(self, prefix: str) -> Iterator[tuple[str, int, float]]:
        """(key, size, when last written) of every object whose key starts with PREFIX."""
        pages = (
            self._s3().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        )
        for page in pages:
            for obj in page.get("Contents", []):
                yield obj["Key"], obj["Size"], obj["LastModified"].timestamp()

    def _download(self, pairs: list[tuple[str, Path]], what: str) -> None:
        if not pairs:
            return
        with self._errors(what), self._transfers() as manager:
            futures = [manager.download(self.bucket, key, str(path)) for key, path in pairs]
            for future in futures:
                future.result()

    def _put_bytes(self, key: str, body: bytes) -> None:
        self._s3().put_object(Bucket=self.bucket, Key=key, Body=body)

    def _get_bytes(self, key: str) -> bytes | None:
        from botocore.exceptions import ClientError

        try:
            return self._s3().get_object(Bucket=self.bucket, Key=key)["Body"].read()
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return None
            raise

    def _delete_keys(self, keys: list[str], prefix: str) -> None:
        with self._errors(f"deleting {prefix}"):
            for start in range(0, len(keys), 1000):
                batch = [{"Key": k} for k in keys[start : start + 1000]]
                reply = self._s3().delete_objects(
                    Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True}
                )
                if reply.get("Errors"):
                    err = reply["Errors"][0]
                    raise MonkeyError(
                        f"S3 bucket {self.bucket}: deleting {err.get('Key')} "
                        f"failed: {err.get('Code')} {err.get('Message')}"
                    )

    def _presign(self, method: str, key: str, expires: int) -> str:
        key = check_key(key)
        with self._errors("signing a URL"):
            return self._s3().generate_presigned_url(
                method, Params={"Bucket": self.bucket, "Key": key}, ExpiresIn=int(expires)
            )
