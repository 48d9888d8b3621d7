"""Compatibility with the original Monkey scripts: `from monkeycli import MonkeyCLI`."""

from __future__ import annotations

from typing import Any

from monkey.api import Job, Monkey


class MonkeyCLI:
    """The seed scripts' entry point; ``run`` takes a command string like the shell."""

    def __init__(self, **kwargs: Any) -> None:
        self.monkey = Monkey(kwargs.pop("home", None))

    def run(self, cmd: str, **options: Any) -> Job:
        """Queue ``cmd`` (a shell-style string or an argv list) and return its job."""
        return self.monkey.run(cmd, **options)
