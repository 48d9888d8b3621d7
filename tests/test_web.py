"""Monkey Web (issue 28): pages of a real main node (`monkey server run`, TLS) driven by
a real browser (Debian's chromium through Playwright; never a downloaded browser), and the
pure helpers (ANSI colours to HTML, downsampling)."""

from __future__ import annotations

import json
import math
import re
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import wait_for
from mainnode import MainNode, node  # noqa: F401 - node: a fixture

from monkey.server.web.render import AnsiHtml, ansi_to_html
from monkey.tracking.series import decimate

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


# -- pure helpers -------------------------------------------------------------------------


def test_ansi_escapes_text_before_colouring_it():
    out = ansi_to_html(b"<script>alert('x')</script> \x1b[31mred\x1b[0m & \x1b[1;4mbold\x1b[m")
    assert "<script>" not in out
    assert out == (
        "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; "
        '<span class="a-f1">red</span> &amp; <span class="a-b a-u">bold</span>'
    )


def test_ansi_colours_256_truecolour_bright_and_resets():
    assert ansi_to_html(b"\x1b[92mok\x1b[39m.") == '<span class="a-f10">ok</span>.'
    assert ansi_to_html(b"\x1b[38;5;196mX") == '<span style="color:#ff0000;">X</span>'
    assert ansi_to_html(b"\x1b[48;2;1;2;3mY") == '<span style="background-color:#010203;">Y</span>'
    # cursor moves and clears are dropped, not shown as garbage
    assert ansi_to_html(b"a\x1b[2K\x1b[1Gb\x1b]0;title\x07c") == "abc"


def test_ansi_state_and_split_sequences_carry_across_pieces():
    r = AnsiHtml()
    assert r.feed(b"x\x1b[3") == "x"  # the sequence is cut: kept for the next piece
    assert r.feed(b"2mgreen \xe2") == '<span class="a-f2">green </span>'
    assert r.feed(b"\x82\xac\n") == '<span class="a-f2">€\n</span>'  # the colour carries on


def test_the_jobs_list_shows_a_jobs_own_metrics_and_leaves_system_ones_out(monkey):
    from monkey.server.web.views import jobs_page
    from monkey.tracking.ingest import on_heartbeat

    store = monkey.store
    job = monkey.run(["python", "train.py"], start_core=False)
    assert store.begin_attempt(job.record, "local", str(monkey.home.run_dir(job.juid, 1)))
    now = time.time()
    assert store.ingest_metrics(
        job.juid, 1, 1, [(["loss", "acc"], [0, 1], [5, 5], [0.25, 0.9], [now, now])]
    )
    on_heartbeat(store, job.juid, 1, 2, {"ts": now, "cpu": 97.0, "rss": 512 << 20})
    assert set(store.latest_metric_values([job.juid])[job.juid]) == {
        "acc",
        "loss",
        "sys/cpu",
        "sys/mem",
    }
    (row,) = jobs_page(monkey, {}, None)["rows"]
    assert row["metrics"] == "acc=0.9 loss=0.25"  # as the dashboard: no sys/cpu, no "…"


def test_ansi_carriage_returns_keep_each_lines_last_redraw():
    """A progress bar redrawn with \r: a piece keeps its last redraw, after "\r" (outside
    any tag) when the page must erase what it has of the line; \r\n is a newline."""
    a = AnsiHtml()
    assert a.feed(b"start\n 10%\r 20%\r 30%") == "start\n 30%"
    assert a.feed(b"\r") == ""  # waits for the next text
    assert a.feed(b" 40%\r\x1b[32m 50%\x1b[0m\ndone\r\n") == (
        '\r 40%\r<span class="a-f2"> 50%</span>\ndone\n'
    )
    assert a.feed(b"next") == "next"


def test_decimate_keeps_short_series_and_turns_nan_to_none():
    assert decimate(zip([1, 2, 3], [1.0, math.nan, 3.0]), 1, 3, 10) == ([1, 2, 3], [1.0, None, 3.0])


