"""The dashboard driven by Textual's pilot over a real MONKEY_HOME, with jobs run by a real core."""

from __future__ import annotations

import asyncio
import html
import os
import re
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from conftest import core_pid, start_core
from terminal import Terminal
from textual import events, on
from textual.widgets import Input

from monkey.models import State
from monkey.tui.app import DashApp
from monkey.tui.confirm import ConfirmScreen
from monkey.tui.job_screen import JobScreen
from monkey.tui.log_pane import LogPane
from monkey.tui.metrics_pane import MetricsPane
from monkey.tui.new_job import NewJobScreen

SIZE = (140, 40)


def drive(app: DashApp, body: Callable[..., Awaitable[None]], size: tuple[int, int] = SIZE) -> None:
    """Run ``body(pilot)`` against the app, headless, in a terminal of SIZE."""

    async def main() -> None:
        async with app.run_test(size=size) as pilot:
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


def row_text(app: DashApp, juid: str) -> str:
    """The line the jobs table draws for JUID, as on screen."""
    table = app.table
    y = table.order.index(juid) - table.scroll_offset.y + 1
    return "".join(segment.text for segment in table.render_line(y)).rstrip()


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
        await until(
            pilot,
            lambda: cell(app, a, "state") == cell(app, b, "state") == "running",
            "both jobs running",
        )
        await pilot.press("down", "c")  # the cursor on job a
        assert isinstance(app.screen, ConfirmScreen)
        assert a in app.screen.question
        await pilot.press("y")
        await until(
            pilot, lambda: monkey.job(a).status.value == "cancelled", "a cancelled in the DB"
        )
        await until(pilot, lambda: cell(app, a, "state") == "cancelled", "the table to show it")
        await pilot.press("up", "p", "n")  # pause b, but answer no
        assert monkey.job(b).status.value == "running"
        await pilot.press("p", "y")
        await until(pilot, lambda: monkey.job(b).status.value == "paused", "b paused in the DB")
        await until(pilot, lambda: cell(app, b, "state") == "paused", "the table to show it")
        await pilot.press("u")  # resume needs no confirmation
        await until(
            pilot,
            lambda: monkey.job(b).status.value in ("queued", "dispatching", "running"),
            "b resumed",
        )
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
        names = {
            str(commands.get_option_at_index(i).prompt).split("\n")[0]
            for i in range(commands.option_count)
        }
        assert any("Retry" in n for n in names) and not any("Pause" in n for n in names)
        await pilot.press("escape", "space", "up", "space")  # mark both: pause applies to one
        assert offered(app)["pause"]
        await pilot.press("p")
        assert isinstance(app.screen, ConfirmScreen) and app.screen.question.startswith(
            f"Pause {queued}?"
        )
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
        await until(
            pilot,
            lambda: all(monkey.job(j).status.value == "cancelled" for j in grid),
            "the whole sweep cancelled",
        )
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
        await until(
            pilot,
            lambda: (
                (cell(app, ok, "state"), cell(app, bad, "state")) == ("succeeded", "failed")
                if len(shown(app)) == 3
                else False
            ),
            "jobs to end",
        )
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
    code = (
        "import time\nfor i in range(40):\n    print('line', i, flush=True)\n    time.sleep(0.03)"
    )
    juid = monkey.run([sys.executable, "-c", code]).juid
    app = DashApp(home, job=juid)

    async def body(pilot) -> None:
        await until(pilot, lambda: isinstance(app.screen, JobScreen), "the job screen")
        await pilot.press("l")
        pane = app.screen.query_one(LogPane)
        await until(pilot, lambda: "line 39" in pane.view.lines, "the last line", timeout=60)
        assert [line for line in pane.view.lines if line.startswith("line")] == [
            f"line {i}" for i in range(40)
        ]
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
        await until(
            pilot,
            lambda: "quotation" in str(app.screen.query_one("#form-error").render()),
            "the error",
        )
        assert isinstance(app.screen, NewJobScreen) and not monkey.jobs()

    drive(app, body)


