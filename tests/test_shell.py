"""The `monkey>` shell: cmd2 transcripts, completion, redirection, Ctrl-C, a real terminal.

cmd2 4 removed its transcript runner (its CHANGELOG: "Removed Transcript Testing feature
set"), so `run_transcript` below carries its file format on: lines before the first prompt
are comments; `monkey> COMMAND` lines are run in turn; the lines up to the next prompt are the
expected output, literal text except between slashes, which is a regular expression
(`\\/` is a literal slash). Unlike cmd2's runner, stderr is captured with stdout, so error
lines are checked too, and the whole output must match (trailing blank lines aside).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
from terminal import Terminal

from monkey.api import Monkey
from monkey.config import Home
from monkey.models import Resources
from monkey.shell.repl import PROMPT, MonkeyShell

TRANSCRIPTS = Path(__file__).parent / "transcripts"
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def shell_home(home, monkeypatch):
    """conftest's MONKEY_HOME (everything started under it is killed afterwards), no colour."""
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    return Home(home)


@pytest.fixture
def app(shell_home):
    return MonkeyShell(persistent_history_file="")


# -- a transcript runner (the format of cmd2 < 4) -------------------------------------------


def _expected_regex(text: str) -> str:
    """Literal text, except /regex/ between unescaped slashes; `\\/` is a literal slash."""
    out, i, n = [], 0, len(text)
    literal: list[str] = []
    while i < n:
        if text.startswith("\\/", i):
            literal.append("/")
            i += 2
        elif text[i] == "/":
            end = i + 1
            pattern: list[str] = []
            while end < n and text[end] != "/":
                if text.startswith("\\/", end):
                    pattern.append("/")
                    end += 2
                else:
                    pattern.append(text[end])
                    end += 1
            if end >= n:  # no closing slash: plain text
                literal.append(text[i:])
                break
            out.append(re.escape("".join(literal)))
            literal = []
            out.append("".join(pattern))
            i = end + 1
        else:
            literal.append(text[i])
            i += 1
    out.append(re.escape("".join(literal)))
    return "".join(out)


def run_one(app: MonkeyShell, line: str) -> tuple[str, bool]:
    """Run one command line; its stdout and stderr together, and whether it asked to stop."""
    buf = io.StringIO()
    saved = app.stdout
    app.stdout = buf
    try:
        with contextlib.redirect_stderr(buf):
            stop = app.onecmd_plus_hooks(line)
    finally:
        app.stdout = saved
    return buf.getvalue(), stop


def run_transcript(app: MonkeyShell, path: Path) -> None:
    lines = path.read_text().splitlines(keepends=True)
    i = 0
    while i < len(lines) and not lines[i].startswith(PROMPT):
        i += 1
    while i < len(lines):
        lineno = i + 1
        command = lines[i][len(PROMPT) :].rstrip("\n")
        i += 1
        expected = []
        while i < len(lines) and not lines[i].startswith(PROMPT):
            expected.append(lines[i])
            i += 1
        got, stop = run_one(app, command)
        regex = _expected_regex("".join(expected).rstrip())
        assert re.fullmatch(regex, got.rstrip(), re.MULTILINE | re.DOTALL), (
            f"\n{path.name}:{lineno}: {PROMPT}{command}\n"
            f"--- expected ---\n{''.join(expected)}--- got ---\n{got}"
        )
        assert not stop or i >= len(lines), f"{path.name}:{lineno}: the shell quit early"


def test_transcript_regex():
    assert re.fullmatch(_expected_regex("job /\\d+/ at a\\/b"), "job 42 at a/b")
    assert not re.fullmatch(_expected_regex("job /\\d+/"), "job x")
    assert re.fullmatch(_expected_regex("one / slash"), "one / slash")
    assert re.fullmatch(_expected_regex("(a) [b]"), "(a) [b]")


# -- transcripts ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["help", "errors", "providers", "rerun"])
def test_transcript(app, name):
    run_transcript(app, TRANSCRIPTS / f"{name}.txt")


def test_transcript_notes_and_tags(app, shell_home):
    """`job note|tag|untag`, `list jobs --tag` and `sweep note|tag` on a job of the test."""
    when = time.mktime((2026, 11, 21, 12, 0, 0, 0, 0, -1))
    assert _new_job(Monkey(), when) == "26-11-21-001"
    run_transcript(app, TRANSCRIPTS / "notes.txt")