def test_decimate_a_million_points_keeps_extremes_in_order():
    n = 1_000_000
    ys = [math.sin(i / 1000) for i in range(n)]
    ys[123_456] = 50.0  # a spike one point wide
    ys[654_321] = -50.0
    ys[777_777] = math.nan
    x, y = decimate(zip(range(n), ys), 0, n - 1, 1000)
    assert len(x) == len(y) <= 2000
    assert x == sorted(x)
    assert max(y) == 50.0 and min(y) == -50.0  # spikes survive
    assert 123_456 in x and 654_321 in x
    assert all(v == v for v in y)  # no NaN


# -- in a browser ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: scripts/test.sh installs Debian's chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


def page_for(browser, **options):
    context = browser.new_context(ignore_https_errors=True, **options)
    context.set_default_timeout(30_000)
    return context.new_page()


def login(page, node: MainNode, token: str, path: str = "/web/jobs") -> None:
    page.goto(node.url + path)
    page.fill("#token", token)
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(re.escape(path) + r"(\?.*)?$"))


def run_job(node: MainNode, *argv: str, name: str | None = None) -> str:
    done = node.server("run", *(["--name", name] if name else []), "--", *argv)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def state_of(node: MainNode, juid: str) -> str:
    return json.loads(node.server("info", juid, "--json").stdout)["state"]


def csrf_of(page) -> str:
    return page.get_attribute("input[name=csrf]", "value")


@pytest.mark.system
def test_login_is_required_a_wrong_token_refused_and_logout_ends_the_session(node, browser):
    page = page_for(browser)
    page.goto(node.url + "/web/jobs?state=running")
    assert "/web/login?next=" in page.url  # no session: the login form, coming back after
    page.fill("#token", "mk_not-a-token")
    page.click("button[type=submit]")
    assert "that token was refused" in page.inner_text("[role=alert]")
    page.fill("#token", node.token)
    page.click("button[type=submit]")
    page.wait_for_url("**/web/jobs?state=running")
    cookie = next(c for c in page.context.cookies() if c["name"] == "monkey_session")
    assert cookie["httpOnly"] and cookie["secure"] and cookie["sameSite"] == "Strict"
    assert node.token not in cookie["value"]
    # the API is untouched: a web session is no bearer token
    api = page.request.post(node.url + "/api/v1/call/whoami", headers={"X-Monkey-API": "1"})
    assert api.status == 401
    # pages, their assets and a browser's own /favicon.ico are no refused tokens: many page
    # loads never lock this address out of the API
    for _ in range(12):
        page.reload()
        assert page.request.get(node.url + "/favicon.ico").ok
    api = page.request.post(
        node.url + "/api/v1/call/whoami",
        headers={"X-Monkey-API": "1", "Authorization": f"Bearer {node.token}"},
    )
    assert api.status == 200, api.text()
    # a forged login form (no CSRF token) is refused
    forged = page.context.request.post(node.url + "/web/login", form={"token": node.token})
    assert forged.status == 403
    page.click("text=Log out")
    page.wait_for_url("**/web/login")
    page.goto(node.url + "/web/jobs")
    assert "/web/login" in page.url
    # the old cookie, replayed, is refused too
    again = page_for(browser)
    again.context.add_cookies([{**cookie}])
    again.goto(node.url + "/web/jobs")
    assert "/web/login" in again.url


@pytest.mark.system
def test_a_line_written_by_a_running_job_appears_without_a_reload(node, browser, tmp_path):
    flag, flag2 = tmp_path / "go", tmp_path / "go2"
    script = (
        f"echo first line; while [ ! -e {flag} ]; do sleep 0.05; done; "
        "printf '\\033[31mthe red <line>\\033[0m\\n' >&2; "
        f"while [ ! -e {flag2} ]; do sleep 0.05; done; echo written while hidden; sleep 300"
    )
    juid = run_job(node, "sh", "-c", script)
    page = page_for(browser)
    login(page, node, node.token, f"/web/jobs/{juid}")
    page.wait_for_selector("#log >> text=first line")
    page.evaluate("window.sameDocument = 1")
    flag.touch()
    red = page.wait_for_selector("#log .err .a-f1")
    assert red.inner_text() == "the red <line>"  # escaped, coloured, on stderr
    assert page.evaluate("window.sameDocument") == 1  # no reload
    # a hidden page gives its connection back; shown again, it resumes at its offsets:
    # what was written meanwhile appears once, nothing before it again
    shown = "Object.defineProperty(document, 'hidden', {value: %s, configurable: true});"
    event = "document.dispatchEvent(new Event('visibilitychange'))"
    page.evaluate(shown % "true" + event)
    flag2.touch()
    wait_for(lambda: "written while hidden" in node.server("logs", juid).stdout, timeout=60)
    page.evaluate(shown % "false" + event)
    page.wait_for_selector("#log >> text=written while hidden")
    text = page.inner_text("#log")
    assert [text.count(s) for s in ("first line", "the red", "written while hidden")] == [1, 1, 1]
    page.fill("#find", "LINE")  # find in the output, case aside
    assert page.inner_text("#found") == "2 found"
    page.press("#find", "Enter")
    assert page.inner_text("#found") == "1 of 2"
    assert page.evaluate("CSS.highlights.get('found').size") == 2
    node.server("job", "cancel", juid)


