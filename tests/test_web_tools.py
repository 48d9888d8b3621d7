"""Monkey Web, issue 43 item 10 (what every other tool has): notes and tags edited on the
job and sweep pages (owners and admins only, CSRF as every form) and the jobs list
filtered by a tag; a job's checkpoint files; a sweep's report; CSV of the tables; pages
both ways with their range; a phone's tables and parallel coordinates; the `queued`
state's colour readable (4.5:1) in light and dark mode. A real main node, real jobs, a
real browser (the fixtures of tests/test_web.py)."""

from __future__ import annotations

import json
import re

import pytest
from conftest import wait_for
from mainnode import MainNode, node  # noqa: F401 - node: a fixture
from test_web import browser, csrf_of, login, page_for, run_job, state_of  # noqa: F401


def info(node: MainNode, juid: str) -> dict:
    return json.loads(node.server("info", juid, "--json").stdout)


@pytest.mark.system
def test_a_jobs_note_and_tags_are_edited_on_its_page_and_filter_the_jobs_list(node, browser):
    juid = run_job(node, "true", name="tagged")
    other = run_job(node, "true", name="plain")
    page = page_for(browser)
    login(page, node, node.token, f"/web/jobs/{juid}")
    assert page.inner_text("#notes summary") == "Add a note or tags"
    page.click("#notes summary")
    page.fill("#note-text", "lr 0.1 diverged at step 458\nretry with warm-up")
    page.fill("#note-tags", "baseline lr-0.1")
    page.click("#notes button[type=submit]")
    page.wait_for_url(f"**/web/jobs/{juid}#notes")
    assert page.inner_text("#notes .note") == "lr 0.1 diverged at step 458\nretry with warm-up"
    tags = page.eval_on_selector_all("#notes .tag", "ts => ts.map(t => t.textContent)")
    assert tags == ["baseline", "lr-0.1"]
    shown = info(node, juid)
    assert shown["tags"] == ["baseline", "lr-0.1"] and shown["note"]["text"].endswith("warm-up")
    # a bad tag: a 400 naming it, nothing changed
    page.click("#notes summary")
    page.fill("#note-text", "changed")
    page.fill("#note-tags", "baseline bad!tag")
    page.click("#notes button[type=submit]")
    assert "tag 'bad!tag': a tag is 1 to 32 letters" in page.inner_text(".error")
    shown = info(node, juid)
    assert shown["tags"] == ["baseline", "lr-0.1"] and shown["note"]["text"].startswith("lr 0.1")
    # a tag links to the jobs list filtered by it; the filter's field keeps it
    page.goto(node.url + f"/web/jobs/{juid}")
    page.click("#notes a.tag:text-is('baseline')")
    page.wait_for_url("**/web/jobs?tag=baseline")
    listed = page.eval_on_selector_all(
        "table.jobs tbody tr td:nth-child(2) a", "as => as.map(a => a.textContent)"
    )
    assert listed == [juid] and "1 job" in page.inner_text(".count")
    assert page.input_value("input[name=tag]") == "baseline"
    assert "baseline" in page.inner_text("table.jobs tbody tr")
    bad = page.request.get(node.url + "/web/jobs?tag=a%20b")
    assert bad.status == 400 and "tag &#39;a b&#39;: a tag is" in bad.text()
    page.fill("input[name=tag]", "")
    page.click(".filters button[type=submit]")
    page.wait_for_selector(f"table.jobs a:text-is('{other}')")
    # a blank note removes it, an empty tags field removes them
    page.goto(node.url + f"/web/jobs/{juid}")
    page.click("#notes summary")
    page.fill("#note-text", "")
    page.fill("#note-tags", "")
    page.click("#notes button[type=submit]")
    page.wait_for_url(f"**/web/jobs/{juid}#notes")
    shown = info(node, juid)
    assert shown["tags"] == [] and shown["note"] is None


