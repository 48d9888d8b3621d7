"""`monkey notify` (issue 29, part 3): Slack, signed webhook and email targets per user, with
rules; deliveries from an outbox written with each ending, sent by the core's notifier with
retries and an idempotency id; secrets kept out of the database and the logs.

The receivers are real: an HTTP server on 127.0.0.1 in a thread (it checks signatures and
records deliveries), aiosmtpd with STARTTLS and AUTH as the mail server."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import stat
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import kill_core, start_core, wait_for
from mainnode import node  # noqa: F401  (a fixture)
from ports import free_port

from tests import test_ec2

fleet = test_ec2.fleet  # one sshd per address moto gives the instances (a fixture)

KEY = "k" * 20 + "-signing-key-of-the-test"
ENDED = ("succeeded", "failed", "cancelled", "lost", "preempted")


class Receiver:
    """An HTTP receiver on 127.0.0.1: records each POST (headers, body, whether its
    signature checks out with KEY); ``hang`` holds answers until released; ``status`` is
    what it answers."""

    def __init__(self, port: int = 0) -> None:
        self.got: list[dict] = []
        self.hang = threading.Event()
        self.release = threading.Event()
        self.status = 200
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                stamp = self.headers.get("X-Monkey-Timestamp", "")
                mac = hmac.new(KEY.encode(), stamp.encode() + b"." + body, hashlib.sha256)
                receiver.got.append(
                    {
                        "path": self.path,
                        "headers": dict(self.headers),
                        "body": json.loads(body),
                        "signed": self.headers.get("X-Monkey-Signature")
                        == "sha256=" + mac.hexdigest(),
                    }
                )
                if receiver.hang.is_set():
                    receiver.release.wait(60)
                self.send_response(receiver.status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/hook/T0001/B0002/s3cr3tPathOfTheHook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def _ended(monkey, *juids: str, timeout: float = 60) -> None:
    wait_for(
        lambda: all(monkey.store.get_job(j).state.value in ENDED for j in juids),
        timeout=timeout,
        what=f"jobs {', '.join(juids)} to end",
    )


def _settled(monkey) -> None:
    """Wait until every ending so far was turned into deliveries and none is pending."""
    db = monkey.store.db
    wait_for(
        lambda: (
            db.execute("SELECT COUNT(*) FROM notify_outbox").fetchone()[0] == 0
            and db.execute(
                "SELECT COUNT(*) FROM notify_deliveries WHERE state = 'pending'"
            ).fetchone()[0]
            == 0
        ),
        what="the notifier to send everything",
    )


def _targets(cli) -> dict[str, dict]:
    return {t["name"]: t for t in json.loads(cli("notify", "list", "--json", check=True).stdout)}


def _fail(text: str = "boom") -> list[str]:
    return ["python3", "-c", f"print('working'); print({text!r}); raise SystemExit(3)"]


def test_a_failing_job_sends_one_signed_webhook_with_what_to_act_on(monkey, cli, receiver):
    """The failure's message: job id and name, state and reason, the last lines of output,
    duration; signed with the key over timestamp and body, with a delivery id; sent once."""
    out = cli("notify", "add", "ci", "webhook", receiver.url, "--secret", KEY, check=True).stdout
    assert "ci" in out and "s3cr3tPath" not in out and KEY not in out
    juid = monkey.run(_fail("the last words"), name="trainer").juid
    _ended(monkey, juid)
    wait_for(lambda: _targets(cli)["ci"]["sent"] == 1, what="the delivery to be sent")
    [got] = receiver.got
    assert got["signed"], got["headers"]
    assert got["path"] == "/hook/T0001/B0002/s3cr3tPathOfTheHook"
    assert abs(int(got["headers"]["X-Monkey-Timestamp"]) - time.time()) < 300
    body = got["body"]
    assert body["delivery"] == got["headers"]["X-Monkey-Delivery"]
    assert body["event"] == "failed"
    job = body["job"]
    assert (job["id"], job["name"], job["state"], job["reason"]) == (
        juid,
        "trainer",
        "failed",
        "exit 3",
    )
    assert job["exit_code"] == 3 and job["duration"] is not None
    assert body["output"][-2:] == ["working", "the last words"]
    assert juid in body["text"] and "failed" in body["text"]
    _settled(monkey)
    assert len(receiver.got) == 1
    assert _targets(cli)["ci"]["pending"] == 0


def test_slack_gets_block_kit_and_run_notify_sends_an_ending_no_rule_takes(monkey, cli, receiver):
    """A Slack target whose rules skip successes still hears of a job run with --notify;
    the body is Slack's documented shape: `text` as the fallback, `blocks` of section and
    context blocks with mrkdwn text objects."""
    cli("notify", "add", "team", "slack", receiver.url, "--on", "failed", check=True)
    plain = monkey.run(["true"]).juid
    told = cli("run", "--notify", "team", "--name", "told", "--", "true", check=True)
    juid = told.stdout.split()[0]
    _ended(monkey, plain, juid)
    wait_for(lambda: len(receiver.got) >= 1, what="the Slack message")
    _settled(monkey)
    [got] = receiver.got
    payload = got["body"]
    assert "X-Monkey-Signature" not in got["headers"]  # Slack checks nothing: its URL is secret
    assert isinstance(payload["text"], str) and juid in payload["text"]
    blocks = payload["blocks"]
    assert {b["type"] for b in blocks} <= {"section", "context"}
    assert blocks[0]["type"] == "section" and blocks[-1]["type"] == "context"
    for block in blocks:
        texts = block.get("fields", []) + ([block["text"]] if "text" in block else [])
        texts += block.get("elements", [])
        assert texts
        for t in texts:
            assert t["type"] in ("mrkdwn", "plain_text") and 0 < len(t["text"]) <= 3000
        assert len(block.get("fields", [])) <= 10
    fields = " ".join(f["text"] for b in blocks for f in b.get("fields", []))
    assert "succeeded" in fields and "told" in fields
    bad = cli("run", "--notify", "nobody", "--", "true")
    assert bad.returncode == 1
    assert bad.stderr.strip().splitlines() == [
        "monkey: error: --notify nobody: you have no such target; add it with `monkey notify "
        "add nobody ...` (see `monkey notify list`)"
    ]


def test_rules_choose_events_sweep_and_job_names(monkey, cli, receiver, tmp_path: Path):
    """`--on succeeded --name 'keep-*'` takes keep-* successes only; `--sweep S` takes that
    sweep's failures and its end (one message when its last job ends)."""
    cli(
        "notify", "add", "keep", "webhook", receiver.url + "/keep", "--secret", KEY,
        "--on", "succeeded", "--name", "keep-*", check=True,
    )  # fmt: skip
    kept = monkey.run(["true"], name="keep-1").juid
    dropped = monkey.run(["true"], name="drop-1").juid
    failed = monkey.run(_fail(), name="keep-2").juid
    _ended(monkey, kept, dropped, failed)
    flag = tmp_path / "go"
    gate = monkey.run(["sh", "-c", f"while [ ! -e {flag} ]; do sleep 0.05; done"]).juid
    sid = monkey.sweep(
        ["python3", "-c", "import sys; sys.exit(int('{x}') == 2)"],
        grid={"x": [1, 2, 3]},
        after=gate,  # its cells end after the rule exists
    )
    cli(
        "notify", "add", "sw", "webhook", receiver.url + "/sw", "--secret", KEY,
        "--sweep", sid, check=True,
    )  # fmt: skip
    flag.touch()
    cells = [j.juid for j in monkey.store.list_jobs(sweep=sid)]
    assert len(cells) == 3
    _ended(monkey, gate, *cells)
    other = monkey.run(_fail(), name="not-in-sweep").juid
    _ended(monkey, other)
    wait_for(lambda: _targets(cli)["sw"]["sent"] == 2, what="the sweep's two messages")
    _settled(monkey)
    keep = [g["body"] for g in receiver.got if g["path"].endswith("/keep")]
    assert [(b["event"], b["job"]["id"]) for b in keep] == [("succeeded", kept)]
    sw = [g["body"] for g in receiver.got if g["path"].endswith("/sw")]
    assert [b["event"] for b in sw] == ["failed", "sweep"]
    assert sw[0]["job"]["sweep"] == sid
    assert sw[1]["sweep"]["name"] == sid and sw[1]["sweep"]["jobs"] == 3
    assert (sw[1]["sweep"]["succeeded"], sw[1]["sweep"]["failed"]) == (2, 1)
    assert all(g["signed"] for g in receiver.got)


