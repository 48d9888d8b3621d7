"""A job's recorded job.yml, its ``spec`` (``jobspec.resolve`` makes it), in two readings:
``check_spec`` when a client sends one (a main node's API): strict, every field of its type,
every path relative and in the alphabet a folder name may use, sizes bounded, unknown keys
refused, a wrong field one line naming it; ``stored_spec`` when a row is read back: whatever
it holds, a dict of the same shape with what is malformed left out, so that no reader (info,
the web page, pull, rerun, the core) fails on it. Also the other paths a client gathers."""

from __future__ import annotations

from monkey.models import MonkeyError, later_pattern

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    Check = Callable[[Any, str], Any]

ENV_TYPES = ("pip", "conda", "none")
DATA_TYPES = ("copy", "mount")
COMPRESSIONS = ("gztar", "zip", "none")
# Machine options a provider entry may carry, with the YAML types each accepts.
MACHINE_OPTIONS: dict[str, tuple[type, ...]] = {
    "size": (str,),
    "machine_type": (str,),
    "disk": (int, str),
    "preemptible": (bool,),
    "spot": (bool,),
    "image": (str,),
    "region": (str,),
    "zone": (str,),
    "gpu_type": (str,),
}
MAX_FOLDERS = 100  # persisted or data folders of one job.yml
MAX_ITEMS = 1000  # env variables, ignore patterns, providers
MAX_TEXT = 4096  # a path, a pattern, a name
MAX_VALUE = 128 * 1024  # an env value (Linux takes at most 128 KiB per string)
DIGEST = later_pattern(r"[0-9a-f]{64}")
ENV_NAME = later_pattern(r"[A-Za-z_][A-Za-z0-9_]*")
_CONTROL = later_pattern(r"[\x00-\x1f\x7f-\x9f]")


def _fail(where: str, problem: str) -> MonkeyError:
    return MonkeyError(f"{where}: {problem}")


def _key(key: Any) -> str:
    """KEY as an error names it: its first 80 characters, quoted when not printable (a
    newline in a key must not split the one-line error)."""
    text = str(key)[:80]
    return text if text.isprintable() else repr(text)


def check_text(value: Any, where: str, most: int = MAX_TEXT) -> str:
    """VALUE as text of at most MOST characters, without control characters or lone
    surrogates."""
    if not isinstance(value, str):
        raise _fail(where, f"must be text, not {type(value).__name__}")
    if len(value) > most:
        raise _fail(where, f"is {len(value):,} characters long; at most {most:,}")
    if _CONTROL.search(value):
        raise _fail(where, f"{value[:80]!r} holds a control character")
    try:
        value.encode()
    except UnicodeEncodeError:
        raise _fail(where, f"{value[:80]!r} is not valid Unicode text") from None
    return value


def check_relpath(value: Any, where: str, dot: bool = False) -> str:
    """VALUE as a normalised relative path that stays in its folder (no absolute path, no
    `..`, `.` or empty part; `.` itself when DOT)."""
    path = check_text(value, where)
    if dot and path == ".":
        return path
    parts = path.split("/")
    if path.startswith(("/", "~")) or any(p in ("", ".", "..") for p in parts):
        raise _fail(where, f"{path!r} must be a relative path inside the project, without `..`")
    if any(len(p.encode()) > 255 for p in parts):
        raise _fail(where, f"{path[:80]!r} has a part longer than 255 bytes")
    return path


def check_folder_name(value: Any, where: str) -> str:
    """VALUE as the name of a persisted or data folder (one part of a path)."""
    from monkey.client_agent.rundir import FOLDER_NAME  # (the agent's own rule)

    if not isinstance(value, str) or not FOLDER_NAME.fullmatch(value):
        raise _fail(
            where,
            f"{value!r} must be 1 to 200 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit",
        )
    return value


def check_digest(value: Any, where: str) -> str:
    if not isinstance(value, str) or not DIGEST.fullmatch(value):
        raise _fail(where, f"{str(value)[:80]!r} is not a blob digest")
    return value


def _choice(choices: tuple[str, ...]) -> Check:
    def check(value: Any, where: str) -> str:
        if value not in choices:
            raise _fail(where, f"{str(value)[:80]!r} is not one of {', '.join(choices)}")
        return str(value)

    return check


