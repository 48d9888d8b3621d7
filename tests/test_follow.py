"""The one log follower (monkey.logfiles.Follower: watchdog's inotify observer, its polling
observer as the fallback) behind `logs -f`, `Job.wait()` and the dashboard's log pane: woken
by writes, never by its own reads; output, attempt marks and exit codes as before."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import wait_for

from monkey.client_agent import rundir
from monkey.client_agent.events import Events
from monkey.client_agent.state import Job
from monkey.logfiles import LOGS, Follower, LogCursor, interleaved, read_segments

LONG = 60.0  # a bound only: a wait that is woken returns long before


def test_a_write_wakes_the_follower_and_its_own_reads_do_not(tmp_path):
    log = tmp_path / "run" / "1" / "stdout.log"
    log.parent.mkdir(parents=True)
    log.write_bytes(b"start\n")
    with Follower() as follower:
        assert follower.watch(tmp_path / "run", LOGS, recursive=True)
        assert not follower.watch(tmp_path / "run", LOGS, recursive=True)  # once is enough
        assert not follower.watch(tmp_path / "missing", LOGS)
        with open(log, "ab") as fh:
            fh.write(b"epoch 1\n")
            fh.flush()
            assert follower.wait(LONG)
        while follower.wait(1.0):  # the close of the write comes as an event of its own
            pass
        for _ in range(3):  # a reader opening and reading the file is no write
            assert log.read_bytes().endswith(b"epoch 1\n")
        with open(log.with_name("events.jsonl"), "a") as fh:  # nor a heartbeat beside it
            fh.write('{"kind": "heartbeat"}\n')
        assert not follower.wait(0.3)
        second = tmp_path / "run" / "2"  # a new attempt's folder and its log
        second.mkdir()
        (second / "stdout.log").write_bytes(b"resumed\n")
        assert follower.wait(LONG)
        while follower.wait(1.0):
            pass
        (second / "stderr.tmp").write_bytes(b"fetched\n")  # a fetched copy moved into place
        assert not follower.wait(0.3)
        (second / "stderr.tmp").rename(second / "stderr.log")
        assert follower.wait(LONG)


def test_named_files_only_and_the_polling_fallback(tmp_path):
    (tmp_path / "monkey.db").write_bytes(b"")
    with Follower() as follower:
        assert follower.watch(tmp_path, ("monkey.db", "monkey.db-wal"))
        (tmp_path / "daemon.log").write_text("core: a pass\n")
        assert not follower.wait(0.3)
        (tmp_path / "monkey.db-wal").write_bytes(b"x")
        assert follower.wait(LONG)
        follower._fallback()  # as when inotify has no instance or watch left
        while follower.wait(1.0):
            pass
        with open(tmp_path / "monkey.db-wal", "ab") as fh:
            fh.write(b"y")
        assert follower.wait(LONG)
        while follower.wait(1.0):
            pass
        (tmp_path / "daemon.log").write_text("core: another pass\n")
        assert not follower.wait(0.5)


def test_logs_follow_prints_as_written_and_keeps_exit_codes_and_marks(cli, home, monkey, tmp_path):
    go = tmp_path / "go"
    script = (
        f"import os, sys, time\nprint('first', flush=True)\n"
        f"while not os.path.exists({str(go)!r}): time.sleep(0.05)\n"
        "print('second', flush=True)\nprint('oops', file=sys.stderr, flush=True)\n"
        "sys.exit(3)\n"
    )
    Path("job.py").write_text(script)
    juid = cli("run", "--retries", "1", "--", sys.executable, "job.py", check=True).stdout.strip()
    follow = subprocess.Popen(
        [sys.executable, "-m", "monkey", "logs", "-f", juid],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert follow.stdout is not None
        assert follow.stdout.readline() == b"first\n"  # printed while the job still runs
        go.write_text("")
        out, err = follow.communicate(timeout=120)
    finally:
        if follow.poll() is None:
            follow.kill()
    marks = [line for line in out.decode().splitlines() if line.startswith("── attempt")]
    assert len(marks) == 1 and marks[0].startswith("── attempt 2 on")  # the retry followed too
    assert out.decode().replace(marks[0] + "\n", "") == "second\noops\nfirst\nsecond\noops\n"
    assert follow.returncode == 3 and f"monkey: job {juid} failed" in err.decode()
    again = cli("logs", "-f", "--stdout", juid)
    assert again.stdout == "first\nsecond\nfirst\nsecond\n" and again.returncode == 3
    assert monkey.job(juid).wait(timeout=LONG).value == "failed"


def test_following_an_ended_job_or_reading_logs_imports_no_watchdog(cli, home, monkey):
    juid = cli("run", "--", "echo", "hi", check=True).stdout.strip()
    wait_for(lambda: monkey.job(juid).status.value == "succeeded", timeout=60, what="the job")
    code = (
        "import sys; from monkey.shell.cli import main\n"
        f"for args in (['logs', {juid!r}], ['logs', '-f', {juid!r}]):\n"
        "    try: main(args)\n"
        "    except SystemExit: pass\n"
        "print(sorted(m for m in sys.modules if m.startswith('watchdog')))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.splitlines()[-1] == "[]", proc.stdout + proc.stderr


def test_a_follower_closed_while_its_file_is_written_prints_nothing(tmp_path, caplog):
    # watchdog logged an ERROR ("queue_events() called when the thread is inactive") for an
    # event read as its observer stopped; with no handler configured it reached stderr at
    # the end of `logs -f` and of `Job.wait` (seen in 27 of 300 closes).
    import threading

    stop = threading.Event()

    def write() -> None:
        with open(tmp_path / "stdout.log", "ab", buffering=0) as f:
            while not stop.is_set():
                f.write(b"x\n")

    writer = threading.Thread(target=write)
    writer.start()
    try:
        for _ in range(300):
            with Follower() as follower:
                follower.watch(tmp_path, ["stdout.log"])
                follower.wait(0.001)
    finally:
        stop.set()
        writer.join()
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == []


LINES = 20000


def alternate(out: Path, err: Path) -> subprocess.Popen[bytes]:
    """A process writing o000000 to OUT, e000000 to ERR, o000001 to OUT... (LINES of each;
    8 bytes a line, so none straddles a 4 KiB page, whose size another process could see
    mid-write)."""
    out.touch()
    err.touch()
    script = (
        "import os, sys\n"
        "o = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND)\n"
        "e = os.open(sys.argv[2], os.O_WRONLY | os.O_APPEND)\n"
        f"for i in range({LINES}):\n"
        "    os.write(o, b'o%06d\\n' % i)\n"
        "    os.write(e, b'e%06d\\n' % i)\n"
    )
    return subprocess.Popen([sys.executable, "-c", script, str(out), str(err)])


def assert_each_stdout_line_first(seen: list[bytes]) -> None:
    shown = {line: n for n, line in enumerate(seen)}
    assert len(shown) == 2 * LINES
    assert [i for i in range(LINES) if shown[b"o%06d" % i] > shown[b"e%06d" % i]] == []


def test_a_cursor_never_shows_stderr_before_the_stdout_written_ahead_of_it(tmp_path):
    # Stdout read to its end, then a line written to each, then stderr read to its end,
    # would show e{i} before o{i} (a follow did, in a CI run).
    out, err = tmp_path / "stdout.log", tmp_path / "stderr.log"
    writer = alternate(out, err)
    cursor = LogCursor()
    seen: list[bytes] = []
    pending = {out: b"", err: b""}
    while True:
        done = writer.poll() is not None
        for path, _, piece in cursor.read([out, err]):
            lines = (pending[path] + piece).split(b"\n")
            pending[path] = lines.pop()
            seen += lines
        if done:
            break
    assert_each_stdout_line_first(seen)


def test_the_agents_order_marks_never_put_stderr_before_the_stdout_written_ahead_of_it(
    tmp_path,
):
    # `logs` puts the two together by the sizes the agent marks in output.order as the job
    # runs: stdout's size taken, a line written to each, then stderr's would do it too.
    out, err = tmp_path / rundir.STDOUT, tmp_path / rundir.STDERR
    writer = alternate(out, err)
    job = Job("j", 1, str(tmp_path), 0, -1, False, 0, 0.0)
    while writer.poll() is None:
        Events._mark_order(job)
    segments = interleaved(out, err, tmp_path / rundir.ORDER)
    assert_each_stdout_line_first(b"".join(read_segments(segments)).splitlines())
