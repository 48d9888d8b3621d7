"""Monkey Web as the place a researcher analyses runs (issue 43): charts that read right
(compact y labels never clipped, steps not dates, a zoom that stays and is shared across
panels) and a sweep's runs table that reads right. One main node seeded once for the
module (a sweep of small fake jobs, a job reaching 10^6, a job still running), driven by
Debian's chromium (the fixtures of tests/test_web.py)."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from conftest import REPO, kill_all, plain_terminal, wait_for
from mainnode import MainNode
from test_web import browser, login, page_for, run_job, state_of  # noqa: F401 - browser: a fixture

BIG = (  # a counter that reaches 1.2 million
    "import json\n"
    "for step in range(40):\n"
    "    print(json.dumps({'monkey': {'tokens': step * 30000, 'step': step}}))\n"
)
RUNNING = (  # two metrics logged until the job is cancelled
    "import json, time\n"
    "step = 0\n"
    "while True:\n"
    "    print(json.dumps({'monkey': {'loss': 1 / (step + 1), 'acc': step / (step + 9),"
    " 'step': step}}), flush=True)\n"
    "    step += 1\n"
    "    time.sleep(0.1)\n"
)
TRAIN = (  # a sweep's cell: a few points of loss and acc; lr=1 diverges
    "import json, sys\n"
    "lr, depth = float(sys.argv[1]), int(sys.argv[2])\n"
    "for step in range(0, 41, 10):\n"
    "    loss = 3.855e-07 * depth / 2 * lr * 1000 * (1 + (40 - step) / 10)\n"
    "    if lr >= 1 and step == 20:\n"
    "        print(json.dumps({'monkey': {'loss': 1e6, 'step': step}}))\n"
    "        sys.exit('FloatingPointError: loss diverged at step %d' % step)\n"
    "    print(json.dumps({'monkey': {'loss': loss, 'acc': 1 - loss, 'step': step}}))\n"
)


@dataclass
class Seeded:
    node: MainNode
    big: str  # a finished job whose metric reaches 1.2M
    running: str  # a job logging loss and acc until the module ends
    sweep: str  # a 12-cell lr x depth sweep, 4 parameters constant, 3 runs diverged
    runs: list[dict]


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seeded]:
    tmp = tmp_path_factory.mktemp("analysis")
    root = tmp / "mh"
    work = tmp / "project"
    work.mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MONKEY_HOME", str(root))
        mp.setenv("MONKEY_HEARTBEAT", "0.5")
        mp.setenv("MONKEY_KILL_GRACE", "3")
        mp.setenv("PYTHONPATH", str(REPO))
        plain_terminal(mp)
        mp.chdir(work)
        root.mkdir()
        (root / "providers.yml").write_text("providers:\n  local: {type: local, slots: 6}\n")
        node = MainNode(root, tmp)
        node.start()
        try:
            big = run_job(node, sys.executable, "-c", BIG, name="big-counter")
            running = run_job(node, sys.executable, "-c", RUNNING, name="live-train")
            done = node.server(
                "sweep",
                "--name",
                "depth-scan",
                "--metric",
                "loss",
                "--goal",
                "min",
                "--retries",
                "0",
                "--grid",
                "lr=0.001,0.01,0.1,1",
                "--grid",
                "depth=2,4,8",
                "--grid",
                "seed=0",
                "--grid",
                "opt=sgd",
                "--grid",
                "wd=0",
                "--grid",
                "batch=64",
                "--",
                sys.executable,
                "-c",
                TRAIN,
                "{lr}",
                "{depth}",
                "{seed}",
                "{opt}",
                "{wd}",
                "{batch}",
            )
            assert done.returncode == 0, done.stderr
            sweep = json.loads(node.server("list", "sweeps", "--json").stdout)[0]["id"]
            jobs = json.loads(node.server("list", "jobs", "--json").stdout)["jobs"]
            runs = [r for r in jobs if "depth" in (r["params"] or {})]
            assert len(runs) == 12
            for juid in [big, *(r["job"] for r in runs)]:
                wait_for(
                    lambda j=juid: state_of(node, j) in ("succeeded", "failed"),
                    timeout=180,
                    what=f"{juid} to end",
                )
            for juid in [big, *(r["job"] for r in runs)]:  # every point read in
                wait_for(lambda j=juid: node.server("metrics", j).stdout.strip(), timeout=60)
            yield Seeded(node, big, running, sweep, runs)
        finally:
            node.close()
            kill_all(f"MONKEY_HOME={root}")


def chart_of(page, name: str) -> str:
    """The selector of metric NAME's chart (its drag-and-zoom surface)."""
    return f"#charts figure:has(h3:text-is('{name}')) .u-over"


TICKS = """name => {  // each y tick label drawn, and its left edge in the chart (CSS px)
    const u = monkeyCharts[name], a = u.axes[1], dpr = devicePixelRatio;
    u.ctx.font = a.font[0];
    const right = u.bbox.left / dpr - a.ticks.size - a.gap;
    return a._values.map(v => [v, right - u.ctx.measureText(v).width / dpr]);
}"""


