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
from mainnode import MainNode

pytestmark = pytest.mark.system

TRAIN = (
    "import json, sys\n"
    "lr = float(sys.argv[1])\n"
    "for i in range(4): print(json.dumps({'monkey': {'step': i, 'loss': lr / (i + 1), "
    "'acc': 1 - lr / (i + 2)}}))\n"
)


@pytest.fixture
def node(home: Path, tmp_path: Path):
    n = MainNode(home, tmp_path)
    n.start()
    yield n
    n.close()


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


def _settle(node: MainNode, sid: str, settled: set[str]) -> None:
    wait_for(lambda: _states(node, sid) <= settled, timeout=120, what=f"sweep {sid}: {settled}")


def _states(node: MainNode, sid: str) -> set[str]:
    return {
        j["state"] for j in json.loads(node.server("sweep", "status", sid, "--json").stdout)["jobs"]
    }
