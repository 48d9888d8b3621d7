"""`monkey logs` streams in bounded pieces and reads a tail from the end, whatever the size."""

from __future__ import annotations

import filecmp
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import wait_for
from hypothesis import given, settings
from hypothesis import strategies as st

from monkey import logfiles
from monkey.logfiles import LogCursor
from monkey.models import MonkeyError

BIG = 200 << 20  # bytes of log in the large-file test
RSS_LIMIT = 100 << 20  # what `monkey logs` may take, whatever the log's size


def _lines(data: bytes) -> list[bytes]:
    """Lines as `tail` counts them: ended by b"\\n", the last one maybe unterminated."""
    return re.findall(rb"[^\n]*\n|[^\n]+$", data)


def _read(paths: list[Path], tail: int | None = None, **kw: int) -> bytes:
    cursor = LogCursor(**kw)
    if tail is not None:
        cursor.skip_to_tail(paths, tail)
    return b"".join(piece for _, _, piece in cursor.read(paths))


def _files(tmp_path: Path, parts: list[bytes]) -> list[Path]:
    paths = []
    for i, data in enumerate(parts, 1):
        (tmp_path / str(i)).mkdir(exist_ok=True)
        path = tmp_path / str(i) / "stdout.log"
        path.write_bytes(data)
        paths.append(path)
    return paths


@settings(max_examples=300, deadline=None)
@given(
    parts=st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"x", b"\n")), max_size=4),
    n=st.integers(0, 12),
)
def test_tail_of_attempts_equals_the_last_lines_of_their_concatenation(tmp_path_factory, parts, n):
    """Any bytes (CRLF, invalid UTF-8, no final newline), tails spanning attempts, small blocks."""
    tmp = tmp_path_factory.mktemp("t")
    paths = _files(tmp, parts)
    saved = logfiles.BLOCK, logfiles.CHUNK
    logfiles.BLOCK, logfiles.CHUNK = 3, 5  # so that lines cross block and piece boundaries
    try:
        whole = b"".join(parts)
        assert _read(paths) == whole
        assert _read(paths, tail=n) == (b"".join(_lines(whole)[-n:]) if n else b"")
    finally:
        logfiles.BLOCK, logfiles.CHUNK = saved


def test_tail_edge_cases(tmp_path):
    paths = _files(tmp_path, [b"a\r\nb\n", b"", b"\xff\xfe c\nno newline"])
    assert _read(paths, tail=1) == b"no newline"
    assert _read(paths, tail=2) == b"\xff\xfe c\nno newline"
    assert _read(paths, tail=3) == b"b\n\xff\xfe c\nno newline"
    assert _read(paths, tail=99) == b"a\r\nb\n\xff\xfe c\nno newline"
    assert _read(paths, tail=0) == b""
    assert _read(paths + [tmp_path / "3" / "missing.log"], tail=1) == b"no newline"
    assert _read([], tail=5) == b""
    with pytest.raises(MonkeyError, match="0 lines or more"):
        _read(paths, tail=-1)


def test_first_bytes_starts_on_a_whole_line(tmp_path):
    """The dashboard's opening view: the last lines within a byte budget, from a line start."""
    (path,) = _files(tmp_path, [b"one\ntwo\nthree\n"])
    assert _read([path], first_bytes=7) == b"three\n"
    assert _read([path], first_bytes=10) == b"two\nthree\n"
    assert _read([path], first_bytes=100) == b"one\ntwo\nthree\n"
    cursor = LogCursor(first_bytes=7)
    assert [(off, data) for _, off, data in cursor.read([path], limit=2)] == [(8, b"th")]
    assert [(off, data) for _, off, data in cursor.read([path])] == [(10, b"ree\n")]


def _big_job(monkey, home: Path) -> tuple[str, Path]:
    """A job whose stdout.log holds BIG bytes of one repeated line, then six distinct ones."""
    job = monkey.run(["true"], start_core=False)
    run_dir = home / "runs" / job.juid / "1"
    run_dir.mkdir(parents=True)
    monkey.store.begin_attempt(monkey.store.get_job(job.juid), "local", str(run_dir))
    block = b"the same line of output, again and again\n" * ((8 << 20) // 41)
    path = run_dir / "stdout.log"
    with open(path, "wb") as fh:
        while fh.tell() < BIG:
            fh.write(block)
        fh.write(b"".join(b"tail %d\n" % i for i in range(1, 7)) + b"last, unterminated")
    return job.juid, path


# Started from a small process: a child's peak RSS counts what it shares with its parent
# between fork and exec, and the test runner itself may be hundreds of MB by then.
_MEASURE = (
    "import os, subprocess, sys\n"
    "with open(sys.argv[1], 'wb') as fh:\n"
    "    proc = subprocess.Popen(sys.argv[2:], stdout=fh)\n"
    "    _, status, usage = os.wait4(proc.pid, 0)\n"
    "print(os.waitstatus_to_exitcode(status), usage.ru_maxrss * 1024)\n"
)


def _logs(args: list[str], out: Path) -> tuple[int, int]:
    """Run `monkey logs ARGS > out`; its exit status and peak RSS in bytes."""
    measured = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(out), sys.executable, "-m", "monkey", "logs", *args],
        capture_output=True,
        text=True,
        check=True,
    )
    code, rss = measured.stdout.split()
    return int(code), int(rss)


