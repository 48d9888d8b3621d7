"""The S3 storage: a provider's bucket, through boto3 (imported only when first used).

Credentials are whatever boto3 resolves (the entry's ``profile``, its ``credentials``
file, the AWS_* environment, ...); monkey never reads or stores them. ``endpoint`` points
at an S3-compatible service (moto in tests). Workers get presigned URLs only.

A tree (``put_tree``) is its files under ``PREFIX/REL`` plus one object at ``PREFIX/`` (the
folder's own key) holding its listing as JSON, ``{"tree": {rel: [mode, size, mtime_ns]}}``
with size -1 for folders and "" for the root. The listing is written last and is what
``get_tree`` reads, so a tree whose upload was cut short is still the previous one.
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from monkey.models import MonkeyError
from monkey.snapshot import hash_file
from monkey.storage.base import (
    URL_EXPIRES,
    ProgressFn,
    Storage,
    Tree,
    blob_key,
    blob_mismatch,
    check_key,
    check_rel,
    fix_modes,
    local_tree,
    prune,
    source_size,
)
from monkey.storage.progress import upload_progress

if TYPE_CHECKING:
    from monkey.config import ProviderConfig
    from monkey.snapshot import BlobStore

MULTIPART = 8 << 20  # files from this size go in parts of this size (S3's default too)
_HEAD_AT_MOST = 64  # more unknown digests than this: list blobs/ instead of one HEAD each
_LIST_PAGES = 20  # ... unless the bucket holds more blobs than these pages of 1,000 list
_THREADS = 8


class S3Storage(Storage):
    """Keys of the module docstring of ``monkey.storage.base``, in BUCKET."""

    def __init__(self, bucket: str, *, region: str | None = None, endpoint: str | None = None,
                 profile: str | None = None, credentials: str | None = None,
                 multipart: int = MULTIPART) -> None:  # fmt: skip
        self.bucket, self.region, self.endpoint = bucket, region, endpoint
        self.profile, self.credentials = profile, credentials
        self.multipart = multipart
        self._client: Any = None
        self._lock = threading.Lock()
        self._known: set[str] = set()  # digests seen stored (blobs are never changed)

    @classmethod
    def from_config(cls, config: ProviderConfig) -> S3Storage:
        opts = config.options
        return cls(str(opts["bucket"]), region=opts.get("region"), endpoint=opts.get("endpoint"),
                   profile=opts.get("profile"), credentials=opts.get("credentials"))  # fmt: skip

    # -- blobs

    def has(self, digests: Iterable[str]) -> set[str]:
        """Known digests cost nothing; many unknown ones are looked up by listing blobs/
        (1,000 a call, at most _LIST_PAGES calls), the rest with concurrent HEADs."""
        wanted = set(digests)
        unknown = wanted - self._known
        found: set[str] = set()
        with self._errors("checking which blobs are stored"):
            if len(unknown) > _HEAD_AT_MOST:
                listed, complete = self._list_blobs()
                found = unknown & listed
                unknown = set() if complete else unknown - found
            if unknown:
                with ThreadPoolExecutor(min(_THREADS, len(unknown))) as pool:
                    ordered = list(unknown)
                    present = pool.map(self._exists, [blob_key(d) for d in ordered])
                    found |= {d for d, there in zip(ordered, present) if there}
        with self._lock:
            self._known |= found
        return wanted & self._known

    def put_blobs(self, digests: Iterable[str], source: BlobStore,
                  progress: ProgressFn | None = None) -> int:  # fmt: skip
        wanted = list(dict.fromkeys(digests))
        present = self.has(wanted)
        missing = [d for d in wanted if d not in present]
        sizes = {d: source_size(source, d) for d in missing}
        for digest in missing:
            if hash_file(source.path(digest)) != digest:
                raise blob_mismatch(source, digest)
        files = [(source.path(d), blob_key(d)) for d in missing]
        with upload_progress(sum(sizes.values()), progress) as advance:
            self._upload(files, advance, "uploading blobs")
        with self._lock:
            self._known.update(missing)
        return sum(sizes.values())

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
                self.bucket, prefix + "${filename}", ExpiresIn=int(expires),
                Fields={"Content-Type": "application/octet-stream"},
                Conditions=[["starts-with", "$key", prefix],
                            {"Content-Type": "application/octet-stream"}])  # fmt: skip
        return {"url": form["url"], "fields": form["fields"]}

    def get_file(self, key: str, path: Path) -> bool:
        key, path = check_key(key), Path(path)
        with self._errors(f"downloading {key}"):
            if not self._exists(key):
                return False
            path.parent.mkdir(parents=True, exist_ok=True)
            with self._transfers() as manager:  # a temporary name, renamed when complete
                manager.download(self.bucket, key, str(path)).result()
        return True

    # -- trees

    def put_tree(self, local_dir: Path, prefix: str) -> int:
        prefix = check_key(prefix)
        tree = local_tree(Path(local_dir)) or {"": (0o700, -1, 0)}
        old = self._read_tree(prefix) or {}
        with self._errors(f"uploading {prefix}"):
            stored = {k for k, _ in self._list(prefix + "/")}
        changed = [rel for rel, entry in tree.items() if entry[1] >= 0
                   and (old.get(rel) != entry or f"{prefix}/{rel}" not in stored)]  # fmt: skip
        with upload_progress(sum(tree[rel][1] for rel in changed), None, prefix) as advance:
            self._upload([(Path(local_dir) / rel, f"{prefix}/{rel}") for rel in changed],
                         advance, f"uploading {prefix}")  # fmt: skip
        body = json.dumps({"tree": {rel: list(e) for rel, e in sorted(tree.items())}}).encode()
        with self._errors(f"uploading {prefix}"):
            self._s3().put_object(Bucket=self.bucket, Key=prefix + "/", Body=body)
        keep = {f"{prefix}/{rel}" for rel, e in tree.items() if e[1] >= 0} | {prefix + "/"}
        self._delete_keys(sorted(stored - keep), prefix)
        return sum(tree[rel][1] for rel in changed)

    def get_tree(self, prefix: str, local_dir: Path) -> int:
        prefix, local_dir = check_key(prefix), Path(local_dir)
        tree = self._read_tree(prefix)
        if tree is None:
            return 0
        prune(local_dir, tree)
        have = local_tree(local_dir)
        changed = [rel for rel, e in tree.items() if e[1] >= 0 and have.get(rel) != e]
        temps = {rel: local_dir / f"{rel}.monkey-{uuid.uuid4().hex[:8]}" for rel in changed}
        try:
            with self._errors(f"downloading {prefix}"), self._transfers() as manager:
                futures = [manager.download(self.bucket, f"{prefix}/{rel}", str(temps[rel]))
                           for rel in changed]  # fmt: skip
                for future in futures:
                    future.result()
            for rel in changed:
                mode, _size, mtime = tree[rel]
                os.chmod(temps[rel], mode)
                os.utime(temps[rel], ns=(mtime, mtime))
                os.replace(temps[rel], local_dir / rel)
        finally:
            for tmp in temps.values():
                tmp.unlink(missing_ok=True)
        fix_modes(local_dir, tree)
        return sum(tree[rel][1] for rel in changed)

    def delete(self, prefix: str) -> None:
        prefix = check_key(prefix)
        with self._errors(f"deleting {prefix}"):
            keys = [k for k, _ in self._list(prefix) if k == prefix or k.startswith(prefix + "/")]
        self._delete_keys(keys, prefix)
        if prefix.startswith("blobs/"):
            with self._lock:
                self._known.discard(prefix[len("blobs/"):])

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
                        core.set_config_variable("credentials_file",
                                                 os.path.expanduser(self.credentials))  # fmt: skip
                    session = boto3.session.Session(botocore_session=core, profile_name=self.profile,
                                                    region_name=self.region)  # fmt: skip
                    config = Config(signature_version="s3v4", max_pool_connections=2 * _THREADS,
                                    s3={"addressing_style": "path"} if self.endpoint else {})  # fmt: skip
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
            raise MonkeyError(f"S3 bucket {self.bucket}: no AWS credentials found; set `profile` "
                              "or `credentials` in providers.yml, or AWS_PROFILE") from None
        except ProfileNotFound as e:
            raise MonkeyError(f"S3 bucket {self.bucket}: {e}; fix `profile` in providers.yml") from None
        except ClientError as e:
            err = e.response.get("Error", {})
            code, msg = err.get("Code", "?"), err.get("Message") or ""
            hint = "; create it with `monkey provider add`" if code == "NoSuchBucket" else ""
            raise MonkeyError(f"S3 bucket {self.bucket}: {what} failed: {code} {msg}{hint}".rstrip()) from None
        except BotoCoreError as e:
            raise MonkeyError(f"S3 bucket {self.bucket}: {what} failed: {e}") from None

    @contextmanager
    def _transfers(self) -> Iterator[Any]:
        from boto3.s3.transfer import TransferConfig, create_transfer_manager

        config = TransferConfig(multipart_threshold=self.multipart, multipart_chunksize=self.multipart,
                                max_concurrency=_THREADS)  # fmt: skip
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
            futures = [manager.upload(str(path), self.bucket, key, subscribers=[Progress()])
                       for path, key in files]  # fmt: skip
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
        pages = self._s3().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        for page in pages:
            for obj in page.get("Contents", []):
                yield obj["Key"], obj["Size"]

    def _list_blobs(self) -> tuple[set[str], bool]:
        """Digests stored, from the first _LIST_PAGES pages of blobs/; and whether that was all."""
        found: set[str] = set()
        pages = self._s3().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix="blobs/")
        for number, page in enumerate(pages):
            if number == _LIST_PAGES:
                return found, False
            found.update(obj["Key"][len("blobs/"):] for obj in page.get("Contents", []))
        return found, True

    def _read_tree(self, prefix: str) -> Tree | None:
        """The listing stored at PREFIX/, or None when there is no tree."""
        from botocore.exceptions import ClientError

        with self._errors(f"reading {prefix}"):
            try:
                body = self._s3().get_object(Bucket=self.bucket, Key=prefix + "/")["Body"].read()
            except ClientError as e:
                if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                    return None
                raise
        try:
            raw = json.loads(body)["tree"]
            tree = {rel: (int(e[0]), int(e[1]), int(e[2])) for rel, e in raw.items()}
        except (ValueError, KeyError, TypeError, IndexError):
            raise MonkeyError(f"S3 bucket {self.bucket}: {prefix}/ is not a tree stored by "
                              "monkey; delete it or use another bucket") from None
        for rel in tree:
            if rel:
                check_rel(rel, f"s3://{self.bucket}/{prefix}/")
        return tree

    def _delete_keys(self, keys: list[str], prefix: str) -> None:
        with self._errors(f"deleting {prefix}"):
            for start in range(0, len(keys), 1000):
                batch = [{"Key": k} for k in keys[start:start + 1000]]
                reply = self._s3().delete_objects(Bucket=self.bucket,
                                                  Delete={"Objects": batch, "Quiet": True})  # fmt: skip
                if reply.get("Errors"):
                    err = reply["Errors"][0]
                    raise MonkeyError(f"S3 bucket {self.bucket}: deleting {err.get('Key')} "
                                      f"failed: {err.get('Code')} {err.get('Message')}")  # fmt: skip

    def _presign(self, method: str, key: str, expires: int) -> str:
        key = check_key(key)
        with self._errors("signing a URL"):
            return self._s3().generate_presigned_url(
                method, Params={"Bucket": self.bucket, "Key": key}, ExpiresIn=int(expires))
