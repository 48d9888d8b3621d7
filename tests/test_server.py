"""`monkey server` and `monkey remote` (issue 27, step 1): a real server with TLS on
127.0.0.1, a laptop in a separate HOME, XDG_CONFIG_HOME and MONKEY_HOME."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import ssl
import stat
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from blackhole import Blackhole
from conftest import wait_for
from mainnode import MainNode, node, wait_until_ended  # noqa: F401 - node: a fixture

pytestmark = pytest.mark.system


def raw(
    node: MainNode,
    method: str,
    path: str,
    token: str | None = None,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], bytes]:
    """One HTTPS request to the server as any client could send it."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    conn = http.client.HTTPSConnection("127.0.0.1", node.port, context=ctx, timeout=30)
    sent = {"X-Monkey-API": "1", **(headers or {})}
    if token:
        sent["Authorization"] = f"Bearer {token}"
    conn.request(method, path, body=body, headers=sent)
    resp = conn.getresponse()
    out = resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    conn.close()
    return out


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


# -- the server's own commands ------------------------------------------------------------


def test_first_start_prints_url_fingerprint_and_a_ready_remote_add_line(node):
    assert f"server: {node.url}" in node.welcome
    assert re.fullmatch(r"SHA256:[0-9a-f]{64}", node.fingerprint)
    assert (
        f"monkey remote add lab {node.url} --token {node.token} --fingerprint {node.fingerprint}"
        in node.welcome
    )
    key = node.home / "server" / "key.pem"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    status = node.server("server", "status")
    assert status.returncode == 0 and f"certificate: {node.fingerprint}" in status.stdout
    # the token is nowhere in clear on the server: not in the database, not in a log
    for path in node.home.rglob("*"):
        if path.is_file():
            assert node.token.encode() not in path.read_bytes(), path
    # a second start prints no token again (the admin exists)
    node.kill(signal.SIGTERM)
    again = node.start()
    assert "--token" not in again and node.fingerprint in again


def test_users_add_list_remove_and_rotate(node):
    token = node.add_user("bob")
    users = {
        u["name"]: u for u in json.loads(node.server("server", "user", "list", "--json").stdout)
    }
    admin = next(name for name in users if name != "bob")
    assert users[admin]["admin"] and not users["bob"]["admin"] and "digest" not in users["bob"]
    node.add_remote(token)
    assert node.laptop("--remote", "lab", "list", "jobs").returncode == 0
    used = {
        u["name"]: u for u in json.loads(node.server("server", "user", "list", "--json").stdout)
    }
    assert used["bob"]["last_used"] and not used[admin]["last_used"]
    # rotated: the old token is refused at once, the new one works
    rotated = node.server("server", "user", "token", "bob")
    new = rotated.stdout.strip().splitlines()[-1]
    assert (
        f"on bob's laptop: monkey remote add lab {node.url} --token {new} --fingerprint "
        f"{node.fingerprint}" == one_line(rotated.stderr)
    )
    refused = node.laptop("--remote", "lab", "list", "jobs")
    assert refused.returncode == 1
    assert (
        one_line(refused.stderr)
        == "monkey: error: lab: token refused; ask an admin: monkey server user token bob"
    )
    node.add_remote(new)
    assert node.laptop("--remote", "lab", "list", "jobs").returncode == 0
    # removed: refused at once
    assert node.server("server", "user", "remove", "bob").returncode == 0
    gone = node.laptop("--remote", "lab", "list", "jobs")
    assert gone.returncode == 1 and "token refused" in one_line(gone.stderr)
    dup = node.server("server", "user", "add", admin)
    assert dup.returncode == 1 and "exists" in one_line(dup.stderr)
    bad = node.server("server", "user", "add", "../x")
    assert bad.returncode == 1 and "cannot name a user" in one_line(bad.stderr)


def test_no_tls_is_refused_off_loopback(home, tmp_path):
    n = MainNode(home, tmp_path)
    done = n.server("server", "run", "--bind", "0.0.0.0:1", "--no-tls")
    assert done.returncode == 1
    assert one_line(done.stderr) == (
        "monkey: error: --no-tls serves plain HTTP, allowed on loopback "
        "only (127.0.0.1, ::1), not 0.0.0.0; drop --no-tls to serve HTTPS"
    )
    assert not (home / "server" / "cert.pem").exists()


