"""The dashboard through a remote (issue 27): Textual's pilot over a real TLS main node
(`monkey server run`), the dashboard on a laptop with its own HOME and MONKEY_HOME."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mainnode import MainNode, node, wait_until_ended  # noqa: F401 - node: a fixture
from test_tui import cell, drive, offered, row_text, screen_text, shown, until
from test_tui_charts import NOW, drawn, fill_sweep, overlaid_metrics
from test_tui_charts import drive as charts_drive

from monkey.api import Monkey
from monkey.models import REDACTED
from monkey.remote.facade import RemoteMonkey
from monkey.tui.app import DashApp
from monkey.tui.confirm import ConfirmScreen
from monkey.tui.job_screen import JobScreen
from monkey.tui.log_pane import LogPane
from monkey.tui.new_job import NewJobScreen
from monkey.tui.sweep_view import SweepScreen

pytestmark = pytest.mark.system


@pytest.fixture(autouse=True)
def laptop_here(node: MainNode, monkeypatch: pytest.MonkeyPatch) -> None:
    """This test process is the main node's laptop (the dashboard runs here)."""
    for name in ("HOME", "XDG_CONFIG_HOME", "MONKEY_HOME"):
        monkeypatch.setenv(name, node.laptop_env[name])
    monkeypatch.delenv("MONKEY_REMOTE", raising=False)


def state_on_server(node: MainNode, juid: str) -> str:
    return json.loads(node.server("info", juid, "--json").stdout)["state"]


def no_job_data(node: MainNode) -> None:
    """The laptop holds its remote settings and its blob cache, nothing of any job."""
    assert not (node.laptop_root / ".monkey").exists()
    for path in node.laptop_files():
        assert path.startswith((".config/monkey/", ".cache/monkey/remotes/")), path


def test_remote_dash_shows_the_main_nodes_jobs_live_and_follows_a_log(node, tmp_path):
    node.add_remote()
    go = tmp_path / "go"
    script = f"echo before; while [ ! -e {go} ]; do sleep 0.05; done; echo written after opening"
    first = node.server("run", "--", "sh", "-c", script).stdout.strip()
    remote = RemoteMonkey("lab")
    app = DashApp(remote)

    async def body(pilot) -> None:
        await until(pilot, lambda: shown(app) == [first], "the main node's job")
        await until(pilot, lambda: cell(app, first, "state") == "running", "it running", 60)
        assert "main node lab: core running" in str(app.status.render())
        assert app.providers and "local" in app.providers
        second = node.server("run", "--", "sleep", "600").stdout.strip()
        await until(pilot, lambda: shown(app) == [second, first], "a new job, live")
        await pilot.press("i")  # the main node's providers and live attempts
        attempts = app.screen.query_one("#attempts-table")
        await until(
            pilot,
            lambda: (
                {str(attempts.get_row_at(i)[0]) for i in range(attempts.row_count)}
                == {first, second}
            ),
            "both live attempts",
        )
        assert str(app.screen.query_one("#instances-table").get_row_at(0)[0]) == "local"
        await pilot.press("i")
        await pilot.press("down", "enter", "l")
        assert isinstance(app.screen, JobScreen) and app.screen.juid == first
        pane = app.screen.query_one(LogPane)
        await until(pilot, lambda: "before" in pane.view.lines, "the output so far")
        go.touch()
        await until(pilot, lambda: "written after opening" in pane.view.lines, "the new output")
        assert [line for line in pane.view.lines if line] == ["before", "written after opening"]
        await until(
            pilot, lambda: "succeeded" in str(app.screen.query_one("#job-title").render()), "end"
        )
        await pilot.press("escape")
        await until(pilot, lambda: cell(app, first, "state") == "succeeded", "the table")
        await pilot.press("D")  # never a core on the laptop: the main node's runs
        await until(
            pilot,
            lambda: any("already running" in str(n.message) for n in app._notifications),
            "the core said running",
        )

    drive(app, body)
    remote.close()
    no_job_data(node)


def test_remote_dash_shows_owners_and_disables_what_one_may_not_do_to_a_colleagues_job(node):
    theirs = node.server("run", "--", "sleep", "600").stdout.strip()
    admin = json.loads(node.server("server", "user", "list", "--json").stdout)[0]["name"]
    node.add_remote(node.add_user("bob"), name="bob")
    submitted = node.laptop("--remote", "bob", "run", "--", "sleep", "600")
    assert submitted.returncode == 0, submitted.stderr
    mine = submitted.stdout.strip().splitlines()[-1]
    remote = RemoteMonkey("bob")
    app = DashApp(remote)
    refusal = (
        f"job {theirs} belongs to {admin}; only its owner or an admin may cancel, pause, "
        "resume or retry it"
    )

    async def body(pilot) -> None:
        await until(pilot, lambda: shown(app) == [mine, theirs], "both jobs")
        await until(
            pilot,
            lambda: cell(app, mine, "state") == cell(app, theirs, "state") == "running",
            "both running",
            60,
        )
        assert cell(app, mine, "owner") == "bob" and cell(app, theirs, "owner") == admin
        assert f" {admin} " in row_text(app, theirs) and " bob " in row_text(app, mine)
        assert "OWNER" in screen_text(app)
        assert offered(app) == {"cancel": True, "pause": True, "resume": False, "retry": False}
        assert refusal not in screen_text(app)
        await pilot.press("down")  # the colleague's job: its keys disabled, the note says why
        assert offered(app) == {"cancel": False, "pause": False, "resume": False, "retry": False}
        assert refusal in screen_text(app)
        await pilot.press("c")
        assert not isinstance(app.screen, ConfirmScreen)
        await pilot.press("enter")  # its own screen: the same
        assert isinstance(app.screen, JobScreen)
        assert offered(app) == {"cancel": False, "pause": False, "resume": False, "retry": False}
        await until(pilot, lambda: refusal in screen_text(app), "the note on the job's screen")
        await pilot.press("c")
        assert not isinstance(app.screen, ConfirmScreen)
        await pilot.press("escape")
        assert state_on_server(node, theirs) == "running"
        await pilot.press("up", "c", "y")
        await until(pilot, lambda: cell(app, mine, "state") == "cancelled", "mine cancelled")
        assert cell(app, theirs, "state") == "running"

    drive(app, body)
    remote.close()
    wait_until_ended(node, mine)
    assert state_on_server(node, mine) == "cancelled"
    assert state_on_server(node, theirs) == "running"
    no_job_data(node)