def test_instances_pane_shows_live_attempts_with_figures(home, monkey):
    start_core(home)
    juid = monkey.run([sys.executable, "-c", "while True: pass"], name="spin").juid
    app = DashApp(home)

    async def body(pilot) -> None:
        await pilot.press("i")
        table = app.screen.query_one("#attempts-table")
        await until(
            pilot,
            lambda: table.row_count == 1 and str(table.get_row_at(0)[6]) != "-",
            "a heartbeat with CPU figures",
        )
        row = [str(c) for c in table.get_row_at(0)]
        assert row[0] == juid and row[2] == "spin" and row[6].endswith("%")
        providers = app.screen.query_one("#instances-table")
        assert str(providers.get_row_at(0)[0]) == "local"

    drive(app, body)


@pytest.mark.system  # drives the dashboard app
def test_question_mark_lists_the_keys_and_q_quits(home):
    app = DashApp(home)

    async def body(pilot) -> None:
        await pilot.press("question_mark")
        await pilot.pause()
        text = screen_text(app)
        for words in (
            "Quit",
            "Filter",
            "Cancel",
            "Pause",
            "Resume",
            "Retry",
            "New job",
            "Start core",
            "Clear filter/marks",
            "Group sweeps",
        ):  # the last three are
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
        await until(
            pilot,
            lambda: (
                offered.option_count
                and "Pause job(s)" in str(offered.get_option_at_index(0).prompt)
            ),
            "the command offered first",
        )
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
        await until(
            pilot,
            lambda: any("invalid YAML" in str(n.message) for n in app._notifications),
            "the problem told",
        )
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
    runs = [
        monkey.run([sys.executable, "-c", METRICS_JOB.replace("{scale}", str(s))]).juid
        for s in (1, 2)
    ]
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
        # one panel per metric, titled by it; the legend names each run once
        assert text.count(runs[0]) >= 2 and text.count(runs[1]) >= 1
        assert pane.chosen == {"acc", "loss"} and " acc " in text and " loss " in text

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
        await until(
            pilot,
            lambda: "stderr has 5 bytes: press e" in str(status.render()),
            "the hint that the output is on stderr",
        )
        assert "stdout is empty" in str(status.render())
        await pilot.press("e")
        pane = app.screen.query_one(LogPane)
        await until(pilot, lambda: "boom" in pane.view.lines, "stderr shown")
        assert "empty" not in str(status.render())
        await pilot.press("m")
        await until(
            pilot, lambda: "no metrics yet" in screen_text(app), "the empty chart explained"
        )

    drive(app, body)


def test_form_error_is_visible_on_an_80x24_terminal(home, monkey):
    app = DashApp(home)

    async def main() -> None:
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.press("n", *"python train.py")
            app.screen.query_one("#memory", Input).value = "lots"
            await pilot.press("ctrl+s")
            await until(
                pilot,
                lambda: "memory 'lots' is not a size" in screen_text(app),
                "the error on screen",
            )
            assert isinstance(app.screen, NewJobScreen) and not monkey.jobs()
            app.exit()

    asyncio.run(main())


def finished(monkey, name: str, state: State, loss: float | None = None, **kwargs) -> str:
    """A job that ran (no core needed): its attempt, its end state and a last `loss`."""
    store = monkey.store
    job = monkey.run(["python", f"{name}.py"], name=name, start_core=False, **kwargs)
    assert store.begin_attempt(job.record, "local", str(monkey.home.run_dir(job.juid, 1)))
    if loss is not None:
        assert store.ingest_metrics(job.juid, 1, 1, [(["loss"], [0], [0], [loss], [time.time()])])
    store.transition(job.juid, State.DISPATCHING, State.RUNNING, kind="core", detail="test")
    if state != State.RUNNING:
        store.transition(job.juid, State.RUNNING, state, kind="core", detail="test")
    return job.juid


