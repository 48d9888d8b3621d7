"""The run directory's layout (monkey/client_agent/rundir.py) is the one place its file names
are written, and the agent's modules all reach a worker that has only a python3."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

from monkey.client_agent import rundir, track
from monkey.version import AGENT_SRC, agent_digest, agent_files

PACKAGE = Path(__file__).resolve().parents[1] / "monkey"
# Names distinctive enough to find as string constants (``work``, ``started``, ``exit``
# are words the code uses for other things too).
NAMES = (
    rundir.STDOUT,
    rundir.STDERR,
    rundir.ORDER,
    rundir.EVENTS,
    rundir.METRICS,
    rundir.CODE_RECORD,
    rundir.LAUNCH,
    rundir.SETUP_LOG,
    rundir.SETUP_RECORD,
    rundir.SETUP_FAILED,
    rundir.RESULTS,
    rundir.RESULTS_SEQ,
)
# Shipped alone into a job's environment (they cannot import rundir): checked below.
ALONE = ("launcher.py", "track.py", "image.py")  # copied beside the job: see spawn.py


def _string_constants(path: Path) -> list[tuple[int, str]]:
    """(line, text) of the string constants of PATH's code, docstrings left out."""
    tree = ast.parse(path.read_text())
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
    ]


def test_no_run_dir_file_name_is_written_outside_the_layout() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "client_agent" / "rundir.py" or (
            path.parent.name == "client_agent" and path.name in ALONE
        ):
            continue
        found += [
            f"{path.relative_to(PACKAGE)}:{line}: {text!r}"
            for line, text in _string_constants(path)
            if any(name in text for name in NAMES) and (path.name, text) not in WRITTEN_OUT
        ]
    assert found == []


# Names written out where importing the agent's module would cost every `monkey run` its
# code; a test checks each agrees with rundir (test_what_monkey_writes_outside_a_job_is_not_code).
WRITTEN_OUT = {("walk.py", rundir.OUTSIDE_METRICS)}


def test_the_files_shipped_alone_write_the_names_of_the_layout() -> None:
    assert track.FILE_NAME == rundir.METRICS
    assert f'"{rundir.PREEMPTED}"' in (AGENT_SRC / "track.py").read_text()
    launcher = (AGENT_SRC / "launcher.py").read_text()
    assert all(
        f'"{name}"' in launcher
        for name in (rundir.SETUP_LOG, rundir.SETUP_RECORD, rundir.SETUP_FAILED)
    )
    image = (AGENT_SRC / "image.py").read_text()
    assert all(f'"{name}"' in image for name in (rundir.SETUP_LOG, rundir.PULL))
    assert (rundir.stream_log("stdout"), rundir.stream_log("stderr")) == (
        rundir.STDOUT,
        rundir.STDERR,
    )


def test_every_agent_module_is_shipped_and_runs_on_the_standard_library_alone(
    tmp_path: Path,
) -> None:
    """What the SSH and Slurm drivers install on a worker (agent_files() under
    monkey/client_agent/, beside an empty monkey/__init__.py) imports without site-packages
    (-I -S): each module of the agent is among the files shipped and needs nothing else;
    the agent's digest of its own copy is the one the core expects."""
    code = tmp_path / "agent"
    (code / "monkey" / "client_agent").mkdir(parents=True)
    (code / "monkey" / "__init__.py").write_bytes(b"")
    for name in agent_files():
        shutil.copyfile(AGENT_SRC / name, code / "monkey" / "client_agent" / name)
    modules = [name[:-3] for name in agent_files() if name not in ("__main__.py", "shim.py")]
    script = (
        "import importlib, sys; sys.path.insert(0, sys.argv[1]); "
        "[importlib.import_module('monkey.client_agent.' + m) for m in sys.argv[2:]]; "
        "from monkey.client_agent.agent import code_digest; print(code_digest())"
    )
    proc = subprocess.run(
        [sys.executable, "-I", "-S", "-c", script, str(code), *modules],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == agent_digest()
    assert {"agent", "rundir", "procs", "blobs", "wire", "spawn", "adopt"} <= set(modules)
