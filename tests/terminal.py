"""A program on a real pseudo-terminal, driven as a user types: the interactive `monkey>`
shell, zsh and bash with monkey's completion."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path


def _controlling_terminal() -> None:
    """In the child: a new session whose controlling terminal is stdin, so ^C is SIGINT."""
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class Terminal:
    """`python -m monkey` (or ARGV) on a pseudo-terminal; what it shows, without escape sequences."""

    ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Z0-9]|\r")

    def __init__(
        self,
        env: dict[str, str],
        cwd: Path,
        argv: list[str] | None = None,
        size: tuple[int, int] = (24, 100),
    ) -> None:
        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", *size, 0, 0))  # rows, columns
        self.proc = subprocess.Popen(
            argv or [sys.executable, "-m", "monkey"],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=env,
            cwd=cwd,
            preexec_fn=_controlling_terminal,
        )
        os.close(slave)
        self.raw = ""
        self.pos = 0  # where the next expect() starts looking

    def expect(self, pattern: str, timeout: float = 30.0) -> str:
        """Wait until the output after the last match matches `pattern`; return the match."""
        deadline = time.monotonic() + timeout
        while True:
            shown = self.ESCAPES.sub("", self.raw)
            found = re.compile(pattern, re.DOTALL).search(shown, self.pos)
            if found:
                self.pos = found.end()
                return found.group(0)
            left = deadline - time.monotonic()
            ready = left > 0 and select.select([self.master], [], [], left)[0]
            try:
                data = os.read(self.master, 65536) if ready else b""
            except OSError:  # EIO: the shell has gone
                data = b""
            if not data:
                raise AssertionError(f"no {pattern!r} in terminal output:\n{shown[self.pos :]}")
            self.raw += data.decode(errors="replace")

    def send(self, text: str) -> None:
        os.write(self.master, text.encode())

    def settle(self, quiet: float = 0.3, timeout: float = 10.0) -> None:
        """Read until the terminal has shown nothing new for `quiet` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and select.select([self.master], [], [], quiet)[0]:
            self.raw += os.read(self.master, 65536).decode(errors="replace")

    def close(self) -> int:
        """Wait for the program to exit (killed after 15 s), reading what it still shows as a
        terminal does (a full pty would block its last writes); its exit code."""
        deadline = time.monotonic() + 15
        try:
            while self.proc.poll() is None and time.monotonic() < deadline:
                if select.select([self.master], [], [], 0.05)[0]:
                    try:
                        self.raw += os.read(self.master, 65536).decode(errors="replace")
                    except OSError:  # EIO: the program has gone
                        break
            return self.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        finally:
            self._end()

    def _end(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.master >= 0:
            os.close(self.master)
            self.master = -1

    def __enter__(self) -> Terminal:
        return self

    def __exit__(self, *_exc: object) -> None:
        """Nothing is left running, whatever the test did."""
        self._end()
