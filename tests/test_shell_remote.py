"""The `monkey>` shell through a remote (issue 27): `monkey --remote lab` opens it on a laptop
against a real TLS server; each command typed goes where the one-shot command would (the
refused ones say so in the CLI's line and the shell goes on), the prompt names the remote,
`remote use` switches it, job ids complete from the main node, and the laptop is left with
its remote settings, the blob cache and the shell's history, never a MONKEY_HOME."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from mainnode import MainNode, wait_until_ended
from terminal import Terminal
from test_remote_tunnel import tunnelled  # noqa: F401  (a fixture)
from test_shell import _complete, run_one

from monkey.shell.repl import MonkeyShell

pytestmark = pytest.mark.system

REFUSED = (
    "monkey daemon status does not work through a remote yet; run it on the main node (remote lab)"
)


@pytest.fixture
def node(home: Path, tmp_path: Path):
    n = MainNode(home, tmp_path)
    n.start()
    n.add_remote()
    yield n
    n.close()


@pytest.fixture
def laptop(node: MainNode, monkeypatch: pytest.MonkeyPatch) -> MainNode:
    """This process as the laptop (its HOME, config and MONKEY_HOME), through remote lab."""
    for key in ("HOME", "XDG_CONFIG_HOME", "MONKEY_HOME"):
        monkeypatch.setenv(key, node.laptop_env[key])
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("MONKEY_REMOTE", "lab")  # (restored after the test, whatever it set)
    monkeypatch.setenv("NO_COLOR", "1")
    return node


def _shell(node: MainNode, lines: list[str], *argv: str, cwd: Path, **env: str) -> str:
    """`monkey ARGV` on the laptop reading LINES on its stdin: stdout and stderr as printed."""
    done = subprocess.run(
        [sys.executable, "-m", "monkey", *argv],
        input="".join(f"{line}\n" for line in lines),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=180,
        cwd=cwd,
        env={**node.laptop_env, "PYTHONUNBUFFERED": "1", "NO_COLOR": "1", **env},
    )
    assert done.returncode == 0, done.stdout
    return done.stdout


def test_the_shell_through_a_remote_runs_lists_shows_and_refuses_in_one_line(node, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "hi.py").write_text("print('hi there')\n")
    typed = [
        "list jobs",
        "run -- python3 hi.py",
        "logs --follow last",
        "info job last",
        "daemon status",  # not through a remote: refused, and the shell goes on
        "logs last",
        "list jobs",
    ]
    out = _shell(node, typed, "--remote", "lab", cwd=work)
    juid = node.server("list", "jobs", "--json")
    juid = json.loads(juid.stdout)["jobs"][0]["job"]  # the job ran on the main node
    assert re.fullmatch(
        r"no jobs yet; try `monkey run -- CMD`\n"
        f"{juid}\n"
        r"hi there\n"  # logs --follow
        r"(.*\n)*state\s+succeeded.*\n"  # info job
        r"command\s+python3 hi.py\n(.*\n)*"
        f"{re.escape(REFUSED)}\n"
        r"hi there\n"  # logs
        r"JOB .*\n"
        f"{juid} .*succeeded.*python3 hi.py\n",
        out.rstrip("\n") + "\n",  # (the shell leaves a blank line at the end of its input)
    ), out
    # the laptop holds its remote settings, the blob cache and the history, no job data
    assert not (node.laptop_root / ".monkey").exists()
    files = node.laptop_files()
    assert {f.split("/")[0] for f in files} == {".config", ".cache"}, files
    history = node.laptop_root / ".cache/monkey/remotes/lab/history"
    assert history.stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("how", ["MONKEY_REMOTE", "remote use"])
def test_the_shell_goes_to_the_remote_chosen_by_the_environment_or_remote_use(node, how):
    juid = node.server("run", "--", "true").stdout.strip()
    env = {"MONKEY_REMOTE": "lab"} if how == "MONKEY_REMOTE" else {}
    if how == "remote use":
        assert node.laptop("remote", "use", "lab").returncode == 0
    out = _shell(node, ["list jobs", "remote list"], cwd=node.laptop_root, **env)
    assert juid in out and re.search(r"\*\s+lab\s", out)
    assert not (node.laptop_root / ".monkey").exists()


def test_the_remote_shell_keeps_its_history_beside_the_blob_cache(laptop):
    app = MonkeyShell()
    history = laptop.laptop_root / ".cache/monkey/remotes/lab/history"
    assert app.persistent_history_file == str(history)
    run_one(app, "list jobs")
    app._persist_history()
    assert [item.raw for item in MonkeyShell().history] == ["list jobs"]
    assert history.stat().st_mode & 0o777 == 0o600
    assert history.parent.stat().st_mode & 0o777 == 0o700
    assert not (laptop.laptop_root / ".monkey").exists()


def test_an_unknown_remote_is_one_line_and_no_shell(node):
    done = node.laptop("--remote", "nowhere", timeout=60)
    assert done.returncode == 1
    assert done.stderr.startswith("monkey: error: no remote 'nowhere'; add it with")
    assert len(done.stderr.splitlines()) == 1 and done.stdout == ""
    assert not (node.laptop_root / ".monkey").exists()


def test_the_prompt_names_the_remote_and_remote_use_switches_it(laptop, monkeypatch):
    juid = laptop.server("run", "--", "true").stdout.strip()
    monkeypatch.setenv("MONKEY_REMOTE", "local")
    app = MonkeyShell(persistent_history_file="")
    assert app.prompt == "monkey> "
    assert _complete(app, "remote use ") == ["lab", "local"]
    assert _complete(app, "remote remove ") == ["lab"]
    assert run_one(app, "remote use lab")[0] == "commands now go to lab\n"
    assert app.prompt == "monkey[lab]> "
    assert juid in run_one(app, "list jobs")[0]
    out, _ = run_one(app, "remote use local")
    assert out == "commands now run on this machine\n"
    assert app.prompt == "monkey> "
    assert run_one(app, "list jobs")[0].startswith("no jobs yet")  # the laptop's own
    assert run_one(app, "daemon status")[0].startswith("core not running")  # allowed here
    # `--remote NAME` on one command, as the one-shot CLI takes it; the shorts forms too
    assert juid in run_one(app, "list jobs --remote lab")[0]
    assert app.prompt == "monkey> "
    assert run_one(app, f"info --remote lab {juid} > info.txt") == ("", False)
    assert re.match(rf"job\s+{juid}\n", Path("info.txt").read_text())
    assert run_one(app, "list jobs")[0].startswith("no jobs yet")
    run_one(app, "remote use lab")
    assert juid in run_one(app, "list jobs")[0]
    # another terminal choosing this machine does not move this shell's session
    assert laptop.laptop("remote", "use", "--local").returncode == 0
    assert juid in run_one(app, "list jobs")[0]
    assert app.prompt == "monkey[lab]> "
    run_one(app, "remote remove lab")
    assert app.prompt == "monkey> "


def test_a_shell_on_this_machine_follows_remote_use_from_another_terminal(laptop, monkeypatch):
    juid = laptop.server("run", "--", "true").stdout.strip()
    monkeypatch.delenv("MONKEY_REMOTE")
    app = MonkeyShell(persistent_history_file="")
    assert run_one(app, "list jobs")[0].startswith("no jobs yet")
    assert app.prompt == "monkey> "
    assert laptop.laptop("remote", "use", "lab").returncode == 0
    assert juid in run_one(app, "list jobs")[0]  # as a one-shot command would
    assert app.prompt == "monkey[lab]> "  # from then on the prompt says so


def test_job_ids_complete_from_the_main_node_and_nothing_when_it_is_down(laptop):
    juid = laptop.server("run", "--", "true").stdout.strip()
    app = MonkeyShell(persistent_history_file="")
    assert set(_complete(app, "logs ")) == {"last", juid}
    assert _complete(app, f"info job {juid[:5]}") == [juid]
    assert not (laptop.laptop_root / ".monkey").exists()
    laptop.kill()
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert _complete(app, "logs ") == ["last"]
    assert err.getvalue() == ""


def _one_shot_line(node: MainNode, *argv: str) -> str:
    done = node.laptop("--remote", "lab", *argv)
    assert done.returncode == 1 and len(done.stderr.splitlines()) == 1, done.stderr
    return done.stderr.strip().removeprefix("monkey: ")


def test_a_refused_token_a_changed_certificate_and_a_server_down_are_one_line_each(laptop):
    app = MonkeyShell(persistent_history_file="")
    config = Path(laptop.laptop_env["XDG_CONFIG_HOME"]) / "monkey" / "remotes.json"
    pinned = json.loads(config.read_text())

    def refused(expect: str) -> None:
        out, stop = run_one(app, "list jobs")
        assert out == f"{_one_shot_line(laptop, 'list', 'jobs')}\n"
        assert expect in out and not stop and app.last_result == 1
        assert "lab" in run_one(app, "remote list")[0]  # the shell goes on

    user = pinned["remotes"]["lab"]["user"]
    assert laptop.server("server", "user", "token", user).returncode == 0
    refused(f"error: lab: token refused; ask an admin: monkey server user token {user}")
    changed = json.loads(config.read_text())
    changed["remotes"]["lab"]["fingerprint"] = "SHA256:" + "0" * 64
    config.write_text(json.dumps(changed))
    refused("error: lab: the certificate of")
    config.write_text(json.dumps(pinned))
    laptop.kill()
    refused("error: lab: cannot reach")
    assert not (laptop.laptop_root / ".monkey").exists()


def test_ctrl_c_stops_following_through_a_remote_and_the_shell_goes_on(laptop):
    juid = laptop.server("run", "--", "sleep", "600").stdout.strip()
    out, err = io.StringIO(), io.StringIO()
    app = MonkeyShell(
        persistent_history_file="",
        stdin=io.StringIO(f"logs --follow {juid}\nlist jobs --json\n"),
        stdout=out,
    )
    timer = threading.Timer(3.0, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with contextlib.redirect_stderr(err):
            assert app.cmdloop() == 0
    finally:
        timer.cancel()
    assert f"stopped following; job {juid} goes on" in err.getvalue()
    assert f'"job": "{juid}"' in out.getvalue()  # the next command ran, on the main node
    assert laptop.laptop("--remote", "lab", "cancel", juid).returncode == 0
    wait_until_ended(laptop, juid)
    assert not (laptop.laptop_root / ".monkey").exists()


@pytest.mark.timeout(180)
def test_the_remote_shell_in_a_terminal(node, tmp_path):
    """`monkey --remote lab` as a user types it: the intro and prompt name the main node, tab
    completes one of its job ids, Ctrl-C stops following and the shell goes on."""
    endless = node.server("run", "--", "sleep", "600").stdout.strip()
    env = {**node.laptop_env, "PROMPT_TOOLKIT_NO_CPR": "1", "TERM": "xterm", "NO_COLOR": "1"}
    prompt = r"monkey\[lab\]>"
    argv = [sys.executable, "-m", "monkey", "--remote", "lab"]
    with Terminal(env, tmp_path, argv) as term:
        term.expect(rf"Commands go to the main node lab \({re.escape(node.url)}\).*" + prompt)
        term.send("list jobs\r")
        term.expect(f"{endless} .*sleep 600.*" + prompt)
        for keys in ("inf\t", "j\t", f"{endless[:-2]}\t"):  # completion runs in a thread
            term.send(keys)
            term.settle()
        term.send("\r")
        term.expect(rf"info job {endless}.*command\s+sleep 600.*" + prompt)
        term.send(f"logs --follow {endless}\r")
        term.expect(f"logs --follow {endless}")
        time.sleep(1.0)
        term.send("\x03")  # Ctrl-C
        term.expect(f"stopped following; job {endless} goes on.*" + prompt)
        term.send("daemon status\r")
        term.expect(re.escape(REFUSED) + ".*" + prompt)
        term.send("\x04")  # Ctrl-D
        assert term.close() == 0
    assert node.laptop("--remote", "lab", "cancel", endless).returncode == 0
    wait_until_ended(node, endless)
    assert not (node.laptop_root / ".monkey").exists()


def test_the_shell_through_an_ssh_remote(tunnelled, monkeypatch):
    """Through an ssh:// remote: commands, and job ids completed over the kept tunnel."""
    node = tunnelled.node
    assert tunnelled.add("--fingerprint", node.fingerprint).returncode == 0
    juid = node.server("run", "--", "true").stdout.strip()
    for key in ("HOME", "XDG_CONFIG_HOME", "MONKEY_HOME"):
        monkeypatch.setenv(key, node.laptop_env[key])
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    monkeypatch.setenv("MONKEY_REMOTE", "lab")
    app = MonkeyShell(persistent_history_file="")
    assert set(_complete(app, "logs ")) == {"last", juid}
    assert set(_complete(app, "info job ")) == {"last", juid}
    assert juid in run_one(app, "list jobs")[0]
    assert re.search(rf"job\s+{juid}\n", run_one(app, f"info {juid}")[0])
    assert run_one(app, "daemon status")[0] == REFUSED + "\n"
    assert not (node.laptop_root / ".monkey").exists()
