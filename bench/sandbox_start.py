"""With the core running: `monkey run -- CMD` (a new CLI process) until the job's command
runs (and from the agent's spawn of the job until it runs), on one home whose `local`
provider is switched between `isolation: none` and `isolation: sandbox` (bubblewrap) before
each run, interleaved in the same run (this machine is one provider entry). CMD is `sh -c 'date +%s%N >
t'`: the command itself notes when it runs (the agent's recorded start comes before the
sandbox is made, so it would hide the sandbox's cost). The cost is the median of the
differences of runs taken one after the other (the machine's load shifts both alike). Target
(issue 41): sandboxed within 10 ms of unsandboxed.
"""

from __future__ import annotations

import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from common import MONKEY, fresh_home, stop_everything

RUNS = 31
CMD = ["sh", "-c", "date +%s%N > t"]


def run_to_command(project: str, isolation: str, home: Path) -> tuple[float, float]:
    """Seconds from starting `monkey run -- CMD` with `local` set to ISOLATION to CMD's own
    clock reading, and from the agent's recorded start of the job (its wrapper spawned) to
    that reading."""
    from monkey.api import Monkey

    (home / "providers.yml").write_text(
        f"providers:\n  local: {{type: local, isolation: {isolation}}}\n"
    )
    t0 = time.time()
    out = subprocess.run(
        [*MONKEY, "run", "--", *CMD],
        capture_output=True,
        text=True,
        check=True,
        cwd=project,
    )
    juid = out.stdout.strip()
    job = Monkey(home).job(juid)
    job.wait(timeout=30)
    assert str(job.status) == "succeeded", f"{juid} ({isolation}): {job.status}"
    ran = int((home / "runs" / juid / "1" / "work" / "t").read_text()) / 1e9
    return ran - t0, ran - job.attempts()[0].started_at


def main() -> None:
    home = fresh_home()
    home.mkdir(parents=True)
    (home / "providers.yml").write_text("providers:\n  local: {type: local}\n")
    from monkey.config import Home
    from monkey.core import daemon

    project = tempfile.mkdtemp()
    daemon.start(Home(home))
    try:
        times: dict[str, list[tuple[float, float]]] = {"none": [], "sandbox": []}
        for name in times:
            run_to_command(project, name, home)  # warm: the agent is up, bwrap probed
        for _ in range(RUNS):
            for name, seen in times.items():
                seen.append(run_to_command(project, name, home))
        for i, what in enumerate(("run", "agent's spawn")):
            plain, boxed = ([t[i] for t in times[n]] for n in times)
            cost = statistics.median(b - p for p, b in zip(plain, boxed))  # pairs: same moment
            print(
                f"{what} -> command runs: unsandboxed {statistics.median(plain) * 1000:6.1f} ms, "
                f"sandboxed {statistics.median(boxed) * 1000:6.1f} ms; sandbox cost "
                f"{cost * 1000:+5.1f} ms (median of {RUNS} pairs; target <= 10 ms)"
            )
    finally:
        stop_everything(home)


if __name__ == "__main__":
    main()
