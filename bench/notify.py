"""Whether notifications cost the core's loop anything: `monkey run -- true` (a new CLI
process) to the job's process start, in a home whose core is idle and in one whose core has
EVENTS (default 1,000) deliveries pending to a webhook receiver that answers each in 200 ms
(they take minutes to drain: its notifier sends them while the runs are timed). The runs
alternate between the two homes, so both see the same load of the machine. Target (issue
29): within 1.1x of idle. `python bench/notify.py [EVENTS]`.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from common import MONKEY, fresh_home, stop_everything

RUNS = 21
ANSWER = 0.2  # seconds the receiver takes per delivery


class Slow(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers["Content-Length"]))
        time.sleep(ANSWER)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def run_to_start(m: object, home: Path, project: str) -> float:
    """Seconds from starting `monkey run -- true` in HOME to its process start."""
    t0 = time.time()
    out = subprocess.run(
        [*MONKEY, "run", "--", "true"],
        capture_output=True,
        text=True,
        check=True,
        cwd=project,
        env=dict(os.environ, MONKEY_HOME=str(home)),
    )
    job = m.job(out.stdout.strip())  # type: ignore[attr-defined]
    job.wait(timeout=30)
    return job.attempts()[0].started_at - t0


def main() -> None:
    events = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    from monkey.api import Monkey
    from monkey.config import Home
    from monkey.core import daemon

    server = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    project = tempfile.mkdtemp()
    idle_home, busy_home = fresh_home(), fresh_home()
    idle_m, busy_m = Monkey(idle_home), Monkey(busy_home)
    try:
        for home, m in ((idle_home, idle_m), (busy_home, busy_m)):
            daemon.start(Home(home))
            m.run(["true"], workdir=project).wait(timeout=30)  # warm: the agent is up
        busy_m.notify_add("bench", "webhook", url, events="all")
        sid = busy_m.sweep(["true", "{x}"], grid={"x": list(range(events))}, workdir=project)
        deadline = time.monotonic() + 600
        while busy_m.sweep_status(sid)["counts"].get("succeeded", 0) < events:
            if time.monotonic() > deadline:
                raise SystemExit("the sweep did not finish within 10 minutes")
            time.sleep(0.5)
        for _ in range(3):  # warm: the files the CLI reads are cached
            run_to_start(idle_m, idle_home, project)
        before = busy_m.notify_list()[0]["pending"]
        idle, loaded = [], []
        for _ in range(RUNS):
            idle.append(run_to_start(idle_m, idle_home, project))
            loaded.append(run_to_start(busy_m, busy_home, project))
        after = busy_m.notify_list()[0]["pending"]
    finally:
        stop_everything(idle_home)
        stop_everything(busy_home)
        server.shutdown()
    base, busy = statistics.median(idle), statistics.median(loaded)
    print(f"monkey run -- true -> process start, idle core:       {base * 1000:6.1f} ms median")
    print(
        f"same, {before} deliveries pending ({ANSWER * 1000:.0f} ms each): {busy * 1000:6.1f} ms "
        f"median = {busy / base:.2f}x idle (target <= 1.1x); {after} still pending after"
    )


if __name__ == "__main__":
    main()
