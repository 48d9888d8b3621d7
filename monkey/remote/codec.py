"""One codec for what the facade returns, both ways over the API: records (Job, Attempt,
Resources, Instance), states and enums become tagged JSON objects, and come back as the
same types on the client, so a command prints a remote result as it prints a local one."""

from __future__ import annotations

import enum
import json
import math
import os

from monkey import models

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

TAG = "__monkey__"
_RECORDS: dict[str, type[models.Record]] = {
    cls.__name__: cls for cls in (models.Job, models.Attempt, models.Resources, models.Instance)
}
# Each record's fields: one a newer server sends that this client does not know is dropped.
_FIELDS = {name: frozenset(cls.__slots__) for name, cls in _RECORDS.items()}
_ENUMS: dict[str, type[enum.Enum]] = {
    cls.__name__: cls for cls in (models.State, models.Request, models.Ending, models.InstanceState)
}


_PLAIN = frozenset((str, int, bool, type(None)))  # exact types: a str enum is not one


def encode(value: Any) -> Any:
    """VALUE as plain JSON data (tagged objects for records and enums)."""
    if type(value) in _PLAIN:
        return value
    if isinstance(value, enum.Enum) and type(value).__name__ in _ENUMS:
        return {TAG: type(value).__name__, "value": value.value}
    if isinstance(value, models.Record) and type(value).__name__ in _RECORDS:
        return {
            TAG: type(value).__name__,
            **{n: encode(getattr(value, n)) for n in value.__slots__},
        }
    if isinstance(value, dict):
        return {str(k): encode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [encode(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return {TAG: "float", "value": repr(value)}
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return value


def _decoded(value: dict[str, Any]) -> Any:
    """A JSON object (its members decoded first) as the record, enum or float ``encode``
    made it from, when tagged."""
    tag = value.pop(TAG, None)
    if tag is None:
        return value
    if tag == "float":
        return float(value["value"])
    if tag in _ENUMS:
        return _ENUMS[tag](value["value"])
    if tag in _RECORDS:
        if tag == "Job":  # a Job's resources and state are typed; the rest is plain data
            value["resources"] = value["resources"] or models.Resources()
        if value.keys() - _FIELDS[tag]:
            value = {k: v for k, v in value.items() if k in _FIELDS[tag]}
        return _RECORDS[tag](**value)
    raise ValueError(f"unknown type {tag!r} in a server's answer")


def dumps(value: Any) -> bytes:
    """VALUE as JSON (see ``encode``)."""
    return json.dumps(encode(value), separators=(",", ":")).encode()


def loads(data: bytes) -> Any:
    """The value ``dumps`` made DATA from."""
    return json.loads(data, object_hook=_decoded)


def arguments(args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any]) -> bytes:
    """A call's body: its arguments as plain JSON (an enum as its value, a path as text,
    a set as a list), never a tagged object: the contract declares none among arguments."""

    def plain(value: Any) -> Any:
        if isinstance(value, enum.Enum):
            return value.value
        if isinstance(value, os.PathLike):
            return os.fspath(value)
        if isinstance(value, (set, frozenset)):
            return sorted(value, key=str)
        raise TypeError(f"{type(value).__name__} is not an argument the API takes")

    return json.dumps({"args": list(args), "kwargs": kwargs}, default=plain).encode()
