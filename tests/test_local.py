"""The `local` provider: this machine, through one agent sharing MONKEY_HOME with the core."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.driver_contract import DriverContract, Target, provider, serve


class TestLocalContract(DriverContract):
    """The driver contract on this machine."""

    @pytest.fixture
    def target(self, home: Path) -> Iterator[Target]:
        yield from serve(provider(home, "local", {"type": "local", "slots": 2}), home, ["local"])
