"""Shared helpers for the benchmark scripts: a throw-away MONKEY_HOME and timing."""

from __future__ import annotations

import atexit
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def bench_python() -> str:
    """The interpreter timed commands run with, and their `python -c pass` baseline: a clean
    virtualenv's (no site-packages but monkey's dependencies; monkey itself comes from this
    checkout through PYTHONPATH), made once in ~/.cache/monkey-bench. A global interpreter
    with many packages and .pth files starts 3x slower (28 ms vs 9 ms here) and flatters
    every ratio. MONKEY_BENCH_PYTHON names another."""
    given = os.environ.get("MONKEY_BENCH_PYTHON")
    if given:
        return given
    import hashlib

    key = hashlib.sha256((REPO / "pyproject.toml").read_bytes() + sys.version.encode()).hexdigest()[
        :12
    ]
    venv = Path.home() / ".cache" / "monkey-bench" / f"venv-{key}"
    python = venv / "bin" / "python"
    if not python.exists():
        print(f"making a clean virtualenv for timed commands in {venv} (once)", file=sys.stderr)
        tmp = venv.with_name(venv.name + ".tmp")
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(tmp)], check=True)
        pip = [str(tmp / "bin" / "python"), "-m", "pip", "-q", "--disable-pip-version-check"]
        subprocess.run([*pip, "install", str(REPO)], check=True)  # the dependencies...
        subprocess.run([*pip, "uninstall", "-y", "monkey-runner"], check=True)  # ...not monkey
        tmp.rename(venv)
    return str(python)


PY = bench_python()


def monkey_command() -> list[str]:
    """The `monkey` command as pip installs it: its console script (pip's template, which
    imports `re` and calls monkey.shell.cli.main), run by PY on this checkout. `python -m
    monkey` would time runpy's imports too, which the installed command never pays."""
    script = Path(PY).parent / "monkey"  # beside PY, where pip puts it (not on PATH)
    script.write_text(
        "import re\nimport sys\nfrom monkey.shell.entry import main\n"
        "if __name__ == '__main__':\n"
        "    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])\n"
        "    sys.exit(main())\n"
    )
    return [PY, str(script)]


MONKEY = monkey_command()


def outside_imports(argv: list[str], cwd: str | None = None) -> list[str]:
    """The modules from outside monkey (the standard library, blake3...) that the command
    ARGV imports, as `python -X importtime` reports them."""
    done = subprocess.run(
        [argv[0], "-X", "importtime", *argv[1:]], capture_output=True, text=True, cwd=cwd
    )
    names = []
    for line in done.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            name = line.rsplit("|", 1)[1].strip()
            if name != "imported package" and not name.startswith("monkey"):
                names.append(name)
    return names


def floor_argv(argv: list[str], cwd: str | None = None) -> list[str]:
    """A `python -c` that imports only what ARGV imports from outside monkey: the part of
    ARGV's time no code of monkey's could remove (an import that fails there, e.g. a
    Windows-only module a stdlib one tries, fails here too)."""
    code = (
        f"for n in {outside_imports(argv, cwd)!r}:\n"
        "    try:\n        __import__(n)\n    except ImportError:\n        pass"
    )
    return [PY, "-c", code]


def floor_wall(argv: list[str], repeat: int, cwd: str | None = None) -> float:
    """Median wall time of ARGV's floor (``floor_argv``)."""
    floor = floor_argv(argv, cwd)
    return median_wall(lambda: run_quiet(floor), repeat)


def child_cpu(fn: Callable[[], object]) -> float:
    """CPU seconds (user + system) the child processes FN ran and waited for used: unlike
    wall time, it stays put on a machine busy with other work."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    fn()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def median_cpu(fn: Callable[[], object], repeat: int) -> float:
    """Median ``child_cpu`` of ``fn`` over ``repeat`` runs, after one warm-up run."""
    fn()
    return statistics.median(child_cpu(fn) for _ in range(repeat))


def compile_repo() -> None:
    """Write the checkout's bytecode, as the first run of any install does. Where
    PYTHONDONTWRITEBYTECODE is set (some sandboxes set it) no run writes it, and every
    timed `monkey` process would compile each module it imports from source: about 30 ms
    of `monkey list jobs`, which an installed copy (pip compiles at install) never pays."""
    import compileall

    compileall.compile_dir(str(REPO / "monkey"), quiet=1)


def fresh_home() -> Path:
    """A new MONKEY_HOME, exported for this process and its children (which import this
    checkout, compiled)."""
    compile_repo()
    home = Path(tempfile.mkdtemp(prefix="monkey-bench-")) / "home"
    os.environ["MONKEY_HOME"] = str(home)
    os.environ["PYTHONPATH"] = str(REPO)
    atexit.register(_stop_home, home)
    return home


def _stop_home(home: Path) -> None:
    """Stop what still serves a bench home. The home itself stays in /tmp (remove
    /tmp/monkey-bench-* yourself): on this machine's ext4 (no journal) the thousands of
    files a bench leaves, deleted at its exit, made every file created in the next 30 s
    skip their freshly freed inodes, and 1,000 jobs a run took up to 3x as long."""
    if home.exists():
        stop_everything(home)


def median_wall(fn: Callable[[], object], repeat: int) -> float:
    """Median wall time of ``fn`` over ``repeat`` runs, after one warm-up run."""
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def run_to_start(
    m: Any,
    project: str,
    runs: int,
    remote: dict[str, str] | None = None,
    cpu: list[float] | None = None,
) -> list[float]:
    """Seconds from starting `monkey run -- true` (a new CLI process, in PROJECT) to the job's
    process start as the agent recorded it, for RUNS jobs one after another (a core serves);
    with REMOTE (a laptop's environment), `monkey --remote lab run` from that laptop. CPU, when
    given, gets each CLI process's CPU seconds."""
    import resource

    latencies = []
    argv = [*MONKEY, *(["--remote", "lab"] if remote else []), "run", "--", "true"]
    for _ in range(runs):
        t0 = time.time()
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        out = subprocess.run(
            argv, capture_output=True, text=True, check=True, cwd=project, env=remote
        )
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if cpu is not None:
            cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        job = m.job(out.stdout.strip())
        job.wait(timeout=30)
        latencies.append(job.attempts()[0].started_at - t0)
    return latencies


def run_quiet(argv: list[str]) -> None:
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)


