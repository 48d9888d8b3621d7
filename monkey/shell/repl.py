"""The interactive `monkey>` shell: the one-shot commands, with completion and history.

Every command here is the one-shot command of the same name: the shell builds its parser with
the builder in `cli.PARSERS` (given a cmd2 parser class) and runs the same `cmd_*` function
through `MonkeyShell.run_command`, on this machine or through the selected remote as the CLI
would (`routing.route`). Nothing else in monkey imports this module (cmd2 is slow to
import), except `cli.main` when `monkey` is run with no arguments.
"""

from __future__ import annotations

import argparse
import codecs
import io
import json
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TextIO, cast

import cmd2

from monkey import version
from monkey.models import MonkeyError
from monkey.shell import cli, common

if TYPE_CHECKING:
    from monkey.api import Monkey

PROMPT = "monkey> "
REMOTE_PROMPT = "monkey[{}]> "  # through remote NAME
# A shell restarted onto reinstalled code gets {"line": the command typed when the change was
# noticed, run first; "session": where its history session began} in this variable.
RESUME = "MONKEY_SHELL_RESUME"
CATEGORY = "monkey"
# Arguments that name jobs; tab completes them with job ids.
JOB_ARGUMENTS = ("job", "jobs", "after", "after_any")
# How many of the newest job ids completion offers.
JOB_CHOICES = 200
# Arguments that name local files or folders (and the command after `--`); tab completes
# them with paths. `provider add ssh --workdir` is a folder on the host, so not completed.
PATH_ARGUMENTS = (
    "workdir",
    "dataset",
    "job_yml",
    "env_file",
    "install_script",
    "persist",
    "data",
    "to",
    "out",
    "file",
    "cmd",
)


class ShellParser(cmd2.Cmd2ArgumentParser):
    """cmd2's parser, reporting a bad command line in one line as the one-shot CLI does.

    The SystemExit that follows is caught by cmd2, so the shell goes on.
    """

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"error: {self.prog}: {message}; see `{self.prog} --help`\n")
        self.exit(2)


class _BinaryOutput:
    """`sys.stdout.buffer` while a shell command runs: bytes to the shell's stdout.

    Bytes pass through untouched to a stream that has a binary layer (a terminal, a file,
    a pipe); otherwise (a StringIO in tests) they are decoded as UTF-8.
    """

    def __init__(self, text: TextIO) -> None:
        self._text = text
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def write(self, data: bytes) -> int:
        raw = getattr(self._text, "buffer", None)
        if raw is not None:
            self._text.flush()  # keep text written before these bytes in front of them
            raw.write(data)
        else:
            self._text.write(self._decoder.decode(bytes(data)))
        return len(data)

    def flush(self) -> None:
        self._text.flush()
        raw = getattr(self._text, "buffer", None)
        if raw is not None:
            raw.flush()


class _CommandOutput(io.TextIOBase):
    """`sys.stdout` while a shell command runs: the shell's current stdout.

    cmd2 swaps `self.stdout` for redirection (`list jobs > file`, `| less`) and tests swap it
    to capture output; the command functions print to `sys.stdout`, so it points here.
    """

    def __init__(self, target: TextIO) -> None:
        super().__init__()
        self._target = target
        self.buffer = _BinaryOutput(target)

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self._target, "encoding", None) or "utf-8"

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self._target.write(text)
        return len(text)

    def flush(self) -> None:
        self._target.flush()

    def isatty(self) -> bool:
        return self._target.isatty()

    def fileno(self) -> int:
        return self._target.fileno()


def _job_choices(app: MonkeyShell) -> cmd2.Choices:
    """choices_provider for JOB arguments: `last` and the newest job ids."""
    return cmd2.Choices.from_values(["last", *app.job_ids()], is_sorted=True)


