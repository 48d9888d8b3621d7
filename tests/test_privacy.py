"""A private MONKEY_HOME and secrets kept out of it: what another user of the machine can
read, where symlinks leading out of a project end up, and where secret values are stored."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from monkey.models import is_secret, is_secret_name
from monkey.store.db import Store
from tests import test_ssh
from tests.conftest import kill_all

OTHER_UID = 65534  # nobody: any uid that is not ours


def everything_under(root: Path) -> list[Path]:
    """Every folder and file under ROOT, ROOT included (links are not followed)."""
    found = [root]
    for folder, dirs, files in os.walk(root):
        found += [Path(folder, name) for name in (*dirs, *files)]
    return found


@pytest.fixture
def reachable_home(home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A MONKEY_HOME in a fresh folder of /tmp open to everyone, so that only its own
    permissions stand between another user and its files. (Not HOME with the folders above
    it opened: pytest's are 0700 and shared by the workers of a parallel run, and one test
    closing them again while another looked made that one see nothing.)"""
    if os.getuid() != 0:
        pytest.skip("needs root to act as another user")
    base = Path(tempfile.mkdtemp(prefix="monkey-privacy-"))
    os.chmod(base, 0o755)
    assert all(stat.S_IMODE(p.stat().st_mode) & 0o005 == 0o005 for p in base.parents)
    root = base / "mh"
    monkeypatch.setenv("MONKEY_HOME", str(root))
    try:
        yield root
    finally:
        kill_all(f"MONKEY_HOME={root}")
        shutil.rmtree(base, ignore_errors=True)


def readable_by_another_user(paths: list[Path]) -> list[str]:
    """The PATHS a process of another uid (and no group of ours) can list or read."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        found: list[str] = []
        try:
            os.setgroups([])
            os.setgid(OTHER_UID)
            os.setuid(OTHER_UID)
            for path in paths:
                try:
                    if path.is_dir():
                        os.listdir(path)
                    else:
                        with open(path, "rb") as f:
                            f.read(1)
                    found.append(str(path))
                except OSError:
                    pass
        except BaseException as e:
            found = [f"error: {e!r}"]
        finally:
            os.write(write_end, json.dumps(found).encode())
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        answer = json.loads(f.read())
    os.waitpid(pid, 0)
    return answer


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def login_umask() -> int:
    """The umask of an SSH session on a lab host: the sshd the tests start has this one's."""
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1], 8) for line in fh if line.startswith("Umask:"))


def blob_files(home: Path) -> list[Path]:
    return [p for p in (home / "blobs").glob("??/*")]


# -- finding 7: nobody else can read MONKEY_HOME -----------------------------------------


def test_another_user_can_read_nothing_a_job_left_in_monkey_home(cli, reachable_home):
    home = reachable_home
    Path("job.yml").write_text("run:\n  env:\n    - HF_TOKEN: hf_not_a_real_token_but_long\n")
    Path(".env").write_text("DB_PASS=from-the-dot-env\n")
    os.chmod(".env", 0o600)
    Path("run.sh").write_text("#!/bin/sh\necho out; echo err >&2; ls -l .env run.sh\n")
    os.chmod("run.sh", 0o755)
    Path("data.csv").write_text("1,2\n")
    proc = cli("run", "--env", "API_TOKEN=x", "--dataset", "data.csv", "--follow", "--", "./run.sh")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("out\n")
    # File modes are kept in the job's folder (`ls` lines; "err" may come before or after
    # them, as the follow interleaves the two streams by when they were seen written) ...
    listed = {line.split()[-1]: line for line in proc.stdout.splitlines() if line.startswith("-")}
    assert listed[".env"].startswith("-rw------- ")
    assert listed["run.sh"].startswith("-rwxr-xr-x ")
    # ... while everything under MONKEY_HOME is the user's alone.
    assert readable_by_another_user(everything_under(home)) == []
    assert mode(home) == 0o700
    for entry in home.iterdir():
        assert mode(entry) & 0o077 == 0, f"{entry} is {oct(mode(entry))}"
    run = next((home / "runs").iterdir())
    private_files = [
        *home.glob("monkey.db*"),
        home / "daemon.log",
        home / "agent.log",
        *(home / "secrets").iterdir(),
        *(run / "1" / name for name in ("stdout.log", "stderr.log", "events.jsonl")),
    ]
    assert len(private_files) >= 7
    for path in private_files:
        assert mode(path) == 0o600, f"{path} is {oct(mode(path))}"
    blobs = {mode(p) for p in blob_files(home)}
    assert blobs == {0o400, 0o500}  # read-only, the owner's only; run.sh stays executable


