"""monkey: run experiments on any compute, track them, and never lose one.

The public Python API::

    from monkey import Monkey
    job = Monkey().run("python train.py --lr 0.1")
    job.wait()

Names are loaded on first use so that `import monkey` stays cheap for one-shot commands.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from monkey.api import Job, Monkey
    from monkey.models import MonkeyError, State
    from monkey.tracking.logger import log, log_params, summary

__all__ = ["Job", "Monkey", "MonkeyError", "State", "checkpoint_dir", "log", "log_params",
           "preempted", "summary"]
__version__ = "0.1.0"


def checkpoint_dir() -> Path:
    """The job's checkpoint folder, kept across attempts; ./checkpoints outside monkey."""
    path = Path(os.environ.get("MONKEY_CHECKPOINT_DIR") or "checkpoints")
    path.mkdir(parents=True, exist_ok=True)
    return path


def preempted() -> bool:
    """Whether a spot/preemption notice is stopping this job (its SIGTERM says "save and
    exit": the job is re-queued and its checkpoint folder restored). ``MONKEY_PREEMPTED=1``
    in the environment, or the agent's ``preempted`` mark in the run folder."""
    if os.environ.get("MONKEY_PREEMPTED") == "1":
        return True
    run_dir = os.environ.get("MONKEY_RUN_DIR")
    return bool(run_dir) and os.path.exists(os.path.join(run_dir, "preempted"))


def __getattr__(name: str) -> Any:
    if name in ("log", "log_params", "summary"):
        from monkey.tracking import logger

        globals()[name] = value = getattr(logger, name)  # later calls skip this hook
        return value
    if name in ("Job", "Monkey"):
        from monkey import api

        return getattr(api, name)
    if name in ("MonkeyError", "State"):
        from monkey import models

        return getattr(models, name)
    raise AttributeError(f"module 'monkey' has no attribute {name!r}")
