"""Submitting to a main node: the code, datasets, job.yml, git state and packages are
gathered on this machine exactly as a local submission gathers them (``Submitter.gather``)
into a blob cache of this remote, the blobs the server lacks are uploaded, and the server
records the jobs from what was gathered (``Submitter.accept``), owned by the token's user.

The cache (``$XDG_CACHE_HOME/monkey/remotes/NAME``, default ``~/.cache``) holds blobs and
the digests of unchanged files, so submitting an unchanged project again reads and sends
nothing but the file list; it holds no job. Deleting it costs one full upload."""

from __future__ import annotations

import os
from pathlib import Path

from monkey.config import Home
from monkey.remote import RemoteError
from monkey.remote import blobs as transfer
from monkey.remote.client import Client
from monkey.store import Store
from monkey.submit import Submitter, blobs_needed

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# Options of run and sweep read on this machine; the others go to the server as given.
LOCAL_OPTIONS = ("outputs", "retries", "datasets", "env", "workdir", "job_yml", "yes")
RESOURCES = {"cpus": 1, "gpus": 0, "memory": None, "host": None, "time": None}  # defaults


def cache_folder(name: str) -> Path:
    """The blob cache of remote NAME."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "monkey" / "remotes" / name


class Gatherer:
    """Gathers submissions to one remote through its CLIENT into the remote's cache."""

    def __init__(self, name: str, client: Client) -> None:
        self.client = client
        self.home = Home(cache_folder(name)).ensure()
        self.store = Store(self.home.db)
        self.submitter = Submitter(self.home, self.store, dict)

    def close(self) -> None:
        self.store.close()

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
        with self.submitter.blobs().lease():
            sub = self.submitter.gather(provider, job_options, **local)
        fields = {k: v for k, v in sub.fields.items() if k != "blobs"}
        self.named, self.listed = blobs_needed(fields, self.submitter.blobs())
        self.send()
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
            return self.client.call(method, *args, **kwargs)
        except RemoteError as exc:
            if exc.status != 409:
                raise
        self.send(full=True)
        return self.client.call(method, *args, **kwargs)
