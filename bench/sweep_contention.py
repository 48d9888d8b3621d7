"""A 100,000-cell sweep being written while `monkey run -- true` runs 20 times, one after
the other, in another process (the core running). Prints the sweep's write time, each
run's latency (submit to exit of the CLI), the slowest (target under 2 s) and the failures
(target 0: no `database is locked`, no traceback).

The project is a small git repository, as a user's usually is.
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from pathlib import Path

from common import MONKEY, fresh_home, stop_everything

CELLS = 100_000
RUNS = 20


def project() -> str:
    """A folder with a few files under git."""
    root = Path(tempfile.mkdtemp(prefix="monkey-bench-project-"))
    for i in range(20):
        (root / f"mod{i}.py").write_text(f"X = {i}\n")
    (root / "train.py").write_text("import sys\nprint(sys.argv)\n")
    git = ["git", "-c", "user.name=bench", "-c", "user.email=bench@example.com"]
    subprocess.run([*git, "init", "-q"], cwd=root, check=True)
    subprocess.run([*git, "add", "."], cwd=root, check=True)
    subprocess.run([*git, "commit", "-qm", "init"], cwd=root, check=True)
    return str(root)


def main() -> None:
    home = fresh_home()
    from monkey.config import Home
    from monkey.core import daemon

    cwd = project()
    monkey = MONKEY
    daemon.start(Home(home))
    try:
        subprocess.run([*monkey, "run", "--", "true"], cwd=cwd, check=True, capture_output=True)
        t0 = time.perf_counter()
        sweep = subprocess.Popen(
            [
                *monkey,
                "sweep",
                "--random",
                str(CELLS),
                "--max-cells",
                str(CELLS),
                "--uniform",
                "lr=0.0001:0.1",
                "--max-parallel",
                "1",
                "--",
                "python3",
                "train.py",
                "--lr",
                "{lr}",
            ],
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(0.5)  # the sweep is writing its cells by now
        latencies, failures, during = [], [], 0
        for _ in range(RUNS):
            t = time.perf_counter()
            run = subprocess.run(
                [*monkey, "run", "--", "true"], cwd=cwd, capture_output=True, text=True
            )
            latencies.append(time.perf_counter() - t)
            during += sweep.poll() is None
            if run.returncode != 0 or run.stderr.strip():
                failures.append(run.stderr.strip().splitlines()[-1:] or [f"exit {run.returncode}"])
        out, err = sweep.communicate()
        written = time.perf_counter() - t0
        if sweep.returncode != 0:
            raise SystemExit(f"the sweep failed: {err.strip()}")
        print(f"sweep of {CELLS:,} cells written in {written:.1f} s")
        print("monkey run -- true latencies (s): " + " ".join(f"{x:.2f}" for x in latencies))
        print(f"runs while the sweep was being written: {during}/{RUNS}")
        print(f"slowest run: {max(latencies):.2f} s (target < 2 s)")
        print(f"failed runs: {len(failures)} (target 0)" + "".join(f"\n  {f[0]}" for f in failures))
    finally:
        stop_everything(home)


if __name__ == "__main__":
    main()
