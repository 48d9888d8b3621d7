"""`Job.wait()` through a remote (issue 27): a real server stopped and started again while a
script on the laptop waits for a job; past the limit, one line and the script fails."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from mainnode import MainNode, node  # noqa: F401 - node: a fixture

pytestmark = pytest.mark.system

WAITER = (
    "import sys\n"
    "from monkey.handles import Job\n"
    "from monkey.remote.facade import RemoteMonkey\n"
    "job = Job(RemoteMonkey('lab'), sys.argv[1])  # as Monkey(remote='lab').job(ID)\n"
    "print('waiting', job.status.value, flush=True)\n"
    "state = job.wait()\n"
    "print(state.value, job.exit_code)\n"
)


def waiter(env: dict[str, str], juid: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", WAITER, juid],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def wait_across_a_restart(
    node: MainNode,
    go: Path,
    env: dict[str, str],
    down: Callable[[], object] | None = None,
    up: Callable[[], object] | None = None,
) -> None:
    """Submit a job held until GO exists; wait for it from the laptop while the server is
    SIGKILLed and started again (or while DOWN and UP cut and restore the link); the wait
    ends with the job's state."""
    script = f"echo before; while [ ! -e {go} ]; do sleep 0.05; done; echo after; exit 3"
    juid = node.server("run", "--", "sh", "-c", script).stdout.strip()
    proc = waiter(env, juid)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline() in (
        "waiting queued\n",
        "waiting dispatching\n",
        "waiting running\n",
    )
    (down or node.kill)()
    lost = proc.stderr.readline()  # seen before the server is back: the wait noticed
    if lost != f"monkey: lab: connection lost; reconnecting (job {juid} goes on)\n":
        proc.kill()
        rest = proc.stderr.read()  # what readline took in (communicate would not see it)
        proc.wait()
        raise AssertionError(lost + rest)
    (up or node.start)()
    go.touch()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert out == "failed 3\n"
    assert err == "monkey: lab: reconnected; waiting again\n"


def test_job_wait_rides_out_a_server_restart(node, tmp_path):
    node.add_remote()
    wait_across_a_restart(node, tmp_path / "go", node.laptop_env)


def test_job_wait_gives_up_past_the_limit_with_one_line(node, tmp_path, monkeypatch, capsys):
    from monkey.handles import Job
    from monkey.remote import Unreachable, facade

    node.add_remote()
    juid = node.server("run", "--", "sleep", "600").stdout.strip()
    for key in ("HOME", "XDG_CONFIG_HOME"):  # this process is the laptop now
        monkeypatch.setenv(key, node.laptop_env[key])
    monkeypatch.setattr(facade, "RESUME_FOR", 1.0)
    job = Job(facade.RemoteMonkey("lab"), juid)
    node.kill()
    with pytest.raises(Unreachable) as caught:
        job.wait()
    assert str(caught.value) == (
        f"lab: cannot reach {node.url} for 1s; stopped waiting (job {juid} goes on): "
        f"monkey info {juid}"
    )
    assert capsys.readouterr().err == (
        f"monkey: lab: connection lost; reconnecting (job {juid} goes on)\n"
    )
    # a timeout shorter than the limit ends the wait first
    monkeypatch.setattr(facade, "RESUME_FOR", 300.0)
    with pytest.raises(TimeoutError, match=f"job {juid}: lab out of reach after 0.5s"):
        job.wait(timeout=0.5)
