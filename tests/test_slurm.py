"""The `slurm` provider against a real single-node Slurm (tests/slurm.py): jobs run inside
allocations monkey makes with sbatch, followed and released like any instance."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import wait_for
from slurm import PARTITION, SlurmLab, slurm, slurm_cluster  # noqa: F401 - fixtures

GOLDEN = Path(__file__).parent / "golden"


def write_provider(home: Path, **options: Any) -> None:
    home.mkdir(parents=True, exist_ok=True)
    entry = {"type": "slurm", "partition": PARTITION, **options}
    (home / "providers.yml").write_text(yaml.safe_dump({"providers": {"cluster": entry}}))


def run_job(cli: Any, *argv: str, options: tuple[str, ...] = ()) -> str:
    out = cli("run", "--json", "-p", "cluster", *options, "--", *argv, check=True).stdout
    return json.loads(out)["juid"]


def info(cli: Any, juid: str) -> dict[str, Any]:
    return json.loads(cli("info", "job", juid, "--json", check=True).stdout)


def monkey_jobs(lab: SlurmLab) -> list[str]:
    return [line for line in lab.jobs() if " monkey-" in line]


@pytest.fixture
def cluster(cli: Any, home: Path, slurm: SlurmLab) -> Any:  # noqa: F811 - the fixture
    write_provider(home)
    yield slurm
    cli("daemon", "stop")


def test_job_runs_in_an_allocation_and_its_logs_follow(cli: Any, home: Path, cluster: SlurmLab) -> None:
    juid = run_job(cli, "sh", "-c", 'echo "hi from slurm job $SLURM_JOB_ID"; echo oops >&2',
                   options=("--cpus", "2", "--memory", "100M"))
    wait_for(lambda: info(cli, juid)["state"] in ("succeeded", "failed"), timeout=60, what="the job to end")
    job = info(cli, juid)
    assert job["state"] == "succeeded", job
    assert job["instance"].startswith("cluster/")
    slurm_id = job["instance"].split("/")[1]
    assert cli("logs", juid, check=True).stdout == f"hi from slurm job {slurm_id}\n"
    assert cli("logs", "--stderr", juid, check=True).stdout == "oops\n"
    # The allocation lived for the job only: released once it ended, nothing left in Slurm.
    wait_for(lambda: not monkey_jobs(cluster), timeout=30, what="the allocation to be released")
