"""Issue 41, finding 6: a plain user's notify targets may not reach the main node's own
network (loopback, link-local, private, its own addresses), checked when a target is added
and again at each send on the address connected to; admins allow ranges with `monkey server
notify-allow CIDR`; an SMTP error never shows what the peer said.

A real main node with a plain user (bob) and an admin (boss), a real HTTP receiver on
127.0.0.1 (tests/test_notify.py's) and a tiny TCP server that speaks like sshd."""

from __future__ import annotations

import json
import socket
import threading

from conftest import wait_for
from mainnode import node  # noqa: F401  (a fixture)
from test_notify import KEY, Receiver, receiver  # noqa: F401  (a fixture)

RULE = (
    "a loopback address: a plain user's notifications may not reach this main node's own "
    "network; an admin may allow it: monkey server notify-allow"
)


def _one_line(proc) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1, (proc.returncode, proc.stderr)
    return lines[0]


def _targets(node, remote: str) -> dict[str, dict]:
    out = node.laptop("--remote", remote, "notify", "list", "--json")
    assert out.returncode == 0, out.stderr
    return {t["name"]: t for t in json.loads(out.stdout)}


def test_a_plain_users_target_on_the_main_nodes_loopback_is_refused_at_add_and_at_send(
    node, receiver
):
    node.add_remote(node.add_user("bob"), name="bob")
    node.add_remote(node.add_user("boss", "--admin"), name="boss")
    port = receiver.port
    for url in (
        receiver.url,
        f"http://localhost:{port}/hook",
        f"https://[::1]:{port}/hook",
        f"https://127.1:{port}/hook",
        f"https://0x7f000001:{port}/hook",
        f"https://2130706433:{port}/hook",
        f"https://[::ffff:127.0.0.1]:{port}/hook",
    ):
        refused = node.laptop("--remote", "bob", "notify", "add", "x", "webhook", url)
        line = _one_line(refused)
        assert "a loopback address" in line and "notify-allow" in line, line
        assert line.endswith("(nothing was added)"), line
    mail = node.laptop(
        "--remote", "bob", "notify", "add", "m", "email", "bob@example.org",
        "--smtp", f"localhost:{port}", "--no-check",
    )  # fmt: skip
    assert f"localhost is 127.0.0.1, {RULE} 127.0.0.1/32" in _one_line(mail)
    assert _targets(node, "bob") == {}
    # An admin's targets are not restricted.
    mine = node.laptop("--remote", "boss", "notify", "add", "ops", "slack", receiver.url)
    assert mine.returncode == 0, mine.stderr

    # Allowed by an admin: bob's target is added and delivered to.
    allowed = node.laptop("--remote", "boss", "server", "notify-allow", "127.0.0.1/32")
    assert allowed.returncode == 0, allowed.stderr
    listed = node.server("server", "notify-allow")
    assert listed.stdout.splitlines() == ["127.0.0.1/32"]
    plain = node.laptop("--remote", "bob", "server", "notify-allow", "10.0.0.0/8")
    assert "notify allow is for admins of this server" in _one_line(plain)
    added = node.laptop(
        "--remote", "bob", "notify", "add", "ci", "webhook", receiver.url, "--secret", KEY,
        "--on", "succeeded",
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    tested = node.laptop("--remote", "bob", "notify", "test", "ci")
    assert tested.returncode == 0, tested.stderr
    assert len(receiver.got) == 1 and receiver.got[0]["signed"]

    # Disallowed again: the send is refused on the address it would connect to.
    removed = node.server("server", "notify-allow", "127.0.0.1/32", "--remove")
    assert removed.returncode == 0, removed.stderr
    assert "notify test ci: 127.0.0.1 is 127.0.0.1, a loopback address" in _one_line(
        node.laptop("--remote", "bob", "notify", "test", "ci")
    )
    juid = node.laptop("--remote", "bob", "run", "--", "true").stdout.strip()
    wait_for(
        lambda: (_targets(node, "bob")["ci"]["last_error"] or "").startswith(
            f"127.0.0.1 is 127.0.0.1, {RULE} 127.0.0.1/32"
        ),
        timeout=60,
        what=f"the delivery of {juid}'s ending to be refused",
    )
    assert len(receiver.got) == 1  # nothing more reached it
    gone = node.server("server", "notify-allow", "127.0.0.1/32", "--remove")
    assert _one_line(gone) == (
        "monkey: error: 127.0.0.1/32 is not allowed; see `monkey server notify-allow` (the list)"
    )


def test_an_smtp_error_names_its_class_never_the_peers_words(cli):
    """An SMTP target pointed at a port that speaks like sshd: one line naming what failed,
    without the banner; a port nobody listens on: connection refused."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]

    def speak() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")
            conn.close()

    threading.Thread(target=speak, daemon=True).start()
    try:
        for tls, said in (
            ("--starttls", f"SMTP 127.0.0.1:{port}: the server does not speak SMTP"),
            ("--ssl", f"TLS error with SMTP 127.0.0.1:{port}: "),
        ):
            proc = cli(
                "notify", "add", "m", "email", "me@example.org", "--smtp", f"127.0.0.1:{port}", tls
            )
            line = _one_line(proc)
            assert "SSH" not in line and "OpenSSH" not in line, line
            assert line.startswith(f"monkey: error: {said}"), line
            assert line.endswith("(nothing was added)"), line
    finally:
        server.shutdown(socket.SHUT_RDWR)  # wakes its accept
        server.close()
    proc = cli("notify", "add", "m", "email", "me@example.org", "--smtp", f"127.0.0.1:{port}")
    assert _one_line(proc) == (
        f"monkey: error: SMTP 127.0.0.1:{port}: connection refused (nothing was added)"
    )


def test_a_redirect_is_not_followed(cli):
    """A receiver answering 302 is told of in one line: the redirect is not followed (it
    could lead anywhere, the main node's own network included)."""
    moved = Receiver()
    moved.status = 302
    try:
        cli("notify", "add", "moved", "webhook", moved.url, check=True)
        line = _one_line(cli("notify", "test", "moved"))
        assert line == (
            f"monkey: error: notify test moved: 127.0.0.1:{moved.port} answered HTTP 302 "
            "Found, a redirect, which is not followed; give the target's final URL"
        )
    finally:
        moved.close()
