"""MONKEY_HOME and its files; providers.yml loading and validation."""

from __future__ import annotations

import functools
import os
import re
import stat
import sys
from collections.abc import Callable
from pathlib import Path

from monkey.models import MonkeyError, Record, later_pattern

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, BinaryIO

# Unix socket paths are limited to 107 bytes; longer homes get a short private folder.
_SOCKET_PATH_MAX = 100
_PACKAGE_PARENT = str(Path(__file__).resolve().parents[1])


def python_entry(module: str, function: str, exits: bool = False) -> list[str]:
    """argv running ``module.function()`` with this interpreter and this copy of monkey,
    whether or not monkey is installed. The process is isolated (``-I``: neither the folder
    it starts in nor PYTHON* variables reach sys.path, so a project's json.py cannot stand
    in for the standard library's) and given this process's import path instead, minus the
    script's folder and the current one; the path travels as an argument, not PYTHONPATH,
    so jobs started below it inherit nothing. With EXITS, the result is the exit status."""
    skip = 0 if sys.flags.isolated or getattr(sys.flags, "safe_path", False) else 1
    try:
        here = os.getcwd()
    except OSError:  # the folder was deleted: nothing can be imported from it
        here = ""
    # Relative entries ('' included) name the current folder too.
    paths = [p for p in sys.path[skip:] if os.path.isabs(p) and p != here]
    boot = (
        "import os, sys; sys.path[:] = sys.argv.pop(1).split(os.pathsep); "
        f"from {module} import {function}; "
        + (f"sys.exit({function}())" if exits else f"{function}()")
    )
    path = os.pathsep.join(dict.fromkeys([_PACKAGE_PARENT, *paths]))
    return [sys.executable, "-I", "-c", boot, path]


_ROUTINE_LOG_LINE = later_pattern(r"^\S+ \S+ (?:(?:DEBUG|INFO|WARNING) |agent\[)")


def lock_now(fd: int) -> int | None:
    """FD with an exclusive lock taken on it now, or None (FD closed) when another process
    holds it: the lock that says a core, or a server, runs for a MONKEY_HOME."""
    import errno
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            return None
        raise
    return fd


def stop_process(
    pid_now: Callable[[], int | None], what: str, timeout: float, every: float = 0.02
) -> int | None:
    """SIGTERM the process PID_NOW names (a pid file or lock read fresh: a core, a server)
    and wait until PID_NOW names none; the pid that stopped, or None when none ran.
    MonkeyError naming WHAT when it is still there after TIMEOUT seconds."""
    import signal
    import time

    pid = pid_now()
    if not pid or pid < 0:
        return None
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return None
    deadline = time.monotonic() + timeout
    while pid_now():
        if time.monotonic() > deadline:
            raise MonkeyError(f"{what} (pid {pid}) did not stop within {timeout:.0f}s")
        time.sleep(every)
    return pid


def first_error(log: Path, offset: int) -> str:
    """The first error a process wrote to LOG from byte OFFSET on: the exception line of a
    traceback, else the first line that is not a routine log message."""
    try:
        with open(log, "rb") as fh:
            fh.seek(offset)
            text = fh.read(1 << 16).decode(errors="replace")
    except OSError as exc:
        return f"its log {log} cannot be read ({exc.strerror})"
    for line in text.splitlines():
        if (
            line.strip()
            and not line.startswith((" ", "\t", "Traceback (", "usage: "))
            and not _ROUTINE_LOG_LINE.match(line)
        ):
            line = line.strip().removeprefix("monkey: ").removeprefix("error: ")
            return line.removeprefix("monkey.models.MonkeyError: ")[:500]  # says it all
    return "it exited without saying why"


_APPEND = os.O_WRONLY | os.O_CREAT | os.O_APPEND


def open_private(path: str | os.PathLike[str], flags: int = _APPEND) -> BinaryIO:
    """PATH opened for writing (appending unless FLAGS say otherwise), created 0600."""
    return os.fdopen(os.open(path, flags | os.O_CLOEXEC, 0o600), "wb")


