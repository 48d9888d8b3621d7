"""`job.yml`: a project's job description (environment, persisted and data folders,
per-provider machine options), loaded with line numbers so every error names its place.

The format is the original Monkey one::

    name: mnist
    image: pytorch/pytorch:2.4.0-cuda12.1-cudnn9-runtime   # optional: run in this OCI image
    run:
      env_type: pip            # pip | conda | none
      env_file: requirements.txt
      env:
        - TEST_ENV: "HELLO"    # or a mapping {TEST_ENV: HELLO}
      install_script: setup.sh
    code:
      path: "."
      ignore: ["data**", "output**", "venv**"]
    persist:
      - name: output
        path: output
    data:
      - name: mnist-data
        type: copy             # copy | mount
        path: data
        compression: gztar     # gztar | zip | none
    providers:
      - name: gcp
        machine_type: n1-standard-2
        preemptible: true

Every path is relative to the code folder (``code.path``, itself relative to the folder
holding job.yml) and may not leave it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from monkey.config import compose_yaml, read_config
from monkey.models import REDACTED, MonkeyError, Record, later_pattern
from monkey.specrecord import (
    COMPRESSIONS,
    DATA_TYPES,
    ENV_TYPES,
    MACHINE_OPTIONS,
    check_folder_name,
    check_relpath,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

FILENAME = "job.yml"
_ENV_NAME = later_pattern(r"[A-Za-z_][A-Za-z0-9_]*")
_PROPERTIES = later_pattern(r"(?:[&!]\S*\s+)*")  # a YAML node's anchor and tag
_TYPE_NAMES = {
    str: "a string",
    int: "a whole number",
    bool: "true or false",
    float: "a number",
    list: "a list",
    dict: "a mapping",
}


class Folder(Record):
    """A persisted or data folder: ``path`` is relative to the code folder."""

    __slots__ = ("name", "path", "type", "compression")

    def __init__(self, name: str, path: str, type: str = "copy", compression: str = "none") -> None:
        self.name = name
        self.path = path
        self.type = type  # data folders only: copy | mount
        self.compression = compression  # data folders only; accepted for the original format


class JobSpec(Record):
    """A validated job.yml."""

    __slots__ = (
        "file",
        "name",
        "image",
        "env_type",
        "env_file",
        "env",
        "install_script",
        "code_path",
        "ignore",
        "persist",
        "data",
        "providers",
        "text",
        "env_spans",
    )

    def __init__(self, file: Path, text: str = "") -> None:
        self.file = file
        self.name: str | None = None
        self.image: str | None = None  # an OCI reference, pinned at submission
        self.env_type = "none"
        self.env_file: str | None = None
        self.env: dict[str, str] = {}
        self.install_script: str | None = None
        self.code_path = "."
        self.ignore: list[str] = []
        self.persist: list[Folder] = []
        self.data: list[Folder] = []
        self.providers: dict[str, dict[str, Any]] = {}
        self.text = text  # the file as read
        self.env_spans: list[tuple[int, int]] = []  # env values in text

    def __repr__(self) -> str:  # never the env values, which may be secrets
        return f"JobSpec(file={self.file!r}, name={self.name!r})"

    @property
    def code_root(self) -> Path:
        return (self.file.parent / self.code_path).resolve()

    def snapshot_ignore(self) -> list[str]:
        """Ignore patterns for the code snapshot: code.ignore plus the persisted and data
        folders, which reach the job by their own way."""
        folders = (*self.persist, *self.data)
        return [*self.ignore, *("/" + re.sub(r"([*?\[\]\\!# ])", r"\\\1", f.path) for f in folders)]

    def redacted(self) -> bytes:
        """The file with every env value replaced by ``"<redacted>"``: the copy stored with
        the code (the values reach the job through the job's env and the secrets store)."""
        text = self.text
        for start, end in sorted(set(self.env_spans), reverse=True):  # an alias repeats one
            value = text[start:end]
            properties = _PROPERTIES.match(value)
            assert properties is not None  # the pattern matches the empty string too
            anchor = properties.group()  # keep `&name !tag`: aliases need them
            kept = value[len(value.rstrip()) :]  # a block scalar's span ends with line breaks
            text = f'{text[:start]}{anchor}"{REDACTED}"{kept}{text[end:]}'
        return text.encode()

    def to_json(self) -> dict[str, Any]:
        return {
            "file": str(self.file),
            "name": self.name,
            "env_type": self.env_type,
            "env_file": self.env_file,
            "env": dict(self.env),
            "install_script": self.install_script,
            "code": {"path": self.code_path, "ignore": list(self.ignore)},
            "persist": [{"name": f.name, "path": f.path} for f in self.persist],
            "data": [
                {"name": f.name, "path": f.path, "type": f.type, "compression": f.compression}
                for f in self.data
            ],
            "providers": {k: dict(v) for k, v in self.providers.items()},
        }


class _Node:
    """A YAML node with its value constructed and its line remembered."""

    def __init__(self, file: Path, node: Any, constructor: Any) -> None:
        self.file = file
        self.node = node
        self.line = node.start_mark.line + 1
        self.c = constructor

    def fail(self, key: str, problem: str) -> MonkeyError:
        return MonkeyError(f"{self.file}:{self.line}: {key}: {problem}")

    def kind(self) -> type:
        import yaml

        if isinstance(self.node, yaml.MappingNode):
            return dict
        if isinstance(self.node, yaml.SequenceNode):
            return list
        value = self.c.construct_object(self.node, deep=True)
        return type(value) if value is not None else type(None)

    def value(self, key: str, *types: type) -> Any:
        """The scalar value, checked against TYPES."""
        kind = self.kind()
        if kind in (dict, list) or not any(kind is t for t in types):
            if kind is int and float in types:
                return self.c.construct_object(self.node, deep=True)
            wanted = " or ".join(_TYPE_NAMES[t] for t in types)
            got = "nothing" if kind is type(None) else _TYPE_NAMES.get(kind, kind.__name__)
            raise self.fail(key, f"must be {wanted}, not {got}")
        return self.c.construct_object(self.node, deep=True)

    def mapping(self, key: str, allowed: tuple[str, ...] | None) -> dict[str, _Node]:
        """Children of a mapping; unknown keys are refused when ALLOWED is given."""
        if self.kind() is not dict:
            raise self.fail(key, "must be a mapping of `name: value` lines")
        out: dict[str, _Node] = {}
        for k, v in self.node.value:
            name = _Node(self.file, k, self.c).value(key, str, int, bool)
            name = str(name)
            here = f"{key}.{name}" if key else name
            if allowed is not None and name not in allowed:
                raise _Node(self.file, k, self.c).fail(
                    here, f"unknown key; allowed here: {', '.join(allowed)}"
                )
            if name in out:
                raise _Node(self.file, k, self.c).fail(here, "given twice")
            out[name] = _Node(self.file, v, self.c)
        return out

    def items(self, key: str) -> list[_Node]:
        if self.kind() is not list:
            raise self.fail(key, "must be a list (lines starting with `- `)")
        return [_Node(self.file, n, self.c) for n in self.node.value]


def find(folder: str | os.PathLike[str]) -> Path | None:
    """FOLDER/job.yml when there is one (whatever it is: `load` refuses all but files)."""
    path = os.path.join(folder, FILENAME)
    return Path(path) if os.path.lexists(path) else None


def load(path: str | os.PathLike[str]) -> JobSpec:
    """Read and validate a job.yml; MonkeyError names the file, line, key and the fix."""
    file = Path(path).expanduser().resolve()
    text = read_config(file)
    root, loader = compose_yaml(file, text)
    spec = JobSpec(file=file, text=text)
    if root is None:
        return spec
    top = _Node(file, root, loader).mapping(
        "", ("name", "image", "run", "code", "persist", "data", "providers")
    )
    if "name" in top:
        spec.name = str(top["name"].value("name", str, int))
    if "image" in top:
        from monkey.images import parse

        spec.image = top["image"].value("image", str)
        try:
            parse(spec.image)
        except MonkeyError as exc:
            raise top["image"].fail("image", str(exc)) from None
    if "code" in top:
        code = top["code"].mapping("code", ("path", "ignore"))
        if "path" in code:
            spec.code_path = _relpath(code["path"], "code.path", file.parent, allow_dot=True)
        if "ignore" in code:
            node = code["ignore"]
            items = [node] if node.kind() is str else node.items("code.ignore")
            spec.ignore = [n.value("code.ignore", str) for n in items]
    base = spec.code_root
    if not base.is_dir():
        raise top["code"].fail("code.path", f"{base} is not a folder; point it at your code")
    if "run" in top:
        _load_run(spec, top["run"], base)
    for key in ("persist", "data"):
        if key in top:
            _load_folders(spec, top[key], key, base)
    if "providers" in top:
        _load_providers(spec, top["providers"])
    return spec


def _load_run(spec: JobSpec, node: _Node, base: Path) -> None:
    run = node.mapping("run", ("env_type", "env_file", "env", "install_script"))
    if "env_type" in run:
        value = run["env_type"].value("run.env_type", str)
        if value not in ENV_TYPES:
            raise run["env_type"].fail(
                "run.env_type", f"{value!r} is not allowed; use one of {', '.join(ENV_TYPES)}"
            )
        spec.env_type = value
    for key in ("env_file", "install_script"):
        if key not in run:
            continue
        rel = _relpath(run[key], f"run.{key}", base)
        if not (base / rel).is_file():
            raise run[key].fail(
                f"run.{key}",
                f"{base / rel} does not exist; create it or fix "
                "the path (relative to the code folder)",
            )
        setattr(spec, key, rel)
    if spec.env_type != "none" and spec.env_file is None:
        default = "requirements.txt" if spec.env_type == "pip" else "environment.yml"
        raise node.fail(
            "run.env_file", f"env_type {spec.env_type} needs an env_file, e.g. env_file: {default}"
        )
    if spec.env_type == "none" and spec.env_file is not None:
        raise run["env_file"].fail(
            "run.env_file", "is only used with env_type pip or conda; set run.env_type"
        )
    if "env" in run:
        env = run["env"]
        pairs: list[tuple[str, _Node]] = []
        if env.kind() is list:
            for item in env.items("run.env"):
                pairs += [(k, v) for k, v in item.mapping("run.env", None).items()]
        else:
            pairs = list(env.mapping("run.env", None).items())
        for name, value in pairs:
            if not _ENV_NAME.fullmatch(name):
                raise value.fail(f"run.env.{name}", "is not a valid variable name")
            if name in spec.env:
                raise value.fail(f"run.env.{name}", "is given twice; give each variable once")
            scalar = value.value(f"run.env.{name}", str, int, float, bool)
            spec.env[name] = str(scalar).lower() if isinstance(scalar, bool) else str(scalar)
            spec.env_spans.append((value.node.start_mark.index, value.node.end_mark.index))


def _load_folders(spec: JobSpec, node: _Node, key: str, base: Path) -> None:
    allowed = ("name", "path") if key == "persist" else ("name", "path", "type", "compression")
    folders: list[Folder] = getattr(spec, key)
    for i, item in enumerate(node.items(key)):
        here = f"{key}[{i}]"
        if item.kind() is str:
            fields = {"path": item}
        else:
            fields = item.mapping(here, allowed)
        if "path" not in fields:
            raise item.fail(f"{here}.path", "is missing; give the folder's path, e.g. path: output")
        path = _relpath(fields["path"], f"{here}.path", base)
        name = fields["name"].value(f"{here}.name", str) if "name" in fields else Path(path).name
        try:
            check_folder_name(name, f"{here}.name")
        except MonkeyError as exc:
            problem = str(exc).split(": ", 1)[1]
            raise (fields.get("name") or item).fail(f"{here}.name", problem) from None
        folder = Folder(name=name, path=path)
        if "type" in fields:
            folder.type = fields["type"].value(f"{here}.type", str)
            if folder.type not in DATA_TYPES:
                raise fields["type"].fail(
                    f"{here}.type",
                    f"{folder.type!r} is not allowed; use one of {', '.join(DATA_TYPES)}",
                )
        if "compression" in fields:
            value = fields["compression"].value(f"{here}.compression", str, type(None))
            folder.compression = value or "none"
            if folder.compression not in COMPRESSIONS:
                raise fields["compression"].fail(
                    f"{here}.compression",
                    f"{value!r} is not allowed; use one of {', '.join(COMPRESSIONS)}",
                )
        if key == "data" and not (base / path).is_dir():
            problem = "is not a folder" if (base / path).exists() else "does not exist"
            raise fields["path"].fail(
                f"{here}.path",
                f"{base / path} {problem}; data entries "
                "are folders (ship single files with --dataset)",
            )
        if any(other.name == name for other in folders):
            raise item.fail(f"{here}.name", f"{name!r} is used twice; give each its own name")
        for other in (*spec.persist, *spec.data):
            a, b = other.path + "/", path + "/"
            if a.startswith(b) or b.startswith(a):
                raise fields["path"].fail(
                    f"{here}.path", f"{path!r} overlaps {other.path!r}; use separate folders"
                )
        folders.append(folder)


def _load_providers(spec: JobSpec, node: _Node) -> None:
    entries: list[tuple[str, _Node, dict[str, _Node]]] = []
    if node.kind() is list:
        for i, item in enumerate(node.items("providers")):
            fields = item.mapping(f"providers[{i}]", ("name", *MACHINE_OPTIONS))
            if "name" not in fields:
                raise item.fail(
                    f"providers[{i}].name",
                    "is missing; name the provider of providers.yml these options are for",
                )
            name = fields.pop("name").value(f"providers[{i}].name", str)
            entries.append((name, item, fields))
    else:
        for name, item in node.mapping("providers", None).items():
            entries.append((name, item, item.mapping(f"providers.{name}", tuple(MACHINE_OPTIONS))))
    for name, item, fields in entries:
        if name in spec.providers:
            raise item.fail(f"providers.{name}", "given twice; merge the entries")
        options = {}
        for key, value in fields.items():
            options[key] = value.value(f"providers.{name}.{key}", *MACHINE_OPTIONS[key])
        spec.providers[name] = options


def _relpath(node: _Node, key: str, base: Path, allow_dot: bool = False) -> str:
    """A relative path inside BASE, normalised; absolute or escaping paths are refused."""
    raw = node.value(key, str)
    if not raw or raw.startswith(("/", "~")) or "\0" in raw:
        raise node.fail(key, f"{raw!r} must be a relative path inside the project")
    norm = os.path.normpath(raw).replace(os.sep, "/")
    resolved = (base / norm).resolve()
    if norm == ".." or norm.startswith("../") or not resolved.is_relative_to(base.resolve()):
        raise node.fail(key, f"{raw!r} is outside the project ({base}); use a path inside it")
    if norm == "." and not allow_dot:
        raise node.fail(key, f"{raw!r} is the whole project; name a folder or file inside it")
    try:
        return check_relpath(norm, key, dot=True)  # what a main node accepts (its alphabet)
    except MonkeyError as exc:
        raise node.fail(key, str(exc).split(": ", 1)[1]) from None


# -- monkey init ----------------------------------------------------------------------


def detect_env(folder: Path) -> tuple[str, str | None]:
    """(env_type, env_file) guessed from the files of FOLDER."""
    for name, kind in (
        ("requirements.txt", "pip"),
        ("environment.yml", "conda"),
        ("environment.yaml", "conda"),
    ):
        if (folder / name).is_file():
            return kind, name
    return "none", None


def render(
    name: str,
    env_type: str,
    env_file: str | None,
    install_script: str | None,
    persist: list[str],
    data: list[str],
) -> str:
    """A commented job.yml in the original Monkey format."""
    import json

    def q(text: str) -> str:
        return json.dumps(text)  # a JSON string is a valid YAML scalar

    lines = [
        "# monkey job description; `monkey run CMD` reads it from this folder.",
        "# Command-line options override it. Paths are relative to code.path.",
        f"name: {q(name)}",
        "run:",
        f"  env_type: {env_type}            # pip | conda | none: prepared once per worker",
    ]
    if env_file:
        lines.append(f"  env_file: {q(env_file)}")
    lines.append('  env: []                    # variables for the job, e.g. [{SEED: "1"}]')
    if install_script:
        lines.append(f"  install_script: {q(install_script)}  # runs once per worker")
    else:
        lines.append("  # install_script: setup.sh  # runs once per worker, inside the environment")
    ignore = ["venv**", ".venv**", *(f"{p}**" for p in (*persist, *data))]
    lines += [
        "code:",
        '  path: "."',
        f"  ignore: [{', '.join(q(i) for i in ignore)}]",
        "# folders kept across attempts and laid over the code when a job starts again",
    ]
    lines.append("persist:" + ("" if persist else " []"))
    for p in persist:
        lines += [f"  - name: {q(Path(p).name)}", f"    path: {q(p)}"]
    lines.append(
        "# folders checksummed and stored once, placed at their path before the job starts"
    )
    lines.append("data:" + ("" if data else " []"))
    for d in data:
        lines += [
            f"  - name: {q(Path(d).name)}",
            "    type: copy               # copy | mount",
            f"    path: {q(d)}",
        ]
    lines += [
        "# machine options per provider of providers.yml, e.g.",
        "# - name: gcp",
        "#   machine_type: n1-standard-2",
        "#   preemptible: true",
        "providers: []",
        "",
    ]
    return "\n".join(lines)


# -- submit ---------------------------------------------------------------------------


def resolve(
    spec: JobSpec, files: list[Any], blobs: Any, store: Any, provider: str, accepted: frozenset[str]
) -> tuple[dict[str, Any], list[tuple[str, int]]]:
    """The spec as recorded on a job: env file and install script digests from the code
    snapshot FILES, data folders checksummed and stored, this provider's machine options.
    Returns (record, new blobs)."""
    from monkey.models import is_secret
    from monkey.snapshot.datasets import dataset

    record = spec.to_json()
    record["env"] = {k: REDACTED if is_secret(k, v) else v for k, v in spec.env.items()}
    digests = {f.path: f.digest for f in files}
    for key in ("env_file", "install_script"):
        rel = getattr(spec, key)
        if rel is None:
            continue
        if rel not in digests:
            raise MonkeyError(
                f"{spec.file}: run.{key} {rel} is left out of the code snapshot "
                "by an ignore rule; remove that rule or move the file"
            )
        record[f"{key}_digest"] = digests[rel]
    new_blobs: list[tuple[str, int]] = []
    for entry, folder in zip(record["data"], spec.data):
        ds = dataset(f"{spec.code_root / folder.path}:DATA", blobs, store)
        new_blobs += ds.new_blobs
        entry.update(
            digest=ds.digest,
            single=ds.single,
            size=ds.size,
            stored=sum(size for _, size in ds.new_blobs),
        )
    options = spec.providers.get(provider, {})
    ignored = sorted(set(options) - accepted)
    if ignored:
        import logging

        logging.getLogger("monkey").warning(
            "monkey: provider %r ignores %s from %s (the options it takes: %s)",
            provider,
            ", ".join(ignored),
            spec.file,
            ", ".join(sorted(accepted)) or "none",
        )
    record["provider_options"] = options
    return record, new_blobs