def _complete_jobs(parser: argparse.ArgumentParser, paths: bool = True) -> None:
    """Give every job argument of `parser` and its sub-parsers job-id completion, and
    (with `paths`) every path argument path completion."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):  # aliases share a parser
                _complete_jobs(sub, paths)
        elif action.dest in JOB_ARGUMENTS:  # JOB, --juid JOB, --jobs JOB...
            action.set_choices_provider(_job_choices)  # type: ignore[attr-defined]
        elif paths and action.dest in PATH_ARGUMENTS:
            action.set_completer(cmd2.Cmd.path_complete)  # type: ignore[attr-defined]


# The shell's commands: the one-shot CLI's (the same parsers and functions).
COMMANDS = {**cli.PARSERS, **{name: cli.ONE_SHOT[name] for name in cli.SHELL_TOO}}


def _remotes(_: MonkeyShell) -> cmd2.Choices:
    """choices_provider for `remote remove NAME`: the remotes set up here."""
    from monkey.remote import settings

    try:
        return cmd2.Choices.from_values(sorted(settings.load()["remotes"]), is_sorted=True)
    except MonkeyError as exc:
        raise cmd2.CompletionError(str(exc)) from None


def _remotes_or_local(app: MonkeyShell) -> cmd2.Choices:
    """choices_provider for `remote use NAME`: the remotes set up here, and `local`."""
    from monkey.remote.settings import LOCAL

    return cmd2.Choices.from_values([*_remotes(app).to_strings(), LOCAL])


def shell_parser(name: str) -> ShellParser:
    """The parser of one-shot command `name`, built for the shell."""
    parser = cast(ShellParser, COMMANDS[name](cls=ShellParser))  # built as a cls
    _complete_jobs(parser, paths=name != "provider")
    if name == "remote":
        verbs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        for verb, choices in (("use", _remotes_or_local), ("remove", _remotes)):
            for arg in verbs.choices[verb]._actions:
                if arg.dest == "name":
                    arg.set_choices_provider(choices)
    return parser


def _private_file(path: Path) -> Path:
    """Make `path` a 0600 file: the history may hold secrets typed in `run --env`."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    os.chmod(path, 0o600)
    return path


def history_file() -> Path:
    """Where the shell keeps its history: $MONKEY_HOME/history, or through remote NAME
    beside its blob cache (the laptop then holds no MONKEY_HOME)."""
    from monkey.remote.settings import selected

    name = selected()
    if name is None:
        from monkey.config import Home

        return _private_file(Home().ensure().root / "history")
    from monkey.remote.submit import cache_folder

    folder = cache_folder(name)
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    return _private_file(folder / "history")


def prompt() -> str:
    """`monkey> ` on this machine, `monkey[lab]> ` through remote lab."""
    from monkey.remote.settings import selected

    name = selected()
    return PROMPT if name is None else REMOTE_PROMPT.format(name)


