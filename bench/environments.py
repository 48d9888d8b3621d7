"""A job.yml project with a pip environment (a requirements file naming a local wheel, so
no network), run on the local provider: the first job builds the environment, the next
ones on the same worker reuse it. Target: preparing an unchanged environment under 1 s,
against the full build of that same environment measured here first.

Figures come from each attempt's setup.json (written by the worker's launcher).
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, fresh_home, stop_everything

sys.path.insert(0, str(REPO / "tests"))
from wheels import build_wheel  # noqa: E402

REUSES = 7


def main() -> None:
    home = fresh_home()
    from monkey.api import Monkey

    project = Path(tempfile.mkdtemp(prefix="monkey-bench-project-"))
    build_wheel(project / "wheels", "benchpkg")
    (project / "requirements.txt").write_text(
        f"--no-index\n--find-links {project / 'wheels'}\nbenchpkg\n"
    )
    (project / "job.yml").write_text(
        'run:\n  env_type: pip\n  env_file: requirements.txt\ncode:\n  ignore: ["wheels**"]\n'
    )
    m = Monkey(home)
    argv = ["python", "-c", "import benchpkg"]

    def one() -> tuple[dict, float]:
        t = time.perf_counter()
        job = m.run(argv, workdir=project)
        state = job.wait(timeout=300)
        wall = time.perf_counter() - t
        if state.value != "succeeded":
            raise SystemExit(f"job {job.juid} {state.value}: {m.setup_logs(job.juid).decode()}")
        return json.loads((home / "runs" / job.juid / "1" / "setup.json").read_text()), wall

    try:
        built, built_wall = one()
        assert not built["reused"]
        reuses = [one() for _ in range(REUSES)]
        assert all(r["reused"] for r, _ in reuses)
        prep = [r["seconds"] for r, _ in reuses]
        walls = [w for _, w in reuses]
        med = statistics.median(prep)
        print(
            f"full build of the pip environment (job 1):  {built['seconds'] * 1000:8.1f} ms "
            f"(job wall {built_wall * 1000:.0f} ms)"
        )
        print(
            f"reused environment, jobs 2-{REUSES + 1} (median):   {med * 1000:8.1f} ms "
            f"(max {max(prep) * 1000:.1f} ms; job wall median "
            f"{statistics.median(walls) * 1000:.0f} ms; target < 1000 ms)"
        )
        print(f"ratio build / reuse: {built['seconds'] / med:,.0f}x")
    finally:
        stop_everything(home)


if __name__ == "__main__":
    main()
