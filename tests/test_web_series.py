"""Monkey Web's long series (issue 43, item 7): a zoom fetches its window finer, the page
asks for each series once, a running job's refresh sends only the points since the page's
last (and its state line follows the log's feed rather than a poll a second), and pages
and series travel gzip-compressed; against a real main node, in Debian's chromium (the
fixtures of tests/test_web.py)."""

from __future__ import annotations

import gzip
import json
import math
import ssl
import sys
import urllib.request

import pytest
from conftest import wait_for
from mainnode import MainNode, node  # noqa: F401 - node: a fixture
from test_web import browser, login, page_for, run_job, state_of  # noqa: F401 - browser: a fixture

from monkey.api import Monkey
from monkey.store import Store
from monkey.tracking.ingest import as_columns
from monkey.tracking.series import SeriesCache

POINTS = 200_000
SPIKE = 101_234  # the step of a spike one point wide


def long_job(node: MainNode) -> str:
    """A finished job with a POINTS-point loss (a slow wave, one spike at step SPIKE),
    written straight into the main node's store."""
    juid = run_job(node, "true", name="long")
    wait_for(lambda: state_of(node, juid) == "succeeded", timeout=120, what="the job to end")
    m = Monkey(node.home)
    wall = m.store.get_job(juid).started_at
    rows = [
        ("loss", s, 40.0 if s == SPIKE else math.sin(s / 500), wall + s / 1000)
        for s in range(POINTS)
    ]
    with m.store.tx() as db:
        m.store._insert_columns(db, juid, 1, as_columns(rows))
    m.store.close()
    return juid


def chart(name: str) -> str:
    return f"#charts figure:has(h3:text-is('{name}')) .u-over"


def drag(page, name: str, start: float, end: float) -> None:
    """Drag across metric NAME's chart from x START to x END (its data's units)."""
    over = page.locator(chart(name))
    over.scroll_into_view_if_needed()
    box = over.bounding_box()
    left, right = (page.evaluate(f"monkeyCharts.{name}.valToPos({v}, 'x')") for v in (start, end))
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + left, y)
    page.mouse.down()
    page.mouse.move(box["x"] + right, y, steps=5)
    page.mouse.up()


IN_VIEW = """name => {  // the points drawn inside the x range shown: [how many, highest]
    const u = monkeyCharts[name], [xs, ys] = u.data, lo = u.scales.x.min, hi = u.scales.x.max;
    let n = 0, top = -Infinity;
    xs.forEach((x, i) => { if (x >= lo && x <= hi) { n++; top = Math.max(top, ys[i]); } });
    return [n, top];
}"""


@pytest.mark.system
def test_a_zoom_into_a_long_series_draws_its_window_finer_and_the_page_asks_once(node, browser):
    juid = long_job(node)
    page = page_for(browser)
    asked = []
    page.on("request", lambda r: "/metrics" in r.url and asked.append(r.url))
    login(page, node, node.token, f"/web/jobs/{juid}")
    page.wait_for_selector(chart("loss"))
    wait_for(lambda: "ended" in page.inner_text("#logstate"), what="the log's end")
    whole = page.evaluate("monkeyCharts.loss.data[0].length")
    # 2% of the run around the spike: its window comes again, finer
    with page.expect_request(lambda r: "/metrics" in r.url) as window:
        drag(page, "loss", SPIKE - 2000, SPIKE + 2000)
    assert "from=" in window.value.url and "to=" in window.value.url
    wait_for(lambda: page.evaluate(IN_VIEW, "loss")[0] > 20 * 20, what="the window drawn finer")
    drawn, top = page.evaluate(IN_VIEW, "loss")
    assert top == 40.0  # the spike inside the window is drawn
    assert "in this window" in page.inner_text("#charts figcaption")
    # a double-click goes back to the whole run, as drawn first
    page.dblclick(chart("loss"))
    wait_for(lambda: page.evaluate("monkeyCharts.loss.scales.x.max") == POINTS - 1)
    assert page.evaluate("monkeyCharts.loss.data[0].length") == whole
    # the series was asked for once, however the page loaded (the log's end included);
    # the whole was kept through the zoom: nothing asked again
    assert [u for u in asked if "from=" not in u] == asked[:1], asked


RUNNING = (  # two metrics logged until the job is cancelled
    "import json, time\n"
    "step = 0\n"
    "while True:\n"
    "    print(json.dumps({'monkey': {'loss': 1 / (step + 1), 'acc': step / (step + 9),"
    " 'step': step}}), flush=True)\n"
    "    step += 1\n"
    "    time.sleep(0.1)\n"
)


@pytest.mark.system
def test_a_running_jobs_refresh_asks_only_for_the_points_since_its_last(node, browser):
    juid = run_job(node, sys.executable, "-c", RUNNING, name="live")
    wait_for(lambda: state_of(node, juid) == "running", timeout=120, what="the job to run")
    wait_for(lambda: node.server("metrics", juid).stdout.strip(), timeout=60)
    page = page_for(browser)
    answers = []
    page.on("response", lambda r: "/metrics" in r.url and answers.append(r))
    polls = []
    page.on("request", lambda r: "/web/changed" in r.url and polls.append(r.url))
    try:
        login(page, node, node.token, f"/web/jobs/{juid}")
        page.wait_for_selector(chart("acc"))
        page.wait_for_selector("#log >> text=loss")
        polled = len(polls)
        first = answers[0].json()
        had = {n: list(s["x"]) for n, s in first.items()}
        # the next one (every 10 s): whatever it asks, read its answer
        page.wait_for_event("response", lambda r: "/metrics" in r.url, timeout=30_000)
        url, new = answers[1].url, answers[1].json()
        last = max(s["last"] for s in first.values())
        assert f"since={last}" in url  # the cursor: the last point the page has
        assert new and set(new) <= {"loss", "acc", *first}
        for name in ("loss", "acc"):
            assert new[name]["x"] and min(new[name]["x"]) > max(had[name])  # only new ones
        # appended to what the chart had, each point once
        wait_for(lambda: page.evaluate("monkeyCharts.loss.data[0].length") > len(had["loss"]))
        xs = page.evaluate("monkeyCharts.loss.data[0]")
        assert xs[: len(had["loss"])] == had["loss"]
        assert all(a < b for a, b in zip(xs, xs[1:])), "a point twice or out of order"
        # the state line follows what the log's feed says, not a poll each second
        assert len(polls) == polled, polls
        node.server("job", "cancel", juid)
        wait_for(lambda: page.inner_text("#state") == "cancelled", what="the state line")
    finally:
        node.server("job", "cancel", juid)