def test_install_service_writes_a_systemd_user_unit(home, tmp_path):
    n = MainNode(home, tmp_path)
    done = n.server("server", "install-service")
    assert done.returncode == 0, done.stderr
    unit = Path(n.server_env["XDG_CONFIG_HOME"]) / "systemd" / "user" / "monkey-server.service"
    text = unit.read_text()
    assert f"Environment=MONKEY_HOME={home}" in text and "-m monkey server run" in text


# -- remote add: certificates and tokens --------------------------------------------------


def test_remote_add_refuses_an_unpinned_self_signed_certificate(node):
    done = node.laptop("remote", "add", "lab", node.url, "--token", node.token)
    assert done.returncode == 1
    line = one_line(done.stderr)
    assert node.fingerprint in line and f"add --fingerprint {node.fingerprint}" in line
    assert node.laptop_files() == []  # nothing saved
    node.add_remote()
    files = node.laptop_files()
    assert files == [".config/monkey/lab.token", ".config/monkey/remotes.json"]
    token_file = node.laptop_root / ".config/monkey/lab.token"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert node.token not in (node.laptop_root / ".config/monkey/remotes.json").read_text()


def test_remote_add_with_a_wrong_token_is_refused_and_saves_nothing(node):
    done = node.laptop(
        "remote", "add", "lab", node.url, "--token", "nope", "--fingerprint", node.fingerprint
    )
    assert done.returncode == 1
    assert one_line(done.stderr) == (
        "monkey: error: lab: token refused; ask an admin: monkey server user token NAME"
    )
    assert node.laptop_files() == []


def test_remote_add_with_http_for_an_https_server_says_so(node):
    """http:// for a server that speaks HTTPS: one line saying so and the command to use,
    not "the connection dropped"; nothing saved."""
    plain = node.url.replace("https://", "http://")
    done = node.laptop("remote", "add", "lab", plain, "--token", node.token)
    assert done.returncode == 1
    line = one_line(done.stderr)
    assert f"{plain} speaks HTTPS, not plain HTTP" in line
    assert f"monkey remote add lab {node.url} --fingerprint {node.fingerprint}" in line
    assert "dropped" not in line
    assert node.laptop_files() == []


def test_a_changed_certificate_is_refused_with_both_fingerprints(node):
    node.add_remote()
    old = node.fingerprint
    node.kill()
    (node.home / "server" / "cert.pem").unlink()
    (node.home / "server" / "key.pem").unlink()
    node.start()
    assert node.fingerprint != old
    done = node.laptop("--remote", "lab", "list", "jobs")
    assert done.returncode == 1
    line = one_line(done.stderr)
    assert f"pinned {old}, now {node.fingerprint}" in line


def test_every_endpoint_answers_401_without_a_valid_token(node):
    for method, path in (
        ("POST", "/api/v1/call/job_listing"),
        ("GET", "/api/v1/logs/last"),
        ("GET", "/"),
        ("GET", "/api/v1/nothing"),
    ):
        for token in (None, "wrong"):
            status, headers, body = raw(node, method, path, token)
            assert status == 401 and json.loads(body) == {"error": "token refused"}
            assert headers["x-monkey-api"] == "1"


def test_the_address_pasted_into_a_browser_opens_monkey_web(node):
    """`server start` prints the main node's address: a browser (Accept: text/html) at / is
    sent to Monkey Web, which asks it to log in; an API client there still gets a 401."""
    page = {"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"}
    status, headers, _ = raw(node, "GET", "/", headers=page)
    assert status == 303 and headers["location"] == "/web/jobs"
    status, headers, body = raw(node, "GET", "/web/jobs", headers=page)
    assert status in (302, 303, 307) and headers["location"].startswith("/web/login")
    assert raw(node, "GET", "/")[0] == 401  # no Accept: an API client


def test_refused_tokens_are_rate_limited_per_address_and_prefix(node):
    for _ in range(10):
        assert raw(node, "POST", "/api/v1/call/whoami", "wrong")[0] == 401
    status, headers, _ = raw(node, "POST", "/api/v1/call/whoami", "wrong")
    assert status == 429 and 0 < int(headers["retry-after"]) <= 60
    status, _, _ = raw(node, "POST", "/api/v1/call/whoami", node.token)  # another prefix
    assert status == 200
    done = node.laptop(
        "remote", "add", "lab", node.url, "--token", "wrung", "--fingerprint", node.fingerprint
    )
    assert done.returncode == 1
    assert re.fullmatch(
        r"monkey: error: lab: too many refused tokens from this address; try again in \d+s",
        one_line(done.stderr),
    )


