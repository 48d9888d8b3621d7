"""Shared helpers for the benchmark scripts: a throw-away MONKEY_HOME and timing."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def fresh_home() -> Path:
    """A new MONKEY_HOME, exported for this process and its children."""
    home = Path(tempfile.mkdtemp(prefix="monkey-bench-")) / "home"
    os.environ["MONKEY_HOME"] = str(home)
    os.environ["PYTHONPATH"] = str(REPO)
    return home


def median_wall(fn: Callable[[], object], repeat: int) -> float:
    """Median wall time of ``fn`` over ``repeat`` runs, after one warm-up run."""
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def run_quiet(argv: list[str]) -> None:
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)


def stop_everything(home: Path) -> None:
    """Stop the core and the local agent of a bench home."""
    from monkey.config import Home
    from monkey.core import daemon

    h = Home(home)
    daemon.stop(h)
    pid_file = h.private / "agent.pid"
    if pid_file.exists():
        try:
            os.kill(int(pid_file.read_text()), 15)
        except (ProcessLookupError, ValueError):
            pass
