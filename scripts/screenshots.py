"""Regenerate the README's screenshots: SVGs of the dashboard and of a sweep report's chart.

Builds a demo MONKEY_HOME with monkey's own API and store (a 12-run learning-rate x depth
sweep with logged metrics, a failed, a running and a queued job; no core runs, nothing
reaches the network), drives `monkey dash` with Textual's pilot and writes under OUT:

- dash-jobs.svg: the jobs table;
- dash-metrics.svg: one job's metrics, four sweep runs overlaid;
- dash-problems.svg: the problems view (`!`), failed jobs first;
- report-chart.svg: the metric charts of `monkey report`'s HTML page for the sweep;
- web-jobs.png, web-job.png, web-sweep.png, web-compare.png: Monkey Web's jobs, job and
  sweep pages and four runs' curves compared, served in this process (no core) and shot by
  Debian's chromium through Playwright.

Usage: python scripts/screenshots.py [--out docs] [--home DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import re
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from monkey.api import Monkey  # noqa: E402
from monkey.models import State  # noqa: E402
from monkey.tracking.ingest import as_columns  # noqa: E402

SIZE = (132, 32)
STEPS = 60
METRIC = "val/loss"
FILES = ("dash-jobs.svg", "dash-metrics.svg", "dash-problems.svg", "report-chart.svg")
WEB_FILES = ("web-jobs.png", "web-job.png", "web-sweep.png", "web-compare.png")
CHROMIUM = "/usr/bin/chromium"


def build_home(root: Path) -> tuple[Monkey, str, list[str]]:
    """A MONKEY_HOME under ``root`` holding the demo jobs; returns the facade, the sweep id
    and the sweep's job ids (grid order)."""
    project = root / "project"
    project.mkdir(parents=True, exist_ok=True)
    (project / "train.py").write_text("import monkey\n# a stand-in: the demo writes its runs\n")
    m = Monkey(root / "home")
    m.wake = lambda queued=None: None  # type: ignore[method-assign]  # no core: runs are written
    grid = {"lr": [0.001, 0.003, 0.01, 0.03], "layers": [2, 4, 8]}
    sid = m.sweep(
        "python train.py --lr {lr} --layers {layers}",
        grid=grid,
        metric=METRIC,
        goal="min",
        name="lr-depth",
        workdir=str(project),
    )
    status = m.sweep_status(sid)
    juids = [j["job"] for j in status["jobs"]]
    now = time.time()
    for i, j in enumerate(status["jobs"]):
        lr, layers = j["params"]["lr"], j["params"]["layers"]
        if lr == 0.03 and layers == 4:
            _run(m, j["job"], now - 300, lr, layers, steps=STEPS // 2, end=None)  # still running
        elif lr == 0.03 and layers == 8:
            _run(
                m,
                j["job"],
                now - 3000 + 60 * i,
                lr,
                layers,
                steps=12,
                end=(State.FAILED, 1, "exit 1"),
            )  # diverged
        else:
            _run(
                m,
                j["job"],
                now - 3000 + 60 * i,
                lr,
                layers,
                steps=STEPS,
                end=(State.SUCCEEDED, 0, "exit 0"),
            )
    prep = m.run(["python", "prepare.py"], name="prepare", workdir=str(project), start_core=False)
    _run(m, prep.juid, now - 4000, None, None, steps=0, end=(State.SUCCEEDED, 0, "exit 0"))
    oom = m.run(
        ["python", "eval.py", "--batch", "512"], name="eval", workdir=str(project), start_core=False
    )
    _run(m, oom.juid, now - 900, None, None, steps=0, end=(State.FAILED, 137, "killed (OOM)"))
    m.run(["python", "export.py"], name="export", workdir=str(project), start_core=False)
    return m, sid, juids


def _run(
    m: Monkey,
    juid: str,
    at: float,
    lr: float | None,
    layers: int | None,
    *,
    steps: int,
    end: tuple[State, int, str] | None,
) -> None:
    """Give a queued job one attempt started at ``at``, its metrics and its end (or keep it
    running)."""
    store = m.store
    record = store.get_job(juid)
    assert record is not None
    store.begin_attempt(record, "local", str(m.home.run_dir(juid, 1)), now=at)
    store.attempt_started(juid, 1, 4242, at + 1)
    if steps:
        points = []
        for step in range(steps):
            points += [
                (name, step, value, at + 2 + 5 * step)
                for name, value in _curves(lr or 0.01, layers or 4, step).items()
            ]
        store.ingest_metrics(juid, 1, 1, [as_columns(points)], params={"lr": lr, "layers": layers})
    if end:
        state, code, reason = end
        store.end_attempt(
            juid,
            1,
            final=state,
            exit_code=code,
            signal=None,
            reason=reason,
            now=at + 10 + 5 * max(steps, 1),
        )


def _curves(lr: float, layers: int, step: int) -> dict[str, float]:
    """Plausible training curves: faster with a higher learning rate, lower with depth."""
    speed = 40 * lr**0.7
    floor = 0.25 + 0.6 / layers + 0.15 * abs(math.log10(lr / 0.01))
    floor += 0.8 if lr >= 0.03 and layers == 8 else 0.0
    wobble = 0.02 * math.sin(step * 1.7 + layers)
    loss = floor + 2.0 * math.exp(-speed * step) + wobble
    return {"train/loss": loss * 0.9, METRIC: loss, "val/acc": max(0.0, 1.0 - loss / 2.6)}


async def dashboard(m: Monkey, juids: list[str], out: Path) -> None:
    """The jobs table, one run's metrics with three others overlaid, and the problems view."""
    from textual.widgets import Input

    from monkey.tui.app import DashApp
    from monkey.tui.metrics_pane import MetricsPane

    app = DashApp(m.home)
    async with app.run_test(size=SIZE) as pilot:
        await _until(pilot, lambda: app.table.row_count == len(m.jobs()))
        for box in app.screen.query(Input):
            box.cursor_blink = False
        await pilot.pause(0.3)
        (out / "dash-jobs.svg").write_text(app.export_screenshot(title="monkey dash"))
        await pilot.press("exclamation_mark")
        await pilot.pause(0.3)
        (out / "dash-problems.svg").write_text(
            app.export_screenshot(title="monkey dash: problems first (!)")
        )
        await pilot.press("exclamation_mark")
        for juid in juids[:4]:  # mark four runs of the sweep, open the first: overlaid
            app.table.move_cursor(juid)
            await pilot.press("space")
        app.table.move_cursor(juids[0])
        await pilot.press("enter", "m")
        pane = app.screen.query_one(MetricsPane)
        await _until(pilot, lambda: pane.names and pane.shown)
        await pilot.pause(0.5)
        (out / "dash-metrics.svg").write_text(
            app.export_screenshot(title="monkey dash: a run's metrics")
        )
        app.exit()


async def _until(pilot, predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit("the dashboard did not show the demo jobs in time")
        await pilot.pause(0.05)


def report_chart(m: Monkey, sid: str, out: Path) -> None:
    """The metric charts of the sweep's HTML report (its inline SVG figure with a legend), as
    a standalone SVG file on a white background."""
    page = Path(m.report(sid, str(out / "report.html.tmp")))
    html = page.read_text()
    page.unlink()
    charts = re.findall(r"<svg\b[^>]*>.*?</svg>", html, re.S)
    figure = next((c for c in charts if 'role="img"' in c[:400]), None)
    if figure is None:
        raise SystemExit("the report has no metric chart (inline SVG)")
    head = re.match(r"<svg\b[^>]*>", figure).group(0)  # type: ignore[union-attr]
    width = re.search(r'viewBox="0 0 ([\d.]+) ', head)
    fixed = head.replace('width="100%"', f'width="{width.group(1)}"' if width else "")
    if "xmlns=" not in fixed:
        fixed = fixed.replace("<svg", '<svg xmlns="http://www.w3.org/2000/svg"', 1)
    svg = fixed + '<rect width="100%" height="100%" fill="white"/>' + figure[len(head) :]
    (out / "report-chart.svg").write_text(svg + "\n")


def web_pages(m: Monkey, sid: str, juids: list[str], out: Path) -> None:
    """Monkey Web's pages of the demo, served by uvicorn in a thread of this process (no
    core: the demo stays as written), logged in by a one-time link, shot at 1280x800."""
    import socket
    import threading

    import uvicorn
    from playwright.sync_api import sync_playwright

    from monkey.server.app import build
    from monkey.server.auth import add_user
    from monkey.server.websession import issue_link

    if not m.store.count_users():
        add_user(m.store, "demo", admin=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(build(m.home), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    url = f"http://127.0.0.1:{port}"
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"]
            )
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.goto(f"{url}/web/login?once={issue_link(m.home, m.store.users()[0]['name'])}")
            page.wait_for_url("**/web/jobs")
            page.screenshot(path=str(out / "web-jobs.png"))
            page.goto(f"{url}/web/jobs/{juids[0]}")
            page.wait_for_selector("#charts canvas")
            page.screenshot(path=str(out / "web-job.png"), full_page=True)
            page.goto(f"{url}/web/sweeps/{sid}")
            page.wait_for_selector("#overlay canvas")
            page.screenshot(path=str(out / "web-sweep.png"), full_page=True)
            page.goto(f"{url}/web/compare?" + "&".join(f"job={j}" for j in juids[:4]))
            page.wait_for_selector("#overlay canvas")
            page.screenshot(path=str(out / "web-compare.png"), full_page=True)
            browser.close()
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs", help="where the images go")
    parser.add_argument("--home", type=Path, help="folder for the demo (default: a temp dir)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    root = args.home or Path(tempfile.mkdtemp(prefix="monkey-screenshots-"))
    m, sid, juids = build_home(root)
    asyncio.run(dashboard(m, juids, args.out))
    report_chart(m, sid, args.out)
    web_pages(m, sid, juids, args.out)
    m.store.close()
    for name in (*FILES, *WEB_FILES):
        print(args.out / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
