"""Monkey Web's sweep analysis, chart options, live state lines and session upkeep (issue
28): the pure helpers as unit tests, the pages against a real main node with real jobs in
a real browser (the fixtures of tests/test_web.py)."""

from __future__ import annotations

import json
import sys

import pytest
from conftest import wait_for
from mainnode import MainNode, node  # noqa: F401 - node: a fixture
from test_web import browser, login, page_for, run_job, state_of  # noqa: F401 - browser: a fixture

from monkey.config import Home
from monkey.server import websession
from monkey.server.web.sweep_views import analysis, importance, parcoords
from monkey.tracking.axes import epoch_mapper, xs

# -- pure helpers -------------------------------------------------------------------------


def test_importance_scores_a_grid_by_anova_and_a_random_search_by_rank_correlation():
    rows = []
    for lr in (0.001, 0.01, 0.1):
        for opt in ("sgd", "adam"):
            for seed in (1, 2):
                # acc peaks at the middle lr (a straight-line fit would miss it); opt barely
                # matters; seed not at all
                acc = {0.001: 0.5, 0.01: 0.9, 0.1: 0.5}[lr] + (0.01 if opt == "adam" else 0)
                rows.append(
                    {"job": f"j{len(rows)}", "lr": lr, "opt": opt, "seed": seed, "acc": acc}
                )
    scores = {d["param"]: d for d in importance(rows, ["seed", "opt", "lr"], "acc")}
    assert scores["lr"]["method"] == "η²" and scores["lr"]["score"] > 0.99
    assert scores["opt"]["score"] < 0.01 and scores["seed"]["score"] == 0.0
    assert [d["param"] for d in importance(rows, ["seed", "opt", "lr"], "acc")][0] == "lr"
    # a random search: values never repeat, a monotonic effect on a log scale counts fully
    random = [{"job": str(i), "lr": 10 ** -(i / 7), "loss": i * i} for i in range(20)]
    (lr,) = importance(random, ["lr"], "loss")
    assert lr["method"] == "ρ²" and lr["score"] == pytest.approx(1.0) and lr["n"] == 20


def test_importance_says_none_with_too_few_runs_one_value_or_no_metric():
    rows = [
        {"job": "a", "x": 1, "y": "p", "m": 1.0},
        {"job": "b", "x": 1, "y": "q", "m": None},  # not ended: no metric, left out
        {"job": "c", "x": 1, "y": "q", "m": float("nan")},
        {"job": "d", "x": 1, "y": "p", "m": 3.0},
    ]
    scores = {d["param"]: d for d in importance(rows, ["x", "y"], "m")}
    assert scores["x"]["score"] is None and scores["x"]["n"] == 2
    assert scores["y"]["score"] is None  # 2 runs with the metric: too few
    assert importance([], ["x"], "m") == [{"param": "x", "score": None, "method": "η²", "n": 0}]


def test_parcoords_axes_are_numeric_log_or_categorical_with_the_metric_last():
    rows = [
        {"job": "a", "lr": 0.0001, "opt": "sgd", "layers": 2, "acc:best": 0.5},
        {"job": "b", "lr": 0.1, "opt": "adam", "layers": 10, "acc:best": None},
        {"job": "c", "lr": 0.01, "opt": None, "layers": 4, "acc:best": 0.75},
    ]
    pc = parcoords(rows, ["lr", "opt", "layers"], "acc:best", "max")
    axes = {a["name"]: a for a in pc["axes"]}
    assert [a["name"] for a in pc["axes"]] == ["lr", "opt", "layers", "acc:best"]
    assert axes["lr"]["log"] and not axes["layers"]["log"]
    assert axes["opt"] == {"name": "opt", "kind": "cat", "levels": ["adam", "sgd"]}
    assert pc["runs"][1] == {"job": "b", "v": [0.1, "adam", 10, None], "m": None}
    assert pc["runs"][2]["v"][1] is None
    table = {
        "columns": ["job", "name", "state", "lr", "param:acc", "acc", "acc:best"],
        "rows": [{**r, "param:acc": 1} for r in rows],
    }
    found = analysis(table, ["lr", "acc", "missing"], {"name": "acc", "goal": "max"})
    assert found["metric"] == "acc:best" and found["params"] == ["lr", "param:acc"]
    assert found["parcoords"]["goal"] == "max"
    # no metric of the sweep's: the first one logged, its last value
    assert analysis(table, ["lr"], None)["metric"] == "acc"


