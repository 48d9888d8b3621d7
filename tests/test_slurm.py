"""The `slurm` provider against a real single-node Slurm (tests/slurm.py): jobs run inside
allocations monkey makes with sbatch, followed and released like any instance."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import wait_for
from driver_contract import DriverContract, Target, provider, serve
from in_job import SCRIPT, bare_python, check_tracked, open_tmp  # noqa: F401 - a fixture
from registry import reg  # noqa: F401 - a fixture
from slurm import PARTITION, SlurmLab, slurm, slurm_cluster  # noqa: F401 - fixtures

from monkey.models import State

GOLDEN = Path(__file__).parent / "golden"


def write_provider(home: Path, **options: Any) -> None:
    home.mkdir(parents=True, exist_ok=True)
    entry = {"type": "slurm", "partition": PARTITION, **options}
    (home / "providers.yml").write_text(yaml.safe_dump({"providers": {"cluster": entry}}))


def run_job(cli: Any, *argv: str, options: tuple[str, ...] = ()) -> str:
    out = cli("run", "--json", "-p", "cluster", *options, "--", *argv, check=True).stdout
    return json.loads(out)["job"]


def info(cli: Any, juid: str) -> dict[str, Any]:
    return json.loads(cli("info", "job", juid, "--json", check=True).stdout)


def monkey_jobs(lab: SlurmLab) -> list[str]:
    return [line for line in lab.jobs() if " monkey-" in line]


class TestSlurmContract(DriverContract):
    """The driver contract against a real single-node Slurm (allocations on this machine)."""

    @pytest.fixture
    def target(self, home: Path, slurm: SlurmLab) -> Iterator[Target]:  # the fixture
        config = provider(home, "cluster", {"type": "slurm", "partition": PARTITION})
        yield from serve(config, home, [])


@pytest.fixture
def cluster(cli: Any, home: Path, slurm: SlurmLab) -> Any:  # the fixture
    write_provider(home)
    yield slurm
    cli("daemon", "stop")


def test_job_runs_in_an_allocation_and_its_logs_follow(
    cli: Any, home: Path, monkey: Any, cluster: SlurmLab
) -> None:
    juid = run_job(
        cli,
        "sh",
        "-c",
        'echo "hi from slurm job $SLURM_JOB_ID"; echo oops >&2',
        options=("--cpus", "2", "--memory", "100M"),
    )
    wait_for(
        lambda: info(cli, juid)["state"] in ("succeeded", "failed"),
        timeout=60,
        what="the job to end",
    )
    job = info(cli, juid)
    assert job["state"] == "succeeded", job
    assert job["instance"].startswith("cluster/")
    slurm_id = job["instance"].split("/")[1]
    assert cli("logs", "--stdout", juid, check=True).stdout == f"hi from slurm job {slurm_id}\n"
    assert cli("logs", "--stderr", juid, check=True).stdout == "oops\n"
    # The allocation lived for the job only: released once it ended, nothing left in Slurm.
    wait_for(lambda: not monkey_jobs(cluster), timeout=30, what="the allocation to be released")
    # ... quietly: the core knew the link was going with it (and tried no reconnect until
    # Slurm's queue showed the allocation gone).
    wait_for(
        lambda: [r["state"] for r in monkey.store.instances("cluster")] == ["terminated"],
        timeout=30,
        what="the allocation to be recorded gone",
    )
    log = (home / "daemon.log").read_text()
    assert "lost the link" not in log and "cannot reach the agent" not in log, log


def test_cancel_leaves_no_slurm_job_and_a_waiting_job_shows_slurms_reason(
    cli: Any, home: Path, cluster: SlurmLab
) -> None:
    everything = ("--cpus", str(cluster.cpus))
    first = run_job(cli, "sh", "-c", "echo started; exec sleep 300", options=everything)
    wait_for(
        lambda: cli("logs", first).stdout == "started\n", timeout=60, what="the first job to run"
    )
    second = run_job(cli, "sleep", "300", options=everything)
    # The second allocation waits in Slurm's queue for the node: `info job` says why.
    wait_for(
        lambda: any(p.get("reason") == "Resources" for p in info(cli, second)["pending_instances"]),
        timeout=30,
        what="Slurm's pending reason on the queued job",
    )
    text = cli("info", "job", second, check=True).stdout
    assert "reason Resources" in text and "slurm_state PENDING" in text, text
    running = info(cli, first)
    assert running["instance_extra"]["node_list"] == cluster.node
    assert (
        f"job_id {running['instance'].split('/')[1]}"
        in cli("info", "job", first, check=True).stdout
    )

    cli("job", "cancel", first, check=True)
    wait_for(lambda: info(cli, first)["state"] == "cancelled", timeout=30, what="the cancel")
    first_slurm_id = running["instance"].split("/")[1]
    wait_for(
        lambda: not any(line.startswith(first_slurm_id + " ") for line in cluster.jobs()),
        timeout=30,
        what="the first allocation to be released",
    )
    wait_for(
        lambda: info(cli, second)["state"] == "running", timeout=60, what="the second job to run"
    )
    cli("job", "cancel", second, check=True)
    wait_for(
        lambda: info(cli, second)["state"] == "cancelled", timeout=30, what="the second cancel"
    )
    wait_for(lambda: not monkey_jobs(cluster), timeout=30, what="no allocation left")


def test_a_sweep_is_one_job_array_and_its_cancel_leaves_no_slurm_job(
    cli: Any, home: Path, monkey: Any, cluster: SlurmLab
) -> None:
    out = cli(
        "sweep",
        "--grid",
        f"k={','.join(map(str, range(20)))}",
        "--max-parallel",
        "4",
        "-p",
        "cluster",
        "--",
        "sh",
        "-c",
        "echo cell {k} in $SLURM_ARRAY_JOB_ID; sleep 2",
        check=True,
    ).stdout
    sid = out.strip()
    # One sbatch: every task of one array, at most 4 of them running at once.
    wait_for(lambda: len(monkey_jobs(cluster)) == 20, timeout=30, what="the array's 20 tasks")
    tasks = [line.split()[0] for line in monkey_jobs(cluster)]
    arrays = {task.split("_")[0] for task in tasks}
    assert len(arrays) == 1 and sorted(int(t.split("_")[1]) for t in tasks) == list(range(20)), (
        tasks
    )
    [array] = arrays
    assert "ArrayTaskThrottle=4" in cluster.run("scontrol", "show", "job", array)  # max_parallel
    jobs = lambda: monkey.store.list_jobs(sweep=sid)  # noqa: E731
    wait_for(
        lambda: sum(j.state == State.SUCCEEDED for j in jobs()) >= 6,
        timeout=120,
        what="six cells to succeed",
    )
    assert sum(j.state == State.RUNNING for j in jobs()) <= 4
    for job in [j for j in jobs() if j.state == State.SUCCEEDED][:6]:  # each in a task of the array
        assert info(cli, job.juid)["instance"].startswith(f"cluster/{array}_"), job
        assert (
            cli("logs", "--stdout", job.juid, check=True).stdout
            == f"cell {job.params['k']} in {array}\n"
        )
    cli("sweep", "cancel", sid, check=True)
    wait_for(
        lambda: all(j.state in (State.SUCCEEDED, State.CANCELLED) for j in jobs()),
        timeout=30,
        what="the cells to be cancelled",
    )
    # The array's tasks that still waited or ran are cancelled: no Slurm job is left.
    wait_for(lambda: not monkey_jobs(cluster), timeout=30, what="no task of the array left")


# Counts epochs of 0.5 s in $MONKEY_CHECKPOINT_DIR/epoch; on SIGTERM it saves and exits.
TRAIN = """import os, signal, sys, time
path = os.path.join(os.environ["MONKEY_CHECKPOINT_DIR"], "epoch")
start = int(open(path).read()) if os.path.exists(path) else 0
print(f"resumed from epoch {start}", flush=True)
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
for epoch in range(start + 1, int(sys.argv[1]) + 1):
    time.sleep(0.5)
    with open(path + ".tmp", "w") as f:
        f.write(str(epoch))
    os.replace(path + ".tmp", path)
    print(f"epoch {epoch}", flush=True)
    if stop:
        print(f"checkpointed at epoch {epoch}", flush=True)
        sys.exit(0)
