"""The client's HTTP/1.1 (monkey/remote/wire.py): against the real `monkey server` where a
user meets it (a script idle past the server's keep-alive), and against a loopback socket
speaking the answers uvicorn may give (chunked, closed mid-answer, not HTTP at all)."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from mainnode import MainNode

from monkey.remote.wire import BadAnswer, Connection, Disconnected


@pytest.fixture
def node(home: Path, tmp_path: Path):
    n = MainNode(home, tmp_path)
    n.start()
    yield n
    n.close()


def test_a_script_idle_longer_than_the_servers_keep_alive_goes_on(node):
    """uvicorn closes a connection idle for 5 s; the next call opens another, unnoticed."""
    node.add_remote()
    node.server("run", "--", "true")
    script = (
        "import time\nfrom monkey import Monkey\n"
        "m = Monkey(remote='lab')\n"
        "print(m.job_listing(limit=5)['total'])\n"
        "time.sleep(7)\n"
        "print(m.job_listing(limit=5)['total'])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=node.laptop_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "1"]


def _serving(*answers: bytes) -> tuple[int, list[bytes]]:
    """A loopback server giving one ANSWER per request, in order, on one connection (then it
    closes it); the port, and the requests it read."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    seen: list[bytes] = []

    def serve() -> None:
        conn, _ = listener.accept()
        listener.close()
        with conn, conn.makefile("rb") as f:
            for answer in answers:
                head = b""
                while not head.endswith(b"\r\n\r\n"):
                    line = f.readline()
                    if not line:
                        return
                    head += line
                length = next(
                    (
                        int(h.split(b":")[1])
                        for h in head.split(b"\r\n")
                        if h.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                seen.append(head + f.read(length))
                conn.sendall(answer)

    threading.Thread(target=serve, daemon=True).start()
    return port, seen


def _connect(port: int) -> Connection:
    return Connection(socket.create_connection(("127.0.0.1", port), 5), f"127.0.0.1:{port}")


def test_answers_sized_chunked_and_ended_by_a_close_on_one_connection():
    port, seen = _serving(
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Monkey-Api: 1\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"4;ext=1\r\nline\r\n6\r\n one\n\n\r\n0\r\nTrailer: x\r\n\r\n",
        b"HTTP/1.1 201 Created\r\nConnection: close\r\n\r\nuntil the end",
    )
    conn = _connect(port)
    first = conn.request("POST", "/a", {"Authorization": "Bearer t"}, b'{"x": 1}')
    assert (first.status, first.getheader("x-monkey-api"), first.read()) == (200, "1", b"hello")
    assert conn.reusable
    second = conn.request("GET", "/b", {})
    assert second.readline() == b"line one\n"
    assert second.read(1) == b"\n"
    assert second.read() == b"" and conn.reusable
    third = conn.request("POST", "/c", {"Content-Length": "6"}, iter([b"abc", b"def"]))
    assert (third.status, third.read()) == (201, b"until the end")
    assert not conn.reusable  # the server said it closes
    conn.close()
    assert seen[0].startswith(b"POST /a HTTP/1.1\r\nHost: 127.0.0.1:")
    assert b"Authorization: Bearer t\r\n" in seen[0] and seen[0].endswith(b'\r\n\r\n{"x": 1}')
    assert seen[2].endswith(b"\r\n\r\nabcdef")


def test_an_answer_left_unread_keeps_the_connection_from_the_next_request():
    body = bytes(range(256)) * 400  # more than the answer's buffer
    port, _ = _serving(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body))
    conn = _connect(port)
    answer = conn.request("GET", "/", {})
    assert answer.read(4) == body[:4]
    assert not conn.reusable
    assert answer.read() == body[4:] and conn.reusable
    conn.close()


@pytest.mark.parametrize(
    ("answer", "error", "words"),
    [
        (b"", Disconnected, "closed the connection"),
        (b"SSH-2.0-OpenSSH_9.2\r\n", BadAnswer, "not an HTTP answer"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", BadAnswer, "Content-Length"),
        (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", BadAnswer, "malformed header"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", BadAnswer, "chunk"),
    ],
)
def test_what_is_not_an_answer_is_an_error_naming_it(answer, error, words):
    port, _ = _serving(answer)
    conn = _connect(port)
    with pytest.raises(error, match=words):
        conn.request("GET", "/", {}).read()
    conn.close()


def test_an_answer_cut_in_the_middle_is_an_error_not_a_short_read():
    port, _ = _serving(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly part")
    conn = _connect(port)
    answer = conn.request("GET", "/", {})
    with pytest.raises(BadAnswer, match="in the middle of an answer"):
        answer.read()
    conn.close()


def test_a_call_whose_answer_is_cut_is_unreachable_so_a_wait_reconnects():
    """A link cut (or a server killed) between an answer's head and the end of its body is
    the connection dropping, as one cut before the head: `Job.wait()` and the followers
    reconnect on Unreachable, where a BadAnswer came out as a traceback."""
    from monkey.remote import Unreachable
    from monkey.remote.client import Client
    from monkey.remote.settings import Remote

    port, _ = _serving(b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\nX-Monkey-API: 1\r\n\r\n{"r')
    client = Client(Remote("lab", f"http://127.0.0.1:{port}", None, "t"))
    with pytest.raises(
        Unreachable, match=r"^lab: the connection to http://127\.0\.0\.1:\d+ dropped"
    ):
        client.call("get_job", "26-11-28-001")
    client.close()