@pytest.mark.system
def test_large_values_get_compact_y_labels_that_fit_the_chart(seeded, browser):
    page = page_for(browser)
    login(page, seeded.node, seeded.node.token, f"/web/jobs/{seeded.big}")
    page.wait_for_selector(chart_of(page, "tokens"))
    ticks = page.evaluate(TICKS, "tokens")
    labels = [t for t, _ in ticks]
    assert "0" in labels and any(t in ("1M", "1.2M") for t in labels), labels
    assert not any("," in t or len(t) > 5 for t in labels), labels  # not 1,200,000
    clipped = [(t, round(left, 1)) for t, left in ticks if left < 0]
    assert not clipped, ticks  # every label whole inside the chart's box
    page.check("#logy")  # on a log scale too: 10, 100, 1k, 10k, 100k, 1M
    wait_for(
        lambda: page.evaluate("monkeyCharts.tokens && monkeyCharts.tokens.scales.y.distr") == 3
    )
    ticks = page.evaluate(TICKS, "tokens")
    labels = [t for t, _ in ticks]
    assert "1M" in labels and "100k" in labels, labels
    assert all(left >= 0 for _, left in ticks), ticks


@pytest.mark.system
def test_compared_runs_are_drawn_by_step_not_as_dates(seeded, browser):
    a, b = (r["job"] for r in seeded.runs[:2])
    page = page_for(browser)
    login(page, seeded.node, seeded.node.token, f"/web/compare?job={a}&job={b}")
    page.wait_for_selector("#overlay figure:has(h3:text-is('loss')) .u-over")
    xs = page.evaluate("monkeyCharts.loss.axes[0]._values")
    assert xs and all(t.isdigit() and 0 <= int(t) <= 40 for t in xs), xs  # steps 0..40
    assert page.evaluate("monkeyCharts.loss.series[0].label") == "step"


def x_range(page, name: str) -> list[float]:
    return page.evaluate(
        f"[monkeyCharts[{name!r}].scales.x.min, monkeyCharts[{name!r}].scales.x.max]"
    )


def drag(page, name: str, start: float, end: float) -> None:
    """Drag across metric NAME's chart from START to END (fractions of its width)."""
    chart = page.locator(chart_of(page, name))
    chart.scroll_into_view_if_needed()
    box = chart.bounding_box()
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + box["width"] * start, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * end, y, steps=5)
    page.mouse.up()


@pytest.mark.system
def test_a_zoom_is_shared_across_panels_and_survives_the_live_refresh(seeded, browser):
    page = page_for(browser)
    login(page, seeded.node, seeded.node.token, f"/web/jobs/{seeded.running}")
    for name in ("loss", "acc"):
        page.wait_for_selector(chart_of(page, name))
    wait_for(lambda: page.evaluate("monkeyCharts.loss.data[0].at(-1)") >= 20, timeout=60)
    # the output above has grown to its full height: the charts stay where they are
    wait_for(lambda: page.evaluate("log.scrollHeight > log.clientHeight + 100"), timeout=60)
    assert page.is_checked("#syncx")  # zooming together is the default
    drag(page, "loss", 0.3, 0.6)
    zoomed = x_range(page, "loss")
    last = page.evaluate("monkeyCharts.loss.data[0].at(-1)")
    assert zoomed[1] < last  # zoomed in, not the whole run
    assert x_range(page, "acc") == zoomed  # the other panel follows
    # the page's live refresh brings new points (every 10 s): the zoom stays
    wait_for(
        lambda: page.evaluate("monkeyCharts.loss.data[0].at(-1)") > last,
        timeout=30,
        what="a live refresh",
    )
    assert x_range(page, "loss") == zoomed and x_range(page, "acc") == zoomed
    # a double-click zooms every panel out to the whole run
    page.dblclick(chart_of(page, "loss"))
    full = page.evaluate("[monkeyCharts.acc.data[0][0], monkeyCharts.acc.data[0].at(-1)]")
    assert x_range(page, "acc") == full
    # each panel on its own when the toggle is off
    page.uncheck("#syncx")
    drag(page, "acc", 0.5, 0.8)
    assert x_range(page, "acc")[1] < page.evaluate("monkeyCharts.acc.data[0].at(-1)")
    assert x_range(page, "loss")[0] == page.evaluate("monkeyCharts.loss.data[0][0]")


def header(page) -> list[str]:
    return page.eval_on_selector_all(
        "table.runs thead th[data-col]", "hs => hs.map(h => h.dataset.col)"
    )


def axes(page) -> list[str]:
    return page.eval_on_selector_all("#parcoords g.axis", "gs => gs.map(g => g.dataset.axis)")