print("done", flush=True)
"""


def attempt_logs(cli: Any, juid: str, n: int) -> str:
    return cli("logs", juid, "--attempt", str(n), check=True).stdout


def test_a_job_slurm_requeues_resumes_from_its_checkpoint_as_the_next_attempt(
    cli: Any, home: Path, cluster: SlurmLab
) -> None:
    Path("train.py").write_text(TRAIN)
    juid = run_job(cli, sys.executable, "train.py", "12")
    wait_for(lambda: "epoch 3\n" in cli("logs", juid).stdout, timeout=60, what="three epochs")
    slurm_id = info(cli, juid)["instance"].split("/")[1]
    cluster.run("scontrol", "requeue", slurm_id)
    wait_for(
        lambda: info(cli, juid)["state"] in ("succeeded", "failed"),
        timeout=120,
        what="the job to end",
    )
    job = info(cli, juid)
    assert job["state"] == "succeeded", job
    first, second = job["attempts_detail"]
    # The agent's notice or, when the core's listing sees the requeue first, Slurm's
    # restart count: either way preempted (no retry used), never a spot instance's words.
    assert first["reason"].startswith(
        ("preempted: Slurm is ending the allocation", "preempted: Slurm requeued the allocation")
    ), first
    saved = int(attempt_logs(cli, juid, 1).split("checkpointed at epoch ")[1].split()[0])
    log2 = attempt_logs(cli, juid, 2)
    assert log2.startswith(f"resumed from epoch {saved}\nepoch {saved + 1}\n"), log2
    # Slurm's SIGTERM, and the batch shell's relay of it: the warning is logged once.
    assert (home / "daemon.log").read_text().count("Slurm is ending the allocation") <= 1
    assert log2.endswith("epoch 12\ndone\n")
    # The requeued Slurm job was not left waiting: monkey made a new allocation instead.
    assert job["instance"].split("/")[1] != slurm_id
    wait_for(lambda: not monkey_jobs(cluster), timeout=30, what="no allocation left")


def test_an_admins_scancel_of_the_allocation_ends_the_job_once(
    cli: Any, home: Path, cluster: SlurmLab
) -> None:
    # Not a preemption (issue 46 item 5): the job fails, saying why, and with --retries 0
    # it is not queued again; Slurm's warning is logged once.
    juid = run_job(cli, "sh", "-c", "echo started; exec sleep 300")
    wait_for(lambda: cli("logs", juid).stdout == "started\n", timeout=60, what="the job to run")
    slurm_id = info(cli, juid)["instance"].split("/")[1]
    cluster.run("scancel", slurm_id)
    wait_for(
        lambda: info(cli, juid)["state"] not in ("queued", "dispatching", "running", "preempted"),
        timeout=60,
        what="the job to end",
    )
    job = info(cli, juid)
    assert job["state"] == "failed", job
    cancelled = "Slurm: the allocation was cancelled (scancel by its user or an admin)"
    assert job["reason"].startswith(cancelled + "; "), job["reason"]
    assert len(job["attempts_detail"]) == 1, job["attempts_detail"]
    wait_for(lambda: not monkey_jobs(cluster), timeout=30, what="no allocation left")
    assert (home / "daemon.log").read_text().count(cancelled) == 1


def test_slurms_time_limit_signal_checkpoints_and_the_job_resumes(
    cli: Any, home: Path, slurm: SlurmLab
) -> None:
    # A one-minute allocation warned 50 s ahead (Slurm checks about every 30 s).
    write_provider(home, time="1", signal="B:USR1@50")
    try:
        Path("train.py").write_text(TRAIN)
        juid = run_job(cli, sys.executable, "train.py", "1000")
        wait_for(
            lambda: len(info(cli, juid)["attempts_detail"]) >= 2,
            timeout=150,
            what="the second attempt",
        )
        first = info(cli, juid)["attempts_detail"][0]
        assert first["reason"].startswith("preempted: Slurm: time limit of allocation"), first
        saved = int(attempt_logs(cli, juid, 1).split("checkpointed at epoch ")[1].split()[0])
        wait_for(
            lambda: f"epoch {saved + 1}\n" in attempt_logs(cli, juid, 2),
            timeout=60,
            what="the second attempt to go on",
        )
        assert attempt_logs(cli, juid, 2).startswith(f"resumed from epoch {saved}\n")
        cli("job", "cancel", juid, check=True)
        wait_for(lambda: info(cli, juid)["state"] == "cancelled", timeout=30, what="the cancel")
        wait_for(lambda: not monkey_jobs(slurm), timeout=30, what="no allocation left")
    finally:
        cli("daemon", "stop")


def test_bad_partition_one_line_and_the_job_waits_with_the_reason(
    cli: Any, home: Path, slurm: SlurmLab
) -> None:
    bad = cli("provider", "add", "slurm", "hpc", "--partition", "nope")
    assert bad.returncode != 0
    assert (
        bad.stderr.strip().splitlines()
        == [f"monkey: no partition 'nope' on this cluster; partitions: {PARTITION}"]
        or len(bad.stderr.strip().splitlines()) == 1
    ), bad.stderr
    assert "no partition 'nope'" in bad.stderr and PARTITION in bad.stderr
    assert (
        not (home / "providers.yml").exists() or "hpc" not in (home / "providers.yml").read_text()
    )

    write_provider(home, partition="nope")  # written by hand: sbatch is the one to refuse it
    try:
        juid = run_job(cli, "true")
        wait_for(
            lambda: "invalid partition" in (info(cli, juid)["waiting"] or ""),
            timeout=30,
            what="the job to say why it waits",
        )
        job = info(cli, juid)
        assert job["state"] == "queued" and "\n" not in job["waiting"], job
        assert not monkey_jobs(slurm)
    finally:
        cli("daemon", "stop")


def test_provider_add_and_list_providers_show_the_partition(
    cli: Any, home: Path, slurm: SlurmLab
) -> None:
    added = cli("provider", "add", "slurm", "hpc", "--time", "1:00:00", check=True).stdout
    assert (
        f"added provider 'hpc' (slurm, partition {PARTITION}: 1 idle, 0 mixed, 0 allocated nodes)"
        in added
    )
    entry = yaml.safe_load((home / "providers.yml").read_text())["providers"]["hpc"]
    assert entry == {"type": "slurm", "time": "1:00:00", "partition": PARTITION}
    listing = cli("list", "providers", check=True).stdout
    assert (
        f"hpc: partition {PARTITION} (up): 1 idle, 0 mixed, 0 allocated nodes; 0 pending jobs"
        in listing
    )
    [hpc] = [
        p
        for p in json.loads(cli("list", "providers", "--json", check=True).stdout)["providers"]
        if p["name"] == "hpc"
    ]
    assert (hpc["type"], hpc["slots"]) == ("slurm", slurm.cpus)


def test_the_batch_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from monkey.config import Home, ProviderConfig
    from monkey.drivers.slurm import SlurmDriver
    from monkey.drivers.slurm_commands import Size
    from monkey.models import Resources
    from monkey.version import agent_digest

    monkeypatch.setenv("MONKEY_HEARTBEAT", "5")
    monkeypatch.setenv("MONKEY_AGENT_IDLE_TIMEOUT", "600")
    (tmp_path / "home_id").write_text("0123456789ab")
    options = {
        "partition": "gpu",
        "account": "lab42",
        "qos": "normal",
        "time": "2:00:00",
        "constraint": "a100",
        "extra_args": ["--nice=10", "--comment=from monkey"],
        "workdir": "/shared/me/monkey",
    }
    driver = SlurmDriver(ProviderConfig("hpc", "slurm", options), Home(tmp_path))
    script = driver.batch_script(Size.of(Resources(cpus=4, gpus=2, memory="16G", time=3600)))
    script = script.replace(agent_digest(), "AGENT")
    golden = GOLDEN / "slurm_batch.sh"
    if not golden.exists():  # made once, then reviewed and committed
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(script)
    assert script == golden.read_text()
    validate_refuses = [
        {"partition": "a b"},
        {"extra_args": ["x"]},
        {"signal": "USR1"},
        {"login": "h"},
        {"login": {"host": "h", "password": "x"}},
    ]
    for bad in validate_refuses:
        with pytest.raises(Exception, match="provider 'hpc'"):
            SlurmDriver.validate("providers.yml", "hpc", {"type": "slurm", **bad})


def test_the_batch_script_keeps_the_agents_socket_folder_private(tmp_path: Path) -> None:
    """The folder of the agent's socket is made 0700 (it may be /tmp/monkey-UID, which the
    core refuses to use when others can read it)."""
    from monkey.config import Home, ProviderConfig
    from monkey.drivers.slurm import SlurmDriver
    from monkey.drivers.slurm_commands import Size
    from monkey.models import Resources

    (tmp_path / "home_id").write_text("0123456789ab")
    driver = SlurmDriver(
        ProviderConfig("hpc", "slurm", {"workdir": "/shared/me/monkey"}), Home(tmp_path)
    )
    script = driver.batch_script(Size.of(Resources(cpus=1)))
    made = [line for line in script.splitlines() if "mkdir" in line]
    sock = tmp_path / "sockets" / "deeper" / "agent.sock"
    run = f"umask 022\nroot={tmp_path / 'root'}\nsock={sock}\n" + "\n".join(made)
    subprocess.run(["bash", "-c", run], check=True)
    assert stat.S_IMODE(sock.parent.stat().st_mode) == 0o700
    assert (tmp_path / "root").is_dir()


def test_pause_checkpoints_and_releases_the_allocation_and_resume_goes_on_from_there(
    cli: Any, home: Path, cluster: SlurmLab
) -> None:
    Path("train.py").write_text(TRAIN)
    juid = run_job(cli, sys.executable, "train.py", "12")
    wait_for(lambda: "epoch 3\n" in cli("logs", juid).stdout, timeout=60, what="three epochs")
    cli("job", "pause", juid, check=True)
    wait_for(lambda: info(cli, juid)["state"] == "paused", timeout=60, what="the pause")
    saved = int(attempt_logs(cli, juid, 1).split("checkpointed at epoch ")[1].split()[0])
    wait_for(lambda: not monkey_jobs(cluster), timeout=30, what="the allocation to be released")
    cli("job", "resume", juid, check=True)
    wait_for(
        lambda: info(cli, juid)["state"] in ("succeeded", "failed"),
        timeout=120,
        what="the job to end",
    )
    job = info(cli, juid)
    assert job["state"] == "succeeded", job
    log2 = attempt_logs(cli, juid, 2)
    assert log2.startswith(f"resumed from epoch {saved}\nepoch {saved + 1}\n") and log2.endswith(
        "done\n"
    ), log2
    wait_for(lambda: not monkey_jobs(cluster), timeout=30, what="no allocation left")


def test_jobs_waiting_together_get_allocations_sized_each_for_its_own_cpus(
    cli: Any, home: Path, monkey: Any, slurm: SlurmLab
) -> None:
    write_provider(home, partition="nope")  # sbatch refuses it: both jobs wait together
    try:
        small = run_job(cli, "sh", "-c", "echo cpus $SLURM_CPUS_PER_TASK", options=("--cpus", "1"))
        large = run_job(cli, "sh", "-c", "echo cpus $SLURM_CPUS_PER_TASK", options=("--cpus", "3"))
        for juid in (small, large):
            wait_for(
                lambda j=juid: "invalid partition" in (info(cli, j)["waiting"] or ""),
                timeout=30,
                what="both jobs to wait",
            )
        write_provider(home)  # fixed: one batch per size, each for its own job
        for juid, cpus in ((small, 1), (large, 3)):
            wait_for(
                lambda j=juid: info(cli, j)["state"] in ("succeeded", "failed"),
                timeout=90,
                what="the jobs to end",
            )
            assert info(cli, juid)["state"] == "succeeded"
            assert cli("logs", "--stdout", juid, check=True).stdout == f"cpus {cpus}\n"
        # Two allocations in all: none was made for the wrong size and left over.
        assert sorted(r["size"] for r in monkey.store.instances("cluster")) == ["c1", "c3"]
        wait_for(lambda: not monkey_jobs(slurm), timeout=30, what="no allocation left")
    finally:
        cli("daemon", "stop")


def test_a_sweep_of_quick_cells_makes_one_allocation_per_cell_in_one_array(
    cli: Any, home: Path, monkey: Any, cluster: SlurmLab
) -> None:
    sid = cli(
        "sweep",
        "--grid",
        f"k={','.join(map(str, range(60)))}",
        "-p",
        "cluster",
        "--",
        "true",
        "{k}",
        check=True,
    ).stdout.strip()
    wait_for(
        lambda: all(j.state == State.SUCCEEDED for j in monkey.store.list_jobs(sweep=sid)),
        timeout=120,
        what="every cell to succeed",
    )
    # Cells ending while others' allocations come up made no surplus allocation.
    made = [r["id"] for r in monkey.store.instances("cluster")]
    assert len(made) == 60 and len({i.split("/")[1].split("_")[0] for i in made}) == 1, made
    wait_for(lambda: not monkey_jobs(cluster), timeout=30, what="no allocation left")


def test_in_job_api_in_an_allocation_tracks_as_locally(
    cli: Any, home: Path, cluster: SlurmLab, open_tmp: Path
) -> None:  # the fixture
    """`import monkey; monkey.log(...)` in a Slurm job whose python has no monkey (a bare
    environment, nothing on its PYTHONPATH): tracked exactly as the same job run locally."""
    python = bare_python(open_tmp / "bare")
    Path("train.py").write_text(SCRIPT)
    bare = ("--env", "PYTHONPATH=")
    remote = run_job(cli, python, "train.py", options=bare)
    local = json.loads(cli("run", "--json", *bare, "--", python, "train.py", check=True).stdout)[
        "job"
    ]
    for juid in (remote, local):
        wait_for(
            lambda j=juid: info(cli, j)["state"] in ("succeeded", "failed"),
            timeout=60,
            what="the job to end",
        )
        assert info(cli, juid)["state"] == "succeeded", cli("logs", "--stderr", juid).stdout
    assert info(cli, remote)["instance"].startswith("cluster/")
    assert check_tracked(cli, remote) == check_tracked(cli, local)


def test_a_job_in_an_image_runs_in_its_allocation(
    cli: Any, home: Path, monkey: Any, cluster: SlurmLab, reg: Any
) -> None:
    """On a compute node with bubblewrap, monkey's unprivileged runner runs
    the job in its image inside the allocation, as on any worker."""
    from registry import PASSWORD, USER

    done = cli("registry", "login", reg.host, "-u", USER, "--password-stdin", "--ca-file",
               str(reg.ca), input=PASSWORD + "\n")  # fmt: skip
    assert done.returncode == 0, done.stderr
    juid = run_job(cli, "sh", "-c", 'cat /etc/said; echo "job $SLURM_JOB_ID"',
                   options=("--image", f"{reg.host}/lab/tiny:2"))  # fmt: skip
    wait_for(
        lambda: info(cli, juid)["state"] in ("succeeded", "failed"), timeout=90, what="the end"
    )
    job = info(cli, juid)
    assert job["state"] == "succeeded", cli("logs", juid, "--setup").stdout
    slurm_id = job["instance"].split("/")[1]
    assert cli("logs", "--stdout", juid, check=True).stdout == f"two\njob {slurm_id}\n"
    assert job["image"]["digest"] == reg.digests["2"]


def test_a_job_in_an_image_runs_through_pyxis_where_the_allocations_srun_has_it(
    cli: Any,
    home: Path,
    monkey: Any,
    cluster: SlurmLab,
    reg: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where srun has pyxis's --container-image (and the node enroot), an allocation runs
    its job's image through pyxis: enroot imports the digest once as a squashfs file (the
    login in its own private config), the job is a step in it. Pyxis is not installable
    here: srun and enroot are stand-ins that record their arguments (tests/engine_standin.py)
    and run the command on this machine; sbatch, the allocation and its agent are real."""
    import shutil

    from registry import PASSWORD, USER

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("srun", "enroot"):
        shutil.copy(Path(__file__).with_name("engine_standin.py"), bin_dir / name)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    done = cli("registry", "login", reg.host, "-u", USER, "--password-stdin", "--ca-file",
               str(reg.ca), input=PASSWORD + "\n")  # fmt: skip
    assert done.returncode == 0, done.stderr
    juid = run_job(cli, "sh", "-c", "echo $MINE; pwd",
                   options=("--image", f"{reg.host}/lab/tiny:2", "--env", "MINE=kept"))  # fmt: skip
    wait_for(
        lambda: info(cli, juid)["state"] in ("succeeded", "failed"), timeout=90, what="the end"
    )
    job = info(cli, juid)
    assert job["state"] == "succeeded", cli("logs", juid, "--setup").stdout
    mine, cwd = cli("logs", "--stdout", juid, check=True).stdout.splitlines()
    assert mine == "kept"

    def calls(name: str) -> list[dict[str, Any]]:
        return [json.loads(ln) for ln in (tmp_path / f"{name}.jsonl").read_text().splitlines()]

    digest = reg.digests["2"]
    [imported] = calls("enroot")
    assert imported["args"][:2] == ["import", "--output"]
    assert imported["args"][3] == f"docker://{reg.host}/lab/tiny@{digest}"  # the pinned digest
    assert imported["netrc"] == [reg.host] and "CURL_CA_BUNDLE" in imported["env"]
    [step] = [c for c in calls("srun") if c["args"] != ["--help"]]
    flags = dict(a.split("=", 1) for a in step["args"] if a.startswith("--container-"))
    sqsh = Path(flags["--container-image"])
    assert sqsh.name == f"{digest.split(':')[1]}.sqsh" and sqsh.parent.name == "enroot"
    assert flags["--container-workdir"] == cwd
    assert {"MINE", "PYTHONPATH"} <= set(flags["--container-env"].split(","))
    assert any(m.endswith(":ro") for m in flags["--container-mounts"].split(","))
    assert "--no-container-mount-home" in step["args"] and "--overlap" in step["args"]
    assert step["args"][-3:] == ["sh", "-c", "echo $MINE; pwd"]
    assert not any(PASSWORD in " ".join(c["args"]) for c in calls("srun") + calls("enroot"))
    assert not list(sqsh.parent.glob("*.auth-*"))  # the login gone once imported
