"""Bad input gets one clear line on stderr, a non-zero exit, and changes nothing."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import pytest


def _db_state(home: Path) -> tuple[int, str]:
    con = sqlite3.connect(home / "monkey.db")
    try:
        count = con.execute("SELECT COUNT(*) FROM jobs").fetchone()[0]
        events = con.execute("SELECT COUNT(*) FROM events").fetchone()[0]
    finally:
        con.close()
    return count, str(events)


def _one_line_error(proc, *needles: str) -> None:
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["frobnicate"], ["unknown command 'frobnicate'"]),
        (["list", "jobs", "--bogus"], ["unrecognized arguments: --bogus"]),
        (["list", "widgets"], ["invalid choice"]),
        (["info", "job", "99-99"], ["no job matches '99-99'"]),
        (["info", "job", "nonsense!"], ["is not a job id"]),
        (["logs", "last"], ["no jobs yet"]),
        (["job", "cancel", "42-01-01-001"], ["no job matches"]),
        (["run"], ["no command given"]),
        (["run", "--cpus", "x", "--", "true"], ["invalid int value"]),
        (["run", "--cpus", "0", "--", "true"], ["--cpus must be"]),
        (["run", "--cpus", "100000", "--", "true"], ["could never run"]),
        (["run", "--workdir", "/does/not/exist", "--", "true"], ["/does/not/exist", "--workdir"]),
        (["run", "--dataset", "/no/such/data", "--", "true"], ["/no/such/data", "--dataset"]),
        (["run", "--env", "NOEQUALS", "--", "true"], ["KEY=VALUE"]),
        (["run", "--provider", "nowhere", "--", "true"], ["unknown provider 'nowhere'"]),
        (["run", "--retries", "99999999999999999999", "--", "true"], ["--retries must be", "0 to 1000"]),
    ],
)
def test_bad_commands(cli, home, args, needles):
    cli("list", "jobs", check=True)  # creates the database
    before = _db_state(home)
    _one_line_error(cli(*args), *needles)
    assert _db_state(home) == before


def test_bad_dataset_name_is_named_as_such(cli, home):
    """`--dataset data.csv:1st` names the bad name, not a missing file."""
    Path("data.csv").write_text("1\n")
    cli("list", "jobs", check=True)
    before = _db_state(home)
    _one_line_error(cli("run", "--dataset", "data.csv:1st", "--", "true"),
                    "name '1st' is not valid", "data.csv:train")
    assert _db_state(home) == before


@pytest.mark.parametrize(
    ("content", "needles"),
    [
        ("providers: [unclosed", ["invalid YAML", "providers.yml"]),
        ("providers:\n  x: {type: banana}\n", ["type 'banana'", "use one of"]),
        ("providers:\n  local: {type: local, slots: -1}\n", ["slots must be a positive integer"]),
        ("providers:\n  local: {type: local, colour: red}\n", ["unknown key 'colour'"]),
        ("nonsense: 1\n", ["unknown top-level key 'nonsense'"]),
    ],
)
def test_invalid_providers_file(cli, home, content, needles):
    cli("list", "jobs", check=True)
    (home / "providers.yml").write_text(content)
    before = _db_state(home)
    _one_line_error(cli("run", "--", "true"), *needles)
    _one_line_error(cli("list", "providers"), *needles)
    assert _db_state(home) == before


def test_unreadable_providers_file(cli, home):
    import os

    if os.getuid() == 0:
        path = home / "providers.yml"
        home.mkdir(parents=True, exist_ok=True)
        path.mkdir()  # a folder where the file should be: unreadable as a file even for root
        _one_line_error(cli("run", "--", "true"), "cannot read")
    else:
        path = home / "providers.yml"
        home.mkdir(parents=True, exist_ok=True)
        path.write_text("providers: {}\n")
        path.chmod(0)
        _one_line_error(cli("run", "--", "true"), "cannot read")


def test_newer_database_is_refused_untouched(cli, home):
    cli("list", "jobs", check=True)
    con = sqlite3.connect(home / "monkey.db")
    con.execute("PRAGMA user_version = 999")
    con.close()
    digest = hashlib.sha256((home / "monkey.db").read_bytes()).hexdigest()
    _one_line_error(cli("list", "jobs"), "newer monkey", "upgrade")
    _one_line_error(cli("run", "--", "true"), "newer monkey")
    assert hashlib.sha256((home / "monkey.db").read_bytes()).hexdigest() == digest


def test_corrupt_database_is_refused_untouched(cli, home):
    home.mkdir(parents=True, exist_ok=True)
    junk = b"this is not a database at all" * 100
    (home / "monkey.db").write_bytes(junk)
    _one_line_error(cli("list", "jobs"), "monkey.db", "move it aside")
    _one_line_error(cli("run", "--", "true"), "move it aside")
    assert (home / "monkey.db").read_bytes() == junk
