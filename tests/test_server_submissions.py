"""What a plain user of a main node may submit and read back (issue 41, findings 1, 5 and 7):
a gathered submission is checked as strictly as one made on the main node, a job's stored
spec never leads a read out of its own folder, a malformed stored spec breaks no reader, and
a job joins only a sweep of its submitter's own (or an admin's doing)."""

from __future__ import annotations

import io
import json
import os
import sqlite3
import subprocess
import sys
import tarfile

import pytest
from mainnode import MainNode, node, wait_until_ended  # noqa: F401 - node: a fixture
from test_server import one_line, raw

pytestmark = pytest.mark.system

DIGEST = "0" * 64
SPEC = {
    "file": "/home/bob/proj/job.yml",
    "name": "keep",
    "env_type": "none",
    "env_file": None,
    "env": {},
    "install_script": None,
    "code": {"path": ".", "ignore": []},
    "persist": [{"name": "out", "path": "out"}],
    "data": [],
    "providers": {},
    "provider_options": {},
}


def gathered(spec: object) -> dict[str, object]:
    """A submission as a client gathers it (its blobs never sent), with SPEC."""
    fields = {
        "env": {},
        "snapshot": DIGEST,
        "workdir": "/home/bob/proj",
        "datasets": [],
        "git": {},
        "python": "3.12.0",
        "retries": 0,
        "spec": spec,
        "outputs": [],
        "packages": DIGEST,
    }
    return {"fields": fields, "name": "keep", "secrets": {}}


def call(node: MainNode, token: str, method: str, *args: object, **kwargs: object):
    """(status, answer) of facade METHOD through the API with TOKEN."""
    body = json.dumps({"args": list(args), "kwargs": kwargs}).encode()
    status, _, answer = raw(node, "POST", f"/api/v1/call/{method}", token, body=body)
    return status, json.loads(answer)


def jobs_recorded(node: MainNode) -> int:
    with sqlite3.connect(node.home / "monkey.db") as db:
        return db.execute("SELECT COUNT(*) FROM jobs").fetchone()[0]


def forge_spec(node: MainNode, juid: str, spec: object) -> None:
    """Write SPEC as job JUID's stored spec, as only the store's own file could."""
    with sqlite3.connect(node.home / "monkey.db") as db:
        db.execute(
            "INSERT OR REPLACE INTO job_specs(juid, spec) VALUES (?, ?)", (juid, json.dumps(spec))
        )


def web_cookie(node: MainNode, token: str) -> str:
    """A Monkey Web session of TOKEN's user, as its Cookie header."""
    status, link = call(node, token, "web_link")
    assert status == 200, link
    status, headers, _ = raw(node, "GET", link)
    assert status == 200
    return headers["set-cookie"].split(";")[0]


def ended_job(node: MainNode) -> str:
    done = node.server("run", "--", "true")
    assert done.returncode == 0, done.stderr
    juid = done.stdout.strip()
    wait_until_ended(node, juid)
    return juid


def test_a_gathered_spec_naming_a_folder_out_of_the_job_is_refused_and_nothing_recorded(node):
    bob = node.add_user("bob")
    for name in ("/abs", "../..", "a/../../x"):
        spec = {**SPEC, "persist": [{"name": name, "path": "out"}]}
        status, answer = call(node, bob, "run", ["true"], gathered=gathered(spec))
        assert status == 400, answer
        assert one_line(answer["error"]).startswith(
            f"gathered spec.persist[0].name: {name!r} must be 1 to 200 letters"
        )
    for field, value, said in (
        ("persist", [{"name": "out", "path": "../../server"}], "gathered spec.persist[0].path"),
        ("persist", [{"name": "out", "path": "out", "more": 1}], "gathered spec.persist[0].more"),
        ("data", [{"name": "d", "path": "/etc", "type": "copy"}], "gathered spec.data[0].path"),
        ("env_file", "/etc/passwd", "gathered spec.env_file"),
        ("code", {"path": "a\0b", "ignore": []}, "run: a string holds NUL"),  # at the door
        (
            "persist",
            [{"name": f"n{i}", "path": f"p{i}"} for i in range(101)],
            "gathered spec.persist",
        ),
        ("shell", "rm -rf /", "gathered spec.shell: unknown key"),
    ):
        status, answer = call(node, bob, "run", ["true"], gathered=gathered({**SPEC, field: value}))
        assert status == 400 and one_line(answer["error"]).startswith(said), answer
    assert jobs_recorded(node) == 0
    # a well-made one only lacks its blobs, which the client then sends
    status, answer = call(node, bob, "run", ["true"], gathered=gathered(SPEC))
    assert status == 409 and answer["missing"], answer