def test_an_older_home_is_made_private_on_first_use(cli, reachable_home):
    """A home written by an earlier monkey (0755 folders, 0644 files, 0444 blobs)."""
    home = reachable_home
    home.mkdir()
    Store(home / "monkey.db").close()
    (home / "daemon.log").write_text("an old log\n")
    (home / "blobs" / "ab").mkdir(parents=True)
    (home / "blobs" / "ab" / "cdef").write_text("an old blob\n")
    os.chmod(home / "blobs" / "ab" / "cdef", 0o444)
    (home / "runs" / "26-01-01-001" / "1").mkdir(parents=True)
    (home / "runs" / "26-01-01-001" / "1" / "stdout.log").write_text("old output\n")
    for path in everything_under(home):
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    assert len(readable_by_another_user(everything_under(home))) > 5

    assert cli("list", "jobs").returncode == 0
    assert readable_by_another_user(everything_under(home)) == []
    assert mode(home) == 0o700
    modes = {entry.name: mode(entry) for entry in home.iterdir()}
    assert {name: modes[name] for name in ("monkey.db", "daemon.log", "blobs", "runs")} == {
        "monkey.db": 0o600,
        "daemon.log": 0o600,
        "blobs": 0o700,
        "runs": 0o700,
    }
    assert all(m & 0o077 == 0 for m in modes.values()), modes


def test_a_symlink_out_of_the_project_is_recorded_never_read(cli, home, tmp_path):
    """`leak -> /etc/shadow` in the working folder: the job gets the link, MONKEY_HOME never
    gets what it points to; links inside the project still bring their target along."""
    shadow = tmp_path / "shadow"
    shadow.write_text("root:SECRET-SHADOW-LINE:19000::::::\n")
    (tmp_path / "disk").mkdir()
    (tmp_path / "disk" / "big.bin").write_text("SECRET-DISK-DATA\n")
    Path("a.py").write_text("print('a')\n")
    os.symlink(shadow, "leak")
    os.symlink(tmp_path / "disk", "data")
    os.symlink("a.py", "same.py")
    proc = cli("run", "--follow", "--", "sh", "-c", "readlink leak data; cat same.py")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"{shadow}\n{tmp_path / 'disk'}\nprint('a')\n"
    assert (
        f"monkey: note: 2 symlink(s) leave the project and were recorded as links: "
        f"data -> {tmp_path / 'disk'}, leak -> {shadow}\n"
    ) in proc.stderr
    for path in everything_under(home):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            assert b"SECRET-SHADOW-LINE" not in data and b"SECRET-DISK-DATA" not in data, path


def test_the_agent_never_writes_through_a_link_a_job_made_in_its_run_folder(cli, home, tmp_path):
    """A job makes its run folder's output.order a link to a file of the machine (issue 41):
    the agent, which may run with more rights than the job, leaves that file as it was."""
    target = tmp_path / "theirs.txt"
    target.write_text("untouched\n")
    script = f"ln -sf {target} ../output.order; echo a; sleep 1.5; echo b >&2; sleep 1.5"
    proc = cli("run", "--follow", "--", "sh", "-c", script)
    assert proc.returncode == 0, proc.stderr
    assert target.read_text() == "untouched\n"


# -- finding 8: secret values stay out of MONKEY_HOME -------------------------------------

PEM = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----"
SECRETS = {
    "DB_PASS": "pw-of-the-db-7731",
    "DATABASE_URL": "postgres://user:pw-in-url-5521@db.example.org:5432/app",
    "GH": "ghp_" + "Ab1" * 12,
    "DEPLOY": PEM,
}
YML_SECRET = "hf_" + "Zq9" * 12
# The job checks its environment against a file outside MONKEY_HOME and prints OK or BAD
# (its output is stored under MONKEY_HOME, so it must not print the values).
CHECK = """\
import json, os, sys
want = json.load(open(sys.argv[1]))
print("OK" if all(os.environ.get(k) == v for k, v in want.items()) else "BAD")
"""