class MonkeyShell(cmd2.Cmd):
    """`monkey>`: every one-shot command, plus cmd2's history, redirection and scripting."""

    def __init__(self, *, persistent_history_file: str | None = None, **kwargs: Any) -> None:
        """cmd2.Cmd's options; history persists in `history_file()` unless a file is given."""
        if persistent_history_file is None:
            persistent_history_file = str(history_file())
        kwargs.setdefault("allow_cli_args", False)  # `monkey ARGS` is the one-shot CLI's
        kwargs.setdefault("suggest_similar_command", True)
        super().__init__(persistent_history_file=persistent_history_file, **kwargs)
        self.prompt = prompt()
        self.default_error = "error: unknown command '{}'; type `help` to list the commands"
        self._monkey: Monkey | None = None
        self._remote: tuple[str, Monkey] | None = None  # (name, its facade) for completion
        self._completing = threading.Lock()  # completion runs in threads; one connection
        self._put_back: tuple[str | None] | None = None  # $MONKEY_REMOTE before `--remote`
        version.code_digest()  # the code this shell runs, to notice a reinstall against
        self._reinstalled: str | None = None
        self.register_postparsing_hook(self._restart_if_reinstalled)
        self.register_postparsing_hook(self._as_the_cli)
        self.register_cmdfinalization_hook(self._end_of_command)

    def _as_the_cli(self, data: cmd2.plugin.PostparsingData) -> cmd2.plugin.PostparsingData:
        """Before a command, read its line as the one-shot CLI does: a short form written out
        (`cancel JOB` is `job cancel JOB`, `info JOB` is `info job JOB`), and `--remote NAME`
        (before any `--`) taken out: NAME for this command only."""
        statement = data.statement
        if not statement.command or statement.command in ("alias", "macro", "shell"):
            return data
        words = [statement.command, *statement.arg_list]  # quotes kept
        before = os.environ.get("MONKEY_REMOTE")
        try:
            line = cli.expand(cli.take_remote(words))
        except MonkeyError as exc:  # `--remote` and no NAME
            self.perror(f"error: {str(exc).removeprefix('monkey: ')}")
            self.last_result = 2
            raise cmd2.exceptions.EmptyStatement from None
        if os.environ.get("MONKEY_REMOTE") != before:
            self._put_back = (before,)  # once the command is done
        if line != words:
            post = statement.post_command
            typed = self.statement_parser.parse(" ".join(line) + (f" {post}" if post else ""))
            data.statement = type(typed).from_dict({**typed.to_dict(), "raw": statement.raw})
        return data

    def _end_of_command(
        self, data: cmd2.plugin.CommandFinalizationData
    ) -> cmd2.plugin.CommandFinalizationData:
        """After a command: the session's remote again if it was given `--remote NAME`, and
        the prompt naming where the next command goes (a shell on this machine follows
        `remote use` typed in another terminal, as one-shot commands do)."""
        if self._put_back is not None:
            (before,), self._put_back = self._put_back, None
            if before is None:
                os.environ.pop("MONKEY_REMOTE", None)
            else:
                os.environ["MONKEY_REMOTE"] = before
        self.prompt = prompt()
        return data

    def _restart_if_reinstalled(
        self, data: cmd2.plugin.PostparsingData
    ) -> cmd2.plugin.PostparsingData:
        """Before a command: when monkey was reinstalled since the shell started, say so and
        restart the shell onto the new code (history kept), which then runs the command. A
        shell reading a script or a pipe is not restarted (it would lose its input): it says
        so once."""
        change = version.reinstalled()
        if (
            change is None
            or change == self._reinstalled
            or data.statement.command in ("quit", "exit", "eof")
        ):
            return data
        self._reinstalled = change
        if not self.stdin.isatty():
            self.perror(f"note: {change}; start the shell again to use it")
            return data
        self.perror(f"note: {change}; restarting the shell")
        self._persist_history()
        resume = {"line": data.statement.raw, "session": self.history.session_start_index}
        version.restart({RESUME: json.dumps(resume)})

    # -- running the one-shot commands ----------------------------------------------------

    def run_command(self, args: argparse.Namespace, name: str) -> int:
        """Run command NAME, parsed into ARGS, as the CLI would (on this machine or through
        the selected remote, the same refusals), printing into the shell.

        A MonkeyError prints `error: MESSAGE` (a command that does not work through a remote:
        the CLI's line) and the shell goes on; the exit status the command would have had is
        left in `self.last_result`.
        """
        saved = sys.stdout
        sys.stdout = _CommandOutput(self.stdout)
        common.in_shell = True  # a command's own error lines read as the shell's (print_error)
        try:
            cli.route(name, args)
            cli.check_jobs(args)
            status = int(args.func(args) or 0)
            if name == "remote":
                self._switched(args)
        except cli.NotRemote as exc:
            self.perror(str(exc))
            status = 2
        except MonkeyError as exc:
            self.perror(f"error: {exc}")
            status = 2 if isinstance(exc, cli.UsageError) else 1
        except BrokenPipeError:  # `list jobs | head -1`
            status = 141
        except Exception as exc:
            error = cli.user_error(exc)
            if error is None:
                raise
            self.perror(f"error: {error}")
            status = 1
        finally:
            common.in_shell = False
            try:
                sys.stdout.flush()
            except (BrokenPipeError, ValueError):
                pass
            sys.stdout = saved
        self.last_result = status
        return status

    def _switched(self, args: argparse.Namespace) -> None:
        """After `remote use` or `remote remove` here: the next commands go where it says
        (kept in $MONKEY_REMOTE for this session, see routing.shell_remote), and the prompt
        names it."""
        from monkey.remote.settings import LOCAL

        if args.action == "use":
            if args.name and args.name != LOCAL:
                os.environ["MONKEY_REMOTE"] = args.name
            else:
                os.environ.pop("MONKEY_REMOTE", None)
        elif args.action == "remove" and os.environ.get("MONKEY_REMOTE") == args.name:
            os.environ.pop("MONKEY_REMOTE", None)  # back to this machine, as the CLI
        self.prompt = prompt()

    def monkey(self) -> Monkey:
        """The Monkey of this machine the shell reads from to complete; commands make their
        own."""
        if self._monkey is None:
            from monkey.api import Monkey

            self._monkey = Monkey(remote="local")
        return self._monkey

    def _remote_facade(self) -> Monkey:
        """The selected remote's facade, for completion (kept while the remote stays)."""
        from monkey.remote.settings import selected
        from monkey.shell.common import monkey

        name = selected()
        if self._remote is None or self._remote[0] != name:
            if self._remote is not None:
                self._remote[1].close()
                self._remote = None
            self._remote = (str(name), monkey())
        return self._remote[1]

    def job_ids(self) -> list[str]:
        """The newest job ids, newest first, for completion: through a remote the main
        node's (none when it is out of reach)."""
        from monkey.remote.settings import selected

        if selected():
            with self._completing:
                return cli.recent_jobs(JOB_CHOICES, self._remote_facade)
        try:
            return [job.juid for job in self.monkey().store.list_jobs(limit=JOB_CHOICES)]
        except MonkeyError as exc:
            raise cmd2.CompletionError(str(exc)) from None

    # -- shell commands -------------------------------------------------------------------

    @cmd2.with_argparser(cmd2.Cmd.__dict__["_build_help_parser"])
    def do_help(self, args: argparse.Namespace) -> None:
        """List the commands, or describe one: help COMMAND [SUBCOMMAND]."""
        if args.command or args.verbose:
            _CMD2_HELP(self, args)
            return
        self.last_result = True
        ours = [name for name in COMMANDS if self.get_command_func(name) is not None]
        others = sorted(set(self.get_visible_commands()) - set(ours))
        for title, names in (
            ("monkey commands (`COMMAND --help` describes one):", ours),
            ("shell commands:", others),
        ):
            self.poutput(title)
            width = max(len(name) for name in names)
            for name in names:
                self.poutput(f"  {name.ljust(width)}  {self._summary(name)}")
            self.poutput("")
        self.poutput("JOB is a job id (26-11-21-001), a unique prefix of one, or `last`.")
        self.poutput("Tab completes commands, options and job ids; `quit` or Ctrl-D leaves.")

    def _summary(self, name: str) -> str:
        """The first line of a command's description."""
        func = self.get_command_func(name)
        doc = (func.__doc__ or "").strip() if func else ""
        return doc.splitlines()[0].strip() if doc else ""

    @staticmethod
    def _build_exit_parser() -> cmd2.Cmd2ArgumentParser:
        return cmd2.Cmd2ArgumentParser(description="Leave the shell (same as quit).")

    @cmd2.with_argparser(_build_exit_parser)
    def do_exit(self, _: argparse.Namespace) -> bool:
        """Leave the shell (same as quit)."""
        self.last_result = True
        return True


