"""The main node's door (issue 41, findings 3 and 4): the refused-token limit keyed on the
TCP peer and the token's prefix (forwarded headers only from a --trusted-proxy), request
bodies bounded before they are read, the audit log, and repeated errors logged once."""

from __future__ import annotations

import http.client
import secrets
import ssl

import pytest
from mainnode import MainNode, node  # noqa: F401 - node: a fixture

pytestmark = pytest.mark.system


def ask(
    node: MainNode,
    token: str | None,
    path: str = "/api/v1/call/whoami",
    source: str = "127.0.0.1",
    forwarded: str | None = None,
) -> int:
    """The status of one HTTPS request from SOURCE (an address of the loopback), with
    X-Forwarded-For FORWARDED when given."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    conn = http.client.HTTPSConnection(
        "127.0.0.1", node.port, context=ctx, timeout=30, source_address=(source, 0)
    )
    headers = {"X-Monkey-API": "1"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if forwarded:
        headers["X-Forwarded-For"] = forwarded
    conn.request("POST", path, body=b"{}", headers=headers)
    status = conn.getresponse().status
    conn.close()
    return status


def wrong(prefix: str) -> str:
    """A refused token starting with PREFIX (after mk_)."""
    return f"mk_{prefix}{secrets.token_urlsafe(30)}"


def prefix(token: str) -> str:
    return token.removeprefix("mk_")[:2]


def test_forwarded_for_is_not_believed_and_the_limit_holds(node):
    statuses = [ask(node, wrong("zz"), forwarded=f"10.{i // 250}.{i % 250}.1") for i in range(200)]
    assert statuses == [401] * 10 + [429] * 190


def test_refusals_claiming_another_address_do_not_lock_it_out(node):
    for _ in range(12):  # from 127.0.0.1, each claiming to be 127.0.0.2
        ask(node, wrong("zz"), forwarded="127.0.0.2")
    assert ask(node, wrong("zz"), source="127.0.0.2") == 401  # counted, not yet refused
    assert ask(node, wrong("zz")) == 429  # the sender's own address is


def test_one_tunnel_users_typos_do_not_lock_out_another(node):
    ana = node.add_user("ana")
    bob = node.add_user("bob")
    while prefix(bob) == prefix(ana):  # one chance in 4,096
        bob = node.server("server", "user", "token", "bob").stdout.strip().splitlines()[-1]
    for i in range(15):  # bob mistypes his token, from 127.0.0.1 like every tunnel
        assert ask(node, bob[:-3] + f"{i:03d}") in (401, 429)
    assert ask(node, bob[:-3] + "xyz") == 429
    assert ask(node, ana) == 200  # ana, from the same address, is not locked out
    assert ask(node, None) == 401  # nor anyone sending no token


def test_a_trusted_proxy_names_the_address_that_is_limited(node):
    node.kill()
    node.start("--trusted-proxy", "127.0.0.1/32")
    node.kill()
    node.start()  # kept for the next start
    for _ in range(10):
        assert ask(node, wrong("zz"), forwarded="10.1.1.1") == 401
    assert ask(node, wrong("zz"), forwarded="10.1.1.1") == 429
    assert ask(node, wrong("zz"), forwarded="10.1.1.2") == 401  # another client of the proxy
    assert ask(node, wrong("zz")) == 401  # the proxy itself
    assert ask(node, node.token, forwarded="10.1.1.1") == 200
    # a peer that is no trusted proxy cannot claim an address
    for _ in range(10):
        ask(node, wrong("yy"), source="127.0.0.2", forwarded="10.2.2.2")
    assert ask(node, wrong("yy"), forwarded="10.2.2.2") == 401


def test_a_bad_trusted_proxy_is_one_line(home, tmp_path):
    n = MainNode(home, tmp_path)
    done = n.server("server", "start", "--trusted-proxy", "10.0.0.0/33")
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "monkey: error: --trusted-proxy '10.0.0.0/33': give the address or network (CIDR) "
        "of a proxy in front of this server, e.g. 10.0.0.5 or 10.0.0.0/24 (none: trust no "
        "proxy)"
    )
    assert n.server("server", "status").returncode == 3
