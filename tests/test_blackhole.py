"""One provider's cloud hangs (a blackholed endpoint): the other providers go on.

The `ec2` provider `dead` talks to an endpoint on 127.0.0.1 that accepts connections and
never answers, so the core's listing of it hangs in a worker until the client's read
timeout (60 s). Meanwhile local jobs run, and `monkey daemon stop` stops the core.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from monkey.config import Home
from monkey.drivers import load_providers
from tests.blackhole import Blackhole
from tests.conftest import core_pid, start_core, wait_for
from tests.moto_server import CREDENTIALS, IMAGE, REGION


@pytest.fixture
def blackhole(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Blackhole]:
    """Provider `dead` (ec2) bound to a blackhole, with fake credentials and no AWS files."""
    for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    hole = Blackhole()
    h = Home(home).ensure()
    entry = {
        "type": "ec2",
        "region": REGION,
        "endpoint": hole.endpoint,
        "size": "t3.micro",
        "image": IMAGE,
        "max_instances": 1,
    }
    h.providers_file.write_text(yaml.safe_dump({"providers": {"dead": entry}}))
    assert load_providers(h)["dead"].type == "ec2"
    yield hole
    hole.stop()


def test_local_jobs_run_while_a_cloud_hangs(
    blackhole: Blackhole, home: Path, monkey: Any, cli: Callable[..., Any]
) -> None:
    start_core(home)
    stuck = cli("run", "--provider", "dead", "--", "true", check=True).stdout.strip()
    wait_for(blackhole.hanging, timeout=60, what="the core's call to the blackholed cloud")

    done = cli("run", "--", "true", check=True).stdout.strip()
    assert monkey.job(done).wait(timeout=60).value == "succeeded"
    again = cli("run", "--", "sh", "-c", "echo hello", check=True).stdout.strip()
    assert monkey.job(again).wait(timeout=60).value == "succeeded"

    # The cloud call has still been answered nothing: the local jobs did not wait for it.
    assert blackhole.hanging() >= 1 and blackhole.closed() == 0
    info = cli("info", "job", stuck, check=True).stdout
    assert "queued" in info, info

    # The core stops within `daemon stop`'s timeout, a worker still hanging on the cloud.
    pid = core_pid(home)
    out = cli("daemon", "stop", check=True).stdout
    assert out.strip() == f"core stopped (pid {pid})"
    assert core_pid(home) is None
    # Its process is gone too (not kept alive by the hung worker), which closed the connection.
    wait_for(lambda: not alive(pid), timeout=10, what=f"the core's process {pid} to exit")
    wait_for(
        lambda: blackhole.hanging() == 0 and blackhole.closed() >= 1,
        timeout=10,
        what="the core's connection to the blackhole to close",
    )


def alive(pid: int) -> bool:
    """Whether process PID runs (a zombie, exited but not yet reaped, does not)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return False
    return fields[0] != "Z"