@pytest.mark.system
def test_a_chart_is_drawn_for_each_metric(node, browser):
    code = (
        "import json\n"
        "for i in range(3000):\n"
        "    print(json.dumps({'monkey': {'loss': 1 / (i + 1), 'acc': i / 3000, 'step': i}}))\n"
    )
    juid = run_job(node, sys.executable, "-c", code)
    wait_for(lambda: state_of(node, juid) == "succeeded", timeout=120, what="the job to end")
    page = page_for(browser)
    login(page, node, node.token, f"/web/jobs/{juid}")
    page.wait_for_selector("#charts figure:nth-of-type(2) canvas")
    drawn = page.evaluate(  # metric -> its canvas's painted pixels
        """() => Object.fromEntries([...document.querySelectorAll('#charts figure')].map(f => {
            const c = f.querySelector('canvas');
            const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
            let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i]) n++;
            return [f.querySelector('h3').textContent, n]; }))"""
    )
    mine = {k: n for k, n in drawn.items() if not k.startswith("sys/")}  # a heartbeat's, if slow
    assert sorted(mine) == ["acc", "loss"] and all(n > 100 for n in mine.values()), drawn
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280  # charts fit
    # log y and smoothing redraw the curves in place
    loss = "monkeyCharts.loss.data[1]"
    before = page.evaluate(f"{loss}.slice(0, 50)")
    page.check("#logy")
    assert page.evaluate("monkeyCharts.loss.scales.y.distr") == 3
    page.fill("#smooth", "0.9")
    smoothed = page.evaluate(f"{loss}.slice(0, 50)")
    assert smoothed[0] == before[0] and smoothed[10] > before[10]  # a falling curve lags
    series = page.request.get(node.url + f"/web/jobs/{juid}/metrics?width=100").json()
    assert series["loss"]["points"] == 3000 and len(series["loss"]["x"]) <= 200


@pytest.mark.system
def test_filters_and_search_narrow_the_jobs_and_new_jobs_appear_live(node, browser):
    a = run_job(node, "echo", "needle-in-output", name="alpha")
    b = run_job(node, "echo", "plain", name="beta")
    c = run_job(node, "false", name="alphabet")
    for juid in (a, b, c):
        wait_for(lambda j=juid: state_of(node, j) in ("succeeded", "failed"), timeout=120)
    page = page_for(browser)
    login(page, node, node.token)

    def shown() -> list[str]:
        return page.eval_on_selector_all(
            "table.jobs tbody tr td:nth-child(2)", "t => t.map(x => x.textContent)"
        )

    assert sorted(shown()) == sorted([a, b, c])
    page.fill("input[name=name]", "alpha")
    page.click("text=Filter")
    page.wait_for_url("**name=alpha**")
    assert sorted(shown()) == sorted([a, c])
    page.select_option("select[name=state]", "failed")
    page.click("text=Filter")
    page.wait_for_url("**state=failed**")
    assert shown() == [c]
    page.goto(node.url + "/web/jobs?q=needle-in-output")
    assert shown() == [a]
    assert "holds “needle-in-output”" in page.inner_text(".count")
    page.goto(node.url + "/web/jobs?name=<b>x")  # a user's string is escaped back
    assert page.input_value("input[name=name]") == "<b>x"
    # live: a job submitted now appears without a reload
    page.goto(node.url + "/web/jobs")
    page.evaluate("window.sameDocument = 1")
    d = run_job(node, "true", name="delta")
    page.wait_for_selector(f"table.jobs a:text-is('{d}')")
    assert page.evaluate("window.sameDocument") == 1


