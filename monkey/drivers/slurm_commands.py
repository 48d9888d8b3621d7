"""Slurm's client commands as monkey runs them (here, or on a login host through a
``Runner``): one-line errors, the partitions and pending jobs a provider check reports,
and the size of an allocation as text and as sbatch's units."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass

from monkey.models import MonkeyError, Resources, parse_size

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_COMMAND_TIMEOUT = 60.0


def slurm_command(argv: list[str], stdin: str | None = None, what: str = "") -> str:
    """Run a Slurm client command here and return its stdout; a one-line MonkeyError with
    Slurm's own message when it fails or is missing."""
    try:
        done = subprocess.run(
            argv, input=stdin, capture_output=True, text=True, timeout=_COMMAND_TIMEOUT
        )
    except FileNotFoundError:
        raise MonkeyError(
            f"{argv[0]} not found: this machine needs Slurm's client commands "
            "(install slurm-client, or run monkey on a login node)"
        ) from None
    except subprocess.TimeoutExpired:
        raise MonkeyError(
            f"{argv[0]} gave no answer in {_COMMAND_TIMEOUT:.0f}s: is slurmctld "
            "reachable from this machine?"
        ) from None
    if done.returncode != 0:
        said = " ".join(done.stderr.split()) or f"exit {done.returncode}"
        raise MonkeyError(f"{what or argv[0]} failed: {said}")
    return done.stdout


# Runs a Slurm command (argv, stdin, what) and returns its stdout: here or on a login host.
Runner = Callable[..., str]


def partitions(run: Runner = slurm_command) -> dict[str, dict[str, Any]]:
    """The cluster's partitions (one ``sinfo`` call): per name, its nodes by state
    (idle, mixed, allocated, other), its idle CPUs, whether it is up and the default."""
    out = run(["sinfo", "-h", "-o", "%P|%a|%T|%D|%C"], what="sinfo")
    found: dict[str, dict[str, Any]] = {}
    for line in out.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 5:
            continue
        name, avail, state, count, cpus = parts
        info = found.setdefault(
            name.rstrip("*"),
            {
                "up": avail == "up",
                "default": name.endswith("*"),
                "idle": 0,
                "mixed": 0,
                "allocated": 0,
                "other": 0,
                "idle_cpus": 0,
            },
        )
        kind = state.rstrip("*~#!%$@^-")
        key = {"idle": "idle", "mixed": "mixed", "allocated": "allocated"}.get(kind, "other")
        info[key] += int(count)
        info["idle_cpus"] += int(cpus.split("/")[1]) if cpus.count("/") == 3 else 0
    return found


def pending_jobs(partition: str | None, run: Runner = slurm_command) -> int:
    """Jobs pending in PARTITION (all partitions when None), from one ``squeue`` call."""
    argv = ["squeue", "-h", "-t", "PENDING", "-o", "%i"]
    if partition:
        argv += ["-p", partition]
    return len(run(argv, what="squeue").split())


@dataclass
class Size:
    """What one allocation asks of Slurm; as text (the instance's size) ``c2-m512M-g1-t3600``
    (t: the job's time limit in seconds)."""

    cpus: int = 1
    memory: str | None = None
    gpus: int = 0
    time: int | None = None

    @classmethod
    def of(cls, resources: Resources) -> Size:
        return cls(max(1, resources.cpus), resources.memory, resources.gpus, resources.time)

    @classmethod
    def parse(cls, text: str | None) -> Size:
        size = cls()
        for part in (text or "").split("-"):
            if part.startswith("c"):
                size.cpus = int(part[1:])
            elif part.startswith("m"):
                size.memory = part[1:]
            elif part.startswith("g"):
                size.gpus = int(part[1:])
            elif part.startswith("t"):
                size.time = int(part[1:])
        return size

    def __str__(self) -> str:
        return "-".join(
            [
                f"c{self.cpus}",
                *([f"m{self.memory}"] if self.memory else []),
                *([f"g{self.gpus}"] if self.gpus else []),
                *([f"t{self.time}"] if self.time else []),
            ]
        )


def slurm_time(seconds: int) -> str:
    """SECONDS as sbatch --time's HH:MM:SS."""
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def mem_megabytes(memory: str) -> int:
    """MEMORY (``512M``, ``4G``) in whole megabytes, as sbatch --mem takes it."""
    return max(1, -(-parse_size(memory) // (1 << 20)))