def test_logs_of_a_huge_file_stream_in_bounded_memory(home, monkey, tmp_path):
    juid, path = _big_job(monkey, home)
    out = tmp_path / "out.log"
    try:
        code, rss = _logs([juid, "--tail", "5"], out)
        assert code == 0
        assert out.read_bytes() == b"tail 3\ntail 4\ntail 5\ntail 6\nlast, unterminated"
        assert rss < RSS_LIMIT, f"`logs --tail 5` of {BIG >> 20} MB took {rss >> 20} MB"
        code, rss = _logs([juid], out)
        assert code == 0
        assert filecmp.cmp(path, out, shallow=False)
        assert rss < RSS_LIMIT, f"`logs` of {BIG >> 20} MB took {rss >> 20} MB"
    finally:
        path.unlink()
        out.unlink(missing_ok=True)


def test_follow_with_tail_starts_from_the_last_lines(cli, home, monkey):
    gate = Path("gate").resolve()
    job = monkey.run(
        ["sh", "-c", f"seq 1000; while [ ! -e {gate} ]; do sleep 0.05; done; echo end"]
    )
    wait_for(lambda: job.logs().endswith("1000\n"), what="the job's first output")
    follow = subprocess.Popen(
        [sys.executable, "-m", "monkey", "logs", "--follow", "--tail", "2", job.juid],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert [follow.stdout.readline() for _ in range(2)] == ["999\n", "1000\n"]
        gate.touch()
        out = follow.communicate(timeout=90)[0]  # a hang guard, not a timing
    finally:
        follow.kill()
        follow.wait()
    assert (follow.returncode, out) == (0, "end\n")
    bad = cli("logs", "--tail", "-1", job.juid)
    assert (bad.returncode, bad.stderr.count("\n")) == (2, 1)
    assert "--tail must be >= 0" in bad.stderr


def _write_run(folder: Path, writes: list[tuple[bool, bytes]], marks: set[int]) -> dict:
    """stdout.log, stderr.log and output.order as an agent marking before each write
    numbered in MARKS leaves them; {False: stdout's bytes, True: stderr's}."""
    data = {False: b"", True: b""}
    order = ""
    for k, (to_err, piece) in enumerate(writes):
        if k in marks:
            order += f"{len(data[False])} {len(data[True])}\n"
        data[to_err] += piece
    (folder / "stdout.log").write_bytes(data[False])
    (folder / "stderr.log").write_bytes(data[True])
    (folder / "output.order").write_text(order)
    return data


def _interleaved(folder: Path) -> bytes:
    segments = logfiles.interleaved(
        folder / "stdout.log", folder / "stderr.log", folder / "output.order"
    )
    return b"".join(logfiles.read_segments(segments))


@settings(max_examples=200, deadline=None)
@given(
    writes=st.lists(
        st.tuples(st.booleans(), st.binary(max_size=12)).map(
            lambda w: (w[0], bytes(b"xy\n"[c % 3] if w[0] else b"ab\n"[c % 3] for c in w[1]))
        ),
        max_size=30,
    ),
    marks=st.sets(st.integers(0, 30)),
)
def test_logs_put_stdout_and_stderr_together_in_whole_lines(tmp_path_factory, writes, marks):
    """Partial writes, marks at any byte: no line of one file is cut by a line of the other,
    each file's lines keep their order, nothing is lost or shown twice."""
    folder = tmp_path_factory.mktemp("run")
    writes += [(False, b"\n"), (True, b"\n")]  # both files end their last line
    data = _write_run(folder, writes, marks)
    shown = _lines(_interleaved(folder))

    def of(letters: bytes, lines: list[bytes]) -> list[bytes]:  # a mixed line is of neither
        return [line for line in lines if line != b"\n" and set(line) <= set(letters + b"\n")]

    assert of(b"ab", shown) == of(b"ab", _lines(data[False]))
    assert of(b"xy", shown) == of(b"xy", _lines(data[True]))
    assert len(shown) == len(_lines(data[False])) + len(_lines(data[True]))


def test_logs_show_a_line_written_in_two_parts_whole(tmp_path):
    writes = [(False, b"epoch 1 lo"), (True, b"warning: slow\n"), (False, b"ss 0.5\n")]
    _write_run(tmp_path, writes, {1, 2})
    assert _interleaved(tmp_path) == b"warning: slow\nepoch 1 loss 0.5\n"
    # A job still writing its last line: the part so far comes last.
    _write_run(tmp_path, [(False, b"epoch 2 lo"), (True, b"warning\n")], {1})
    assert _interleaved(tmp_path) == b"warning\nepoch 2 lo"
    # A line longer than a search block is not held back: its start is not searched for.
    long = b"=" * (logfiles.BLOCK + 10)
    _write_run(tmp_path, [(False, b"0\n" + long), (True, b"warning\n"), (False, b"\n")], {1, 2})
    assert _interleaved(tmp_path) == b"0\n" + long + b"warning\n\n"


def test_logs_of_a_job_keep_a_line_it_flushed_in_two_parts_whole(cli, home, monkey):
    job = monkey.run(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "print('epoch 1 lo', end='', flush=True); time.sleep(0.8)\n"
            "print('warning: slow', file=sys.stderr, flush=True); time.sleep(0.8)\n"
            "print('ss 0.5')\n",
        ]
    )
    assert job.wait() == "succeeded"
    marks = (home / "runs" / job.juid / "1" / "output.order").read_text().splitlines()
    assert marks[:2] == ["10 0", "10 14"]  # the agent saw the line cut by the warning
    assert cli("logs", job.juid, check=True).stdout == "warning: slow\nepoch 1 loss 0.5\n"


def test_a_damaged_order_file_is_read_past(tmp_path):
    _write_run(tmp_path, [(False, b"a\n"), (True, b"b\n"), (False, b"c\n")], {1, 2})
    with open(tmp_path / "output.order", "ab") as fh:  # not text, a digit int() refuses, huge
        fh.write(b"\xff\xfe 1\n\xc2\xb2 1\n" + b"9" * 5000 + b" 1\n-1 2\n")
    assert _interleaved(tmp_path) == b"a\nb\nc\n"
