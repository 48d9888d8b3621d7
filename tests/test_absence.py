"""The core's absence costs nothing (issue 24, findings 1 and 8): a job that ended while no
core ran, or while its host was out of reach, is adopted as it ended, never lost and run
again; an unreachable host shows its jobs `unreachable` until the provider's lost_after;
and listings say when no core runs."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.conftest import core_pid, kill_core, start_core, wait_for
from tests.sshd import Lab, SSHHost
from tests.test_ssh import configure, remote_runs

TIMEOUT = 2  # MONKEY_HEARTBEAT_TIMEOUT in these tests: every absence below is longer


@pytest.fixture
def lab(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Lab]:
    client_home = tmp_path / "client"
    monkeypatch.setenv("HOME", str(client_home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    monkeypatch.setenv("MONKEY_HEARTBEAT_TIMEOUT", str(TIMEOUT))
    lab = Lab(client_home)
    yield lab
    lab.close()


@pytest.fixture
def short_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MONKEY_HEARTBEAT_TIMEOUT", str(TIMEOUT))


def info(cli, juid: str) -> dict:
    return json.loads(cli("info", "job", juid, "--json", check=True).stdout)


def run(cli, *args: str) -> str:
    return json.loads(cli("run", "--json", *args, check=True).stdout)["job"]


def exited(events: Path) -> bool:
    """The agent recorded the attempt's exit in its run folder."""
    return events.exists() and b'"type":"exit"' in events.read_bytes()


def away(cli, home: Path, how: str) -> None:
    """Stop the core (`daemon stop`, or SIGKILL as a crash would)."""
    if how == "stop":
        cli("daemon", "stop", check=True)
    else:
        kill_core(home)


@pytest.mark.parametrize("how", ["stop", "kill"])
def test_a_job_that_ended_while_the_core_was_away_is_adopted(
    cli, home: Path, short_timeout, how: str
) -> None:
    """The job exits 0 while no core runs, which stays away far past the heartbeat timeout:
    the next core adopts the exit; the job succeeded once, no retry ran."""
    gate = Path("gate").resolve()
    juid = run(
        cli,
        "--retries",
        "1",
        "--",
        "sh",
        "-c",
        f"echo up; while [ ! -e {gate} ]; do sleep 0.05; done; echo ok",
    )
    wait_for(lambda: cli("logs", juid).stdout == "up\n", what="the job to start")
    away(cli, home, how)
    gate.touch()
    wait_for(lambda: exited(home / "runs" / juid / "1" / "events.jsonl"), what="the exit recorded")
    time.sleep(3 * TIMEOUT)  # the core stays away well past the heartbeat timeout
    cli("daemon", "start", check=True)
    wait_for(
        lambda: info(cli, juid)["state"] not in ("running", "dispatching"),
        timeout=60,
        what="the job to end",
    )
    job = info(cli, juid)
    assert (job["state"], job["attempts"], job["reason"]) == ("succeeded", 1, "exit 0")
    assert cli("logs", juid).stdout == "up\nok\n"
    assert "unreachable" not in [e["kind"] for e in job["events"]]


def test_a_running_job_survives_a_long_absence(cli, home: Path, short_timeout) -> None:
    """Still running when the core comes back after a long absence: followed on, not lost."""
    gate = Path("gate").resolve()
    juid = run(
        cli, "--", "sh", "-c", f"echo up; while [ ! -e {gate} ]; do sleep 0.05; done; echo ok"
    )
    wait_for(lambda: cli("logs", juid).stdout == "up\n", what="the job to start")
    kill_core(home)
    time.sleep(3 * TIMEOUT)
    start_core(home)
    time.sleep(2 * TIMEOUT)  # past the heartbeat timeout after the start too
    assert info(cli, juid)["state"] == "running"
    gate.touch()
    wait_for(lambda: info(cli, juid)["state"] == "succeeded", timeout=60, what="the job to end")
    assert info(cli, juid)["attempts"] == 1


