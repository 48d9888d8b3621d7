"""Parameters a command gives (``--lr 0.1``, ``--lr=0.1``, ``lr=0.1``, ``-n 5``): what a
plain run records as its params, and where a rerun's ``--set`` rewrites them. ``-`` and
``_`` are the same in names (``--batch-size`` is ``batch_size``)."""

from __future__ import annotations

import re

from monkey.models import later_pattern

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_KV = later_pattern(r"([A-Za-z_][A-Za-z0-9_.-]*)=(.*)", re.DOTALL)
_FLAG = later_pattern(r"--([A-Za-z_][A-Za-z0-9_.-]*)(=(.*))?", re.DOTALL)
_SHORT = later_pattern(r"-([A-Za-z])")  # `-n 5`: a parameter only when a number follows
_NUMBER = later_pattern(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def norm(name: str) -> str:
    """NAME as parameters are compared: `-` and `_` the same."""
    return name.replace("-", "_")


def command_params(argv: list[str]) -> dict[str, tuple[str, list[tuple[int, str]]]]:
    """Parameters given in a command: normalised name -> (name as written, [(index of the
    argument holding the value, form)]) with form "next" (``--lr 0.1``), "eq" (``--lr=0.1``)
    or "kv" (``lr=0.1``); a one-letter flag counts when a number follows (``-n 5``). The
    program itself (argv[0]) is never a parameter."""
    found: dict[str, tuple[str, list[tuple[int, str]]]] = {}

    def add(name: str, index: int, form: str) -> None:
        found.setdefault(norm(name), (name, []))[1].append((index, form))

    for i in range(1, len(argv)):
        arg = argv[i]
        flag = _FLAG.fullmatch(arg)
        if flag:
            if flag.group(2) is not None:
                add(flag.group(1), i, "eq")
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                add(flag.group(1), i + 1, "next")
            continue
        if _SHORT.fullmatch(arg) and i + 1 < len(argv) and _NUMBER.fullmatch(argv[i + 1]):
            add(arg[1:], i + 1, "next")
            continue
        kv = _KV.fullmatch(arg)
        if kv and not arg.startswith("-"):
            add(kv.group(1), i, "kv")
    return found


def command_values(argv: list[str]) -> dict[str, Any]:
    """The parameters a plain command gives (``--lr 0.1`` -> ``{"lr": 0.1}``), by the names
    as written, values as numbers where they read as numbers; the last one given wins."""
    out: dict[str, Any] = {}
    for name, places in command_params(argv).values():
        index, form = places[-1]
        text = argv[index]
        if form != "next":
            text = text.partition("=")[2]
        out[name.lstrip("-")] = scalar(text)
    return out


def scalar(text: str) -> Any:
    """TEXT as a number where it reads as one (see ``monkey.tracking.sweepspec.scalar``)."""
    from monkey.tracking import sweepspec

    return sweepspec.scalar(text)