# cmd2's own help, for `help COMMAND` and `help -v`.
_CMD2_HELP: Callable[[cmd2.Cmd, argparse.Namespace], None] = cmd2.Cmd.do_help.__wrapped__  # type: ignore[attr-defined]


def _shell_command(name: str) -> Callable[..., Any]:
    """`do_NAME`: parse with the one-shot parser, run the one-shot command function."""

    def build_parser() -> ShellParser:
        return shell_parser(name)

    def command(self: MonkeyShell, args: argparse.Namespace) -> None:
        self.run_command(args, name)

    # cmd2 names the command and keys its parser by these, so set them before decorating.
    command.__name__ = f"do_{name}"
    command.__qualname__ = f"{MonkeyShell.__qualname__}.do_{name}"
    description = build_parser().description  # a str: cmd2 allows a rich renderable
    command.__doc__ = description if isinstance(description, str) else None
    return cmd2.with_category(CATEGORY)(cmd2.with_argparser(build_parser)(command))


for _name in COMMANDS:
    setattr(MonkeyShell, f"do_{_name}", _shell_command(_name))
del _name


def run_shell() -> int:
    """`monkey` with no arguments: the interactive shell until quit, exit or Ctrl-D."""
    app = MonkeyShell()
    intro = ""
    resume = json.loads(os.environ.pop(RESUME, "null"))
    if resume is not None:  # restarted onto reinstalled code: the same session goes on
        app.history.session_start_index = min(resume["session"], len(app.history))
        if app.onecmd_plus_hooks(resume["line"]):
            return app.exit_code
    elif sys.stdin.isatty():
        intro = f"monkey {cli.VERSION}: type `help` for the commands, `quit` or Ctrl-D to leave."
        intro += _where()
    return app.cmdloop(intro)


def _where() -> str:
    """The intro's line naming the main node commands go to ("" on this machine)."""
    from monkey.remote import settings

    name = settings.selected()
    if name is None:
        return ""
    url = settings.load()["remotes"].get(name, {}).get("url", "?")
    return f"\nCommands go to the main node {name} ({url}); `remote use local` for this machine."
