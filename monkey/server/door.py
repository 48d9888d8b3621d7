"""Validation at the door: a call's arguments checked against the contract's declaration of
its method (monkey.contract) before the facade sees them. A wrong, missing or extra
argument is a BadCall (400) naming it (msgspec's path, like ``$.tail``); so are bodies
nested too deeply, strings holding NUL, and integers beyond 64 bits. Tagged objects
(``{"__monkey__": ...}``) are never decoded here: no argument's declared type is one."""

from __future__ import annotations

import functools
import inspect
from typing import Any

import msgspec

from monkey import contract
from monkey.models import MonkeyError

MAX_DEPTH = 32  # nesting of a call's arguments
_INT = 1 << 63  # integers stay within 64 bits, as SQLite's
_decoder = msgspec.json.Decoder()


class BadCall(MonkeyError):
    """A call whose arguments do not fit its method's declaration (400)."""


class Form:
    """What one method takes: its positional names and a Struct of its parameters (those
    with a default may be left out: UNSET)."""

    def __init__(self, name: str) -> None:
        fn = contract.signature_of(name)
        params = list(inspect.signature(fn).parameters.values())[1:]
        names = _namespace()
        fields: list[Any] = []
        for p in params:
            kind = eval(p.annotation, names)  # the contract's own annotations, nothing else
            if p.default is p.empty:
                fields.append((p.name, kind))
            else:
                fields.append((p.name, kind | msgspec.UnsetType, msgspec.UNSET))
        self.positional = [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
        title = "".join(w.title() for w in name.split("_"))
        self.struct = msgspec.defstruct(
            title, fields, kw_only=True, forbid_unknown_fields=True, module=__name__
        )


@functools.cache
def _namespace() -> dict[str, Any]:
    """What the contract's parameter annotations name."""
    import collections.abc

    return {
        "Any": Any,
        "Sequence": collections.abc.Sequence,
        "Collection": collections.abc.Collection,
    }


@functools.cache
def form(name: str) -> Form:
    """The Form of contract method NAME (built once)."""
    return Form(name)


def arguments(method: str, body: bytes) -> dict[str, Any]:
    """The keyword arguments of METHOD that BODY (``{"args": [...], "kwargs": {...}}``)
    gives, checked against the contract; BadCall naming what is wrong."""
    try:
        raw = _decoder.decode(body or b"{}")
    except RecursionError:
        raise BadCall(f"{method}: arguments nested too deeply (at most {MAX_DEPTH})") from None
    except msgspec.DecodeError as exc:
        raise BadCall(f"{method}: the body is no JSON ({exc})") from None
    if not isinstance(raw, dict) or raw.keys() - {"args", "kwargs"}:
        raise BadCall(f'{method}: the body is {{"args": [...], "kwargs": {{...}}}}, no more')
    _check(method, raw, 0)
    args, kwargs = raw.get("args", []), raw.get("kwargs", {})
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise BadCall(f"{method}: args is a list and kwargs an object")
    return check(method, args, kwargs)


def check(method: str, args: list[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """METHOD's keyword arguments from ARGS and KWARGS, checked against the contract (the
    arguments the server's own pages pass go through the same door); BadCall when wrong."""
    f = form(method)
    if len(args) > len(f.positional):
        raise BadCall(
            f"{method}: takes {len(f.positional)} positional arguments, {len(args)} given"
        )
    given = dict(zip(f.positional, args))
    twice = sorted(given.keys() & kwargs.keys())
    if twice:
        raise BadCall(f"{method}: {twice[0]} given twice")
    try:
        value = msgspec.convert({**given, **kwargs}, f.struct)
    except msgspec.ValidationError as exc:
        raise BadCall(f"{method}: {exc}") from None
    return {
        k: v for k in f.struct.__struct_fields__ if (v := getattr(value, k)) is not msgspec.UNSET
    }


def _check(method: str, value: Any, depth: int) -> None:
    """BadCall when VALUE nests deeper than MAX_DEPTH, or holds a string with NUL or an
    integer beyond 64 bits."""
    if depth > MAX_DEPTH:
        raise BadCall(f"{method}: arguments nested too deeply (at most {MAX_DEPTH})")
    if isinstance(value, str):
        if "\x00" in value:
            raise BadCall(f"{method}: a string holds NUL (\\u0000)")
    elif isinstance(value, bool):
        pass
    elif isinstance(value, int):
        if not -_INT <= value < _INT:
            raise BadCall(f"{method}: the integer {str(value)[:20]}... is beyond 64 bits")
    elif isinstance(value, dict):
        for k, v in value.items():
            _check(method, k, depth + 1)
            _check(method, v, depth + 1)
    elif isinstance(value, list):
        for v in value:
            _check(method, v, depth + 1)


class FollowStart(msgspec.Struct, forbid_unknown_fields=True):
    """Where a resumed follow starts (``POST /api/v1/logs/REF?follow=1``): each file's
    offset, and the attempts whose mark was already shown."""

    offsets: dict[str, int] = {}
    marked: list[int] = []


def follow_start(body: bytes) -> dict[str, Any] | None:
    """The start BODY gives (None: none), checked; BadCall naming what is wrong."""
    try:
        start = msgspec.json.decode(body or b"null", type=FollowStart | None)
    except RecursionError:
        raise BadCall("logs: the body is nested too deeply") from None
    except msgspec.DecodeError as exc:  # ValidationError is one
        raise BadCall(f"logs: {exc}") from None
    if start is None:
        return None
    _check("logs", start.offsets, 1)
    _check("logs", start.marked, 1)
    return {"offsets": start.offsets, "marked": start.marked}