def test_secret_values_are_stored_only_in_the_secrets_store(cli, home, tmp_path):
    expected = tmp_path / "expected.json"
    expected.write_text(json.dumps({**SECRETS, "HF_TOKEN": YML_SECRET, "SEED": "7"}))
    Path("check.py").write_text(CHECK)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    Path("job.yml").write_text("name: private\n")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "start"], check=True)
    # An uncommitted edit of job.yml: the git diff recorded with the job must not carry it.
    Path("job.yml").write_text(
        f"name: private\nrun:\n  env:\n    - HF_TOKEN: {YML_SECRET}  # from the hub\n"
        "    - SEED: 7\n"
    )
    args = [a for k, v in SECRETS.items() for a in ("--env", f"{k}={v}")]
    proc = cli("run", *args, "--follow", "--", "python3", "check.py", str(expected))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "OK\n"  # the job saw every real value

    info = cli("info", "job", "last", "--json", check=True).stdout
    record = json.loads(info)
    assert {k: record["env"][k] for k in (*SECRETS, "HF_TOKEN")} == dict.fromkeys(
        (*SECRETS, "HF_TOKEN"), "<redacted>"
    )
    assert record["env"]["SEED"] == "7"
    assert record["spec"]["env"] == {"HF_TOKEN": "<redacted>", "SEED": "7"}
    assert record["git"]["dirty"] and record["git"]["diff"] is None  # only job.yml changed
    shipped = cli("cat", record["job"], "job.yml", check=True).stdout  # the job's copy
    assert shipped == (
        'name: private\nrun:\n  env:\n    - HF_TOKEN: "<redacted>"  # from the hub\n'
        '    - SEED: "<redacted>"\n'
    )

    values = [v.encode() for v in (*SECRETS.values(), YML_SECRET)]
    values += [b"pw-in-url-5521", b"b3BlbnNzaC1rZXktdjEAAAAA"]
    for text in (info, proc.stderr):
        assert not [v for v in values if v.decode() in text]
    secret_files = list((home / "secrets").iterdir())
    assert len(secret_files) == 1
    assert json.loads(secret_files[0].read_text()) == {**SECRETS, "HF_TOKEN": YML_SECRET}
    for path in everything_under(home):
        if path.is_file() and path.parent != home / "secrets":
            data = path.read_bytes()
            assert not [v for v in values if v in data], path


@pytest.mark.parametrize(
    "name",
    [
        "DB_PASS",
        "MYSQL_PASSWORD",
        "PASSPHRASE",
        "DB_PWD",
        "API_KEY",
        "OPENAI_API_KEY",
        "APIKEY",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_ACCESS_KEY_ID",
        "KEY",
        "HF_TOKEN",
        "GOOGLE_CREDENTIALS",
        "AUTHORIZATION",
        "OAUTH_CLIENT",
        "PRIVATE_DATA",
        "SESSION_ID",
        "COOKIE",
        "client_secret",
    ],
)
def test_secret_looking_names(name):
    assert is_secret_name(name)


@pytest.mark.parametrize(
    "name",
    [
        "PWD",
        "OLDPWD",
        "KEYBOARD",
        "MONKEY_JUID",
        "MONKEY_SEED",
        "HOTKEY",
        "GIT_AUTHOR_NAME",
        "PATH",
        "SEED",
        "LR",
        "CUDA_VISIBLE_DEVICES",
    ],
)
def test_ordinary_names(name):
    assert not is_secret_name(name)


@pytest.mark.parametrize(
    "value",
    [
        "postgres://u:pw@host/db",
        "redis://:pass@cache:6379/0",
        "https://me:tok@example.org/x",
        PEM,
        "-----BEGIN RSA PRIVATE KEY-----\nMIIE",
        "ghp_" + "a" * 36,
        "github_pat_" + "b" * 40,
        "glpat-" + "c" * 20,
        "xoxb-1234-5678-abcdef",
        "sk-" + "d" * 48,
        "sk_live_" + "e" * 24,
        "AKIAIOSFODNN7EXAMPLE",
        "hf_" + "f" * 34,
        "AIza" + "g" * 35,
        "ya29." + "h" * 40,
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
        "Bearer ghp_" + "a" * 36,
    ],
)
def test_secret_looking_values(value):
    assert is_secret("SOMETHING", value)


