"""SVG snapshots of the dashboard's main screens (pytest-textual-snapshot).

The clock, the job ids, MONKEY_HOME's path and the time zone are fixed, and cursors do not
blink, so a snapshot changes only when what the screen shows changes. After a deliberate
change of the UI: `pytest tests/test_tui_snapshots.py --snapshot-update`, then look at the
new SVGs under tests/__snapshots__/ before committing them.
"""

from __future__ import annotations

import fcntl
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from textual.widgets import Input

from monkey.api import Monkey
from monkey.models import Instance, InstanceState, Resources, State
from monkey.tui.app import DashApp

pytestmark = pytest.mark.system  # drives the whole dashboard app in a headless terminal

NOW = 1_795_000_000.0  # 2026-11-18 08:26:40 UTC
SIZE = (130, 34)
ROOT = Path("/tmp/monkey-tui-snapshots")  # fixed: paths show on the detail screen


@pytest.fixture
def frozen(monkeypatch: pytest.MonkeyPatch) -> Iterator[Monkey]:
    """A MONKEY_HOME at a fixed path holding jobs in every state, created at fixed times.

    The path is the same for every run, so concurrent test runs take turns (a file lock).
    """
    lock = open(f"{ROOT}.lock", "w")  # held until the test ends
    fcntl.flock(lock, fcntl.LOCK_EX)
    shutil.rmtree(ROOT, ignore_errors=True)
    (ROOT / "project").mkdir(parents=True)
    monkeypatch.setenv("MONKEY_HOME", str(ROOT / "home"))
    monkeypatch.setenv("TZ", "UTC")
    monkeypatch.chdir(ROOT / "project")
    time.tzset()
    m = Monkey(ROOT / "home")
    _fill(m)
    yield m
    m.store.close()
    monkeypatch.delenv("TZ")
    time.tzset()
    shutil.rmtree(ROOT, ignore_errors=True)
    lock.close()


def _fill(m: Monkey) -> None:
    store = m.store

    def job(name: str, argv: list[str], at: float, **kw: object):
        return store.create_job(
            name=name,
            argv=argv,
            provider="local",
            resources=Resources(cpus=1),
            env={"PATH": "/usr/bin"},
            snapshot="b3:" + "ab" * 16,
            workdir="/srv/project",
            datasets=[],
            git={"commit": "0123abcd", "dirty": False},
            python="3.11.7",
            now=at,
            **kw,
        )

    def run(j, n_at: float, end: tuple[State, int, str] | None = None) -> None:
        att = store.begin_attempt(j, "local", str(m.home.run_dir(j.juid, 1)), now=n_at)
        assert att is not None
        store.attempt_started(j.juid, 1, 4242, n_at + 1)
        run_dir = m.home.run_dir(j.juid, 1)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "stdout.log").write_text(
            "".join(f"epoch {i}: loss {1 / (i + 1):.4f}\n" for i in range(12))
        )
        if end:
            state, code, reason = end
            store.end_attempt(
                j.juid, 1, final=state, exit_code=code, signal=None, reason=reason, now=n_at + 95
            )
        else:
            store.heartbeat_metrics(j.juid, 1, NOW - 2, 0, 97.5, 512 << 20, None)

    ok = job("mnist", ["python", "mnist.py", "--lr", "0.1"], NOW - 3600)
    run(ok, NOW - 3500, (State.SUCCEEDED, 0, "exit 0"))
    bad = job("mnist", ["python", "mnist.py", "--lr", "10"], NOW - 3000)
    run(bad, NOW - 2900, (State.FAILED, 1, "exit 1"))
    for i, lr in enumerate((0.01, 0.03)):
        cell = job(
            "sweep-lr",
            ["python", "train.py", "--lr", str(lr)],
            NOW - 600 + i,
            sweep="lr-grid",
            params={"lr": lr},
        )
        if i == 0:
            run(cell, NOW - 500)
    job("eval", ["python", "eval.py"], NOW - 60)
    paused = job("long", ["python", "long.py"], NOW - 30)
    store.transition(
        paused.juid, State.QUEUED, State.PAUSED, kind="user", detail="pause", now=NOW - 20
    )


def _cloud(m: Monkey) -> None:
    """A cloud provider and an instance monkey created 90 minutes ago, at $3.60 an hour."""
    store = m.store
    (m.home.root / "providers.yml").write_text(
        "providers:\n  aws: {type: ec2, region: us-east-1, size: t3.micro, image: ami-12c6146b, "
        "spot: true, prices: {t3.micro: 3.6}}\n"
    )
    store.record_instance(Instance("aws/i-0abc12", "aws", "monkey-aws", InstanceState.RUNNING,
                                   address="10.77.0.4", size="t3.micro", spot=True,
                                   launched_at=NOW - 5400, price=3.6,
                                   extra={"kind": "ec2", "slots": 2}), reach="up")  # fmt: skip


def app_for(m: Monkey, **kwargs: object) -> DashApp:
    return DashApp(m.home, clock=lambda: NOW, **kwargs)  # type: ignore[arg-type]


def settle(*keys: str, until: Callable[[DashApp], object] = lambda app: True):
    """A run_before: wait for the first load (and ``until``), press ``keys``, stop blinking."""

    async def run_before(pilot) -> None:
        app = pilot.app
        deadline = time.monotonic() + 20
        while not (app.table.row_count == 6 and until(app)):
            assert time.monotonic() < deadline, "the dashboard did not load"
            await pilot.pause(0.05)
        await pilot.press(*keys)
        await pilot.pause(0.3)
        for box in app.screen.query(Input):
            box.cursor_blink = False
        await pilot.pause()

    return run_before


def test_jobs_table(frozen, snap_compare):
    assert snap_compare(app_for(frozen), terminal_size=SIZE, run_before=settle())


def test_jobs_table_filtered_sorted_and_marked(frozen, snap_compare):
    keys = ("slash", *"sweep:lr-grid", "enter", "s", "space")
    assert snap_compare(app_for(frozen), terminal_size=SIZE, run_before=settle(*keys))


def test_job_detail(frozen, snap_compare):
    juid = frozen.jobs(state="failed")[0].juid
    assert snap_compare(
        app_for(frozen, job=juid),
        terminal_size=SIZE,
        run_before=settle(
            until=lambda app: "failed" in str(app.screen.query_one("#job-title").render())
        ),
    )


def test_log_pane(frozen, snap_compare):
    juid = frozen.jobs(state="succeeded")[0].juid
    assert snap_compare(
        app_for(frozen, job=juid),
        terminal_size=SIZE,
        run_before=settle(
            "l", until=lambda app: len(app.screen.query_one("#log-view").lines) >= 12
        ),
    )


def test_instances_pane(frozen, snap_compare):
    _cloud(frozen)
    assert snap_compare(
        app_for(frozen),
        terminal_size=SIZE,
        run_before=settle("i", until=lambda app: app.instances.history),
    )


def test_keys_help(frozen, snap_compare):
    assert snap_compare(app_for(frozen), terminal_size=SIZE, run_before=settle("question_mark"))


def test_cancel_confirmation(frozen, snap_compare):
    assert snap_compare(app_for(frozen), terminal_size=SIZE, run_before=settle("c"))


def test_new_job_form(frozen, snap_compare):
    assert snap_compare(
        app_for(frozen), terminal_size=SIZE, run_before=settle("n", *"python train.py --lr 0.3")
    )