def test_state_sorts_by_lifecycle_and_s_reaches_each_metric(home, monkey):
    ok = finished(monkey, "ok", State.RUNNING, loss=0.5)
    bad = finished(monkey, "bad", State.FAILED, loss=2.0)
    best = finished(monkey, "best", State.SUCCEEDED, loss=0.1)
    waiting = monkey.run(["true"], name="waiting", start_core=False).juid
    app = DashApp(home)

    def status() -> str:
        return str(app.status.render())

    async def body(pilot) -> None:
        await until(
            pilot,
            lambda: len(shown(app)) == 4 and app.table.metric_names() == ["loss"],
            "the jobs and their metrics",
        )
        await pilot.press("s", "s")  # NAME, then STATE: queued, running, failed, succeeded
        assert shown(app) == [waiting, ok, bad, best] and "sort STATE ↑" in status()
        await pilot.press("s", "s", "s", "s")  # WHERE, TRIES, RUNTIME, then the metric loss
        assert shown(app) == [best, ok, bad, waiting]  # no loss yet: last
        assert "sort loss ↑" in status()  # the label follows the key at once
        await pilot.press("S")
        assert shown(app) == [bad, ok, best, waiting] and "sort loss ↓" in status()
        await pilot.press("s")
        assert "sort SWEEP" in status()

    drive(app, body)


def test_problems_view_puts_lost_and_failed_jobs_first(home, monkey):
    crowd = [finished(monkey, f"fine{i}", State.SUCCEEDED) for i in range(30)]
    failed = finished(monkey, "broken", State.FAILED)
    crowd += [finished(monkey, f"more{i}", State.SUCCEEDED) for i in range(30)]
    lost = finished(monkey, "vanished", State.LOST)
    crowd.append(finished(monkey, "last", State.SUCCEEDED))
    app = DashApp(home)

    async def body(pilot) -> None:
        await until(pilot, lambda: len(shown(app)) == 63, "the jobs")
        assert "2 problems" in str(app.status.render())
        assert shown(app).index(failed) > 30  # drowned under the crowd
        await pilot.press("exclamation_mark")
        assert shown(app)[:2] == [lost, failed]
        assert app.table.current_juid() == lost and "problems first" in str(app.status.render())
        assert "broken" in screen_text(app) and "vanished" in screen_text(app)
        await pilot.press("S")  # any order within: the problems stay on top
        assert shown(app)[:2] == [lost, failed] and shown(app)[2] == crowd[0]
        await pilot.press("exclamation_mark")
        assert shown(app).index(failed) == 30  # back among the crowd, oldest first

    drive(app, body)


def test_modals_paint_at_once_even_while_the_store_is_busy(home, monkey):
    """A poll holding the store for long (a big read on a loaded machine) must not delay a
    modal: each is the active screen, laid out and taking keys as soon as its key is handled."""
    juid = monkey.run(["true"], name="one", start_core=False).juid
    app = DashApp(home)
    busy, release = threading.Event(), threading.Event()

    def slow_store() -> None:
        with app.shared._lock:  # the dashboard's own lock, held as by a slow poll
            busy.set()
            release.wait(20)

    async def body(pilot) -> None:
        await until(pilot, lambda: shown(app) == [juid] and app.providers, "the first poll")
        threading.Thread(target=slow_store, daemon=True).start()
        busy.wait(5)
        await pilot.press("n")
        assert isinstance(app.screen, NewJobScreen)
        assert app.screen.query_one("#dialog").region.height > 0  # laid out and painted
        await pilot.press(*"echo hi")  # the next keys land in the form's first box
        assert app.screen.query_one("#command", Input).value == "echo hi"
        assert "echo hi" in screen_text(app)
        await pilot.press("escape", "c")
        assert isinstance(app.screen, ConfirmScreen) and app.screen.query_one("#dialog").region
        await pilot.press("n", "question_mark")
        assert type(app.screen).__name__ == "HelpScreen"
        assert app.shared._lock.locked(), "the keys waited for the store"
        release.set()

    drive(app, body)


