"""Quotas per user and provider on a shared main node (issue 29, part 2): `monkey server
quota set|list|remove`; a job that would take its owner over a quota (concurrent jobs,
GPUs, estimated $/hour on a cloud) waits, saying why, while other owners' jobs and the
owner's smaller ones start; `list providers` shows each user's use against their quota."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from mainnode import node  # noqa: F401  (a fixture)

from monkey.core.placement import fair_order
from monkey.models import Job, State
from monkey.store.quotas import UNLIMITED, limits_for, share_for
from tests import test_ec2
from tests.conftest import kill_core, start_core, wait_for
from tests.test_ec2 import add_aws, info, run_job

fleet = test_ec2.fleet  # one sshd per address moto gives the instances


# The jobs here wait on a file of the test's, which a sandbox would hide: these tests are
# about quotas, run as the server's own user's jobs would.
NO_SANDBOX = "providers:\n  local: {type: local, isolation: none}\n"


def _gate(tmp_path: Path) -> tuple[Path, list[str]]:
    gate = tmp_path / "gate"
    return gate, ["sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done"]


def _users(monkey, *names: str) -> None:
    for name in names:
        monkey.store.add_user(name, f"digest-of-{name}")


def _state(monkey, juid: str) -> str:
    return monkey.store.get_job(juid).state.value


def _info(cli, juid: str) -> dict[str, Any]:
    return json.loads(cli("info", "job", juid, "--json", check=True).stdout)


def _state_line(cli, juid: str) -> str:
    out = cli("info", "job", juid, check=True).stdout
    return next(line for line in out.splitlines() if line.startswith("state"))


def _listed(cli) -> dict[str, dict[str, Any]]:
    return {
        j["job"]: j for j in json.loads(cli("list", "jobs", "--json", check=True).stdout)["jobs"]
    }


def test_a_user_at_the_jobs_quota_waits_while_another_users_jobs_start(
    home: Path, monkey, cli, tmp_path: Path
):
    home.mkdir(parents=True, exist_ok=True)
    (home / "providers.yml").write_text(
        "providers:\n  local: {type: local, isolation: none, slots: 5}\n"
    )
    _users(monkey, "ana", "bob")
    assert (
        cli(
            "server", "quota", "set", "ana", "--provider", "local", "--jobs", "1", check=True
        ).stdout
        == "quota ana on local: jobs 1\n"
    )
    gate, hold = _gate(tmp_path)
    as_user = monkey.acting_for("ana")
    first = as_user.run(hold).juid
    wait_for(lambda: _state(monkey, first) == "running", what="ana's first job")
    second = as_user.run(hold).juid
    as_user = monkey.acting_for("bob")
    bobs = [as_user.run(hold).juid for _ in range(2)]
    wait_for(lambda: all(_state(monkey, b) == "running" for b in bobs), what="bob's jobs")
    reason = "over quota: ana runs 1 of 1 job on local"
    wait_for(lambda: _info(cli, second)["held"] == reason, what="ana's second job held")
    assert _state(monkey, second) == "queued"
    assert _state_line(cli, second).split(None, 1)[1] == f"queued; waiting: {reason}"
    row = next(
        r for r in cli("list", "jobs", check=True).stdout.splitlines() if r.startswith(second)
    )
    assert row.split()[2:4] == ["over", "quota"]
    listed = _listed(cli)
    assert listed[second]["held"] == reason and "held" not in listed[first]

    providers = cli("list", "providers", check=True).stdout
    assert re.search(r"^QUOTA USER\s+PROVIDER\s+JOBS\s+GPUS\s+SPEND\s+HELD$", providers, re.M)
    assert re.search(r"^ana\s+local\s+1/1\s+0\s+\$0\.00\s+1$", providers, re.M), providers
    assert not re.search(r"^bob\s", providers, re.M)  # no limit binds bob
    [use] = json.loads(cli("list", "providers", "--json", check=True).stdout)["quotas"]
    assert use == {
        "user": "ana",
        "provider": "local",
        "jobs": {"used": 1, "limit": 1},
        "gpus": {"used": 0, "limit": None},
        "spend": {"used": 0.0, "limit": None},
        "held": 1,
    }

    # The quota lives in the store: a core killed and started again starts nothing early.
    kill_core(home)
    start_core(home)
    third = as_user.run(hold).juid  # bob's: once it runs, the new core has had its pass
    wait_for(lambda: _state(monkey, third) == "running", what="bob's third job")
    assert _state(monkey, second) == "queued" and _info(cli, second)["held"] == reason

    cli("server", "quota", "set", "ana", "--provider", "local", "--jobs", "2", check=True)
    wait_for(lambda: _state(monkey, second) == "running", what="ana's second job after the raise")
    assert _info(cli, second)["held"] is None
    assert "over quota" not in _state_line(cli, second)
    assert "held" not in _listed(cli)[second]
    gate.touch()
    wait_for(
        lambda: all(_state(monkey, j) == "succeeded" for j in [first, second, third, *bobs]),
        what="every job to end",
    )


def test_a_gpu_quota_holds_gpu_jobs_but_not_smaller_ones(home: Path, monkey, cli, tmp_path: Path):
    """A default quota binds every user; the owner's CPU-only job still starts."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "providers.yml").write_text(
        "providers:\n  local: {type: local, isolation: none, slots: 6, gpus: [0, 1, 2, 3]}\n"
    )
    _users(monkey, "ana", "bob")
    cli("server", "quota", "set", "--default", "--gpus", "1", check=True)
    gate, hold = _gate(tmp_path)
    as_user = monkey.acting_for("ana")
    gpu1 = as_user.run(hold, gpus=1).juid
    wait_for(lambda: _state(monkey, gpu1) == "running", what="ana's GPU job")
    gpu2 = as_user.run(hold, gpus=1).juid
    cpu = as_user.run(hold).juid
    as_user = monkey.acting_for("bob")
    bobs = as_user.run(hold, gpus=1).juid
    wait_for(
        lambda: _state(monkey, cpu) == "running" and _state(monkey, bobs) == "running",
        what="ana's CPU job and bob's GPU job",
    )
    reason = "over quota: ana uses 1 of 1 GPUs on local; this job asks for 1"
    wait_for(lambda: _info(cli, gpu2)["held"] == reason, what="ana's second GPU job held")
    assert _state(monkey, gpu2) == "queued"  # GPUs are free: the quota holds it
    use = {
        u["user"]: u
        for u in json.loads(cli("list", "providers", "--json", check=True).stdout)["quotas"]
    }
    assert use["ana"]["gpus"] == {"used": 1, "limit": 1} and use["ana"]["jobs"]["used"] == 2
    assert use["bob"]["gpus"] == {"used": 1, "limit": 1} and use["bob"]["held"] == 0
    # bob's own entry lifts the default's limit for him only
    cli("server", "quota", "set", "bob", "--gpus", "unlimited", check=True)
    as_user = monkey.acting_for("bob")
    bob2 = as_user.run(hold, gpus=1).juid
    wait_for(lambda: _state(monkey, bob2) == "running", what="bob's second GPU job")
    assert _state(monkey, gpu2) == "queued"
    listed = cli("server", "quota", "list", check=True).stdout.splitlines()
    assert [line.split() for line in listed] == [
        ["USER", "PROVIDER", "JOBS", "GPUS", "SPEND", "SHARE"],
        ["(default)", "(all)", "-", "1", "-", "-"],
        ["bob", "(all)", "-", "unlimited", "-", "-"],
    ]
    assert cli("server", "quota", "remove", "--default", check=True).stdout == (
        "quota of the default on all providers removed\n"
    )
    wait_for(lambda: _state(monkey, gpu2) == "running", what="ana's GPU job once no quota binds")
    assert _info(cli, gpu2)["held"] is None
    gate.touch()
    wait_for(
        lambda: all(_state(monkey, j) == "succeeded" for j in [gpu1, gpu2, cpu, bobs, bob2]),
        what="every job to end",
    )