@pytest.mark.system
def test_the_runs_table_keeps_numbers_on_one_line_leads_with_the_goal_and_hides_constants(
    seeded, browser
):
    page = page_for(browser, viewport={"width": 600, "height": 900})
    login(page, seeded.node, seeded.node.token, f"/web/sweeps/{seeded.sweep}")
    page.wait_for_selector("#parcoords path.run")
    # the goal metric's best and last first; parameters and metrics told apart
    assert header(page) == [
        *("job", "state", "loss:best", "loss", "depth", "lr", "acc", "acc:best", "name")
    ]
    groups = page.eval_on_selector_all(
        "table.runs tr.groups th", "hs => hs.map(h => [h.innerText.trim(), h.colSpan])"
    )
    assert groups == [["", 2], ["Goal metric", 2], ["Parameters", 2], ["Metrics", 2], ["", 1]]
    heads = page.eval_on_selector_all(
        "table.runs thead th[data-col] a", "as => as.map(a => a.innerText)"
    )
    assert heads[2:8] == ["loss best", "loss last", "depth", "lr", "acc last", "acc best"]
    # the four parameters constant across the sweep: hidden from the table and the axes
    assert axes(page) == ["depth", "lr", "loss:best"]
    said = page.inner_text(".constants")
    assert all(f"{p}=" in said for p in ("seed", "opt", "wd", "batch")), said
    # numbers never wrap: each row one line tall, 3.855e-07 on one line
    lines = page.evaluate(
        """() => [...document.querySelectorAll('table.runs tbody td')]
            .filter(td => td.innerText === '3.855e-07').map(td => {
                const r = document.createRange(); r.selectNodeContents(td);
                return r.getClientRects().length; })"""
    )
    assert lines and all(n == 1 for n in lines), lines
    one = page.evaluate(
        "parseFloat(getComputedStyle(document.querySelector('table.runs tbody td')).lineHeight)"
    )
    heights = page.eval_on_selector_all(
        "table.runs tbody tr", "rs => rs.map(r => r.getBoundingClientRect().height)"
    )
    assert len(heights) == 12 and max(heights) < 2 * one, (one, heights)
    # shown on request, in the table and on the axes; the job column stays in view
    page.click("#constants-toggle")
    page.wait_for_url("**constants=1**")
    assert {"seed", "opt", "wd", "batch"} <= set(header(page))
    assert {"seed", "opt", "wd", "batch"} <= set(axes(page))
    runs = page.locator("#sweep-runs")
    assert runs.evaluate("r => r.scrollWidth > r.clientWidth")  # wider than the page
    runs.evaluate("r => { r.scrollLeft = r.scrollWidth; }")
    job = page.locator("table.runs tbody tr >> nth=0 >> th").bounding_box()
    assert abs(job["x"] - runs.bounding_box()["x"]) < 2
    # a sort keeps the constants shown
    page.click("table.runs thead th[data-col='lr'] a")
    page.wait_for_url("**sort=lr**")
    assert "constants=1" in page.url and "seed" in header(page)
    assert page.evaluate("document.documentElement.scrollWidth") <= 600  # the table scrolls


def jobs_column(page, key: str) -> list[str]:
    """The cells of the jobs list's column KEY (its header's data-sort), top to bottom."""
    heads = page.eval_on_selector_all("table.jobs thead th", "hs => hs.map(h => h.dataset.sort)")
    i = heads.index(key)
    return page.eval_on_selector_all(
        f"table.jobs tbody tr > :nth-child({i + 1})", "ts => ts.map(t => t.innerText.trim())"
    )


@pytest.mark.system
def test_the_jobs_list_sorts_by_a_column_and_filters_by_sweep_name_and_name_glob(seeded, browser):
    page = page_for(browser)
    login(page, seeded.node, seeded.node.token, "/web/jobs")
    assert "14 jobs" in page.inner_text(".count")
    # sort by exit code: the three diverged runs (exit 1) first, the running job last
    page.click("table.jobs th[data-sort='exit'] a")
    page.wait_for_url("**sort=exit**")
    exits = jobs_column(page, "exit")
    assert exits == ["1"] * 3 + ["0"] * 10 + [""], exits
    page.click("table.jobs th[data-sort='exit'] a")  # again: the other way
    page.wait_for_url("**reverse=1**")
    assert jobs_column(page, "exit") == ["0"] * 10 + ["1"] * 3 + [""]
    names = jobs_column(page, "name")
    page.click("table.jobs th[data-sort='name'] a")
    page.wait_for_url("**sort=name**")
    assert jobs_column(page, "name") == sorted(names)
    # the sweep filter takes the sweep's name, as `monkey compare --sweep` does; the sort stays
    page.fill("input[name=sweep]", "depth-scan")
    page.click("form.filters button[type=submit]")
    page.wait_for_url("**sweep=depth-scan**")
    assert "12 jobs" in page.inner_text(".count") and "sort=name" in page.url
    rows = page.eval_on_selector_all("table.jobs tbody tr", "rs => rs.length")
    assert rows == 12
    # the name filter takes a shell-style pattern, as `monkey compare --name` does
    page.goto(seeded.node.url + "/web/jobs?name=big-*")
    assert jobs_column(page, "name") == ["big-counter"]
    page.goto(seeded.node.url + "/web/jobs?name=*train")
    assert jobs_column(page, "name") == ["live-train"]
    page.goto(seeded.node.url + "/web/jobs?name=counter")  # a part of the name, as before
    assert jobs_column(page, "name") == ["big-counter"]
    bad = page.request.get(seeded.node.url + "/web/jobs?sort=colour")
    assert bad.status == 400 and "use one of job, name" in bad.text()
    missing = page.request.get(seeded.node.url + "/web/jobs?sweep=no-such-sweep")
    assert missing.status == 400 and "no-such-sweep" in missing.text()