@pytest.mark.system
def test_jobs_are_paged_newest_first(node, browser):
    done = node.server("sweep", "--grid", "x=" + ",".join(map(str, range(55))), "--", "echo", "{x}")
    assert done.returncode == 0, done.stderr
    page = page_for(browser)
    login(page, node, node.token)
    first = page.eval_on_selector_all("table.jobs tbody tr", "rows => rows.length")
    assert first == 50 and "55 jobs" in page.inner_text(".count")
    page.click("text=Older →")
    assert page.eval_on_selector_all("table.jobs tbody tr", "rows => rows.length") == 5


@pytest.mark.system
def test_cancel_from_the_page_stops_the_job_and_a_forged_post_is_refused(node, browser):
    juid = run_job(node, "sleep", "300")
    wait_for(lambda: state_of(node, juid) == "running", timeout=60, what="the job to run")
    page = page_for(browser)
    login(page, node, node.token, f"/web/jobs/{juid}")
    # a POST without the CSRF token, with the session cookie: refused, the job untouched
    forged = page.request.post(node.url + f"/web/jobs/{juid}/action", form={"action": "cancel"})
    assert forged.status == 403 and "CSRF" in forged.text()
    forged = page.request.post(
        node.url + f"/web/jobs/{juid}/action", form={"action": "cancel", "csrf": "guess"}
    )
    assert forged.status == 403
    assert state_of(node, juid) == "running"
    page.once("dialog", lambda asked: asked.accept())  # "Cancel job ...?" (test_web_analysis)
    page.click("button.act-cancel")
    page.wait_for_url(f"**/web/jobs/{juid}")
    wait_for(lambda: state_of(node, juid) == "cancelled", timeout=60, what="the cancel")
    events = json.loads(node.server("info", juid, "--json").stdout)["events"]
    admin = re.search(r"admin user (\S+) created", node.welcome).group(1)
    assert any(e["actor"] == admin for e in events)  # the session's user asked


@pytest.mark.system
def test_another_users_job_shows_no_actions_and_a_forged_post_is_refused(node, browser):
    bob = node.add_user("bob")
    juid = run_job(node, "sleep", "300")  # the admin's
    page = page_for(browser)
    login(page, node, bob, f"/web/jobs/{juid}")
    assert page.query_selector(".actions") is None
    assert page.query_selector("button.act-cancel") is None
    forged = page.request.post(
        node.url + f"/web/jobs/{juid}/action", form={"action": "cancel", "csrf": csrf_of(page)}
    )
    assert forged.status == 403
    assert f"job {juid} belongs to" in forged.text()
    assert state_of(node, juid) in ("queued", "dispatching", "running")
    node.server("job", "cancel", juid)


@pytest.mark.system
def test_no_horizontal_scroll_at_360_px(node, browser):
    long = "x" * 300
    juid = run_job(node, "echo", long, "--a-very-long-option=" + "y" * 200, name="n" * 80)
    page = page_for(browser, viewport={"width": 360, "height": 740})
    login(page, node, node.token)
    assert page.evaluate("document.documentElement.scrollWidth") <= 360
    page.goto(node.url + f"/web/jobs/{juid}")
    page.wait_for_selector("#log >> text=xxxx")
    assert page.evaluate("document.documentElement.scrollWidth") <= 360
    page.goto(node.url + "/web/login")
    assert page.evaluate("document.documentElement.scrollWidth") <= 360


