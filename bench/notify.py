"""Whether notifications cost the core's loop anything: `monkey run -- true` (a new CLI
process) to the job's process start, with the core idle, then with EVENTS (default 1,000)
deliveries pending to a webhook receiver that answers each in 200 ms (they take minutes to
drain: the notifier thread sends them while the runs are timed). Target (issue 29): within
1.1x of idle, both measured in this run. `python bench/notify.py [EVENTS]`.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from common import fresh_home, run_to_start, stop_everything

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


def main() -> None:
    events = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    home = fresh_home()
    from monkey.api import Monkey
    from monkey.config import Home
    from monkey.core import daemon

    server = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    project = tempfile.mkdtemp()
    m = Monkey(home)
    daemon.start(Home(home))
    try:
        m.run(["true"], workdir=project).wait(timeout=30)  # warm: the agent is up
        run_to_start(m, project, 5)  # warm: the files the CLI reads are cached
        idle = run_to_start(m, project, RUNS)
        m.notify_add("bench", "webhook", url, events="all")
        sid = m.sweep(["true", "{x}"], grid={"x": list(range(events))}, workdir=project)
        deadline = time.monotonic() + 600
        while m.sweep_status(sid)["counts"].get("succeeded", 0) < events:
            if time.monotonic() > deadline:
                raise SystemExit("the sweep did not finish within 10 minutes")
            time.sleep(0.5)
        before = m.notify_list()[0]["pending"]
        loaded = run_to_start(m, project, RUNS)
        after = m.notify_list()[0]["pending"]
    finally:
        stop_everything(home)
        server.shutdown()
    base, busy = statistics.median(idle), statistics.median(loaded)
    print(f"monkey run -- true -> process start, idle core:       {base * 1000:6.1f} ms median")
    print(
        f"same, {before} deliveries pending ({ANSWER * 1000:.0f} ms each): {busy * 1000:6.1f} ms "
        f"median = {busy / base:.2f}x idle (target <= 1.1x); {after} still pending after"
    )


if __name__ == "__main__":
    main()
