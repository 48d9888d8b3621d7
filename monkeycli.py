"""Compatibility with the original Monkey scripts: `from monkeycli import MonkeyCLI`."""

from __future__ import annotations

from typing import Any

from monkey.api import Job, Monkey


class MonkeyCLI:
    """The seed scripts' entry point; ``run`` takes a command string like the shell."""

    def __init__(self, **kwargs: Any) -> None:
        self.monkey = Monkey(kwargs.pop("home", None))

    def run(self, cmd: str, **options: Any) -> Job:
        """Queue ``cmd`` (a shell-style string or an argv list), print its job id as the
        original did, and return its job."""
        job = self.monkey.run(cmd, **options)
        print(f"Submitted job {job.juid}: {cmd if isinstance(cmd, str) else ' '.join(cmd)}")
        return job
