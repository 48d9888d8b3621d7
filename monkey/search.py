"""`monkey search`: jobs whose command or output holds some words, newest first.

The index (monkey/store/search.py) is brought up to date before each query: only the bytes
of logs written since the last search are read, and a job that has ended is read once.
"""

from __future__ import annotations

import json
import shlex

from monkey.client_agent import rundir
from monkey.config import Home
from monkey.models import MonkeyError
from monkey.store.db import Store
from monkey.store.search import SearchIndex

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_MAX_LINE = 1000  # characters of a line that are indexed and shown


def search(home: Home, store: Store, text: str, limit: int = 50) -> list[dict[str, Any]]:
    """Jobs whose command or logs hold TEXT (its words, in order), newest first, each with
    its last matching line (see SearchIndex.query)."""
    if not text.strip():
        raise MonkeyError(
            'monkey search: give the words to look for, e.g. monkey search "out of memory"'
        )
    index = SearchIndex(store)
    update(home, store, index)
    return index.query(text, limit)


def update(home: Home, store: Store, index: SearchIndex) -> None:
    """Index what is new: commands of new jobs, log bytes written since the last update."""
    for juid, name, argv, attempts, ended in index.pending():
        offsets = index.offsets(juid)
        lines: list[tuple[str, str]] = []
        if not offsets.get("command"):
            lines.append(("command", f"{shlex.join(json.loads(argv))}  [{name}]"))
            offsets["command"] = 1
        for n in range(1, attempts + 1):
            for stream in ("stdout", "stderr"):
                file = f"{n}/{rundir.stream_log(stream)}"
                lines += _new_lines(
                    home.run_dir(juid, n) / rundir.stream_log(stream),
                    offsets,
                    file,
                    f"{stream}, attempt {n}",
                    whole=ended,
                )
        index.add(juid, lines, offsets, attempts if ended else None)


def _new_lines(
    path: Any, offsets: dict[str, int], file: str, source: str, whole: bool
) -> list[tuple[str, str]]:
    """The lines of PATH past ``offsets[file]`` (complete ones unless WHOLE), advancing it."""
    start = offsets.get(file, 0)
    try:
        with open(path, "rb") as f:
            f.seek(start)
            data = f.read()
    except (FileNotFoundError, NotADirectoryError):
        return []
    if not whole:
        data = data[: data.rfind(b"\n") + 1]
    offsets[file] = start + len(data)
    text = data.decode("utf-8", "replace").replace("\r", "\n")
    return [(source, line[:_MAX_LINE]) for line in text.split("\n") if line.strip()]
