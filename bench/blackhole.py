"""While one provider's cloud hangs (a blackholed endpoint), `monkey run -- true` on the local
provider to process start stays within 1.2x of its idle median.

The `ec2` provider `dead` talks to an endpoint on 127.0.0.1 that accepts connections and
never answers (tests/blackhole.py), so the core's listing of it hangs in a worker until
libcloud's read timeout (60 s). The idle median is measured first, before `dead` is
written into providers.yml (the core lists an elastic provider as soon as it knows it); then
`dead` is added, a job queued on it and, once the core's call hangs on the blackhole, local
jobs are run one after another for WINDOW seconds. The hang is checked to last the whole window: the
connection is still open and unanswered, and daemon.log reports no failed call of `dead`.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time

import yaml
from common import REPO, fake_aws, fresh_home, run_to_start, stop_everything

sys.path.insert(0, str(REPO / "tests"))  # the test fixtures' blackhole
from blackhole import Blackhole  # noqa: E402
from moto_server import IMAGE, REGION  # noqa: E402

IDLE_RUNS = 41
WINDOW = 30.0  # seconds of local jobs inside the hang


def main() -> None:
    home = fresh_home()
    project = tempfile.mkdtemp()
    fake_aws(project)
    from monkey.api import Monkey
    from monkey.config import Home
    from monkey.core import daemon
    from monkey.drivers import load_providers

    hole = Blackhole()
    h = Home(home).ensure()
    m = Monkey(home)
    daemon.start(h)
    try:
        m.run(["true"]).wait(timeout=30)  # warm: the agent is up
        idle = run_to_start(m, project, IDLE_RUNS)

        entry = {
            "type": "ec2",
            "region": REGION,
            "endpoint": hole.endpoint,
            "size": "t3.micro",
            "image": IMAGE,
            "max_instances": 1,
        }
        h.providers_file.write_text(yaml.safe_dump({"providers": {"dead": entry}}))
        load_providers(h)  # the entry is valid
        stuck = m.run(["true"], provider="dead")
        deadline = time.monotonic() + 60
        while not hole.hanging():
            if time.monotonic() > deadline:
                raise SystemExit("the core never called the blackholed endpoint")
            time.sleep(0.01)
        hung_at = time.monotonic()
        hung = []
        while time.monotonic() - hung_at < WINDOW:
            hung += run_to_start(m, project, 1)
        window = time.monotonic() - hung_at

        log = h.daemon_log.read_text()
        failed = [line for line in log.splitlines() if "dead" in line and "ERROR" in line]
        if not hole.hanging() or hole.closed() or failed:
            raise SystemExit(f"the hang ended inside the window: {failed or 'connection closed'}")
        if stuck.status.value != "queued":
            raise SystemExit(f"the job on `dead` is {stuck.status.value}, not queued")

        base, busy = statistics.median(idle), statistics.median(hung)
        print(
            f"local run -> process start, idle:        {base * 1000:6.1f} ms median "
            f"({len(idle)} jobs)"
        )
        print(
            f"local run -> process start, cloud hangs: {busy * 1000:6.1f} ms median "
            f"({len(hung)} jobs in {window:.1f} s; {hole.hanging()} call(s) still unanswered)"
        )
        print(f"ratio: {busy / base:.2f}x (target <= 1.2x)")
    finally:
        stop_everything(home)
        hole.stop()


if __name__ == "__main__":
    main()
