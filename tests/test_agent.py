"""The worker agent, run for real as a subprocess and driven through AgentLink."""

from __future__ import annotations

import hashlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import kill_until_gone, wait_for

from monkey.drivers.agent_link import AgentError, AgentLink, connect_unix

pytestmark = pytest.mark.system  # starts real agents (processes) and their jobs

REPO = Path(__file__).resolve().parents[1]
TIMEOUT = 20.0
CGROUP2 = next(
    (
        m.split()[1]
        for m in Path("/proc/mounts").read_text().splitlines()
        if m.split()[2] == "cgroup2"
    ),
    "",
)


# ---------------------------------------------------------------- helpers


def stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat fields after the command name, or None when gone."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return data[data.rfind(")") + 2 :].split()


def alive(pid: int) -> bool:
    """PID exists and is not a zombie."""
    fields = stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def session_members(sid: int) -> list[int]:
    """Live (non-zombie) processes whose session id is SID."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = stat_fields(int(name))
            if fields and int(fields[3]) == sid and fields[0] not in ("Z", "X"):
                found.append(int(name))
    return found


def tagged_processes(tag: str) -> list[int]:
    """Live processes whose environment carries the test's tag."""
    needle = f"MONKEY_TEST_TAG={tag}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            env = Path(f"/proc/{name}/environ").read_bytes()
        except OSError:
            continue
        if needle in env.split(b"\0") and alive(int(name)):
            found.append(int(name))
    return found


def put_blob(blobs: Path, data: bytes) -> str:
    """Store DATA in the content-addressed store; return its digest."""
    digest = hashlib.sha256(data).hexdigest()
    path = blobs / digest[:2] / digest[2:]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return digest


def connect_as(uid: int, path: str) -> str:
    """In a forked child running as UID: connect to PATH, say hello; what came back."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        result = b"error"
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(10)
                sock.connect(path)
                try:
                    sock.sendall(b'{"id": 1, "op": "hello"}\n')
                    result = b"reply" if sock.recv(100) else b"closed"
                except ConnectionError:
                    result = b"closed"
        except BaseException as e:
            result = repr(e).encode()
        finally:
            os.write(write_end, result)
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        answer = f.read().decode()
    os.waitpid(pid, 0)
    return answer


class Client:
    """An AgentLink plus the pushes received so far."""

    def __init__(self, link: AgentLink) -> None:
        self.link = link
        self.pushes: list[dict[str, Any]] = []
        self.replies: list[dict[str, Any]] = []  # to requests sent without waiting

    def request(self, op: str, **fields: Any) -> dict[str, Any]:
        return self.link.request(op, **fields)

    def collect(self) -> None:
        for item in self.link.poll():
            (self.replies if "id" in item else self.pushes).append(item)

    def wait_reply(self, rid: int) -> dict[str, Any]:
        """The reply to the request sent (``link.send``) with id RID."""

        def came() -> dict[str, Any] | None:
            select.select([self.link], [], [], 0.05)
            self.collect()
            return next((r for r in self.replies if r["id"] == rid), None)

        return wait_for(came, timeout=TIMEOUT, what=f"the reply to request {rid}")

    def events(self, juid: str, etype: str | None = None) -> list[dict[str, Any]]:
        self.collect()
        return [
            p
            for p in self.pushes
            if p["juid"] == juid and (etype is None or p["event"]["type"] == etype)
        ]

    def wait_event(self, juid: str, etype: str, count: int = 1) -> list[dict[str, Any]]:
        """Wait until COUNT events of ETYPE for JUID were pushed."""

        def enough() -> list[dict[str, Any]] | None:
            select.select([self.link], [], [], 0.05)
            found = self.events(juid, etype)
            return found if len(found) >= count else None

        return wait_for(enough, timeout=TIMEOUT, what=f"{count} {etype} event(s) of {juid}")

    def wait_exit(self, juid: str) -> dict[str, Any]:
        return self.wait_event(juid, "exit")[0]["event"]


class World:
    """Agents on one ROOT started by a test; all killed, with their jobs, at teardown."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.root = tmp_path / "root"
        self.blobs = tmp_path / "blobs"
        self.blobs.mkdir()
        self.sockdir = Path(tempfile.mkdtemp(prefix="mk-", dir="/tmp"))
        self.socket = str(self.sockdir / "agent.sock")
        self.tag = uuid.uuid4().hex
        self.procs: list[subprocess.Popen] = []
        self.links: list[AgentLink] = []

    def spawn(self, *extra: str, socket_path: str | None = None) -> subprocess.Popen:
        """Start an agent process (without waiting for it)."""
        env = dict(os.environ, MONKEY_TEST_TAG=self.tag, PYTHONPATH=str(REPO))
        cmd = [sys.executable, "-m", "monkey.client_agent", "--root", str(self.root)]
        cmd += ["--socket", socket_path or self.socket, *extra]
        with open(self.tmp / "agent.log", "ab") as log:
            proc = subprocess.Popen(
                cmd, env=env, stdin=subprocess.DEVNULL, stderr=log, cwd=self.tmp
            )
        self.procs.append(proc)
        return proc

    def start_agent(self, *extra: str) -> subprocess.Popen:
        """Start an agent and wait until its socket accepts connections."""
        proc = self.spawn(*extra)

        def ready() -> bool:
            assert proc.poll() is None, f"agent exited: {self.log()}"
            try:
                connect_unix(self.socket).close()
            except OSError:
                return False
            return True

        wait_for(ready, timeout=TIMEOUT, what="the agent's socket")
        return proc

    def client(self, sync: bool = True) -> Client:
        """A new connection, subscribed to pushes (sync with no attempts) by default."""
        link = connect_unix(self.socket)
        self.links.append(link)
        client = Client(link)
        if sync:
            client.request("sync", attempts=[])
        return client

    def log(self) -> str:
        path = self.tmp / "agent.log"
        return path.read_text() if path.exists() else ""

    def run_dir(self, juid: str) -> Path:
        return self.tmp / "runs" / juid / "1"

    def start(self, client: Client, juid: str, argv: list[str], **fields: Any) -> dict[str, Any]:
        """Send a start request for attempt 1 of JUID."""
        request = {"env": {}, "files": [], "blobs_dir": str(self.blobs), "datasets": []}
        request.update(fields)
        if request["files"] is None:  # no `files` key at all
            del request["files"]
        return client.request(
            "start", juid=juid, attempt=1, run_dir=str(self.run_dir(juid)), argv=argv, **request
        )

    def sync_item(self, juid: str, offset: int = 0) -> dict[str, Any]:
        return {"juid": juid, "attempt": 1, "run_dir": str(self.run_dir(juid)), "offset": offset}

    def job_pid(self, juid: str) -> int:
        """The pid of JUID's wrapper, from its started event."""
        first = (self.run_dir(juid) / "events.jsonl").read_text().splitlines()[0]
        return json.loads(first)["pid"]

    def recorded_code(self, juid: str) -> str | None:
        """The exit code JUID's wrapper appended to its claim ("exit CODE"), or None."""
        path = self.run_dir(juid) / "started"
        lines = path.read_text().splitlines() if path.exists() else []
        return next((line[5:] for line in lines if line.startswith("exit ")), None)

    def kill_agents(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()

    def teardown(self) -> None:
        for link in self.links:
            link.close()
        self.kill_agents()
        kill_until_gone(lambda: tagged_processes(self.tag))
        shutil.rmtree(self.sockdir, ignore_errors=True)
        assert not tagged_processes(self.tag), "job processes survived the test"


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path)
    try:
        yield w
    finally:
        w.teardown()


@pytest.fixture
def agent(world: World) -> Client:
    """A running agent and a subscribed client."""
    world.start_agent()
    return world.client()


WAIT_GO = "while [ ! -e go ]; do sleep 0.02; done"


# ---------------------------------------------------------------- running jobs


