"""The agent's import on a worker: what every first job on a new host waits for.

Each agent folder given (default: this checkout's monkey/client_agent) is copied as the SSH
and Slurm drivers install it (its .py files under monkey/client_agent/ beside an empty
monkey/__init__.py, compiled by a first run) and imported as they start it
(``python3 -I -c "...; from monkey.client_agent.agent import main"``). Median wall and CPU time over
interleaved runs, against ``python3 -I -c pass``. Give an older checkout's folder too to
compare: ``python3 bench/agent_start.py monkey/client_agent /old/monkey/client_agent``.
"""

from __future__ import annotations

import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUNS = 41
IMPORT = "import sys; sys.path.insert(0, sys.argv[1]); from monkey.client_agent.agent import main"


def install(src: Path, dest: Path) -> Path:
    """DEST/monkey/client_agent/ holding SRC's .py files, as a driver installs the agent."""
    (dest / "monkey" / "client_agent").mkdir(parents=True)
    (dest / "monkey" / "__init__.py").write_bytes(b"")
    for path in sorted(src.glob("*.py")):
        shutil.copyfile(path, dest / "monkey" / "client_agent" / path.name)
    return dest


def timed(argv: list[str]) -> tuple[float, float]:
    """Wall time and CPU time (user + system) of one run of ARGV."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run(argv, check=True, stdin=subprocess.DEVNULL)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def main() -> None:
    sources = [Path(a).resolve() for a in sys.argv[1:]] or [REPO / "monkey" / "client_agent"]
    tmp = Path(tempfile.mkdtemp(prefix="monkey-bench-agent-"))
    try:
        codes = [install(src, tmp / str(i)) for i, src in enumerate(sources)]
        runs = {"pass": [sys.executable, "-I", "-c", "pass"]}
        runs.update(
            {
                str(src): [sys.executable, "-I", "-c", IMPORT, str(code)]
                for src, code in zip(sources, codes)
            }
        )
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}
        for argv in runs.values():
            timed(argv)  # writes the bytecode, as the first start on a host does
        for _ in range(RUNS):
            for name, argv in runs.items():
                times[name].append(timed(argv))
        wall, cpu = (
            {name: statistics.median(t[i] for t in got) for name, got in times.items()}
            for i in (0, 1)
        )
        print(
            f"python3 -I -c pass: wall {wall['pass'] * 1000:6.1f} ms, cpu {cpu['pass'] * 1000:6.1f} ms "
            f"(medians of {RUNS})"
        )
        for src in sources:
            name, files = str(src), len(list(src.glob("*.py")))
            print(
                f"agent import, {files:2d} files from {src}: wall {wall[name] * 1000:6.1f} ms "
                f"({wall[name] / wall['pass']:.2f}x), cpu {cpu[name] * 1000:6.1f} ms "
                f"({cpu[name] / cpu['pass']:.2f}x)"
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
