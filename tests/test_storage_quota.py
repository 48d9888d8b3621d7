"""Issue 41, finding 8: what a user stores on a main node is bounded. `monkey server quota set
ana --storage SIZE` limits the bytes of blobs her uploads and jobs hold; an upload beyond it
is refused in one line before its bytes are read, nothing of it stays; `du` shows each
user's use against their limit; an upload no job uses is reclaimed after the gc grace by
the main node itself, while the blobs of a queued job stay.

A real main node on 127.0.0.1 with a plain user (ana); the laptop's CLI, and raw uploads
as any client could send them."""

from __future__ import annotations

import http.client
import json
import os
import ssl
from pathlib import Path

import blake3
import pytest
from conftest import wait_for
from mainnode import MainNode, node  # noqa: F401  (a fixture)

from monkey.remote import API, API_HEADER


def _pack(*blobs: bytes) -> bytes:
    return b"".join(f"{blake3.blake3(b).hexdigest()} {len(b)}\n".encode() + b for b in blobs)


def _api(node: MainNode, token: str, method: str, path: str, body: bytes | None = None,
         chunked: bool = False) -> tuple[int, bytes]:  # fmt: skip
    context = ssl._create_unverified_context()  # noqa: S323 - the test's own server
    conn = http.client.HTTPSConnection("127.0.0.1", node.port, context=context, timeout=60)
    headers = {"Authorization": f"Bearer {token}", API_HEADER: str(API)}
    try:
        if chunked:
            conn.request(method, path, iter([body or b""]), headers, encode_chunked=True)
        else:
            conn.request(method, path, body, headers)
        answer = conn.getresponse()
        return answer.status, answer.read()
    finally:
        conn.close()


def _blob_files(home: Path) -> list[Path]:
    return [p for p in (home / "blobs").rglob("*") if p.is_file() and p.name != ".lease"]


def test_an_upload_beyond_a_users_storage_quota_is_refused_in_one_line(node):
    token = node.add_user("ana")
    node.add_remote(token, name="ana")
    done = node.server("server", "quota", "set", "ana", "--storage", "1M")
    assert (done.returncode, done.stdout) == (0, "quota ana on all providers: storage 1.0 MB\n")
    listed = node.server("server", "quota", "list").stdout
    assert "STORAGE" in listed and "1.0 MB" in listed, listed
    wrong = node.server("server", "quota", "set", "ana", "--storage", "lots")
    assert wrong.stderr.splitlines() == [
        "monkey: error: --storage 'lots' is not a size; give e.g. 50G or 500M (0 allows none), "
        "or unlimited"
    ]

    Path("train.py").write_text("print('hello')\n")
    small = node.laptop("--remote", "ana", "run", "--", "python3", "train.py")
    assert small.returncode == 0, small.stderr
    Path("weights.bin").write_bytes(os.urandom(2 << 20))
    before = _blob_files(node.home)
    big = node.laptop("--remote", "ana", "run", "--", "python3", "train.py")
    lines = big.stderr.strip().splitlines()
    assert big.returncode == 1 and len(lines) == 1, big.stderr
    assert lines[0].startswith("monkey: error: storage quota of ana: "), lines
    assert " held of 1.0 MB, and this upload adds 2.1 MB; " in lines[0], lines
    assert lines[0].endswith("or ask an admin: monkey server quota set ana --storage SIZE")
    assert _blob_files(node.home) == before  # nothing of it was written

    # A client announcing nothing (chunked) is counted blob by blob as the headers come.
    status, body = _api(node, token, "POST", "/api/v1/blobs", _pack(os.urandom(2 << 20)), True)
    assert status == 413 and "storage quota of ana" in json.loads(body)["error"]
    assert _blob_files(node.home) == before

    du = node.laptop("--remote", "ana", "du")
    assert du.returncode == 0, du.stderr
    [row] = [line.split() for line in du.stdout.splitlines() if line.startswith("ana ")]
    assert row[-2:] == ["1.0", "MB"] and row[1] != "0", du.stdout  # used, then the limit
    data = json.loads(node.laptop("--remote", "ana", "du", "--json").stdout)
    [mine] = [u for u in data["users"] if u["user"] == "ana"]
    assert 0 < mine["used"] < 1 << 20 and mine["limit"] == 1 << 20


def test_an_upload_no_job_uses_goes_after_the_gc_grace_without_an_admin(home, tmp_path):
    node = MainNode(home, tmp_path)
    node.server_env.update(MONKEY_GC_GRACE="1s", MONKEY_GC_EVERY="0.2")
    node.start()
    try:
        token = node.add_user("ana")
        node.add_remote(token, name="ana")
        held = node.server("server", "quota", "set", "ana", "--jobs", "0")  # her job waits
        assert held.returncode == 0, held.stderr
        Path("train.py").write_text("print('kept')\n")
        juid = node.laptop("--remote", "ana", "run", "--", "python3", "train.py").stdout.strip()
        stray = os.urandom(5000)
        digest = blake3.blake3(stray).hexdigest()
        status, _ = _api(node, token, "POST", "/api/v1/blobs", _pack(stray))
        assert status == 200
        assert _api(node, token, "GET", f"/api/v1/blobs/{digest}")[0] == 200
        wait_for(
            lambda: _api(node, token, "GET", f"/api/v1/blobs/{digest}")[0] == 404,
            timeout=60,
            what="the unused upload to be reclaimed",
        )
        info = json.loads(node.server("info", juid, "--json").stdout)
        assert info["state"] == "queued"
        checked = node.server("verify", juid)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert checked.stdout.endswith(" of 1 job: 0 damaged, 0 missing\n")
    finally:
        node.close()


def test_two_uploads_of_one_user_at_once_share_her_room():
    """What one upload under way took counts for the other, until it is over."""
    from monkey.server.blobs import OverQuota, Room

    in_flight: dict[str, int] = {}
    first, second = Room("ana", 10, 100, in_flight), Room("ana", 10, 100, in_flight)
    first.take(60)
    with pytest.raises(OverQuota, match="storage quota of ana: 70 B held of 100 B"):
        second.take(40)
    second.take(30)
    first.close()
    second.take(60)
    second.close()
    assert in_flight == {}