def test_job_output_and_exit_zero(world: World, agent: Client) -> None:
    reply = world.start(agent, "j", ["sh", "-c", "echo hello; echo oops >&2"])
    assert reply["pid"] > 0
    event = agent.wait_exit("j")
    assert (event["code"], event["signal"], event["reason"]) == (0, None, "exited")
    run = world.run_dir("j")
    assert (run / "stdout.log").read_text() == "hello\n"
    assert (run / "stderr.log").read_text() == "oops\n"
    assert world.recorded_code("j") == "0"
    lines = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    assert [e["type"] for e in lines] == ["started", "exit"]
    # what an agent that adopts the job needs
    assert {"pid", "gpus", "cgroup", "limit", "cpus"} <= set(lines[0])
    assert sorted(p.name for p in run.iterdir()) == [
        "events.jsonl",
        "output.order",
        "started",
        "stderr.log",
        "stdout.log",
        "work",
    ]
    assert [e["seq"] for e in lines] == [1, 2]
    assert lines[0]["pid"] == reply["pid"]
    pushes = agent.events("j")
    assert [p["event"] for p in pushes] == lines
    assert pushes[-1]["offset"] == (run / "events.jsonl").stat().st_size
    assert agent.request("jobs")["jobs"] == []


def test_exit_code_propagated(world: World, agent: Client) -> None:
    world.start(agent, "j", ["sh", "-c", "exit 3"])
    event = agent.wait_exit("j")
    assert (event["code"], event["reason"]) == (3, "exited")


def test_command_not_found_is_exit_127(world: World, agent: Client) -> None:
    world.start(agent, "j", ["/no/such/program"])
    assert agent.wait_exit("j")["code"] == 127


def test_workdir_name(world: World, agent: Client) -> None:
    digest = put_blob(world.blobs, b"print('hi')\n")
    world.start(
        agent,
        "j",
        ["sh", "-c", "pwd; cat main.py"],
        workdir_name="myproject",
        files=[["main.py", digest, 0o644]],
    )
    assert agent.wait_exit("j")["code"] == 0
    out = (world.run_dir("j") / "stdout.log").read_text()
    assert out == f"{world.run_dir('j') / 'work' / 'myproject'}\nprint('hi')\n"
    with pytest.raises(AgentError, match="unsafe path"):
        world.start(agent, "k", ["true"], workdir_name="..")


def test_env_overlay_and_cwd(world: World, agent: Client) -> None:
    world.start(
        agent, "j", ["sh", "-c", 'echo "$GREETING $MONKEY_TEST_TAG"; pwd'], env={"GREETING": "hi"}
    )
    agent.wait_exit("j")
    out = (world.run_dir("j") / "stdout.log").read_text().splitlines()
    assert out == [f"hi {world.tag}", str(world.run_dir("j") / "work")]


def test_signal_term_kills_whole_tree(world: World, agent: Client) -> None:
    world.start(agent, "j", ["sh", "-c", "sleep 100 & sleep 100 & wait"])
    pid = world.job_pid("j")
    # the wrapper shell, the job's shell and its two sleeps
    wait_for(lambda: len(session_members(pid)) == 4, timeout=TIMEOUT, what="the job's children")
    agent.request("signal", juid="j", attempt=1, signal="TERM", grace=30)
    event = agent.wait_exit("j")
    assert event["reason"] == "killed" and event["signal"] == signal.SIGTERM
    assert event["code"] == 128 + signal.SIGTERM
    wait_for(
        lambda: not session_members(pid),
        timeout=TIMEOUT,
        what="no process left in the job's session",
    )


def test_signal_reaches_children_that_left_the_process_group(world: World, agent: Client) -> None:
    # a child in another process group but the same session: only the session scan finds it
    script = f"{sys.executable} -c 'import os,time; os.setpgid(0,0); time.sleep(100)' & wait"
    world.start(agent, "j", ["sh", "-c", script])
    pid = world.job_pid("j")

    def moved() -> bool:
        groups = {int(stat_fields(p)[2]) for p in session_members(pid) if stat_fields(p)}
        return len(groups) >= 2

    wait_for(moved, timeout=TIMEOUT, what="a child in its own process group")
    agent.request("signal", juid="j", attempt=1, signal="TERM", grace=30)
    assert agent.wait_exit("j")["reason"] == "killed"
    wait_for(
        lambda: not session_members(pid),
        timeout=TIMEOUT,
        what="no process left in the job's session",
    )


def test_job_ignoring_term_is_killed_after_grace(world: World, agent: Client) -> None:
    script = 'trap "" TERM; touch ready; while :; do sleep 0.05; done'
    world.start(agent, "j", ["sh", "-c", script])
    wait_for(
        (world.run_dir("j") / "work" / "ready").exists,
        timeout=TIMEOUT,
        what="the job to ignore TERM",
    )
    pid = world.job_pid("j")
    reply = agent.request("signal", juid="j", attempt=1, signal="TERM", grace=0.5)
    assert reply["running"] is True
    event = agent.wait_exit("j")
    assert (event["code"], event["signal"], event["reason"]) == (None, 9, "killed")
    wait_for(
        lambda: not session_members(pid),
        timeout=TIMEOUT,
        what="no process left in the job's session",
    )


def test_a_signal_sent_as_the_job_starts_reaches_its_command(world: World, tree_mode: str) -> None:
    # The wrapper traps TERM to outlive the job: a TERM it took before the command's exec
    # (itself, or through its fork that has yet to exec) would never reach the job, which
    # would run on until the grace ran out; one that killed it before its trap would end
    # the attempt with the command never run.
    world.start_agent()
    agent = world.client()
    script = 'trap "echo got TERM; exit 3" TERM; while :; do sleep 0.05; done'
    alone = "import signal, sys, time; signal.signal(15, lambda *_: sys.exit(3)); time.sleep(100)"
    for n in range(12):
        # a command run with `exec` replaces the wrapper (no code is written); this one
        # starts no process of its own
        exec_ = n % 2 == 1
        argv = ["exec", sys.executable, "-c", alone] if exec_ else ["sh", "-c", script]
        if n < 6:  # the signal once the start is answered
            world.start(agent, f"j{n}", argv)
            agent.request("signal", juid=f"j{n}", attempt=1, signal="TERM", grace=60)
        else:  # sent with the start: the agent takes it as the wrapper is still exec'ing
            started = send_start(world, agent, f"j{n}", argv)
            signalled = agent.link.send("signal", juid=f"j{n}", attempt=1, signal="TERM", grace=60)
            assert "error" not in agent.wait_reply(started)
            assert "error" not in agent.wait_reply(signalled)
        event = agent.wait_exit(f"j{n}")  # well within the grace
        assert event["reason"] == "killed"
        # 3: the command's trap ran; else TERM came before the command set its trap
        assert event["code"] in (3, None if exec_ else 128 + signal.SIGTERM)
        assert event["code"] == 3 or event["signal"] == signal.SIGTERM


def test_each_process_of_a_job_gets_a_signal_once(world: World, tree_mode: str) -> None:
    # A process that handles TERM (to save a checkpoint, say) must not run its handler
    # twice: the agent signals the job's process group at once, then each process that
    # left it (here one in a session of its own), not both ways; and a repeated request
    # is not a second signal.
    world.start_agent()
    agent = world.client()
    loop = 'trap "echo T >> terms" TERM; touch ready.$1; while :; do sleep 0.05; done'
    script = (
        f"for i in 1 2 3 4 5; do sh -c '{loop}' - $i & done; setsid sh -c '{loop}' - 6 & "
        f"set -- 0; {loop}"
    )
    world.start(agent, "j", ["sh", "-c", script])
    work = world.run_dir("j") / "work"
    wait_for(lambda: len(list(work.glob("ready.*"))) == 7, timeout=TIMEOUT, what="7 handlers")
    agent.request("signal", juid="j", attempt=1, signal="TERM", grace=3)
    time.sleep(0.3)
    # asked again, as the core does after a broken link: the processes have it already
    assert agent.request("signal", juid="j", attempt=1, signal="TERM", grace=3)["running"]
    assert agent.wait_exit("j")["signal"] == signal.SIGKILL  # the handlers went on
    assert (work / "terms").read_text() == "T\n" * 7


