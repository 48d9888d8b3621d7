"""A wall clock that a test steps, in monkey's processes (the CLI, the core and the agent it
starts): their python is a virtual environment's whose site-packages hold a ``.pth`` that adds
an offset, read from a file the test rewrites, to ``time.time()`` and ``time.time_ns()``; the
monotonic and boot clocks stay untouched, as under an NTP step or a VM resume. (A
``sitecustomize`` on PYTHONPATH would not do: monkey starts its core and agent isolated, with
``python -I``, and they start theirs with the same interpreter.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import REPO

# The module the .pth imports at each start of the environment's python; PATH holds the offset.
SHIFT = """\
import time

_path = PATH
_real, _real_ns, _mono = time.time, time.time_ns, time.monotonic
_seen = [0.0, -1.0]  # the offset, and when to read it again (monotonic)


def _offset():
    now = _mono()
    if now >= _seen[1]:
        _seen[1] = now + 0.02
        try:
            with open(_path) as f:
                _seen[0] = float(f.read() or 0)
        except (OSError, ValueError):
            pass
    return _seen[0]


time.time = lambda: _real() + _offset()
time.time_ns = lambda: _real_ns() + int(_offset() * 1e9)
"""


class SteppedClock:
    """A python for monkey's processes, whose wall clock is at an offset the test steps."""

    def __init__(self, folder: Path) -> None:
        venv = folder / "venv"
        subprocess.run(
            [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", venv],
            check=True,
        )
        self.python = str(venv / "bin" / "python")
        site = subprocess.run(
            [self.python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        self.path = folder / "offset"
        self.offset = 0.0
        self.steps = 0
        self._write()
        (Path(site) / "_stepped_clock.py").write_text(
            SHIFT.replace("PATH", repr(str(self.path)), 1)
        )
        (Path(site) / "stepped_clock.pth").write_text("import _stepped_clock\n")

    def monkey(self, *args: str) -> subprocess.CompletedProcess[str]:
        """`monkey ARGS` run by this python; fails the test on a non-zero exit."""
        env = dict(os.environ, PYTHONPATH=str(REPO))
        proc = subprocess.run(
            [self.python, "-m", "monkey", *args], capture_output=True, text=True, env=env
        )
        assert proc.returncode == 0, (args, proc.stderr)
        return proc

    def step(self, seconds: float) -> None:
        """Move the wall clock SECONDS (either way) at once."""
        self.offset += seconds
        self.steps += 1
        self._write()

    def _write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(repr(self.offset))
        os.replace(tmp, self.path)