def test_keys_typed_in_a_burst_after_a_modal_key_land_in_the_modal(home, monkey):
    """A terminal hands over keys typed while the app was busy (a long frame, a GC pause) in
    one burst: the modal key's modal is active and painted before the next key is taken,
    so `n` then `echo` fills the form (its `c` does not open a cancel confirmation), `c`
    then `n` answers the confirmation no, and `?` then `q` closes the help, not the app."""
    juid = monkey.run(["true"], name="one", start_core=False).juid
    log: list[tuple[str, str]] = []

    class Watched(DashApp):
        def _display(self, screen, update) -> None:  # where Textual writes out a frame
            dialog = screen.query("#dialog")
            if dialog and dialog.first().region.area:  # a frame showing the modal's dialog
                log.append(("painted", type(screen).__name__))
            super()._display(screen, update)

        @on(Input.Changed, "#command")
        def typed(self, event: Input.Changed) -> None:
            log.append(("typed", event.value))

    app = Watched(home)

    def burst(*keys: str) -> None:
        """Keys queued at once, as a terminal delivers them after a stall."""
        log.clear()
        for key in keys:
            app.post_message(events.Key(key, None if len(key) > 1 else key))

    async def body(pilot) -> None:
        await until(pilot, lambda: shown(app) == [juid] and app.providers, "the first poll")
        for _ in range(2):  # the first opening composes the form; the second reuses it
            burst("n", *"echo")
            await until(pilot, lambda: ("typed", "echo") in log, "the keys typed in the form")
            assert isinstance(app.screen, NewJobScreen)
            assert app.screen.query_one("#command", Input).value == "echo"
            assert log[0] == ("painted", "NewJobScreen"), log  # painted before the first key
            await pilot.press("escape")
            assert not isinstance(app.screen, NewJobScreen)
        burst("c", "n")
        await until(
            pilot,
            lambda: not isinstance(app.screen, ConfirmScreen) and log,
            "the confirmation answered",
        )
        assert log[0] == ("painted", "ConfirmScreen"), log
        assert monkey.job(juid).status.value == "queued"  # answered no
        burst("question_mark", "q")
        await until(
            pilot, lambda: log and type(app.screen).__name__ != "HelpScreen", "the help closed"
        )
        assert log[0] == ("painted", "HelpScreen") and app.is_running

    drive(app, body)


def test_opening_modals_does_not_grow_the_heap(home, monkey):
    """Each modal rebuilds the footer; the keys of the old footers must be freed (Textual
    kept them alive, and the garbage collector's passes over them delayed later modals)."""
    import gc

    juid = monkey.run(["true"], name="one", start_core=False).juid
    app = DashApp(home)

    def footer_keys() -> int:
        gc.unfreeze()  # the dashboard froze its heap after loading: count every object
        gc.collect()
        return sum(1 for o in gc.get_objects() if type(o).__name__ == "FooterKey")

    async def body(pilot) -> None:
        await until(pilot, lambda: shown(app) == [juid] and app.providers, "the first poll")
        for _ in range(10):
            for key in ("n", "c", "question_mark"):
                await pilot.press(key, "escape")
        assert footer_keys() == len(app.screen.query("FooterKey"))

    drive(app, body)


def test_state_colours_meet_wcag_aa_on_the_default_theme(home):
    from monkey.tui.format import STATE_STYLES, contrast

    app = DashApp(home)

    async def body(pilot) -> None:
        variables = app.get_css_variables()
        for background in ("surface", "panel", "background"):
            bg = variables[background][:7]
            for state, style in STATE_STYLES.items():
                fg = style.split()[-1]
                assert contrast(fg, bg) >= 4.5, (state, fg, background, bg, contrast(fg, bg))

    drive(app, body)


