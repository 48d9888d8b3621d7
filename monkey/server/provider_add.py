"""`monkey provider add` for an admin through the API: the main node's own one-shot command,
run in a child process over the server's MONKEY_HOME, so the providers.yml written, the
files its path options name, the credentials and the checks (SSH, sinfo, cloud set-up) are
the main node's, exactly as when an admin types it there. Only the words of the command
line come from the client, never its environment; stdin is closed (a missing option is the
command's own one-line error, no prompt), the child has LIMIT seconds, and what it printed
and its exit status go back to the client, which prints them as if it had run it."""

from __future__ import annotations

import logging
import os
import threading

from monkey.models import MonkeyError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from monkey.config import Home

KINDS = ("ssh", "aws", "gcp", "slurm")
# seconds (MONKEY_PROVIDER_ADD_LIMIT): a cloud set-up (network, firewall, key, bucket) takes
# a minute or two
LIMIT = 300.0
log = logging.getLogger("monkey.server")
_one = threading.Lock()  # one at a time: each rewrites providers.yml


def check_words(words: Any) -> list[str]:
    """WORDS (what follows `provider add`) as a list of strings; MonkeyError when the client
    sent anything else (the kind must come first; --remote is the client's own option)."""
    if (
        not isinstance(words, list)
        or not all(isinstance(w, str) for w in words)
        or not words
        or words[0] not in KINDS
    ):
        raise MonkeyError(
            f"provider add: send the words after `provider add`, the kind first "
            f"({', '.join(KINDS)})"
        )
    if any(w == "--remote" or w.startswith("--remote=") for w in words):
        raise MonkeyError("provider add: --remote chooses the main node; it is not sent to it")
    return words


def provider_add(home: Home, user: str, words: Any, name: str = "?") -> dict[str, Any]:
    """Run `monkey provider add WORDS` on this machine for admin USER; its exit status and
    output as {"code", "stdout", "stderr"}. NAME (the provider, as the client parsed it) is
    only for the log line, which never holds the arguments."""
    words = check_words(words)
    if not _one.acquire(blocking=False):
        raise MonkeyError("another provider add runs on the main node; try again when it is done")
    try:
        code, out, err = _child(home, words)
    finally:
        _one.release()
    kind = words[0]
    if code == 0:
        log.info("%s added provider %s (%s)", user, name, kind)
    else:
        log.info("%s: provider add %s %s failed (exit %d)", user, kind, name, code)
    return {"code": code, "stdout": out, "stderr": err}


def _child(home: Home, words: list[str]) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `monkey provider add WORDS` in a child process of
    its own session, killed with its children after LIMIT seconds."""
    import signal
    import subprocess

    from monkey.config import python_entry

    env = dict(os.environ, MONKEY_HOME=str(home.root), MONKEY_REMOTE="local")
    here = os.path.expanduser("~")  # relative paths: from the main node's home, as at a login
    proc = subprocess.Popen(
        [*python_entry("monkey.shell.entry", "main", exits=True), "provider", "add", *words],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=here if os.path.isdir(here) else home.root,
        start_new_session=True,
        text=True,
        errors="replace",
    )
    limit = float(os.environ.get("MONKEY_PROVIDER_ADD_LIMIT", LIMIT))
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
        err += (
            f"monkey: error: provider add did not finish within {limit:.0f}s on the main node; "
            "stopped (providers.yml unchanged; run it again: what it created is reused)\n"
        )
        return 1, out, err
    return proc.returncode, out, err