def test_a_forged_stored_spec_or_a_link_a_job_made_never_serves_the_main_nodes_files(node):
    bob = node.add_user("bob")
    juid = ended_job(node)
    server = node.home / "server"
    assert (server / "key.pem").is_file() and (node.home / "monkey.db").is_file()
    saved = node.home / "runs" / juid / "persist"
    (saved / "keep" / "sub").mkdir(parents=True)
    (saved / "keep" / "sub" / "w.txt").write_text("w1\n")
    os.symlink("/", saved / "keep" / "root")  # what a job could leave in its folder
    os.symlink(server, saved / "keep" / "sub" / "srv")
    os.symlink("/", saved / "linked")  # its persisted folder itself a link
    forge_spec(
        node,
        juid,
        {
            **SPEC,
            "persist": [
                {"name": str(server), "path": "a"},
                {"name": "../../../server", "path": "b"},
                {"name": "../../..", "path": "c"},
                {"name": "linked", "path": "d"},
                {"name": "keep", "path": "e"},
            ],
        },
    )
    status, _, body = raw(node, "GET", f"/api/v1/persisted/{juid}", bob)
    assert status == 200
    with tarfile.open(fileobj=io.BytesIO(body)) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert sorted(members) == ["e", "e/sub", "e/sub/w.txt"]
    assert all(m.isdir() or m.isfile() for m in members.values())
    cookie = web_cookie(node, bob)
    home = str(node.home).lstrip("/")
    for path in (
        f"persisted/keep/root/{home}/server/key.pem",
        "persisted/keep/sub/srv/key.pem",
        f"persisted/linked/{home}/monkey.db",
        "persisted/linked.tar.gz",
        "persisted/server/key.pem",
        "persisted/server.tar.gz",
        "persisted/..%2F..%2F..%2Fserver/key.pem",
    ):
        status, _, page = raw(node, "GET", f"/web/jobs/{juid}/{path}", headers={"Cookie": cookie})
        assert status in (400, 404), path
        assert b"PRIVATE KEY" not in page and b"SQLite format" not in page, path
    status, _, page = raw(
        node, "GET", f"/web/jobs/{juid}/persisted/keep/sub/w.txt", headers={"Cookie": cookie}
    )
    assert (status, page) == (200, b"w1\n")


MALFORMED = [
    7,
    "persist",
    ["persist"],
    {"persist": 5, "data": "x", "env": [1], "code": 3, "providers": 1, "env_type": 5},
    {"persist": [1, "out", {"name": 3}, {"path": "x"}], "data": [{"name": "d"}]},
]


def test_a_malformed_stored_spec_breaks_no_reader(node):
    bob = node.add_user("bob")
    node.add_remote(bob, name="bob")
    cookie = web_cookie(node, bob)
    juid = ended_job(node)
    for spec in MALFORMED:
        forge_spec(node, juid, spec)
        for done in (node.server("info", juid), node.laptop("--remote", "bob", "info", juid)):
            assert done.returncode == 0 and juid in done.stdout, (spec, done.stderr)
        status, _, _ = raw(node, "GET", f"/api/v1/persisted/{juid}", bob)
        assert status == 200, spec
        status, _, page = raw(node, "GET", f"/web/jobs/{juid}", headers={"Cookie": cookie})
        assert status == 200 and juid.encode() in page, spec
        status, answer = call(node, bob, "dashboard_state")
        assert status == 200, (spec, answer)
        status, answer = call(node, bob, "rerun", juid, start_core=False)
        assert status == 200, (spec, answer)


