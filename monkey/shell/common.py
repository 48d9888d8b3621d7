"""What the shell's command modules share: the one-line-error parser, JOB arguments, the
``Monkey`` facade, JSON output, following a job to its end. Only argparse and the standard
library are imported up here (one-shot commands stay fast)."""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import sys
from collections.abc import Iterable

from monkey.models import MonkeyError, State, whole_number

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, NoReturn, TextIO

    from monkey.api import Monkey


# argparse translates its own words ("options", "usage: "...) through gettext, which at each
# word looks for catalogues on disk (Python ships none for them) and imports locale first:
# about 1 M instructions and a module more for each parser a command makes. monkey's
# command lines speak English throughout, argparse's words with them.
argparse._ = str  # type: ignore[attr-defined]


class UsageError(MonkeyError):
    """A command line that does not parse."""


def columns(out: TextIO, fallback: int) -> int:
    """$COLUMNS, else the width of OUT's terminal, else FALLBACK: shutil.get_terminal_size,
    without importing shutil (and bz2 and lzma with it) on a one-shot command's path."""
    given = whole_number(os.environ.get("COLUMNS", ""))
    if given:
        return given
    try:
        return os.get_terminal_size(out.fileno()).columns or fallback
    except (AttributeError, OSError, ValueError):  # not a terminal, closed, or no fileno
        return fallback


class _Formatter(argparse.HelpFormatter):
    """argparse's help layout, sized as argparse sizes it but without importing shutil."""

    def __init__(
        self,
        prog: str,
        indent_increment: int = 2,
        max_help_position: int = 24,
        width: int | None = None,
    ) -> None:
        width = columns(sys.__stdout__ or sys.stdout, 80) - 2 if width is None else width
        super().__init__(prog, indent_increment, max_help_position, width)