@pytest.mark.system
def test_the_jobs_list_names_each_runs_sweep_a_failed_runs_error_and_a_searchs_line(
    seeded, browser
):
    page = page_for(browser)
    login(page, seeded.node, seeded.node.token, f"/web/jobs?sweep={seeded.sweep}")
    sweeps = page.eval_on_selector_all(
        "table.jobs tbody tr",
        "rs => rs.map(r => r.querySelector('a[href^=\"/web/sweeps/\"]'))"
        ".map(a => a && [a.innerText, a.getAttribute('href')])",
    )
    assert sweeps == [["depth-scan", f"/web/sweeps/{seeded.sweep}"]] * 12
    # a failed run says why, as its output's last exception line
    page.click("table.jobs th[data-sort='exit'] a")
    page.wait_for_url("**sort=exit**")
    why = page.eval_on_selector_all(
        "table.jobs tbody tr", "rs => rs.map(r => r.querySelector('.why')?.innerText ?? '')"
    )
    assert why == ["FloatingPointError: loss diverged at step 20"] * 3 + [""] * 9, why
    # a search shows the line it found, where, as `monkey search` does
    page.goto(seeded.node.url + "/web/jobs?q=diverged+at+step+20")
    assert "3 jobs" in page.inner_text(".count")
    found = page.eval_on_selector_all(".jobs .found", "fs => fs.map(f => f.innerText)")
    assert found == ["stderr, attempt 1: FloatingPointError: loss diverged at step 20"] * 3


@pytest.mark.system
def test_the_jobs_list_shows_chosen_parameters_and_metrics_remembered_per_user(seeded, browser):
    page = page_for(browser)
    login(page, seeded.node, seeded.node.token, f"/web/jobs?sweep={seeded.sweep}")
    page.click("details.columns summary")
    for key in ("param:lr", "last:loss", "best:acc"):
        page.check(f"details.columns input[value='{key}']")
    page.click("details.columns button[type=submit]")
    page.wait_for_url("**cols=1**")
    assert "sweep=" in page.url  # the filters kept
    heads = page.eval_on_selector_all("table.jobs th.chosen", "hs => hs.map(h => h.innerText)")
    assert heads == ["lr", "acc best", "loss last"]  # in the order offered
    best = next(
        r["job"] for r in seeded.runs if r["params"]["lr"] == 0.001 and r["params"]["depth"] == 2
    )
    row = page.eval_on_selector(
        f"table.jobs tbody tr:has(a[href='/web/jobs/{best}'])",
        "r => [...r.querySelectorAll('td.num')].map(t => t.innerText)",
    )
    assert row == ["0.001", "1", "3.855e-07"]
    # sorted by a chosen metric: best first (loss: the lowest), the diverged runs last
    page.click("table.jobs th[data-sort='last:loss'] a")
    page.wait_for_url("**sort=last%3Aloss**")
    losses = [float(v) for v in jobs_column(page, "last:loss")]
    assert losses == sorted(losses) and losses[-3:] == [1e6] * 3
    assert jobs_column(page, "job")[0] == best
    page.click("table.jobs th[data-sort='param:lr'] a")
    page.wait_for_url("**sort=param%3Alr**")
    assert [float(v) for v in jobs_column(page, "param:lr")] == [0.001] * 3 + [0.01] * 3 + [
        0.1
    ] * 3 + [1.0] * 3
    # remembered: the plain list shows them again; another user's list does not
    page.goto(seeded.node.url + "/web/jobs")
    assert page.eval_on_selector_all("table.jobs th.chosen", "hs => hs.length") == 3
    bob = page_for(browser)
    login(bob, seeded.node, seeded.node.add_user("bob"), "/web/jobs")
    assert bob.eval_on_selector_all("table.jobs th.chosen", "hs => hs.length") == 0
    bad = page.request.get(seeded.node.url + "/web/jobs?cols=1&col=colour:red")
    assert bad.status == 400 and "use param:NAME, last:METRIC or best:METRIC" in bad.text()
    page.goto(seeded.node.url + "/web/jobs?cols=1")  # none chosen: none shown, remembered
    page.goto(seeded.node.url + "/web/jobs")
    assert page.eval_on_selector_all("table.jobs th.chosen", "hs => hs.length") == 0


def labels(page, name: str) -> list[str]:
    """The legend of metric NAME's chart: its series' labels, x left out."""
    return page.evaluate(f"monkeyCharts[{name!r}].series.slice(1).map(s => s.label)")