def _optional(check: Check) -> Check:
    return lambda value, where: None if value is None else check(value, where)


def _typed(*types: type) -> Check:
    def check(value: Any, where: str) -> Any:
        if not any(type(value) is t for t in types):
            names = " or ".join(t.__name__ for t in types)
            raise _fail(where, f"must be {names}, not {type(value).__name__}")
        return check_text(value, where) if isinstance(value, str) else value

    return check


def _count(value: Any, where: str) -> int:
    if type(value) is not int or not 0 <= value < 1 << 63:
        raise _fail(where, f"{str(value)[:80]!r} is not a whole number of bytes")
    return value


def _record(fields: dict[str, Check], optional: tuple[str, ...] = (), strict: bool = True) -> Check:
    """A check of a mapping with exactly FIELDS (OPTIONAL ones may be absent; not STRICT:
    other keys are left out)."""

    def check(value: Any, where: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise _fail(where, f"must be a mapping, not {type(value).__name__}")
        unknown = sorted(_key(k) for k in value if k not in fields)
        if unknown and strict:
            raise _fail(f"{where}.{unknown[0]}", f"unknown key; known: {', '.join(fields)}")
        out = {}
        for key, field in fields.items():
            if key in value:
                out[key] = field(value[key], f"{where}.{key}")
            elif key not in optional:
                raise _fail(f"{where}.{key}", "is missing")
        return out

    return check


def _listing(item: Check, most: int, strict: bool = True) -> Check:
    """A check of a list of at most MOST ITEMs (or, not STRICT, the good ones of any list)."""

    def check(value: Any, where: str) -> list[Any]:
        if not isinstance(value, list):
            raise _fail(where, f"must be a list, not {type(value).__name__}")
        if len(value) > most and strict:
            raise _fail(where, f"has {len(value):,} entries; at most {most:,}")
        out = []
        for i, entry in enumerate(value[: most if strict else None]):
            try:
                out.append(item(entry, f"{where}[{i}]"))
            except MonkeyError:
                if strict:
                    raise
        return out

    return check


def _mapping(key: Check, item: Check, most: int, strict: bool = True) -> Check:
    """A check of a mapping of at most MOST KEY: ITEM pairs (or, not STRICT, the good ones)."""

    def check(value: Any, where: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise _fail(where, f"must be a mapping, not {type(value).__name__}")
        if len(value) > most and strict:
            raise _fail(where, f"has {len(value):,} entries; at most {most:,}")
        out = {}
        for k, v in value.items():
            try:
                out[key(k, f"{where} key")] = item(v, f"{where}.{k}")
            except MonkeyError:
                if strict:
                    raise
        return out

    return check


def _env_name(value: Any, where: str) -> str:
    if not isinstance(value, str) or not ENV_NAME.fullmatch(value) or len(value) > 200:
        raise _fail(where, f"{str(value)[:80]!r} is not a variable name")
    return value


def _env_value(value: Any, where: str) -> str:
    if not isinstance(value, str) or "\0" in value or len(value) > MAX_VALUE:
        raise _fail(where, f"must be text without NUL of at most {MAX_VALUE:,} characters")
    return value


def _options(strict: bool) -> Check:
    """A check of a provider's machine options (or, not STRICT, the good ones)."""

    def check(value: Any, where: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise _fail(where, f"must be a mapping, not {type(value).__name__}")
        out = {}
        for key, option in value.items():
            try:
                if key not in MACHINE_OPTIONS:
                    known = ", ".join(MACHINE_OPTIONS)
                    raise _fail(f"{where}.{str(key)[:80]}", f"unknown option; known: {known}")
                out[key] = _typed(*MACHINE_OPTIONS[key])(option, f"{where}.{key}")
            except MonkeyError:
                if strict:
                    raise
        return out

    return check


def _fields(strict: bool) -> dict[str, tuple[Check, Any]]:
    """The spec's fields: key -> (check, value when absent or malformed)."""
    folder = _record({"name": check_folder_name, "path": check_relpath}, strict=strict)
    data = _record(
        {
            "name": check_folder_name,
            "path": check_relpath,
            "type": _choice(DATA_TYPES),
            "compression": _choice(COMPRESSIONS),
            "digest": check_digest,
            "single": _typed(bool),
            "size": _count,
            "stored": _count,
        },
        optional=("digest", "single", "size", "stored") if not strict else (),
        strict=strict,
    )
    text = _optional(check_text)
    path = _optional(check_relpath)
    return {
        "file": (check_text, ""),
        "name": (text, None),
        "env_type": (_choice(ENV_TYPES), "none"),
        "env_file": (path, None),
        "env": (_mapping(_env_name, _env_value, MAX_ITEMS, strict), {}),
        "install_script": (path, None),
        "code": (
            _record(
                {
                    "path": lambda v, where: check_relpath(v, where, dot=True),
                    "ignore": _listing(check_text, MAX_ITEMS, strict),
                },
                strict=strict,
            ),
            {"path": ".", "ignore": []},
        ),
        "persist": (_listing(folder, MAX_FOLDERS, strict), []),
        "data": (_listing(data, MAX_FOLDERS, strict), []),
        "providers": (
            _mapping(lambda k, w: check_text(k, w, 200), _options(strict), MAX_ITEMS, strict),
            {},
        ),
        "provider_options": (_options(strict), {}),
        "env_file_digest": (_optional(check_digest), None),
        "install_script_digest": (_optional(check_digest), None),
    }


_OPTIONAL = ("env_file_digest", "install_script_digest")
_STRICT = _fields(True)
_TOLERANT = _fields(False)


def check_spec(spec: Any, where: str = "spec") -> dict[str, Any] | None:
    """SPEC as a client sent it (None: no job.yml), checked field by field; MonkeyError
    naming the first wrong field, e.g. ``spec.persist[0].name: '/abs' must be ...``."""
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise _fail(where, f"must be a mapping, not {type(spec).__name__}")
    unknown = sorted(_key(k) for k in spec if k not in _STRICT)
    if unknown:
        raise _fail(f"{where}.{unknown[0]}", "unknown key")
    out: dict[str, Any] = {}
    for key, (check, _) in _STRICT.items():
        if key in spec:
            out[key] = check(spec[key], f"{where}.{key}")
        elif key not in _OPTIONAL:
            raise _fail(f"{where}.{key}", "is missing")
    for key in ("persist", "data"):  # as job.yml: each name once among its kind
        names = [f["name"] for f in out[key]]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise _fail(f"{where}.{key}", f"the name {twice[0]!r} is used twice")
    return out


def stored_spec(raw: Any) -> dict[str, Any] | None:
    """A spec as read back from the store, whatever the row holds: None unless a mapping;
    else every field monkey reads, each of its shape (what is malformed is left out, down to
    single entries), so that no reader fails on it."""
    if not isinstance(raw, dict):
        return None
    out: dict[str, Any] = {}
    for key, (check, default) in _TOLERANT.items():
        try:
            out[key] = check(raw[key], key) if key in raw else default
        except MonkeyError:
            out[key] = default
        if out[key] is None and key in _OPTIONAL:
            del out[key]
    return out


def _flag(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise _fail(where, "must be true or false")
    return value


def _dataset_name(value: Any, where: str) -> str:
    if not isinstance(value, str) or not DATASET_NAME.fullmatch(value):
        raise _fail(where, f"{str(value)[:80]!r} is not a dataset name (letters, digits, _)")
    return value


DATASET_NAME = later_pattern(r"[A-Za-z0-9_]{1,200}")
MAX_DATASETS = 100  # --dataset of one submission
# A submission's --dataset entries and git state, as ``Submitter.gather`` records them.
check_datasets = _listing(
    _record(
        {
            "name": _dataset_name,
            "digest": check_digest,
            "single": _flag,
            "size": _count,
            "source": check_text,
        }
    ),
    MAX_DATASETS,
)
check_git = _record(
    {
        "commit": _optional(lambda v, where: check_text(v, where, 64)),
        "branch": _optional(check_text),
        "dirty": _flag,
        "diff": _optional(check_digest),
        "root": check_text,
        "untracked": _listing(check_text, 100),
        "subdir": check_relpath,
    },
    optional=("subdir",),
)


def persisted_names(spec: dict[str, Any] | None) -> list[tuple[str, str]]:
    """The (path in the job, saved folder's name) of each persisted folder of SPEC."""
    return [(p["path"], p["name"]) for p in (spec or {}).get("persist", [])]
