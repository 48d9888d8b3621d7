"""The transport half of the driver contract: reach an instance's agent, make blobs available
there, say where runs, checkpoints and persisted folders live there, bring results back.

A :class:`~monkey.drivers.base.Driver` has one (``driver.transport``), made in its
``__init__``; the core calls the transport for everything that moves files or talks to an
agent, and the driver for its rules and provisioning. The implementations kinds compose:
``LocalTransport`` (this machine: a Unix socket, MONKEY_HOME's folders; ``local``, and
``slurm`` without a login host), ``SSHTransport`` (a pool of hosts over paramiko; ``ssh``,
the clouds' running instances, Slurm's login host) and ``BucketTransport`` (SSH for the
agent and logs, a bucket with presigned URLs for blobs and results; ``ec2``, ``gce``).
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, ClassVar

    from monkey.drivers.agent_link import AgentLink


class Transport(ABC):
    """How the core reaches the instances of one provider and moves files to and from them."""

    # Its checkpoint_dir, prepare, start_fields and finish only touch this machine's files
    # (never a network): the core calls them in its loop, sparing a worker's round trip.
    quick: ClassVar[bool] = False

    @abstractmethod
    def connect(self, instance: str) -> AgentLink:
        """A connected link to the instance's agent, started if it was not running. An agent
        running other code than the installed agent's (``hello``'s ``digest`` against
        monkey.version.agent_digest) is asked to ``shutdown``, its jobs left running, and a
        fresh one is started; it adopts them on the core's ``sync``."""

    @abstractmethod
    def blobs_dir(self, instance: str) -> str:
        """Where the instance's agent finds content-addressed blobs."""

    @abstractmethod
    def run_dir(self, instance: str, juid: str, attempt: int) -> str:
        """The attempt's run directory as seen on the instance."""

    @abstractmethod
    def checkpoint_dir(self, instance: str, juid: str) -> str:
        """The job's checkpoint directory as seen on the instance (kept across attempts)."""

    def persist_dir(self, instance: str, juid: str) -> str:
        """Where the instance keeps the job's saved persisted folders (job.yml ``persist``),
        one sub-folder per name; the default is ``persist/`` beside the checkpoint dir.
        ``finish`` brings them back when they do not live in MONKEY_HOME already."""
        return os.path.join(os.path.dirname(self.checkpoint_dir(instance, juid)), "persist")

    def job_env(self, env: dict[str, str]) -> dict[str, str]:
        """The job's recorded environment as it should reach the instance; the default keeps
        it whole (the instance is the machine the job was submitted from)."""
        return env

    def prepare(self, instance: str, blobs: list[str]) -> dict[str, Any]:
        """Make BLOBS available in ``blobs_dir(instance)``, off the core's loop: put them
        there, or, when the agent fetches them itself, return the fields of its ``start``
        request that fetch them (``blob_urls``: {digest: [presigned url, size]};
        ``blob_packs``: [[presigned url, [[digest, size], ...]]], many small blobs stored end
        to end). The fields may carry credentials (a URL's signature): the core neither
        logs nor stores them. The default assumes shared storage and returns none."""
        return {}

    def bucket_damaged(self, digest: str) -> None:
        """A worker found blob DIGEST damaged as fetched from the provider's bucket: store
        it there again when next sent. The default (no bucket) does nothing."""
        return None

    def forget_blobs(self, instance: str) -> None:
        """Assume nothing of the blobs INSTANCE holds: the next ``prepare`` asks again which
        it lacks (its agent found one damaged and removed it). The default keeps no memory."""
        return None

    def start_fields(
        self, instance: str, juid: str, attempt: int, outputs: list[str]
    ) -> dict[str, Any]:
        """Extra fields of the agent's ``start`` for results moved by the agent itself
        (``results``: see monkey/client_agent/results.py; OUTPUTS: the job's ``run --outputs``
        globs); called off the core's loop. They
        carry presigned grants: never logged nor stored. The default adds none."""
        return {}

    def sync_fields(self, instance: str) -> dict[str, Any]:
        """Extra fields of every ``sync`` sent to the instance's agent, such as ``watch``
        ({kind: ec2|gce, url, every}: the metadata service to watch for notices)."""
        return {}

    def follow(self, instance: str, attempts: list[tuple[str, int]]) -> None:
        """The attempts live on INSTANCE now, as ``(juid, attempt)``: the core says so when
        one starts and on each health pass. A remote transport streams their logs (and pulls
        their checkpoints) into MONKEY_HOME until they leave the list. Must not block; the
        default keeps nothing (the instance writes MONKEY_HOME itself)."""
        return None

    def finish(
        self, instance: str, juid: str, attempt: int, outputs: list[str], current: bool
    ) -> None:
        """Fetch the ended attempt's results back to MONKEY_HOME, off the core's loop: the
        rest of its logs, the files matching OUTPUTS (``run --outputs`` globs, relative to
        its work folder) and, when CURRENT (no newer attempt exists), the job's kept
        folders (checkpoint, persisted). Nothing to do for shared storage."""
        return None

    # Whether ``left_behind`` may find anything (a bucket); False spares the core asking.
    leaves_behind = False

    def left_behind(
        self, instance: str, juid: str, attempt: int, offset: int
    ) -> tuple[str, list[tuple[int, dict[str, Any]]]] | None:
        """What the agent of INSTANCE, gone, left of an attempt the core had not fetched
        when it powered the machine off (through a bucket: see
        monkey.storage.results.read_left): the logs' missing tails are appended to
        MONKEY_HOME's copies, and it returns why the agent powered the machine off and the
        attempt's events after byte OFFSET of its events.jsonl (with their end offsets).
        Off the core's loop. None when it left nothing; the default (no bucket) never does."""
        return None

    def close(self) -> None:
        """Drop connections; agents and jobs keep running."""
        return None
