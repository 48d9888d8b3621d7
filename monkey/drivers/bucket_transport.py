"""The bucket transport of the cloud kinds (``ec2``, ``gce``): the SSH transport to their
running instances (the agent's link, logs while up), with blobs, checkpoints, persisted
folders and outputs moved through the provider's bucket by presigned URLs, so instances
hold no credentials. Without a bucket, everything goes over SSH."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

from monkey.drivers.ssh_transport import SSHTransport
from monkey.models import MonkeyError
from monkey.snapshot.blobs import BlobStore
from monkey.storage import results as bucket_results
from monkey.storage.base import source_size
from monkey.storage.bucket import PACK_BLOB_MAX, PACK_MIN, BucketStorage

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from monkey.config import Home, ProviderConfig
    from monkey.drivers.agent_link import AgentLink

log = logging.getLogger("monkey.cloud")


class BucketTransport(SSHTransport):
    """SSH to a cloud provider's running instances (its hosts come and go with them), and
    its bucket for what an agent can move itself. The provider's driver passes in how to
    find an instance not served yet (REACH: a listing) and the fields arming every agent
    (AGENT_FIELDS: the notice watch and the orphan watch, per instance; ORPHAN_FIELD: the
    orphan watch alone)."""

    def __init__(
        self,
        config: ProviderConfig,
        home: Home,
        entry: dict[str, Any],
        storage: BucketStorage | None,
        reach: Callable[[], object],
        agent_fields: Callable[[str], dict[str, Any]],
        orphan_field: Callable[[], dict[str, Any]],
    ) -> None:
        super().__init__(config, home)
        self.entry = entry
        self.storage = storage
        self.leaves_behind = storage is not None
        if storage is not None:  # kept folders go through the bucket, not over SSH
            self.checkpoint_every = math.inf
        self.reach = reach
        self.agent_fields = agent_fields
        self.orphan_field = orphan_field

    def connect(self, instance: str) -> AgentLink:
        if instance not in self.hosts:  # after a restart: list before giving up
            self.reach()
        if instance not in self.hosts:
            raise MonkeyError(f"{instance} is not a running instance of provider {self.name!r}")
        return super().connect(instance)

    def checkpoint_dir(self, instance: str, juid: str) -> str:
        """Without a bucket, the SSH provider's (a copy of MONKEY_HOME's, made over SSH).
        With one, a path only: the agent makes the folder and restores it from the bucket
        (see ``start_fields``)."""
        if self.storage is None:
            return super().checkpoint_dir(instance, juid)
        return f"{self.runs_dir(instance)}/{juid}/checkpoint"

    def prepare(self, instance: str, blobs: list[str]) -> dict[str, Any]:
        """Without a bucket, send the blobs the instance lacks over SSH. With one, put
        those it lacks in the bucket (one SSH round trip asks which, until all are known
        to be there) and return the fields that fetch them: ``blob_packs`` for small ones
        when there are several (a project's code: one request instead of one per file),
        ``blob_urls`` for the others (datasets: each stored once by digest)."""
        if self.storage is None:
            return super().prepare(instance, blobs)
        missing = self.missing(instance, blobs)
        if not missing:
            return {}
        source = BlobStore(self.home.blobs)
        sizes = {d: source_size(source, d) for d in missing}
        small = {d for d in missing if sizes[d] <= PACK_BLOB_MAX}
        single = [d for d in missing if d not in small or len(small) < PACK_MIN]
        self.storage.put_blobs(single, source)
        fields: dict[str, Any] = {}
        # Each with the sha256 of the checked local copy: the agent (no blake3) checks what
        # the bucket gave it, and a damaged object is refused, then stored again.
        if len(small) >= PACK_MIN:
            fields["blob_packs"] = [
                [self.storage.get_url(key), [[d, size, source.sha256(d)] for d, size in index]]
                for key, index in self.storage.put_packs(small, source)
            ]
        if single:
            fields["blob_urls"] = {
                d: [self.storage.blob_url(d), sizes[d], source.sha256(d)] for d in single
            }
        return fields

    def bucket_damaged(self, digest: str) -> None:
        if self.storage is not None:
            self.storage.distrust(digest)

    def start_fields(
        self, instance: str, juid: str, attempt: int, outputs: list[str]
    ) -> dict[str, Any]:
        """``results``: the bucket's upload form for the job, the kept folders to restore
        from its newest manifest (see monkey.storage.results); ``watch`` for spot ones."""
        if self.storage is None:
            return {"orphan": self.orphan_field()}
        dirs = {
            "checkpoint": self.checkpoint_dir(instance, juid),
            "persist": self.persist_dir(instance, juid),
        }
        every = float(self.entry.get("checkpoint_every", 60))
        return {
            **bucket_results.start_fields(self.storage, juid, attempt, dirs, outputs, every),
            **self.sync_fields(instance),
        }

    def sync_fields(self, instance: str) -> dict[str, Any]:
        return self.agent_fields(instance)

    def left_behind(
        self, instance: str, juid: str, attempt: int, offset: int
    ) -> tuple[str, list[tuple[int, dict[str, Any]]]] | None:
        if self.storage is None:
            return None
        return bucket_results.read_left(self.storage, self.home, juid, attempt, offset)

    def finish(
        self, instance: str, juid: str, attempt: int, outputs: list[str], current: bool
    ) -> None:
        """Without a bucket, the SSH provider's. With one: the logs over SSH while the
        instance is up, the checkpoint, persisted folders and outputs from the bucket
        (also when the instance is gone)."""
        if self.storage is None:
            super().finish(instance, juid, attempt, outputs, current)
            return
        logs_error = None
        if instance in self.hosts and self.hosts[instance].up:
            try:
                self.fetch_logs(instance, [(juid, attempt)])
            except Exception as exc:  # noqa: BLE001 - the bucket's part comes first
                logs_error = exc
        fetched = bucket_results.bring_back(self.storage, self.home, juid, attempt, current)
        if fetched:
            log.info(
                "%s: %s attempt %d: %d bytes of results from the bucket",
                self.name,
                juid,
                attempt,
                fetched,
            )
        if logs_error is not None:
            raise logs_error