JOIN = (
    "import sys\n"
    "from monkey import Monkey\n"
    "from monkey.models import MonkeyError\n"
    "try:\n"
    "    job = Monkey(remote=sys.argv[1]).run(['true'], sweep=sys.argv[2], workdir=sys.argv[3])\n"
    "except MonkeyError as exc:\n"
    "    sys.exit(f'error: {exc}')\n"
    "print(job.juid)\n"
)


def laptop_python(node: MainNode, *args: str) -> subprocess.CompletedProcess[str]:
    """JOIN with ARGS, a user's script on the laptop."""
    return subprocess.run(
        [sys.executable, "-c", JOIN, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=node.laptop_env,
    )


def test_a_job_joins_or_waits_for_only_its_own_users_sweeps_and_jobs_or_an_admins(node, tmp_path):
    work = tmp_path / "anas-project"
    work.mkdir()
    (work / "wait.py").write_text("import time\ntime.sleep(600)\n")
    for user in ("ana", "bob"):
        node.add_remote(node.add_user(user), name=user)
    node.add_remote(node.token, name="lab")
    done = node.laptop(
        "--remote",
        "ana",
        "sweep",
        "-w",
        str(work),
        "--grid",
        "x=1,2",
        "--",
        "python3",
        "wait.py",
        "{x}",
    )
    assert done.returncode == 0, done.stderr
    sid = done.stdout.strip()
    before = json.loads(node.server("sweep", "status", sid, "--json").stdout)
    jobs = jobs_recorded(node)
    joined = laptop_python(node, "bob", sid, str(work))
    assert joined.returncode == 1
    assert one_line(joined.stderr) == (
        f"error: sweep {sid} has jobs of ana; only their owner or an admin may add jobs to it "
        "(submit without the sweep, or start your own with `monkey sweep`)"
    )
    squat = laptop_python(node, "bob", "sw-99-01-01-001", str(work))  # a sweep to come
    assert one_line(squat.stderr).startswith("error: no sweep has the id 'sw-99-01-01-001'")
    first = min(j["job"] for j in before["jobs"])
    for ref in (first, sid):  # waiting for her jobs would hold them: she could not rm them
        waits = node.laptop("--remote", "bob", "run", "-w", str(work), "--after", ref, "--", "true")
        assert waits.returncode == 1
        assert one_line(waits.stderr) == (
            f"monkey: error: --after/--after-any: job {first} belongs to ana; a job may wait "
            "only for jobs of your own (an admin may wait for any)"
        )
    assert jobs_recorded(node) == jobs
    after = json.loads(node.server("sweep", "status", sid, "--json").stdout)
    assert [j["job"] for j in after["jobs"]] == [j["job"] for j in before["jobs"]]
    # rerunning her cells into her sweep is joining it too
    rerun = node.laptop("--remote", "bob", "rerun", "--sweep", sid, "--in-place")
    assert rerun.returncode == 1 and "ana" in one_line(rerun.stderr)
    cancelled = node.laptop("--remote", "ana", "sweep", "cancel", sid)
    assert cancelled.returncode == 0, cancelled.stderr
    admin = laptop_python(node, "lab", sid, str(work))
    assert admin.returncode == 0, admin.stderr
    listed = json.loads(node.server("sweep", "status", sid, "--json").stdout)["jobs"]
    assert admin.stdout.strip() in [j["job"] for j in listed]
    node.server("cancel", admin.stdout.strip())


def test_a_log_a_job_made_a_link_is_never_read_through_it(node):
    bob = node.add_user("bob")
    node.add_remote(bob, name="bob")
    done = node.server("run", "--", "sh", "-c", "echo out; echo err >&2")
    juid = done.stdout.strip()
    wait_until_ended(node, juid)
    run_dir = node.home / "runs" / juid / "1"
    for name in ("stdout.log", "stderr.log"):  # as the job could have done while it ran
        (run_dir / name).unlink()
    os.symlink(node.home / "server" / "key.pem", run_dir / "stdout.log")
    os.symlink(node.home / "monkey.db", run_dir / "stderr.log")
    for args in (("logs", juid), ("logs", juid, "--tail", "5"), ("logs", juid, "--stderr")):
        for done in (node.server(*args), node.laptop("--remote", "bob", *args)):
            assert done.returncode == 0, done.stderr
            assert "PRIVATE KEY" not in done.stdout and "SQLite" not in done.stdout, args