def test_bad_quota_input_is_one_line_and_writes_nothing(home: Path, monkey, cli):
    _users(monkey, "ana")
    cases = [
        (
            ["set", "ana", "--jobs", "four"],
            1,
            "--jobs 'four' is not a limit; give a whole number, "
            "e.g. 4 (0 allows none), or unlimited",
        ),
        (
            ["set", "ana", "--gpus", "-1"],
            1,
            "--gpus '-1' is not a limit; give a whole number, e.g. 4 (0 allows none), or unlimited",
        ),
        (
            ["set", "ana", "--spend", "nan"],
            1,
            "--spend 'nan' is not a limit; give dollars per "
            "hour, e.g. 5.50 (0 allows none), or unlimited",
        ),
        (
            ["set", "ana"],
            1,
            "give a limit to set: --jobs N, --gpus N, --spend USD_PER_HOUR, --share W or "
            "--storage SIZE",
        ),
        (
            ["set", "ana", "--share", "0"],
            1,
            "--share '0' is not a weight; give a number above 0, e.g. 2 for twice the slots "
            "of a user with the default 1",
        ),
        (
            ["set", "zed", "--jobs", "1"],
            1,
            "no user 'zed'; see `monkey server user list` (or --default for everyone)",
        ),
        (
            ["set", "ana", "--provider", "gpu-clstr", "--jobs", "1"],
            1,
            "no provider 'gpu-clstr'; "
            "see `monkey list providers` (or leave out --provider for all providers)",
        ),
        (["remove", "ana"], 1, "no quota for ana on all providers; see `monkey server quota list`"),
    ]
    for args, code, line in cases:
        proc = cli("server", "quota", *args)
        assert (proc.returncode, proc.stderr) == (code, f"monkey: error: {line}\n"), args
    both = cli("server", "quota", "set", "ana", "--default", "--jobs", "1")
    assert both.returncode == 2 and len(both.stderr.strip().splitlines()) == 1
    neither = cli("server", "quota", "set", "--jobs", "1")
    assert neither.returncode == 2 and "user --default is required" in neither.stderr
    assert monkey.store.quotas() == []
    assert cli("server", "quota", "list", check=True).stdout.startswith("no quotas")
    assert json.loads(cli("server", "quota", "list", "--json", check=True).stdout) == []