def y_range(page, name: str) -> list[float]:
    return page.evaluate(
        f"[monkeyCharts[{name!r}].scales.y.min, monkeyCharts[{name!r}].scales.y.max]"
    )


def redrawn(page, name: str, check: str) -> None:
    """Wait until metric NAME's chart, drawn again, has CHECK (a JS expression of u)."""
    wait_for(lambda: page.evaluate(f"(u => !!u && ({check}))(monkeyCharts[{name!r}])"))


@pytest.mark.system
def test_a_sweeps_curves_compare_runs_by_their_parameters(seeded, browser):
    page = page_for(browser)
    login(page, seeded.node, seeded.node.token, f"/web/sweeps/{seeded.sweep}")
    page.wait_for_selector("#overlay figure:has(h3:text-is('loss')) .u-over")
    # each run named by the parameters that differ (not the four constants)
    named = {f"depth={r['params']['depth']} lr={r['params']['lr']:g}" for r in seeded.runs}
    assert sorted(labels(page, "loss")) == sorted(named)
    assert "depth=8 lr=0.1" in named
    assert y_range(page, "loss")[1] >= 1e6  # the diverged runs' 1e6 squeezes the others
    page.check("#no-outliers")
    redrawn(page, "loss", "u.scales.y.max < 1")
    low, high = y_range(page, "loss")
    assert high >= 3.855e-07 * 4 * 1000 * 5  # the largest ordinary point (depth=8 lr=1) kept
    # hovering a curve picks its run out: the others fade, its legend is named
    u = "monkeyCharts.loss"
    i = page.evaluate(f"{u}.series.findIndex(s => s.label === 'depth=8 lr=1')")
    x, y = page.evaluate(
        f"[{u}.valToPos(0, 'x'), {u}.valToPos({u}.data[{i}][{u}.data[0].indexOf(0)], 'y')]"
    )
    over = page.locator("#overlay figure:has(h3:text-is('loss')) .u-over")
    over.scroll_into_view_if_needed()
    box = over.bounding_box()
    page.mouse.move(box["x"] + x + 3, box["y"] + y + 1)
    wait_for(lambda: page.evaluate(f"{u}.series[{i}]._focus") is True)
    faded = page.evaluate(f"{u}.series.filter((s, k) => k > 0 && k !== {i}).map(s => s._focus)")
    assert faded and not any(faded), faded
    assert page.inner_text("#overlay figure:has(h3:text-is('loss')) .hovered") == "depth=8 lr=1"
    # hide the failed runs: the three lr=1 runs leave the legend
    page.check("#hide-failed")
    redrawn(page, "loss", "u.series.length === 10")
    assert sorted(labels(page, "loss")) == sorted(n for n in named if not n.endswith(" lr=1"))
    # grouped by depth: one mean per depth in a band of ± one standard deviation
    page.select_option("#group-by", "depth")
    redrawn(page, "loss", "u.series.length === 10 && u.series[1].label.startsWith('depth=')")
    means = [f"depth={d} (mean of 3)" for d in (2, 4, 8)]
    assert labels(page, "loss")[0::3] == means
    legend = page.eval_on_selector_all(  # the bands' edges left out of the legend
        "#overlay figure:has(h3:text-is('loss')) .u-legend .u-series",
        "rs => rs.filter(r => r.offsetParent).map(r => r.innerText.trim())",
    )
    assert legend == means
    at = page.evaluate(f"{u}.data[0].indexOf(40)")
    mean, hi, lo = page.evaluate(f"[1, 2, 3].map(k => {u}.data[k][{at}])")
    ys = [3.855e-07 * 2 / 2 * lr * 1000 for lr in (0.001, 0.01, 0.1)]  # depth 2 at step 40
    m = sum(ys) / 3
    sd = (sum((v - m) ** 2 for v in ys) / 3) ** 0.5
    assert mean == pytest.approx(m, rel=1e-3) and hi == pytest.approx(m + sd, rel=1e-3)
    assert lo == pytest.approx(m - sd, rel=1e-3)
    assert page.evaluate(f"{u}.bands.length") == 3
    # the report's plots: loss against each varying parameter, and the best so far
    titles = page.eval_on_selector_all(
        "#scatters svg.scatter > text:first-child", "t => t.map(e => e.textContent)"
    )
    assert titles == ["loss by depth", "loss by lr"]
    assert page.eval_on_selector_all("#scatters svg:first-child circle.dot", "c => c.length") == 12
    assert page.locator("#best-so-far polyline.best-so-far").count() == 1
    page.set_viewport_size({"width": 360, "height": 740})  # on a phone: nothing wider
    page.reload()
    page.wait_for_selector("#overlay figure:has(h3:text-is('loss')) .u-over")
    assert page.evaluate("document.documentElement.scrollWidth") <= 360