@pytest.mark.system
def test_only_owners_and_admins_edit_notes_and_a_forged_post_is_refused(node, browser):
    juid = run_job(node, "true")  # the admin's
    page = page_for(browser)
    login(page, node, node.add_user("bob"), f"/web/jobs/{juid}")
    assert page.query_selector("#notes form") is None  # shown, not editable
    url = node.url + f"/web/jobs/{juid}/notes"
    forged = page.request.post(url, form={"note": "mine", "tags": "bob", "csrf": "guess"})
    assert forged.status == 403 and "CSRF" in forged.text()
    refused = page.request.post(url, form={"note": "mine", "tags": "x", "csrf": csrf_of(page)})
    assert refused.status == 403
    assert f"job {juid} belongs to" in refused.text() and "may write the note of it" in (
        refused.text()
    )
    tagged = page.request.post(url, form={"note": "", "tags": "x", "csrf": csrf_of(page)})
    assert tagged.status == 403 and "may change the tags of it" in tagged.text()
    shown = info(node, juid)
    assert shown["note"] is None and shown["tags"] == []


@pytest.mark.system
def test_a_sweeps_note_and_tags_are_edited_on_its_page_which_links_its_report(node, browser):
    done = node.server("sweep", "--name", "scan", "--grid", "x=1,2", "--", "echo", "{x}")
    assert done.returncode == 0, done.stderr
    sid = done.stdout.strip()
    page = page_for(browser)
    login(page, node, node.token, f"/web/sweeps/{sid}")
    page.click("#notes summary")
    page.fill("#note-text", "x=2 is the one")
    page.fill("#note-tags", "paper, fig-3")
    page.click("#notes button[type=submit]")
    page.wait_for_url(f"**/web/sweeps/{sid}#notes")
    assert page.inner_text("#notes .note") == "x=2 is the one"
    tags = page.eval_on_selector_all("#notes .tag", "ts => ts.map(t => t.textContent)")
    assert tags == ["fig-3", "paper"]
    status = json.loads(node.server("sweep", "status", sid, "--json").stdout)
    assert status["tags"] == ["fig-3", "paper"] and status["note"]["text"] == "x=2 is the one"
    page.goto(node.url + "/web/sweeps")
    assert page.eval_on_selector_all("table.jobs .tag", "ts => ts.map(t => t.textContent)") == [
        "fig-3",
        "paper",
    ]
    page.goto(node.url + f"/web/sweeps/{sid}")
    # its `monkey report`, linked from the page and served as the CLI writes it
    page.click("#report-link")
    page.wait_for_url(f"**/web/sweeps/{sid}/report.html")
    assert page.title() == f"monkey sweep {sid}"
    assert page.inner_text("h1") == f"Sweep {sid} (scan)"
    kept = page.request.get(node.url + f"/web/sweeps/{sid}/report.html?download=1")
    assert kept.status == 200 and "attachment" in kept.headers["content-disposition"]
    assert page.request.get(node.url + "/web/sweeps/nosuch/report.html").status == 404
    bob = page_for(browser)
    login(bob, node, node.add_user("bob"), f"/web/sweeps/{sid}")
    assert bob.query_selector("#notes form") is None
    refused = bob.request.post(
        node.url + f"/web/sweeps/{sid}/notes",
        form={"note": "", "tags": "", "csrf": csrf_of(bob)},
    )
    assert refused.status == 403 and "only their owner or an admin may" in refused.text()
    assert json.loads(node.server("sweep", "status", sid, "--json").stdout)["tags"] == [
        "fig-3",
        "paper",
    ]


