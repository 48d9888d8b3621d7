"""The API's one contract (monkey.contract): both facades implement it, the server's routes
and its OpenAPI document come from it, and every argument is checked at the door: a wrong,
missing or extra one is a 400 naming it, never a 500 (issue 41, finding 7)."""

from __future__ import annotations

import inspect
import json

import pytest
from mainnode import MainNode, node  # noqa: F401 - node: a fixture
from test_server import raw

from monkey.api import Monkey
from monkey.contract import Access, Api, Crossing, ServerApi, methods
from monkey.remote.facade import RemoteMonkey

pytestmark = pytest.mark.system


def test_every_method_is_declared_once_and_implemented_by_both_facades():
    from monkey.server.calls import SERVED

    rules = methods()
    assert {n for n, r in rules.items() if r.served} == set(SERVED)
    for name in rules:
        assert callable(getattr(RemoteMonkey, name, None)), name
        if name in vars(Api):
            assert callable(getattr(Monkey, name, None)) or name in SERVED, name
    assert not hasattr(RemoteMonkey, "__getattr__")  # no method appears from a string
    assert rules["cancel"].access is Access.JOB and rules["rm"].access is Access.JOBS
    assert rules["run"].crossing is Crossing.GATHERED and rules["gc"].access is Access.ADMIN
    assert rules["start_core"].crossing is Crossing.LOCAL and "whoami" in vars(ServerApi)
    # the shell's remote routing names contract methods only, and the contract decides
    from monkey.shell.routing import USES

    assert {m for uses in USES.values() for m in uses} <= set(rules)


def call(node: MainNode, token: str, method: str, body: bytes) -> tuple[int, str]:
    status, _, answer = raw(node, "POST", f"/api/v1/call/{method}", token, body)
    return status, json.loads(answer).get("error", "") if status != 200 else ""


def test_malformed_arguments_are_a_400_that_names_them(node):
    ana = node.add_user("ana")
    cases = [
        ("info", {"args": [], "kwargs": {"ref": 5}}, "Expected `str`, got `int` - at `$.ref`"),
        ("info", {"args": [], "kwargs": {}}, "missing required field `ref`"),
        ("logs_of", {"args": ["x"]}, "not available through the API"),
        ("info", {"args": ["last"], "kwargs": {"tail": 3}}, "unknown field `tail`"),
        ("info", {"args": [{"__monkey__": "Job"}]}, "got `object` - at `$.ref`"),
        ("info", {"args": [None]}, "got `null` - at `$.ref`"),
        ("search", {"args": ["x", 10**30]}, "beyond 64 bits"),
        ("search", {"args": ["x\x00y"]}, "NUL"),
        ("job_listing", {"args": [["bogus"]]}, "unknown state in ['bogus']"),
        ("rm", {"args": ["26-01-01-001"]}, "Expected `array`, got `str` - at `$.refs`"),
        ("cancel", {"args": ["a", "b"]}, "takes 1 positional arguments, 2 given"),
    ]
    for method, body, error in cases:
        status, text = call(node, ana, method, json.dumps(body).encode())
        assert status in (400, 404) and error in text, (method, body, status, text)
    for body in (
        b'{"args": [' + b"[" * 5000 + b"]" * 5000 + b"]}",
        b'{"args": ["\\ud800"]}',
        b'{"args": [NaN]}',
        b'{"args": "last"}',
    ):
        status, text = call(node, ana, "info", body)
        assert status == 400 and text.startswith("info: "), (body[:40], status, text)
    assert call(node, ana, "whoami", b"{}") == (200, "")  # still up


def test_the_openapi_document_lists_every_call_with_its_parameters(node):
    status, _, _ = raw(node, "GET", "/api/v1/openapi.json")
    assert status == 401  # authenticated like the rest
    ana = node.add_user("ana")
    status, headers, body = raw(node, "GET", "/api/v1/openapi.json", ana)
    assert status == 200 and headers["content-type"].startswith("application/json")
    doc = json.loads(body)
    assert doc["openapi"].startswith("3.")
    called = {n for n, r in methods().items() if r.called}
    assert {p.rsplit("/", 1)[1] for p in doc["paths"]} == called
    schemas = doc["components"]["schemas"]
    for name in called:
        post = doc["paths"][f"/api/v1/call/{name}"]["post"]
        ref = post["requestBody"]["content"]["application/json"]["schema"]["properties"]["kwargs"]
        schema = schemas[ref["$ref"].rsplit("/", 1)[1]]
        declared = ServerApi if methods()[name].crossing is not Crossing.GATHERED else None
        if declared is not None:
            params = list(inspect.signature(getattr(declared, name)).parameters)[1:]
            assert list(schema.get("properties", {})) == params, name
        assert schema["additionalProperties"] is False
    assert schemas["Info"]["required"] == ["ref"]
    assert schemas["Run"]["properties"]["gathered"]["type"] == "object"


def test_each_calls_result_is_the_shape_its_openapi_document_says(node, tmp_path):
    """A client in another language reads the results by the document alone: the whole
    document is valid OpenAPI 3.1, and real answers validate against each call's result."""
    import jsonschema
    from openapi_spec_validator import validate

    ana = node.add_user("ana")
    doc = json.loads(raw(node, "GET", "/api/v1/openapi.json", ana)[2])
    validate(doc)
    node.add_remote(ana)
    done = node.laptop("--remote", "lab", "run", "--", "sleep", "60")
    assert done.returncode == 0, done.stderr
    juid = done.stdout.strip()
    for method, args in (
        ("info", [juid]),
        ("jobs", []),
        ("get_job", [juid]),
        ("job_owners", [[juid]]),
        ("whoami", []),
        ("job_listing", []),
        ("cancel", [juid]),
        ("live_attempts", []),
    ):
        status, _, body = raw(
            node, "POST", f"/api/v1/call/{method}", ana, json.dumps({"args": args}).encode()
        )
        assert status == 200, (method, body)
        answer = doc["paths"][f"/api/v1/call/{method}"]["post"]["responses"]["200"]
        schema = {**answer["content"]["application/json"]["schema"], **doc}
        jsonschema.validate(json.loads(body), schema, cls=jsonschema.Draft202012Validator)
    records = doc["components"]["schemas"]
    assert records["Job"]["properties"]["state"] == {"$ref": "#/components/schemas/State"}
    assert "running" in records["State"]["properties"]["value"]["enum"]
    run = doc["paths"]["/api/v1/call/run"]["post"]["responses"]
    assert run["200"]["content"]["application/json"]["schema"]["type"] == "string"
    assert "409" in run  # blobs to upload first
    bad = {**json.loads(raw(node, "POST", "/api/v1/call/info", ana, b'{"args": [1]}')[2])}
    jsonschema.validate(bad, run["400"]["content"]["application/json"]["schema"])


def test_a_static_file_name_with_nul_is_a_404_not_a_500(node):
    for path in ("/web/static/x%00", "/web/static/%00/../web.css", "/web/static/../app.py"):
        status, _, body = raw(node, "GET", path)
        assert status == 404, (path, status, body[:200])
    status, _, _ = raw(node, "GET", "/web/static/web.css")
    assert status == 200