@pytest.mark.system
def test_monkey_web_prints_a_link_that_logs_in_once(node, browser):
    juid = run_job(node, "true")
    done = node.server("web", juid, "--no-browser")
    assert done.returncode == 0, done.stderr
    link = done.stdout.splitlines()[0]
    assert link.startswith(f"{node.url}/web/login?once=")
    page = page_for(browser)
    page.goto(link)
    page.wait_for_url(f"**/web/jobs/{juid}")
    assert page.inner_text("h1").startswith(f"Job {juid}")
    twice = page_for(browser)
    twice.goto(link)
    assert "used already" in twice.inner_text("[role=alert]")
    # through a remote: the main node's page, logged in as the remote's user
    bob = node.add_user("bob")
    node.add_remote(bob)
    done = node.laptop("--remote", "lab", "web", "--no-browser")
    assert done.returncode == 0, done.stderr
    link = done.stdout.splitlines()[0]
    assert link.startswith(f"{node.url}/web/login?once=")
    assert f"certificate: {node.fingerprint} (self-signed" in done.stdout  # what to check
    assert f"certificate: {node.fingerprint} (self-signed" in done.stdout  # what to check
    page = page_for(browser)
    page.goto(link)
    page.wait_for_url("**/web/jobs")
    assert page.inner_text(".who") == "bob"
    # an unknown job: one line, nothing opened
    bad = node.server("web", "nosuchjob", "--no-browser")
    assert bad.returncode == 1 and len(bad.stderr.strip().splitlines()) == 1


def test_monkey_web_opens_a_sweeps_page_or_a_comparison(node, browser):
    code = "import json, sys; print(json.dumps({'monkey': {'acc': float(sys.argv[1])}}))"
    done = node.server(
        "sweep", "--name", "pair", "--grid", "lr=1,2", "--", sys.executable, "-c", code, "{lr}"
    )
    assert done.returncode == 0, done.stderr
    sid = json.loads(node.server("list", "sweeps", "--json").stdout)[0]["id"]
    a, b = sorted(
        j["job"] for j in json.loads(node.server("list", "jobs", "--json").stdout)["jobs"]
    )
    done = node.server("web", "--sweep", "pair", "--no-browser")  # by its name
    assert done.returncode == 0, done.stderr
    page = page_for(browser)
    page.goto(done.stdout.splitlines()[0])
    page.wait_for_url(f"**/web/sweeps/{sid}")
    assert sid in page.inner_text("h1")
    done = node.server("web", "--compare", a, b, "--no-browser")
    assert done.returncode == 0, done.stderr
    page = page_for(browser)
    page.goto(done.stdout.splitlines()[0])
    page.wait_for_url("**/web/compare?*")
    table = page.inner_text("main")
    assert a in table and b in table
    node.add_remote(node.add_user("ann"))  # through a remote: the same pages
    done = node.laptop("--remote", "lab", "web", "--sweep", sid[:-1], "--no-browser")
    assert done.returncode == 0, done.stderr
    page = page_for(browser)
    page.goto(done.stdout.splitlines()[0])
    page.wait_for_url(f"**/web/sweeps/{sid}")
    # bad input: one line each, no link printed
    for argv, said in (
        (("--sweep", "nosuchsweep"), "nosuchsweep"),
        (("--compare", a), "--compare needs two jobs or more"),
        ((a, "--sweep", "pair"), "give one of JOB, --sweep or --compare"),
    ):
        bad = node.server("web", *argv, "--no-browser")
        assert bad.returncode != 0 and bad.stdout == "", (argv, bad.stdout)
        assert len(bad.stderr.strip().splitlines()) == 1 and said in bad.stderr, bad.stderr


@pytest.mark.system
def test_monkey_web_starts_a_loopback_server_when_none_runs(cli, home, browser):
    done = cli("web", "--no-browser")
    assert done.returncode == 0, done.stderr
    link = done.stdout.splitlines()[0]
    assert re.match(r"http://127\.0\.0\.1:\d+/web/login\?once=", link), link
    page = page_for(browser)
    page.goto(link)
    page.wait_for_url("**/web/jobs")
    # this machine's own view: no token, no line for a laptop, and how it stops
    said = done.stderr
    assert "Monkey Web for this machine's jobs at http://127.0.0.1:" in said, said
    assert "it stops with `monkey daemon stop`" in said
    assert "token" not in said and "remote add" not in said and "mk_" not in said
    again = cli("web", "--no-browser")  # reuses the running server
    assert again.stdout.split("/web/")[0] == link.split("/web/")[0]
    stopped = cli("daemon", "stop", check=True).stdout
    assert stopped.startswith("Monkey Web stopped\ncore stopped")
    assert "server not running" in cli("server", "status").stdout
    assert shutil.which("true")


