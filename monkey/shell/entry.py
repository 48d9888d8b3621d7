"""The `monkey` command as installed (pyproject's [project.scripts]) and `python -m monkey`.

Around ``monkey.shell.cli.main`` it spares a one-shot command two passes of the cyclic
garbage collector that find nothing to free: none while the command line's modules load
(they allocate tens of thousands of objects and no garbage), and none over everything
loaded once the command is done (``gc.freeze``: the interpreter's last collection at exit
skips it). Together about 3 ms of `monkey list jobs`. In-process callers (the tests, the
shell) call ``cli.main`` and keep the collector as it was.
"""

from __future__ import annotations

import gc


def main() -> int:
    """Run the command line in sys.argv; its exit status."""
    gc.disable()
    try:
        from monkey.shell.cli import main as command
    finally:
        gc.enable()
    try:
        return command()
    finally:
        gc.freeze()