def test_a_job_that_ended_on_a_host_while_the_core_was_away_is_adopted(
    cli, home: Path, lab: Lab
) -> None:
    host = lab.add("h1")
    configure(home, [host.entry(key=lab.key)])
    gate = Path(host.workdir) / "gate"
    juid = run(
        cli,
        "--provider",
        "lab",
        "--retries",
        "1",
        "--",
        "sh",
        "-c",
        f"echo up; while [ ! -e {gate} ]; do sleep 0.05; done; echo ok",
    )
    wait_for(lambda: cli("logs", juid).stdout == "up\n", timeout=60, what="the job to start")
    cli("daemon", "stop", check=True)
    gate.touch()
    wait_for(
        lambda: exited(remote_runs(host) / juid / "1" / "events.jsonl"), what="the exit recorded"
    )
    time.sleep(3 * TIMEOUT)
    cli("daemon", "start", check=True)
    wait_for(
        lambda: info(cli, juid)["state"] not in ("running", "dispatching"),
        timeout=60,
        what="the job to end",
    )
    job = info(cli, juid)
    assert (job["state"], job["attempts"]) == ("succeeded", 1)
    assert cli("logs", juid).stdout == "up\nok\n"


def sshd_processes(host: SSHHost) -> list[int]:
    """The host's sshd and its per-connection sshd processes (not the sessions' commands:
    the agent and its jobs run on)."""
    assert host.proc is not None
    children: dict[int, list[int]] = {}
    names: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            name, rest = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :]
            names[int(entry)] = name
            children.setdefault(int(rest.split()[1]), []).append(int(entry))
    found, todo = [], [host.proc.pid]
    while todo:
        pid = todo.pop()
        if names.get(pid, "").startswith("sshd") or pid == host.proc.pid:
            found.append(pid)
            todo += children.get(pid, [])
    return found


def stall(host: SSHHost, sig: int = signal.SIGSTOP) -> None:
    """Freeze the host's sshd and its connections: the link stalls, the agent runs on."""
    for pid in sshd_processes(host):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def unstall(host: SSHHost) -> None:
    stall(host, signal.SIGCONT)


def test_a_link_stall_shows_unreachable_and_the_exit_is_adopted(cli, home: Path, lab: Lab) -> None:
    """sshd frozen far past the heartbeat timeout while the job ends: the job shows
    `unreachable` (list jobs, info job), then, reached again, ends as it did, once."""
    host = lab.add("h1")
    configure(home, [host.entry(key=lab.key)], connect_timeout=2)
    gate = Path(host.workdir) / "gate"
    juid = run(
        cli,
        "--provider",
        "lab",
        "--retries",
        "1",
        "--",
        "sh",
        "-c",
        f"echo up; while [ ! -e {gate} ]; do sleep 0.05; done; echo ok",
    )
    wait_for(lambda: cli("logs", juid).stdout == "up\n", timeout=60, what="the job to start")
    stall(host)
    try:
        gate.touch()
        wait_for(
            lambda: info(cli, juid).get("unreachable_since"),
            timeout=60,
            what="the job to show its host unreachable",
        )
        listed = cli("list", "jobs", check=True).stdout
        assert f"{juid}" in listed and "unreachable" in listed.split(juid, 1)[1].splitlines()[0]
        shown = cli("info", "job", juid, check=True).stdout
        state_line = next(line for line in shown.splitlines() if line.startswith("state"))
        assert "running, but lab/h1 is unreachable since" in state_line, state_line
        time.sleep(3 * TIMEOUT)
        assert info(cli, juid)["state"] == "running"  # lost_after (10 minutes) is far off
    finally:
        unstall(host)
    wait_for(
        lambda: info(cli, juid)["state"] not in ("running", "dispatching"),
        timeout=60,
        what="the job to end",
    )
    job = info(cli, juid)
    assert (job["state"], job["attempts"], job["unreachable_since"]) == ("succeeded", 1, None)
    assert cli("logs", juid).stdout == "up\nok\n"
    kinds = [e["kind"] for e in job["events"]]
    assert "unreachable" in kinds and "reachable" in kinds