def test_epoch_mapping_interpolates_between_logged_epochs_and_clamps_outside():
    at = epoch_mapper([(100, 1.0), (200, 2.0), (None, 9.0), (300, float("nan")), (400, 4.0)])
    assert at(150) == 1.5 and at(200) == 2.0 and at(300) == 3.0
    assert at(0) == 1.0 and at(10_000) == 4.0  # before the first, after the last
    assert epoch_mapper([(None, 1.0), (5, None)]) is None
    rows = [(0, 1.0, 1000.0), (150, 2.0, 1005.0), (None, 3.0, 1010.5)]
    assert list(xs(rows, "epoch", 1000.0, at)) == [(1.0, 1.0), (1.5, 2.0), (10.5, 3.0)]
    assert list(xs(rows, "step", 1000.0)) == [(0.0, 1.0), (150.0, 2.0), (10.5, 3.0)]
    assert list(xs(rows, "time", 999.0)) == [(1.0, 1.0), (6.0, 2.0), (11.5, 3.0)]


def test_expired_sessions_are_pruned_on_a_login_at_most_hourly_and_in_bounded_steps(tmp_path):
    import os
    import time

    (tmp_path / "mh").mkdir()
    home = Home(tmp_path / "mh")
    old = [websession.create_session(home, f"u{i}")[0] for i in range(5)]
    folder = tmp_path / "mh" / "server" / "web" / "sessions"
    for path in folder.iterdir():  # all of them expired a day ago
        record = json.loads(path.read_text())
        path.write_text(json.dumps({**record, "expires": time.time() - 86400}))
    os.utime(folder.parent / "pruned", (time.time() - 30, time.time() - 30))
    websession.create_session(home, "ana")  # pruned half a minute ago: not again yet
    assert len(list(folder.iterdir())) == 6
    gone = websession.prune(home, most=2)  # bounded: two files looked at, the rest wait
    assert gone in (1, 2) and len(list(folder.iterdir())) == 6 - gone
    os.utime(folder.parent / "pruned", (time.time() - 4000, time.time() - 4000))
    sid, _ = websession.create_session(home, "ana")  # over an hour: pruned on this login
    assert len(list(folder.iterdir())) == 2
    assert websession.session(home, sid)["user"] == "ana"
    assert all(websession.session(home, s) is None for s in old)
    assert websession.end_user_sessions(home, "ana") == 2
    assert websession.session(home, sid) is None


# -- in a browser ------------------------------------------------------------------------

ACC = (
    "import json, sys\n"
    "lr, opt = float(sys.argv[1]), sys.argv[2]\n"
    "acc = {0.001: 0.5, 0.01: 0.9, 0.1: 0.6}[lr] + (0.02 if opt == 'adam' else 0)\n"
    "for step in range(3):\n"
    "    print(json.dumps({'monkey': {'acc': acc * (step + 1) / 3, 'step': step}}))\n"
)


def a_sweep(node: MainNode) -> tuple[str, list[dict]]:
    done = node.server(
        "sweep",
        "--name",
        "lr-scan",
        "--metric",
        "acc",
        "--goal",
        "max",
        "--grid",
        "lr=0.001,0.01,0.1",
        "--grid",
        "opt=sgd,adam",
        "--",
        sys.executable,
        "-c",
        ACC,
        "{lr}",
        "{opt}",
    )
    assert done.returncode == 0, done.stderr
    sid = json.loads(node.server("list", "sweeps", "--json").stdout)[0]["id"]
    runs = json.loads(node.server("list", "jobs", "--json").stdout)["jobs"]
    for run in runs:
        wait_for(lambda j=run["job"]: state_of(node, j) == "succeeded", timeout=180)
    return sid, runs


def shown_rows(page) -> list[str]:
    return page.eval_on_selector_all(
        "table.runs tbody tr:not([hidden])", "rs => rs.map(r => r.dataset.job)"
    )