@pytest.mark.system
def test_sweep_page_ranks_runs_sorts_by_a_column_and_keeps_actions_to_owners(node, browser):
    code = "import json, sys; print(json.dumps({'monkey': {'acc': float(sys.argv[1]), 'step': 0}}))"
    done = node.server(
        "sweep",
        "--name",
        "scan",
        "--metric",
        "acc",
        "--goal",
        "max",
        "--grid",
        "lr=1,3,2",
        "--",
        sys.executable,
        "-c",
        code,
        "{lr}",
    )
    assert done.returncode == 0, done.stderr
    sid = json.loads(node.server("list", "sweeps", "--json").stdout)[0]["id"]
    runs = json.loads(node.server("list", "jobs", "--json").stdout)["jobs"]
    for run in runs:
        wait_for(lambda j=run["job"]: state_of(node, j) == "succeeded", timeout=120)
    best = next(r["job"] for r in runs if r["params"] == {"lr": 3})
    page = page_for(browser)
    login(page, node, node.token, f"/web/sweeps/{sid}")
    assert "3 of 3 ended" in page.inner_text(".facts")
    assert page.inner_text(".facts a >> nth=0") == best

    def column(name: str) -> list[str]:
        heads = page.eval_on_selector_all(
            "table.runs thead th[data-col]", "hs => hs.map(h => h.dataset.col)"
        )
        i = heads.index(name)
        return page.eval_on_selector_all(
            f"table.runs tbody tr > :nth-child({i + 1})", "ts => ts.map(t => t.innerText)"
        )

    assert column("acc") == ["3", "2", "1"]  # best first on the sweep's metric
    page.click("table.runs th[data-col='lr'] a")
    page.wait_for_url("**sort=lr**")
    first = column("lr")
    page.click("table.runs th[data-col='lr'] a")  # again: reversed
    page.wait_for_url("**reverse=1**")
    assert column("lr") == first[::-1] and sorted(first) in (first, first[::-1])
    assert page.query_selector("button.act-retry") is not None  # the admin's sweep
    bob = page_for(browser)
    login(bob, node, node.add_user("bob"), f"/web/sweeps/{sid}")
    assert bob.query_selector(".actions") is None
    forged = bob.request.post(
        node.url + f"/web/sweeps/{sid}/action", form={"action": "retry", "csrf": csrf_of(bob)}
    )
    assert forged.status == 403 and "only their owner or an admin" in forged.text()
    assert all(state_of(node, r["job"]) == "succeeded" for r in runs)


@pytest.mark.system
def test_providers_page_shows_each_providers_jobs_and_its_problem(node, browser):
    (node.home / "providers.yml").write_text(
        "providers:\n  box:\n    type: ssh\n    hosts:\n      - {host: 127.0.0.1, port: 1, "
        "user: me, key: /nowhere/key}\n"
    )
    juid = run_job(node, "sleep", "300")
    wait_for(lambda: state_of(node, juid) == "running", timeout=60, what="the job to run")
    page = page_for(browser)
    login(page, node, node.token, "/web/providers")
    rows = page.eval_on_selector_all(
        "table.jobs tbody tr", "rs => rs.map(r => [...r.cells].map(c => c.innerText))"
    )
    local = next(r for r in rows if r[0] == "local")
    assert local[1:4] == ["local", "0", "1"]  # type, queued, running
    assert any(r[0] == "box" and r[1] == "ssh" for r in rows)
    assert "running (pid" in page.inner_text("main")
    node.server("job", "cancel", juid)


