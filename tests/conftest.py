"""Fixtures: a private MONKEY_HOME per test, the real CLI (in the test's process, or in a
subprocess), and clean-up of every process (core, agent, jobs) the test started.

Every test is marked `unit` or `system` here (`pytest -m unit` is the fast inner loop): a
test is `system` when it uses a fixture that starts real services (`SYSTEM_FIXTURES`) or is
marked `system` itself (a module's `pytestmark`, or a parameter's `marks`) because it starts
a core, an agent or the CLI in a subprocess without such a fixture; the rest are `unit`."""

from __future__ import annotations

import contextlib
import gc
import io
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]


# Fixtures that start a core, an agent, sshd, moto, Slurm, a fake cloud's servers, a main
# node (`node`) or Chromium (`browser`), or run the CLI (`cli`, `monkey`: their submissions
# start a core). A test using any of them, directly or through another fixture, is `system`.
SYSTEM_FIXTURES = frozenset(
    {
        "cli",
        "monkey",
        "moto",
        "moto_server",
        "slurm",
        "slurm_cluster",
        "gce",
        "gcs_server",
        "lab",
        "fleet",
        "world",
        "node",
        "browser",
    }
)


# The modules whose tests take longest (in a parallel run's --durations: EC2's 170 s in all,
# the web pages' 100 s, a storm 95 s, Slurm's group 100 s, mypy 45 s in one test), in the
# order xdist hands them out first: started last, one would run on alone at the end of a run.
LONGEST_FIRST = (
    "test_ec2.py",
    "test_slurm.py",
    "test_slurm_login.py",
    "test_absence_storm.py",
    "test_upgrade.py",
    "test_gc_storm.py",
    "test_types.py",
    "test_web.py",
    "test_spot_more.py",
    "test_gce.py",
    "test_remote_commands.py",
    "test_gce_spot.py",
    "test_web_job.py",
    "test_ssh.py",
    "test_documented_commands.py",
    "test_tui.py",
    "test_absence.py",
    "test_web_sweep.py",
    "test_gc_race.py",
    "test_spot.py",
    "test_ec2_setup.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test `system` (by its fixtures or its own marker) or else `unit`; under
    xdist (`-n N --dist loadgroup`), the tests of the session's single Slurm go to one worker
    and the longest modules' go out first (`LONGEST_FIRST`)."""
    xdist = config.pluginmanager.hasplugin("xdist")
    if hasattr(config, "workerinput"):  # an xdist worker: the controller hands out in its order
        rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
        items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: else as found
    for item in items:
        if item.get_closest_marker("system") is None:
            if SYSTEM_FIXTURES.isdisjoint(getattr(item, "fixturenames", ())):
                item.add_marker(pytest.mark.unit)
                continue
            item.add_marker(pytest.mark.system)
        if xdist and "slurm_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("slurm"))  # one Slurm, on one worker


@pytest.hookimpl(tryfirst=True)
def pytest_fixture_setup(
    fixturedef: pytest.FixtureDef[object], request: pytest.FixtureRequest
) -> None:
    """A `unit` test that reaches a system fixture at run time (`request.getfixturevalue`)
    fails at once: it should be marked `system` (a parameter's `marks=` for a parametrised
    fixture)."""
    if fixturedef.argname in SYSTEM_FIXTURES and request.node.get_closest_marker("unit"):
        pytest.fail(
            f"{request.node.nodeid} is marked unit but uses the fixture "
            f"`{fixturedef.argname}`: mark it `@pytest.mark.system`",
            pytrace=False,
        )


def wait_for(
    predicate: Callable[[], object],
    timeout: float = 30.0,
    every: float = 0.02,
    what: str = "condition",
) -> object:
    """Poll until ``predicate()`` is truthy; fail the test after ``timeout`` seconds. The pause
    starts at EVERY and grows to 0.2 s, and is never shorter than the predicate took: a
    predicate running the CLI in this process would otherwise take a core from the processes
    it waits for."""
    deadline = time.monotonic() + timeout
    pause, longest = every, max(every, 0.2)
    while True:
        started = time.monotonic()
        value = predicate()
        if value:
            return value
        now = time.monotonic()
        if now > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(max(pause, now - started))
        pause = min(pause * 1.5, longest)


def processes_with_env(marker: str) -> list[int]:
    """PIDs of processes whose environment contains ``marker`` (e.g. MONKEY_HOME=...)."""
    needle = marker.encode() + b"\0"
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if needle in fh.read() + b"\0":
                    found.append(int(entry))
        except OSError:
            continue
    return found


def kill_until_gone(find: Callable[[], list[int]], tries: int = 50) -> None:
    """SIGKILL what ``find()`` lists until it lists nothing (children may appear late)."""
    for _ in range(tries):
        pids = find()
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


def kill_all(marker: str) -> None:
    """Kill every process whose environment contains ``marker``."""
    kill_until_gone(lambda: processes_with_env(marker))


_CGROUPS = pytest.StashKey[tuple[str | None, set[str]]]()  # the cgroup parent, its children before


def _on_controller(config: pytest.Config) -> bool:
    """True in the process that runs the session: the only one without xdist, xdist's
    controller with it (its workers run the tests)."""
    return not hasattr(config, "workerinput")


def pytest_sessionstart(session: pytest.Session) -> None:
    """Note the job cgroups that exist before the session (see `pytest_sessionfinish`) and
    the machine's busy CPU time (the run's is printed at its end)."""
    if _on_controller(session.config):
        session.config.stash[_STARTED_BUSY] = machine_busy_seconds()
        from monkey.client_agent.procs import cgroup2_self

        parent = cgroup2_self()
        session.config.stash[_CGROUPS] = (parent, set(os.listdir(parent)) if parent else set())


_BUSY = pytest.StashKey[dict[str, float]]()  # test id -> machine CPU seconds while it ran
_STARTED_BUSY = pytest.StashKey[float]()  # the machine's busy CPU seconds when the run began


def machine_busy_seconds() -> float:
    """CPU seconds every core of this machine has spent busy since boot (/proc/stat: all
    but idle and iowait), whoever spent them: a test's daemons and browsers count too."""
    with open("/proc/stat") as fh:
        fields = [int(v) for v in fh.readline().split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    """Note the machine CPU each test took (serial runs only: under xdist tests overlap)."""
    if item.config.pluginmanager.hasplugin("xdist") and item.config.getoption("numprocesses"):
        yield
        return
    before = machine_busy_seconds()
    yield
    item.config.stash.setdefault(_BUSY, {})[item.nodeid] = machine_busy_seconds() - before


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """After --durations' wall times, the tests that kept the machine busiest: where the
    suite's CPU goes (it bounds how fast any number of workers can run it)."""
    busy = config.stash.get(_BUSY, {})
    if not busy:  # under xdist: the whole run's, from the controller
        if _STARTED_BUSY in config.stash:
            spent = machine_busy_seconds() - config.stash[_STARTED_BUSY]
            terminalreporter.write_sep("=", f"machine CPU: {spent:.0f} s in all")
        return
    terminalreporter.write_sep("=", f"machine CPU: {sum(busy.values()):.0f} s in all; busiest 15")
    for nodeid, seconds in sorted(busy.items(), key=lambda kv: -kv[1])[:15]:
        terminalreporter.write_line(f"{seconds:7.2f}s cpu {nodeid}")


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Remove the job cgroups that agents this session killed left behind (an agent removes
    its own when it stops; a SIGKILLed one cannot). Done once, when every test has ended:
    under xdist by the controller, not by a worker while others still run agents."""
    parent, before = session.config.stash.get(_CGROUPS, (None, set()))
    if parent is None:
        return
    for name in set(os.listdir(parent)) - before:
        base = os.path.join(parent, name)
        if name.startswith("monkey-") and os.path.isdir(base):
            for child in os.listdir(base):
                if os.path.isdir(os.path.join(base, child)):
                    with contextlib.suppress(OSError):  # processes still there
                        os.rmdir(os.path.join(base, child))
            with contextlib.suppress(OSError):
                os.rmdir(base)


# What rich, Textual, cmd2/prompt_toolkit, argparse and shutil.get_terminal_size read of the
# terminal: a test sees none of the caller's (an xdist worker or a developer's shell may set
# COLUMNS), so its output depends on neither the order of tests nor the process running them.
TERMINAL_VARIABLES = (
    "COLUMNS",
    "LINES",
    "ROWS",
    "JUPYTER_COLUMNS",
    "JUPYTER_LINES",
    "COLORTERM",
    "NO_COLOR",
    "FORCE_COLOR",
    "CLICOLOR",
    "CLICOLOR_FORCE",
    "PY_COLORS",
    "TTY_COMPATIBLE",
    "TTY_INTERACTIVE",
    "TERM_PROGRAM",
    "TERM_PROGRAM_VERSION",
    "LC_TERMINAL",
    "VTE_VERSION",
    "ESCDELAY",
    "PROMPT_TOOLKIT_COLOR_DEPTH",
    "PROMPT_TOOLKIT_NO_CPR",
    "DATABRICKS_RUNTIME_VERSION",
)


def plain_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Clear the terminal variables and Textual's settings (TEXTUAL_*, not the snapshot
    plugin's TEXTUAL_SNAPSHOT_*, which it sets for the session); TERM is always xterm."""
    for name in TERMINAL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name in list(os.environ):
        if name == "TEXTUAL" or (
            name.startswith("TEXTUAL_") and not name.startswith("TEXTUAL_SNAPSHOT")
        ):
            monkeypatch.delenv(name)
    monkeypatch.setenv("TERM", "xterm")


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh MONKEY_HOME; everything started under it is killed afterwards."""
    root = tmp_path / "mh"
    monkeypatch.setenv("MONKEY_HOME", str(root))
    monkeypatch.setenv("MONKEY_HEARTBEAT", "0.5")
    monkeypatch.setenv("MONKEY_KILL_GRACE", "3")
    monkeypatch.setenv("MONKEY_AGENT_IDLE_TIMEOUT", "60")
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    plain_terminal(monkeypatch)
    work = tmp_path / "project"
    work.mkdir()
    monkeypatch.chdir(work)
    yield root
    kill_all(f"MONKEY_HOME={root}")


def _captured(stream: io.TextIOWrapper) -> str:
    """What a subprocess's captured ``text=True`` stream would read: UTF-8, universal newlines."""
    stream.flush()
    data = stream.buffer.getvalue()  # type: ignore[attr-defined]
    return data.decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")


# Python's default warning filters, first match first (`python -W` and PYTHONWARNINGS unset).
_DEFAULT_WARNINGS = (
    ("default", DeprecationWarning),
    ("ignore", DeprecationWarning),
    ("ignore", PendingDeprecationWarning),
    ("ignore", ImportWarning),
    ("ignore", ResourceWarning),
)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ANN001
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


class _ThreadStream:
    """The command's stream for the threads of the command, and the old one for threads that
    ran before it (a test's servers: their tracebacks are not the command's output)."""

    def __init__(self, mine: io.TextIOWrapper, theirs: object, others: set[int | None]) -> None:
        self._mine, self._theirs, self._others = mine, theirs, others

    def _target(self) -> Any:
        return self._theirs if threading.get_ident() in self._others else self._mine

    def write(self, text: str) -> int:
        return self._target().write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target(), name)


def run_cli_in_process(
    args: list[str], input: str | None = None
) -> subprocess.CompletedProcess[str]:
    """`monkey ARGS` run by this process's `monkey.shell.cli.main`, seen as its subprocess
    would be: its own stdin (INPUT, else empty), stdout, stderr, exit status, traceback on an
    uncaught error, logging's last-resort warnings and Python's default warning filters, what
    it leaves open closed when it returns; the environment, folder, umask, argv and logging
    handlers it changes are put back after."""
    from monkey.shell.cli import main

    saved_env, saved_cwd, saved_argv = dict(os.environ), os.getcwd(), sys.argv
    saved_streams = sys.stdin, sys.stdout, sys.stderr
    umask = os.umask(0o022)
    os.umask(umask)
    loggers = {
        name: logger
        for name, logger in logging.Logger.manager.loggerDict.items()
        if isinstance(logger, logging.Logger)
    }
    saved_handlers = {name: list(logger.handlers) for name, logger in loggers.items()}
    root = logging.getLogger()
    root_handlers = list(root.handlers)
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict", write_through=True)
    err = io.TextIOWrapper(
        io.BytesIO(), encoding="utf-8", errors="backslashreplace", write_through=True
    )
    sys.stdin = io.TextIOWrapper(io.BytesIO((input or "").encode()), encoding="utf-8")
    others = {t.ident for t in threading.enumerate()} - {threading.get_ident()}
    sys.stdout = _ThreadStream(out, saved_streams[1], others)  # type: ignore[assignment]
    sys.stderr = _ThreadStream(err, saved_streams[2], others)  # type: ignore[assignment]
    sys.argv = [str(REPO / "monkey" / "__main__.py"), *args]
    root.handlers = []  # no pytest capture: warnings go to stderr, as in a fresh interpreter
    try:
        with warnings.catch_warnings():
            warnings.resetwarnings()
            for action, category in reversed(_DEFAULT_WARNINGS):  # each goes in front
                warnings.filterwarnings(
                    action, category=category, module="__main__" if action == "default" else ""
                )
            warnings.showwarning = _show_warning
            # Close what the command leaves open (its database), as its exit would: a
            # collection of what it made. What this process held before is frozen meanwhile:
            # a full collection of a worker's heap (Textual, boto3, moto...) took 0.1-0.5 s
            # per command, most of the CPU a test process used.
            gc.freeze()
            try:
                code = main(list(args))
            except SystemExit as exc:
                code = exc.code
            except Exception:
                traceback.print_exc()
                code = 1
            finally:
                gc.collect()
                gc.unfreeze()
            if code is None:
                code = 0
            elif not isinstance(code, int):
                print(code, file=sys.stderr)
                code = 1
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved_streams
        sys.argv = saved_argv
        os.chdir(saved_cwd)
        os.umask(umask)
        os.environ.clear()
        os.environ.update(saved_env)
        root.handlers = root_handlers
        for name, logger in logging.Logger.manager.loggerDict.items():
            if isinstance(logger, logging.Logger) and name != "root":
                logger.handlers = saved_handlers.get(name, [])
    return subprocess.CompletedProcess(
        [sys.executable, "-m", "monkey", *args], code, _captured(out), _captured(err)
    )


@pytest.fixture
def cli(home: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run `monkey ARGS` as a user would: in this process (`run_cli_in_process`), or in a
    subprocess through the entry point (`python -m monkey`) with PROCESS and for the commands
    that are a process of their own (the shell, `daemon run`)."""

    def run(
        *args: str,
        timeout: float = 120,
        check: bool = False,
        input: str | None = None,
        process: bool = False,
    ) -> subprocess.CompletedProcess[str]:
        if process or not args or list(args[:2]) == ["daemon", "run"]:  # the shell, the core
            proc = subprocess.run(
                [sys.executable, "-m", "monkey", *args],
                capture_output=True,
                text=True,
                timeout=timeout,
                input=input,
                env=os.environ.copy(),
            )
        else:
            proc = run_cli_in_process(list(args), input)
        if check and proc.returncode != 0:
            raise AssertionError(f"monkey {' '.join(args)} exited {proc.returncode}: {proc.stderr}")
        return proc

    return run


@pytest.fixture
def monkey(home: Path):
    """The Python API over the test's MONKEY_HOME."""
    from monkey.api import Monkey

    m = Monkey(home)
    yield m
    m.store.close()


def core_pid(home: Path) -> int | None:
    from monkey.config import Home
    from monkey.core import daemon

    return daemon.status(Home(home))


def start_core(home: Path) -> int:
    from monkey.config import Home
    from monkey.core import daemon

    return daemon.start(Home(home))


def kill_core(home: Path) -> None:
    """SIGKILL the core, as a crash would."""
    pid = core_pid(home)
    assert pid and pid > 0, "no core to kill"
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: core_pid(home) is None, what="the core to die")


@pytest.fixture(scope="session")
def moto_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """moto's server on 127.0.0.1 for the whole session (see tests/moto_server.py)."""
    from tests.moto_server import MotoServer

    server = MotoServer(tmp_path_factory.mktemp("moto"))
    yield server
    server.stop()


@pytest.fixture
def moto(moto_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """An empty EC2 + S3 at ``moto.endpoint`` and fake credentials in the environment (no
    real AWS file or profile is read); the test must leave no instance running, and S3's
    checks (the gate's, tests/s3_gate.py) must have refused nothing it sent."""
    from tests.moto_server import CREDENTIALS, REGION, Moto

    moto_server.reset()
    for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    cloud = Moto(moto_server)
    yield cloud
    moto_server.reset_auth()
    left = [(i["InstanceId"], i["State"]["Name"], i["Region"]) for i in cloud.instances()]
    assert not left, f"the test left instances running: {left}"
    assert not moto_server.gate.refused, f"S3 would have refused: {moto_server.gate.refused}"