def test_the_most_specific_entry_sets_each_limit():
    quotas = [
        {"user": "*", "provider": "*", "jobs": 10, "gpus": 4, "spend": None},
        {"user": "*", "provider": "gpu", "jobs": 2, "gpus": None, "spend": 5.0},
        {"user": "ana", "provider": "*", "jobs": None, "gpus": 8, "spend": None},
        {"user": "ana", "provider": "gpu", "jobs": UNLIMITED, "gpus": None, "spend": None},
    ]
    assert limits_for(quotas, "ana", "gpu") == {"gpus": 8, "spend": 5.0}
    assert limits_for(quotas, "ana", "cpu") == {"jobs": 10, "gpus": 8}
    assert limits_for(quotas, "bob", "gpu") == {"jobs": 2, "gpus": 4, "spend": 5.0}
    assert limits_for(quotas, None, "cpu") == {"jobs": 10, "gpus": 4}
    assert limits_for([], "ana", "gpu") == {}
    shares = [
        {"user": "*", "provider": "*", "jobs": None, "gpus": None, "spend": None, "share": 2.0},
        {"user": "ana", "provider": "gpu", "jobs": 1, "gpus": None, "spend": None, "share": 5.0},
    ]
    assert (share_for(shares, "ana", "gpu"), share_for(shares, "ana", "cpu")) == (5.0, 2.0)
    assert share_for([], "bob", "gpu") == 1.0
    assert limits_for(shares, "ana", "gpu") == {"jobs": 1}  # a share is no limit


def test_fair_order_gives_slots_in_proportion_to_shares():
    def queue(owner: str) -> Any:
        return iter(
            Job(f"{owner}{i}", "", State.QUEUED, ["true"], "local", created_at=float(i))
            for i in range(40)
        )

    first = list(fair_order({"ana": queue("ana"), "bob": queue("bob")}, {}, {"ana": 3.0}))[:20]
    assert sum(j.juid.startswith("ana") for j in first) == 15  # 3 of every 4
    # bob already runs 4 slots: with equal shares ana gets the next 4 before bob gets one.
    equal = list(fair_order({"ana": queue("ana"), "bob": queue("bob")}, {"bob": 4}))[:5]
    assert [j.juid for j in equal] == ["ana0", "ana1", "ana2", "ana3", "bob0"]