def test_remote_dash_draws_a_runs_metrics_and_its_sweeps_analysis(node, home):
    local = Monkey(home)  # the main node's store, filled as its core would
    sid, juids = fill_sweep(local, n=6)
    analysis = local.sweep_analysis(sid)
    local.store.close()
    node.add_remote()
    remote = RemoteMonkey("lab")
    app = DashApp(remote, clock=lambda: NOW)

    async def body(pilot) -> None:
        await until(pilot, lambda: app.table.row_count == 7, "the sweep's runs")
        pane = await overlaid_metrics(app, pilot, juids[:2])
        await until(
            pilot,
            lambda: pane.drawn.get("loss") and len(pane.drawn["loss"]) == 2,
            "the loss of both runs",
        )
        xs, ys = pane.drawn["loss"][juids[0]]
        assert xs == list(range(20)) and ys[0] > ys[-1]
        assert "lr=0.001" in screen_text(app)  # the legend: the runs' parameters
        await pilot.press("escape")
        app.table.move_cursor(juids[3])
        await pilot.press("a")
        await until(
            pilot, lambda: isinstance(app.screen, SweepScreen) and drawn(app.screen), "the view"
        )
        assert app.screen.importance == analysis["importance"]
        assert app.screen.best == analysis["best"]

    charts_drive(app, body)
    remote.close()
    no_job_data(node)


def test_remote_dash_command_is_routed_to_the_main_node(node):
    node.add_remote()
    juid = node.server("run", "--", "true").stdout.strip()
    for argv in (["dash"], ["dash", juid[:-1]], ["dash", "--juid", "last"]):
        done = node.laptop("--remote", "lab", *argv)  # no terminal here: refused, in one line
        assert done.returncode == 1, done.stderr
        assert done.stderr.strip() == (
            "monkey: error: the dashboard needs a terminal; use `monkey list jobs` or "
            "`monkey info job JOB` in scripts"
        )
    wrong = node.laptop("--remote", "lab", "dash", "nosuchjob")  # resolved by the main node
    assert wrong.returncode == 1 and "nosuchjob" in wrong.stderr
    assert len(wrong.stderr.strip().splitlines()) == 1
    no_job_data(node)


def test_providers_through_a_remote_hide_their_secrets(node):
    (node.home / "providers.yml").write_text(
        "providers:\n  box:\n    type: ssh\n    hosts:\n"
        "      - {host: 127.0.0.1, user: alice, key: /home/alice/.ssh/lab_key}\n"
    )
    node.add_remote()
    remote = RemoteMonkey("lab")
    try:
        providers = remote.providers
    finally:
        remote.close()
    assert sorted(providers) == ["box", "local"]
    assert providers["box"].type == "ssh"
    assert providers["box"].options["hosts"] == [
        {"host": "127.0.0.1", "user": "alice", "key": REDACTED}
    ]


def test_remote_dash_new_job_runs_the_laptops_folder_and_its_retry_is_followed(node):
    (Path.cwd() / "hello.txt").write_text("from the laptop\n")  # the form's folder: here
    node.add_remote()
    remote = RemoteMonkey("lab")
    app = DashApp(remote)

    async def body(pilot) -> None:
        await until(pilot, lambda: app.providers, "the main node's providers")
        await pilot.press("n", *"cat hello.txt", "ctrl+s")
        await until(pilot, lambda: not isinstance(app.screen, NewJobScreen), "the form to close")
        await until(pilot, lambda: len(shown(app)) == 1, "the new job in the table")
        juid = shown(app)[0]
        await until(pilot, lambda: cell(app, juid, "state") == "succeeded", "it to run", 60)
        await pilot.press("enter", "l")
        pane = app.screen.query_one(LogPane)
        await until(pilot, lambda: "from the laptop" in pane.view.lines, "its output")
        await pilot.press("r")  # retry from the job screen: the second attempt is followed
        await until(pilot, lambda: pane.view.lines.count("from the laptop") == 2, "attempt 2", 60)
        assert any("attempt 2" in line for line in pane.view.lines)

    drive(app, body)
    remote.close()
    no_job_data(node)


def test_remote_dash_reports_the_main_nodes_broken_providers_file_and_shows_its_jobs(node):
    juid = node.server("run", "--", "true").stdout.strip()
    (node.home / "providers.yml").write_text("providers: [unclosed\n")
    node.add_remote()
    remote = RemoteMonkey("lab")
    app = DashApp(remote)

    async def body(pilot) -> None:
        await until(pilot, lambda: shown(app) == [juid], "the job")
        await until(
            pilot,
            lambda: any("invalid YAML" in str(n.message) for n in app._notifications),
            "the problem told",
        )
        assert "main node lab: core running" in str(app.status.render())
        await pilot.press("n")  # the form needs the providers: it says why it cannot open
        assert not isinstance(app.screen, NewJobScreen)

    drive(app, body)
    remote.close()
