"""A job's code as it ran, on a laptop: ``clone``, ``cat`` and ``info --files`` through a
remote read the job's record from the server and its blobs into the remote's cache
(``FetchingBlobs``), then write and read them exactly as ``monkey.rerun.Reruns`` does on
the main node."""

from __future__ import annotations

from monkey.remote.blobs import FetchingBlobs
from monkey.rerun import Reruns

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from monkey.models import Job as JobRecord
    from monkey.remote.client import Client
    from monkey.remote.submit import Gatherer
    from monkey.snapshot.blobs import BlobStore
    from monkey.snapshot.manifest import FileEntry


class RemoteReruns(Reruns):
    """``Reruns.files``, ``cat`` and ``clone`` of a remote's jobs (read by GET_JOB and INFO,
    its blobs through CLIENT) in the cache of GATHERER."""

    def __init__(
        self,
        gatherer: Gatherer,
        client: Client,
        get_job: Callable[[str], JobRecord],
        info: Callable[[str], dict[str, Any]],
    ) -> None:
        super().__init__(gatherer.home, gatherer.store, gatherer.submitter, lambda _: None)
        self.get_job, self.info = get_job, info
        self.fetching = FetchingBlobs(gatherer.home.blobs, client)
        self.using = gatherer.using  # the cache's lease while its blobs are read, then a trim

    def files(self, ref: str) -> list[FileEntry]:
        with self.using():
            return super().files(ref)

    def cat(self, ref: str, path: str) -> bytes:
        with self.using():
            return super().cat(ref, path)

    def clone(self, ref: str, to: Any = None, with_data: bool = False) -> dict[str, Any]:
        with self.using():
            return super().clone(ref, to, with_data)

    def _blobs(self) -> BlobStore:
        return self.fetching

    def _job_record(self, ref: str) -> JobRecord:
        return self.get_job(ref)

    def _job_spec(self, juid: str) -> dict[str, Any] | None:
        return self.info(juid)["spec"]
