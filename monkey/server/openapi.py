"""The OpenAPI 3.1 document of the main node's calls, generated from the contract
(monkey.contract): each call's parameters (the door's own forms, monkey.server.door) and its
result as the server sends it (monkey.remote.codec), so that a lab can write a client in
another language.

A result's schema follows the method's declared return type: records (Job, Attempt,
Resources, Instance) and enums (State, ...) are tagged objects (``{"__monkey__": "Job",
...}``), a float that is not finite is ``{"__monkey__": "float", "value": "inf"}``, and a
submission (run, sweep, rerun...) answers the new job's or sweep's id."""

from __future__ import annotations

import enum
import inspect
import types
import typing
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from monkey import contract, models
from monkey.remote.codec import TAG
from monkey.server.door import form

_RECORDS = (models.Job, models.Attempt, models.Resources, models.Instance)
_ENUMS = (models.State, models.Request, models.Ending, models.InstanceState)
_NUMBER = {"anyOf": [{"type": "number"}, {"$ref": "#/components/schemas/Float"}]}


def _namespace() -> dict[str, Any]:
    """What the contract's and the records' annotations name."""
    return {
        **vars(typing),
        **{cls.__name__: cls for cls in (*_RECORDS, *_ENUMS)},
        "JobRecord": models.Job,
        "Path": Path,
        "Sequence": Sequence,
        "Collection": Collection,
        "Iterable": Iterable,
        "Mapping": Mapping,
    }


def schema_of(kind: Any) -> dict[str, Any]:
    """The JSON schema of a value of Python type KIND as the codec sends it."""
    if kind is Any or kind is object:
        return {}
    if kind is None or kind is type(None):
        return {"type": "null"}
    if isinstance(kind, type):
        if issubclass(kind, enum.Enum) or issubclass(kind, models.Record):
            return {"$ref": f"#/components/schemas/{kind.__name__}"}
        plain = {bool: "boolean", int: "integer", str: "string", Path: "string"}
        if kind in plain:
            return {"type": plain[kind]}
        if kind is float:
            return _NUMBER
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        return {"anyOf": [schema_of(a) for a in args]}
    if origin in (dict, Mapping):
        return {"type": "object", "additionalProperties": schema_of(args[1]) if args else {}}
    if origin is tuple:
        items = [schema_of(a) for a in args]
        return {"type": "array", "prefixItems": items, "minItems": len(items)}
    if origin in (list, set, frozenset, Sequence, Collection, Iterable):
        return {"type": "array", "items": schema_of(args[0]) if args else {}}
    raise TypeError(f"no JSON schema for {kind!r}")


def _record(cls: type[models.Record], names: dict[str, Any]) -> dict[str, Any]:
    """A record's tagged object: every field of its ``__slots__``, typed as its
    constructor declares it."""
    params = inspect.signature(cls.__init__).parameters
    properties: dict[str, Any] = {TAG: {"const": cls.__name__}}
    for slot in cls.__slots__:
        hint = params[slot].annotation if slot in params else "Any"
        properties[slot] = schema_of(eval(hint, names) if isinstance(hint, str) else hint)
    return {
        "type": "object",
        "description": (cls.__doc__ or "").strip().splitlines()[0],
        "properties": properties,
        "required": [TAG, *cls.__slots__],
    }


def _enum(cls: type[enum.Enum]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            TAG: {"const": cls.__name__},
            "value": {"enum": [m.value for m in cls]},
        },
        "required": [TAG, "value"],
    }


def result_schema(name: str) -> dict[str, Any]:
    """The schema of what ``POST /api/v1/call/NAME`` answers."""
    if contract.methods()[name].access is contract.Access.SUBMITS:
        return {"type": "string", "description": "the new job's (or sweep's) id"}
    hint = contract.signature_of(name).__annotations__.get("return", "Any")
    return schema_of(eval(hint, _namespace()) if isinstance(hint, str) else hint)


def _refusals(rule: contract.Rule) -> list[tuple[str, str]]:
    """The error answers of a call (``{"error": "..."}``): status and when."""
    out = [
        ("400", "an argument that does not fit, or what the call cannot do (no such job...)"),
        ("401", "no token, or a token refused"),
        ("403", f"the caller may not ({rule.access.value} may)"),
        ("413", "the body is larger than the server takes"),
        ("426", "the client speaks another API version (the X-Monkey-API header)"),
        ("429", "too many refused tokens from this address; wait"),
    ]
    if rule.crossing is contract.Crossing.GATHERED:
        out.append(("409", "blobs the call names are missing: upload them (`missing`), retry"))
    return out


def document() -> dict[str, Any]:
    """The OpenAPI 3.1 document of the calls."""
    from monkey import __version__

    called = {n: r for n, r in contract.methods().items() if r.called}
    structs = [form(n).struct for n in called]
    schemas, components = msgspec.json.schema_components(
        structs, ref_template="#/components/schemas/{name}"
    )
    names = _namespace()
    components.update({cls.__name__: _record(cls, names) for cls in _RECORDS})
    components.update({cls.__name__: _enum(cls) for cls in _ENUMS})
    components["Float"] = {
        "type": "object",
        "description": "a float that JSON cannot hold",
        "properties": {TAG: {"const": "float"}, "value": {"enum": ["inf", "-inf", "nan"]}},
        "required": [TAG, "value"],
    }
    error = {
        "type": "object",
        "properties": {"error": {"type": "string"}},
        "required": ["error"],
    }
    paths = {}
    for (name, rule), schema in zip(called.items(), schemas):
        paths[f"/api/v1/call/{name}"] = {
            "post": {
                "operationId": name,
                "summary": f"{name}: {rule.access.value}",
                "description": f"Who may call it: {rule.access.value}. How it crosses: "
                f"{rule.crossing.value}.",
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "properties": {
                                    "args": {
                                        "type": "array",
                                        "description": "positional: "
                                        + ", ".join(form(name).positional),
                                    },
                                    "kwargs": schema,
                                },
                                "additionalProperties": False,
                            }
                        }
                    },
                },
                "responses": {
                    "200": {
                        "description": "the result",
                        "content": {"application/json": {"schema": result_schema(name)}},
                    },
                    **{
                        code: {
                            "description": why,
                            "content": {"application/json": {"schema": error}},
                        }
                        for code, why in _refusals(rule)
                    },
                },
            }
        }
    return {
        "openapi": "3.1.0",
        "info": {"title": "monkey main node API", "version": __version__},
        "components": {
            "schemas": components,
            "securitySchemes": {"token": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"token": []}],
        "paths": paths,
    }
