"""A real main node for tests: `monkey server run` with TLS on 127.0.0.1 (a free port) over
the test's MONKEY_HOME, and a laptop beside it: the CLI in a separate HOME, XDG_CONFIG_HOME
and MONKEY_HOME that share no file with the server's."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import kill_all, wait_for
from ports import free_port


class MainNode:
    """The server side (MONKEY_HOME = the test's home) and its laptop."""

    def __init__(self, home: Path, tmp: Path) -> None:
        self.home = home
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.address = "127.0.0.1"  # the server's (another machine's: see tests/netns.py)
        self.server_prefix: list[str] = []  # `monkey server run` starts after these words
        self.laptop_prefix: list[str] = []  # and the laptop's commands after these
        self.server_env = dict(
            os.environ,
            MONKEY_HOME=str(home),
            HOME=str(tmp / "srv-user"),
            XDG_CONFIG_HOME=str(tmp / "srv-user" / ".config"),
        )
        self.laptop_root = tmp / "laptop"
        self.laptop_env = dict(
            os.environ,
            HOME=str(self.laptop_root),
            XDG_CONFIG_HOME=str(self.laptop_root / ".config"),
            MONKEY_HOME=str(self.laptop_root / ".monkey"),
        )
        self.laptop_env.pop("MONKEY_REMOTE", None)
        self.proc: subprocess.Popen[str] | None = None
        self.welcome = ""
        self.token = self.fingerprint = self.admin = ""

    def start(self, *extra: str) -> str:
        """`monkey server run` in the foreground; waits until it accepts connections and
        returns what it printed first."""
        self.proc = subprocess.Popen(
            [
                *self.server_prefix,
                sys.executable,
                "-m",
                "monkey",
                "server",
                "run",
                "--bind",
                f"{self.address}:{self.port}",
                *extra,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=self.server_env,
        )
        lines = []
        assert self.proc.stdout is not None
        while True:  # the welcome lines come before it serves
            line = self.proc.stdout.readline()
            if not line:
                raise AssertionError("the server exited: " + "".join(lines))
            lines.append(line)
            if line.startswith("serving"):
                break
        wait_for(self._accepts, what="the server to accept connections")
        self.welcome = "".join(lines)
        token = re.search(r"remote add lab \S+ --token (\S+)", self.welcome)
        self.token = token.group(1) if token else self.token
        pinned = re.search(r"certificate: (\S+)", self.welcome)
        self.fingerprint = pinned.group(1) if pinned else ""
        return self.welcome

    def _accepts(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
            return True
        except OSError:
            return False

    def kill(self, sig: int = signal.SIGKILL) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)
        self.proc.wait(timeout=30)
        if self.proc.stdout:
            self.proc.stdout.close()
        wait_for(lambda: not self._accepts(), what="the server to stop listening")

    def server(
        self, *args: str, timeout: float = 120, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """`monkey ARGS` on the main node (INPUT on its stdin)."""
        return subprocess.run(
            [sys.executable, "-m", "monkey", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.server_env,
            input=input,
        )

    def laptop(
        self, *args: str, timeout: float = 60, **env: str
    ) -> subprocess.CompletedProcess[str]:
        """`monkey ARGS` on the laptop."""
        return subprocess.run(
            [*self.laptop_prefix, sys.executable, "-m", "monkey", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**self.laptop_env, **env},
        )

    def add_remote(self, token: str | None = None, name: str = "lab") -> None:
        done = self.laptop(
            "remote",
            "add",
            name,
            self.url,
            "--token",
            token or self.token,
            "--fingerprint",
            self.fingerprint,
        )
        assert done.returncode == 0, done.stderr

    def add_user(self, name: str, *flags: str) -> str:
        done = self.server("server", "user", "add", name, *flags)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip().splitlines()[-1]

    def laptop_files(self) -> list[str]:
        """Every file the laptop side holds, relative to its HOME."""
        return sorted(
            str(p.relative_to(self.laptop_root)) for p in self.laptop_root.rglob("*") if p.is_file()
        )

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        if self.proc is not None and self.proc.stdout:
            self.proc.stdout.close()
        # a laptop's own core and agent (a `run` without the remote starts them there)
        kill_all(f"MONKEY_HOME={self.laptop_root / '.monkey'}")


@pytest.fixture
def node(home: Path, tmp_path: Path) -> Iterator[MainNode]:
    """A started main node over the test's MONKEY_HOME, stopped after the test (import it
    into a test module: ``from mainnode import node``)."""
    n = MainNode(home, tmp_path)
    n.start()
    yield n
    n.close()


def wait_until_ended(node: MainNode, juid: str) -> None:
    def ended() -> bool:
        out = node.server("info", juid, "--json").stdout
        return any(f'"state": "{s}"' in out for s in ("succeeded", "failed", "cancelled"))

    wait_for(ended, timeout=120, every=0.2, what=f"job {juid} to end")
