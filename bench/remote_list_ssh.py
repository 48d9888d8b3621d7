"""`monkey list jobs` through an ssh:// remote (issue 27): a real sshd on 127.0.0.2
(tests/sshd.py) with `monkey server` behind it on its loopback port (TLS inside the tunnel),
against the https remote and the local `monkey list jobs` of the same run, 100,000 jobs in
the server's store. The tunnel adds paramiko's import, an SSH login and a channel per
command. The CLIs run with the clean interpreter (common.PY); the server with this one.
`python bench/remote_list_ssh.py [REPEAT]` (default 21 runs each, medians). Needs root
(sshd logs in a throwaway user) and OpenSSH's sshd.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import PY, copy_jobs, fresh_home, median_wall, stop_everything

N = 100_000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    repeat = int(sys.argv[1]) if len(sys.argv) > 1 else 21
    home = fresh_home()
    from monkey.api import Monkey

    m = Monkey(home)
    job = m.run(["true"], start_core=False)
    copy_jobs(
        m,
        job.juid,
        [
            {
                "juid": f"25-01-{1 + i // 9000:02d}-{i % 9000 + 1:04d}",
                "state": ("succeeded", "failed", "running", "queued")[i % 4],
            }
            for i in range(N)
        ],
    )
    server_env = dict(os.environ)
    port = free_port()
    started = subprocess.run(
        [sys.executable, "-m", "monkey", "server", "start", "--bind", f"127.0.0.1:{port}"],
        capture_output=True,
        text=True,
        env=server_env,
        check=True,
    ).stdout
    token, fp = re.search(r"--token (\S+) --fingerprint (\S+)", started).groups()
    laptop = Path(tempfile.mkdtemp(prefix="monkey-bench-laptop-"))
    laptop_env = dict(
        os.environ,
        HOME=str(laptop),
        XDG_CONFIG_HOME=str(laptop / ".config"),
        MONKEY_HOME=str(laptop / ".monkey"),
    )
    subprocess.run(
        [
            PY,
            "-m",
            "monkey",
            "remote",
            "add",
            "lab",
            f"https://127.0.0.1:{port}",
            "--token",
            token,
            "--fingerprint",
            fp,
        ],
        env=laptop_env,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    try:

        def quiet(argv: list[str], env: dict[str, str]) -> None:
            subprocess.run(
                argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, env=env
            )

        time.sleep(1)
        base = median_wall(lambda: quiet([PY, "-c", "pass"], server_env), repeat)
        local = median_wall(lambda: quiet([PY, "-m", "monkey", "list", "jobs"], server_env), repeat)
        remote = median_wall(
            lambda: quiet([PY, "-m", "monkey", "--remote", "lab", "list", "jobs"], laptop_env),
            repeat,
        )
        tunnelled = through_ssh(laptop, laptop_env, port, token, fp, repeat, quiet)
    finally:
        subprocess.run(
            [sys.executable, "-m", "monkey", "server", "stop"],
            env=server_env,
            stdout=subprocess.DEVNULL,
        )
        stop_everything(home)
    print(f"python -c pass:                  {base * 1000:7.1f} ms")
    print(f"monkey list jobs (local):        {local * 1000:7.1f} ms  ({local / base:.1f}x pass)")
    print(
        f"monkey --remote lab list jobs:   {remote * 1000:7.1f} ms  ({remote / local:.2f}x local, "
        "target <= 1.3x)"
    )
    print(
        f"monkey --remote tun list jobs:   {tunnelled * 1000:7.1f} ms  "
        f"({tunnelled / local:.2f}x local, {tunnelled / remote:.2f}x https; ssh://)"
    )


def through_ssh(
    laptop: Path, env: dict[str, str], port: int, token: str, fp: str, repeat: int, quiet: Any
) -> float:
    """The median of `monkey --remote tun list jobs` through a real sshd."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from sshd import Lab

    env = {k: v for k, v in env.items() if k != "SSH_AUTH_SOCK"}
    lab = Lab(laptop)
    try:
        host = lab.add("main")
        url = f"ssh://{host.user}@{host.address}:{host.port}/?server=127.0.0.1:{port}"
        add = [PY, "-m", "monkey", "remote", "add", "tun", url, "--token", token]
        quiet([*add, "--fingerprint", fp], env)
        return median_wall(
            lambda: quiet([PY, "-m", "monkey", "--remote", "tun", "list", "jobs"], env), repeat
        )
    finally:
        lab.close()


if __name__ == "__main__":
    main()