def test_past_lost_after_the_attempt_is_lost_and_a_late_host_is_fenced(
    cli, home: Path, lab: Lab
) -> None:
    """A host out of reach past lost_after: the attempt ends lost (saying so) and the retry
    runs on the other host; when the first comes back, its stale attempt is stopped and the
    record shows both."""
    first, second = lab.add("h1"), lab.add("h2")
    configure(
        home, [first.entry(key=lab.key, cpus=1), second.entry(key=lab.key, cpus=1)], lost_after="3s"
    )
    hold = Path(second.workdir) / "hold"  # h2 busy with another job until the first is lost
    blocker = run(
        cli,
        "--provider",
        "lab",
        "--host",
        "h2",
        "--",
        "sh",
        "-c",
        f"while [ ! -e {hold} ]; do sleep 0.05; done",
    )
    juid = run(cli, "--provider", "lab", "--retries", "1", "--", "sh", "-c", "echo up; sleep 300")
    wait_for(lambda: info(cli, juid)["state"] == "running", timeout=60, what="the job to start")
    assert info(cli, juid)["instance"] == "lab/h1"
    first.cut()
    wait_for(
        lambda: info(cli, juid)["attempts"] == 1 and info(cli, juid)["state"] == "queued",
        timeout=60,
        what="the attempt lost and the job queued again",
    )
    lost = info(cli, juid)["attempts_detail"][0]
    assert lost["reason"].startswith("its instance was unreachable for "), lost
    assert lost["reason"].endswith("(lost_after 3s)"), lost
    hold.touch()
    wait_for(
        lambda: info(cli, juid)["attempts"] == 2 and info(cli, juid)["state"] == "running",
        timeout=60,
        what="the retry on h2",
    )
    stale = int((remote_runs(first) / juid / "1" / "started").read_text().split()[0])
    first.restore()
    wait_for(
        lambda: not os.path.exists(f"/proc/{stale}"), timeout=60, what="the stale attempt stopped"
    )
    fenced = [e for e in info(cli, juid)["events"] if e["kind"] == "fenced"]
    assert len(fenced) == 1 and fenced[0]["attempt"] == 1, fenced
    late = wait_for(
        lambda: [e for e in info(cli, juid)["events"] if e["kind"] == "late exit"],
        timeout=60,
        what="the stale attempt's end recorded",
    )
    assert (
        late[0]["attempt"] == 1
        and "(killed by signal 9), after it had been declared lost" in late[0]["detail"]
    ), late
    assert info(cli, blocker)["state"] == "succeeded"
    cli("cancel", juid, check=True)


def test_an_exit_recorded_after_the_attempt_was_lost_is_adopted(cli, home: Path, lab: Lab) -> None:
    """The job ends 0 on a host out of reach after its attempt was lost (no retry left):
    reached again, the host's record of the exit is adopted as the attempt's late exit,
    with its output."""
    host = lab.add("h1")
    configure(home, [host.entry(key=lab.key)], lost_after="2s")
    gate = Path(host.workdir) / "gate"
    juid = run(
        cli,
        "--provider",
        "lab",
        "--",
        "sh",
        "-c",
        f"echo up; while [ ! -e {gate} ]; do sleep 0.05; done; echo ok",
    )
    wait_for(lambda: cli("logs", juid).stdout == "up\n", timeout=60, what="the job to start")
    host.cut()
    wait_for(lambda: info(cli, juid)["state"] == "lost", timeout=60, what="the attempt lost")
    gate.touch()
    wait_for(
        lambda: exited(remote_runs(host) / juid / "1" / "events.jsonl"), what="the exit recorded"
    )
    host.restore()
    late = wait_for(
        lambda: [e for e in info(cli, juid)["events"] if e["kind"] == "late exit"],
        timeout=60,
        what="the late exit adopted",
    )
    assert "(exit 0), after it had been declared lost" in late[0]["detail"], late
    assert info(cli, juid)["attempts_detail"][0]["exit_code"] == 0
    wait_for(lambda: cli("logs", juid).stdout == "up\nok\n", timeout=30, what="its output fetched")


