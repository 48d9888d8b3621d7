"""Every method of the contract (monkey.contract), called by a plain user of ONE real main
node with random and hostile bodies: deep nesting, tagged objects, lone surrogates, NUL,
huge numbers, NaN, wrong types, missing and extra fields, null. No answer is a 5xx, the
server stays up, and its log stays small (issue 41, finding 7)."""

from __future__ import annotations

import http.client
import json
import os
import ssl
import subprocess
import sys
import threading
import types
import typing
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest
from conftest import REPO, kill_all
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mainnode import MainNode

from monkey.contract import methods
from monkey.server.door import form

pytestmark = pytest.mark.system

CALLED = sorted(n for n, r in methods().items() if r.called)
TRIED: dict[str, Any] = {"calls": 0, "5xx": [], "statuses": {}}  # the figure: tried / 5xx


class Fuzzed:
    """The main node, a plain user's token, a job of hers, and the server's output."""

    def __init__(self, root: Path) -> None:
        home = root / "mh"
        self.node = MainNode(home, root)
        self.node.server_env["PYTHONPATH"] = str(REPO)
        self.node.start()
        self.output: list[str] = []
        proc = self.node.proc
        assert proc is not None and proc.stdout is not None
        self.reader = threading.Thread(target=lambda: self.output.extend(proc.stdout), daemon=True)
        self.reader.start()
        self.token = self.node.add_user("ana")
        self.node.add_remote(self.token)
        done = self.node.laptop("run", "--", "true")
        assert done.returncode == 0, done.stderr
        self.juid = done.stdout.strip().split()[-1]
        self.conn: http.client.HTTPSConnection | None = None

    def post(self, method: str, body: bytes) -> int:
        return self.request("POST", f"/api/v1/call/{method}", body)

    def request(self, verb: str, path: str, body: bytes | None) -> int:
        for _ in range(2):  # a connection the server closed after an answer: once more
            if self.conn is None:
                ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
                ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
                self.conn = http.client.HTTPSConnection(
                    "127.0.0.1", self.node.port, context=ctx, timeout=60
                )
            try:
                self.conn.request(
                    verb,
                    path,
                    body=body,
                    headers={"X-Monkey-API": "1", "Authorization": f"Bearer {self.token}"},
                )
                resp = self.conn.getresponse()
                resp.read()
                return resp.status
            except (http.client.HTTPException, OSError):
                self.conn.close()
                self.conn = None
        raise AssertionError(f"{verb} {path}: the server did not answer")


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fuzzed]:
    root = tmp_path_factory.mktemp("fuzz")
    f = Fuzzed(root)
    yield f
    f.node.close()
    kill_all(f"MONKEY_HOME={root / 'mh'}")


# -- values -------------------------------------------------------------------------------

NAMES = st.sampled_from(["last", "26-01-01-001", "", "..", "/etc/passwd", "a" * 300, "lab"])
HOSTILE = st.sampled_from(
    [
        None,
        float("1e308"),
        -(2**63),
        2**63,
        10**40,
        -(10**40),
        {"__monkey__": "Job"},
        {"__monkey__": "State", "value": "running"},
        {"__monkey__": "float", "value": "nan"},
        {"__monkey__": "nope"},
        "x\x00y",
        [],
        {},
        [[[[[["deep"]]]]]],
        True,
        "running",
        "1e9",
    ]
)
JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text() | HOSTILE,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