@pytest.mark.system
def test_sweep_page_draws_parallel_coordinates_brushes_the_table_and_ranks_parameters(
    node, browser
):
    sid, runs = a_sweep(node)
    assert len(runs) == 6
    best = next(r["job"] for r in runs if r["params"] == {"lr": 0.01, "opt": "adam"})
    page = page_for(browser)
    login(page, node, node.token, f"/web/sweeps/{sid}")
    # one line per run, one axis per parameter and the metric; the best run on top
    page.wait_for_selector("#parcoords path.run")
    assert page.eval_on_selector_all("#parcoords path.run", "ps => ps.length") == 6
    axes = page.eval_on_selector_all("#parcoords g.axis", "gs => gs.map(g => g.dataset.axis)")
    assert axes == ["lr", "opt", "acc:best"]
    assert page.get_attribute("#parcoords path.best", "data-job") == best
    colours = page.eval_on_selector_all(
        "#parcoords path.run", "ps => new Set(ps.map(p => p.getAttribute('stroke'))).size"
    )
    assert colours >= 3  # coloured by the metric
    # the best run is marked in the table too
    assert page.get_attribute("table.runs tr.best", "data-job") == best
    assert "★" in page.inner_text("table.runs tr.best")
    assert len(shown_rows(page)) == 6
    # brush the top of the metric's axis: only the runs with the highest accuracy stay
    page.locator("#parcoords").scroll_into_view_if_needed()  # the mouse acts in view
    hit = page.locator("#parcoords g.axis[data-axis='acc:best'] rect.hit").bounding_box()
    x = hit["x"] + hit["width"] / 2
    page.mouse.move(x, hit["y"] + 2)
    page.mouse.down()
    page.mouse.move(x, hit["y"] + 30, steps=4)
    page.mouse.up()
    kept = shown_rows(page)
    assert best in kept and 0 < len(kept) < 6
    assert page.eval_on_selector_all("#parcoords path.run:not(.off)", "ps => ps.length") == len(
        kept
    )
    assert f"{len(kept)} of 6 runs selected" in page.inner_text("#pc-count")
    # a second brush on a categorical axis narrows further: adam only
    page.locator("#parcoords").scroll_into_view_if_needed()  # the mouse acts in view
    hit = page.locator("#parcoords g.axis[data-axis='opt'] rect.hit").bounding_box()
    x = hit["x"] + hit["width"] / 2
    page.mouse.move(x, hit["y"] + hit["height"] - 30)
    page.mouse.down()
    page.mouse.move(x, hit["y"] + hit["height"] - 2, steps=4)  # the bottom level: "adam"
    page.mouse.up()
    both = shown_rows(page)
    adam = {r["job"] for r in runs if r["params"]["opt"] == "adam"}
    assert set(both) == set(kept) & adam and best in both
    page.click("#pc-clear")
    assert len(shown_rows(page)) == 6
    # by keyboard: Tab from the clear button reaches the first axis, then the metric's;
    # ArrowUp selects the top of it, Escape clears it
    page.focus("#pc-clear")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.dataset.axis") == "lr"
    page.keyboard.press("Tab")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.dataset.axis") == "acc:best"
    page.keyboard.press("ArrowUp")
    top = shown_rows(page)
    assert best in top and 0 < len(top) < 6
    page.keyboard.press("Shift+ArrowDown")  # wider: as many runs or more
    assert set(top) <= set(shown_rows(page))
    page.keyboard.press("Escape")
    assert len(shown_rows(page)) == 6
    # importance: lr explains nearly all of the accuracy, opt little
    names = page.eval_on_selector_all(".importance dt", "ds => ds.map(d => d.textContent)")
    assert names == ["lr", "opt"]
    scores = page.eval_on_selector_all(".importance .score", "ss => ss.map(s => +s.textContent)")
    assert scores[0] > 0.9 and scores[1] < 0.1
    bars = page.eval_on_selector_all(".importance .bar", "bs => bs.map(b => b.clientWidth)")
    assert bars[0] > bars[1] > 0
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280