def test_signal_after_exit_is_ok(world: World, agent: Client) -> None:
    world.start(agent, "j", ["true"])
    agent.wait_exit("j")
    assert agent.request("signal", juid="j", attempt=1, signal="TERM")["running"] is False


def test_leftover_background_processes_are_killed_at_exit(world: World, agent: Client) -> None:
    world.start(agent, "j", ["sh", "-c", "sleep 100 & echo started"])
    pid = world.job_pid("j")
    assert agent.wait_exit("j")["code"] == 0
    wait_for(
        lambda: not session_members(pid), timeout=TIMEOUT, what="the background sleep to be killed"
    )


def with_cmdline(token: str) -> list[int]:
    """Live processes whose command line starts with TOKEN (they may have cleared their
    env); not the job's shells, whose command lines hold it further on."""
    found = []
    for name in os.listdir("/proc"):
        try:
            cmd = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if name.isdigit() and cmd.startswith(token.encode()) and alive(int(name)):
            found.append(int(name))
    return found


@pytest.fixture(params=["cgroup", "sweep"])
def tree_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Agents that track jobs by cgroup (where the kernel lets them) or by sweeping."""
    if request.param == "sweep":
        monkeypatch.setenv("MONKEY_NO_CGROUP", "1")
    return request.param


def escapes(mark: int) -> tuple[str, tuple[str, ...]]:
    """A script whose processes leave the job's session (one also clears its environment),
    and the command lines they show (unique to the test by MARK)."""
    tokens = tuple(f"sleep 100{i}.{mark}" for i in range(3))
    script = (
        f"setsid {tokens[0]} & setsid sh -c '( {tokens[1]} & ) &'; "
        f"env -i setsid {tokens[2]} & echo up"
    )
    return script, tokens


@pytest.mark.parametrize("end", ["cancel", "exit"])
def test_processes_that_left_the_session_are_killed(world: World, tree_mode: str, end: str) -> None:
    world.start_agent()
    agent = world.client()
    script, tokens = escapes(int(world.tag[:8], 16))
    world.start(agent, "j", ["sh", "-c", f"{script}; {WAIT_GO}"])
    wait_for(lambda: all(with_cmdline(t) for t in tokens), timeout=TIMEOUT, what="the escapees")
    if end == "cancel":
        agent.request("signal", juid="j", attempt=1, signal="TERM", grace=30)
    else:
        (world.run_dir("j") / "work" / "go").touch()
    agent.wait_exit("j")
    wait_for(
        lambda: not any(with_cmdline(t) for t in tokens),
        timeout=TIMEOUT,
        what="every process of the job to be gone",
    )


def test_processes_left_are_killed_when_a_held_start_takes_the_slot(
    world: World, tree_mode: str
) -> None:
    # One slot: the start held behind the job is spawned the moment the job ends; what the
    # job left (even a process with no trace of it) is killed all the same.
    world.start_agent()
    agent = world.client()
    script, tokens = escapes(int(world.tag[:8], 16))
    assert agent.wait_reply(send_start(world, agent, "j", ["sh", "-c", f"{script}; {WAIT_GO}"]))[
        "ok"
    ]
    wait_for(lambda: all(with_cmdline(t) for t in tokens), timeout=TIMEOUT, what="the escapees")
    held = send_start(world, agent, "next", ["sh", "-c", WAIT_GO])
    (world.run_dir("j") / "work" / "go").touch()
    assert agent.wait_exit("j")["code"] == 0
    assert agent.wait_reply(held)["ok"]
    wait_for(
        lambda: not any(with_cmdline(t) for t in tokens),
        timeout=TIMEOUT,
        what="every process of the ended job to be gone",
    )
    (world.run_dir("next") / "work" / "go").touch()
    assert agent.wait_exit("next")["code"] == 0


def test_a_job_shares_its_cgroup_with_no_process_of_an_earlier_job(world: World) -> None:
    # Cgroups are kept for later jobs once empty: one whose earlier job left a process
    # behind must not be handed out, and an agent that stops leaves none behind.
    agent_proc = world.start_agent()
    agent = world.client()
    script, tokens = escapes(int(world.tag[:8], 16))
    world.start(agent, "left", ["sh", "-c", script])
    agent.wait_exit("left")
    groups = set()
    for n in range(6):
        juid = f"j{n}"
        world.start(agent, juid, ["sh", "-c", "touch in; " + WAIT_GO])
        wait_for((world.run_dir(juid) / "work" / "in").exists, timeout=TIMEOUT, what="the job")
        pid = world.job_pid(juid)
        group = Path("/proc", str(pid), "cgroup").read_text().splitlines()[-1].partition("::")[2]
        members = (Path(CGROUP2) / group.lstrip("/") / "cgroup.procs").read_text().split()
        mark = f"MONKEY_STARTED_FILE={world.run_dir(juid) / 'started'}".encode()
        assert members and all(mark in Path("/proc", m, "environ").read_bytes() for m in members)
        groups.add(group)
        (world.run_dir(juid) / "work" / "go").touch()
        assert agent.wait_exit(juid)["code"] == 0
    assert not any(with_cmdline(t) for t in tokens)
    assert len(groups) == 1, groups  # one job at a time: the same cgroup each time
    base = Path(CGROUP2) / next(iter(groups)).lstrip("/")
    assert base.parent.name.startswith("monkey-") and base.exists()
    agent_proc.send_signal(signal.SIGTERM)
    agent_proc.wait(timeout=TIMEOUT)
    assert not base.parent.exists(), list(base.parent.iterdir())


def run_wrapper(run_dir: Path, argv: list[str], tag: str) -> subprocess.Popen:
    """Start a job's wrapper as an agent does, without an agent: what an agent SIGKILLed
    between its spawn and its own records leaves behind."""
    from monkey.client_agent import spawn as agent_module

    (run_dir / "work").mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, MONKEY_TEST_TAG=tag, **agent_module.job_env(str(run_dir), ""))
    return subprocess.Popen(
        ["/bin/sh", "-c", agent_module.WRAPPER, "monkey-job", str(run_dir / "work"), *argv],
        env=env,
        start_new_session=True,
    )


@pytest.mark.parametrize("when", ["ended", "running"])
def test_job_started_by_an_earlier_agent_is_adopted(world: World, when: str) -> None:
    # Agents before this one kept the started record in `pid` and the wrapper's exit code
    # in `exit`: a job they started is adopted after an upgrade, its code read from there.
    from monkey.client_agent.procs import read_stat, stat_start_ticks

    run = world.run_dir("j")
    (run / "work").mkdir(parents=True)
    go = world.tmp / "go"
    proc = subprocess.Popen(
        ["sh", "-c", f"while [ ! -e {go} ]; do sleep 0.02; done; echo 7 > {run}/exit; exit 7"],
        start_new_session=True,
        env=dict(os.environ, MONKEY_TEST_TAG=world.tag),
    )
    ticks = stat_start_ticks(read_stat(proc.pid))
    (run / "started").write_text(f"{proc.pid}\n")
    (run / "pid").write_text(json.dumps({"pid": proc.pid, "start_ticks": ticks, "cgroup": ""}))
    (run / "events.jsonl").write_text(
        json.dumps({"seq": 1, "ts": time.time(), "type": "started", "pid": proc.pid}) + "\n"
    )
    if when == "ended":
        go.touch()
        assert proc.wait() == 7
    world.start_agent()
    client = world.client(sync=False)
    reply = client.request("sync", attempts=[world.sync_item("j")])
    assert reply["attempts"][0]["status"] == ("exited" if when == "ended" else "running")
    go.touch()
    event = client.wait_exit("j")
    assert (event["code"], event["reason"]) == (7, "exited")
    proc.wait()


def test_job_whose_agent_died_before_recording_it_is_adopted_not_rerun(world: World) -> None:
    ledger = world.tmp / "ledger"
    proc = run_wrapper(world.run_dir("j"), ["sh", "-c", f"echo ran >> {ledger}; exit 3"], world.tag)
    assert proc.wait() == 3
    world.start_agent()
    client = world.client(sync=False)
    reply = client.request("sync", attempts=[world.sync_item("j")])
    assert reply["attempts"][0]["status"] == "exited"
    event = client.wait_exit("j")
    assert (event["code"], event["reason"]) == (3, "exited")
    with pytest.raises(AgentError, match="already started"):
        world.start(client, "j", ["sh", "-c", f"echo ran >> {ledger}"])
    assert ledger.read_text() == "ran\n"


def test_running_job_whose_agent_died_before_recording_it_is_adopted(world: World) -> None:
    proc = run_wrapper(world.run_dir("j"), ["sh", "-c", WAIT_GO + "; echo done"], world.tag)
    wait_for((world.run_dir("j") / "started").exists, timeout=TIMEOUT, what="the claim")
    world.start_agent()
    client = world.client(sync=False)
    reply = client.request("sync", attempts=[world.sync_item("j")])
    assert reply["attempts"][0]["status"] == "running"
    assert world.job_pid("j") == proc.pid
    (world.run_dir("j") / "work" / "go").touch()
    event = client.wait_exit("j")
    assert (event["code"], event["reason"]) == (0, "exited")
    proc.wait()
    assert (world.run_dir("j") / "stdout.log").exists() is False  # not ours: no redirect
    assert [p["event"]["type"] for p in client.events("j")] == ["started", "exit"]


def test_an_adopting_agent_keeps_the_signal_sent_and_its_deadline(world: World) -> None:
    # The first agent stops the job at its time limit (TERM: the job goes on, as one saving
    # a checkpoint may) and dies; the next one adopts the job: no second TERM, the SIGKILL
    # when the first one's grace ends, and the attempt still ends as a timeout.
    first = world.start_agent()
    agent = world.client()
    script = 'trap "echo TERM" TERM; while :; do sleep 0.05; done'
    world.start(agent, "j", ["sh", "-c", script], time_limit=0.5, grace=2.5)
    out = world.run_dir("j") / "stdout.log"
    wait_for(lambda: out.read_text() == "TERM\n", timeout=TIMEOUT, what="the time limit's TERM")
    first.kill()
    first.wait()
    world.start_agent()
    client = world.client(sync=False)
    assert (
        client.request("sync", attempts=[world.sync_item("j")])["attempts"][0]["status"]
        == "running"
    )
    event = client.wait_exit("j")
    assert (event["signal"], event["reason"]) == (signal.SIGKILL, "timeout")
    assert out.read_text() == "TERM\n"


def test_a_job_finds_its_signal_marked_when_the_signal_arrives(world: World) -> None:
    # An agent killed after sending a TERM but before marking it would leave the job to an
    # adopter that sends a second one (run twice, a handler saving a checkpoint can be cut
    # short): the mark is written first.
    world.start_agent()
    agent = world.client()
    script = (
        "import os, signal, sys, time\n"
        "def took(*_):\n"
        "    print('marked' if os.path.exists(sys.argv[1]) else 'unmarked', flush=True)\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, took)\n"
        "print('up', flush=True)\n"
        "while True:\n"
        "    time.sleep(1)\n"
    )
    mark = world.run_dir("j") / "signalled"
    world.start(agent, "j", [sys.executable, "-c", script, str(mark)])
    out = world.run_dir("j") / "stdout.log"
    wait_for(lambda: out.read_text() == "up\n", timeout=TIMEOUT, what="the job to start")
    assert agent.request("signal", juid="j", attempt=1, signal="TERM", grace=60)["running"]
    assert agent.wait_exit("j")["code"] == 0
    assert out.read_text() == "up\nmarked\n"
    assert json.loads(mark.read_text())["signal"] == signal.SIGTERM


def test_a_signal_marked_but_never_sent_is_not_sent_by_the_adopter(world: World) -> None:
    # An agent killed between marking a TERM and sending it: the agent that adopts the job
    # takes the mark as sent (a second TERM is worse than none) and the job still ends
    # when the grace does, by SIGKILL.
    first = world.start_agent()
    agent = world.client()
    script = 'trap "echo TERM" TERM; echo up; while :; do sleep 0.05; done'
    world.start(agent, "j", ["sh", "-c", script])
    out = world.run_dir("j") / "stdout.log"
    wait_for(lambda: out.read_text() == "up\n", timeout=TIMEOUT, what="the job to start")
    first.kill()
    first.wait()
    # The grace ends 1.5 s from now on the boot clock (a step of the wall clock moves it not).
    grace_end = time.clock_gettime(time.CLOCK_BOOTTIME) + 1.5
    mark = {"signal": signal.SIGTERM, "boot_deadline": grace_end, "timeout": False}
    (world.run_dir("j") / "signalled").write_text(json.dumps(mark))
    world.start_agent()
    client = world.client(sync=False)
    reply = client.request("sync", attempts=[world.sync_item("j")])
    assert reply["attempts"][0]["status"] == "running"
    assert client.request("signal", juid="j", attempt=1, signal="TERM", grace=60)["running"]
    event = client.wait_exit("j")
    assert (event["signal"], event["reason"]) == (signal.SIGKILL, "killed")
    assert out.read_text() == "up\n"


def sync_with_pid_of(world: World, holder: subprocess.Popen[bytes], claim: str) -> Client:
    """Record job j as started by a wrapper whose pid HOLDER now holds (its claim reading
    CLAIM, a format with the pid), then start a new agent whose sync finds it exited."""
    run = world.run_dir("j")
    (run / "work").mkdir(parents=True)
    (run / "started").write_text(claim.format(pid=holder.pid))
    started = {
        "seq": 1,
        "ts": time.time(),
        "type": "started",
        "pid": holder.pid,
        "gpus": "",
        "cgroup": "",
        "limit": None,
        "cpus": 1,
    }
    (run / "events.jsonl").write_text(json.dumps(started) + "\n")
    world.start_agent()
    client = world.client(sync=False)
    reply = client.request("sync", attempts=[world.sync_item("j")])
    assert reply["attempts"][0]["status"] == "exited"
    return client


def test_recorded_pid_now_of_another_process_is_not_adopted(world: World) -> None:
    # The job ended while no agent ran and its pid went to a stranger: a new agent must not
    # take the stranger for the job (nor kill it), and reports the job ended.
    stranger = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        client = sync_with_pid_of(world, stranger, "{pid}\n")
        assert client.wait_exit("j")["reason"] == "vanished"
        assert client.request("jobs")["jobs"] == []
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


def test_wrapper_that_wrote_its_exit_code_is_not_adopted(world: World) -> None:
    # The wrapper's pid now names a process of the job (its environment names the claim),
    # but the wrapper wrote its code, its last act: the job ended with that code.
    claim = world.run_dir("j") / "started"
    child = subprocess.Popen(
        ["sleep", "60"],
        start_new_session=True,
        env=dict(os.environ, MONKEY_STARTED_FILE=str(claim)),
    )
    try:
        event = sync_with_pid_of(world, child, "{pid}\nexit 4\n").wait_exit("j")
        assert (event["code"], event["reason"]) == (4, "exited")
    finally:
        child.kill()
        child.wait()


def test_empty_claim_whose_writer_died_was_never_started(world: World, agent: Client) -> None:
    # A wrapper (or a sync making its own claim) killed between creating the claim and
    # writing it leaves it empty: the job never ran. Reported never started, so the core
    # queues it again (a fault storm once ended such a job `lost`, run zero times).
    run_dir = world.run_dir("j")
    run_dir.mkdir(parents=True)
    (run_dir / "started").touch()
    reply = agent.request("sync", attempts=[world.sync_item("j")])
    assert reply["attempts"][0]["status"] == "unknown"
    assert claim(world, "j") == b"abandoned\n"
    assert not (run_dir / "events.jsonl").exists()  # no started or exit event for it


def test_empty_claim_of_a_live_wrapper_is_adopted(world: World, agent: Client) -> None:
    # The wrapper created the claim and is about to write its pid: it lives, so it runs.
    run_dir = world.run_dir("j")
    run_dir.mkdir(parents=True)
    (run_dir / "started").touch()
    holder = subprocess.Popen(
        ["sleep", "60"],
        start_new_session=True,
        env=dict(os.environ, MONKEY_STARTED_FILE=str(run_dir / "started")),
    )
    try:
        reply = agent.request("sync", attempts=[world.sync_item("j")])
        assert reply["attempts"][0]["status"] == "running"
        assert world.job_pid("j") == holder.pid
        assert claim(world, "j") == b""
    finally:
        holder.kill()
        holder.wait()


def test_wrapper_that_loses_to_a_sync_runs_nothing(world: World, agent: Client) -> None:
    # A sync found no claim and reported the attempt never started; the wrapper of an agent
    # that died just after forking it comes late: it must not run the job.
    ledger = world.tmp / "ledger"
    reply = agent.request("sync", attempts=[world.sync_item("j")])
    assert reply["attempts"][0]["status"] == "unknown"
    proc = run_wrapper(world.run_dir("j"), ["sh", "-c", f"echo ran >> {ledger}"], world.tag)
    assert proc.wait() == 125
    assert not ledger.exists() and world.recorded_code("j") is None


def test_start_twice_same_run_dir_refused(world: World, agent: Client) -> None:
    world.start(agent, "j", ["true"])
    agent.wait_exit("j")
    with pytest.raises(AgentError, match="already started"):
        world.start(agent, "j", ["true"])
    assert len(agent.events("j", "exit")) == 1


# ---------------------------------------------------------------- agent restarts


def ended_while_agent_down(world: World, script: str) -> tuple[Client, dict[str, Any]]:
    """Start SCRIPT as job j (it waits for `go` first), SIGKILL the agent, let the job end,
    then start a new agent that syncs it as exited: (its client, j's started push)."""
    agent_proc = world.start_agent()
    first = world.client()
    world.start(first, "j", ["sh", "-c", f"{WAIT_GO}; {script}"])
    started = first.wait_event("j", "started")[0]
    agent_proc.kill()
    agent_proc.wait()
    pid = world.job_pid("j")
    assert alive(pid), "the job died with the agent"
    (world.run_dir("j") / "work" / "go").touch()
    wait_for(lambda: not alive(pid), timeout=TIMEOUT, what="the job to end")
    world.start_agent()
    second = world.client(sync=False)
    reply = second.request("sync", attempts=[world.sync_item("j", 0)])
    assert reply["attempts"] == [{"juid": "j", "attempt": 1, "status": "exited"}]
    return second, started


def test_job_that_removed_its_claim_keeps_its_exit_code_across_an_agent_crash(world: World) -> None:
    second, _ = ended_while_agent_down(world, 'rm -f "$MONKEY_STARTED_FILE"; exit 6')
    assert world.recorded_code("j") == "6"
    event = second.wait_event("j", "exit")[0]["event"]
    assert (event["code"], event["reason"]) == (6, "exited")


def test_job_outlives_agent_crash_and_sync_resumes(world: World) -> None:
    second, started = ended_while_agent_down(world, "echo done; exit 5")
    assert world.recorded_code("j") == "5"
    second.wait_event("j", "exit")
    pushes = second.events("j")
    assert [p["event"]["type"] for p in pushes] == ["started", "exit"]
    assert [p["event"]["seq"] for p in pushes] == [1, 2]
    assert pushes[0] == started
    exit_event = pushes[1]["event"]
    assert (exit_event["code"], exit_event["reason"]) == (5, "exited")
    size = (world.run_dir("j") / "events.jsonl").stat().st_size
    assert pushes[1]["offset"] == size

    # resuming from the last offset pushes nothing; from the middle, only what follows
    third = world.client(sync=False)
    reply = third.request("sync", attempts=[world.sync_item("j", size)])
    assert reply["attempts"][0]["status"] == "exited"
    third.request("hello")  # the backlog is pushed right after the sync reply
    assert third.events("j") == []
    third.request("sync", attempts=[world.sync_item("j", started["offset"])])
    third.request("hello")
    assert [p["event"]["type"] for p in third.events("j")] == ["exit"]
    lines = (world.run_dir("j") / "events.jsonl").read_text().splitlines()
    assert [json.loads(line)["type"] for line in lines] == ["started", "exit"]


def test_running_job_adopted_by_new_agent(world: World) -> None:
    agent_proc = world.start_agent()
    first = world.client()
    world.start(first, "j", ["sh", "-c", WAIT_GO])
    first.wait_event("j", "started")
    agent_proc.kill()
    agent_proc.wait()

    world.start_agent()
    second = world.client(sync=False)
    reply = second.request("sync", attempts=[world.sync_item("j", 0)])
    assert reply["attempts"][0]["status"] == "running"
    assert [j["juid"] for j in second.request("jobs")["jobs"]] == ["j"]
    (world.run_dir("j") / "work" / "go").touch()
    event = second.wait_exit("j")
    assert (event["code"], event["reason"], event["seq"]) == (0, "exited", 2)


def test_adopted_job_can_be_signalled(world: World) -> None:
    agent_proc = world.start_agent()
    first = world.client()
    world.start(first, "j", ["sh", "-c", "sleep 100"])
    first.wait_event("j", "started")
    agent_proc.kill()
    agent_proc.wait()

    world.start_agent()
    second = world.client(sync=False)
    second.request("sync", attempts=[world.sync_item("j", 0)])
    second.request("signal", juid="j", attempt=1, signal="TERM", grace=30)
    event = second.wait_exit("j")
    assert (event["code"], event["signal"], event["reason"]) == (143, 15, "killed")


def test_job_killed_while_agent_down_is_vanished(world: World) -> None:
    agent_proc = world.start_agent()
    first = world.client()
    world.start(first, "j", ["sh", "-c", "sleep 100"])
    first.wait_event("j", "started")
    agent_proc.kill()
    agent_proc.wait()

    pid = world.job_pid("j")
    wait_for(lambda: len(session_members(pid)) >= 2, timeout=TIMEOUT, what="the job's sleep")
    for member in session_members(pid):
        os.kill(member, signal.SIGKILL)
    wait_for(lambda: not session_members(pid), timeout=TIMEOUT, what="the job's session to be gone")
    assert world.recorded_code("j") is None

    world.start_agent()
    second = world.client(sync=False)
    reply = second.request("sync", attempts=[world.sync_item("j", 0)])
    assert reply["attempts"][0]["status"] == "exited"
    event = second.wait_exit("j")
    assert (event["code"], event["signal"], event["reason"]) == (None, None, "vanished")
    # syncing again does not record a second exit
    second.request("sync", attempts=[world.sync_item("j", 0)])
    lines = (world.run_dir("j") / "events.jsonl").read_text().splitlines()
    assert [json.loads(line)["type"] for line in lines] == ["started", "exit"]


def test_never_started_is_unknown(world: World, agent: Client) -> None:
    world.run_dir("ghost").mkdir(parents=True)
    reply = agent.request("sync", attempts=[world.sync_item("ghost"), world.sync_item("none")])
    assert [a["status"] for a in reply["attempts"]] == ["unknown", "unknown"]
    # a start for an attempt already reported as never started (sent by a core that died
    # before the sync) is refused, so the attempt the core re-queued is the only one to run
    with pytest.raises(AgentError, match="never started"):
        world.start(agent, "ghost", ["touch", "ran"])
    assert not (world.run_dir("ghost") / "events.jsonl").exists()


# ---------------------------------------------------------------- materialising


def test_unsafe_paths_refused_and_nothing_runs(world: World, agent: Client) -> None:
    digest = put_blob(world.blobs, b"x")
    for rel in ["../x", "/etc/x", "a/../../x"]:
        with pytest.raises(AgentError, match="unsafe path"):
            world.start(agent, "j", ["touch", "ran"], files=[[rel, digest, 0o644]])
    with pytest.raises(AgentError, match="missing blob"):
        world.start(agent, "j", ["touch", "ran"], files=[["a", "ab" + "0" * 62, 0o644]])
    with pytest.raises(AgentError, match="bad digest"):
        world.start(agent, "j", ["touch", "ran"], files=[["a", "../../etc", 0o644]])
    assert not (world.run_dir("j") / "events.jsonl").exists()
    assert not (world.tmp / "runs" / "x").exists() and not (world.tmp / "x").exists()
    assert agent.request("jobs")["jobs"] == []
    # the same request with a safe path then works
    world.start(agent, "j", ["true"], files=[["sub/x", digest, 0o644]])
    assert agent.wait_exit("j")["code"] == 0


def test_files_are_private_copies(world: World, agent: Client) -> None:
    script = (
        b"#!/bin/sh\ncat data/input.txt\necho changed >> data/input.txt\nstat -c '%a %i' run.sh\n"
    )
    run_digest = put_blob(world.blobs, script)
    data_digest = put_blob(world.blobs, b"original\n")
    files = [["run.sh", run_digest, 0o755], ["data/input.txt", data_digest, 0o644]]
    world.start(agent, "j", ["./run.sh"], files=files)
    assert agent.wait_exit("j")["code"] == 0
    work = world.run_dir("j") / "work"
    first, mode_ino = (world.run_dir("j") / "stdout.log").read_text().splitlines()
    assert first == "original"
    blob = world.blobs / data_digest[:2] / data_digest[2:]
    assert blob.read_bytes() == b"original\n"
    mode, ino = mode_ino.split()
    assert (
        mode == "755" and int(ino) != (world.blobs / run_digest[:2] / run_digest[2:]).stat().st_ino
    )
    # At the end the code copy is reclaimed; the file the job changed stays.
    wait_for(
        lambda: not (world.run_dir("j") / "code.json").exists(),
        what="the code copy to be reclaimed",
    )
    assert not (work / "run.sh").exists()
    assert (work / "data" / "input.txt").read_text() == "original\nchanged\n"


def test_datasets_materialised_once_and_exposed(world: World, agent: Client) -> None:
    a = put_blob(world.blobs, b"aaa\n")
    b = put_blob(world.blobs, b"bbb\n")
    multi = {
        "digest": "d" * 64,
        "env": "MONKEY_DATASET_TRAIN",
        "single": False,
        "files": [["x/a.txt", a, 0o644], ["b.txt", b, 0o644]],
    }
    single = {
        "digest": "e" * 64,
        "env": "MONKEY_DATASET_ONE",
        "single": True,
        "files": [["only.csv", b, 0o644]],
    }
    script = (
        'echo "$MONKEY_DATASET_TRAIN"; cat "$MONKEY_DATASET_TRAIN/x/a.txt" "$MONKEY_DATASET_ONE"'
    )
    world.start(agent, "j1", ["sh", "-c", script], datasets=[multi, single])
    assert agent.wait_exit("j1")["code"] == 0
    folder = world.root / "datasets" / ("d" * 64)
    out = (world.run_dir("j1") / "stdout.log").read_text()
    assert out == f"{folder}\naaa\nbbb\n"
    inode = folder.stat().st_ino
    marker = (folder / "b.txt").stat().st_mtime_ns

    world.start(agent, "j2", ["sh", "-c", script], datasets=[multi, single])
    assert agent.wait_exit("j2")["code"] == 0
    assert (world.run_dir("j2") / "stdout.log").read_text() == out
    assert folder.stat().st_ino == inode and (folder / "b.txt").stat().st_mtime_ns == marker
    assert sorted(p.name for p in (world.root / "datasets").iterdir() if p.is_dir()) == [
        "d" * 64,
        "e" * 64,
    ]  # built once each, no temporary folders left
    assert not os.access(folder / "b.txt", os.W_OK) or os.getuid() == 0  # shared: read-only
    assert folder.stat().st_mode & 0o777 == 0o555


def manifest_digest(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


def test_code_list_cached_then_named_by_manifest(world: World, agent: Client) -> None:
    a, b = put_blob(world.blobs, b"aaa\n"), put_blob(world.blobs, b"bbb\n")
    files = [["sub/b.txt", b, 0o644], ["a.txt", a, 0o755]]
    m1 = manifest_digest("m1")
    world.start(agent, "j1", ["cat", "a.txt", "sub/b.txt"], files=files, manifest=m1)
    assert agent.wait_exit("j1")["code"] == 0
    cached = world.root / "manifests" / f"{m1}.json"
    assert cached.read_text() == json.dumps(sorted(files), separators=(",", ":"))
    world.start(
        agent, "j2", ["sh", "-c", "cat a.txt sub/b.txt; stat -c %a a.txt"], files=None, manifest=m1
    )
    assert agent.wait_exit("j2")["code"] == 0
    assert (world.run_dir("j2") / "stdout.log").read_text() == "aaa\nbbb\n755\n"


def test_code_list_as_a_delta(world: World, agent: Client) -> None:
    a, b, c = (put_blob(world.blobs, x) for x in (b"a1\n", b"b\n", b"c\n"))
    a2, d = put_blob(world.blobs, b"a2\n"), put_blob(world.blobs, b"d\n")
    m1, m2 = manifest_digest("m1"), manifest_digest("m2")
    files = [["a.txt", a, 0o644], ["b.txt", b, 0o644], ["sub/c.txt", c, 0o644]]
    world.start(agent, "j1", ["true"], files=files, manifest=m1)
    assert agent.wait_exit("j1")["code"] == 0
    world.start(
        agent,
        "j2",
        [
            "sh",
            "-c",
            "find . -type f | sort; find . -type f | sort | xargs cat; stat -c %a d/d.txt",
        ],
        files=None,
        manifest=m2,
        base=m1,
        removed=["b.txt"],
        changes=[["a.txt", a2, 0o644], ["d/d.txt", d, 0o600]],
    )
    assert agent.wait_exit("j2")["code"] == 0
    assert (world.run_dir("j2") / "stdout.log").read_text() == (
        "./a.txt\n./d/d.txt\n./sub/c.txt\na2\nd\nc\n600\n"
    )
    cached = json.loads((world.root / "manifests" / f"{m2}.json").read_text())
    assert cached == [["a.txt", a2, 0o644], ["d/d.txt", d, 0o600], ["sub/c.txt", c, 0o644]]
    # the list built from the delta is itself a base
    world.start(agent, "j3", ["cat", "a.txt"], files=None, manifest=m2)
    assert agent.wait_exit("j3")["code"] == 0


def test_unknown_manifest_refused_and_nothing_runs(world: World, agent: Client) -> None:
    a = put_blob(world.blobs, b"a\n")
    known, unknown = manifest_digest("known"), manifest_digest("unknown")
    world.start(agent, "j0", ["true"], files=[["a.txt", a, 0o644]], manifest=known)
    agent.wait_exit("j0")
    for fields in (
        {"manifest": unknown},
        {"manifest": manifest_digest("new"), "base": unknown, "changes": [], "removed": ["a.txt"]},
    ):
        with pytest.raises(AgentError, match="unknown manifest"):
            world.start(agent, "j", ["touch", "ran"], files=None, **fields)
    assert not world.run_dir("j").exists()
    assert not (world.root / "manifests" / f"{manifest_digest('new')}.json").exists()
    assert agent.request("jobs")["jobs"] == [] and agent.events("j") == []


def test_unsafe_paths_in_a_delta_refused(world: World, agent: Client) -> None:
    a = put_blob(world.blobs, b"a\n")
    base, new = manifest_digest("base"), manifest_digest("new")
    world.start(agent, "j0", ["true"], files=[["a.txt", a, 0o644]], manifest=base)
    agent.wait_exit("j0")
    for delta in (
        {"changes": [["../x", a, 0o644]], "removed": []},
        {"changes": [["/tmp/x", a, 0o644]], "removed": []},
        {"changes": [], "removed": ["a/../../x"]},
        {"changes": [["b.txt", "../../etc", 0o644]], "removed": []},
    ):
        with pytest.raises(AgentError, match="unsafe path|bad digest"):
            world.start(agent, "j", ["touch", "ran"], files=None, manifest=new, base=base, **delta)
    assert not world.run_dir("j").exists()
    assert not (world.root / "manifests" / f"{new}.json").exists()
    assert agent.request("jobs")["jobs"] == []


# ---------------------------------------------------------------- the agent process


def test_hello(world: World, agent: Client) -> None:
    reply = agent.request("hello")
    assert reply["version"] == "1" and reply["root"] == str(world.root)
    assert reply["cpus"] == os.cpu_count() and reply["memory"] > 0
    assert isinstance(reply["gpus"], list)
    assert int((world.root / "private" / "agent.pid").read_text()) == reply["pid"]
    assert (world.root / "private").stat().st_mode & 0o777 == 0o700
    assert os.stat(world.socket).st_mode & 0o777 == 0o600


def test_bad_requests_do_not_break_the_agent(world: World, agent: Client) -> None:
    with pytest.raises(AgentError, match="unknown op"):
        agent.request("fly")
    with pytest.raises(AgentError):
        agent.request("start", juid="j")
    for bad in ({"slots": 0}, {"slots": "2"}, {"cpus": 0}):  # nothing would ever fit
        with pytest.raises(AgentError, match="slots and cpus must be positive integers"):
            world.start(agent, "j", ["true"], **bad)
    assert not world.run_dir("j").exists()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(world.socket)
    sock.sendall(b"this is not json\n[1, 2]\n")
    raw = AgentLink(sock)
    assert raw.request("hello")["version"] == "1"
    raw.close()
    assert agent.request("hello")["version"] == "1"


def test_failed_requests_are_logged_without_their_content(world: World, agent: Client) -> None:
    """A start request carries the job's env (secrets included): agent.log names the op
    and the error of a request that fails, never the request itself."""
    secret = "hunter2-in-a-bad-request"
    with pytest.raises(AgentError, match="bad request"):
        agent.request("start", env={"DB_PASS": secret})  # no juid
    with pytest.raises(AgentError):
        agent.request(
            "start",
            env=[f"DB_PASS={secret}"],
            juid="j",
            attempt=1,
            run_dir=str(world.run_dir("j")),
            argv=["true"],
        )  # env not a mapping
    assert agent.request("hello")["version"] == "1"
    log = world.log()
    assert log.count("(op 'start')") == 2
    assert secret not in log


def test_second_agent_on_same_root_exits(world: World, agent: Client) -> None:
    other_socket = str(world.sockdir / "other.sock")
    second = world.spawn(socket_path=other_socket)
    assert second.wait(timeout=TIMEOUT) == 0
    assert not os.path.exists(other_socket)
    assert agent.request("hello")["pid"] == world.procs[0].pid


def test_connection_from_other_uid_refused(world: World) -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to connect as another user")
    os.chmod(world.sockdir, 0o755)
    world.start_agent()
    os.chmod(world.socket, 0o666)  # let the file mode through: the peer check must still refuse
    assert connect_as(65534, world.socket) == "closed"
    assert "refused a connection from uid 65534" in world.log()
    assert world.client().request("hello")["version"] == "1"


def test_heartbeats(world: World) -> None:
    world.start_agent("--heartbeat", "0.2")
    client = world.client()
    world.start(client, "j", ["sh", "-c", WAIT_GO])
    beats = client.wait_event("j", "heartbeat", count=3)
    for beat in beats:
        event = beat["event"]
        assert event["rss"] > 0 and event["cpu"] >= 0 and event["procs"] >= 1
    seqs = [p["event"]["seq"] for p in client.events("j")]
    assert seqs == list(range(1, len(seqs) + 1))
    (world.run_dir("j") / "work" / "go").touch()
    assert client.wait_exit("j")["code"] == 0


def test_sigterm_stops_agent_but_not_jobs(world: World) -> None:
    agent_proc = world.start_agent()
    client = world.client()
    world.start(client, "j", ["sh", "-c", f"{WAIT_GO}; exit 4"])
    agent_proc.send_signal(signal.SIGTERM)
    assert agent_proc.wait(timeout=TIMEOUT) == 0
    assert not os.path.exists(world.socket)
    assert not (world.root / "private" / "agent.pid").exists()
    assert alive(world.job_pid("j"))
    (world.run_dir("j") / "work" / "go").touch()
    wait_for(lambda: world.recorded_code("j"), timeout=TIMEOUT, what="the recorded exit code")
    assert world.recorded_code("j") == "4"


def test_idle_agent_exits(world: World) -> None:
    agent_proc = world.start_agent("--idle-timeout", "0.3")
    assert agent_proc.wait(timeout=TIMEOUT) == 0
    assert not os.path.exists(world.socket)
    assert not (world.root / "private" / "agent.pid").exists()


def test_shutdown_if_idle(world: World) -> None:
    agent_proc = world.start_agent()
    client = world.client()
    world.start(client, "j", ["sh", "-c", WAIT_GO])
    assert client.request("shutdown", if_idle=True)["stopping"] is False
    (world.run_dir("j") / "work" / "go").touch()
    client.wait_exit("j")
    assert client.request("shutdown", if_idle=True)["stopping"] is True
    assert agent_proc.wait(timeout=TIMEOUT) == 0


def test_many_trivial_jobs_two_at_a_time(world: World, agent: Client) -> None:
    total, in_flight, started = 200, set(), 0
    exits: dict[str, dict[str, Any]] = {}
    begin = time.monotonic()
    while len(exits) < total:
        while len(in_flight) < 2 and started < total:
            juid = f"t{started}"
            world.start(agent, juid, ["true"])
            in_flight.add(juid)
            started += 1
        select.select([agent.link], [], [], 1.0)
        for push in agent.link.poll():
            if push["event"]["type"] == "exit":
                exits[push["juid"]] = push["event"]
                in_flight.discard(push["juid"])
        assert time.monotonic() - begin < 120, "jobs stopped making progress"
    assert all(e["code"] == 0 and e["reason"] == "exited" for e in exits.values())
    print(f"\n{total} trivial jobs in {time.monotonic() - begin:.2f} s")


# ---------------------------------------------------------------- starts held for a slot


def send_start(world: World, client: Client, juid: str, argv: list[str], slots: int = 1) -> int:
    """Send a start carrying the worker's SLOTS without waiting; its request id."""
    return client.link.send(
        "start",
        juid=juid,
        attempt=1,
        run_dir=str(world.run_dir(juid)),
        argv=argv,
        env={},
        files=[],
        blobs_dir=str(world.blobs),
        datasets=[],
        slots=slots,
        cpus=1,
    )


def claim(world: World, juid: str) -> bytes | None:
    path = world.run_dir(juid) / "started"
    return path.read_bytes() if path.exists() else None


def test_starts_beyond_the_slots_are_held_and_run_in_order(world: World, agent: Client) -> None:
    go, order = world.tmp / "go", world.tmp / "order"
    first = send_start(
        world,
        agent,
        "a",
        ["sh", "-c", f"while [ ! -e {go} ]; do sleep 0.02; done; echo a >> {order}"],
    )
    assert agent.wait_reply(first)["ok"]
    held = [send_start(world, agent, j, ["sh", "-c", f"echo {j} >> {order}"]) for j in ("b", "c")]
    time.sleep(0.5)
    agent.collect()
    # one slot: b and c wait, prepared but unclaimed, and nothing answered them yet
    assert claim(world, "b") is None and claim(world, "c") is None
    assert (world.run_dir("b") / "work").is_dir()
    assert not [r for r in agent.replies if r["id"] in held]
    go.touch()
    assert all(agent.wait_reply(rid)["ok"] for rid in held)
    for juid in "abc":
        assert agent.wait_exit(juid)["code"] == 0
    assert order.read_text().split() == ["a", "b", "c"]


def test_held_start_is_withdrawn_when_no_slot_frees(tmp_path: Path) -> None:
    w = World(tmp_path)
    os.environ["MONKEY_HOLD_LIMIT"] = "1"
    try:
        w.start_agent()
    finally:
        del os.environ["MONKEY_HOLD_LIMIT"]
    try:
        client = w.client()
        assert client.wait_reply(send_start(w, client, "long", ["sleep", "30"]))["ok"]
        begin = time.monotonic()
        reply = client.wait_reply(send_start(w, client, "late", ["touch", "ran"]))
        assert not reply["ok"] and reply["withdrawn"], reply
        assert "no slot freed within 1s" in reply["error"]
        assert 0.9 < time.monotonic() - begin < 10
        assert claim(w, "late") == b"abandoned\n"  # no later start can run it
        with pytest.raises(AgentError, match="never started"):
            w.start(client, "late", ["touch", "ran"])
        assert not (w.run_dir("late") / "work" / "ran").exists()
    finally:
        w.teardown()


def test_signal_withdraws_a_held_start(world: World, agent: Client) -> None:
    assert agent.wait_reply(send_start(world, agent, "long", ["sleep", "30"]))["ok"]
    rid = send_start(world, agent, "held", ["touch", "ran"])
    time.sleep(0.2)
    assert agent.request("signal", juid="held", attempt=1, signal="TERM")["running"] is False
    reply = agent.wait_reply(rid)
    assert not reply["ok"] and reply["withdrawn"] and "signalled TERM" in reply["error"]
    assert claim(world, "held") == b"abandoned\n"
    agent.request("signal", juid="long", attempt=1, signal="KILL")
    agent.wait_exit("long")
    time.sleep(0.3)  # the freed slot starts nothing
    assert not (world.run_dir("held") / "work" / "ran").exists()


def test_a_sync_naming_a_held_start_withdraws_it(world: World, agent: Client) -> None:
    assert agent.wait_reply(send_start(world, agent, "long", ["sleep", "30"]))["ok"]
    rid = send_start(world, agent, "held", ["touch", "ran"])
    time.sleep(0.2)
    # a core that reconnects lists its live attempts: the held one is reported never
    # started, and the first connection is told it was withdrawn
    other = world.client(sync=False)
    reply = other.request("sync", attempts=[world.sync_item("long"), world.sync_item("held")])
    assert [a["status"] for a in reply["attempts"]] == ["running", "unknown"]
    assert agent.wait_reply(rid)["withdrawn"]
    assert claim(world, "held") == b"abandoned\n"


def test_big_request_and_backlog_with_a_slow_client(world: World, agent: Client) -> None:
    # a start request of ~400 kB (many reads on the agent's side)
    digest = put_blob(world.blobs, b"x")
    files = [[f"d{i % 7}/{'f' * 120}{i}", digest, 0o644] for i in range(2000)]
    world.start(agent, "big", ["sh", "-c", "ls d*/ | wc -l"], files=files)
    assert agent.wait_exit("big")["code"] == 0
    assert int((world.run_dir("big") / "stdout.log").read_text().split()[-1]) >= 2000

    # a 4 MB backlog for a client that does not read: the agent keeps serving others
    run = world.run_dir("old")
    run.mkdir(parents=True)
    lines = [
        json.dumps({"seq": i, "ts": 0.0, "type": "heartbeat", "pad": "p" * 150}) + "\n"
        for i in range(1, 25001)
    ]
    (run / "events.jsonl").write_text("".join(lines))
    slow = world.client(sync=False)
    assert (
        slow.request("sync", attempts=[world.sync_item("old")])["attempts"][0]["status"]
        == "unknown"
    )
    for _ in range(5):
        assert agent.request("hello", timeout=5)["version"] == "1"
    pushes = slow.wait_event("old", "heartbeat", count=len(lines))
    assert [p["event"]["seq"] for p in pushes] == list(range(1, len(lines) + 1))
    assert pushes[-1]["offset"] == (run / "events.jsonl").stat().st_size


def test_an_armed_agent_powers_off_only_once_idle_and_unspoken_to(world: World) -> None:
    """Armed by its core (a cloud instance monkey created), the agent runs the shutdown
    command once it has had no job and no request for `orphan_timeout` — an open link that
    says nothing (a core on a laptop that sleeps) is no contact — and logs why; it does not
    exit when idle meanwhile. A running job keeps the machine up however long it runs."""
    mark, gate, ran = world.tmp / "powered-off", world.tmp / "gate", world.tmp / "ran"
    proc = world.start_agent("--idle-timeout", "0.2")
    client = world.client(sync=False)
    client.request("sync", attempts=[], orphan={"timeout": 1, "command": f"echo bye >> {mark}"})
    world.start(
        client,
        "j1",
        ["sh", "-c", f"sleep 3; touch {ran}; while [ ! -e {gate} ]; do sleep 0.05; done"],
    )
    wait_for(ran.exists, timeout=TIMEOUT, what="the job to run past the orphan timeout")
    assert not mark.exists() and proc.poll() is None
    gate.touch()
    client.wait_exit("j1")
    client.request("ping", attempts=[])  # the core fetched it (until then, the machine stays)
    wait_for(  # `echo bye >> FILE` makes the file, then writes to it
        lambda: mark.exists() and mark.read_text() == "bye\n",
        timeout=TIMEOUT,
        what="the shutdown command",
    )
    assert proc.poll() is None  # it stays: the machine goes
    assert (
        "(orphan_timeout 1s): powering the machine off so that its cloud terminates it: echo bye"
        in world.log()
    )
    wait_for(  # logged once the command has exited, a moment after its file appeared
        lambda: "the shutdown command succeeded" in world.log(),
        timeout=TIMEOUT,
        what="the command's success in agent.log",
    )


def test_an_armed_agent_idle_past_its_idle_timeout_waits_without_spinning(world: World) -> None:
    """Armed, an agent idle past --idle-timeout stays (the orphan watch decides); it then
    sleeps until its next deadline, not in a loop that wakes at once (it took a whole CPU
    of every idle cloud machine until its orphan timeout)."""
    proc = world.start_agent("--idle-timeout", "0.2")
    client = world.client(sync=False)
    client.request("sync", attempts=[], orphan={"timeout": 600, "command": "true"})
    client.link.close()
    time.sleep(1)  # idle past its idle timeout, no link open
    ticks = os.sysconf("SC_CLK_TCK")

    def cpu() -> float:
        fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / ticks  # utime + stime

    before = cpu()
    time.sleep(2)
    assert proc.poll() is None  # it stays
    assert cpu() - before < 0.5  # a spinning loop takes the whole 2 s


def test_a_failed_shutdown_command_is_logged_and_a_request_is_contact(world: World) -> None:
    mark = world.tmp / "tried"
    world.start_agent()
    client = world.client(sync=False)
    with pytest.raises(AgentError, match="orphan timeout must be a number of seconds"):
        client.request("sync", attempts=[], orphan={"timeout": "soon"})
    client.request(
        "ping", orphan={"timeout": 0.5, "command": f"touch {mark}; echo no rights >&2; exit 4"}
    )
    wait_for(mark.exists, timeout=TIMEOUT, what="the shutdown command")
    wait_for(
        lambda: "the shutdown command exited 4: no rights; trying again in 300s" in world.log(),
        timeout=TIMEOUT,
        what="the failure in agent.log",
    )


@pytest.mark.skipif(not CGROUP2, reason="needs a cgroup2 mount")
def test_a_vanished_cgroup_folder_is_made_again(world: World) -> None:
    """The agent's cgroup folder removed from outside while no job runs (its kept empty
    cgroups too): the next job still runs in a cgroup of its own, and agent.log says so."""
    world.start_agent()
    agent = world.client()
    world.start(agent, "first", ["true"])
    agent.wait_exit("first")
    first = json.loads((world.run_dir("first") / "events.jsonl").read_text().splitlines()[0])[
        "cgroup"
    ]
    if not first:
        pytest.skip("the kernel lets this agent make no cgroups")
    base = Path(first).parent
    for kept in base.iterdir():
        if kept.is_dir():
            kept.rmdir()
    base.rmdir()
    world.start(agent, "next", ["sh", "-c", "touch in; " + WAIT_GO])
    wait_for((world.run_dir("next") / "work" / "in").exists, timeout=TIMEOUT, what="the job")
    group = (
        Path("/proc", str(world.job_pid("next")), "cgroup")
        .read_text()
        .splitlines()[-1]
        .partition("::")[2]
    )
    assert Path(CGROUP2, group.lstrip("/")).parent == base and base.is_dir()
    assert f"the cgroup folder {base} vanished; made it again" in world.log()
    (world.run_dir("next") / "work" / "go").touch()
    assert agent.wait_exit("next")["code"] == 0
