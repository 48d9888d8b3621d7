"""One linter and one formatter for all the code: `ruff check` and `ruff format --check` over
monkey/, tests/ and bench/ (settings in pyproject.toml's [tool.ruff]) find nothing. `# fmt:
skip` is kept for the few tables whose aligned columns read better than the formatter's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CODE = ["monkey", "tests", "bench", "monkey.py", "monkeycli.py", "scripts"]


def _ruff(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args, *CODE],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_ruff_check_is_clean() -> None:
    proc = _ruff("check")
    assert proc.returncode == 0, f"ruff check found problems:\n{proc.stdout}{proc.stderr}"


def test_code_is_formatted() -> None:
    proc = _ruff("format", "--check")
    assert proc.returncode == 0, (
        f"not formatted (run `python3 -m ruff format {' '.join(CODE)}`):\n{proc.stdout}{proc.stderr}"
    )