@pytest.mark.system
def test_a_users_sessions_end_when_its_token_is_rotated_or_it_is_removed(node, browser):
    bob = page_for(browser)
    login(bob, node, node.add_user("bob"), "/web/jobs")
    done = node.server("server", "user", "token", "bob")
    assert done.returncode == 0, done.stderr
    bob.goto(node.url + "/web/providers")
    assert "/web/login?next=%2Fweb%2Fproviders" in bob.url  # the stale cookie: log in again
    new = done.stdout.strip().splitlines()[1]
    login(bob, node, new, "/web/providers")
    assert bob.inner_text(".who") == "bob"
    # removed, then added again under the same name: the old session is not theirs
    assert node.server("server", "user", "remove", "bob").returncode == 0
    node.add_user("bob")
    bob.goto(node.url + "/web/jobs")
    assert "/web/login" in bob.url
    # a token rotated by another path than the command (the store itself): the session
    # knows its token's key and ends all the same
    from monkey.server import auth
    from monkey.store import Store

    carol = page_for(browser)
    login(carol, node, node.add_user("carol"), "/web/jobs")
    store = Store(Home(node.home).db)
    auth.rotate(store, "carol")
    store.close()
    carol.goto(node.url + "/web/jobs")
    assert "/web/login" in carol.url
    ana = page_for(browser)  # the admin's own session is untouched
    login(ana, node, node.token, "/web/jobs")
    ana.goto(node.url + "/web/providers")
    assert ana.url.endswith("/web/providers")


@pytest.mark.system
def test_state_lines_follow_a_job_that_ends_without_a_reload(node, browser, tmp_path):
    flag = tmp_path / "go"
    juid = run_job(node, "sh", "-c", f"while [ ! -e {flag} ]; do sleep 0.05; done; exit 3")
    wait_for(lambda: state_of(node, juid) == "running", timeout=120, what="the job to run")
    page = page_for(browser)
    login(page, node, node.token, f"/web/jobs/{juid}")
    providers = page.context.new_page()
    providers.goto(node.url + "/web/providers")
    assert page.inner_text("#state") == "running"
    assert page.query_selector("button.act-cancel") and not page.query_selector("button.act-retry")
    running = providers.eval_on_selector_all(
        "#providers-live tbody tr >> nth=0 >> td", "ts => ts.map(t => t.innerText)"
    )
    assert running[3] == "1"  # the local provider runs one job
    page.evaluate("window.sameDocument = 1")
    providers.evaluate("window.sameDocument = 1")
    flag.touch()
    page.wait_for_selector("#state >> text=failed")
    facts = page.inner_text("#job-facts")
    assert "Exit\n3" in facts or "Exit\t3" in facts, facts
    page.wait_for_selector("button.act-retry")
    assert page.query_selector("button.act-cancel") is None  # its actions changed too
    assert "exit 3" in page.inner_text("#job-attempts")
    assert page.evaluate("window.sameDocument") == 1  # no reload
    from playwright.sync_api import expect

    running = providers.locator("#providers-live tbody tr >> nth=0 >> td >> nth=3")
    expect(running).to_have_text("0", timeout=30_000)
    assert providers.evaluate("window.sameDocument") == 1
    # the swapped-in action works: its form carries the session's CSRF token
    page.click("button.act-retry")
    page.wait_for_url(f"**/web/jobs/{juid}")
    attempts = lambda: json.loads(node.server("info", juid, "--json").stdout)["attempts"]  # noqa: E731
    wait_for(lambda: attempts() == 2, timeout=60, what="the retry to start")


LOG_X = """echo '{"monkey": {"acc": {x}}}'"""  # a run's metric: its parameter x


@pytest.mark.system
def test_a_sweeps_progress_follows_its_runs_without_a_reload(node, browser, tmp_path):
    flag = tmp_path / "go"
    done = node.server(
        "sweep",
        "--grid",
        "x=1,2",
        "--metric",
        "acc",
        "--",
        "sh",
        "-c",
        f"while [ ! -e {flag} ]; do sleep 0.05; done; " + LOG_X,
    )
    assert done.returncode == 0, done.stderr
    sid = json.loads(node.server("list", "sweeps", "--json").stdout)[0]["id"]
    page = page_for(browser)
    login(page, node, node.token, f"/web/sweeps/{sid}")
    assert "0 of 2 ended" in page.inner_text("#sweep-facts")
    assert page.query_selector("#sweep-facts button.act-cancel")
    page.wait_for_selector("#parcoords path.run", state="attached")  # no metric: no line yet
    assert page.eval_on_selector_all("#parcoords path.run:not(.none)", "ps => ps.length") == 0
    page.evaluate("window.sameDocument = 1")
    flag.touch()
    page.wait_for_selector("#sweep-facts >> text=2 of 2 ended")
    assert "2 succeeded" in page.inner_text("#sweep-facts")
    # the runs table and the parallel coordinates follow too: both runs ended with a metric
    wait_for(
        lambda: (
            page.eval_on_selector_all("table.runs td .state", "ss => ss.map(s => s.textContent)")
            == ["succeeded", "succeeded"]
        ),
        what="the runs table to show both ended",
    )
    wait_for(
        lambda: page.eval_on_selector_all("#parcoords path.run:not(.none)", "ps => ps.length") == 2,
        what="the parallel coordinates to draw both runs' metric",
    )
    assert page.get_attribute("table.runs tr.best", "data-job") == page.get_attribute(
        "#parcoords path.best", "data-job"
    )
    assert page.evaluate("window.sameDocument") == 1


