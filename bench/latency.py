"""With the core running: `monkey run -- true` (a new CLI process) until the job's process
has started, as recorded by the agent: in an empty folder, and in a git project with a
.gitignore, as researchers run it. Target: median at most 4x `python -c pass` (issue 26;
under 150 ms in issue 11), both run by a clean virtualenv's interpreter (common.PY). It
also prints the floor: a `python -c` importing just the modules from outside monkey that the
CLI process imports, which no change to monkey's own code could go below.
"""

from __future__ import annotations

import statistics
import tempfile

from common import (
    MONKEY,
    PY,
    floor_argv,
    floor_wall,
    fresh_home,
    median_cpu,
    median_wall,
    run_quiet,
    run_to_start,
    stop_everything,
)

RUNS = 31


def git_project() -> str:
    """A project as researchers have one: a git repository with a .gitignore, 24 Python
    files in three folders and a __pycache__ the .gitignore leaves out, committed, and older
    than the racy window (2 s) so that what its snapshot learns is kept."""
    import subprocess
    import time
    from pathlib import Path

    root = Path(tempfile.mkdtemp())
    (root / ".gitignore").write_text("__pycache__/\n*.pyc\n.venv/\nwandb/\noutputs/\n*.ckpt\n")
    for folder in ("src", "configs", "scripts"):
        (root / folder / "__pycache__").mkdir(parents=True)
        for i in range(8):
            (root / folder / f"m{i}.py").write_text(f"VALUE = {i}\n" * 40)
            (root / folder / "__pycache__" / f"m{i}.cpython-311.pyc").write_bytes(b"\0" * 900)
    git = ["git", "-C", str(root), "-c", "user.name=b", "-c", "user.email=b@b"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "bench"], check=True)
    time.sleep(2.5)
    return str(root)


def main() -> None:
    home = fresh_home()
    from monkey.api import Monkey
    from monkey.config import Home
    from monkey.core import daemon

    project = tempfile.mkdtemp()
    repo = git_project()
    m = Monkey(home)
    daemon.start(Home(home))
    try:
        m.run(["true"]).wait(timeout=30)  # warm: the agent is up
        cpu: list[float] = []
        latencies = run_to_start(m, project, RUNS, cpu=cpu)
        run_to_start(m, repo, 1)  # its first snapshot learns the folder
        in_repo = run_to_start(m, repo, RUNS)
        base = median_wall(lambda: run_quiet([PY, "-c", "pass"]), 11)
        floor = floor_wall([*MONKEY, "run", "--", "true"], 11, cwd=project)
        base_cpu = median_cpu(lambda: run_quiet([PY, "-c", "pass"]), 31)
        floor_cmd = floor_argv([*MONKEY, "run", "--", "true"], cwd=project)
        floor_cpu = median_cpu(lambda: run_quiet(floor_cmd), 31)
        lat = statistics.median(latencies)
        print(f"python -c pass:                      {base * 1000:6.1f} ms")
        print(
            f"its CLI's imports from outside:     {floor * 1000:6.1f} ms ({floor / base:.1f}x: the "
            "floor of any code of monkey's)"
        )
        print(
            f"monkey run -- true -> process start: {lat * 1000:6.1f} ms median "
            f"(min {min(latencies) * 1000:.1f}, max {max(latencies) * 1000:.1f}) = "
            f"{lat / base:.1f}x, target <= 4x"
        )
        own = statistics.median(cpu) - floor_cpu
        print(
            f"CPU: python -c pass {base_cpu * 1000:.1f} ms, the floor {floor_cpu * 1000:.1f} ms, "
            f"the CLI's `run -- true` {statistics.median(cpu) * 1000:.1f} ms: monkey's own "
            f"{own * 1000:.1f} ms (medians of {RUNS}, 31, 31)"
        )
        lat = statistics.median(in_repo)
        print(
            f"the same in a git project:           {lat * 1000:6.1f} ms median "
            f"(min {min(in_repo) * 1000:.1f}, max {max(in_repo) * 1000:.1f}) = {lat / base:.1f}x"
        )
    finally:
        stop_everything(home)


if __name__ == "__main__":
    main()