def _contrast(page, selector: str) -> float:
    """The WCAG contrast of SELECTOR's text colour on the first opaque background behind it."""
    fg, *backs = page.evaluate(  # one step: the live refresh may replace the element
        """selector => {
          const el = document.querySelector(selector);
          const out = [getComputedStyle(el).color];
          for (let e = el; e; e = e.parentElement) out.push(getComputedStyle(e).backgroundColor);
          return out;
        }""",
        selector,
    )

    def rgba(text: str) -> list[float]:
        assert text.startswith("rgb"), text  # Chromium's computed colours: rgb() or rgba()
        values = [float(v) for v in re.findall(r"[\d.]+", text)]
        return values if len(values) == 4 else [*values, 1.0]

    def luminance(c: list[float]) -> float:
        r, g, b = (v / 255 for v in c[:3])
        lin = [v / 12.92 if v <= 0.03928 else ((v + 0.055) / 1.055) ** 2.4 for v in (r, g, b)]
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]

    back = next((c for c in map(rgba, backs) if c[3] > 0), [255.0, 255.0, 255.0, 1.0])
    a, b = luminance(rgba(fg)), luminance(back)
    return (max(a, b) + 0.05) / (min(a, b) + 0.05)


@pytest.mark.system
def test_the_queued_state_reads_at_4_5_to_1_in_light_and_dark_mode(node, browser, tmp_path):
    gate = tmp_path / "gate"
    first = run_job(node, "sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done")
    held = node.server("run", "--after", first, "--", "true").stdout.strip()
    wait_for(lambda: state_of(node, held) == "queued", what="a queued job")
    for scheme in ("light", "dark"):
        page = page_for(browser, color_scheme=scheme)
        login(page, node, node.token, f"/web/jobs/{held}")
        assert _contrast(page, "#state.s-queued") >= 4.5, scheme
        page.goto(node.url + "/web/jobs")
        assert _contrast(page, "table.jobs .state.s-queued") >= 4.5, scheme
    gate.touch()


CHECKPOINTS = (
    "import os, monkey\n"
    "d = monkey.checkpoint_dir()\n"
    "os.makedirs(os.path.join(d, 'opt'), exist_ok=True)\n"
    "open(os.path.join(d, 'model-100.pt'), 'wb').write(b'w' * 2048)\n"
    "open(os.path.join(d, 'opt', 'state.json'), 'w').write('{\"step\": 100}')\n"
    "os.symlink('/etc/passwd', os.path.join(d, 'out-link'))\n"
)


@pytest.mark.system
def test_the_job_page_lists_its_checkpoint_files_each_downloadable(node, browser):
    import sys

    juid = run_job(node, sys.executable, "-c", CHECKPOINTS)
    wait_for(lambda: state_of(node, juid) == "succeeded", timeout=60, what="the job to end")
    page = page_for(browser)
    login(page, node, node.token, f"/web/jobs/{juid}")
    rows = page.eval_on_selector_all(
        "#checkpoints tbody tr", "rs => rs.map(r => [...r.cells].map(c => c.textContent))"
    )
    assert sorted(r[0] for r in rows) == ["model-100.pt", "opt/state.json"]  # no link
    assert dict((r[0], r[1]) for r in rows)["model-100.pt"] == "2.0 KiB"
    assert all(r[2].startswith("20") for r in rows)  # when each was written
    assert "2 files" in page.inner_text("#checkpoints-h + p")
    with page.expect_download() as got:
        page.click("#checkpoints a:text-is('opt/state.json')")
    assert open(got.value.path()).read() == '{"step": 100}'
    for path, status in (("out-link", 404), ("..%2F..%2Fmonkey.db", 400), ("nothing", 404)):
        answer = page.request.get(node.url + f"/web/jobs/{juid}/checkpoints/{path}")
        assert answer.status == status, (path, answer.status)


