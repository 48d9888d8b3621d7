"""Reinstalling monkey while its core and agent run (issue 13 §1), with real installs:
`pip install .` into a venv, then an editable install of a changed tree, as README's
scripts/example.sh then scripts/test.sh do. The next job.yml job works, the job that was
running keeps running under a fresh agent and its exit code is recorded, and
`daemon status` shows the versions. A shell or dashboard left open across a reinstall
restarts itself onto the new code."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, wait_for
from terminal import Terminal
from wheels import write_wheel

pytestmark = pytest.mark.system  # pip installs into venvs, cores and agents, the CLI in a terminal

JOB_YML = """\
name: upgrade
run:
  env_type: none
persist:
  - name: output
    path: output
"""


ENTRY_POINTS = "[console_scripts]\nmonkey = monkey.shell.cli:main\n"


def copy_tree(dest: Path, marker: str) -> Path:
    """A source tree of monkey, its code (CLI, core and agent) changed by MARKER."""
    shutil.copytree(REPO / "monkey", dest / "monkey", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "monkeycli.py", dest / "monkeycli.py")
    for rel in ("monkey/api.py", "monkey/client_agent/agent.py"):
        with open(dest / rel, "a") as f:
            f.write(f"# {marker}\n")
    return dest


def pip_install(venv: Path, wheel: Path) -> None:
    """`pip install` as a user does (a reinstall replaces the installed files)."""
    subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            "--force-reinstall",
            str(wheel),
        ],
        check=True,
        capture_output=True,
        timeout=300,
        cwd=venv.parent,
        # Not the test run's PYTHONPATH: pip would take a checkout's metadata on it for the
        # installed copy and leave the venv's files in place.
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )


def install(venv: Path, src: Path) -> None:
    """`pip install .` of SRC: the wheel its build makes (written here: no network)."""
    files = {
        str(p.relative_to(src)): p.read_bytes()
        for p in [*src.glob("monkey/**/*.py"), *src.glob("monkey/**/*.tcss"), src / "monkeycli.py"]
    }
    pip_install(venv, write_wheel(src / "dist", "monkey", "0.1.0", files, ENTRY_POINTS))


def install_editable(venv: Path, src: Path) -> None:
    """`pip install -e SRC`: what setuptools' editable wheel holds, a .pth naming SRC."""
    files = {"__editable__.monkey-0.1.0.pth": f"{src}\n".encode()}
    pip_install(venv, write_wheel(src / "dist-e", "monkey", "0.1.0", files, ENTRY_POINTS))


