"""`monkey completion bash|zsh` in the real shells: an interactive zsh (compinit) and bash on
a pseudo-terminal load the script as README says (`eval "$(monkey completion zsh)"`), and Tab
completes commands, sub-commands, choices, options and job ids, and leaves a job's own
command to file completion."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
from conftest import REPO
from terminal import Terminal

PROMPT = "ready> "
KILL_LINE = "\x15"  # Ctrl-U: both shells' emacs keymap clears the line


def _shell(name: str, tmp_path: Path) -> Terminal:
    """An interactive NAME with monkey's completion loaded, on a terminal, at its prompt."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    shim = bin_dir / "monkey"  # the installed `monkey` command, of this tree
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m monkey "$@"\n')
    shim.chmod(0o755)
    rc = tmp_path / f"{name}rc"
    env = dict(
        os.environ,
        PATH=f"{bin_dir}:{os.environ['PATH']}",
        PYTHONPATH=str(REPO),
        TERM="dumb",
        HISTFILE=os.devnull,
    )
    if name == "zsh":
        # No compinit of its own: the script loads it when the rc file has not.
        (tmp_path / ".zshrc").write_text(f"eval \"$(monkey completion zsh)\"\nPS1='{PROMPT}'\n")
        env["ZDOTDIR"] = str(tmp_path)
        argv = ["zsh", "-i"]
    else:
        rc.write_text(f"eval \"$(monkey completion bash)\"\nPS1='{PROMPT}'\n")
        argv = ["bash", "--rcfile", str(rc), "-i"]
    term = Terminal(env, Path.cwd(), argv)
    term.expect(PROMPT)
    return term


@pytest.mark.timeout(180)
@pytest.mark.parametrize("shell", ["zsh", "bash"])
def test_tab_completes_commands_options_and_job_ids(shell, cli, home, tmp_path):
    assert shutil.which(shell), f"{shell} is not installed (scripts/test.sh installs it)"
    juid = cli("run", "--", "true", check=True).stdout.strip()
    cli("logs", "--follow", juid)
    Path("train.py").write_text("pass\n")
    term = _shell(shell, tmp_path)

    def tab(line: str, shown: str, twice: bool = False) -> None:
        """Type LINE and Tab (twice: list the candidates); the terminal shows SHOWN."""
        term.send(line + "\t" + ("\t" if twice else ""))
        term.expect(shown)
        term.settle(0.2)
        term.send(KILL_LINE)
        term.settle(0.2)

    with term:
        tab("monkey li", r"monkey list ")  # a command
        tab("monkey list jo", r"monkey list jobs ")  # a sub-command
        tab("monkey list jobs --li", r"monkey list jobs --limit ")  # an option
        tab("monkey daemon sta", r"start\s+status", twice=True)  # a positional's choices
        tab("monkey sweep stat", r"monkey sweep status ")  # sweep's actions
        tab(f"monkey logs {juid[:4]}", f"monkey logs {juid} ")  # a job id
        tab(f"monkey info {juid[:4]}", f"monkey info {juid} ")  # after a short form
        tab("monkey job cancel ", f"{juid}\\s+last", twice=True)  # the candidates listed
        tab("monkey run -- python tr", r"monkey run -- python train\.py ")  # files after --
        term.send("exit\r")
        assert term.close() == 0