@pytest.mark.system
def test_runs_picked_in_the_jobs_list_are_compared_by_the_parameters_that_differ(seeded, browser):
    pick = {
        r["job"]: r["params"]["lr"]
        for r in seeded.runs
        if r["params"]["depth"] == 8 and r["params"]["lr"] in (0.01, 0.1)
    }
    page = page_for(browser)
    login(page, seeded.node, seeded.node.token, f"/web/jobs?sweep={seeded.sweep}")
    for juid in pick:
        page.check(f"input[name=job][value='{juid}']")
    page.click("form.pick button[type=submit]")
    page.wait_for_url("**/web/compare?**")
    page.wait_for_selector("#overlay figure:has(h3:text-is('acc')) .u-over")
    # depth is 8 in both: the legend names lr alone
    assert sorted(labels(page, "acc")) == ["lr=0.01", "lr=0.1"]
    assert page.locator("#group-by option[value='lr']").count() == 1


TQDM = (  # an epoch line on stdout, a progress bar redrawn 200 times on stderr, then a crash
    "import sys, time\n"
    "print('epoch 1 of 1', flush=True)\n"
    "for i in range(201):\n"
    "    sys.stderr.write('\\rtrain: %3d%%|%-20s| %d/200' % (i // 2, '#' * (i // 10), i))\n"
    "    sys.stderr.flush()\n"
    "    if i % 50 == 0:\n"
    "        time.sleep(0.05)\n"
    "sys.stderr.write('\\n')\n"
    "print('saving', flush=True)\n"
    "1 / 0\n"
)


@pytest.mark.system
def test_the_log_shows_progress_bars_as_a_terminal_and_leads_to_the_error(seeded, browser):
    juid = run_job(seeded.node, sys.executable, "-c", TQDM, name="tqdm-crash")
    wait_for(lambda: state_of(seeded.node, juid) == "failed", timeout=60, what="the crash")
    page = page_for(browser)
    login(page, seeded.node, seeded.node.token, f"/web/jobs/{juid}")
    wait_for(lambda: "ZeroDivisionError" in page.inner_text("#log"), timeout=30)
    text = page.inner_text("#log")
    bars = [line for line in text.splitlines() if line.startswith("train:")]
    assert bars == ["train: 100%|####################| 200/200"], repr(text)  # its last state only
    assert "epoch 1 of 1" in text and "ZeroDivisionError: division by zero" in text
    # the header says why beside "failed — exit 1"
    state = page.inner_text("#job-facts dd:has(#state)")
    assert "failed — exit 1" in state and "ZeroDivisionError: division by zero" in state, state
    # one stream at a time
    page.select_option("#streams", "out")
    shown = page.inner_text("#log")
    assert "epoch 1 of 1" in shown and "saving" in shown and "Traceback" not in shown
    page.select_option("#streams", "err")
    shown = page.inner_text("#log")
    assert "Traceback" in shown and "epoch 1 of 1" not in shown
    page.select_option("#streams", "")
    # straight to the first Traceback: marked, scrolled into the log's view
    page.click("#first-error")
    assert not page.is_checked("#follow")
    marked = page.evaluate("[...CSS.highlights.get('found-here')].map(r => r.toString())")
    assert marked == ["Traceback (most recent call last)"]
    top = page.evaluate(
        """() => { const r = [...CSS.highlights.get('found-here')][0].getBoundingClientRect(),
            l = log.getBoundingClientRect(); return [r.top - l.top, l.height]; }"""
    )
    assert 0 <= top[0] < top[1], top
    # the output's pause says it pauses the output, not the job
    assert page.inner_text("#pause") == "Pause output"
    assert page.locator("button", has_text="Pause").count() == 1


@pytest.mark.system
def test_a_running_jobs_progress_bar_is_rewritten_in_place(seeded, browser):
    live = (
        "import sys, time\n"
        "for i in range(10**6):\n"
        "    sys.stderr.write('\\rstep %d' % i); sys.stderr.flush(); time.sleep(0.02)\n"
    )
    juid = run_job(seeded.node, sys.executable, "-c", live, name="live-bar")
    page = page_for(browser)
    login(page, seeded.node, seeded.node.token, f"/web/jobs/{juid}")
    wait_for(lambda: "step 5" in page.inner_text("#log"), timeout=60, what="the bar")
    first = page.inner_text("#log").strip()
    wait_for(lambda: page.inner_text("#log").strip() != first, timeout=30, what="a redraw")
    lines = page.inner_text("#log").strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("step "), lines  # one line, redrawn
    seeded.node.server("cancel", juid)


class Asked:
    """The page's confirmation dialogs: their questions, each answered ANSWER."""

    def __init__(self, page, answer: bool) -> None:
        self.questions: list[str] = []
        self.answer = answer
        page.on("dialog", self.reply)

    def reply(self, dialog) -> None:
        self.questions.append(dialog.message)
        dialog.accept() if self.answer else dialog.dismiss()