def stop_everything(home: Path) -> None:
    """Stop the core and the local agent of a bench home."""
    from monkey.config import Home
    from monkey.core import daemon

    h = Home(home)
    daemon.stop(h)
    pid_file = h.private / "agent.pid"
    if pid_file.exists():
        try:
            os.kill(int(pid_file.read_text()), 15)
        except (ProcessLookupError, ValueError):
            pass


def copy_jobs(m: Any, juid: str, changes: list[dict[str, Any]]) -> None:
    """Insert copies of job JUID's row into M's store in one transaction, each with one
    dict of CHANGES applied (a new juid at least): a large store in seconds."""
    row = m.store.db.execute("SELECT * FROM jobs WHERE juid = ?", (juid,)).fetchone()
    cols = [d[0] for d in m.store.db.execute("SELECT * FROM jobs LIMIT 0").description]
    names = [c for c in cols if c != "seq"]
    base = dict(zip(cols, row))
    values = [tuple({**base, **change}[c] for c in names) for change in changes]
    with m.store.tx() as db:
        db.executemany(
            f"INSERT INTO jobs({', '.join(names)}) VALUES ({', '.join('?' * len(names))})", values
        )


def make_sweep(
    m: Any,
    runs: int,
    params: Callable[[int], dict[str, Any]],
    value: Callable[[int, int], float],
    steps: int = 100,
) -> str:
    """A sweep of RUNS jobs (not run) on metric `acc` (max), run i with PARAMS(i) and `acc`
    logged as VALUE(i, step) for STEPS steps, one second apart; returns its id."""
    from monkey.tracking.ingest import as_columns

    spec = {
        "command": ["python", "t.py", "{lr}"],
        "method": "grid",
        "count": None,
        "parameters": {"lr": {"values": list(range(runs))}},
        "metric": {"name": "acc", "goal": "max"},
        "max_parallel": None,
        "early_terminate": None,
        "retries": 0,
        "seed": 0,
    }
    template = m.run(["true"], start_core=False).record
    with m.store.tx() as db:
        sid = m.store.create_sweep("bench", spec)
        for i in range(runs):
            job = m.store.create_job(
                name=f"bench-{i}",
                argv=["python", "t.py", str(i)],
                provider="local",
                resources=template.resources,
                env={},
                snapshot=template.snapshot,
                workdir=template.workdir,
                datasets=[],
                git={},
                python=template.python,
                sweep=sid,
                params=params(i),
            )
            points = [("acc", s, value(i, s), 1.7e9 + i * 60 + s) for s in range(steps)]
            m.store._insert_columns(db, job.juid, 1, as_columns(points))
    return sid


def start_main_node(home: Path) -> tuple[dict[str, str], Callable[[], None]]:
    """`monkey server start` on a free loopback port over HOME, and a laptop (its own HOME,
    config and MONKEY_HOME) with the remote `lab` added: (the laptop's environment, stop).
    The server runs with this interpreter (it needs starlette and uvicorn)."""
    import re
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server_env = dict(os.environ)
    started = subprocess.run(
        [sys.executable, "-m", "monkey", "server", "start", "--bind", f"127.0.0.1:{port}"],
        capture_output=True,
        text=True,
        env=server_env,
        check=True,
    ).stdout
    found = re.search(r"--token (\S+) --fingerprint (\S+)", started)
    assert found, started
    token, fingerprint = found.groups()
    laptop = Path(tempfile.mkdtemp(prefix="monkey-bench-laptop-"))
    laptop_env = dict(
        os.environ,
        HOME=str(laptop),
        XDG_CONFIG_HOME=str(laptop / ".config"),
        XDG_CACHE_HOME=str(laptop / ".cache"),
        MONKEY_HOME=str(laptop / ".monkey"),
    )
    subprocess.run(
        [*MONKEY, "remote", "add", "lab", f"https://127.0.0.1:{port}", "--token", token]
        + ["--fingerprint", fingerprint],
        env=laptop_env,
        check=True,
        stdout=subprocess.DEVNULL,
    )

    def stop() -> None:
        subprocess.run(
            [sys.executable, "-m", "monkey", "server", "stop"],
            env=server_env,
            stdout=subprocess.DEVNULL,
        )

    return laptop_env, stop


def fake_aws(folder: str) -> None:
    """Fake credentials in the environment, no AWS file or metadata service read."""
    sys.path.insert(0, str(REPO / "tests"))
    from moto_server import CREDENTIALS

    for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
        os.environ.pop(name, None)
    os.environ.update(
        CREDENTIALS,
        AWS_EC2_METADATA_DISABLED="true",
        AWS_CONFIG_FILE=os.path.join(folder, "no-aws-config"),
        AWS_SHARED_CREDENTIALS_FILE=os.path.join(folder, "no-aws-credentials"),
    )