@pytest.mark.parametrize(
    "value",
    [
        "",
        "7",
        "0.001",
        "/usr/local/bin:/usr/bin",
        "https://example.org/data.csv",
        "http://localhost:8080/api",
        "user@example.org",
        "sk-learn",
        "resnet50",
        "hf_hub",
    ],
)
def test_ordinary_values(value):
    assert not is_secret("SOMETHING", value)


# -- issue 24 finding 6: nobody else on an SSH host can read what monkey keeps there -------


lab = test_ssh.lab  # SSH hosts on loopback


def _job_on_the_host(cli, home: Path, lab) -> tuple[Path, str, Path]:
    """A job that writes a checkpoint, reads a dataset and leaves a file in a folder the lab
    shares, run on a lab host; its workdir, its id and that folder."""
    from tests.test_ssh import configure, job_info, run, wait_state

    if os.getuid() != 0:
        pytest.skip("needs root to act as another user")
    host = lab.hosts[0]
    configure(home, [host.entry(key=lab.key)])
    shared = Path(tempfile.mkdtemp(prefix="monkey-lab-results-"))
    os.chmod(shared, 0o777)
    Path("data.csv").write_text("1,2\n")
    Path("train.py").write_text(
        "import os\n"
        "open(os.path.join(os.environ['MONKEY_CHECKPOINT_DIR'], 'model.pt'), 'w').write('w')\n"
        f"open({str(shared / 'shared.txt')!r}, 'w').write('for the lab')\n"
        "print(open('data.csv').read())\n"
    )
    juid = run(cli, "--provider", "lab", "--dataset", "data.csv", "--", "python3", "train.py")
    assert wait_state(cli, juid, "succeeded", "failed") == "succeeded", job_info(cli, juid)
    return Path(host.workdir), juid, shared


def test_another_user_of_an_ssh_host_can_read_nothing_monkey_keeps_there(cli, home, lab):
    lab.add("h1")
    workdir, juid, shared = _job_on_the_host(cli, home, lab)
    everything = everything_under(workdir)
    assert len(everything) > 15
    assert readable_by_another_user(everything) == []
    assert mode(workdir) == 0o700
    for entry in workdir.iterdir():
        assert mode(entry) & 0o077 == 0, f"{entry} is {oct(mode(entry))}"
    [tag] = (workdir / "runs").iterdir()
    kept = [
        *(workdir / "blobs").glob("??/*"),
        *(tag / juid / "1" / name for name in ("stdout.log", "stderr.log", "events.jsonl")),
    ]
    assert len(kept) >= 5
    assert mode(tag / juid / "checkpoint") == 0o700
    # What the job writes itself follows the login's umask, as without monkey: a file it
    # leaves for the lab outside monkey's folders is as readable as the user would make it
    # (inside them, the folders above it keep others out).
    left = shared / "shared.txt"
    assert left.read_text() == "for the lab"
    assert mode(left) == 0o666 & ~login_umask(), oct(mode(left))
    shutil.rmtree(shared)
    for path in kept:
        assert mode(path) & 0o077 == 0, f"{path} is {oct(mode(path))}"
    for path in everything:  # a job's code and data copies keep the project's modes inside
        if path.is_dir() and not {"work", "datasets"} & set(path.relative_to(workdir).parts[:4]):
            assert mode(path) & 0o077 == 0, f"{path} is {oct(mode(path))}"


def test_a_loose_tree_an_older_monkey_left_on_a_host_is_tightened(cli, home, lab):
    """A workdir written by an earlier monkey (0755 folders, 0644 files)."""
    host = lab.add("h1")
    workdir = Path(host.workdir)
    old_run = workdir / "runs" / "0123456789ab" / "26-01-01-001" / "1"
    old_run.mkdir(parents=True)
    (old_run / "stdout.log").write_text("an old job's output\n")
    (workdir / "blobs" / "ab").mkdir(parents=True)
    (workdir / "blobs" / "ab" / "cdef").write_text("an old job's code\n")
    for path in everything_under(workdir):
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
        shutil.chown(path, lab.user, lab.user)
    assert len(readable_by_another_user(everything_under(workdir))) > 5

    shutil.rmtree(_job_on_the_host(cli, home, lab)[2])
    assert readable_by_another_user(everything_under(workdir)) == []
    assert mode(workdir) == 0o700
    assert all(mode(entry) & 0o077 == 0 for entry in workdir.iterdir())