def test_a_client_of_another_api_is_refused(node):
    status, headers, body = raw(
        node, "POST", "/api/v1/call/whoami", node.token, headers={"X-Monkey-API": "99"}
    )
    assert status == 426 and "API 1" in json.loads(body)["error"]


def test_a_server_of_another_api_is_one_line_naming_both(home, tmp_path):
    class Newer(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            self.send_response(426)
            self.send_header("X-Monkey-API", "2")
            self.send_header("X-Monkey-Version", "0.9.0")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            pass

    httpd = HTTPServer(("127.0.0.1", 0), Newer)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        n = MainNode(home, tmp_path)
        done = n.laptop(
            "remote", "add", "new", f"http://127.0.0.1:{httpd.server_port}", "--token", "t"
        )
        assert done.returncode == 1
        assert one_line(done.stderr) == (
            "monkey: error: new: the server runs monkey 0.9.0 (API 2) and this client monkey 0.1.0 "
            "(API 1); upgrade the older one: pip install -U monkey-runner"
        )
    finally:
        httpd.shutdown()


def test_server_down_or_silent_is_one_line(node, tmp_path):
    node.add_remote()
    node.kill()
    down = node.laptop("--remote", "lab", "list", "jobs", timeout=30)
    assert down.returncode == 1
    assert one_line(down.stderr) == (
        f"monkey: error: lab: cannot reach {node.url} (connection refused); "
        "is `monkey server` running there? (`monkey server status` on it)"
    )
    hole = Blackhole()  # accepts TCP, never answers the TLS handshake
    try:
        settings = node.laptop_root / ".config/monkey/remotes.json"
        data = json.loads(settings.read_text())
        data["remotes"]["lab"]["url"] = f"https://127.0.0.1:{hole.port}"
        settings.write_text(json.dumps(data))
        silent = node.laptop("--remote", "lab", "list", "jobs", timeout=30)
        assert silent.returncode == 1
        assert "no answer within 5s" in one_line(silent.stderr)
    finally:
        hole.stop()


# -- the commands of this step, through the remote ----------------------------------------

METRICS_JOB = (
    "python3 -c \"import json\nfor i in range(3): print(json.dumps({'monkey': "
    "{'step': i, 'loss': 1.0 / (i + 1)}}))\nimport sys; print('warn', file=sys.stderr)\""
)

# (command, is it a table whose ages may tick between the two runs)
SLICE = [
    ("list jobs", True),
    ("list jobs --json", True),
    ("list jobs --failed", True),
    ("list jobs --limit 1", True),
    ("list providers", False),
    ("list providers --json", False),
    ("info {ok}", False),
    ("info job {bad} --json", False),
    ("info {ok} --json", False),
    ("logs {ok}", False),
    ("logs --stderr {ok}", False),
    ("logs --tail 1 {bad}", False),
    ("logs --attempt 7 {ok}", False),
    ("logs -f {ok}", False),
    ("logs --setup {ok}", False),
    ("metrics {ok}", False),
    ("metrics {ok} --json", False),
    ("metrics {ok} --name loss", False),
    ("metrics {ok} --csv", False),
    ("search warn", False),
    ("search nothing-matches-this", False),
    ("search boom --json", False),
    ("info 99-", False),
    ("logs nosuch", False),
]


def _normal(text: str, ages: bool) -> str:
    """TEXT with the ages and runtimes of a table blanked (they may tick between two runs)."""
    if not ages:
        return text
    text = re.sub(r'"(runtime|since)": [0-9.e+-]+', r'"\1": T', text)
    return re.sub(r"\b\d+(\.\d+)?[smhd]\b", "T", text)


def test_each_command_of_the_slice_gives_the_local_output_and_exit_code(node):
    ok = node.server("run", "-f", "--", "sh", "-c", METRICS_JOB).stderr
    ok_id = re.search(r"job (\S+) queued", ok).group(1)
    bad_id = node.server("run", "--", "sh", "-c", "echo one; echo boom >&2; exit 3").stdout.strip()
    wait_until_ended(node, bad_id)
    node.add_remote()
    # two jobs alike that never start (their provider has no room for 64 CPUs): one acted on
    # here, the other through the remote, each step compared (their ids aside)
    here, there = (node.server("run", "--cpus", "64", "--", "true").stdout.strip() for _ in "ab")
    for action in (
        "pause",
        "pause",
        "resume",
        "resume",
        "cancel",
        "pause",
        "retry",
        "kill job",
        "job cancel",
    ):
        local = node.server(*action.split(), here)
        remote = node.laptop("--remote", "lab", *action.split(), there)
        assert (
            remote.returncode,
            remote.stdout.replace(there, "J"),
            remote.stderr.replace(there, "J"),
        ) == (local.returncode, local.stdout.replace(here, "J"), local.stderr.replace(here, "J")), (
            action
        )
    laptop_jobs_before = node.laptop_files()
    for command, ages in SLICE:
        argv = command.format(ok=ok_id, bad=bad_id).split()
        local = node.server(*argv)
        remote = node.laptop("--remote", "lab", *argv)
        assert (remote.returncode, _normal(remote.stdout, ages), _normal(remote.stderr, ages)) == (
            local.returncode,
            _normal(local.stdout, ages),
            _normal(local.stderr, ages),
        ), command
    # the laptop holds only its remote settings: no job data, no MONKEY_HOME
    assert (
        node.laptop_files()
        == laptop_jobs_before
        == [".config/monkey/lab.token", ".config/monkey/remotes.json"]
    )


def test_remote_use_env_and_option_select_the_remote(node):
    node.add_remote()
    local = node.laptop("list", "jobs")
    assert local.stdout.startswith("no jobs yet")  # the laptop's own (empty) MONKEY_HOME
    node.server("run", "--", "true")
    assert "true" in node.laptop("list", "jobs", MONKEY_REMOTE="lab").stdout
    assert "true" in node.laptop("list", "jobs", "--remote", "lab").stdout
    assert node.laptop("remote", "use", "lab").returncode == 0
    assert "true" in node.laptop("list", "jobs").stdout
    assert node.laptop("list", "jobs", "--remote", "local").stdout.startswith("no jobs yet")
    assert node.laptop("list", "jobs", MONKEY_REMOTE="local").stdout.startswith("no jobs yet")
    listed = node.laptop("remote", "list").stdout
    assert re.search(r"\*\s+lab\s+" + re.escape(node.url), listed)
    assert node.laptop("remote", "use", "--local").returncode == 0
    assert node.laptop("list", "jobs").stdout.startswith("no jobs yet")
    unknown = node.laptop("list", "jobs", "--remote", "nowhere")
    assert unknown.returncode == 1 and "no remote 'nowhere'" in one_line(unknown.stderr)
    assert node.laptop("remote", "remove", "lab").returncode == 0
    assert [f for f in node.laptop_files() if f.startswith(".config")] == [
        ".config/monkey/remotes.json"
    ]


@pytest.mark.parametrize(
    "argv, words",
    [
        (["server", "status"], "server status"),
        (["daemon", "status"], "daemon status"),
    ],
)
def test_commands_not_through_a_remote_yet_say_so_and_exit_2(node, argv, words):
    node.add_remote()
    done = node.laptop("--remote", "lab", *argv)
    assert done.returncode == 2
    assert one_line(done.stderr) == (
        f"monkey {words} does not work through a remote yet; run it on the main node (remote lab)"
    )
    assert done.stdout == ""
    assert node.server("list", "jobs").stdout.startswith("no jobs yet")  # nothing ran there
    assert not (node.laptop_root / ".monkey").exists()  # nor here


# -- owners ---------------------------------------------------------------------------------


def test_another_users_job_is_refused_with_403_and_an_admin_may(node):
    juid = node.server("run", "--", "sleep", "600").stdout.strip()
    admin_name = json.loads(node.server("server", "user", "list", "--json").stdout)[0]["name"]
    bob = node.add_user("bob")
    node.add_remote(bob, name="bob")
    node.add_remote(node.token, name="admin")
    refused = node.laptop("--remote", "bob", "cancel", juid)
    assert refused.returncode == 1
    assert one_line(refused.stderr) == (
        f"monkey: error: job {juid} belongs to {admin_name}; only its owner or an admin may cancel it"
    )
    assert '"state": "cancelled"' not in node.server("info", juid, "--json").stdout
    for action in ("pause", "resume", "retry"):
        other = node.laptop("--remote", "bob", action, juid)
        assert other.returncode == 1 and f"only its owner or an admin may {action} it" in one_line(
            other.stderr
        )
    listed = node.laptop("--remote", "bob", "list", "jobs").stdout.splitlines()
    assert listed[0].split()[:3] == ["JOB", "NAME", "OWNER"] and admin_name in listed[1]
    owners = json.loads(node.laptop("--remote", "bob", "list", "jobs", "--json").stdout)
    assert owners["jobs"][0]["owner"] == admin_name
    status, _, body = raw(
        node, "POST", "/api/v1/call/check_provider", bob, body=b'{"args": ["local"], "kwargs": {}}'
    )
    assert status == 403 and "for admins" in json.loads(body)["error"]
    done = node.laptop("--remote", "admin", "cancel", juid)
    assert done.returncode == 0, done.stderr
    wait_until_ended(node, juid)
    # a single-user server (or this machine) shows no OWNER column
    assert "OWNER" not in node.server("list", "jobs").stdout


# -- logs -f across a server restart -------------------------------------------------------


def _read_until(proc: subprocess.Popen[bytes], want: bytes) -> bytes:
    """What PROC printed up to and including the line WANT."""
    assert proc.stdout is not None
    seen = b""
    while want not in seen:
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.stderr else "it exited"
        seen += line
    return seen


def test_logs_follow_exits_with_the_jobs_code_across_a_server_stop(node, tmp_path):
    """`server stop` (SIGTERM) while a laptop follows a job that ends during the stop, the
    server started again a moment later: the follower prints every line once and exits with
    the job's code, 0 (it said `cannot reach ... (connection refused)` and exited 1). Three
    times: where the job's end falls in the stop varies."""
    node.add_remote()
    for round_ in range(3):
        go = tmp_path / f"go{round_}"
        script = (
            "echo first; "
            f"while [ ! -e {go} ]; do sleep 0.05; done; "
            "for i in 1 2 3; do echo out $i; done"
        )
        juid = node.server("run", "--", "sh", "-c", script).stdout.strip()
        follower = subprocess.Popen(
            [sys.executable, "-m", "monkey", "--remote", "lab", "logs", "-f", juid],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=node.laptop_env,
            bufsize=0,
        )
        seen = _read_until(follower, b"first\n")
        node.proc.send_signal(signal.SIGTERM)  # what `monkey server stop` sends
        go.touch()  # the job ends while the server stops
        node.proc.wait(timeout=60)
        node.start()
        rest, err = follower.communicate(timeout=120)
        assert follower.returncode == 0, err
        lines = (seen + rest).decode().splitlines()
        assert lines == ["first", "out 1", "out 2", "out 3"], err
        assert "cannot reach" not in err.decode()


def test_logs_follow_resumes_across_a_server_killed_and_restarted(node, tmp_path):
    go = tmp_path / "go"
    script = (
        "for i in 1 2 3 4 5; do echo out $i; echo err $i >&2; done; "
        f"while [ ! -e {go} ]; do sleep 0.05; done; "
        "for i in $(seq 6 60); do echo out $i; echo err $i >&2; sleep 0.02; done"
    )
    juid = node.server("run", "--", "sh", "-c", script).stdout.strip()
    node.add_remote()

    def follow(*flags: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "monkey", "--remote", "lab", "logs", "-f", *flags, juid],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=node.laptop_env,
            bufsize=0,
        )  # unbuffered: communicate() reads the rest from the fd

    follower, tailing = follow(), follow("--tail", "3")
    seen = _read_until(follower, b"err 5\n")
    tail_seen = _read_until(tailing, b"err 5\n")  # the last 3 lines: all of stderr's
    node.kill()  # SIGKILL mid-stream, while the job waits
    node.start()
    go.touch()
    rest, err = follower.communicate(timeout=120)
    assert follower.returncode == 0, err
    tail_rest, tail_err = tailing.communicate(timeout=120)
    assert tailing.returncode == 0, tail_err
    # no line lost or doubled, each stream in order (a follow reads stdout and stderr as they
    # grow, so their interleaving is by the reads' timing, as locally)
    lines = (seen + rest).decode().splitlines()
    assert [x for x in lines if x.startswith("out")] == [f"out {i}" for i in range(1, 61)], (
        seen,
        rest,
        err,
    )
    assert [x for x in lines if x.startswith("err")] == [f"err {i}" for i in range(1, 61)]
    assert len(lines) == 120
    assert "connection lost; reconnecting" in err.decode()
    # from a tail: what it skipped stays skipped after the resume
    shown = (tail_seen + tail_rest).decode().splitlines()
    assert [x for x in shown if x.startswith("out")] == [f"out {i}" for i in range(6, 61)], shown
    assert [x for x in shown if x.startswith("err")] == [f"err {i}" for i in range(3, 61)], shown


