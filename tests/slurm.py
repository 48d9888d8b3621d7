"""A real single-node Slurm (munged + slurmctld + slurmd from Debian's packages) for the
Slurm provider's tests and benchmark.

No systemd, no cgroups, no slurmdbd: job completions go to a jobcomp text file (``sacct -c``).
The controller schedules at once (``batch_sched_delay=0``) and the node advertises more CPUs
than the machine has, so trivial jobs run side by side. Everything lives in one folder and
listens on free loopback ports; client commands find it through ``SLURM_CONF``. If Slurm
cannot start, the fixture fails loudly (no test is skipped for it).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from ports import free_port

PARTITION = "debug"


class SlurmLab:
    """One controller, one node (this machine) and munged, started in FOLDER."""

    def __init__(self, folder: Path, cpus: int = 16) -> None:
        self.dir = folder
        self.cpus = cpus
        self.node = socket.gethostname().split(".")[0]
        self.conf = folder / "slurm.conf"
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def env(self) -> dict[str, str]:
        """What client commands (sbatch, squeue...) need to find this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def start(self) -> None:
        for tool in ("munged", "slurmctld", "slurmd", "sbatch"):
            if not shutil.which(tool) and not os.path.exists(f"/usr/sbin/{tool}"):
                raise RuntimeError(
                    f"{tool} not found: apt-get install -y --no-install-recommends slurm-wlm munge"
                )
        d = self.dir
        os.chmod(d, 0o755)  # munged (its own user) must reach its socket folder
        for sub in ("state", "spool", "log", "munge"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        shutil.chown(d / "munge", "munge", "munge")
        os.chmod(d / "munge", 0o755)  # munged insists on a world-searchable socket folder
        sock = d / "munge" / "munge.sock"
        self._spawn(
            [
                "setpriv",
                "--reuid",
                "munge",
                "--regid",
                "munge",
                "--init-groups",
                "/usr/sbin/munged",
                "-F",
                f"--socket={sock}",
                f"--pid-file={d}/munge/munged.pid",
                f"--log-file={d}/log/munged.log",
                f"--seed-file={d}/munge/munged.seed",
            ],
            "munged",
        )
        self._wait(sock.exists, "munged's socket")
        self.conf.write_text(self._config(sock))
        env = {**os.environ, **self.env}
        self._spawn(["/usr/sbin/slurmctld", "-D", "-i", "-f", str(self.conf)], "slurmctld", env)
        self._spawn(
            ["/usr/sbin/slurmd", "-D", "-f", str(self.conf), "-N", self.node], "slurmd", env
        )
        self._wait(lambda: self.node_state() == "idle", "the Slurm node to be idle", 60)

    def _config(self, sock: Path) -> str:
        d = self.dir
        return f"""ClusterName=monkeylab
SlurmctldHost={self.node}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
AuthType=auth/munge
AuthInfo=socket={sock}
CredType=cred/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={d}/log/jobcomp.txt
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MinJobAge=300
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
MessageTimeout=10
MailProg=/bin/true
KillWait=5
OverTimeLimit=0
JobRequeue=1
SlurmdParameters=config_overrides
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory=4000 State=UNKNOWN
PartitionName={PARTITION} Nodes={self.node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
"""

    def _spawn(self, argv: list[str], name: str, env: dict[str, str] | None = None) -> None:
        out = open(self.dir / "log" / f"{name}.out", "ab")  # noqa: SIM115 - kept by the child
        self.procs.append(
            subprocess.Popen(argv, stdout=out, stderr=out, stdin=subprocess.DEVNULL, env=env)
        )
        out.close()

    def _wait(self, ready: object, what: str, timeout: float = 15) -> None:
        deadline = time.monotonic() + timeout
        while not ready():  # type: ignore[operator]
            dead = [p.args[0] for p in self.procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                logs = "\n".join(
                    f"--- {p.name}:\n{p.read_text()[-2000:]}"
                    for p in (self.dir / "log").glob("*")
                    if p.is_file()
                )
                raise RuntimeError(f"Slurm did not start ({what}; exited: {dead}):\n{logs}")
            time.sleep(0.1)

    def run(self, *argv: str) -> str:
        """A Slurm client command's output (CalledProcessError when it fails)."""
        return subprocess.run(
            argv,
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout

    def node_state(self) -> str:
        try:
            return self.run("sinfo", "-h", "-N", "-o", "%t").strip()
        except (subprocess.SubprocessError, OSError):
            return ""

    def jobs(self) -> list[str]:
        """Slurm jobs not finished (pending, running, completing...): 'ID STATE NAME' each, one per
        array task (ARRAYID_TASK)."""
        return [
            line
            for line in self.run("squeue", "-h", "-r", "-o", "%i %T %j").splitlines()
            if line.strip()
        ]

    def cancel_all(self) -> None:
        """Cancel every job, whoever submitted it (a login host's user too)."""
        ids = sorted({line.split("_")[0] for line in self.run("squeue", "-h", "-o", "%i").split()})
        if ids:
            self.run("scancel", "--full", *ids)
        # scancel only asks: wait until the jobs' processes are gone, so that stopping the
        # lab next leaves nothing running (bounded: a stuck job is reported by the caller).
        deadline = time.monotonic() + 30
        while self.run("squeue", "-h", "-o", "%i").split() and time.monotonic() < deadline:
            time.sleep(0.2)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmLab]:
    """The session's single-node Slurm; fails loudly when it cannot start. Its folder is
    outside pytest's (0700) temporary tree: munged runs as its own user."""
    lab = SlurmLab(Path(tempfile.mkdtemp(prefix="monkey-slurm-")))
    try:
        lab.start()
        yield lab
    finally:
        lab.stop()
        shutil.rmtree(lab.dir, ignore_errors=True)


@pytest.fixture
def slurm(slurm_cluster: SlurmLab, monkeypatch: pytest.MonkeyPatch) -> Iterator[SlurmLab]:
    """The cluster, reachable from the test's processes; no job of the test is left on it."""
    for key, value in slurm_cluster.env.items():
        monkeypatch.setenv(key, value)
    yield slurm_cluster
    slurm_cluster.cancel_all()
