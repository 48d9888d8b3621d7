"""Placement by memory and pinning to a host (pure functions of monkey.core.placement)."""

from __future__ import annotations

import pytest

from monkey.core.placement import Usage, place
from monkey.drivers.base import Capacity
from monkey.models import MonkeyError, Resources, parse_size

G = 1 << 30


def hosts() -> list[Capacity]:
    return [Capacity("lab/small", 4, [], 8 * G), Capacity("lab/big", 4, ["0", "1"], 64 * G)]


def test_memory_decides_where_a_job_fits() -> None:
    usage: dict[str, Usage] = {}
    first = place(Resources(memory="40G"), hosts(), usage)
    assert first is not None and first.instance == "lab/big"
    # The big host has 24G left and the small one 8G: a 16G job goes to big, a 30G one nowhere.
    assert place(Resources(memory="30G"), hosts(), usage) is None
    second = place(Resources(memory="16G"), hosts(), usage)
    assert second is not None and second.instance == "lab/big"
    third = place(Resources(memory="8G"), hosts(), usage)
    assert third is not None and third.instance == "lab/small"
    assert usage["lab/big"].memory == 56 * G
    assert not hosts()[1].could_hold(Resources(memory="100G"))
    assert hosts()[1].could_hold(Resources(memory="64G", gpus=2))


def test_pinned_job_waits_for_its_host() -> None:
    usage = {"lab/big": Usage(slots=4)}
    assert place(Resources(), hosts(), usage, pinned="big") is None
    placed = place(Resources(), hosts(), usage, pinned="small")
    assert placed is not None and placed.instance == "lab/small"
    placed = place(Resources(), hosts(), {}, pinned="lab/big")
    assert placed is not None and placed.instance == "lab/big"


def test_sizes() -> None:
    assert parse_size("512M") == 512 << 20 and parse_size("1.5GiB") == 3 << 29
    assert parse_size(1024) == 1024 and parse_size("2T") == 2 << 40
    with pytest.raises(MonkeyError, match="'lots' is not a size"):
        parse_size("lots")