def test_server_start_status_stop_detached(home, tmp_path):
    n = MainNode(home, tmp_path)
    port = n.port
    started = n.server("server", "start", "--bind", f"127.0.0.1:{port}")
    assert started.returncode == 0, started.stderr
    assert started.stdout.startswith("server running (pid ")
    assert f"server: https://127.0.0.1:{port}" in started.stdout and "--token" in started.stdout
    status = n.server("server", "status")
    assert status.returncode == 0 and f"at https://127.0.0.1:{port}" in status.stdout
    assert n.server("daemon", "status").returncode == 0  # the core runs beside it
    again = n.server("server", "start")
    assert again.returncode == 1 and "already running" in one_line(again.stderr)
    busy = MainNode(home, tmp_path / "other")
    assert busy.server("server", "run", "--bind", f"127.0.0.1:{port}").returncode == 1
    stopped = n.server("server", "stop")
    assert stopped.returncode == 0 and stopped.stdout.startswith("server stopped (pid ")
    assert n.server("server", "status").returncode == 3
    # the port is taken by another program: one line saying so, nothing left running
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        failed = n.server("server", "start", "--bind", f"127.0.0.1:{taken.getsockname()[1]}")
        assert failed.returncode == 1
        assert one_line(failed.stderr).startswith("monkey: error: the server could not start: ")
        assert "address already in use" in failed.stderr.lower()
    assert n.server("server", "status").returncode == 3
    bad = n.server("server", "start", "--bind", "nowhere")
    assert bad.returncode == 1 and one_line(bad.stderr) == (
        "monkey: error: --bind 'nowhere': give HOST:PORT, e.g. 127.0.0.1:8443 or 0.0.0.0:8443"
    )