LOSS = (
    "import json, sys\n"
    "k = float(sys.argv[1])\n"
    "for step in range(0, 300, 5):\n"
    "    print(json.dumps({'monkey': {'loss': k / (step + 1), 'step': step}}))\n"
    "    if step % 100 == 0:\n"
    "        print(json.dumps({'monkey': {'epoch': step // 100, 'step': step}}))\n"
)


@pytest.mark.system
def test_a_runs_charts_overlay_its_sweeps_runs_and_go_by_step_epoch_or_time(node, browser):
    done = node.server("sweep", "--grid", "k=1,2,3", "--", sys.executable, "-c", LOSS, "{k}")
    assert done.returncode == 0, done.stderr
    runs = json.loads(node.server("list", "jobs", "--json").stdout)["jobs"]
    for run in runs:
        wait_for(lambda j=run["job"]: state_of(node, j) == "succeeded", timeout=180)
    juid = next(r["job"] for r in runs if r["params"] == {"k": 1})
    for run in runs:  # every run's metrics read in, not only its state ended
        wait_for(lambda j=run["job"]: "loss" in node.server("metrics", j).stdout, timeout=60)
    page = page_for(browser)
    login(page, node, node.token, f"/web/jobs/{juid}")
    page.wait_for_selector("#charts figure canvas")
    series = "monkeyCharts.loss.series.length"
    assert page.evaluate(series) == 2  # x and this run
    assert "Overlay sweep runs (2)" in page.inner_text("#charts-h + .logbar")
    page.check("#overlay-runs")
    page.wait_for_selector("#charts figure canvas")
    wait_for(lambda: page.evaluate(f"window.monkeyCharts.loss && {series}") == 4, timeout=30)
    labels = page.evaluate("monkeyCharts.loss.series.map(s => s.label)")
    assert labels[1] == "loss" and sorted(labels[2:]) == sorted(
        r["job"] for r in runs if r["job"] != juid
    )
    # x by epoch: steps 0..295 with epochs logged at steps 0, 100, 200 -> 0 to 2
    page.select_option("#xby", "epoch")
    wait_for(
        lambda: page.evaluate("window.monkeyCharts.loss && monkeyCharts.loss.data[0].at(-1)") == 2
    )
    xs_epoch = page.evaluate("monkeyCharts.loss.data[0]")
    assert xs_epoch[0] == 0 and 1.4 < xs_epoch[len(xs_epoch) // 2] < 1.6
    assert page.evaluate("monkeyCharts.loss.series.length") == 4  # still overlaid
    # x by time: seconds since the run started, small and increasing
    page.select_option("#xby", "time")
    wait_for(
        lambda: (
            page.evaluate("window.monkeyCharts.loss && monkeyCharts.loss.series[0].label")
            == "seconds"
        )
    )
    t = page.evaluate("monkeyCharts.loss.data[0]")
    assert 0 <= t[0] <= t[-1] < 600
    page.uncheck("#overlay-runs")
    wait_for(lambda: page.evaluate(f"window.monkeyCharts.loss && {series}") == 2, timeout=30)
    got = page.request.get(node.url + f"/web/jobs/{juid}/metrics?x=epoch&width=50").json()
    assert got["loss"]["by"] == "epoch" and got["epoch"]["x"][-1] == 2
    bad = page.request.get(node.url + f"/web/jobs/{juid}/metrics?x=wall")
    assert "use one of step, epoch, time" in bad.json()["error"]