def typed(kind: object, juid: str) -> st.SearchStrategy[object]:
    """Values of KIND (a contract annotation), mostly fitting, sometimes not."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*(typed(a, juid) for a in args if a is not msgspec.UnsetType))
    if kind is str:
        return st.one_of(NAMES, st.just(juid), st.text(max_size=20))
    if kind is int:
        return st.one_of(st.integers(-5, 5), st.integers())
    if kind is float:
        return st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.integers(0, 10))
    if kind is bool:
        return st.booleans()
    if kind is type(None) or kind is None:
        return st.none()
    if origin in (list, Sequence, Collection):
        return st.lists(typed(args[0], juid), max_size=3)
    if origin is dict:
        return st.dictionaries(st.text(max_size=8), typed(args[1], juid), max_size=3)
    return JSONISH


@st.composite
def bodies(draw: st.DrawFn, juid: str) -> tuple[str, bytes]:
    """(method, body): a call with fitting, wrong, missing and extra arguments, or a body
    no client would send."""
    method = draw(st.sampled_from(CALLED))
    fields = form(method).struct.__annotations__
    how = draw(st.sampled_from(["typed", "typed", "typed", "hostile", "raw"]))
    if how == "raw":
        return method, draw(
            st.sampled_from(
                [
                    b"[" * 5000 + b"]" * 5000,
                    b'{"args": ' + b"[" * 5000 + b"]" * 5000 + b"}",
                    b'{"kwargs": ' + b'{"a":' * 3000 + b"1" + b"}" * 3001,
                    b'{"args": ["\\ud800"]}',
                    b'{"args": ["\\udfff\\ud800x"]}',
                    b'{"args": [NaN]}',
                    b'{"args": [Infinity]}',
                    b'{"args": [1' + b"0" * 5000 + b"]}",
                    b'{"args": ["\xff\xfe"]}',
                    b"null",
                    b'{"args": null, "kwargs": null}',
                    b'{"args": {}, "kwargs": []}',
                    b'{"args": [], "kwargs": {}, "extra": 1}',
                    b"",
                    b"not json",
                ]
            )
        )
    kwargs: dict[str, object] = {}
    for name, kind in fields.items():
        if draw(st.integers(0, 3)) == 0:  # left out: missing when required
            continue
        kwargs[name] = draw(typed(kind, juid) if how == "typed" else JSONISH)
    if draw(st.integers(0, 5)) == 0:
        kwargs[draw(st.text(min_size=1, max_size=8))] = draw(JSONISH)  # an extra field
    if method == "notify_add":  # no message leaves 127.0.0.1 (a closed port)
        kwargs["check"] = False
        if isinstance(kwargs.get("dest"), str):
            kwargs["dest"] = "https://127.0.0.1:9/hook"
        kwargs.pop("smtp", None)
    positional = form(method).positional
    cut = draw(st.integers(0, len(positional)))
    args = [kwargs.pop(n) for n in positional[:cut] if n in kwargs]
    return method, json.dumps({"args": args, "kwargs": kwargs}).encode()


@pytest.mark.timeout(300)
def test_no_call_of_the_contract_is_answered_with_a_server_error(fuzzed):
    @settings(
        max_examples=1500,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(bodies(fuzzed.juid))
    def one(call: tuple[str, bytes]) -> None:
        method, body = call
        status = fuzzed.post(method, body)
        TRIED["calls"] += 1
        TRIED["statuses"][status] = TRIED["statuses"].get(status, 0) + 1
        if status >= 500:
            TRIED["5xx"].append((method, body[:300]))

    one()
    print(
        f"\nfuzz: {TRIED['calls']} calls tried / {len(TRIED['5xx'])} answered 5xx "
        f"(by status: {dict(sorted(TRIED['statuses'].items()))})"
    )
    failed = [line for line in fuzzed.output if " ERROR " in line]
    assert not TRIED["5xx"], (TRIED["5xx"][:5], failed[:20])
    # the server is still up, and its log holds no traceback and stays small
    assert fuzzed.node.proc is not None and fuzzed.node.proc.poll() is None
    assert fuzzed.node.laptop("info", fuzzed.juid).returncode == 0
    log = "".join(fuzzed.output)
    assert "Traceback" not in log, log[-3000:]
    assert len(log) < 64 * 1024, len(log)


@st.composite
def log_requests(draw: st.DrawFn, juid: str) -> tuple[str, str, bytes | None]:
    """A request of a job's output, its query and resume body hostile or not."""
    from urllib.parse import quote, urlencode

    ref = draw(st.one_of(NAMES, st.just(juid), st.text(max_size=10)))
    query = {
        k: draw(st.one_of(st.integers(-(10**30), 10**30).map(str), st.text(max_size=6)))
        for k in draw(st.sets(st.sampled_from(["stream", "tail", "attempt", "setup", "follow"])))
    }
    if draw(st.booleans()):
        query["stream"] = draw(st.sampled_from(["both", "stdout", "stderr"]))
    body = None
    if draw(st.booleans()):
        body = draw(
            st.one_of(
                JSONISH.map(lambda v: json.dumps(v).encode()),
                st.sampled_from([b"[" * 5000, b'{"offsets": {"x": 1e400}}', b'{"marked": [NaN]}']),
                st.just(json.dumps({"offsets": {"stdout.log": 0}, "marked": [1]}).encode()),
            )
        )
    path = f"/api/v1/logs/{quote(ref, safe='')}?{urlencode(query)}"
    return ("POST" if body is not None else "GET"), path, body


@pytest.mark.timeout(120)
def test_no_request_of_a_job_output_is_answered_with_a_server_error(fuzzed):
    errors = []

    @settings(max_examples=200, deadline=None, derandomize=True, database=None)
    @given(log_requests(fuzzed.juid))
    def one(request: tuple[str, str, bytes | None]) -> None:
        status = fuzzed.request(*request)
        if status >= 500:
            errors.append(request)

    one()
    assert not errors, errors[:5]


def test_the_one_shot_client_does_not_import_the_validation_library(tmp_path):
    code = "import sys, monkey.remote.facade, monkey.contract; print('msgspec' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.stdout.strip() == "False", done.stderr
