"""A provider that starts nothing is flagged, saying why, and tried again with back-off
instead of every second for ever; it clears once a job starts (issue 42, item 14)."""

from __future__ import annotations

import json
import re
from datetime import datetime

from conftest import wait_for


def next_try(text: str) -> datetime:
    at = re.search(r"next try at (\d\d:\d\d:\d\d)", text)
    assert at, text
    return datetime.strptime(at.group(1), "%H:%M:%S")


def test_a_provider_whose_agent_cannot_start_is_flagged_and_backs_off(cli, home, monkeypatch):
    monkeypatch.setenv("MONKEY_START_BACKOFF", "2")
    lock = home / "private" / "agent.lock"
    lock.mkdir(parents=True)  # the local agent cannot take its lock: it exits at once
    juid = cli("run", "--", "echo", "hi", check=True).stdout.strip()

    def info() -> str:
        return cli("info", juid).stdout

    first = wait_for(lambda: "5 starts in a row" in (text := info()) and text, 60, what="flag")
    assert isinstance(first, str)
    state = next(line for line in first.splitlines() if line.startswith("state"))
    assert "queued; waiting: cannot start jobs: 5 starts in a row came to nothing" in state
    assert "the local agent could not start: IsADirectoryError" in state
    providers = cli("list", "providers").stdout
    assert "local: cannot start jobs: 5 starts in a row came to nothing" in providers
    assert "local: cannot start jobs" in cli("list", "jobs").stderr
    listed = json.loads(cli("list", "jobs", "--json").stdout)
    assert "the local agent could not start" in listed["providers_down"]["local"]
    # tried again after the back-off, which then doubles: not every second for ever
    second = wait_for(lambda: "6 starts in a row" in (text := info()) and text, 60, what="retry")
    assert isinstance(second, str)
    assert (next_try(second) - next_try(first)).total_seconds() >= 4
    assert json.loads(cli("info", juid, "--json").stdout)["attempts"] == 0  # nothing ran

    lock.rmdir()  # the cause gone: the next try starts the job, and the flag clears
    wait_for(lambda: "succeeded" in info(), 60, what="the job to run")
    assert "cannot start" not in cli("list", "providers").stdout
    assert cli("list", "jobs").stderr == ""


def test_an_edit_of_a_flagged_providers_entry_is_tried_at_once(cli, home, monkeypatch):
    monkeypatch.setenv("MONKEY_START_BACKOFF", "3600")  # no try again before an hour
    lock = home / "private" / "agent.lock"
    lock.mkdir(parents=True)
    juid = cli("run", "--", "echo", "hi", check=True).stdout.strip()
    wait_for(lambda: "5 starts in a row" in cli("list", "providers").stdout, 60, what="flag")
    lock.rmdir()
    (home / "providers.yml").write_text("providers:\n  local: {type: local, slots: 3}\n")
    wait_for(lambda: "succeeded" in cli("info", juid).stdout, 60, what="the job to run")
    assert "cannot start" not in cli("list", "providers").stdout
