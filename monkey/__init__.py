"""monkey: run experiments on any compute, track them, and never lose one.

The public Python API::

    from monkey import Monkey
    job = Monkey().run("python train.py --lr 0.1")
    job.wait()

Names are loaded on first use so that `import monkey` stays cheap for one-shot commands.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from monkey.api import Job, Monkey
    from monkey.client_agent.track import checkpoint_dir, flush, log, log_params, preempted, summary
    from monkey.models import MonkeyError, State

__all__ = [
    "Job",
    "Monkey",
    "MonkeyError",
    "State",
    "checkpoint_dir",
    "flush",
    "log",
    "log_params",
    "preempted",
    "summary",
]
# The in-job API: one implementation, shipped with the agent to every worker.
_IN_JOB = frozenset({"checkpoint_dir", "flush", "log", "log_params", "preempted", "summary"})
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in _IN_JOB:
        from monkey.client_agent import track

        globals()[name] = value = getattr(track, name)  # later calls skip this hook
        return value
    if name in ("Job", "Monkey"):
        from monkey import api

        return getattr(api, name)
    if name in ("MonkeyError", "State"):
        from monkey import models

        return getattr(models, name)
    raise AttributeError(f"module 'monkey' has no attribute {name!r}")
