"""What version of monkey a CLI, a core or an agent runs: the package version plus a digest.

The CLI and the core compare ``version()``: the package version and a digest of the
name, size and modification time of every ``.py`` file of the installed package (stat
only: about half a millisecond on the one-shot path). A reinstall, editable or not, changes
it. A running core records its version in ``MONKEY_HOME/private/core.version``; a CLI that
finds another one there restarts the core (jobs keep running: the new core re-attaches).
The core also looks at its code on disk each second and hands over to a core on the new
code by itself (``Core.reinstalled``), so that no command is needed after a reinstall.

Agents are compared by ``agent_digest()``: a digest of the content of the agent's own files
(``monkey/client_agent/*.py``), which an agent computes for itself and reports in ``hello``
(``digest``), and, for the local agent, by the folder it runs from (``code``): the same code
installed elsewhere replaces it too. SSH hosts keep each agent version in a folder named by it.

A long-running REPL or dashboard calls ``code_digest()`` when it starts and ``reinstalled()``
before each command / at each refresh; when the code on disk changed it says so in one line
and ``restart()`` replaces the process by a fresh run of the same command line.
"""

from __future__ import annotations

import functools
import os
import sys
import zlib
from pathlib import Path

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import NoReturn

PACKAGE = Path(__file__).resolve().parent
AGENT_SRC = PACKAGE / "client_agent"


def package_version() -> str:
    """The version the package declares."""
    from monkey import __version__

    return __version__


@functools.cache
def code_digest() -> str:
    """A digest of the package's .py files' names, sizes and modification times: 12 hex
    digits from zlib's CRC-32 and Adler-32 (zlib is loaded already where hashlib's OpenSSL
    is not; this tells a reinstall apart, it guards against no adversary)."""
    stats = []
    stack = [str(PACKAGE)]
    while stack:
        folder = stack.pop()
        with os.scandir(folder) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                if entry.name.endswith(".py"):
                    st = entry.stat()
                    stats.append(f"{entry.path}\0{st.st_size}\0{st.st_mtime_ns}\0")
                elif entry.is_dir(follow_symlinks=False) and entry.name != "__pycache__":
                    stack.append(entry.path)
    data = "".join(stats).encode()
    return f"{zlib.crc32(data):08x}{zlib.adler32(data):08x}"[:12]


def version() -> str:
    """This process's monkey version: ``0.1.0+<code digest>``."""
    return f"{package_version()}+{code_digest()}"


def reinstalled() -> str | None:
    """One line saying how the installed code differs from what this process loaded (its
    first ``code_digest()``), or None when it does not. Not cached: it looks at the disk."""
    try:
        now = code_digest.__wrapped__()
    except OSError:  # the package's folder is gone: an install elsewhere replaced it
        return f"monkey {version()} was uninstalled or reinstalled elsewhere"
    if now == code_digest():
        return None
    return f"monkey changed on disk ({version()} -> {package_version()}+{now})"


def restart(env: dict[str, str] | None = None) -> NoReturn:
    """Replace this process by a fresh run of its command line (the same interpreter and
    arguments, ENV added to the environment): it loads the code installed now."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], {**os.environ, **(env or {})})


def fresh_entry(module: str, function: str) -> list[str]:
    """argv running ``module.function()`` with this interpreter and the monkey installed for
    it now: site's import path of a new process (isolated, ``-I``), not this process's, which
    may name an install that was removed since (``pip install -e .`` over ``pip install .``)."""
    return [sys.executable, "-I", "-c", f"from {module} import {function}; {function}()"]


def installed_elsewhere() -> bool:
    """Whether this python now imports monkey from somewhere, this process's install being
    gone (a new process is asked: about 50 ms)."""
    import subprocess

    try:
        probe = subprocess.run(
            fresh_entry("monkey.version", "package_version"),
            cwd="/",
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return probe.returncode == 0


def agent_files() -> list[str]:
    """Names of the agent's source files (what is copied to a worker)."""
    return sorted(p.name for p in AGENT_SRC.glob("*.py"))


def agent_digest() -> str:
    """Digest of the agent's source as it is on disk now: the agent version a worker should
    run (the same computation as the agent's own ``code_digest``). Not cached: a running
    core compares agents with the files a fresh agent would load."""
    import hashlib

    h = hashlib.blake2b(digest_size=12)
    for name in agent_files():
        h.update(name.encode() + b"\0" + (AGENT_SRC / name).read_bytes() + b"\0")
    return h.hexdigest()