def write_private(path: str | os.PathLike[str], data: bytes) -> None:
    """Write DATA to PATH (replacing what it held), a file only this user may read."""
    with open_private(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC) as f:
        os.fchmod(f.fileno(), 0o600)  # a file left by an older monkey may be 0644
        f.write(data)


def _chmod_private(path: str | os.PathLike[str]) -> None:
    """Take every group and other permission away from PATH (gone meanwhile: nothing to do)."""
    try:
        os.chmod(path, stat.S_IMODE(os.stat(path).st_mode) & 0o700)
    except FileNotFoundError:
        pass


class Home:
    """Every path under MONKEY_HOME, derived from one folder."""

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        base = root or os.environ.get("MONKEY_HOME") or Path.home() / ".monkey"
        self.root = Path(base).expanduser().resolve()
        self._sockets: dict[str, Path] = {}  # socket paths under the root (fixed: the root is)

    def ensure(self) -> Home:
        """Create the folder layout (idempotent), private to this user, and return self;
        MonkeyError when MONKEY_HOME is not a folder of this user that it can write to.

        A home made by an older monkey (0755) is tightened once: the root and what lies
        directly in it lose every group and other permission; deeper files need not be
        visited, as nobody else can reach them any more."""
        try:
            self._refuse_a_foreign_folder()
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            info = self.root.stat()
            if info.st_uid != os.getuid():
                raise MonkeyError(
                    f"MONKEY_HOME {self.root} belongs to another user "
                    f"(uid {info.st_uid}); set MONKEY_HOME to a folder of your own"
                )
            for sub in (self.blobs, self.runs, self.secrets, self.private):
                sub.mkdir(mode=0o700, exist_ok=True)
        except FileExistsError as exc:
            raise MonkeyError(
                f"MONKEY_HOME: {exc.filename} is a file, not a folder; move it "
                "aside or set MONKEY_HOME to a folder"
            ) from None
        except OSError as exc:
            raise MonkeyError(
                f"MONKEY_HOME {self.root} cannot be used ({exc.strerror}: "
                f"{exc.filename}); fix its permissions or set MONKEY_HOME "
                "elsewhere"
            ) from None
        if info.st_mode & 0o077:
            self._tighten()
        return self

    def _refuse_a_foreign_folder(self) -> None:
        """MonkeyError when the root is a folder of other files, not a home: monkey would
        fill it with its folders and take every group and other permission off what lies in
        it (MONKEY_HOME=/ made the whole machine unreadable to other users). A new or empty
        folder, one holding only a providers.yml, or one monkey has used is a home."""
        if self.db.exists():
            return
        try:
            with os.scandir(self.root) as entries:
                names = {e.name for e in entries}
        except (FileNotFoundError, NotADirectoryError):
            return  # made below, or refused there as a file
        ours = {self.blobs.name, self.runs.name, self.secrets.name, self.private.name}
        if names & ours or names <= {self.providers_file.name}:
            return
        raise MonkeyError(
            f"MONKEY_HOME {self.root} is a folder of other files, not a monkey home (it has no "
            f"{self.db.name}); set MONKEY_HOME to a new or empty folder"
        )

    def _tighten(self) -> None:
        """Remove group and other permissions from the root and its direct entries."""
        try:
            with os.scandir(self.root) as entries:
                for entry in entries:
                    if not entry.is_symlink():
                        _chmod_private(entry.path)
            _chmod_private(self.root)  # last: a tightening cut short is done again next time
        except OSError as exc:
            where = exc.filename or self.root
            raise MonkeyError(
                f"cannot make {where} private to you ({exc.strerror}); it must belong to you"
            ) from None

    @property
    def db(self) -> Path:
        return self.root / "monkey.db"

    @property
    def providers_file(self) -> Path:
        return self.root / "providers.yml"

    @property
    def blobs(self) -> Path:
        return self.root / "blobs"

    @property
    def runs(self) -> Path:
        return self.root / "runs"

    @property
    def secrets(self) -> Path:
        return self.root / "secrets"

    @property
    def private(self) -> Path:
        """A 0700 folder for sockets and locks only this user may touch."""
        return self.root / "private"

    @property
    def daemon_pid(self) -> Path:
        return self.root / "daemon.pid"

    @property
    def daemon_log(self) -> Path:
        return self.root / "daemon.log"

    @property
    def core_status(self) -> Path:
        """Why the running core cannot write, when it cannot (see monkey.core.outage)."""
        return self.private / "core.status"

    @property
    def daemon_lock(self) -> Path:
        return self.private / "daemon.lock"

    @property
    def agent_root(self) -> Path:
        """Where the local agent keeps its state; runs and blobs are shared with the core."""
        return self.root

    @property
    def keys(self) -> Path:
        """SSH keys monkey made for the machines it creates (0700; each key 0600)."""
        return self.root / "keys"

    def home_id(self) -> str:
        """This home's id, made once at random (file `home_id`). Cloud resources monkey
        creates carry it in their `monkey-home` tag, so a home touches only its own."""
        path = self.root / "home_id"
        if not path.exists():
            staged = path.with_name(f"home_id.{os.getpid()}")
            write_private(staged, os.urandom(6).hex().encode())
            try:
                os.link(staged, path)  # atomic: of two racing processes, one id wins
            except FileExistsError:
                pass
            finally:
                staged.unlink()
        found = path.read_text(errors="replace").strip()
        if not re.fullmatch(r"[0-9a-f]{12}", found):
            raise MonkeyError(
                f"{path} holds {found[:40]!r}, not a home id; delete it and monkey makes a new one"
            )
        return found

    def socket_path(self, name: str) -> Path:
        """Path of a private Unix socket, shortened when MONKEY_HOME is deep."""
        path = self._sockets.get(name)
        if path is not None:
            return path
        path = self.private / f"{name}.sock"
        if len(str(path)) <= _SOCKET_PATH_MAX:
            self._sockets[name] = path
            return path
        import hashlib  # only for a deep MONKEY_HOME: one-shot commands skip its import

        tag = hashlib.blake2s(str(self.root).encode(), digest_size=6).hexdigest()
        short = Path(f"/tmp/monkey-{os.getuid()}")
        short.mkdir(mode=0o700, exist_ok=True)
        info = short.lstat()
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise MonkeyError(
                f"{short} is not a private folder of this user; remove it or set a shorter MONKEY_HOME"
            )
        return short / f"{tag}-{name}.sock"

    def run_dir(self, juid: str, attempt: int) -> Path:
        return self.runs / juid / str(attempt)

    def checkpoint_dir(self, juid: str) -> Path:
        return self.runs / juid / "checkpoint"

    def secrets_file(self, juid: str) -> Path:
        return self.secrets / f"{juid}.json"