def test_a_spend_quota_on_a_cloud_holds_jobs_and_makes_no_machine(
    cli, home: Path, moto: Any, fleet, monkey
) -> None:
    from monkey.store.db import local_user

    me = local_user()
    add_aws(cli, moto, fleet, home, "--max-instances", "1", "--idle-timeout", "600")
    providers = yaml.safe_load((home / "providers.yml").read_text())
    providers["providers"]["aws"]["prices"] = {"t3.micro": 36.0}  # 2 vCPUs: $18/h per cpu
    (home / "providers.yml").write_text(yaml.safe_dump(providers))
    try:
        cli("server", "quota", "set", me, "--provider", "aws", "--spend", "10", check=True)
        first = run_job(cli, "sleep", "600")
        reason = f"over quota: {me} spends $0.00 of $10.00/h on aws; this job adds $18.00/h"
        wait_for(lambda: info(cli, first)["held"] == reason, timeout=60, what="the job held")
        assert monkey.store.instances("aws") == []  # no machine is made for a held job
        cli("server", "quota", "set", me, "--provider", "aws", "--spend", "20", check=True)
        wait_for(lambda: info(cli, first)["state"] == "running", timeout=90, what="the job")
        second = run_job(cli, "sleep", "600")  # the machine's second cpu is free
        reason = f"over quota: {me} spends $18.00 of $20.00/h on aws; this job adds $18.00/h"
        wait_for(lambda: info(cli, second)["held"] == reason, timeout=60, what="the second held")
        assert info(cli, second)["state"] == "queued"
        [use] = json.loads(cli("list", "providers", "--json", check=True).stdout)["quotas"]
        assert use["spend"] == {"used": 18.0, "limit": 20.0} and use["held"] == 1
        table = cli("list", "providers", check=True).stdout
        assert re.search(rf"^{me}\s+aws\s+1\s+0\s+\$18\.00/\$20\.00/h\s+1$", table, re.M), table
        cli("server", "quota", "set", me, "--provider", "aws", "--spend", "unlimited", check=True)
        wait_for(lambda: info(cli, second)["state"] == "running", timeout=60, what="the second")
        for juid in (first, second):
            cli("cancel", juid, check=True)
    finally:
        cli("daemon", "stop")
        left = [i["InstanceId"] for i in moto.instances()]
        if left:
            moto.boto3("ec2").terminate_instances(InstanceIds=left)


def test_quotas_through_a_remote_admins_set_them_users_see_their_use(node, tmp_path: Path):
    from mainnode import wait_until_ended

    bob = node.add_user("bob")
    node.add_remote(bob, name="bob")
    node.add_remote(node.token, name="admin")
    refused = node.laptop("--remote", "bob", "server", "quota", "set", "bob", "--jobs", "5")
    assert (refused.returncode, refused.stderr) == (
        1,
        "monkey: error: set quota is for admins of this server; ask one\n",
    )
    done = node.laptop("--remote", "admin", "server", "quota", "set", "bob", "--jobs", "1")
    assert (done.returncode, done.stdout) == (0, "quota bob on all providers: jobs 1\n"), (
        done.stderr
    )
    bad = node.laptop(
        "--remote", "admin", "server", "quota", "set", "bob", "--provider", "x", "--jobs", "1"
    )
    assert bad.returncode == 1 and bad.stderr.startswith("monkey: error: no provider 'x'")
    (node.home / "providers.yml").write_text(NO_SANDBOX)
    gate, hold = _gate(tmp_path)
    first = node.laptop("--remote", "bob", "run", "--", *hold).stdout.strip()
    second = node.laptop("--remote", "bob", "run", "--", *hold).stdout.strip()
    reason = "over quota: bob runs 1 of 1 job on local"

    def held() -> str | None:
        return json.loads(node.laptop("--remote", "bob", "info", second, "--json").stdout)["held"]

    wait_for(lambda: held() == reason, what="bob's second job held")
    shown = node.laptop("--remote", "bob", "info", second).stdout
    assert f"queued; waiting: {reason}" in shown
    row = next(
        r
        for r in node.laptop("--remote", "bob", "list", "jobs").stdout.splitlines()
        if r.startswith(second)
    )
    assert "over quota" in row
    use = json.loads(node.laptop("--remote", "bob", "list", "providers", "--json").stdout)
    assert [(u["user"], u["jobs"], u["held"]) for u in use["quotas"]] == [
        ("bob", {"used": 1, "limit": 1}, 1)
    ]
    listed = json.loads(node.laptop("--remote", "bob", "server", "quota", "list", "--json").stdout)
    assert [(q["user"], q["provider"], q["jobs"]) for q in listed] == [("bob", "*", 1)]
    assert not (node.laptop_root / ".monkey").exists()  # nothing made on the laptop
    removed = node.laptop("--remote", "admin", "server", "quota", "remove", "bob")
    assert removed.returncode == 0, removed.stderr
    wait_for(lambda: held() is None, what="bob's second job to start")
    gate.touch()
    wait_until_ended(node, first)
    wait_until_ended(node, second)


