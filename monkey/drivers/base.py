"""The provider contract: every kind of compute is driven through this one base class."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from monkey.config import Home, ProviderConfig
    from monkey.drivers.agent_link import AgentLink


@dataclass
class Capacity:
    """What one instance (a machine with an agent) can hold at once."""

    instance: str
    slots: int
    gpus: list[str] = field(default_factory=list)
    memory: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class Driver(ABC):
    """A provider kind (local, ssh, ec2, gce, slurm) as the core sees it.

    Lifecycle of an attempt, all called by the core only:

    1. ``instances()`` lists the instances the provider has now and what each can hold;
       the core places jobs on them with the pure functions of ``monkey.core.placement``.
    2. ``connect(instance)`` returns a live :class:`AgentLink` to the agent on that
       instance, starting (and, for remote kinds, installing) the agent when needed. The
       link is kept by the core and polled for pushed events; when it breaks the core
       calls ``connect`` again and re-syncs from its stored byte offsets.
    3. ``prepare(instance, blobs)`` makes the given content-addressed blobs (code snapshot
       and datasets) available in ``blobs_dir(instance)``, sending only missing ones.
    4. The core then sends the agent's ``start`` request with paths from ``run_dir`` and
       ``checkpoint_dir``; ``signal`` and ``sync`` go through the same link.
    5. ``finish(instance, juid, attempt)`` brings results (logs, checkpoint) back to
       MONKEY_HOME when they do not already live there.
    6. ``close()`` drops links; agents and their jobs keep running.
    """

    kind: str = ""

    def __init__(self, config: ProviderConfig, home: Home) -> None:
        self.name = config.name
        self.config = config
        self.home = home

    @abstractmethod
    def instances(self) -> list[Capacity]:
        """Instances of this provider and what each can hold."""

    @abstractmethod
    def connect(self, instance: str) -> AgentLink:
        """A connected link to the instance's agent, started if it was not running."""

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

    def prepare(self, instance: str, blobs: list[str]) -> None:
        """Make the blobs available on the instance; the default assumes shared storage."""
        return None

    def finish(self, instance: str, juid: str, attempt: int) -> None:
        """Fetch the attempt's results back to MONKEY_HOME; nothing to do for shared storage."""
        return None

    def close(self) -> None:
        """Drop connections; agents and jobs keep running."""
        return None