@pytest.mark.system
def test_picked_jobs_are_compared_side_by_side_with_their_metrics_overlaid(node, browser):
    code = (
        "import json, sys\n"
        "for i in range(20):\n"
        "    print(json.dumps({'monkey': {'loss': float(sys.argv[1]) / (i + 1), 'step': i}}))\n"
    )
    done = node.server("sweep", "--grid", "lr=1,2", "--", sys.executable, "-c", code, "{lr}")
    assert done.returncode == 0, done.stderr
    runs = [j["job"] for j in json.loads(node.server("list", "jobs", "--json").stdout)["jobs"]]
    for juid in runs:
        wait_for(lambda j=juid: state_of(node, j) == "succeeded", timeout=120)
    page = page_for(browser)
    login(page, node, node.token)
    for juid in runs:
        page.check(f"input[name=job][value='{juid}']")
    page.click("text=Compare picked")
    page.wait_for_url("**/web/compare?job=**")
    differing = page.eval_on_selector_all(
        "table.compare tr.differs th", "hs => hs.map(h => h.innerText)"
    )
    assert "≠ lr" in differing and "≠ loss" in differing
    assert not any("state" in h for h in differing)  # both succeeded: the same
    page.wait_for_selector("#overlay figure canvas")
    legends = page.eval_on_selector_all(  # one chart per metric; heartbeats may add sys/*
        "#overlay figure",
        "fs => Object.fromEntries(fs.map(f => [f.querySelector('h3').innerText,"
        " [...f.querySelectorAll('.u-legend .u-series .u-label')].map(l => l.innerText)]))",
    )
    # one line per job in the loss chart, named by the parameter that differs
    assert sorted(legends["loss"]) == ["lr=1", "lr=2"]  # the runs alone (no x value shown)
    one = page_for(browser)
    login(one, node, node.token, f"/web/compare?job={runs[0]}")
    assert "at least two jobs" in one.inner_text("[role=alert]")


@pytest.mark.system
def test_hidden_pages_give_their_connections_back(node, browser):
    """A browser opens at most 6 connections to a server, and each live page holds one:
    hidden pages close theirs, so a seventh page still opens (and they catch up when shown)."""
    juid = run_job(node, "sh", "-c", "echo started; sleep 300")
    first = page_for(browser)
    login(first, node, node.token)
    context = first.context
    hide = (
        "Object.defineProperty(document, 'hidden', {value: true, configurable: true});"
        "document.dispatchEvent(new Event('visibilitychange'))"
    )
    for i in range(7):
        page = context.new_page()
        page.goto(node.url + (f"/web/jobs/{juid}" if i % 2 else "/web/jobs"))
        if i % 2:
            page.wait_for_selector("#log >> text=started")
        page.evaluate(hide)
    last = context.new_page()
    last.goto(node.url + f"/web/jobs/{juid}")
    last.wait_for_selector("#log >> text=started")
    node.server("job", "cancel", juid)


def test_decimate_reads_a_stream_once_and_keeps_a_windows_neighbours():
    n = 12_345
    stream = ((float(i), float(i % 97)) for i in range(n))  # read once, like a cursor
    x, y = decimate(stream, 0, n - 1, 100)
    assert len(x) == 200 and x == sorted(x)
    assert set(y) == {0.0, 96.0}  # each pixel's lowest and highest
    empty = ((float(i), None) for i in range(5000))  # nothing logged: nothing drawn
    assert decimate(empty, 0, 4999, 10) == ([], [])
    # a window: its points, and the nearest one on each side for the lines to reach its edges
    x, y = decimate(((float(i), float(i)) for i in range(100)), 10.5, 20.5, 100)
    assert x == [10.0, *range(11, 21), 21.0]


@pytest.mark.system
def test_assets_are_cached_and_confined_and_a_login_never_leaves_this_server(node, browser):
    page = page_for(browser)
    asset = page.request.get(node.url + "/web/static/vendor/uPlot.iife.min.js?v=1")
    assert asset.ok and "immutable" in asset.headers["cache-control"]
    assert asset.headers["content-type"].startswith("text/javascript")
    for path in ("/web/static/..%2fapp.py", "/web/static/%2e%2e/app.py", "/web/static/nothing"):
        assert page.request.get(node.url + path).status == 404, path
    # no session needed for assets, but every page asks for one (the API's token does not do)
    assert "/web/login" in page.request.get(node.url + "/web/providers").url
    page.goto(node.url + "/web/login?next=//evil.example/web/x")
    page.fill("#token", node.token)
    page.click("button[type=submit]")
    page.wait_for_url(f"{node.url}/web/jobs")  # not another site
    shown = page.request.get(node.url + "/web/jobs")
    assert shown.headers["cache-control"] == "no-store"
    assert "frame-ancestors 'none'" in shown.headers["content-security-policy"]
