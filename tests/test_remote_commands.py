"""Commands through a remote (issue 27, the tracking reads and the acting commands with
rights, and owners): each run on a laptop against a real TLS server gives the same stdout,
stderr and exit code as the same command run on the main node; files are written on the
laptop; acting on another user's job or sweep is refused with one line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import wait_for
from mainnode import MainNode, node, wait_until_ended  # noqa: F401 - node: a fixture

pytestmark = pytest.mark.system

TRAIN = (
    "import json, sys\n"
    "lr = float(sys.argv[1])\n"
    "for i in range(4): print(json.dumps({'monkey': {'step': i, 'loss': lr / (i + 1), "
    "'acc': 1 - lr / (i + 2)}}))\n"
)


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


def _normal(text: str) -> str:
    """TEXT with ages and runtimes blanked (they may tick between the two runs)."""
    text = re.sub(r'"(runtime|since)": [0-9.e+-]+', r'"\1": T', text)
    return re.sub(r"\b\d+(\.\d+)?[smhd]\b", "T", text)


def _project(tmp: Path) -> Path:
    work = tmp / "project"
    work.mkdir(exist_ok=True)
    (work / "train.py").write_text(TRAIN)
    (work / "wait.py").write_text("import time\ntime.sleep(600)\n")
    return work


def _sweep(node: MainNode, work: Path, *extra: str, script: str = "train.py") -> str:
    """A two-run sweep of SCRIPT on the main node ranked on loss (finished, for train.py);
    its id."""
    done = node.server(
        "sweep",
        "-w",
        str(work),
        "--grid",
        "lr=0.1,0.5",
        "--metric",
        "loss",
        *extra,
        "--",
        "python3",
        script,
        "{lr}",
    )
    assert done.returncode == 0, done.stderr
    sid = done.stdout.strip()
    if script != "train.py":
        return sid

    def finished() -> bool:
        status = json.loads(node.server("sweep", "status", sid, "--json").stdout)
        return status["state"] == "finished"

    wait_for(finished, timeout=120, every=0.3, what=f"sweep {sid} to finish")
    return sid


def _same(node: MainNode, command: str, fill: dict[str, str], outs: dict[str, Path]) -> None:
    """COMMAND (FILL's fields, {out}: a folder) gives the same here and through the remote."""
    local = node.server(*command.format(**fill, out=outs["srv"]).split())
    remote = node.laptop("--remote", "lab", *command.format(**fill, out=outs["lap"]).split())

    def seen(text: str, out: Path) -> str:
        return _normal(text.replace(str(out), "OUT"))

    assert (
        remote.returncode,
        seen(remote.stdout, outs["lap"]),
        seen(remote.stderr, outs["lap"]),
    ) == (
        local.returncode,
        seen(local.stdout, outs["srv"]),
        seen(local.stderr, outs["srv"]),
    ), command


# (command, with {a} {b}: two runs, {s}: the sweep)
READS = [
    "list sweeps",
    "list sweeps --json",
    "sweep status {s}",
    "sweep status {s} --json",
    "sweep status nosuch",
    "compare {a} {b}",
    "compare {a} {b} --json",
    "compare {a} {b} --csv",
    "compare {a} {b} --sort loss --reverse",
    "compare --sweep {s}",
    "compare --sweep {s} --json",
    "compare --sweep {s} --sort acc",
    "compare --sweep {s} {a}",
    "compare",
    "diff {a} {b}",
    "diff {a} {b} --json",
    "diff {a} nosuch",
    "metrics {a}",
    "metrics {a} --plot",
    "metrics {a} --plot --x time --name loss",
    "metrics {a} --csv",
    "metrics {a} --json",
    "metrics {a} --name nosuch",
    "plot {a} -m nosuch -o {out}/x.png",
    "plot {a} --smooth 2 -m loss -o {out}/x.png",
    "plot {a} -m loss -o {out}/nosuchdir/x.png",
    "plot {a} -m loss -o {out}/x.txt",
    "plot --name nomatch* -m loss -o {out}/x.png",
    "report -o {out}/r.html",
    "report {s} --jobs {a} -o {out}/r.html",
]


def test_tracking_reads_through_a_remote_give_the_local_output(node, tmp_path):
    sid = _sweep(node, _project(tmp_path))
    a, b = (
        j["job"] for j in json.loads(node.server("sweep", "status", sid, "--json").stdout)["jobs"]
    )
    node.add_remote()
    outs = {"srv": tmp_path / "srv-out", "lap": tmp_path / "laptop" / "out"}
    for d in outs.values():
        d.mkdir(parents=True)
    before = node.laptop_files()
    for command in READS:
        _same(node, command, {"a": a, "b": b, "s": sid}, outs)
    assert node.laptop_files() == before  # nothing written on the laptop but its settings


def test_plot_and_report_are_drawn_and_written_on_the_laptop(node, tmp_path):
    sid = _sweep(node, _project(tmp_path))
    a, b = (
        j["job"] for j in json.loads(node.server("sweep", "status", sid, "--json").stdout)["jobs"]
    )
    node.add_remote()
    srv, lap = tmp_path / "srv-out", tmp_path / "laptop" / "out"
    srv.mkdir()
    lap.mkdir(parents=True)
    cases = [
        ("plot {a} {b} -m loss -m acc -o {out}/p.png", "p.png"),
        ("plot --sweep {s} --smooth 0.5 --log-y -o {out}/s.png", "s.png"),
        ("plot --name * -m loss --x time -o {out}/n.png", "n.png"),
        ("report {s} -o {out}/r.html", "r.html"),
        ("report --jobs {a} {b} -o {out}/j.html", "j.html"),
        ("report --name * -o {out}/n.html", "n.html"),
    ]
    for command, name in cases:
        fill = {"a": a, "b": b, "s": sid}
        local = node.server(*command.format(**fill, out=srv).split())
        remote = node.laptop("--remote", "lab", *command.format(**fill, out=lap).split())
        assert local.returncode == remote.returncode == 0, (command, remote.stderr)
        assert remote.stdout == f"{lap / name}\n" and local.stdout == f"{srv / name}\n"
        assert remote.stderr == local.stderr == ""
        if name.endswith(".html"):  # the same report, rendered here from the server's data
            assert (lap / name).read_text() == (srv / name).read_text(), command
        else:
            assert (lap / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the main node wrote nothing but what its own commands wrote
    assert sorted(p.name for p in srv.iterdir()) == sorted(n for _, n in cases)
    assert not list(node.home.rglob("*.png")) and not list(node.home.rglob("*.html"))


def test_sweep_actions_need_the_owner_of_its_jobs_or_an_admin(node, tmp_path):
    work = _project(tmp_path)
    # two sweeps alike of jobs that wait: one steered here, the other through the remote,
    # each step compared (their ids aside) once both have settled
    here, there = (_sweep(node, work, script="wait.py") for _ in "ab")
    admin_name = json.loads(node.server("server", "user", "list", "--json").stdout)[0]["name"]
    bob = node.add_user("bob")
    node.add_remote(bob, name="bob")
    node.add_remote(node.token, name="lab")
    # reads are open to every user
    status = node.laptop("--remote", "bob", "sweep", "status", there)
    assert status.stdout == node.server("sweep", "status", there).stdout
    assert there in node.laptop("--remote", "bob", "list", "sweeps").stdout
    before = node.server("sweep", "status", there, "--json").stdout
    for action in ("cancel", "pause", "resume", "retry"):
        refused = node.laptop("--remote", "bob", "sweep", action, there)
        assert refused.returncode == 1, refused.stderr
        assert one_line(refused.stderr) == (
            f"monkey: error: sweep {there} has jobs of {admin_name}; only their owner or an "
            f"admin may {action} it"
        )
    assert node.server("sweep", "status", there, "--json").stdout == before
    for action, settled in (
        ("pause", {"paused"}),
        ("resume", {"queued", "running"}),
        ("cancel", {"cancelled"}),
    ):
        local = node.server("sweep", action, here)
        remote = node.laptop("--remote", "lab", "sweep", action, there)
        assert (remote.returncode, remote.stdout.replace(there, "S"), remote.stderr) == (
            local.returncode,
            local.stdout.replace(here, "S"),
            local.stderr.replace(here, there),
        ), action
        for sid in (here, there):
            _settle(node, sid, settled)
    # the events of the sweep's jobs name who acted through the remote: the admin
    run = json.loads(node.server("sweep", "status", there, "--json").stdout)["jobs"][0]["job"]
    events = json.loads(node.server("info", run, "--json").stdout)["events"]
    acted = [(e["detail"], e["actor"]) for e in events if e["kind"] in ("user", "request")]
    assert ("resume", admin_name) in acted and ("cancel", admin_name) in acted, acted


def _settle(node: MainNode, sid: str, settled: set[str]) -> None:
    wait_for(lambda: _states(node, sid) <= settled, timeout=120, what=f"sweep {sid}: {settled}")


def _states(node: MainNode, sid: str) -> set[str]:
    return {
        j["state"] for j in json.loads(node.server("sweep", "status", sid, "--json").stdout)["jobs"]
    }


# -- acting commands with rights: rm, gc, verify, du, provider check, instances -------------


def _twins(node: MainNode, *argv: str) -> tuple[str, str]:
    """Two ended jobs alike (ARGV) on the main node: one acted on here, one there."""
    juids = tuple(node.server("run", *argv).stdout.strip() for _ in "ab")
    for juid in juids:
        wait_until_ended(node, juid)
    return juids  # type: ignore[return-value]


def _same_twins(node: MainNode, argv: list[str], here: str, there: str) -> None:
    """ARGV ("J": the job) on HERE locally and on THERE through the remote say the same
    (the sizes of their folders, which differ by a byte or so, aside)."""
    local = node.server(*[here if w == "J" else w for w in argv])
    remote = node.laptop("--remote", "lab", *[there if w == "J" else w for w in argv])
    assert (
        remote.returncode,
        _sizeless(remote.stdout.replace(there, "J")),
        _sizeless(remote.stderr.replace(there, "J")),
    ) == (
        local.returncode,
        _sizeless(local.stdout.replace(here, "J")),
        _sizeless(local.stderr.replace(here, "J")),
    ), argv


def _sizeless(text: str) -> str:
    return re.sub(r"\b\d+(\.\d+)? ([kMG]?B)\b", r"N \2", text)


def test_disk_and_instance_commands_through_a_remote_give_the_local_output(node, tmp_path):
    here, there = _twins(node, "-w", str(_project(tmp_path)), "--", "python3", "train.py", "1")
    node.add_remote()
    node.server("gc", "--grace", "0s")  # what a first gc frees, freed: both see the same
    outs = {"srv": tmp_path, "lap": tmp_path}
    for command in (
        "du",
        "du --json",
        "du --hosts",
        "du --hosts --json",
        "verify",
        "verify {a}",
        "verify nosuch",
        "gc",
        "gc --grace 0s",
        "gc --grace soon",
        "provider check local",
        "provider check nosuch",
        "create instance --provider local",
        "create instance --provider nosuch",
        "delete instance nosuch",
        "rm",
        "rm nosuch --yes",
        "rm {a}",
        "rm --failed --yes",
    ):
        _same(node, command, {"a": here}, outs)
    busy = [node.server("run", "--", "sleep", "600").stdout.strip()]
    _same(node, "rm {busy} --yes", {"busy": busy[0]}, outs)  # queued or running: refused
    wait_for(lambda: '"state": "running"' in node.server("info", busy[0], "--json").stdout)
    _same(node, "rm {busy} --yes", {"busy": busy[0]}, outs)  # refused as locally: still there
    assert node.server("info", busy[0]).returncode == 0
    _same_twins(node, ["rm", "J", "--yes"], here, there)  # deleted, each with its folder
    for juid in (here, there):
        gone = node.server("info", juid)
        assert gone.returncode == 1 and "no job" in gone.stderr
        assert not (node.home / "runs" / juid).exists()
    for juid in busy:
        node.server("cancel", juid)
    # provider add is run by the main node (tests/test_remote_provider_add.py): added there
    added = node.laptop("--remote", "lab", "provider", "add", "ssh", "gpus", "--host", "h1")
    assert added.returncode == 0, added.stderr
    assert "gpus" in node.server("list", "providers").stdout
    assert node.laptop_files() == [".config/monkey/lab.token", ".config/monkey/remotes.json"]


def test_rm_is_the_owners_or_an_admins_and_gc_verify_instances_are_admins(node):
    from monkey.store import Store

    mine, theirs = _twins(node, "--", "true")
    admin_name = json.loads(node.server("server", "user", "list", "--json").stdout)[0]["name"]
    bob = node.add_user("bob")
    Store(node.home / "monkey.db").set_owner([mine], "bob")
    node.add_remote(bob, name="bob")
    node.add_remote(node.token, name="lab")
    # bob removes his own job, not the admin's (nor both at once: nothing deleted then)
    for argv in (["rm", theirs, "--yes"], ["rm", mine, theirs, "--yes"]):
        refused = node.laptop("--remote", "bob", *argv)
        assert refused.returncode == 1, (argv, refused.stderr)
        assert one_line(refused.stderr) == (
            f"monkey: error: job {theirs} belongs to {admin_name}; only its owner or an admin "
            "may rm it"
        )
    assert node.server("info", mine).returncode == node.server("info", theirs).returncode == 0
    # a selection by filters (no job named) is of bob's own jobs only
    done = node.laptop("--remote", "bob", "rm", "--older-than", "0s", "--yes")
    assert done.returncode == 0 and done.stdout.startswith("deleted 1 jobs, freed "), done
    assert node.server("info", mine).returncode == 1
    assert node.laptop("--remote", "bob", "rm", "--older-than", "0s").stdout == "no job matches\n"
    # admins' commands
    for argv, what in (
        (["gc"], "gc"),
        (["verify"], "verify"),
        (["provider", "check", "local"], "check provider"),
        (["provider", "add", "ssh", "gpus", "--host", "h1"], "provider add"),
        (["create", "instance", "--provider", "local"], "create instance"),
        (["delete", "instance", "x"], "delete instance"),
    ):
        refused = node.laptop("--remote", "bob", *argv)
        assert refused.returncode == 1, (argv, refused.stderr)
        assert one_line(refused.stderr) == (
            f"monkey: error: {what} is for admins of this server; ask one"
        ), argv
    # reads are every user's
    assert node.laptop("--remote", "bob", "du").stdout == node.server("du").stdout
    # an admin removes anyone's job
    done = node.laptop("--remote", "lab", "rm", theirs, "--yes")
    assert done.returncode == 0, done.stderr
    assert node.server("info", theirs).returncode == 1


# -- owners: list jobs --mine/--owner, and who acted in a job's events --------------------


def _listed(done) -> list[str]:
    assert done.returncode == 0, done.stderr
    return [j["job"] for j in json.loads(done.stdout)["jobs"]]


def test_list_jobs_mine_and_owner_here_and_through_a_remote(node):
    from monkey.store import Store
    from monkey.store.db import local_user

    admins, bobs = _twins(node, "--", "true")
    Store(node.home / "monkey.db").set_owner([bobs], "bob")
    admin_name = json.loads(node.server("server", "user", "list", "--json").stdout)[0]["name"]
    node.add_remote(node.add_user("bob"), name="bob")
    node.add_remote(node.token, name="lab")
    assert _listed(node.laptop("--remote", "bob", "list", "jobs", "--mine", "--json")) == [bobs]
    assert _listed(node.laptop("--remote", "lab", "list", "jobs", "--mine", "--json")) == [admins]
    for who, juid in (("bob", bobs), (admin_name, admins), ("nobody", None)):
        argv = ["list", "jobs", "--owner", who]
        local, remote = node.server(*argv), node.laptop("--remote", "bob", *argv)
        assert _listed(node.laptop("--remote", "bob", *argv, "--json")) == ([juid] if juid else [])
        assert _listed(node.server(*argv, "--json")) == ([juid] if juid else [])
        if juid:  # through the remote, the OWNER column (a server with several users)
            assert remote.stdout.splitlines()[1].split()[:3] == [juid, "true", who]
            assert local.stdout.splitlines()[1].split()[:3] == [juid, "true", "succeeded"]
        else:
            assert remote.stdout == local.stdout == "no jobs match\n"
    # here, --mine is this machine's user's
    mine = _listed(node.server("list", "jobs", "--mine", "--json"))
    assert mine == ([admins] if local_user() == admin_name else [])
    both = node.server("list", "jobs", "--mine", "--owner", "bob")
    assert both.returncode == 2 and "not allowed with argument" in one_line(both.stderr)


def test_the_events_of_a_job_name_who_acted(node):
    from monkey.store import Store
    from monkey.store.db import local_user

    bobs, others = (node.server("run", "--", "sleep", "600").stdout.strip() for _ in "ab")
    Store(node.home / "monkey.db").set_owner([bobs, others], "bob")
    admin_name = json.loads(node.server("server", "user", "list", "--json").stdout)[0]["name"]
    node.add_remote(node.add_user("bob"), name="bob")
    node.add_remote(node.token, name="lab")
    for argv in (["pause", bobs], ["resume", bobs], ["cancel", bobs]):
        done = node.laptop("--remote", "bob", *argv)
        assert done.returncode == 0, done.stderr
    wait_until_ended(node, bobs)
    assert node.laptop("--remote", "lab", "cancel", others).returncode == 0
    wait_until_ended(node, others)
    assert node.laptop("--remote", "bob", "retry", others).returncode == 0
    assert node.server("cancel", others).returncode == 0  # here: this machine's user

    def acted(juid: str) -> list[tuple[str, str | None]]:
        events = json.loads(node.server("info", juid, "--json").stdout)["events"]
        return [(e["detail"], e["actor"]) for e in events if e["kind"] in ("user", "request")]

    assert [a for a in acted(bobs) if a[0] in ("pause", "resume", "cancel")] == [
        ("pause", "bob"),
        ("resume", "bob"),
        ("cancel", "bob"),
    ]
    assert [a for a in acted(others) if a[0] in ("retry", "cancel")] == [
        ("cancel", admin_name),
        ("retry", "bob"),
        ("cancel", local_user()),
    ]
    # `info` shows them, here and through the remote alike
    shown = node.server("info", bobs).stdout
    assert re.search(r"paused -> queued\s+resume \(by bob\)", shown), shown
    assert re.search(r"request\s+cancel \(by bob\)", shown), shown
    assert node.laptop("--remote", "bob", "info", bobs).stdout == shown


def test_export_through_a_remote_writes_the_same_files_on_the_laptop(node, tmp_path):
    """The rows come from the server a page of jobs at a time (a sweep of 22 runs spans two
    pages: its row is written once); the SQLite file and CSV files are written here."""
    cells = ",".join(str(i) for i in range(22))
    done = node.server(
        "sweep", "-w", str(_project(tmp_path)), "--grid", f"x={cells}", "--", "echo", "{x}"
    )
    assert done.returncode == 0, done.stderr
    sid = done.stdout.strip()
    wait_for(
        lambda: (
            json.loads(node.server("sweep", "status", sid, "--json").stdout)["state"] == "finished"
        ),
        timeout=180,
        every=0.5,
        what="the sweep to finish",
    )
    node.add_remote()
    outs = {"srv": tmp_path / "srv-out", "lap": tmp_path / "laptop" / "out"}
    for d in outs.values():
        d.mkdir(parents=True)
    for command in (
        "export --to {out}/runs.db --csv {out}/csv",
        "export --sweep {s} --name *-1* --csv {out}/csv1",
        "export --sweep {s} --to {out}/runs.db --json",  # an earlier export, updated
        "export --sweep {s} last --to {out}/x.db",
        "export --to {out}/nosuch/x.db",
        "export --sweep nosuch --to {out}/x.db",
        "export",
    ):
        _same(node, command, {"s": sid}, outs)
    for name in ("csv", "csv1"):
        for table in sorted(p.name for p in (outs["srv"] / name).iterdir()):
            here = (outs["lap"] / name / table).read_text()
            assert here == (outs["srv"] / name / table).read_text(), table
    swept = (outs["lap"] / "csv" / "sweeps.csv").read_text().splitlines()
    assert len(swept) == 2 and swept[1].startswith(f"{sid},")  # its header and its one row
    import sqlite3

    def tables(db: Path) -> dict[str, list[tuple]]:
        with sqlite3.connect(db) as con:
            names = [
                r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            ]
            return {n: sorted(map(repr, con.execute(f"SELECT * FROM [{n}]"))) for n in names}

    assert tables(outs["lap"] / "runs.db") == tables(outs["srv"] / "runs.db")
    assert not list(node.home.rglob("*.csv"))


def test_completion_offers_the_main_nodes_recent_jobs(node):
    node.add_remote()
    juid = node.server("run", "--", "true").stdout.strip()
    done = node.laptop("--remote", "lab", "__complete", "logs", "")
    assert done.returncode == 0, done.stderr
    assert juid in done.stdout.split()
    # no MONKEY_HOME is made on the laptop for it
    assert not [f for f in node.laptop_files() if f.startswith(".monkey")]
    node.kill()
    down = node.laptop("--remote", "lab", "__complete", "logs", "")
    assert down.returncode == 0
    assert down.stdout.split() == ["last"]
