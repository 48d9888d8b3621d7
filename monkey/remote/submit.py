"""Submitting to a main node: the code, datasets, job.yml, git state and packages are
gathered on this machine exactly as a local submission gathers them (``Submitter.gather``)
into a blob cache of this remote, the blobs the server lacks are uploaded, and the server
records the jobs from what was gathered (``Submitter.accept``), owned by the token's user.

The cache (``$XDG_CACHE_HOME/monkey/remotes/NAME``, default ``~/.cache``; see
``monkey.remote.cache``) holds blobs and the digests of unchanged files, so submitting an
unchanged project again reads and sends nothing but the file list; it holds no job. It is
bounded, and a blob it no longer holds costs a read of its file and an upload only when the
server lacks it."""

from __future__ import annotations

import os
import sys
from contextlib import ExitStack, contextmanager

from monkey.config import Home
from monkey.remote import RemoteError
from monkey.remote import blobs as transfer
from monkey.remote.cache import Cache, cache_folder
from monkey.remote.client import Client
from monkey.store import Store
from monkey.store.errors import DiskFull, StoreUnavailable
from monkey.submit import Submitter, blobs_needed

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any

__all__ = ["Gatherer", "cache_folder"]

# Options of run and sweep read on this machine; the others go to the server as given.
LOCAL_OPTIONS = ("outputs", "retries", "datasets", "env", "workdir", "job_yml", "yes")
RESOURCES = {"cpus": 1, "gpus": 0, "memory": None, "host": None, "time": None}  # defaults


class Gatherer:
    """Gathers submissions to one remote through its CLIENT into the remote's cache."""

    def __init__(self, name: str, client: Client) -> None:
        self.client = client
        self.cache = Cache(name)
        self.cache.check()  # one line naming the folder and the fix, before any work
        self.home = Home(self.cache.root).ensure()
        try:
            self.store = Store(self.home.db)
        except DiskFull:
            raise self.cache.full() from None
        self.submitter = Submitter(self.home, self.store, dict)
        self._lease: ExitStack | None = None  # held from a gather to its submission's end
        self.sent = 0  # the bytes the last submission uploaded
        self.image: str | None = None  # the last gathered job.yml's image

    def close(self) -> None:
        self._release()
        self.store.close()

    def _hold(self) -> None:
        if self._lease is None:
            lease = ExitStack()
            lease.enter_context(self.cache.blobs.lease())
            self._lease = lease

    def _release(self) -> None:
        if self._lease is not None:
            self._lease.close()
            self._lease = None

    @contextmanager
    def using(self) -> Iterator[None]:
        """Hold the cache's lease while blobs are read or fetched (nothing trims them
        meanwhile), then trim the cache to its limit."""
        try:
            with self.cache.blobs.lease(), self._disk():
                yield
        finally:
            self.trim()

    @contextmanager
    def _disk(self) -> Iterator[None]:
        """A full disk under the cache as one line naming it and the fix."""
        try:
            yield
        except DiskFull as exc:
            if not os.path.realpath(exc.path).startswith(os.path.realpath(self.cache.root)):
                raise  # not the cache's disk (a clone's folder)
            raise self.cache.full() from None

    def trim(self) -> None:
        """Bring the cache under its limit, unless another command uses it (it does so as
        it ends); a cache that cannot be trimmed now is said in a note."""
        try:
            self.cache.trim(self.store)
        except (OSError, StoreUnavailable) as exc:
            print(
                f"monkey: note: the cache of remote {self.cache.name} could not be trimmed "
                f"now ({exc}); the next command tries again",
                file=sys.stderr,
            )

    def gather(self, provider: str, options: dict[str, Any]) -> dict[str, Any]:
        """What a run or sweep to PROVIDER with OPTIONS (run's keywords) sends as
        ``gathered``, once the server agreed the resources fit and every blob it needs is
        on the server."""
        kind = self.client.call(
            "provider_kind", provider, *(options.get(k, v) for k, v in RESOURCES.items())
        )  # a provider that does not exist, or too many CPUs, is refused before any work
        from monkey.drivers import driver_class
        from monkey.models import MonkeyError

        try:
            job_options = driver_class(kind).job_options
        except MonkeyError:  # a kind this client does not know: the server warns
            job_options = frozenset()
        local = {k: options[k] for k in LOCAL_OPTIONS if options.get(k) is not None}
        self._hold()  # until ``submit`` ends
        try:
            with self._disk():
                sub = self.submitter.gather(provider, job_options, captured=False, **local)
            # the job.yml's image is sent as `image`: the server pins it with its logins
            self.image = sub.fields.pop("image", None)
            fields = {k: v for k, v in sub.fields.items() if k != "blobs"}
            self.named, self.listed = blobs_needed(fields, self.submitter.blobs())
            self.cache.touch(self.named)  # the file lists stand for their files
            self.sent = self.send()
        except BaseException:
            self._release()
            raise
        return {"fields": fields, "name": sub.name, "secrets": sub.secrets}

    def send(self, full: bool = False) -> int:
        """Upload the blobs of the last gathered submission the server lacks (the files
        before the lists naming them); the bytes sent. Unless FULL, the server is asked
        about the files only when it lacks a list: it checks them all when the jobs are
        submitted, and says which it lacks (HTTP 409)."""
        lacking = transfer.missing(self.client, self.named)
        if lacking or full:
            lacking = [*transfer.missing(self.client, self.listed), *lacking]
        return transfer.upload(self.client, self.submitter.blobs(), lacking)

    def submit(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Facade METHOD on the server with the gathered submission in KWARGS; when a gc
        there removed some blobs since they were sent, they are sent again, once."""
        try:
            try:
                return self.client.call(method, *args, **kwargs)
            except RemoteError as exc:
                if exc.status != 409:
                    raise
            self.sent += self.send(full=True)
            return self.client.call(method, *args, **kwargs)
        finally:
            self._release()
            self.trim()