def test_jobs_held_back_do_not_use_up_the_pass_for_other_owners(
    home: Path, monkey, cli, tmp_path: Path
):
    """ana's urgent GPU jobs, all over her quota, come first in the queue: bob's job still
    gets the free slot (held jobs are not counted among the few a pass looks at)."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "providers.yml").write_text(
        "providers:\n  local: {type: local, isolation: none, slots: 2, gpus: [0, 1]}\n"
    )
    _users(monkey, "ana", "bob")
    cli("server", "quota", "set", "ana", "--gpus", "1", check=True)
    gate, hold = _gate(tmp_path)
    as_user = monkey.acting_for("ana")
    running = as_user.run(hold, gpus=1).juid
    wait_for(lambda: _state(monkey, running) == "running", what="ana's GPU job")
    urgent = [as_user.run(hold, gpus=1, priority=5).juid for _ in range(6)]
    as_user = monkey.acting_for("bob")
    bobs = as_user.run(hold).juid
    wait_for(lambda: _state(monkey, bobs) == "running", what="bob's job")
    assert all(_state(monkey, j) == "queued" for j in urgent)
    held = _listed(cli)
    assert all(held[j]["held"].startswith("over quota: ana uses 1 of 1 GPUs") for j in urgent[:3])
    gate.touch()
    cli("server", "quota", "remove", "ana", check=True)
    wait_for(
        lambda: all(_state(monkey, j) == "succeeded" for j in [running, bobs, *urgent]),
        what="every job to end",
    )


def test_a_users_share_weighs_the_free_slots_they_get(home: Path, monkey, cli, tmp_path: Path):
    """ana's share is 3, bob's the default 1: of 4 slots, ana's queue takes 3 and bob's 1,
    and the share is listed with the quotas."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "providers.yml").write_text(
        "providers:\n  local: {type: local, isolation: none, slots: 4}\n"
    )
    _users(monkey, "ana", "bob", "carl")
    out = cli("server", "quota", "set", "ana", "--share", "3", check=True).stdout
    assert out == "quota ana on all providers: share 3\n"
    gate, hold = _gate(tmp_path)
    first, blocking = _gate(tmp_path / "carl")
    (tmp_path / "carl").mkdir()
    as_user = monkey.acting_for("carl")  # carl's jobs take every slot until both queues are full
    carls = [as_user.run(blocking).juid for _ in range(4)]
    wait_for(lambda: all(_state(monkey, j) == "running" for j in carls), what="carl's jobs")
    mine = {}
    for owner in ("bob", "ana"):
        as_user = monkey.acting_for(owner)
        mine[owner] = [as_user.run(hold).juid for _ in range(6)]
    first.touch()

    def running(owner: str) -> int:
        return sum(_state(monkey, j) == "running" for j in mine[owner])

    wait_for(lambda: running("ana") + running("bob") == 4, what="4 jobs running")
    assert (running("ana"), running("bob")) == (3, 1)
    listed = cli("server", "quota", "list", check=True).stdout.splitlines()
    assert listed[0].split()[-1] == "SHARE" and listed[1].split()[-1] == "3"
    gate.touch()
    wait_for(
        lambda: all(_state(monkey, j) == "succeeded" for j in mine["ana"] + mine["bob"]),
        what="every job to end",
    )


def test_removing_a_user_removes_its_quotas(monkey, cli):
    _users(monkey, "ana", "bob")
    cli("server", "quota", "set", "ana", "--jobs", "2", check=True)
    cli("server", "quota", "set", "bob", "--provider", "local", "--gpus", "1", check=True)
    cli("server", "user", "remove", "ana", check=True)
    assert [(q["user"], q["provider"]) for q in monkey.store.quotas()] == [("bob", "local")]


def test_holding_and_releasing_a_job_is_a_change_pages_and_the_dashboard_see(tmp_path: Path):
    from monkey.api import Monkey

    m = Monkey(tmp_path / "home")
    juid = m.run(["true"], start_core=False).juid
    store = m.store
    before = store.last_job_change()
    store.hold([juid], "over quota: ana uses 1 of 1 jobs on local")
    assert store.get_job(juid).held == "over quota: ana uses 1 of 1 jobs on local"
    held = store.last_job_change()
    assert held > before
    assert juid in [j.juid for j in store.jobs_updated_since(before[0])]  # the dashboard reads
    store.hold([juid], "over quota: ana uses 1 of 1 jobs on local")  # known: no write
    assert store.last_job_change() == held
    store.release(None)
    assert store.last_job_change() > held and store.get_job(juid).held is None