CONFIG_MAX_BYTES = 1 << 20  # providers.yml, job.yml and sweep files are far smaller
YAML_MAX_NODES = 100_000  # values in one file, counting each alias (*name) as what it repeats
YAML_MAX_DEPTH = 100


def read_config(path: Path) -> str:
    """The text of a config file: a regular UTF-8 file of at most CONFIG_MAX_BYTES.

    FIFOs, devices and folders are refused without reading them (the open does not block)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise MonkeyError(f"cannot read {path}: {exc.strerror}; check its permissions") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise MonkeyError(f"cannot read {path}: not a regular file; put a YAML file there")
        chunks, size = [], 0
        while size <= CONFIG_MAX_BYTES:
            chunk = os.read(fd, CONFIG_MAX_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise MonkeyError(f"cannot read {path}: {exc.strerror}; check the file") from None
    finally:
        os.close(fd)
    if size > CONFIG_MAX_BYTES:
        raise MonkeyError(
            f"{path} is over {CONFIG_MAX_BYTES >> 20} MB, too big for a config "
            "file; point at the right file or trim it"
        )
    try:
        return b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MonkeyError(
            f"{path} is not UTF-8 text (byte {exc.start}); save it as UTF-8"
        ) from None


def compose_yaml(path: Path, text: str | None = None) -> tuple[Any, Any]:
    """A config file's root YAML node (None when empty) and the loader that constructs its
    values. Read through ``read_config`` unless its TEXT is given; aliases and nesting are
    bounded (no alias bombs)."""
    import yaml

    if text is None:
        text = read_config(path)
    try:
        loader = _bounded_loader()(text, path)
        return loader.get_single_node(), loader
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 1
        problem = exc.problem or exc.context
        raise MonkeyError(
            f"{path}:{line}: invalid YAML ({problem}); fix the syntax there"
        ) from None
    except yaml.YAMLError as exc:
        problem = str(exc).splitlines()[0]
        raise MonkeyError(f"{path}: invalid YAML ({problem}); fix the syntax there") from None


def read_yaml(path: Path, text: str | None = None) -> Any:
    """A config file's YAML data (its TEXT when read already); every problem is a one-line
    MonkeyError naming the file."""
    root, loader = compose_yaml(path, text)
    return None if root is None else loader.construct_document(root)


@functools.cache
def _bounded_loader() -> type:
    """yaml.SafeLoader that counts the values a document expands to as it is composed."""
    import yaml

    class BoundedLoader(yaml.SafeLoader):
        def __init__(self, text: str, path: Path) -> None:
            super().__init__(text)
            self.path = path
            self.sizes: dict[int, int] = {}  # id(node) -> values it expands to
            self.depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):  # repeats its anchor's values
                node = super().compose_node(parent, index)
                self.size(node)
                return node
            if self.depth >= YAML_MAX_DEPTH:
                raise MonkeyError(
                    f"{self.path}: nested over {YAML_MAX_DEPTH} levels deep; "
                    "a config file needs far fewer"
                )
            self.depth += 1
            try:
                node = super().compose_node(parent, index)
            finally:
                self.depth -= 1
            if isinstance(node, yaml.SequenceNode):
                size = 1 + sum(self.size(n) for n in node.value)
            elif isinstance(node, yaml.MappingNode):
                size = 1 + sum(self.size(k) + self.size(v) for k, v in node.value)
            else:
                size = 1
            if size > YAML_MAX_NODES:
                raise MonkeyError(
                    f"{self.path}: over {YAML_MAX_NODES:,} values (counting what "
                    "its aliases *name repeat); write the values out once"
                )
            self.sizes[id(node)] = size
            return node

        def size(self, node: Any) -> int:
            size = self.sizes.get(id(node))
            if size is None:  # an alias of a value still being composed
                raise MonkeyError(
                    f"{self.path}: an alias refers to the value that contains it; remove the loop"
                )
            return size

    return BoundedLoader


class ProviderConfig(Record):
    """One entry of providers.yml."""

    __slots__ = ("name", "type", "options")

    def __init__(self, name: str, type: str, options: dict[str, Any] | None = None) -> None:
        self.name = name
        self.type = type
        self.options = {} if options is None else options


def default_local() -> ProviderConfig:
    """The `local` provider that exists with no configuration."""
    return ProviderConfig("local", "local", {})


def read_providers(home: Home, text: str | None = None) -> dict[str, ProviderConfig]:
    """providers.yml's entries (from its TEXT when read already), checked for shape only (a
    mapping of names to mappings with a `type`); each kind's own rules are applied by
    ``monkey.drivers.load_providers``. The `local` provider is always present."""
    providers = {"local": default_local()}
    path = home.providers_file
    if text is None and not path.exists():
        return providers
    where = f"{path}"
    data = read_yaml(path, text)
    if data is None:
        return providers
    if not isinstance(data, dict) or not isinstance(data.get("providers", {}), dict):
        raise MonkeyError(f"{where}: expected a mapping `providers: {{NAME: {{type: ...}}}}`")
    unknown = set(data) - {"providers"}
    if unknown:
        raise MonkeyError(
            f"{where}: unknown top-level key {sorted(unknown)[0]!r}; only `providers` is allowed"
        )
    for name, entry in (data.get("providers") or {}).items():
        if not isinstance(entry, dict):
            raise MonkeyError(f"{where}: provider {name!r} must be a mapping with a `type`")
        if not isinstance(entry.get("type"), str):
            raise MonkeyError(f"{where}: provider {name!r} needs `type:` (local, ssh, ...)")
        providers[str(name)] = ProviderConfig(str(name), entry["type"], dict(entry))
    return providers
