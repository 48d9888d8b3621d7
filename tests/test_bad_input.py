"""Bad input gets one clear line on stderr, a non-zero exit, and changes nothing."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import resource
import shutil
import sqlite3
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import REPO


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
        (["list", "providers", "--all"], ["--all goes with --monkey-instances"]),
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
        (
            ["run", "--retries", "99999999999999999999", "--", "true"],
            ["--retries must be", "0 to 1000"],
        ),
        (["run", "--memory", "nan", "--", "true"], ["memory 'nan' is not a size"]),
        (["run", "--memory", "inf", "--", "true"], ["memory 'inf' is not a size"]),
        (["run", "--memory", "1e400G", "--", "true"], ["memory '1e400G' is not a size"]),
        (
            ["sweep", "--random", "2", "--uniform", "lr=-inf:inf", "--", "echo", "{lr}"],
            ["'lr'", "finite"],
        ),
        (["sweep", "--grid", "lr=nan,0.1", "--", "echo", "{lr}"], ["'lr'", "nan is not a finite"]),
        # "²" passes str.isdigit() but not int(): a number is ASCII digits
        (["plot", "last", "-m", "loss", "-o", "x.png", "--size", "²x600"], ["--size", "WIDTHxH"]),
        (["server", "start", "--bind", "127.0.0.1:²"], ["--bind", "give HOST:PORT"]),
        (["provider", "add", "slurm", "gpu", "--login", "u@h:²"], ["--login", "user@host:port"]),
        (
            ["notify", "add", "ops", "email", "a@b.c", "--smtp", "h:²", "--no-check"],
            ["--smtp 'h:²'", "HOST[:PORT]"],
        ),
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
    _one_line_error(
        cli("run", "--dataset", "data.csv:1st", "--", "true"),
        "name '1st' is not valid",
        "data.csv:train",
    )
    assert _db_state(home) == before


@pytest.mark.parametrize(
    ("content", "needles"),
    [
        ("providers: [unclosed", ["invalid YAML", "providers.yml"]),
        ("providers:\n  x: {type: banana}\n", ["type 'banana'", "use one of"]),
        ("providers:\n  local: {type: local, slots: -1}\n", ["slots must be a positive integer"]),
        ("providers:\n  local: {type: local, colour: red}\n", ["unknown key 'colour'"]),
        (  # one agent serves this machine: two entries looped between dispatching and queued
            "providers:\n  cpu: {type: local, slots: 1}\n",
            ["providers 'cpu' and 'local' are both this machine", "keep one entry, named local"],
        ),
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


def test_huge_list_limit_lists_everything(cli, home):
    proc = cli("list", "jobs", "--limit", "99999999999999999999")
    assert proc.returncode == 0, proc.stderr
    assert "no jobs yet" in proc.stdout


def test_providers_file_not_utf8(cli, home):
    cli("list", "jobs", check=True)
    (home / "providers.yml").write_bytes(b"providers:\n  local: {type: local}\n# caf\xe9\n")
    _one_line_error(cli("list", "providers"), "providers.yml is not UTF-8", "save it as UTF-8")


@pytest.mark.parametrize(
    ("content", "needles"),
    [
        ("command: 5\nparameters: {lr: [1, 2]}\n", ["command must be text", "got 5"]),
        ('command: "python t.py \'{lr}"\nparameters: {lr: [1, 2]}\n', ["No closing quotation"]),
        (
            "command: echo {lr}\nmetric: {name: acc, goal: [max]}\nparameters: {lr: [1, 2]}\n",
            ["goal ['max'] is not max or min"],
        ),
        ("command: echo {lr}\nname: [a]\nparameters: {lr: [1, 2]}\n", ["name must be text"]),
        (
            "command: echo {lr}\nmethod: random\ncount: 2\n"
            "parameters: {lr: {distribution: uniform, min: -.inf, max: .inf}}\n",
            ["finite"],
        ),
        ("command: echo {lr}\nparameters: {lr: [.nan]}\n", ["nan is not a finite number"]),
    ],
)
def test_bad_sweep_files(cli, home, content, needles):
    cli("list", "jobs", check=True)
    Path("sweep.yml").write_text(content)
    before = _db_state(home)
    _one_line_error(cli("sweep", "--file", "sweep.yml"), *needles)
    assert _db_state(home) == before


def test_nul_bytes_are_refused_at_submit(cli, monkey, home):
    """No program can receive a NUL byte: refused when submitted, not when started."""
    from monkey.models import MonkeyError

    before = _db_state(home)
    with pytest.raises(MonkeyError, match="NUL byte"):
        monkey.run(["echo", "a\0b"], start_core=False)
    with pytest.raises(MonkeyError, match="NUL byte"):
        monkey.run(["true"], env={"SEED": "1\0"}, start_core=False)
    Path("job.yml").write_text('run:\n  env_type: none\n  env:\n    - SEED: "1\\0"\n')
    _one_line_error(cli("run", "--", "true"), "--env SEED", "NUL byte")
    Path("job.yml").unlink()
    Path("sweep.yml").write_text('command: echo {x}\nparameters: {x: ["a\\0b"]}\n')
    _one_line_error(cli("sweep", "--file", "sweep.yml"), "NUL byte")
    assert _db_state(home) == before


# -- hostile config files: bounded in size, regular files only, aliases bounded -------


def _alias_bomb(levels: int = 9) -> str:
    """YAML of a few hundred bytes whose aliases expand to 10**LEVELS values."""
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def _limited_monkey(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`monkey ARGS` with 1 GB of address space and 60 s: a hostile file cannot take the
    machine down with the test."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    return subprocess.run(
        [sys.executable, "-m", "monkey", *args],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=limit,
        cwd=cwd,
    )


HOSTILE = {
    "alias bomb": (lambda path, text: path.write_text(_alias_bomb() + text), "over 100,000 values"),
    "alias loop": (
        lambda path, text: path.write_text("loop: &l [*l]\n" + text),
        "refers to the value that contains it",
    ),
    "fifo": (lambda path, text: os.mkfifo(path), "not a regular file"),
    "/dev/zero": (lambda path, text: path.symlink_to("/dev/zero"), "not a regular file"),
    "100 MB": (lambda path, text: path.write_text(text + "#" * (100 << 20) + "\n"), "over 1 MB"),
}


@pytest.mark.parametrize("kind", HOSTILE)
def test_hostile_providers_file(cli, home, kind):
    cli("list", "jobs", check=True)
    make, needle = HOSTILE[kind]
    path = home / "providers.yml"
    make(path, "providers:\n  local: {type: local, slots: 2}\n")
    before = _db_state(home)
    for args in (["list", "providers"], ["run", "--", "true"]):
        _one_line_error(_limited_monkey(*args), str(path), needle)
    assert _db_state(home) == before


@pytest.mark.parametrize("kind", HOSTILE)
def test_hostile_job_file(cli, home, kind):
    cli("list", "jobs", check=True)
    make, needle = HOSTILE[kind]
    path = Path("job.yml")
    make(path, "name: hostile\n")
    before = _db_state(home)
    _one_line_error(_limited_monkey("run", "--", "true"), str(path.resolve()), needle)
    assert _db_state(home) == before


@pytest.mark.parametrize("kind", HOSTILE)
def test_hostile_sweep_file(cli, home, kind):
    cli("list", "jobs", check=True)
    make, needle = HOSTILE[kind]
    path = Path("sweep.yml")
    make(path, "command: echo {lr}\nparameters: {lr: [1, 2]}\n")
    before = _db_state(home)
    _one_line_error(_limited_monkey("sweep", "--file", "sweep.yml"), "sweep.yml", needle)
    assert _db_state(home) == before


# -- a project folder cannot break the core or the agent ------------------------------

SHADOWS = ("json", "random", "types", "signal", "copy", "string", "logging", "tempfile")


def _monkey_script(
    *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`monkey ARGS` through the launcher script, as the installed command runs: the
    current folder is not on its sys.path (unlike `python -m monkey`)."""
    return subprocess.run(
        [sys.executable, str(REPO / "monkey.py"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


@pytest.mark.system  # the CLI in a subprocess, and a core
def test_project_modules_named_like_the_standard_library(home):
    """A project's json.py, signal.py... stop neither the core nor the agent."""
    for name in SHADOWS:
        Path(f"{name}.py").write_text(f"raise SystemExit('the project {name}.py was imported')\n")
    proc = _monkey_script("run", "--follow", "--", "echo", "ran")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "ran\n"
    core = int((home / "daemon.pid").read_text())
    assert os.readlink(f"/proc/{core}/cwd") == str(home)
    assert "was imported" not in (home / "daemon.log").read_text()


@pytest.mark.system  # the CLI in a subprocess
def test_core_that_cannot_start_fails_the_command(home):
    """`monkey run` says the job is queued but the core could not start, and why; the
    job runs once the core can start."""
    env = dict(os.environ, MONKEY_LOG_LEVEL="nonsense")  # the core's logging set-up fails
    proc = _monkey_script("run", "--", "echo", "later", env=env)
    assert proc.returncode == 1
    assert proc.stdout == ""
    _one_line_error(
        proc, "is queued, but the core could not start", "Unknown level: 'nonsense'", "daemon.log"
    )
    juid = proc.stderr.split("job ")[1].split()[0]
    _one_line_error(_monkey_script("daemon", "start", env=env), "the core could not start")
    assert _monkey_script("daemon", "status").returncode == 3
    assert _monkey_script("logs", "--follow", juid).stdout == "later\n"


# -- the database: damaged pages, another program's file -------------------------------


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_database_with_a_damaged_page(cli, home):
    """A real monkey.db with one page overwritten: every command says which file is damaged
    and how to recover it; the core refuses to start on it; the file is left as it was."""
    from monkey.api import Monkey

    m = Monkey(home)
    juids = [m.run(["echo", "x" * 300, str(i)], start_core=False).juid for i in range(40)]
    m.store.close()  # the last connection folds the WAL into the file
    db = home / "monkey.db"
    con = sqlite3.connect(db)
    page = con.execute("SELECT rootpage FROM sqlite_master WHERE name = 'jobs'").fetchone()[0]
    size = con.execute("PRAGMA page_size").fetchone()[0]
    con.close()
    with open(db, "r+b") as fh:
        fh.seek((page - 1) * size)
        fh.write(bytes(range(256)) * (size // 256))
    digest = _sha(db)
    for args in (
        ["list", "jobs"],
        ["info", "job", juids[20]],
        ["run", "--", "true"],
        ["daemon", "start"],
    ):
        _one_line_error(cli(*args), f"{db} is damaged", f"sqlite3 {db} .recover")
    assert cli("daemon", "status").returncode == 3
    assert _sha(db) == digest


def test_another_programs_database_is_refused_untouched(cli, home):
    home.mkdir(parents=True, exist_ok=True)
    db = home / "monkey.db"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE notes(body TEXT)")
    con.execute("INSERT INTO notes VALUES ('mine')")
    con.commit()
    con.close()
    digest = _sha(db)
    _one_line_error(cli("list", "jobs"), str(db), "another program", "move it aside")
    _one_line_error(cli("run", "--", "true"), "another program")
    assert _sha(db) == digest
    assert not (home / "monkey.db-wal").exists()


# -- MONKEY_HOME that cannot be used; a socket folder of another user ------------------

NOBODY = 65534


def _as_user(uid: int, work) -> str:
    """Run WORK() in a forked child as UID (root only); its result or error, as text.
    Everything WORK needs must be imported already: the child cannot read /root."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            result = str(work())
        except BaseException as exc:  # noqa: B036 - reported to the parent
            result = f"{type(exc).__name__}: {exc}"
        os.write(write_end, result.encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as fh:
        answer = fh.read().decode()
    os.waitpid(pid, 0)
    return answer


def test_monkey_home_that_is_a_file(cli, home, tmp_path):
    home.parent.mkdir(parents=True, exist_ok=True)
    home.write_text("not a folder\n")
    _one_line_error(cli("list", "jobs"), f"{home} is a file, not a folder")
    _one_line_error(cli("run", "--", "true"), "is a file, not a folder")
    assert home.read_text() == "not a folder\n"


def test_monkey_home_of_another_user(cli, home):
    home.mkdir(parents=True)
    if os.getuid() == 0:
        os.chown(home, NOBODY, NOBODY)
    else:
        os.environ["MONKEY_HOME"] = "/"  # root's, for a user that is not root
    _one_line_error(cli("list", "jobs"), "belongs to another user", "set MONKEY_HOME")
    _one_line_error(cli("run", "--", "true"), "belongs to another user")


def test_unwritable_monkey_home(tmp_path):
    from monkey.shell import cli, table  # noqa: F401 - loaded before the child drops root

    def list_jobs() -> str:
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            code = cli.main(["list", "jobs"])
        return f"exit {code}: {err.getvalue()}"

    home = Path(tempfile.mkdtemp(prefix="monkey-ro-"))
    try:
        os.environ["MONKEY_HOME"] = str(home / "mh")
        if os.getuid() == 0:
            os.chown(home, NOBODY, NOBODY)
            os.chmod(home, 0o500)
            answer = _as_user(NOBODY, list_jobs)
        else:
            os.chmod(home, 0o500)
            answer = list_jobs()
    finally:
        os.environ.pop("MONKEY_HOME")
        os.chmod(home, 0o700)
        shutil.rmtree(home)
    assert answer.startswith("exit 1: monkey: error: MONKEY_HOME") and answer.count("\n") == 1
    assert "cannot be used (Permission denied" in answer and "fix its permissions" in answer


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to act as a second user")
def test_socket_folder_of_another_user_refuses_before_recording(tmp_path):
    """A long MONKEY_HOME keeps its sockets in /tmp/monkey-UID; when another user owns that
    folder, `run` fails with one line and records nothing."""
    from monkey.api import Monkey
    from monkey.models import MonkeyError

    short = Path(f"/tmp/monkey-{NOBODY}")
    if os.path.lexists(short):
        pytest.skip(f"{short} exists already; this test needs to create it")
    base = Path(tempfile.mkdtemp(prefix="monkey-sock-"))
    home = base / ("deep-" * 20) / "mh"
    project = base / "project"
    try:
        project.mkdir()
        (project / "train.py").write_text("print(1)\n")
        Monkey(home).run(["true"], workdir=project, start_core=False).monkey.store.close()
        for path in [base, *base.rglob("*")]:
            os.chown(path, NOBODY, NOBODY)
        short.mkdir(mode=0o700)  # root's: another user's, for nobody

        def submit() -> str:
            m = Monkey(home)
            try:
                m.run(["true"], workdir=project)
            except MonkeyError as exc:
                return f"refused: {exc}"
            finally:
                m.store.close()
            return "accepted"

        answer = _as_user(NOBODY, submit)
        con = sqlite3.connect(home / "monkey.db")
        jobs = con.execute("SELECT COUNT(*) FROM jobs").fetchone()[0]
        con.close()
    finally:
        short.rmdir()
        shutil.rmtree(base)
    assert answer.startswith("refused: ") and f"{short} is not a private folder" in answer
    assert jobs == 1


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to mount a read-only bind")
def test_read_only_monkey_home_is_one_line(cli, home, tmp_path, monkeypatch):
    """A MONKEY_HOME on a read-only mount (root writes past any chmod): `daemon status` says
    the core cannot start there and why; `daemon start` / `daemon run` refuse in one line."""
    cli("list", "jobs", check=True)  # a home made while it could be written
    mount = tmp_path / "ro"
    mount.mkdir()
    subprocess.run(["mount", "--bind", str(home), str(mount)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(mount)], check=True)
        monkeypatch.setenv("MONKEY_HOME", str(mount))
        status = cli("daemon", "status")
        assert status.returncode == 3 and "Traceback" not in status.stderr, status.stderr
        why = (
            f"MONKEY_HOME {mount} cannot be written (it is on a read-only file system): the "
            "core keeps its database there; remount it read-write, or set MONKEY_HOME to a "
            "folder you may write to"
        )
        assert status.stdout.splitlines()[0] == f"core not running; it cannot start: {why}"
        for action in ("start", "run"):
            _one_line_error(cli("daemon", action), f"monkey: error: the core cannot start: {why}")
        assert cli("daemon", "stop", check=True).stdout == "core was not running\n"
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_a_second_core_names_the_first_while_it_starts(cli, home):
    """The first core holds the lock but has yet to write its pid: the second names it by
    its real pid (from the lock), never "pid -1"; `daemon status` too."""
    import fcntl

    cli("list", "jobs", check=True)
    with open(home / "private" / "daemon.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # this process is the core that starts
        second = cli("daemon", "run")
        assert second.returncode == 1
        assert second.stderr == (
            f"monkey: a core is already running for {home} (pid {os.getpid()}, still starting)\n"
        )
        status = cli("daemon", "status").stdout.splitlines()[0]
        assert status == f"core running (pid {os.getpid()}, still starting) for {home}"


def test_gc_grace_takes_a_bare_zero(cli, home):
    """`gc --grace 0` is no grace at all; any other bare number asks for its unit."""
    cli("list", "jobs", check=True)
    assert cli("gc", "--grace", "0", check=True).stdout.startswith("freed 0 B")
    _one_line_error(cli("gc", "--grace", "30"), "'30' is not an age", "e.g. 30d, 12h, 90m")


def test_info_job_escapes_control_characters_of_a_name(cli, home):
    """A name (or command) with a newline or an escape sequence is shown escaped, on its
    own line, as `list jobs` shows it: nothing printed can forge a field or recolour."""
    juid = cli(
        "run", "--name", "two\nlines\x1b[31m", "--", "echo", "a\nb", check=True
    ).stdout.strip()
    shown = [
        " ".join(line.split()) for line in cli("info", "job", juid, check=True).stdout.splitlines()
    ]
    assert "name two\\nlines\\x1b[31m" in shown, shown
    assert "command echo 'a\\nb'" in shown, shown
    assert "\x1b" not in "\n".join(shown)
    assert "two\\nlines\\x1b[31m" in cli("list", "jobs", check=True).stdout


def test_an_option_of_another_sub_command_is_not_suggested_as_itself(cli, home):
    proc = cli("list", "sweeps", "--all")
    _one_line_error(proc, "unrecognized arguments: --all")
    assert "did you mean --all" not in proc.stderr


def test_a_damaged_home_id_or_token_file_is_one_line(cli, home, tmp_path, monkeypatch):
    from monkey.config import Home
    from monkey.models import MonkeyError

    Home(home).ensure()
    (home / "home_id").write_bytes(b"\xff\xfe" * 6)  # not text: a disk's damage
    with pytest.raises(MonkeyError, match=r"home_id holds .*, not a home id; delete it"):
        Home(home).home_id()
    config = tmp_path / "config"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config))
    (config / "monkey").mkdir(parents=True)
    remotes = {"default": None, "remotes": {"lab": {"url": "https://127.0.0.1:9"}}}
    (config / "monkey" / "remotes.json").write_text(json.dumps(remotes))
    (config / "monkey" / "lab.token").write_bytes(b"\xff\xfe\n")
    _one_line_error(
        cli("--remote", "lab", "list", "jobs"), "lab.token cannot be read", "add the remote again"
    )


def test_a_columns_variable_that_is_no_number_is_ignored(cli, home, monkeypatch):
    cli("run", "--", "true", check=True)
    monkeypatch.setenv("COLUMNS", "²")
    listing = cli("list", "jobs", check=True)
    assert listing.stdout.startswith("JOB") and listing.stderr == ""


def test_a_damaged_core_version_restarts_the_core_on_the_next_command(cli, home):
    cli("daemon", "start", check=True)
    (home / "private" / "core.version").write_bytes(b"\xff\xfe")  # not text
    status = cli("daemon", "status", check=True)
    assert "outdated: the next command restarts it" in status.stdout and not status.stderr
    juid = cli("run", "--", "true", check=True).stdout.strip()
    assert cli("logs", "--follow", juid).returncode == 0
    mine = cli("daemon", "status", check=True).stdout
    assert "outdated" not in mine and "\ufffd" not in mine


@pytest.mark.parametrize(
    ("name", "value"), [("MONKEY_KILL_GRACE", "ten"), ("MONKEY_HEARTBEAT_TIMEOUT", "-1")]
)
def test_a_core_setting_that_is_no_number_of_seconds_is_named(cli, home, monkeypatch, name, value):
    before = os.environ.get(name)
    monkeypatch.setenv(name, value)
    refused = cli("run", "--", "true")
    _one_line_error(refused, f"{name}={value!r} is not a number of seconds; unset it", "queued")
    juid = refused.stderr.split("job ")[1].split()[0]
    if before is None:
        monkeypatch.delenv(name)
    else:
        monkeypatch.setenv(name, before)
    assert cli("logs", "--follow", juid).returncode == 0  # the job kept runs once it is fixed


def test_a_monkey_home_that_is_a_folder_of_other_files_is_refused_untouched(tmp_path):
    """MONKEY_HOME pointed at a folder that is not a monkey home (here a stand-in for `/` or
    a project): one line, and no folder of monkey's made in it, no permission taken away
    (monkey took group and other permissions off every entry of `/` once)."""
    folder = tmp_path / "machine"
    (folder / "usr").mkdir(parents=True)
    (folder / "notes.txt").write_text("mine\n")
    os.chmod(folder, 0o755)
    os.chmod(folder / "usr", 0o755)
    env = {**os.environ, "MONKEY_HOME": str(folder)}
    proc = subprocess.run(
        [sys.executable, "-m", "monkey", "list", "jobs"], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"monkey: error: MONKEY_HOME {folder} is a folder of other files, not a monkey home (it "
        "has no monkey.db); set MONKEY_HOME to a new or empty folder"
    ]
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt", "usr"]
    assert stat.S_IMODE(folder.stat().st_mode) == 0o755
    assert stat.S_IMODE((folder / "usr").stat().st_mode) == 0o755
    only_config = tmp_path / "fresh"
    only_config.mkdir()
    (only_config / "providers.yml").write_text("providers:\n  local: {type: local}\n")
    env["MONKEY_HOME"] = str(only_config)
    done = subprocess.run(
        [sys.executable, "-m", "monkey", "list", "jobs"], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr  # a providers.yml written first is a home
