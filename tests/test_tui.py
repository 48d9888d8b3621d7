"""The dashboard driven by Textual's pilot over a real MONKEY_HOME, with jobs run by a real core."""

from __future__ import annotations

import asyncio
import html
import re
import sys
import time
from collections.abc import Awaitable, Callable

from conftest import core_pid, start_core
from textual.widgets import Input

from monkey.models import State
from monkey.tui.app import DashApp
from monkey.tui.confirm import ConfirmScreen
from monkey.tui.job_screen import JobScreen
from monkey.tui.log_pane import LogPane
from monkey.tui.metrics_pane import MetricsPane
from monkey.tui.new_job import NewJobScreen

SIZE = (140, 40)


def drive(app: DashApp, body: Callable[..., Awaitable[None]]) -> None:
    """Run ``body(pilot)`` against the app, headless."""

    async def main() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await body(pilot)
            app.exit()

    asyncio.run(main())


async def until(pilot, predicate: Callable[[], object], what: str, timeout: float = 30.0) -> None:
    """Let the app run until ``predicate()`` holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await pilot.pause(0.05)


def shown(app: DashApp) -> list[str]:
    """Job ids in the table, top to bottom."""
    return list(app.table.order)


def screen_text(app: DashApp) -> str:
    """What the terminal shows, as plain text (from the SVG screenshot)."""
    svg = app.export_screenshot()
    return html.unescape(" ".join(re.findall(r">([^<>]+)</text>", svg))).replace("\xa0", " ")


def cell(app: DashApp, juid: str, column: str) -> str:
    return str(app.table.cell(juid, column))


def sleeper(monkey, name: str, **kwargs) -> str:
    return monkey.run(["sleep", "60"], name=name, **kwargs).juid


def test_keys_cancel_and_pause_running_jobs(home, monkey):
    start_core(home)
    a = sleeper(monkey, "a")
    b = sleeper(monkey, "b")
    app = DashApp(home)

    async def body(pilot) -> None:
        await until(pilot, lambda: shown(app) == [b, a], "both jobs in the table, newest first")
        await until(pilot, lambda: cell(app, a, "state") == cell(app, b, "state") == "running",
                    "both jobs running")
        await pilot.press("down", "c")  # the cursor on job a
        assert isinstance(app.screen, ConfirmScreen)
        assert a in app.screen.question
        await pilot.press("y")
        await until(pilot, lambda: monkey.job(a).status.value == "cancelled", "a cancelled in the DB")
        await until(pilot, lambda: cell(app, a, "state") == "cancelled", "the table to show it")
        await pilot.press("up", "p", "n")  # pause b, but answer no
        assert monkey.job(b).status.value == "running"
        await pilot.press("p", "y")
        await until(pilot, lambda: monkey.job(b).status.value == "paused", "b paused in the DB")
        await until(pilot, lambda: cell(app, b, "state") == "paused", "the table to show it")
        await pilot.press("u")  # resume needs no confirmation
        await until(pilot, lambda: monkey.job(b).status.value in ("queued", "dispatching", "running"),
                    "b resumed")
        await pilot.press("down", "r")  # retry a: finished, so it is allowed
        await until(pilot, lambda: monkey.job(a).status.value != "cancelled", "a re-queued")

    drive(app, body)


def offered(app: DashApp) -> dict[str, bool]:
    """Control keys the footer shows, and whether each is enabled."""
    keys = {"c": "cancel", "p": "pause", "u": "resume", "r": "retry"}
    return {keys[k]: b.enabled for k, b in app.active_bindings.items() if k in keys}


def test_only_legal_actions_are_offered(home, monkey):
    failed = monkey.run(["false"], start_core=False).juid
    monkey.store.transition(failed, State.QUEUED, State.DISPATCHING, kind="core", detail="t")
    monkey.store.transition(failed, State.DISPATCHING, State.FAILED, kind="core", detail="t")
    queued = monkey.run(["true"], start_core=False).juid
    app = DashApp(home)

    async def body(pilot) -> None:
        await until(pilot, lambda: shown(app) == [queued, failed], "the jobs")
        assert offered(app) == {"cancel": True, "pause": True, "resume": False, "retry": False}
        await pilot.press("down")  # the failed job: no pause, no cancel, retry yes
        assert offered(app) == {"cancel": False, "pause": False, "resume": False, "retry": True}
        await pilot.press("p")
        assert not isinstance(app.screen, ConfirmScreen)
        assert monkey.job(failed).status.value == "failed"
        await pilot.press("ctrl+p", *"job(s)")
        commands = app.screen.query_one("CommandList")
        await until(pilot, lambda: commands.option_count, "the commands")
        names = {str(commands.get_option_at_index(i).prompt).split("\n")[0]
                 for i in range(commands.option_count)}
        assert any("Retry" in n for n in names) and not any("Pause" in n for n in names)
        await pilot.press("escape", "space", "up", "space")  # mark both: pause applies to one
        assert offered(app)["pause"]
        await pilot.press("p")
        assert isinstance(app.screen, ConfirmScreen) and app.screen.question.startswith(
            f"Pause {queued}?")
        await pilot.press("y")
        await until(pilot, lambda: monkey.job(queued).status.value == "paused", "queued paused")
        assert monkey.job(failed).status.value == "failed"

    drive(app, body)


def test_bulk_cancel_of_a_sweep(home, monkey):
    start_core(home)
    grid = [sleeper(monkey, f"g{i}", sweep="grid") for i in range(3)]
    other = sleeper(monkey, "other")
    app = DashApp(home)

    async def body(pilot) -> None:
        await until(pilot, lambda: len(shown(app)) == 4, "the jobs")
        await pilot.press("down", "w")  # mark the sweep of the job under the cursor
        assert app.table.marked == set(grid)
        await pilot.press("c")
        assert "3 jobs" in app.screen.question
        await pilot.press("y")
        await until(pilot, lambda: all(monkey.job(j).status.value == "cancelled" for j in grid),
                    "the whole sweep cancelled")
        assert monkey.job(other).status.value in ("queued", "dispatching", "running")
        await until(pilot, lambda: not app.table.marked, "marks cleared after the action")

    drive(app, body)


def test_filter_and_sort(home, monkey):
    start_core(home)
    ok = monkey.run(["true"], name="alpha").juid
    bad = monkey.run(["false"], name="charlie").juid
    slow = sleeper(monkey, "bravo", sweep="s1")
    app = DashApp(home)

    async def body(pilot) -> None:
        await until(pilot, lambda: (cell(app, ok, "state"), cell(app, bad, "state"))
                    == ("succeeded", "failed") if len(shown(app)) == 3 else False, "jobs to end")
        assert shown(app) == [slow, bad, ok]
        await pilot.press("slash")
        await pilot.press(*"state:failed", "enter")
        assert shown(app) == [bad]
        assert "filter" in str(app.status.render())
        await pilot.press("slash", "ctrl+u", *"bravo", "enter")
        assert shown(app) == [slow]
        await pilot.press("slash", "ctrl+u", *"sweep:s1 state:running,queued", "enter")
        assert shown(app) == [slow]
        await pilot.press("slash", "ctrl+u", *"state:bogus", "enter")
        assert shown(app) == [slow]  # a bad filter changes nothing and says why
        assert any("unknown state 'bogus'" in str(n.message) for n in app._notifications)
        await pilot.press("escape", "escape")  # close the box, then clear the filter
        assert shown(app) == [slow, bad, ok]
        await pilot.press("s")  # next sort column: NAME, ascending
        assert shown(app) == [ok, slow, bad]
        await pilot.press("S")
        assert shown(app) == [bad, slow, ok]
        await pilot.click("#jobs-table", offset=(2, 0))  # a click on a header sorts too
        await pilot.pause()

    drive(app, body)


def test_log_pane_follows_a_job_across_attempts_and_searches(home, monkey):
    start_core(home)
    code = "import time\nfor i in range(40):\n    print('line', i, flush=True)\n    time.sleep(0.03)"
    juid = monkey.run([sys.executable, "-c", code]).juid
    app = DashApp(home, job=juid)

    async def body(pilot) -> None:
        await until(pilot, lambda: isinstance(app.screen, JobScreen), "the job screen")
        await pilot.press("l")
        pane = app.screen.query_one(LogPane)
        await until(pilot, lambda: "line 39" in pane.view.lines, "the last line", timeout=60)
        assert [line for line in pane.view.lines if line.startswith("line")] == [
            f"line {i}" for i in range(40)]
        await until(pilot, lambda: monkey.job(juid).status.value == "succeeded", "the job to end")
        await pilot.press("r")  # retry from the job screen: a second attempt follows on
        await until(pilot, lambda: pane.view.lines.count("line 39") == 2, "attempt 2", timeout=60)
        assert any("attempt 2" in line for line in pane.view.lines)
        await pilot.press("slash", *"line 7", "enter")
        status = str(app.screen.query_one("#log-status").render())
        assert "match 1/2" in status and "line 7" in status
        await pilot.press("slash", "escape")  # Esc closes the search box first,
        assert isinstance(app.screen, JobScreen)
        await pilot.press("escape")  # then goes back to the table
        assert not isinstance(app.screen, JobScreen)

    drive(app, body)


def test_core_down_is_shown_and_can_be_started(home, monkey):
    app = DashApp(home)

    async def body(pilot) -> None:
        await until(pilot, lambda: "core down" in str(app.status.render()), "the core shown down")
        await pilot.press("D")
        await until(pilot, lambda: core_pid(home), "a core to run", timeout=30)
        await until(pilot, lambda: "core running" in str(app.status.render()), "the core shown up")

    drive(app, body)


def test_new_job_form_submits_through_the_api(home, monkey):
    start_core(home)
    app = DashApp(home)

    async def body(pilot) -> None:
        await pilot.press("n")
        assert isinstance(app.screen, NewJobScreen)
        await pilot.press(*"echo 'hi there'", "tab", *"greeter")
        app.screen.query_one("#cpus", Input).value = "x"
        await pilot.press("ctrl+s")
        assert "cpus must be a whole number" in str(app.screen.query_one("#form-error").render())
        app.screen.query_one("#cpus", Input).value = "1"
        await pilot.press("ctrl+s")
        await until(pilot, lambda: not isinstance(app.screen, NewJobScreen), "the form to close")
        await until(pilot, lambda: len(shown(app)) == 1, "the new job in the table")
        job = monkey.jobs()[0]
        assert (job.argv, job.name) == (["echo", "hi there"], "greeter")
        await until(pilot, lambda: monkey.job(job.juid).status.value == "succeeded", "it to run")

    drive(app, body)


def test_bad_input_in_the_form_keeps_it_open(home, monkey):
    app = DashApp(home)

    async def body(pilot) -> None:
        await pilot.press("n", *"python 'unclosed", "ctrl+s")
        await until(pilot, lambda: "quotation" in str(app.screen.query_one("#form-error").render()),
                    "the error")
        assert isinstance(app.screen, NewJobScreen) and not monkey.jobs()

    drive(app, body)


def test_instances_pane_shows_live_attempts_with_figures(home, monkey):
    start_core(home)
    juid = monkey.run([sys.executable, "-c", "while True: pass"], name="spin").juid
    app = DashApp(home)

    async def body(pilot) -> None:
        await pilot.press("i")
        table = app.screen.query_one("#attempts-table")
        await until(pilot, lambda: table.row_count == 1 and str(table.get_row_at(0)[6]) != "-",
                    "a heartbeat with CPU figures")
        row = [str(c) for c in table.get_row_at(0)]
        assert row[0] == juid and row[2] == "spin" and row[6].endswith("%")
        providers = app.screen.query_one("#instances-table")
        assert str(providers.get_row_at(0)[0]) == "local"

    drive(app, body)


def test_question_mark_lists_the_keys_and_q_quits(home):
    app = DashApp(home)

    async def body(pilot) -> None:
        await pilot.press("question_mark")
        await pilot.pause()
        text = screen_text(app)
        for words in ("Quit", "Filter", "Cancel", "Pause", "Resume", "Retry", "New job",
                      "Start core", "Clear filter/marks", "Group sweeps"):  # the last three are
            assert words in text, words  # keys the footer does not show
        await pilot.press("escape")
        assert "Group sweeps" not in screen_text(app)
        await pilot.press("q")
        await until(pilot, lambda: app.return_code is not None or not app.is_running, "quit")

    drive(app, body)


def test_command_palette_offers_the_actions(home, monkey):
    juid = monkey.run(["true"], start_core=False).juid
    app = DashApp(home)

    async def body(pilot) -> None:
        await until(pilot, lambda: shown(app) == [juid], "the job")
        await pilot.press("ctrl+p", *"pause job")
        offered = app.screen.query_one("CommandList")
        await until(pilot, lambda: offered.option_count and "Pause job(s)" in str(
            offered.get_option_at_index(0).prompt), "the command offered first")
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the confirmation")
        await pilot.press("y")
        await until(pilot, lambda: monkey.job(juid).status.value == "paused", "the job paused")

    drive(app, body)


def test_a_broken_providers_file_is_reported_and_jobs_still_shown(home, monkey):
    juid = monkey.run(["true"], start_core=False).juid
    (home / "providers.yml").write_text("providers: [unclosed\n")
    app = DashApp(home)

    async def body(pilot) -> None:
        await until(pilot, lambda: shown(app) == [juid], "the job")
        await until(pilot, lambda: any("invalid YAML" in str(n.message)
                                       for n in app._notifications), "the problem told")
        await pilot.press("n")  # the form needs the providers: it says why it cannot open
        assert not isinstance(app.screen, NewJobScreen)

    drive(app, body)


def test_dash_and_web_refuse_unknown_jobs_and_pipes(cli, monkey):
    proc = cli("web", "--juid", "99-")
    assert proc.returncode == 1 and "no job matches '99-'" in proc.stderr
    proc = cli("dash")
    assert proc.returncode == 1 and "needs a terminal" in proc.stderr


METRICS_JOB = (
    "import monkey, time\n"
    "for i in range(30):\n"
    "    monkey.log({'loss': {scale} / (i + 1), 'acc': i / 30}, step=i)\n"
    "    time.sleep(0.02)\n"
)


def test_metrics_chart_shows_logged_series_overlaid_for_marked_runs(home, monkey):
    start_core(home)
    runs = [monkey.run([sys.executable, "-c", METRICS_JOB.replace("{scale}", str(s))]).juid
            for s in (1, 2)]
    for juid in runs:
        assert monkey.job(juid).wait(60).value == "succeeded"
    app = DashApp(home)

    async def body(pilot) -> None:
        await until(pilot, lambda: len(shown(app)) == 2, "the runs")
        assert cell(app, runs[0], "metrics") == "acc 0.9667  loss 0.03333"  # last values
        assert cell(app, runs[1], "metrics") == "acc 0.9667  loss 0.06667"
        await pilot.press("space", "space", "enter", "m")  # mark both, open, metrics tab
        pane = app.screen.query_one(MetricsPane)
        await until(pilot, lambda: pane.names and pane.shown, "the chart")
        assert {"acc", "loss"} <= set(pane.names)
        assert pane.chosen == {"acc"} and len(pane.shown) == 2  # one line per run
        assert all(count == 30 for count, _ in pane.shown.values())
        await pilot.press("down", "space")  # also choose the next series: loss
        await until(pilot, lambda: len(pane.shown) == 4, "both series of both runs")
        text = screen_text(app)
        assert f"{runs[0]} loss" in text and f"{runs[1]} acc" in text  # the legend

    drive(app, body)


def test_job_with_only_stderr_and_no_metrics_says_where_to_look(home, monkey):
    start_core(home)
    code = "import sys\nprint('boom', file=sys.stderr)\nsys.exit(3)"
    juid = monkey.run([sys.executable, "-c", code]).juid
    assert monkey.job(juid).wait(60).value == "failed"
    app = DashApp(home, job=juid)

    async def body(pilot) -> None:
        await until(pilot, lambda: isinstance(app.screen, JobScreen), "the job screen")
        await pilot.press("l")
        status = app.screen.query_one("#log-status")
        await until(pilot, lambda: "stderr has 5 bytes: press e" in str(status.render()),
                    "the hint that the output is on stderr")
        assert "stdout is empty" in str(status.render())
        await pilot.press("e")
        pane = app.screen.query_one(LogPane)
        await until(pilot, lambda: "boom" in pane.view.lines, "stderr shown")
        assert "empty" not in str(status.render())
        await pilot.press("m")
        await until(pilot, lambda: "no metrics yet" in screen_text(app), "the empty chart explained")

    drive(app, body)


def test_form_error_is_visible_on_an_80x24_terminal(home, monkey):
    app = DashApp(home)

    async def main() -> None:
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.press("n", *"python train.py")
            app.screen.query_one("#memory", Input).value = "lots"
            await pilot.press("ctrl+s")
            await until(pilot, lambda: "memory 'lots' is not a size" in screen_text(app),
                        "the error on screen")
            assert isinstance(app.screen, NewJobScreen) and not monkey.jobs()
            app.exit()

    asyncio.run(main())