class Parser(argparse.ArgumentParser):
    """argparse that reports errors as one line and raises instead of exiting."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if "formatter_class" not in kwargs:  # the width looked up once per parser, not once
            width = columns(sys.__stdout__ or sys.stdout, 80) - 2  # per argument added
            kwargs["formatter_class"] = functools.partial(_Formatter, width=width)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}{self._hint(message)}; see `{self.prog} --help`")

    def _hint(self, message: str) -> str:
        """ "did you mean ..." for an unknown option or sub-command in MESSAGE."""
        if message.startswith("unrecognized arguments: "):
            word = message.split()[2].partition("=")[0]
            # (never the word itself: an option of another sub-command)
            return suggest(word, set(_long_options(self)) - {word}) if word.startswith("-") else ""
        choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if choice:
            return suggest(choice.group(1), re.findall(r"'([^']*)'", choice.group(2)))
        return ""


def _long_options(parser: argparse.ArgumentParser) -> list[str]:
    """The --options of PARSER and of its sub-commands."""
    found = [o for o in parser._option_string_actions if o.startswith("--")]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += _long_options(sub)
    return found


def suggest(word: str, choices: Iterable[str]) -> str:
    """ "; did you mean X?" naming the choice closest to WORD, or "" when none is close."""
    import difflib

    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


# The parser class a builder makes its parsers with: `Parser` for one-shot use; the shell
# passes a cmd2.Cmd2ArgumentParser subclass (this module never imports cmd2).
ParserClass = type[argparse.ArgumentParser]


def make_parser(cls: ParserClass, prog: str, help: str) -> argparse.ArgumentParser:
    return cls(prog=f"monkey {prog}", description=help)


# -- JOB arguments: a positional, or `--juid JOB` as the original Monkey's scripts write ---


class _JobRef(argparse.Action):
    """Fills DEST from the JOB positional or from --juid; one job (many: a list)."""

    many = False

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        given = values if isinstance(values, list) else [] if values is None else [values]
        if not given:  # the positional, absent
            return
        before = getattr(namespace, self.dest)
        if before is not None and not self.many:
            parser.error("give the job once: as JOB or as --juid JOB")
        setattr(namespace, self.dest, [*(before or []), *given] if self.many else given[0])


class _JobRefs(_JobRef):
    many = True


def job_argument(
    p: argparse.ArgumentParser,
    dest: str = "job",
    count: str | int = 1,
    default: str | None = None,
    help: str = "job id, unique prefix, or `last`",
) -> None:
    """Add DEST, the job(s) a command takes: positional JOB, or --juid JOB (repeatable when
    COUNT, argparse's nargs, allows several). COUNT 1 with DEFAULT None means required;
    "?" optional (DEFAULT when absent); "+", "*" or an int as in argparse."""
    many = count not in (1, "?")
    action = _JobRefs if many else _JobRef
    p.add_argument(
        dest,
        nargs="*" if many else "?",
        metavar="JOB",
        action=action,
        default=None,
        help=help + " (or --juid JOB" + (", repeatable)" if many else ")"),
    )
    p.add_argument(
        "--juid",
        dest=dest,
        metavar="JOB",
        action=action,
        default=None,
        help="the job, as the original Monkey's scripts give it"
        if not many
        else "a job, as the original Monkey's scripts give it (repeatable)",
    )
    p.set_defaults(_job_rule=(dest, count, default, p))  # the parser: its prog as the shell set it


def queue_options(p: argparse.ArgumentParser) -> None:
    """Where a job stands in the queue: `--priority`, `--after` and `--after-any` of run,
    sweep and rerun."""
    p.add_argument(
        "--priority",
        type=int,
        default=0,
        metavar="N",
        help="higher starts first among queued jobs (default 0; first come first served "
        "within a priority)",
    )
    p.add_argument(
        "--after",
        action="append",
        metavar="JOB[,JOB...]",
        help="start only once these jobs (ids, prefixes, `last`, or sweeps: all their jobs) "
        "succeeded; if one fails or is cancelled, this one is cancelled (repeatable)",
    )
    p.add_argument(
        "--after-any",
        action="append",
        metavar="JOB[,JOB...]",
        help="start only once these jobs ended, however they ended (repeatable)",
    )
    p.add_argument(
        "--notify",
        action="append",
        metavar="TARGET[,TARGET...]",
        help="tell these `monkey notify` targets of this job's end (a sweep's: its "
        "failures and its end), whatever their rules (repeatable)",
    )


def check_jobs(args: argparse.Namespace) -> None:
    """Apply the rule job_argument() set: a missing required JOB is a UsageError."""
    rule = getattr(args, "_job_rule", None)
    if rule is None:
        return
    dest, count, default, parser = rule
    prog = parser.prog
    value = getattr(args, dest)
    if count in (1, "?"):
        if value is None:
            if count == 1:
                raise UsageError(
                    f"{prog}: name the job (JOB or --juid JOB, e.g. `last`); see `{prog} --help`"
                )
            setattr(args, dest, default)
        return
    value = value or []
    setattr(args, dest, value)
    if count == "+" and not value or isinstance(count, int) and len(value) != count:
        need = "at least one job" if count == "+" else f"{count} jobs"
        raise UsageError(f"{prog}: give {need} (JOB or --juid JOB); see `{prog} --help`")


def monkey() -> Monkey:
    """The facade every command goes through: this machine's, or the selected remote's
    (``RemoteMonkey``: the same methods and results for the commands that work through a
    remote; the CLI refuses the others before they run)."""
    from monkey.remote.settings import selected

    if selected():
        from monkey.remote.facade import RemoteMonkey

        return RemoteMonkey()  # type: ignore[return-value]  # the methods those commands use
    from monkey.api import Monkey

    return Monkey()


in_shell = False  # a command of the `monkey>` shell is running (set by its run_command)


def print_error(text: str) -> None:
    """One error line on stderr, as every other error is shown: ``error: ...`` in the
    ``monkey>`` shell, ``monkey: error: ...`` from a one-shot command."""
    print(("error: " if in_shell else "monkey: error: ") + text, file=sys.stderr)


def print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2, default=str) + "\n")


def exit_status(state: State, code: int | None) -> int:
    """The shell exit status that reflects how a job ended."""
    if state == State.SUCCEEDED:
        return 0
    if state == State.FAILED and code:
        return code if 0 < code < 256 else 1
    if state == State.CANCELLED:
        return 130
    return 1


def write_all(chunks: Iterable[bytes]) -> bool:
    """Write bytes to stdout as they come; whether there were any."""
    out, wrote = sys.stdout.buffer, False
    for chunk in chunks:
        out.write(chunk)
        out.flush()
        wrote = True
    return wrote


def follow(m: Monkey, juid: str, stream: str, tail: int | None = None) -> int:
    try:
        write_all(m.follow(juid, tail=tail, stream=stream))
    except KeyboardInterrupt:
        print(f"\nmonkey: stopped following; job {juid} goes on", file=sys.stderr)
        return 130
    job = m.get_job(juid)
    if job.state != State.SUCCEEDED:
        hint = (
            ""
            if stream != "stdout"
            or "monkey logs" in (job.reason or "")
            or job.state != State.FAILED
            else f"; its errors: `monkey logs --stderr {juid}`"
        )
        print(
            f"monkey: job {juid} {job.state.value}"
            + (f" ({job.reason})" if job.reason else "")
            + hint,
            file=sys.stderr,
        )
    return exit_status(job.state, job.exit_code)