@pytest.mark.system  # runs jobs: a core and an agent
@pytest.mark.timeout(120)
def test_transcript_run_and_follow(app):
    """Needs the core and the local agent: queues `echo hi` and follows it to its end."""
    run_transcript(app, TRANSCRIPTS / "follow.txt")


# -- completion -------------------------------------------------------------------------


def _new_job(m: Monkey, when: float, argv: tuple[str, ...] = ("echo", "hi")) -> str:
    job = m.store.create_job(
        name="t",
        argv=list(argv),
        provider="local",
        resources=Resources(cpus=1, gpus=0),
        env={},
        snapshot=None,
        workdir=str(Path.cwd()),
        datasets=[],
        git={},
        python="3",
        now=when,
    )
    return job.juid


def _complete(app: MonkeyShell, line: str) -> list[str]:
    text = line.rsplit(" ", 1)[-1]
    result = app.complete(text, line, len(line) - len(text), len(line))
    assert not result.error, result.error
    return list(result.to_strings())


@pytest.fixture
def two_jobs(shell_home):
    when = time.mktime((2026, 11, 21, 12, 0, 0, 0, 0, -1))
    m = Monkey()
    return [_new_job(m, when), _new_job(m, when + 1)]


def test_complete_job_ids(app, two_jobs):
    assert two_jobs == ["26-11-21-001", "26-11-21-002"]
    assert set(_complete(app, "info job 26-")) == set(two_jobs)
    # newest first
    assert _complete(app, "info job 26-11-21-00") == ["26-11-21-002", "26-11-21-001"]
    assert "last" in _complete(app, "logs ")
    # nargs="+" arguments complete each job once
    assert _complete(app, "job cancel 26-11-21-001 26-") == ["26-11-21-002"]
    assert set(_complete(app, "kill job 26-")) == set(two_jobs)
    assert _complete(app, "logs --follow la") == ["last"]


def test_complete_job_ids_newest_200(app):
    m = Monkey()
    base = time.mktime((2026, 11, 20, 12, 0, 0, 0, 0, -1))
    ids = [_new_job(m, base) for _ in range(205)]
    offered = _complete(app, "info job 26-11-20-")
    assert len(offered) == 200
    assert set(offered) == set(ids[-200:])


def test_complete_commands_subcommands_options(app):
    assert "list" in _complete(app, "li")
    assert _complete(app, "list j") == ["jobs"]
    assert _complete(app, "info ") == ["job"]
    assert set(_complete(app, "job ")) == {
        *("cancel", "pause", "resume", "retry", "priority"),
        *("note", "tag", "untag"),
    }
    assert "--provider" in _complete(app, "list jobs --pr")
    assert _complete(app, "daemon st") == ["start", "status", "stop"]
    assert "--follow" in _complete(app, "logs --fo")


def test_complete_paths(app, shell_home):
    """Folders, datasets, job.yml files and the command's own arguments complete as paths."""
    Path("data_dir").mkdir()
    Path("train.py").write_text("print(1)\n")
    assert _complete(app, "run --workdir data_") == ["data_dir/"]
    assert _complete(app, "run --dataset data_") == ["data_dir/"]
    assert _complete(app, "run --job-yml tra") == ["train.py"]
    assert _complete(app, "run -- python tra") == ["train.py"]
    assert _complete(app, "sweep --grid lr=1,2 -- python tra") == ["train.py"]
    # a folder on the SSH host is not completed from this machine
    line = "provider add ssh lab --host h --workdir data_"
    assert not app.complete("data_", line, len(line) - 5, len(line)).to_strings()


# -- output, redirection, Ctrl-C, history ---------------------------------------------------


def test_redirection_to_file(app, two_jobs, tmp_path):
    out = tmp_path / "jobs.txt"
    got, _ = run_one(app, f"list jobs > {out}")
    assert got == ""
    text = out.read_text()
    assert text.startswith("JOB ")
    assert all(juid in text for juid in two_jobs)
    got, _ = run_one(app, f"info job last >> {out}")
    assert "26-11-21-002" in out.read_text().split("JOB ", 1)[1]