def fetch(node: MainNode, cookie: str, path: str, gzipped: bool) -> tuple[dict, bytes]:
    """(headers, body as sent) of PATH, asking for gzip or not."""
    tls = ssl.create_default_context()
    tls.check_hostname, tls.verify_mode = False, ssl.CERT_NONE  # the node's own certificate
    headers = {"Cookie": cookie, **({"Accept-Encoding": "gzip"} if gzipped else {})}
    request = urllib.request.Request(node.url + path, headers=headers)
    with urllib.request.urlopen(request, context=tls, timeout=30) as answer:
        head = {k.lower(): v for k, v in answer.headers.items()}
        if head.get("content-type", "").startswith("text/event-stream"):
            return head, answer.readline()  # a live feed: its first line only
        return head, answer.read()


@pytest.mark.system
def test_pages_and_series_are_gzip_encoded_when_asked_and_live_feeds_are_not(node, browser):
    juid = run_job(node, "true")
    wait_for(lambda: state_of(node, juid) == "succeeded", timeout=120, what="the job to end")
    m = Monkey(node.home)
    rows = [("loss", s, 1 / (s + 1), 1.7e9 + s) for s in range(5000)]
    with m.store.tx() as db:
        m.store._insert_columns(db, juid, 1, as_columns(rows))
    m.store.close()
    page = page_for(browser)
    login(page, node, node.token, f"/web/jobs/{juid}")
    cookie = "; ".join(f"{c['name']}={c['value']}" for c in page.context.cookies())
    for path in (f"/web/jobs/{juid}", f"/web/jobs/{juid}/metrics?width=800", "/web/jobs"):
        head, body = fetch(node, cookie, path, gzipped=True)
        assert head.get("content-encoding") == "gzip", path
        plain = gzip.decompress(body)
        assert len(body) < len(plain)
        head, body = fetch(node, cookie, path, gzipped=False)
        assert "content-encoding" not in head, path
        if "metrics" in path:
            assert json.loads(plain)["loss"]["points"] == 5000 and body == plain
        else:
            assert plain.startswith(b"<!doctype html>") and body.startswith(b"<!doctype html>")
    # the live feeds stream as they are (a compressor would hold their lines back)
    head, first = fetch(node, cookie, f"/web/jobs/{juid}/log", gzipped=True)
    assert "content-encoding" not in head and first.startswith((b"id:", b"data:", b"event:"))


def test_the_series_are_read_through_their_index(tmp_path):
    store = Store(tmp_path / "monkey.db")
    asked: list[str] = []
    store.db.set_trace_callback(asked.append)
    list(store.metric_window(1, 0, 10))
    store.metric_ends(1)
    store.metric_blocks(1, 0, 32)
    store.db.set_trace_callback(None)
    assert len(asked) == 3
    for sql in asked:
        plan = " / ".join(p[3] for p in store.db.execute("EXPLAIN QUERY PLAN " + sql))
        assert "INDEX metrics_series (series=?" in plan and "SCAN metrics" not in plan, plan
    store.close()


def test_a_series_is_read_once_and_a_running_ones_summary_grows(monkey):
    job = monkey.run(["python", "train.py"], start_core=False)
    store = monkey.store

    def log(first: int, n: int) -> None:
        rows = [("loss", s, float(s % 7), 1.7e9 + s) for s in range(first, first + n)]
        with store.tx() as db:
            store._insert_columns(db, job.juid, 1, as_columns(rows))

    log(0, 100_000)
    cache = SeriesCache()
    whole = monkey.metric_series(job.juid, cache, 500)["loss"]
    assert whole["points"] == 100_000 and len(whole["x"]) <= 1000
    (summary,) = cache._items.values()
    again = monkey.metric_series(job.juid, cache, 500)["loss"]
    assert again == whole and cache._items[job.juid, "loss"] is summary  # not read again
    log(100_000, 50)  # the job logs on: only its new blocks are read
    new = monkey.metric_series(job.juid, cache, 500, since=whole["last"])["loss"]
    assert new["points"] == 100_050 and min(new["x"]) >= 100_000
    # cut down as the chart draws them: 50 steps are a pixel of 100,050 in 500
    assert len(new["x"]) == 2 and sorted(new["y"]) == [0.0, 6.0]
    grown = cache._items[job.juid, "loss"]
    kept = len(summary.cols[0]) - 1  # every block but the last, as it was
    assert grown.cols[0][:kept] == summary.cols[0][:kept] and grown.points == 100_050
    # a window: its points exactly, with the nearest one on each side
    window = monkey.metric_series(job.juid, cache, 500, window=(40_000.5, 40_100.5))["loss"]
    assert window["x"] == list(range(40_000, 40_102))
    assert window["y"] == [float(s % 7) for s in range(40_000, 40_102)]