@pytest.mark.system
def test_the_jobs_list_and_a_sweeps_runs_download_as_csv_as_shown(node, browser):
    import csv
    import io

    done = node.server(
        "sweep", "--name", "scan", "--grid", "lr=0.001,0.01,0.1", "--metric", "acc", "--goal",
        "max", "--", "python3", "-c",
        "import json, sys; lr = float(sys.argv[1]); "
        "print(json.dumps({'monkey': {'acc': 1 / 3 + lr}}))", "{lr}",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    sid = done.stdout.strip()
    runs = json.loads(node.server("list", "jobs", "--json").stdout)["jobs"]
    for run in runs:
        wait_for(lambda j=run["job"]: state_of(node, j) == "succeeded", timeout=120)
    lone = run_job(node, "true", name="=cmd()")  # a name a spreadsheet would run
    for juid in (lone, runs[0]["job"]):
        assert node.server("job", "tag", juid, "keep").returncode == 0
    page = page_for(browser)
    login(page, node, node.token, "/web/jobs?tag=keep&sort=name")
    with page.expect_download() as got:
        page.click("#jobs-csv")
    table = list(csv.reader(io.StringIO(open(got.value.path()).read())))
    assert table[0][:6] == ["job", "name", "tags", "sweep", "state", "provider"]
    assert [r[0] for r in table[1:]] == [lone, runs[0]["job"]]  # by name: "=cmd()" first
    assert table[1][1] == "'=cmd()" and table[1][2] == "keep" and table[2][3] == "scan"
    # the sweep's runs: the page's columns in its order, values whole
    page.goto(node.url + f"/web/sweeps/{sid}?sort=lr")
    shown = page.eval_on_selector_all("table.runs tbody tr", "rs => rs.map(r => r.dataset.job)")
    with page.expect_download() as got:
        page.click("#runs-csv")
    table = list(csv.reader(io.StringIO(open(got.value.path()).read())))
    heads = page.eval_on_selector_all(
        "table.runs thead tr:last-child th", "hs => hs.map(h => h.textContent.trim())"
    )
    assert table[0] == [h.rstrip(" ↑↓") for h in heads]
    assert [r[0] for r in table[1:]] == shown and len(shown) == 3
    acc = table[0].index("acc best")
    assert sorted(float(r[acc]) for r in table[1:]) == [1 / 3 + 0.001, 1 / 3 + 0.01, 1 / 3 + 0.1]
    # a selection in the parallel coordinates (the top of the metric's axis): those runs
    page.focus("#parcoords g.axis[data-axis='acc:best']")
    page.keyboard.press("ArrowUp")
    kept = page.eval_on_selector_all(
        "table.runs tbody tr:not([hidden])", "rs => rs.map(r => r.dataset.job)"
    )
    assert 0 < len(kept) < 3
    with page.expect_download() as got:
        page.click("#runs-csv")
    table = list(csv.reader(io.StringIO(open(got.value.path()).read())))
    assert [r[0] for r in table[1:]] == kept


@pytest.mark.system
def test_the_jobs_list_pages_newer_and_older_with_its_range(node, browser):
    done = node.server("sweep", "--grid", "x=" + ",".join(map(str, range(67))), "--", "echo", "{x}")
    assert done.returncode == 0, done.stderr
    page = page_for(browser)
    login(page, node, node.token)

    def shown() -> tuple[str, list[str]]:
        # the page after a click may still be drawing its rows: wait for as many as it says
        page.wait_for_function(
            """() => {
                const r = document.querySelector('nav.pages .range');
                const m = r && r.textContent.match(/(\\d+)–(\\d+) of/);
                const rows = document.querySelectorAll('table.jobs tbody tr td:nth-child(2) a');
                return m && rows.length === m[2] - m[1] + 1;
            }"""
        )
        ids = page.eval_on_selector_all(
            "table.jobs tbody tr td:nth-child(2) a", "as => as.map(a => a.textContent)"
        )
        return page.inner_text("nav.pages .range"), ids

    first = shown()
    assert first[0] == "1–50 of 67" and len(first[1]) == 50
    assert page.query_selector("nav.pages a[rel=prev]") is None
    page.click("text=Older →")
    older = shown()
    assert older[0] == "51–67 of 67" and len(older[1]) == 17
    assert not set(older[1]) & set(first[1])
    assert page.query_selector("nav.pages a[rel=next]") is None
    page.click("text=← Newer")
    assert shown() == first
    # sorted: the same by offsets
    page.goto(node.url + "/web/jobs?sort=job&reverse=1")
    top = shown()
    assert top[0] == "1–50 of 67"
    page.click("text=Next →")
    assert shown()[0] == "51–67 of 67" and len(shown()[1]) == 17
    page.click("text=← Previous")
    assert shown() == top


PHONE_SWEEP = (
    "import json, sys; lr, wd, bs = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]); "
    "print(json.dumps({'monkey': {'validation_loss': lr * 1000 + wd + 1e-9 * bs, "
    "'train_accuracy_top5': 0.123456789 * bs}}))"
)
# The cells of SELECTOR whose text takes more than one line: [text, lines].
WRAPPED = """(sel) => [...document.querySelectorAll(sel)].map(c => {
  const r = document.createRange(); r.selectNodeContents(c);
  return [c.textContent.trim(), new Set([...r.getClientRects()].map(x => Math.round(x.top))).size];
}).filter(x => x[1] > 1)"""


@pytest.mark.system
def test_on_a_phone_numbers_never_wrap_and_parallel_coordinates_titles_read(node, browser):
    import sys

    done = node.server(
        "sweep", "--name", "phone", "--metric", "validation_loss", "--goal", "min",
        "--grid", "learning_rate=3.855e-07,0.00012,0.0314", "--grid", "weight_decay=0.0001,0.01",
        "--grid", "batch_size=32,256", "--", sys.executable, "-c", PHONE_SWEEP,
        "{learning_rate}", "{weight_decay}", "{batch_size}",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    sid = done.stdout.strip()
    runs = json.loads(node.server("list", "jobs", "--json").stdout)["jobs"]
    for run in runs:
        wait_for(lambda j=run["job"]: state_of(node, j) == "succeeded", timeout=120)
    page = page_for(browser, viewport={"width": 390, "height": 844})
    login(page, node, node.token, f"/web/sweeps/{sid}")
    page.wait_for_selector("#parcoords g.axis text.name")
    assert page.evaluate(WRAPPED, "table.runs td, table.runs tbody th") == []
    assert page.evaluate(WRAPPED, "#sweep-facts .keep") == []  # the best run's parameters
    titles = page.evaluate(
        """() => {
          const svg = document.querySelector('#parcoords svg').getBoundingClientRect();
          return [...document.querySelectorAll('#parcoords text.name')].map(t => {
            const b = t.getBoundingClientRect(), whole = t.querySelector('title');
            return {left: b.left, right: b.right, top: b.top, bottom: b.bottom,
                    inside: b.left >= svg.left - 0.5 && b.right <= svg.right + 0.5,
                    size: parseFloat(getComputedStyle(t).fontSize),
                    shown: [...t.childNodes].filter(n => n.nodeType === 3).map(n => n.data).join(''),
                    whole: whole ? whole.textContent : null};
          });
        }"""
    )
    assert len(titles) == 4 and all(t["inside"] and t["size"] >= 11 for t in titles), titles
    for i, a in enumerate(titles):
        for b in titles[i + 1 :]:
            apart = a["right"] <= b["left"] or b["right"] <= a["left"]
            assert apart or a["bottom"] <= b["top"] or b["bottom"] <= a["top"], (a, b)
    for t in titles:  # each reads: whole, or shortened with the whole name as its tooltip
        assert t["whole"] is None or (t["shown"].endswith("…") and len(t["shown"]) >= 8), t
    names = [t["whole"] or t["shown"] for t in titles]
    assert names == [
        "batch_size",
        "learning_rate (log)",
        "weight_decay (log)",
        "validation_loss best (log)",
    ]
    # the jobs list, with chosen numeric columns, and a comparison
    page.goto(node.url + "/web/jobs?cols=1&col=param:learning_rate&col=last:validation_loss")
    assert page.evaluate(WRAPPED, "table.jobs td.num, table.jobs td.nowrap") == []
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    picked = "&".join(f"job={r['job']}" for r in runs[:3])
    page.goto(node.url + f"/web/compare?{picked}")
    assert page.evaluate(WRAPPED, "table.compare td") == []
