"""The suite's own rules: every test is `unit` or `system`, and the `home` fixture hides the
caller's terminal, so a test's output depends on neither the order of tests nor the process
(an xdist worker, a developer's shell) running them."""

from __future__ import annotations

import io
import os

import pytest
from conftest import SYSTEM_FIXTURES, TERMINAL_VARIABLES


def test_every_test_is_unit_or_system_and_no_unit_test_starts_services(
    request: pytest.FixtureRequest,
) -> None:
    assert request.node.get_closest_marker("unit") is not None
    for item in request.session.items:
        kinds = {name for name in ("unit", "system") if item.get_closest_marker(name)}
        assert len(kinds) == 1, f"{item.nodeid} is marked {sorted(kinds) or 'neither'}"
        if "unit" in kinds:
            assert SYSTEM_FIXTURES.isdisjoint(item.fixturenames), item.nodeid


def test_home_hides_the_callers_terminal(
    monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    from rich.console import Console

    leaked = {
        "COLUMNS": "40",
        "LINES": "10",
        "FORCE_COLOR": "1",
        "NO_COLOR": "1",
        "TTY_COMPATIBLE": "1",
        "TEXTUAL_COLOR_SYSTEM": "standard",
        "TERM": "dumb",
        "TEXTUAL_SNAPSHOT_TEMPDIR": "/tmp/snapshots",
    }  # the last: the plugin's, kept
    for name, value in leaked.items():
        monkeypatch.setenv(name, value)
    request.getfixturevalue("home")
    assert not [
        name for name in (*TERMINAL_VARIABLES, "TEXTUAL_COLOR_SYSTEM") if name in os.environ
    ]
    assert (os.environ["TERM"], os.environ["TEXTUAL_SNAPSHOT_TEMPDIR"]) == (
        "xterm",
        "/tmp/snapshots",
    )
    console = Console(file=io.StringIO())
    assert (console.width, console.height, console.color_system) == (80, 25, None)
