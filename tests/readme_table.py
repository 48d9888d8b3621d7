"""README.md's command table, read with markdown-it-py (CommonMark + GFM tables), and the
CLI's parsers, leaf by leaf: what tests/test_readme.py and tests/test_documented_commands.py
compare."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"

# Options documented once for every command, not in each row: (option, where README says it).
GLOBAL_OPTIONS = {"--help": "`monkey COMMAND --help`", "--juid": "`--juid JOB`"}
# Parser options README leaves out on purpose, each with its reason.
HIDDEN = {
    ("provider add aws", "--metadata-url"): "test-only: a loopback stand-in for EC2's metadata",
    ("provider add gcp", "--metadata-url"): "test-only: a loopback stand-in for GCE's metadata",
    ("provider add gcp", "--endpoint"): "emulators only; providers.yml's `endpoint` is documented",
    ("provider add gcp", "--storage-endpoint"): "emulators only; `storage_endpoint` is documented",
}
_FLAG = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")


@dataclass
class Row:
    """One row of the table: the command's forms (code spans of the first cell) and every
    option named in the row's code spans."""

    forms: list[str]
    flags: set[str] = field(default_factory=set)
    text: str = ""

    @property
    def words(self) -> list[str]:
        """The command words of its first form, alternatives kept: ["job", "cancel|pause"]."""
        words = []
        for word in self.forms[0].split():
            if not re.fullmatch(r"[a-z][a-z-]*(\|[a-z][a-z-]*)*", word):
                break
            words.append(word)
        return words


def tokens() -> list:
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark").enable("table").parse(README.read_text())


def tables() -> list[list[list[list[str]]]]:
    """Each table of README: rows (the header first) of cells, each the cell's code spans."""
    found: list[list[list[list[str]]]] = []
    row: list[list[str]] | None = None
    for tok in tokens():
        if tok.type == "table_open":
            found.append([])
        elif tok.type == "tr_open":
            row = []
        elif tok.type == "tr_close" and row is not None:
            found[-1].append(row)
            row = None
        elif tok.type == "inline" and row is not None:
            spans = [
                c.content.replace("\\|", "|") for c in tok.children or [] if c.type == "code_inline"
            ]
            row.append(spans + ["\0" + tok.content])  # the cell's text last, marked
    return found


def command_rows() -> list[Row]:
    """The rows of the table headed `command | what it does`."""
    [table] = [t for t in tables() if [c[-1] for c in t[0]] == ["\0command", "\0what it does"]]
    rows = []
    for first, second in (r for r in table[1:]):
        spans = first[:-1] + second[:-1]
        rows.append(
            Row(
                forms=first[:-1],
                text=first[-1][1:] + " | " + second[-1][1:],
                flags={f for s in spans for f in _FLAG.findall(s)},
            )
        )
    return rows


def leaves() -> dict[str, argparse.ArgumentParser]:
    """Every command of the CLI as typed (`job cancel`, `provider add ssh`): its parser."""
    from monkey.shell import cli

    out: dict[str, argparse.ArgumentParser] = {}

    def walk(p: argparse.ArgumentParser, path: list[str]) -> None:
        subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            out[" ".join(path)] = p
        for sub in subs:
            for name, child in sub.choices.items():
                walk(child, [*path, name])

    for name, builder in {**cli.PARSERS, **cli.ONE_SHOT}.items():
        walk(builder(), [name])
    return out


def row_commands(row: Row, parsers: dict[str, argparse.ArgumentParser]) -> list[str]:
    """The commands a row documents (`job cancel|pause` -> job cancel, job pause)."""
    paths = [""]
    for word in row.words:
        grown = [f"{p} {alt}".strip() for p in paths for alt in word.split("|")]
        if not any(any(k == g or k.startswith(g + " ") for k in parsers) for g in grown):
            break  # a positional word (`daemon start|stop`), not a command
        paths = grown
    return [p for p in paths if p in parsers]


def options(parser: argparse.ArgumentParser) -> list[list[str]]:
    """The option strings of each option of PARSER."""
    return [list(a.option_strings) for a in parser._actions if a.option_strings]
