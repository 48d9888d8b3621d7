"""The dashboard through a remote (issue 27): Textual's pilot over a real TLS main node
(`monkey server run`), the dashboard on a laptop with its own HOME and MONKEY_HOME."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mainnode import MainNode, wait_until_ended
from test_tui import cell, drive, shown, until

from monkey.remote.facade import RemoteMonkey
from monkey.tui.app import DashApp
from monkey.tui.confirm import ConfirmScreen
from monkey.tui.job_screen import JobScreen
from monkey.tui.log_pane import LogPane

pytestmark = pytest.mark.system


@pytest.fixture
def node(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A main node, and this test process as its laptop (the dashboard runs here)."""
    n = MainNode(home, tmp_path)
    n.start()
    for name in ("HOME", "XDG_CONFIG_HOME", "MONKEY_HOME"):
        monkeypatch.setenv(name, n.laptop_env[name])
    monkeypatch.delenv("MONKEY_REMOTE", raising=False)
    yield n
    n.close()


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
        assert "core running" in str(app.status.render())  # the main node's core
        assert app.providers and "local" in app.providers
        second = node.server("run", "--", "sleep", "600").stdout.strip()
        await until(pilot, lambda: shown(app) == [second, first], "a new job, live")
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


def test_remote_dash_cancels_ones_own_job_and_refuses_a_colleagues_in_one_line(node):
    theirs = node.server("run", "--", "sleep", "600").stdout.strip()
    admin = json.loads(node.server("server", "user", "list", "--json").stdout)[0]["name"]
    node.add_remote(node.add_user("bob"), name="bob")
    submitted = node.laptop("--remote", "bob", "run", "--", "sleep", "600")
    assert submitted.returncode == 0, submitted.stderr
    mine = submitted.stdout.strip().splitlines()[-1]
    remote = RemoteMonkey("bob")
    app = DashApp(remote)
    refusal = f"job {theirs} belongs to {admin}; only its owner or an admin may cancel it"

    async def body(pilot) -> None:
        await until(pilot, lambda: shown(app) == [mine, theirs], "both jobs")
        await until(
            pilot,
            lambda: cell(app, mine, "state") == cell(app, theirs, "state") == "running",
            "both running",
            60,
        )
        await pilot.press("down", "c")
        assert isinstance(app.screen, ConfirmScreen) and theirs in app.screen.question
        await pilot.press("y")
        await until(
            pilot,
            lambda: any(str(n.message) == refusal for n in app._notifications),
            "the refusal, in one line",
        )
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
