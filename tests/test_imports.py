"""One-shot commands import only what they need (docs: ARCHITECTURE.md, "Heavy imports")."""

from __future__ import annotations

import ast
import json
import os
import site
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import kill_all

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("cmd2", "textual", "libcloud", "boto3", "paramiko", "sqlite_utils", "watchdog", "rich",
         "kubernetes")  # fmt: skip


def _heavy_modules(code: str, tmp_path: Path, among: tuple[str, ...] = HEAVY) -> list[str]:
    """The modules named in AMONG (or their sub-modules) that running CODE loaded. The
    interpreter runs without `site` (-S), its packages on PYTHONPATH: a global interpreter's
    .pth files load modules of their own, as a clean virtualenv's do not."""
    path = [str(ROOT), *site.getsitepackages()]
    env = dict(os.environ, MONKEY_HOME=str(tmp_path / "home"), PYTHONPATH=os.pathsep.join(path))
    report = f"print(sorted(m for m in sys.modules if m.startswith({among!r})))"
    proc = subprocess.run(
        [sys.executable, "-S", "-c", f"import sys; {code}; {report}"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return [
        m
        for m in ast.literal_eval(proc.stdout.strip().splitlines()[-1])
        if m in among or m.startswith(tuple(f"{name}." for name in among))
    ]


def test_list_jobs_imports_nothing_heavy(tmp_path):
    code = "from monkey.shell.cli import main; main(['list','jobs'])"
    assert _heavy_modules(code, tmp_path) == []


def test_list_jobs_loads_no_other_command(tmp_path):
    """A command pays only for its own module: `list jobs` loads no other command's code,
    nor what only those need (logging for providers, hashlib for a deep MONKEY_HOME)."""
    others = tuple(
        f"monkey.shell.{m}_commands"
        for m in ("dash", "jobspec", "provider", "rerun", "disk", "tracking")
    )
    code = "from monkey.shell.cli import main; main(['list','jobs'])"
    assert _heavy_modules(code, tmp_path, (*others, "logging", "hashlib", "monkey.api")) == []


# Standard modules a one-shot command does not need, each a millisecond or more of its
# start (typing; shutil with bz2 and lzma; dataclasses with inspect; logging with traceback;
# subprocess; hashlib with OpenSSL): modules import them under TYPE_CHECKING or where used.
SLOW_STDLIB = ("typing", "shutil", "dataclasses", "inspect", "logging", "subprocess", "hashlib")


def test_list_jobs_loads_no_slow_stdlib(tmp_path):
    code = "from monkey.shell.cli import main; main(['list','jobs'])"
    assert _heavy_modules(code, tmp_path, SLOW_STDLIB) == []


def test_run_loads_no_slow_stdlib(tmp_path):
    """Submitting from a folder outside git (the second time: the first lists the installed
    packages, which loads importlib.metadata, and stores new blobs) loads none of them."""
    code = "from monkey.api import Monkey; Monkey().run(['true'], start_core=False)"
    _heavy_modules(code, tmp_path, SLOW_STDLIB)
    assert _heavy_modules(code, tmp_path, SLOW_STDLIB) == []


# What `monkey run` needs none of (issue 42, speed): the facade's other parts (loaded when a
# method of theirs is first called), the remote API's rules (read only when a remote is
# selected), the agent's link and files (a kind's rules load no transport).
NOT_FOR_RUN = ("monkey.facade", "monkey.rerun", "monkey.contract", "monkey.logfiles",
               "monkey.client_agent", "monkey.drivers.agent_link", "monkey.core.presence",
               "monkey.shell.table", "monkey.snapshot.datasets",
               # the Store's queries a submission makes none of (monkey/store/later.py)
               "monkey.store.attempts", "monkey.store.dashboard", "monkey.store.hosts",
               "monkey.store.housekeeping", "monkey.store.instance_requests",
               "monkey.store.instances", "monkey.store.jobspec", "monkey.store.notes",
               "monkey.store.notify", "monkey.store.outputs", "monkey.store.tracking",
               "monkey.store.queue", "monkey.store.quotas", "monkey.store.rerun",
               "monkey.store.users", "monkey.store.web",
               # what gettext loads to look argparse's words up (monkey/shell/common.py),
               # and socket.py's enums and selectors (the core's wake: core/daemon.py)
               "locale", "socket", "selectors")  # fmt: skip


def test_run_loads_only_the_submission_path(tmp_path):
    """`monkey run -- true` (the second: the first lists the installed packages) loads none
    of NOT_FOR_RUN."""
    from monkey.config import Home
    from monkey.core import daemon

    code = "from monkey.shell.cli import main; main(['run', '--', 'true'])"
    try:
        _heavy_modules(code, tmp_path)
        assert _heavy_modules(code, tmp_path, NOT_FOR_RUN) == []
    finally:
        daemon.stop(Home(tmp_path / "home"))
        kill_all(f"MONKEY_HOME={tmp_path / 'home'}")  # and its agent, whatever stop did


def test_in_job_api_loads_no_slow_stdlib(tmp_path):
    """`import monkey; monkey.log(...)` inside a job costs the job's start little."""
    assert _heavy_modules("import monkey; monkey.log", tmp_path, SLOW_STDLIB) == []


def test_shell_package_imports_nothing_heavy(tmp_path):
    assert _heavy_modules("import monkey.shell", tmp_path) == []


@pytest.mark.parametrize("module", ["monkey.shell.cli", "monkey"])
def test_cli_and_api_import_nothing_heavy(tmp_path, module):
    assert _heavy_modules(f"import {module}", tmp_path) == []


def test_cli_never_imports_the_shell_or_tui():
    """cli.py may load repl.py only inside main(), for `monkey` with no arguments."""
    tree = ast.parse((ROOT / "monkey" / "shell" / "cli.py").read_text())
    top = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    names = [alias.name for node in top for alias in node.names]
    names += [node.module or "" for node in top if isinstance(node, ast.ImportFrom)]
    assert not [n for n in names if n.startswith(("cmd2", "monkey.shell.repl", "monkey.tui"))]


def test_ec2_entry_validation_imports_nothing_heavy(tmp_path):
    """providers.yml is validated on every one-shot command: the ec2 rules load no SDK."""
    code = (
        "from monkey.drivers.ec2_setup import validate; "
        "validate('p', 'aws', {'type': 'ec2', 'region': 'us-east-1', 'size': 't3.micro', "
        "'image': 'ami-1', 'endpoint': 'http://127.0.0.1:5000'})"
    )
    assert _heavy_modules(code, tmp_path) == []


def test_kubernetes_entry_validation_imports_no_client(tmp_path):
    """A `kubernetes` entry is checked without the kubernetes client (a second to import)."""
    code = (
        "from monkey.drivers.kubernetes import KubernetesDriver; "
        "KubernetesDriver.validate('p', 'k8s', {'type': 'kubernetes', 'context': 'lab', "
        "'namespace': 'ml', 'schedule_timeout': 30, 'node_selector': {'gpu': 'a100'}})"
    )
    assert _heavy_modules(code, tmp_path) == []


EC2_ENTRY = (
    "providers:\n  aws: {type: ec2, region: us-east-1, size: t3.micro, image: ami-1,\n"
    "        endpoint: 'http://127.0.0.1:5000', max_instances: 2}\n"
)


def _load(tmp_path: Path) -> subprocess.CompletedProcess[str]:
    code = (
        "import sys; from monkey.config import Home; from monkey.drivers import load_providers; "
        f"p = load_providers(Home({str(tmp_path / 'home')!r}).ensure()); "
        "print({n: (c.type, c.options.get('max_instances')) for n, c in p.items()}); "
        "print(sorted(m for m in ('yaml', 'monkey.drivers.ec2', 'monkey.drivers.cloud') if m in sys.modules))"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        cwd=tmp_path,
    )


@pytest.mark.system  # the CLI's commands in subprocesses
def test_providers_checked_once_are_read_back_without_yaml_or_drivers(tmp_path):
    """Every one-shot command reads providers.yml: once checked, while its bytes stay the
    same, the command loads neither the YAML parser nor the drivers' modules (an ec2 entry's
    rules cost `monkey run` on the local provider about 13 ms). An edit is seen at once, a
    bad one refused as before, and a damaged cache is ignored."""
    (tmp_path / "home").mkdir()
    config = tmp_path / "home" / "providers.yml"
    config.write_text(EC2_ENTRY)
    first = _load(tmp_path)
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines() == [
        "{'local': ('local', None), 'aws': ('ec2', 2)}",
        "['monkey.drivers.cloud', 'monkey.drivers.ec2', 'yaml']",
    ]
    cache = tmp_path / "home" / "private" / "providers.json"
    assert oct(cache.stat().st_mode & 0o777) == "0o600"
    again = _load(tmp_path)
    assert again.stdout.splitlines() == ["{'local': ('local', None), 'aws': ('ec2', 2)}", "[]"]

    config.write_text(EC2_ENTRY.replace("max_instances: 2", "max_instances: 3"))
    assert _load(tmp_path).stdout.splitlines()[0] == "{'local': ('local', None), 'aws': ('ec2', 3)}"
    config.write_text(EC2_ENTRY.replace("region: us-east-1, ", ""))
    bad = _load(tmp_path)
    assert bad.returncode != 0 and "provider 'aws': needs `region:`" in bad.stderr
    config.write_text(EC2_ENTRY)
    for damaged in (
        "{not json",
        '{"key": 1}',
        json.dumps({"key": "x", "providers": {"aws": ["ec2", 3]}}),
    ):
        cache.write_text(damaged)
        assert (
            _load(tmp_path).stdout.splitlines()[0]
            == "{'local': ('local', None), 'aws': ('ec2', 2)}"
        )
    cache.unlink()
    os.mkfifo(cache)  # not a file: never opened for a read that would block
    loaded = _load(tmp_path)
    assert loaded.stdout.splitlines()[0] == "{'local': ('local', None), 'aws': ('ec2', 2)}", (
        loaded.stderr
    )


SERVER_STACK = ("starlette", "uvicorn", "anyio", "cryptography", "monkey.server", "monkey.api")


def test_web_command_loads_neither_the_pages_nor_the_server_stack(tmp_path):
    """`monkey web` issues a link and opens a browser: Monkey Web's pages, Jinja2 and
    Starlette are the server's alone."""
    code = (
        "import contextlib; from monkey.shell.cli import main\n"
        "with contextlib.suppress(SystemExit): main(['web', '--help'])"
    )
    among = ("monkey.server.web", "jinja2", "starlette", "uvicorn", "anyio")
    assert _heavy_modules(f"exec({code!r})", tmp_path, among) == []


@pytest.mark.system  # starts a main node
def test_list_jobs_through_a_remote_imports_neither_the_server_stack_nor_heavy_ones(home, tmp_path):
    """The laptop's `monkey --remote lab list jobs` (and `compare`, `list sweeps`): standard
    library and monkey.remote only, no matplotlib, and not the standard library's
    http.client (its email package costs more than the listing: monkey/remote/wire.py)."""
    from mainnode import MainNode

    node = MainNode(home, tmp_path)
    node.start()
    try:
        node.add_remote()
        node.server("run", "--", "true")
        among = (*HEAVY, *SERVER_STACK, "matplotlib", "http.client", "email")
        report = f"print(sorted(m for m in sys.modules if m.startswith({among!r})))"
        for argv, shown in (
            (["list", "jobs"], "true"),
            (["compare", "last"], "JOB"),
            (["list", "sweeps"], "no sweeps yet"),
        ):
            code = (
                "import sys; from monkey.shell.cli import main; "
                f"code = main(['--remote', 'lab', *{argv!r}]); {report}; sys.exit(code)"
            )
            done = subprocess.run(
                [sys.executable, "-c", code],
                capture_output=True,
                text=True,
                env=dict(node.laptop_env, PYTHONPATH=str(ROOT)),
                timeout=60,
            )
            assert done.returncode == 0, done.stderr
            assert shown in done.stdout
            assert ast.literal_eval(done.stdout.strip().splitlines()[-1]) == [], argv
    finally:
        node.close()