def test_logs_bytes_go_to_shell_stdout(app, shell_home, two_jobs):
    """`logs` writes bytes to sys.stdout.buffer; the shell puts them in its own stdout."""
    m = Monkey()
    job = m.store.get_job("26-11-21-001")
    run_dir = shell_home.run_dir(job.juid, 1)
    run_dir.mkdir(parents=True)
    (run_dir / "stdout.log").write_bytes("héllo\nworld\n".encode())
    m.store.begin_attempt(job, "local", str(run_dir))
    got, _ = run_one(app, "logs 26-11-21-001")
    assert got == "héllo\nworld\n"
    out = shell_home.root / "log.txt"
    run_one(app, f"logs 26-11-21-001 --tail 1 > {out}")
    assert out.read_bytes() == b"world\n"


def test_sys_stdout_restored(app):
    before = sys.stdout
    run_one(app, "list jobs")
    run_one(app, "info job nope")
    assert sys.stdout is before
    assert app.last_result == 1


@pytest.mark.system  # runs jobs: a core and an agent
def test_ctrl_c_stops_follow_and_the_shell_goes_on(shell_home):
    """`logs --follow` of a job that never ends; Ctrl-C brings back the prompt."""
    juid = Monkey().run(["sleep", "600"]).juid
    out = io.StringIO()
    app = MonkeyShell(
        persistent_history_file="",
        stdin=io.StringIO(f"logs --follow {juid}\nlist jobs --json\n"),
        stdout=out,
    )
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))
    err = io.StringIO()
    timer.start()
    try:
        with contextlib.redirect_stderr(err):
            assert app.cmdloop() == 0
    finally:
        timer.cancel()
    assert f"stopped following; job {juid} goes on" in err.getvalue()
    assert f'"job": "{juid}"' in out.getvalue()  # the next command ran


def test_exit_and_quit_stop(app):
    assert run_one(app, "exit")[1] is True
    assert run_one(app, "quit")[1] is True


def test_history_persists_in_monkey_home(shell_home):
    app = MonkeyShell()
    history = shell_home.root / "history"
    assert app.persistent_history_file == str(history)
    assert history.stat().st_mode & 0o777 == 0o600
    run_one(app, "list jobs")
    app._persist_history()
    again = MonkeyShell()
    assert [item.raw for item in again.history] == ["list jobs"]
    assert history.stat().st_mode & 0o777 == 0o600


def test_one_way_per_command():
    """The shell's commands are the CLI's: same parsers, same functions."""
    from monkey.shell import cli, repl

    for name in repl.COMMANDS:
        assert callable(getattr(MonkeyShell, f"do_{name}"))
        one_shot = {**cli.PARSERS, **cli.ONE_SHOT}[name]()
        shell = repl.shell_parser(name)
        assert shell.description == one_shot.description
        assert {a.dest for a in shell._actions} == {a.dest for a in one_shot._actions}


# -- the real thing: `monkey` in a terminal ----------------------------------------------


@pytest.mark.system  # the shell in a terminal
@pytest.mark.timeout(120)
def test_interactive_terminal(shell_home, two_jobs):
    # A job that never ends, to follow (following starts the core).
    endless = _new_job(Monkey(), time.mktime((2026, 11, 21, 12, 0, 2, 0, 0, -1)), ("sleep", "600"))
    env = dict(os.environ, PYTHONPATH=str(ROOT), PROMPT_TOOLKIT_NO_CPR="1", TERM="xterm")
    prompt = r"monkey>"
    with Terminal(env, Path.cwd()) as term:
        term.expect(r"type `help` for the commands.*" + prompt)
        term.send("list jobs\r")
        term.expect(r"26-11-21-002.*26-11-21-001.*" + prompt)
        # Tab completes the command, the sub-command and a job id. Completion runs in a
        # thread, so let each finish before typing on; Enter redraws the whole line.
        for keys in ("inf\t", "j\t", "las\t"):
            term.send(keys)
            term.settle()
        term.send("\r")
        term.expect(r"info job last.*state\s+queued.*" + prompt)
        term.send(f"logs --follow {endless}\r")
        term.expect(f"logs --follow {endless}")
        time.sleep(1.0)
        term.send("\x03")  # Ctrl-C
        term.expect(f"stopped following; job {endless} goes on.*" + prompt)
        term.send("info job 99-99\r")
        term.expect(r"error: no job matches '99-99'.*" + prompt)
        term.send("\x04")  # Ctrl-D
        assert term.close() == 0
    assert (shell_home.root / "history").exists()
