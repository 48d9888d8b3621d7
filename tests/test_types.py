"""monkey/ type-checks clean: `python3 -m mypy` from the repo root reads pyproject.toml's
[tool.mypy] (files, per-library overrides, warn_unused_ignores) and must find nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# A cold run takes most of a minute: no services, but too slow for `pytest -m unit`.
pytestmark = pytest.mark.system


def test_mypy_is_clean() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=280
    )
    assert proc.returncode == 0, (
        f"mypy found problems (fix them at their cause; see pyproject.toml's [tool.mypy]):\n"
        f"{proc.stdout}{proc.stderr}"
    )