@pytest.mark.system
def test_a_running_jobs_cancel_asks_first_naming_the_job_and_its_runtime(seeded, browser):
    juid = run_job(seeded.node, "sleep", "300", name="long-sleep")
    wait_for(lambda: state_of(seeded.node, juid) == "running", timeout=60, what="the job to run")
    page = page_for(browser)
    login(page, seeded.node, seeded.node.token, f"/web/jobs/{juid}")
    asked = Asked(page, answer=False)
    page.click("button.act-cancel")
    wait_for(lambda: asked.questions)
    question = asked.questions[0]
    assert question.startswith(f"Cancel job {juid} (long-sleep)? This stops it for good"), question
    assert re.search(r"its \d+(\.\d)?s of running so far is lost\.$", question), question
    assert page.url.endswith(f"/web/jobs/{juid}") and state_of(seeded.node, juid) == "running"
    asked.answer = True  # yes: cancelled, through the same checked form
    page.click("button.act-cancel")
    wait_for(lambda: state_of(seeded.node, juid) == "cancelled", timeout=60, what="the cancel")
    assert len(asked.questions) == 2
    forged = page.request.post(  # the CSRF check is still there
        seeded.node.url + f"/web/jobs/{seeded.running}/action", form={"action": "cancel"}
    )
    assert forged.status == 403 and state_of(seeded.node, seeded.running) == "running"


@pytest.mark.system
def test_a_sweeps_cancel_all_and_retry_all_ask_first(seeded, browser):
    done = seeded.node.server(
        "sweep", "--name", "naps", "--grid", "t=300,301", "--", "sleep", "{t}"
    )
    assert done.returncode == 0, done.stderr
    naps = json.loads(seeded.node.server("list", "sweeps", "--json").stdout)
    sid = next(s["id"] for s in naps if s["name"] == "naps")
    cells = [
        j["job"]
        for j in json.loads(seeded.node.server("list", "jobs", "--json").stdout)["jobs"]
        if j["sweep"] == sid
    ]
    for juid in cells:
        wait_for(lambda j=juid: state_of(seeded.node, j) == "running", timeout=60)
    page = page_for(browser)
    login(page, seeded.node, seeded.node.token, f"/web/sweeps/{sid}")
    asked = Asked(page, answer=False)
    page.click("button.act-cancel")
    wait_for(lambda: asked.questions)
    question = asked.questions[-1]
    assert question.startswith(
        f"Cancel all of sweep {sid} (naps)? This stops its 2 unfinished runs"
    ), question
    assert re.search(r"\(2 running\); \d+(\.\d)?s of running is lost\.$", question), question
    assert all(state_of(seeded.node, j) == "running" for j in cells)
    asked.answer = True
    page.click("button.act-cancel")
    for juid in cells:
        wait_for(lambda j=juid: state_of(seeded.node, j) == "cancelled", timeout=60)
    # Retry all on the seeded sweep: its three diverged runs named, nothing done on "no"
    asked.answer = False
    page.goto(seeded.node.url + f"/web/sweeps/{seeded.sweep}")
    page.click("button.act-retry")
    wait_for(lambda: len(asked.questions) == 3)
    question = asked.questions[-1]
    assert question.startswith(
        f"Retry all of sweep {seeded.sweep} (depth-scan)? This runs its 3 failed"
    ), question
    failed = [r["job"] for r in seeded.runs if r["params"]["lr"] == 1]
    assert [state_of(seeded.node, j) for j in failed] == ["failed"] * 3


# -- views in the URL (issue 43 item 9): a link reproduces them in a fresh browser ----------


def shown_rows(page) -> list[str]:
    return page.eval_on_selector_all(
        "table.runs tbody tr:not([hidden])", "rs => rs.map(r => r.dataset.job)"
    )


def same_view(url: str, link: str) -> bool:
    """Whether URL is LINK's page with the same view (its parameters in any order)."""
    from urllib.parse import parse_qs, urlsplit

    a, b = urlsplit(url), urlsplit(link)
    return a.path == b.path and parse_qs(a.query) == parse_qs(b.query)


def chosen(page) -> list[str]:
    return page.eval_on_selector_all("table.jobs th.chosen", "hs => hs.map(h => h.dataset.sort)")