def test_reinstall_while_the_core_and_agent_run(home: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=120
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the installed copy only

    def monkey(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [str(venv / "bin" / "monkey"), *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        if check:
            assert proc.returncode == 0, f"monkey {' '.join(args)}: {proc.stdout}{proc.stderr}"
        return proc

    def job(juid: str) -> dict:
        return next(
            j
            for j in json.loads(monkey("list", "jobs", "--json").stdout)["jobs"]
            if j["job"] == juid
        )

    home.mkdir(exist_ok=True)
    (home / "providers.yml").write_text("providers:\n  local: {type: local, slots: 4}\n")
    Path("job.yml").write_text(JOB_YML)
    Path("train.py").write_text(
        "import os\nos.makedirs('output', exist_ok=True)\nprint('trained')\n"
    )

    # `pip install .` (scripts/example.sh), then a job.yml job and a job that outlives the upgrade.
    install(venv, copy_tree(tmp_path / "src1", "first"))
    first = monkey("run", "--", "python3", "train.py").stdout.strip()
    assert monkey("logs", "--follow", first).returncode == 0
    gate = Path.cwd() / "gate"
    gate.touch()
    long = monkey(
        "run", "--", "sh", "-c", f"while [ -e {gate} ]; do sleep 0.1; done; exit 7"
    ).stdout.strip()
    wait_for(lambda: job(long)["state"] == "running", what="the long job to run")
    before = monkey("daemon", "status").stdout
    old_core = int(before.split("(pid ")[1].split(")")[0])

    # An editable install of a changed tree (scripts/test.sh): the first install's files are gone.
    src2 = copy_tree(tmp_path / "src2", "second")
    install_editable(venv, src2)
    installed = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import monkey; print(monkey.__file__)"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        cwd=tmp_path,
    ).stdout.strip()
    assert installed == str(src2 / "monkey" / "__init__.py")

    # The next job.yml job works: the CLI restarted the core, the core replaced the agent.
    second = monkey("run", "--", "python3", "train.py").stdout.strip()
    follow = monkey("logs", "--follow", second, check=False)
    assert follow.returncode == 0, follow.stdout + follow.stderr
    assert "trained" in follow.stdout
    status = monkey("daemon", "status").stdout
    lines = {line.split()[0]: line.split()[1:] for line in status.splitlines()[1:]}
    assert lines["cli"][0] == lines["core"][0] and "outdated" not in status, status
    assert lines["cli"][0] != before.splitlines()[1].split()[1]  # a new version
    assert int(status.split("(pid ")[1].split(")")[0]) != old_core
    from monkey.client_agent.agent import code_digest

    agent_version = lines["agent"][0]
    assert agent_version != code_digest()  # the changed tree's agent, not this worktree's

    # The job that ran across the upgrade keeps running, and its exit code is recorded.
    assert job(long)["state"] == "running"
    gate.unlink()
    wait_for(
        lambda: job(long)["state"] in ("failed", "succeeded"),
        timeout=60,
        what="the long job to end",
    )
    ended = job(long)
    assert ended["state"] == "failed" and ended["exit_code"] == 7, ended

    # `daemon stop --all` stops the core and the idle agent.
    out = monkey("daemon", "stop", "--all").stdout
    assert "core stopped" in out and "agent stopped" in out
    wait_for(lambda: "agent  not running" in monkey("daemon", "status", check=False).stdout,
             what="the agent to stop")  # fmt: skip


def reinstall(src: Path) -> None:
    """What an editable reinstall of a changed tree does to the code a process loaded."""
    with open(src / "monkey" / "api.py", "a") as f:
        f.write("# reinstalled\n")


@pytest.mark.timeout(120)
def test_a_shell_left_open_restarts_onto_reinstalled_code(home: Path, tmp_path: Path) -> None:
    src = copy_tree(tmp_path / "src", "installed")
    env = dict(os.environ, PYTHONPATH=str(src), TERM="xterm", PROMPT_TOOLKIT_NO_CPR="1")
    with Terminal(env, Path.cwd()) as term:
        term.expect("monkey>")
        term.send("daemon status\r")
        old = term.expect(r"cli\s+\S+").split()[1]
        term.expect("monkey>")
        reinstall(src)
        term.send("daemon status\r")  # runs once, in the restarted shell: the new version
        note = term.expect(r"note: monkey changed on disk \(.*?\); restarting the shell")
        new = term.expect(r"cli\s+\S+").split()[1]
        assert new != old and f"({old} -> {new})" in note
        term.expect("monkey>")
        term.send("history\r")  # the session goes on
        term.expect(r"1\s+daemon status\s+2\s+daemon status\s+monkey>")
        term.send("\x04")
        assert term.close() == 0


def test_a_shell_reading_a_script_only_notes_a_reinstall(home: Path, tmp_path: Path) -> None:
    src = copy_tree(tmp_path / "src", "installed")
    script = (
        f"daemon status\nshell echo '# reinstalled' >> {src / 'monkey' / 'api.py'}\n"
        "daemon status\ndaemon status\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "monkey"],
        input=script,
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, PYTHONPATH=str(src)),
    )
    assert proc.returncode == 0, proc.stderr
    versions = [line.split()[1] for line in proc.stdout.splitlines() if line.split()[:1] == ["cli"]]
    assert len(versions) == 3 and len(set(versions)) == 1  # the same process ran all three
    notes = [line for line in proc.stderr.splitlines() if "changed on disk" in line]
    assert len(notes) == 1 and notes[0].endswith("; start the shell again to use it"), proc.stderr


@pytest.mark.timeout(120)
def test_a_dashboard_left_open_restarts_onto_reinstalled_code(
    cli, home: Path, tmp_path: Path
) -> None:
    juid = cli("run", "--", "true", check=True).stdout.strip()
    cli("logs", "--follow", juid)
    src = copy_tree(tmp_path / "src", "installed")
    env = dict(os.environ, PYTHONPATH=str(src), TERM="xterm-256color")
    with Terminal(
        env, Path.cwd(), [sys.executable, "-m", "monkey", "dash"], size=(30, 120)
    ) as term:
        term.expect(juid)
        term.send("\r")  # open the job
        term.expect(f"job {juid}")
        term.send("?")  # a dialog: no restart under it, a notice instead
        term.expect("Keys")
        reinstall(src)
        term.expect("monkey changed on disk")
        term.send("\x1b")  # closing it: the dashboard restarts, on the job it showed
        term.expect(r"monkey changed on disk \(.*?\); restarting the dashboard")
        term.expect(f"job {juid}")
        term.send("q")
        assert term.close() == 0


def test_the_same_code_installed_elsewhere_strands_no_agent(home: Path, tmp_path: Path) -> None:
    """`pip install .`, then `pip install -e .` of the same code (only where it lives changes),
    then `pip uninstall` + `pip install .`: every job.yml job and `job retry` after each works,
    and a job running across all three keeps running and has its exit code recorded."""
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=120
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the installed copy only

    def monkey(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [str(venv / "bin" / "monkey"), *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        if check:
            assert proc.returncode == 0, f"monkey {' '.join(args)}: {proc.stdout}{proc.stderr}"
        return proc

    def job(juid: str) -> dict:
        return json.loads(monkey("info", "job", juid, "--json").stdout)

    def trained() -> str:
        juid = monkey("run", "--", "python3", "train.py").stdout.strip()
        follow = monkey("logs", "--follow", juid, check=False)
        assert follow.returncode == 0 and "trained" in follow.stdout, (
            follow.stdout + follow.stderr + monkey("logs", "--setup", juid, check=False).stdout
        )
        return juid

    home.mkdir(exist_ok=True)
    (home / "providers.yml").write_text("providers:\n  local: {type: local, slots: 4}\n")
    Path("job.yml").write_text(JOB_YML)
    Path("train.py").write_text(
        "import os\nos.makedirs('output', exist_ok=True)\nprint('trained')\n"
    )
    src = copy_tree(tmp_path / "src", "same")
    install(venv, src)
    first = trained()
    gate = Path.cwd() / "gate"
    gate.touch()
    long = monkey(
        "run", "--", "sh", "-c", f"while [ -e {gate} ]; do sleep 0.1; done; exit 7"
    ).stdout.strip()
    wait_for(lambda: job(long)["state"] == "running", what="the long job to run")

    core = (home / "daemon.pid").read_text()
    install_editable(venv, src)  # the same code, now from the checkout: site-packages' is gone
    assert not list((venv / "lib").glob("python*/site-packages/monkey"))
    # The core notices by itself (no command needed), and a core on the new install serves.
    wait_for(
        lambda: (
            (pid := (home / "daemon.pid").read_text() if (home / "daemon.pid").exists() else core)
            != core
            and pid
        ),
        what="the core to restart on the new install",
    )
    assert "monkey was reinstalled" in (home / "daemon.log").read_text()
    trained()
    monkey("job", "retry", first)
    wait_for(
        lambda: job(first)["state"] in ("succeeded", "failed") and job(first)["attempts"] == 2,
        timeout=60,
        what="the retry to end",
    )
    assert job(first)["state"] == "succeeded", monkey("logs", "--stderr", first, check=False).stdout

    subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "uninstall", "-y", "-q", "monkey"],
        check=True,
        capture_output=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    install(venv, src)
    trained()

    assert job(long)["state"] == "running"
    gate.unlink()
    wait_for(
        lambda: job(long)["state"] in ("failed", "succeeded"),
        timeout=60,
        what="the long job to end",
    )
    ended = job(long)
    assert ended["state"] == "failed" and ended["exit_code"] == 7, ended
    monkey("daemon", "stop", "--all")


def test_a_core_hands_over_to_code_changed_in_place_with_no_command(
    home: Path, tmp_path: Path
) -> None:
    """A `git pull` in an editable checkout while the core runs: the core itself starts a core
    on the new code (no command needed), which `daemon status` then shows as current."""
    src = copy_tree(tmp_path / "src", "installed")
    env = dict(os.environ, PYTHONPATH=str(src))

    def monkey(*args: str) -> str:
        return subprocess.run(
            [sys.executable, "-m", "monkey", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=True,
        ).stdout

    monkey("daemon", "start")
    old = (home / "daemon.pid").read_text()
    reinstall(src)
    wait_for(
        lambda: (home / "daemon.pid").exists() and (home / "daemon.pid").read_text() != old,
        what="a core on the new code",
    )
    assert "monkey was reinstalled" in (home / "daemon.log").read_text()
    status = monkey("daemon", "status")
    assert "outdated" not in status and f"(pid {old.strip()})" not in status, status
    monkey("daemon", "stop")