def test_listings_say_when_no_core_runs_and_runtimes_stop(cli, home: Path) -> None:
    juid = run(cli, "--", "sh", "-c", "echo up; sleep 300")
    wait_for(lambda: cli("logs", juid).stdout == "up\n", what="the job to start")
    assert "core not running" not in cli("list", "jobs", check=True).stderr
    kill_core(home)
    listed = cli("list", "jobs", check=True)
    assert listed.stderr.startswith("core not running since "), listed.stderr
    assert listed.stderr.rstrip().endswith("; states as of then; monkey daemon start")
    assert len(listed.stderr.splitlines()) == 1
    shown = cli("info", "job", juid, check=True)
    assert shown.stderr.startswith("core not running since "), shown.stderr
    first = json.loads(cli("list", "jobs", "--json", check=True).stdout)
    assert first["core"]["running"] is False and first["core"]["since"]
    time.sleep(1.5)
    again = json.loads(cli("list", "jobs", "--json", check=True).stdout)
    assert again["jobs"][0]["runtime"] == first["jobs"][0]["runtime"]  # stopped at the last contact
    start_core(home)
    listed = cli("list", "jobs", check=True)
    assert "core not running" not in listed.stderr
    assert json.loads(cli("list", "jobs", "--json", check=True).stdout)["core"]["running"] is True
    cli("cancel", juid, check=True)


def test_a_core_stopped_cleanly_is_not_running_either(cli, home: Path) -> None:
    juid = run(cli, "--", "sh", "-c", "echo up; sleep 300")
    wait_for(lambda: cli("logs", juid).stdout == "up\n", what="the job to start")
    cli("daemon", "stop", check=True)
    assert core_pid(home) is None
    assert cli("list", "jobs", check=True).stderr.startswith("core not running since ")
    cli("cancel", juid, check=True)


@pytest.mark.parametrize("value", ["soon", 0, -5, True, "10x", [1]])
def test_a_bad_lost_after_is_one_line(cli, home: Path, value: object) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "providers.yml").write_text(
        yaml.safe_dump({"providers": {"local": {"type": "local", "lost_after": value}}})
    )
    out = cli("run", "--", "true")
    assert out.returncode != 0
    assert out.stderr.count("\n") == 1, out.stderr
    assert "provider 'local': lost_after must be a duration like 600, 90s, 10m or 1h" in out.stderr
    assert cli("list", "jobs", "--json", check=True).stdout.count('"job"') == 0  # nothing half-done


@pytest.mark.parametrize("value", [600, 90.5, "90s", "10m", "1h"])
def test_a_good_lost_after_is_taken(home: Path, value: object) -> None:
    from monkey.config import Home
    from monkey.drivers import load_providers
    from monkey.drivers.base import lost_after

    home.mkdir(parents=True, exist_ok=True)
    (home / "providers.yml").write_text(
        yaml.safe_dump({"providers": {"local": {"type": "local", "lost_after": value}}})
    )
    config = load_providers(Home(home))["local"]
    assert (
        lost_after(config.options)
        == {600: 600, 90.5: 90.5, "90s": 90, "10m": 600, "1h": 3600}[value]
    )


def test_the_dashboard_shows_unreachable_jobs() -> None:
    from monkey.models import Job, State
    from monkey.tui.format import row_cells

    job = Job(
        "26-11-27-001",
        "train",
        State.RUNNING,
        ["true"],
        "lab",
        started_at=1.0,
        unreachable_since=5.0,
    )
    assert row_cells(job, 10.0)["state"].plain == "unreachable"
    assert row_cells(job.replace(unreachable_since=None), 10.0)["state"].plain == "running"