@pytest.mark.system
def test_a_zoomed_smoothed_log_chart_is_reproduced_from_its_url(seeded, browser):
    run = seeded.runs[0]["job"]
    path = f"/web/jobs/{run}"
    page = page_for(browser)
    login(page, seeded.node, seeded.node.token, path)
    page.wait_for_selector(chart_of(page, "loss"))
    page.select_option("#xby", "epoch")
    page.check("#logy")
    page.locator("#smooth").fill("0.9")
    wait_for(lambda: page.evaluate("monkeyCharts.loss && monkeyCharts.loss.scales.y.distr") == 3)
    drag(page, "loss", 0.3, 0.7)
    zoomed = x_range(page, "loss")
    assert x_range(page, "acc") == zoomed
    link = page.url
    for part in ("x=epoch", "logy=1", "smooth=0.9", "zoom="):
        assert part in link, link
    # a colleague opens the link: another browser context (no cookie, nothing remembered)
    fresh = page_for(browser)
    login(fresh, seeded.node, seeded.node.token, link.removeprefix(seeded.node.url))
    fresh.wait_for_selector(chart_of(fresh, "acc"))
    wait_for(lambda: fresh.evaluate("monkeyCharts.loss && monkeyCharts.loss.scales.y.distr") == 3)
    assert fresh.input_value("#xby") == "epoch" and fresh.is_checked("#logy")
    assert fresh.input_value("#smooth") == "0.9"
    assert x_range(fresh, "loss") == zoomed and x_range(fresh, "acc") == zoomed
    # the same points, smoothed the same: the zoomed window fetched finer on both pages
    data = "monkeyCharts.loss.data[1]"
    wait_for(lambda: fresh.evaluate(data) == page.evaluate(data), what="the same smoothed window")
    assert same_view(fresh.url, link)
    # remembered in the first browser: the page opened without a view shows the last one
    page.goto(seeded.node.url + path)
    page.wait_for_selector(chart_of(page, "acc"))
    assert same_view(page.url, link) and x_range(page, "loss") == zoomed
    # zoomed out: the link says so
    page.dblclick(chart_of(page, "loss"))
    assert "zoom=" not in page.url and "smooth=0.9" in page.url


@pytest.mark.system
def test_the_jobs_lists_sort_and_columns_are_in_its_url(seeded, browser):
    page = page_for(browser)
    login(page, seeded.node, seeded.node.token, f"/web/jobs?sweep={seeded.sweep}")
    page.click("details.columns summary")
    for key in ("param:depth", "best:loss"):
        page.check(f"details.columns input[value='{key}']")
    page.click("details.columns button[type=submit]")
    page.wait_for_url("**cols=1**")
    page.click("table.jobs th[data-sort='best:loss'] a")
    page.wait_for_url("**sort=best%3Aloss**")
    link, order = page.url, jobs_column(page, "job")
    assert chosen(page) == ["param:depth", "best:loss"]
    # a colleague who chose no columns opens the link: the same columns, the same order
    dana = page_for(browser)
    login(dana, seeded.node, seeded.node.add_user("dana"), link.removeprefix(seeded.node.url))
    assert chosen(dana) == ["param:depth", "best:loss"]
    assert jobs_column(dana, "job") == order
    # remembered: the list opened plain comes back so sorted, its URL saying it
    page.goto(seeded.node.url + "/web/jobs")
    page.wait_for_url("**sort=best%3Aloss**")
    assert "col=param%3Adepth" in page.url and chosen(page) == ["param:depth", "best:loss"]


@pytest.mark.system
def test_a_sweeps_brush_and_sort_are_in_its_url(seeded, browser):
    path = f"/web/sweeps/{seeded.sweep}"
    page = page_for(browser)
    login(page, seeded.node, seeded.node.token, path)
    page.click("table.runs thead th[data-col='lr'] a")
    page.wait_for_url("**sort=lr**")
    page.wait_for_selector("#parcoords path.run")
    # brush the top of the goal metric's axis: the runs with the highest loss
    page.locator("#parcoords").scroll_into_view_if_needed()  # the mouse acts in view
    hit = page.locator("#parcoords g.axis[data-axis='loss:best'] rect.hit").bounding_box()
    x = hit["x"] + hit["width"] / 2
    page.mouse.move(x, hit["y"] + 2)
    page.mouse.down()
    page.mouse.move(x, hit["y"] + 60, steps=4)
    page.mouse.up()
    kept = shown_rows(page)
    assert 0 < len(kept) < 12, kept
    # its curves: the failed runs hidden, grouped by depth
    page.check("#hide-failed")
    page.select_option("#group-by", "depth")
    redrawn(page, "loss", "u.series.length === 1 + 3 * 3")  # a mean and its band per depth
    link, count = page.url, page.inner_text("#pc-count")
    for part in ("brush=loss%3Abest%3A", "sort=lr", "failed=hide", "group=depth"):
        assert part in link, link
    # in a fresh browser, narrower: the same runs kept
    fresh = page_for(browser, viewport={"width": 700, "height": 900})
    login(fresh, seeded.node, seeded.node.token, link.removeprefix(seeded.node.url))
    fresh.wait_for_selector("#parcoords path.run")
    assert shown_rows(fresh) == kept and fresh.inner_text("#pc-count") == count
    assert fresh.is_checked("#hide-failed") and fresh.input_value("#group-by") == "depth"
    redrawn(fresh, "loss", "u.series.length === 1 + 3 * 3")
    assert same_view(fresh.url, link)
    # remembered for this sweep: opened without a view, its brush and sort come back
    page.goto(seeded.node.url + path)
    page.wait_for_selector("#parcoords path.run")
    wait_for(lambda: "sort=lr" in page.url and "brush=" in page.url)
    wait_for(lambda: page.get_attribute("table.runs th[data-col='lr']", "aria-sort") is not None)
    wait_for(lambda: shown_rows(page) == kept)