def test_a_receiver_down_then_up_gets_every_message_once_in_order(monkey, cli):
    """While the receiver is down the deliveries wait (list shows them pending with the
    error); once it is up each arrives once, in the order the jobs ended."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/hook"
    cli("notify", "add", "ci", "webhook", url, "--secret", KEY, check=True)
    juids = []
    for i in range(3):
        juids.append(monkey.run(_fail(f"n{i}"), name=f"j{i}").juid)
        _ended(monkey, juids[-1])

    def waiting() -> bool:
        row = _targets(cli)["ci"]
        return row["pending"] == 3 and "connection refused" in (row["last_error"] or "")

    wait_for(waiting, what="three messages waiting after a refused try")
    assert _targets(cli)["ci"]["sent"] == 0
    listed = cli("notify", "list", check=True).stdout
    assert "connection refused" in listed and f"{port}/hook" not in listed
    shown = cli("info", juids[0], check=True).stdout
    assert re.search(
        rf"notified +ci \(failed\): pending after \d+ tries, last: 127.0.0.1:{port}: "
        "connection refused",
        shown,
    ), shown
    receiver = Receiver(port)
    try:
        wait_for(lambda: _targets(cli)["ci"]["sent"] == 3, timeout=90, what="all three delivered")
        _settled(monkey)
        ids = [g["headers"]["X-Monkey-Delivery"] for g in receiver.got]
        assert len(ids) == 3 and len(set(ids)) == 3
        assert [g["body"]["job"]["id"] for g in receiver.got] == juids
        assert all(g["signed"] for g in receiver.got)
        assert re.search(r"notified +ci \(failed\): sent\n", cli("info", juids[0]).stdout)
    finally:
        receiver.close()


def test_a_core_killed_mid_send_sends_again_with_the_same_id(monkey, cli, home, receiver):
    """The receiver takes the request but does not answer; the core is SIGKILLed; after
    its restart the message comes again with the same idempotency id."""
    cli("notify", "add", "ci", "webhook", receiver.url, "--secret", KEY, check=True)
    receiver.hang.set()
    juid = monkey.run(_fail(), name="crash").juid
    _ended(monkey, juid)
    wait_for(lambda: receiver.got, what="the first try to arrive")
    kill_core(home)
    receiver.hang.clear()
    receiver.release.set()
    start_core(home)
    wait_for(lambda: len(receiver.got) >= 2, timeout=60, what="the try after the restart")
    first, again = receiver.got[:2]
    assert first["headers"]["X-Monkey-Delivery"] == again["headers"]["X-Monkey-Delivery"]
    assert first["body"] == again["body"] and again["signed"]
    wait_for(lambda: _targets(cli)["ci"]["sent"] == 1, what="it to be marked sent")


def test_bad_urls_and_rules_are_one_line_and_store_nothing(cli, home):
    cases = [
        (
            ["webhook", "http://hooks.example.org/x"],
            "webhook URL 'http://hooks.example.org/x' is plain http to hooks.example.org: only "
            "https may leave this machine (plain http is for 127.0.0.1, ::1 or localhost); "
            "use https://",
        ),
        (
            ["slack", "hooks.slack.com/services/T/B/X"],
            "Slack webhook URL 'hooks.slack.com/services/T/B/X' is malformed; give "
            "https://HOST/PATH (e.g. https://hooks.slack.com/services/...)",
        ),
        (
            ["webhook", "https://example.org:99999/x"],
            "webhook URL 'https://example.org:99999/x' is malformed (Port out of range 0-65535)",
        ),
        (
            ["webhook", "https://example.org/x", "--on", "failed,exploded"],
            "--on exploded: not an event; choose among succeeded, failed, lost, preempted, "
            "cancelled, timeout, sweep, idle, spend (comma-separated), or all",
        ),
        (
            ["email", "me@example.org", "--smtp", "mail.example.org", "--plain"],
            "--plain sends the mail and password unencrypted, allowed to loopback only, not "
            "mail.example.org; use --starttls (default) or --ssl",
        ),
        (["email", "not-an-address", "--smtp", "localhost"], None),
    ]
    for args, line in cases:
        proc = cli("notify", "add", "x", *args)
        assert proc.returncode != 0, args
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1, proc.stderr
        if line:
            assert lines == [f"monkey: error: {line}"]
    assert _targets(cli) == {}
    assert not list((home / "secrets").glob("notify-*"))
    proc = cli("notify", "test", "x")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "monkey: error: you have no target named 'x'; see `monkey notify list`"
    ]


def test_notify_test_says_why_in_one_line(cli):
    """An HTTP error status and a refused connection, each one line and exit 1."""
    receiver = Receiver()
    receiver.status = 404
    try:
        cli("notify", "add", "gone", "slack", receiver.url, check=True)
        proc = cli("notify", "test", "gone")
        assert proc.returncode == 1
        assert proc.stderr.strip().splitlines() == [
            f"monkey: error: notify test gone: 127.0.0.1:{receiver.port} answered HTTP 404 "
            "Not Found: ok"
        ]
        receiver.status = 200
        proc = cli("notify", "test", "gone")
        assert proc.returncode == 0 and proc.stdout.strip() == "test message sent to gone"
        assert receiver.got[-1]["body"]["text"] == "Test message from monkey to gone"
    finally:
        receiver.close()
    proc = cli("notify", "test", "gone")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"monkey: error: notify test gone: 127.0.0.1:{receiver.port}: connection refused"
    ]


def test_secrets_stay_out_of_the_database_and_logs(monkey, cli, home, receiver):
    """The webhook URL and its key are in a 0600 file of secrets/, never in monkey.db (its
    WAL too), daemon.log, the events or `notify list`."""
    cli(
        "notify",
        "add",
        "ci",
        "webhook",
        "-",
        "--secret",
        KEY,
        input=receiver.url + "\n",
        check=True,
    )
    juid = monkey.run(_fail(), name="leak").juid
    _ended(monkey, juid)
    wait_for(lambda: _targets(cli)["ci"]["sent"] == 1, what="the delivery")
    [secret] = (home / "secrets").glob("notify-*")
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert receiver.url in secret.read_text() and KEY in secret.read_text()
    listed = cli("notify", "list", check=True).stdout + cli("notify", "list", "--json").stdout
    for place in [home / "monkey.db", home / "monkey.db-wal", home / "daemon.log"]:
        data = place.read_bytes() if place.exists() else b""
        assert b"s3cr3tPathOfTheHook" not in data, place
        assert KEY.encode() not in data, place
    assert "s3cr3tPathOfTheHook" not in listed and KEY not in listed
    assert "http://127.0.0.1:" in listed and "…/Hook" in listed
    events = json.dumps(monkey.store.events(juid))
    assert "s3cr3t" not in events
    cli("notify", "remove", "ci", check=True)
    assert not secret.exists()
    assert _targets(cli) == {}


# -- email ------------------------------------------------------------------------------


@pytest.fixture
def smtp_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """aiosmtpd on 127.0.0.1 with STARTTLS (a certificate for 127.0.0.1 that
    SSL_CERT_FILE makes trusted) and AUTH (user `me`, password `right`); the messages it
    received are in ``.messages``."""
    import ssl

    pytest.importorskip("aiosmtpd")
    from aiosmtpd.controller import Controller
    from aiosmtpd.smtp import AuthResult, LoginPassword

    from monkey.server.tls import make_self_signed

    cert, key = tmp_path / "smtp-cert.pem", tmp_path / "smtp-key.pem"
    make_self_signed(cert, key, ["127.0.0.1"])
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)

    class Handler:
        def __init__(self) -> None:
            self.messages: list[bytes] = []

        async def handle_DATA(self, server, session, envelope):  # noqa: N802 - aiosmtpd's
            self.messages.append(envelope.content)
            return "250 OK"

    def authenticator(server, session, envelope, mechanism, auth_data):
        ok = isinstance(auth_data, LoginPassword) and (
            auth_data.login,
            auth_data.password,
        ) == (b"me", b"right")
        return AuthResult(success=ok, handled=False)

    handler = Handler()
    controller = Controller(
        handler,
        hostname="127.0.0.1",
        port=free_port(),
        tls_context=context,
        require_starttls=True,
        authenticator=authenticator,
        auth_require_tls=True,
    )
    controller.start()
    controller.messages = handler.messages
    yield controller
    controller.stop()


def test_email_through_starttls_and_login(monkey, cli, home, smtp_server):
    """A failure's mail arrives through STARTTLS and AUTH with the job, reason and output;
    a wrong password is one line at add and stores nothing; the password is in no file
    but its 0600 secret."""
    smtp = f"127.0.0.1:{smtp_server.port}"
    env = dict(os.environ, SMTP_PW="wrong")
    import subprocess
    import sys

    def add(*args: str, pw: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "monkey", "notify", "add", *args],
            capture_output=True,
            text=True,
            env={**env, "SMTP_PW": pw},
        )

    args = ("me", "email", "me@example.org", "--smtp", smtp, "--user", "me")
    args += ("--password-env", "SMTP_PW")
    proc = add(*args, pw="wrong")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"monkey: error: SMTP {smtp} refused the login of 'me' (the server answered code "
        "535); check --user and the password (nothing was added)"
    ]
    assert _targets(cli) == {}
    proc = add(*args, pw="right")
    assert proc.returncode == 0, proc.stderr
    juid = monkey.run(_fail("mail me this"), name="mailed").juid
    _ended(monkey, juid)
    wait_for(lambda: smtp_server.messages, what="the mail")
    mail = smtp_server.messages[0].decode()
    assert f"Job {juid} (mailed) failed: exit 3" in mail
    assert "mail me this" in mail and "X-Monkey-Delivery" in mail
    for place in [home / "monkey.db", home / "monkey.db-wal", home / "daemon.log"]:
        assert b"right" not in (place.read_bytes() if place.exists() else b""), place
    assert cli("notify", "test", "me").returncode == 0
    wait_for(lambda: len(smtp_server.messages) == 2, what="the test mail")


def test_no_target_means_no_outbox(monkey):
    """With no target an ending writes nothing more than before."""
    juid = monkey.run(_fail()).juid
    _ended(monkey, juid)
    assert monkey.store.db.execute("SELECT COUNT(*) FROM notify_outbox").fetchone()[0] == 0


# -- through a remote -------------------------------------------------------------------


def test_through_a_remote_each_user_has_their_own_targets(node, receiver):
    """bob adds a target from his laptop (its URL and key go to the main node's secrets,
    nothing is made on the laptop); ana sees none of it and cannot remove it; bob's job
    run with --notify is told there, with a link to the main node's page of the job."""
    from mainnode import wait_until_ended

    node.add_remote(node.add_user("bob"), name="bob")
    node.add_remote(node.add_user("ana"), name="ana")
    # The receiver is on the main node's loopback: an admin lets plain users reach it.
    assert node.server("server", "notify-allow", "127.0.0.1/32").returncode == 0
    added = node.laptop(
        "--remote", "bob", "notify", "add", "ci", "webhook", receiver.url, "--secret", KEY,
        "--on", "succeeded",
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    assert "s3cr3tPath" not in added.stdout
    mine = json.loads(node.laptop("--remote", "bob", "notify", "list", "--json").stdout)
    assert [(t["name"], t["shown"]) for t in mine] == [
        ("ci", f"http://127.0.0.1:{receiver.port}/…/Hook")
    ]
    assert json.loads(node.laptop("--remote", "ana", "notify", "list", "--json").stdout) == []
    refused = node.laptop("--remote", "ana", "notify", "remove", "ci")
    assert (refused.returncode, refused.stderr) == (
        1,
        "monkey: error: you have no target named 'ci'; see `monkey notify list`\n",
    )
    other = node.laptop("--remote", "ana", "run", "--notify", "ci", "--", "true")
    assert other.returncode == 1 and "--notify ci: you have no such target" in other.stderr
    juid = node.laptop("--remote", "bob", "run", "--name", "remote-job", "--", "true")
    juid = juid.stdout.strip()
    wait_until_ended(node, juid)
    wait_for(lambda: receiver.got, what="bob's message")
    body = receiver.got[0]["body"]
    assert (body["job"]["id"], body["job"]["owner"], body["event"]) == (juid, "bob", "succeeded")
    assert body["job"]["url"] == f"{node.url}/web/jobs/{juid}"
    assert receiver.got[0]["signed"]
    tested = node.laptop("--remote", "bob", "notify", "test", "ci")
    assert (tested.returncode, tested.stdout) == (0, "test message sent to ci\n"), tested.stderr
    [secret] = (node.home / "secrets").glob("notify-*")
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert not (node.laptop_root / ".monkey").exists()
    assert node.laptop("--remote", "bob", "notify", "remove", "ci").returncode == 0
    assert not secret.exists()


def test_time_limits_and_retries_are_told_once_the_job_is_over(monkey, cli, receiver):
    """`--on timeout` hears of a time limit reached (with its reason); a failing job with a
    retry left is told once, when its last attempt failed, not at each attempt."""
    cli("notify", "add", "t", "webhook", receiver.url + "/t", "--secret", KEY, "--on", "timeout")
    cli("notify", "add", "f", "webhook", receiver.url + "/f", "--secret", KEY, "--on", "failed")
    slow = monkey.run(["sleep", "60"], name="slow", time="2s").juid
    retried = monkey.run(_fail(), name="retried", retries=1).juid
    _ended(monkey, slow, retried)
    assert len(monkey.store.attempts(retried)) == 2
    wait_for(lambda: _targets(cli)["f"]["sent"] == 2, what="the failures' messages")
    wait_for(lambda: _targets(cli)["t"]["sent"] == 1, what="the time limit's message")
    _settled(monkey)
    told = sorted(
        (g["path"][-2:], g["body"]["event"], g["body"]["job"]["id"]) for g in receiver.got
    )
    assert told == sorted(
        [("/t", "timeout", slow), ("/f", "timeout", slow), ("/f", "failed", retried)]
    )
    [timeout] = [g["body"] for g in receiver.got if g["path"].endswith("/t")]
    assert "time limit 2s reached" in timeout["job"]["reason"]
    [failed] = [g["body"] for g in receiver.got if g["body"]["job"]["id"] == retried]
    assert failed["job"]["attempt"] == 2


def test_https_receivers_have_their_certificate_checked(
    monkey, cli, home, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A webhook over HTTPS: refused in one line while its certificate is not trusted here;
    delivered once SSL_CERT_FILE names it (the core reads the same variable)."""
    import ssl

    from monkey.server.tls import make_self_signed

    cert, key = tmp_path / "hook-cert.pem", tmp_path / "hook-key.pem"
    make_self_signed(cert, key, ["127.0.0.1"])
    receiver = Receiver()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    receiver.server.socket = context.wrap_socket(receiver.server.socket, server_side=True)
    url = f"https://127.0.0.1:{receiver.port}/hook/s3cr3tPathOfTheHook"
    try:
        cli("notify", "add", "secure", "webhook", url, "--secret", KEY, check=True)
        proc = cli("notify", "test", "secure")
        assert proc.returncode == 1
        assert proc.stderr.strip().splitlines() == [
            f"monkey: error: notify test secure: TLS error with 127.0.0.1:{receiver.port}: "
            "self-signed certificate (its certificate is not trusted here; SSL_CERT_FILE names "
            "a CA file)"
        ]
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))
        assert cli("notify", "test", "secure").returncode == 0
        juid = monkey.run(_fail(), name="over-tls").juid  # the core starts with the variable
        _ended(monkey, juid)
        wait_for(lambda: len(receiver.got) == 2, what="the failure over HTTPS")
        assert receiver.got[1]["body"]["job"]["id"] == juid and receiver.got[1]["signed"]
    finally:
        receiver.close()


def test_an_idle_billing_machine_and_a_months_spend_are_told_once(
    cli, home: Path, moto, fleet, receiver, monkeypatch
) -> None:
    """An EC2 machine left idle past --idle-after, and the month's estimated spend passing
    --spend-over: one message each (looked for again and again, each made once)."""
    import yaml

    from tests.test_ec2 import add_aws, info, run_job

    monkeypatch.setenv("MONKEY_NOTIFY_WATCH_EVERY", "0.3")
    add_aws(cli, moto, fleet, home, "--max-instances", "1", "--idle-timeout", "600")
    providers = yaml.safe_load((home / "providers.yml").read_text())
    providers["providers"]["aws"]["prices"] = {"t3.micro": 36.0}  # 2 vCPUs: $18/h per cpu
    (home / "providers.yml").write_text(yaml.safe_dump(providers))
    out = cli(
        "notify", "add", "ops", "webhook", receiver.url, "--secret", KEY,
        "--on", "idle", "--idle-after", "2s", "--spend-over", "0.01", check=True,
    ).stdout  # fmt: skip
    assert "idle>2s,spend>$0.0100" in out
    listed = _targets(cli)["ops"]
    assert (listed["events"], listed["idle_after"], listed["spend_over"]) == (
        ["idle", "spend"],
        2.0,
        0.01,
    )
    try:
        juid = run_job(cli, "sleep", "3")  # $18/h for 3 s: $0.015
        wait_for(lambda: info(cli, juid)["state"] == "succeeded", timeout=120, what="the job")
        wait_for(lambda: len(receiver.got) >= 2, timeout=30, what="both messages")
        time.sleep(1.5)  # several more looks: nothing is told twice
        bodies = {g["body"]["event"]: g for g in receiver.got}
        assert sorted(g["body"]["event"] for g in receiver.got) == ["idle", "spend"]
        assert all(g["signed"] for g in receiver.got)
        idle = bodies["idle"]["body"]
        [instance] = info(cli, juid)["instance"].split()
        assert idle["instance"]["id"] == instance and idle["instance"]["price"] == 36.0
        assert "still billing ($36.00/h)" in idle["text"]
        spend = bodies["spend"]["body"]["spend"]
        assert spend["threshold"] == 0.01 and 0.01 <= spend["spent"] < 0.1
    finally:
        cli("daemon", "stop")
        left = [i["InstanceId"] for i in moto.instances()]
        if left:
            moto.boto3("ec2").terminate_instances(InstanceIds=left)


def test_idle_and_spend_options_are_checked(cli) -> None:
    cases = [
        (["--on", "spend"], "--on spend needs its threshold: --spend-over USD"),
        (["--idle-after", "30m"], "--idle-after goes with the idle event: add --on idle"),
        (["--on", "idle", "--idle-after", "30"], "--idle-after '30' is not a duration"),
        (["--spend-over", "-5"], "--spend-over '-5' is not an amount"),
    ]
    for extra, said in cases:
        proc = cli("notify", "add", "x", "webhook", "https://example.org/h", *extra)
        assert proc.returncode != 0 and said in proc.stderr, (extra, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1
    assert _targets(cli) == {}


def test_a_lost_job_queued_again_is_told_with_its_last_output(home: Path, monkey, cli, receiver):
    """A job whose process vanished while no core watched ends its attempt lost: told (a
    default event) with the reason, "queued again" and its last output; the retry that
    succeeds is not (succeeded is not among the default events)."""
    import signal

    from test_recovery import _agent_pid, _dead

    cli("notify", "add", "ops", "webhook", receiver.url, "--secret", KEY, check=True)
    job = monkey.run(
        [
            "sh",
            "-c",
            'if [ -e "$MONKEY_CHECKPOINT_DIR/x" ]; then exit 0; fi; '
            'touch "$MONKEY_CHECKPOINT_DIR/x"; echo once; sleep 300',
        ],
        retries=1,
        name="vanishing",
    )
    wait_for(lambda: job.logs() == "once\n" and job.status.value == "running", what="a start")
    pid = job.attempts()[0].pid
    kill_core(home)
    os.kill(_agent_pid(home), signal.SIGKILL)
    os.killpg(pid, signal.SIGKILL)
    wait_for(lambda: _dead(pid), what="the job to die")
    start_core(home)
    assert job.wait(timeout=60).value == "succeeded"
    _settled(monkey)
    [got] = receiver.got
    body = got["body"]
    assert got["signed"] and body["event"] == "lost"
    assert (body["job"]["id"], body["job"]["state"]) == (job.juid, "lost")
    assert body["job"]["reason"] == "process vanished; queued again"
    assert body["output"] == ["once"]