def test_plain_http_on_loopback_works_without_a_certificate(home, tmp_path):
    n = MainNode(home, tmp_path)
    n.url = f"http://127.0.0.1:{n.port}"
    try:
        welcome = n.start("--no-tls")
        assert "certificate" not in welcome and f"server: {n.url}" in welcome
        token = re.search(r"--token (\S+)", welcome).group(1)
        added = n.laptop("remote", "add", "lab", n.url, "--token", token)
        assert added.returncode == 0, added.stderr
        assert n.laptop("--remote", "lab", "list", "jobs").stdout.startswith("no jobs yet")
    finally:
        n.close()


def test_server_stop_while_a_client_follows_ends_the_server_and_the_follow_goes_on(node):
    juid = node.server("run", "--", "sh", "-c", "echo first; sleep 600").stdout.strip()
    node.add_remote()
    follower = subprocess.Popen(
        [sys.executable, "-m", "monkey", "--remote", "lab", "logs", "-f", juid],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=node.laptop_env,
        bufsize=0,
    )
    assert follower.stdout is not None and follower.stdout.readline() == b"first\n"
    node.kill(signal.SIGTERM)  # a graceful stop does not wait for the follow to end
    assert node.proc is not None and node.proc.returncode is not None
    node.start()
    assert node.laptop("--remote", "lab", "cancel", juid).returncode == 0
    rest, err = follower.communicate(timeout=120)
    assert b"first" not in rest and follower.returncode == 130, err  # a cancelled job's exit status
    assert b"connection lost; reconnecting" in err


def test_the_main_node_starts_its_core_again_when_it_dies(node, tmp_path):
    """The core the server started, SIGKILLed: the server reaps it (no zombie) and starts
    another within seconds, so a job submitted meanwhile runs; `server status` counts it."""
    pid_file = node.home / "daemon.pid"
    old = int(pid_file.read_text())
    os.kill(old, signal.SIGKILL)

    def restarted() -> bool:
        try:
            return int(pid_file.read_text()) != old
        except (OSError, ValueError):
            return False

    wait_for(restarted, timeout=30, what="a new core")  # nobody asked: the server did
    wait_for(lambda: not Path(f"/proc/{old}").exists(), timeout=10, what="the old core reaped")
    status = node.server("server", "status").stdout
    assert re.search(r"core: running \(pid \d+\); restarted by the server 1 time\(s\)", status)
    node.add_remote()
    juid = node.laptop("--remote", "lab", "run", "--", "true").stdout.strip()
    wait_for(
        lambda: '"state": "succeeded"' in node.server("info", juid, "--json").stdout,
        timeout=60,
        what="a job to run on the new core",
    )
