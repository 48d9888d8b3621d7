"""The `monkey` command as installed (pyproject's [project.scripts]) and `python -m monkey`.

Around ``monkey.shell.cli.main`` it spares a one-shot command passes of the cyclic
garbage collector that find nothing to free: none while the command line's modules load
(they allocate tens of thousands of objects and no garbage), few while the command runs
(the modules it loads then, e.g. `monkey run`'s store and snapshot, would set off a young
collection every 700 allocations, Python's default; every 20,000 here, which bounds the
garbage a long command such as `logs -f` keeps waiting to a few MB), and none over
everything loaded once the command is done (``gc.freeze``: the interpreter's last
collection at exit skips it). Together about 3 ms of `monkey list jobs` and 1.5 ms of
`monkey run`. In-process callers (the tests, the shell) call ``cli.main`` and keep the
collector as it was.
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
    gc.set_threshold(20_000, *gc.get_threshold()[1:])
    try:
        return command()
    finally:
        gc.freeze()