def test_a_job_a_quota_holds_shows_over_quota_until_it_is_let_go(home):
    from monkey.api import Monkey

    m = Monkey(home)
    juid = m.run(["true"], start_core=False).juid  # no core: it stays queued
    app = DashApp(home)

    async def body(pilot) -> None:
        await until(pilot, lambda: shown(app) == [juid], "the job")
        assert cell(app, juid, "state") == "queued"
        m.store.hold([juid], "over quota: ana uses 1 of 1 jobs on local")
        await until(pilot, lambda: cell(app, juid, "state") == "over quota", "over quota")
        m.store.release(None)
        await until(pilot, lambda: cell(app, juid, "state") == "queued", "queued again")

    drive(app, body)


def test_a_job_waiting_for_another_shows_waiting_until_that_one_ends(home):
    """`run --after-any A` waits for A; A cancelled while it is queued lets it go: it shows
    `queued` (no core runs here) at the next poll, though nothing of its own record changed
    but the wait, and it last changed long before (past the incremental poll's overlap)."""
    from monkey.api import Monkey

    m = Monkey(home)
    first = m.run(["true"], start_core=False).juid
    then = m.run(["true"], start_core=False, after_any=first).juid
    with m.store.tx() as db:
        db.execute("UPDATE jobs SET updated_at = updated_at - 600")
    app = DashApp(home)

    async def body(pilot) -> None:
        await until(pilot, lambda: sorted(shown(app)) == sorted([first, then]), "the jobs")
        assert cell(app, then, "state") == "waiting" and cell(app, first, "state") == "queued"
        other = m.run(["true"], start_core=False).juid  # the polls move on past the two
        await until(pilot, lambda: other in shown(app), "a newer job")
        m.cancel(first)
        await until(pilot, lambda: cell(app, first, "state") == "cancelled", "the cancel")
        await until(pilot, lambda: cell(app, then, "state") == "queued", "no wait", timeout=5)

    drive(app, body)


@pytest.mark.system  # `monkey dash` on a terminal
@pytest.mark.timeout(90)
def test_an_unexpected_error_ends_the_dashboard_with_one_line_and_exit_1(home, tmp_path):
    """A defect in the dashboard (here: the help key made to raise) is one line naming it and
    the log with its traceback, exit status 1 — not a screen of traceback and status 0."""
    script = (
        "import sys\n"
        "from monkey.tui.app import DashApp\n"
        "def boom(self):\n"
        "    raise RuntimeError('injected defect')\n"
        "DashApp.action_help = boom\n"
        "from monkey.shell.entry import main\n"
        "sys.argv = ['monkey', 'dash']\n"
        "sys.exit(main())\n"
    )
    env = dict(
        os.environ,
        MONKEY_HOME=str(home),
        XDG_CACHE_HOME=str(tmp_path / "cache"),
        PYTHONPATH=str(Path(__file__).resolve().parents[1]),
        TERM="xterm",
    )
    with Terminal(env, tmp_path, argv=[sys.executable, "-c", script], size=(30, 120)) as term:
        term.expect("Keys")  # the footer: the dashboard is up
        term.send("?")
        out = term.expect(r"error: the dashboard stopped.*\n?.*dash\.log")
        status = term.close()
    assert status == 1
    assert "RuntimeError: injected defect" in out and "Traceback" not in out
    log = (tmp_path / "cache" / "monkey" / "dash.log").read_text()
    assert "Traceback" in log and "injected defect" in log and "def boom" not in out


def test_the_dashboard_reads_runtimes_as_list_jobs_does(monkey):
    """RUNTIME said 0s in the dashboard where `list jobs` said 0.8s: one formatting now."""
    from monkey.models import run_time as listed  # what `list jobs` prints
    from monkey.tui.format import row_cells

    job = monkey.run(["true"], start_core=False).record
    for seconds, text in ((0.8, "0.8s"), (42.5, "42s"), (185, "3m05s"), (7800, "2h10m")):
        ran = job.replace(state=State.SUCCEEDED, started_at=1000.0, finished_at=1000.0 + seconds)
        assert row_cells(ran, now=9e9)["runtime"] == listed(seconds) == text
    assert listed(90_000) == "1d01h" and listed(-3.0) == "0.0s" and listed(None) == "-"
