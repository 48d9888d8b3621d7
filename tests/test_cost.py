"""Estimated cost: instance prices (providers.yml `prices:`, libcloud's table, EC2's spot price),
each attempt's share, and the figures `info job`, `compare`, `sweep status` and
`list providers --monkey-instances` show."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from monkey.config import Home
from monkey.drivers.ec2 import EC2Driver
from monkey.models import Instance, InstanceState, State
from monkey.store import Store
from tests import test_ec2
from tests.conftest import wait_for
from tests.test_ec2 import add_aws, info, run_job, setup_aws

fleet = test_ec2.fleet  # one sshd per address moto gives the instances

T0 = 1_790_000_000.0


def test_instance_prices_from_the_table_libcloud_and_the_spot_price(
    home: Path, moto: Any, fleet
) -> None:
    config = setup_aws(home, moto, fleet, max_instances=3, prices={"t3.micro": 3.6})
    drv = EC2Driver(config, Home(home))
    made = []
    try:
        made.append(drv.create_node())  # t3.micro: the table's price
        made.append(drv.create_node("t3.small"))  # not in the table: libcloud's us-east-1 price
        made.append(drv.create_node(options={"spot": True}))  # spot: the price EC2 reports
        from libcloud.pricing import get_size_price

        listed = get_size_price("compute", "ec2_linux", "t3.small", "us-east-1")
        assert listed and [i.price for i in made] == [3.6, listed, 0.00001]  # moto: 0.00001 for all
        assert {i.id: i.price for i in drv.list_nodes()} == {i.id: i.price for i in made}
    finally:
        for inst in made:
            drv.destroy_node(inst.id)
        drv.close()


def test_bad_price_table_is_one_line(home: Path, cli) -> None:
    home.mkdir(parents=True, exist_ok=True)
    entry = {
        "type": "ec2",
        "region": "us-east-1",
        "size": "t3.micro",
        "image": "ami-1",
        "prices": {"t3.micro": "cheap"},
    }
    (home / "providers.yml").write_text(yaml.safe_dump({"providers": {"aws": entry}}))
    proc = cli("list", "providers")
    assert proc.returncode != 0
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .endswith(
            "provider 'aws': prices must map sizes to $ per hour, e.g. prices: {t3.micro: 0.0104}, "
            "got {'t3.micro': 'cheap'}"
        )
    )


def _record(store: Store, id: str, size: str, spot: bool, price: float, slots: int) -> None:
    store.record_instance(
        Instance(
            id,
            "aws",
            id,
            InstanceState.RUNNING,
            address="10.0.0.1",
            size=size,
            spot=spot,
            launched_at=T0,
            price=price,
            extra={"kind": "ec2", "slots": slots},
        )
    )


def test_attempt_costs_and_the_part_lost_to_preemption(home: Path, monkey, cli) -> None:
    """A 1-cpu job runs 100 s on a spot t3.large ($3.60/h, 2 cpus: its share is $1.80/h) that
    is reclaimed, then 1,000 s on an on-demand c5.large ($0.36/h, 2 cpus: $0.18/h)."""
    sweep = monkey.sweep(["python", "train.py", "--lr", "{lr}"], grid={"lr": [0.1, 0.2]})
    juid, other = [j["job"] for j in monkey.sweep_status(sweep)["jobs"]]
    store = monkey.store
    _record(store, "aws/i-spot", "t3.large", True, 3.6, 2)
    _record(store, "aws/i-demand", "c5.large", False, 0.36, 2)
    job = store.get_job(juid)
    store.begin_attempt(job, "aws/i-spot", "/r/1", now=T0)
    store.attempt_started(juid, 1, 11, T0)
    store.end_attempt(
        juid,
        1,
        final=State.LOST,
        exit_code=None,
        signal=None,
        reason="its instance was terminated",
        requeue_after=0,
        now=T0 + 100,
    )
    job = store.get_job(juid)
    store.begin_attempt(job, "aws/i-demand", "/r/2", now=T0 + 200)
    store.attempt_started(juid, 2, 12, T0 + 200)
    store.end_attempt(
        juid, 2, final=State.SUCCEEDED, exit_code=0, signal=None, reason="exit 0", now=T0 + 1200
    )

    shown = json.loads(cli("info", "job", juid, "--json", check=True).stdout)
    assert shown["cost"] == {"total": 0.05 + 0.05, "preempted": 0.05}
    first, second = shown["attempts_detail"]
    assert (first["size"], first["spot"], first["price"], first["cost"]) == (
        "t3.large",
        True,
        1.8,
        0.05,
    )
    assert (second["size"], second["spot"], second["price"]) == ("c5.large", False, 0.18)
    assert abs(second["cost"] - 0.05) < 1e-12
    text = cli("info", "job", juid, check=True).stdout
    assert re.search(
        r"^cost\s+\$0\.1000 estimated, \$0\.0500 of it on preempted attempts$", text, re.M
    ), text
    assert re.search(r"^1\s+aws/i-spot .* t3\.large\s+spot\s+\$0\.0500$", text, re.M), text
    assert re.search(r"^2\s+aws/i-demand .* c5\.large\s+on-demand\s+\$0\.0500$", text, re.M), text

    compared = cli("compare", juid, other, check=True).stdout
    assert re.search(rf"^1\s+{juid}\s.*\$0\.1000$", compared, re.M), compared
    assert re.search(rf"^2\s+{other}\s.*-$", compared, re.M), compared
    rows = json.loads(cli("compare", juid, other, "--json", check=True).stdout)
    assert [r["cost"] for r in rows] == [0.1, None]

    status = cli("sweep", "status", sweep, check=True).stdout
    assert "cost: $0.1000 estimated, $0.0500 of it on preempted attempts" in status
    assert re.search(rf"^{juid}\s+succeeded\s+2\s+\$0\.1000\s", status, re.M), status
    # The core may have run the second job here meanwhile (no price: no cost either way).
    assert re.search(rf"^{other}\s+\w+\s+\d+\s+-\s", status, re.M), status


def test_no_price_known_shows_no_cost(home: Path, monkey, cli) -> None:
    juid = monkey.run(["true"], start_core=False).juid
    shown = json.loads(cli("info", "job", juid, "--json", check=True).stdout)
    assert shown["cost"] is None
    assert "cost" not in cli("compare", juid, check=True).stdout.splitlines()[0].lower()


def test_monkey_instances_listing_end_to_end(cli, home: Path, moto: Any, fleet) -> None:
    add_aws(cli, moto, fleet, home, "--max-instances", "1", "--idle-timeout", "600")
    providers = yaml.safe_load((home / "providers.yml").read_text())
    providers["providers"]["aws"]["prices"] = {"t3.micro": 36.0}  # $0.01 a second
    (home / "providers.yml").write_text(yaml.safe_dump(providers))
    try:
        assert cli("list", "providers", "--monkey-instances", check=True).stdout.startswith(
            "no instances"
        )
        juid = run_job(cli, "sleep", "1")
        wait_for(lambda: info(cli, juid)["state"] == "succeeded", timeout=60, what="the job")
        attempt = info(cli, juid)["attempts_detail"][0]
        assert (attempt["size"], attempt["spot"]) == ("t3.micro", False)
        assert attempt["price"] == 18.0  # a 1-cpu job on a 2-cpu t3.micro: half of $36/h
        ran = attempt["ended_at"] - attempt["started_at"]
        assert info(cli, juid)["cost"] == {"total": 18.0 * ran / 3600, "preempted": 0.0}

        def listed() -> dict[str, Any]:
            [row] = json.loads(
                cli("list", "providers", "--monkey-instances", "--json", check=True).stdout
            )["instances"]
            return row

        row = wait_for(lambda: (r := listed())["idle"] is not None and r, what="idle time")
        assert 0 <= row["idle"] <= row["age"]
        assert row["id"] == info(cli, juid)["instance"] and row["provider"] == "aws"
        assert (row["state"], row["size"], row["spot"], row["address"], row["jobs"]) == (
            "up",
            "t3.micro",
            False,
            "127.0.0.4",
            [],
        )
        assert row["price"] == 36.0 and row["cost"] == 36.0 * row["age"] / 3600 > 0
        table = cli("list", "providers", "--monkey-instances", check=True).stdout
        header, line, total = table.splitlines()
        assert header.split() == [
            "INSTANCE",
            "PROVIDER",
            "STATE",
            "SIZE",
            "SPOT",
            "ADDRESS",
            "JOBS",
            "AGE",
            "IDLE",
            "$/H",
            "COST",
        ]
        assert re.match(
            rf"{re.escape(row['id'])}\s+aws\s+up\s+t3\.micro\s+-\s+127\.0\.0\.4\s+-\s+\d+[smh]\s+\d+[smh]\s+36\s+\$\d+\.\d+$",
            line,
        ), line
        assert total.startswith("estimated cost so far: $")
    finally:
        cli("daemon", "stop")
        left = [i["InstanceId"] for i in moto.instances()]
        if left:
            moto.boto3("ec2").terminate_instances(InstanceIds=left)


def test_dashboard_instances_pane_shows_them_with_their_cost(home: Path, monkey) -> None:
    from monkey.tui.app import DashApp
    from tests.test_tui import drive, until

    home.mkdir(parents=True, exist_ok=True)
    (home / "providers.yml").write_text(
        yaml.safe_dump(
            {
                "providers": {
                    "aws": {
                        "type": "ec2",
                        "region": "us-east-1",
                        "size": "t3.micro",
                        "image": "ami-1",
                    }
                }
            }
        )
    )
    monkey.store.record_instance(
        Instance(
            "aws/i-0abc",
            "aws",
            "monkey-aws",
            InstanceState.RUNNING,
            address="10.77.0.4",
            size="t3.micro",
            spot=True,
            launched_at=T0 - 7200,
            price=0.5,
            extra={"kind": "ec2", "slots": 2},
        ),
        reach="up",
    )
    app = DashApp(home, clock=lambda: T0)

    async def body(pilot) -> None:
        await pilot.press("i")
        table = app.screen.query_one("#created-table")
        await until(pilot, lambda: table.row_count == 1, "the instance")
        assert [str(c) for c in table.get_row_at(0)] == [
            "aws/i-0abc",
            "aws",
            "up",
            "t3.micro",
            "spot",
            "10.77.0.4",
            "-",
            "2h00m",
            "0.5",
            "$1.00",
        ]

    drive(app, body)
