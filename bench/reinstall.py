"""Reinstalling monkey while a job.yml job runs: `pip install -e .` over `pip install .` of
the same code (only where it lives changes), and back, in a throw-away virtualenv (the
installs are the wheels tests/test_upgrade.py writes: no network).

Each round: `pip install .`, a job.yml job to completion (the baseline: seconds from
`monkey run` to the job's process start, core and agent warm); `pip install -e .`; then the
same job again, timed from the end of the reinstall to its process start (the CLI restarts
the core, the core replaces the agent). A job started before the first reinstall runs
across every round and is let finish at the end. Target: 0 failed jobs.

Usage: python bench/reinstall.py [ROUNDS]
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, compile_repo

sys.path.insert(0, str(REPO / "tests"))  # the upgrade test's installs
from test_upgrade import JOB_YML, copy_tree, install, install_editable  # noqa: E402

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 3


def main() -> None:
    compile_repo()
    base = Path(tempfile.mkdtemp(prefix="monkey-bench-reinstall-"))
    venv, project = base / "venv", base / "project"
    project.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["MONKEY_HOME"] = str(base / "home")
    (base / "home").mkdir()
    (base / "home" / "providers.yml").write_text("providers:\n  local: {type: local, slots: 4}\n")
    (project / "job.yml").write_text(JOB_YML)
    (project / "train.py").write_text(
        "import os\nos.makedirs('output', exist_ok=True)\nprint('trained')\n"
    )
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    src = copy_tree(base / "src", "bench")

    def monkey(*args: str) -> str:
        return subprocess.run(
            [str(venv / "bin" / "monkey"), *args],
            capture_output=True,
            text=True,
            env=env,
            cwd=project,
            check=True,
        ).stdout

    def start_delay(since: float) -> float:
        """Run the job.yml job to its end; seconds from SINCE to its process start."""
        juid = json.loads(monkey("run", "--json", "--", "python3", "train.py"))["job"]
        subprocess.run(
            [str(venv / "bin" / "monkey"), "logs", "--follow", juid],
            env=env,
            cwd=project,
            capture_output=True,
        )
        return json.loads(monkey("info", "job", juid, "--json"))["started_at"] - since

    gate = project / "gate"
    try:
        install(venv, src)
        gate.touch()
        long = json.loads(
            monkey("run", "--json", "--", "sh", "-c", f"while [ -e {gate} ]; do sleep 0.1; done")
        )["job"]
        warm, after = [], []
        for _ in range(ROUNDS):
            install(venv, src)
            start_delay(time.time())  # the core restarted, the agent replaced: not timed
            warm.append(start_delay(time.time()))
            t = time.perf_counter()
            install_editable(venv, src)
            pip = time.perf_counter() - t
            after.append(start_delay(time.time()))
            print(
                f"  round: pip install -e {pip:.1f}s; next job running {after[-1]:.2f}s after it "
                f"(warm: {warm[-1]:.2f}s)"
            )
        gate.unlink()
        deadline = time.monotonic() + 60
        while json.loads(monkey("info", "job", long, "--json"))["state"] == "running":
            if time.monotonic() > deadline:
                raise SystemExit("the long job did not end")
            time.sleep(0.1)
        jobs = json.loads(monkey("list", "jobs", "--json", "--all"))["jobs"]
        failed = [j["job"] for j in jobs if j["state"] != "succeeded"]
        print(f"pip install -e . over pip install . with a job.yml job running, {ROUNDS} rounds:")
        print(
            f"  next job.yml job running {statistics.median(after):.2f}s after the reinstall "
            f"(median; warm core and agent: {statistics.median(warm):.2f}s, "
            f"{statistics.median(after) / statistics.median(warm):.1f}x)"
        )
        print(
            f"  failed jobs: {len(failed)} of {len(jobs)} (target: 0){' ' + str(failed) if failed else ''}"
        )
    finally:
        gate.unlink(missing_ok=True)
        subprocess.run(
            [str(venv / "bin" / "monkey"), "daemon", "stop", "--all"],
            env=env,
            cwd=project,
            capture_output=True,
        )
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
