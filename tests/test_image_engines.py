"""Jobs in images with the engines a provider entry chooses (`engine:`, issue 44): Docker's
engine end to end (a real dockerd started here, as root: vfs storage, no bridge, no
iptables), Podman and Apptainer through their command-line contract (a stand-in on PATH
that records its arguments: tests/engine_standin.py), against a real registry with TLS and
a login (tests/registry.py)."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import registry
from conftest import wait_for
from registry import reg  # noqa: F401  (the fixture)
from test_images import TRAIN, ended, login


@contextlib.contextmanager
def docker_engine(root: Path, *extra: str) -> Iterator[str]:
    """A Docker engine of its own (its socket's DOCKER_HOST) keeping its files in ROOT, in
    this process's network namespace; EXTRA: dockerd's further options."""
    sock = f"unix://{root}/docker.sock"
    short = Path(tempfile.mkdtemp(prefix="mkd", dir="/tmp"))  # containerd's socket paths: < 104
    log = open(root / "dockerd.log", "ab")
    proc = subprocess.Popen(
        ["dockerd", "--iptables=false", "--ip6tables=false", "--bridge=none",
         "--storage-driver=vfs", "--data-root", str(root / "data"), "--exec-root",
         str(short / "exec"), "--pidfile", str(root / "docker.pid"), "--host", sock, *extra],
        stdout=log, stderr=log,
    )  # fmt: skip
    env = {**os.environ, "DOCKER_HOST": sock}
    deadline = time.monotonic() + 60
    try:
        while subprocess.run(["docker", "info"], env=env, capture_output=True).returncode != 0:
            assert proc.poll() is None and time.monotonic() < deadline, (
                root / "dockerd.log"
            ).read_text()
            time.sleep(0.2)
        yield sock
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for mount in (short / "exec" / "netns" / "default", root / "data"):  # left when killed
            subprocess.run(["umount", "--lazy", str(mount)], capture_output=True)
        shutil.rmtree(short, ignore_errors=True)
        log.close()


@pytest.fixture(scope="module")
def dockerd(tmp_path_factory):
    """A Docker engine of this test module's own (a loopback registry is one Docker never
    verifies: 127.0.0.0/8 is always an insecure registry to it)."""
    with docker_engine(tmp_path_factory.mktemp("dockerd")) as sock:
        yield sock


def providers(home: Path, entry: str) -> None:
    home.mkdir(exist_ok=True)
    (home / "providers.yml").write_text(f"providers:\n  local: {entry}\n")


def containers(sock: str) -> list[str]:
    out = subprocess.run(["docker", "ps", "-aq", "--filter", "name=monkey-"], capture_output=True,
                         text=True, env={**os.environ, "DOCKER_HOST": sock}, check=True)  # fmt: skip
    return out.stdout.split()


def test_the_docker_engine_runs_a_job_in_its_image_with_checkpoints_logs_and_cancel(
    cli, monkey, reg, home, dockerd, monkeypatch
):
    monkeypatch.setenv("DOCKER_HOST", dockerd)
    providers(home, "{type: local, engine: docker}")
    login(cli, reg)
    assert "local: images docker\n" in cli("list", "providers").stdout
    assert cli("provider", "check", "local").stdout.endswith("  images docker\n")
    Path("train.py").write_text(TRAIN)
    juid = cli("run", "--image", f"{reg.host}/lab/py:1", "--retries", "1", "--env", "MINE=kept",
               "--", "sh", "-c", "id -u; echo $MINE $IMAGE_SAYS; python3 train.py").stdout.strip()  # fmt: skip
    job = ended(monkey, juid, timeout=180)
    out = cli("logs", juid).stdout
    assert job.state.value == "succeeded", out + cli("logs", juid, "--setup").stdout
    lines = [ln for ln in out.splitlines() if not ln.startswith("──")]  # attempts' headers
    assert lines[0] == str(os.getuid())  # the worker's user, in the container
    assert lines[1] == "kept hello"  # the job's own variable, and the image's
    assert "attempt 1 found none python 3.11" in out and "python inside" in out
    assert "attempt 2 found saved by 1" in out  # the checkpoint folder, mounted
    assert [v for _s, v, _t in monkey.metrics(juid)["acc"]] == [0.25, 0.5]  # monkey.log
    assert "loaded into docker" in cli("logs", juid, "--setup").stdout  # the CA is monkey's
    assert registry.PASSWORD not in json.dumps(monkey.job(juid).record.env)
    assert not list(home.rglob("engine-auth-*")) and not list(home.rglob("pull-auth.json"))

    marker = "4219"  # a job deaf to SIGTERM: killed after the grace, its container removed
    juid = cli("run", "--image", f"{reg.host}/lab/tiny:2", "--", "sh", "-c",
               f"trap '' TERM; sleep {marker} & sleep {marker} & echo started; wait").stdout.strip()  # fmt: skip
    wait_for(lambda: "started" in cli("logs", juid).stdout, 120, what="the job to start")
    assert cli("job", "cancel", juid).returncode == 0
    assert ended(monkey, juid).state.value == "cancelled"
    wait_for(lambda: not containers(dockerd), 30, what="its container to be gone")


def test_an_image_gone_from_the_registry_when_docker_pulls_it_fails_in_one_line(
    cli, monkey, reg, home, dockerd, monkeypatch
):
    monkeypatch.setenv("DOCKER_HOST", dockerd)
    providers(home, "{type: local, engine: docker}")
    login(cli, reg)
    reg.push("lab/gone:1", {"/etc/said": "soon gone\n"})
    blocker = cli("run", "--", "sleep", "2").stdout.strip()
    juid = cli("run", "--after", blocker, "--image", f"{reg.host}/lab/gone:1", "--",
               "true").stdout.strip()  # fmt: skip
    subprocess.run(
        ["skopeo", "delete", "--cert-dir", str(reg.ca.parent), "--creds",
         f"{registry.USER}:{registry.PASSWORD}", f"docker://{reg.host}/lab/gone:1"],
        check=True, capture_output=True,
    )  # fmt: skip
    job = ended(monkey, juid, timeout=120)
    state = next(ln for ln in cli("info", juid).stdout.splitlines() if ln.startswith("state"))
    assert job.state.value == "failed"
    assert f"/lab/gone:1: not found in registry {reg.host}" in state, state


def _standin(tmp_path: Path, monkeypatch, engine: str) -> Path:
    """ENGINE's stand-in first on PATH; its log."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    shutil.copy(Path(__file__).with_name("engine_standin.py"), bin_dir / engine)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return tmp_path / f"{engine}.jsonl"  # where it writes (beside its folder)


def _calls(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def _flags(args: list[str], flag: str) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args) if a == flag]


def test_podman_gets_the_image_by_digest_the_users_id_cdi_gpus_and_the_jobs_folders(
    cli, monkey, reg, home, tmp_path, monkeypatch
):
    log = _standin(tmp_path, monkeypatch, "podman")
    providers(home, "{type: local, engine: podman, gpus: 1}")
    login(cli, reg)
    assert "local: images podman\n" in cli("list", "providers").stdout
    juid = cli("run", "--gpus", "1", "--image", f"{reg.host}/lab/tiny:2", "--env", "MINE=kept",
               "--", "sh", "-c", "echo $MINE; pwd").stdout.strip()  # fmt: skip
    job = ended(monkey, juid)
    out = cli("logs", juid).stdout
    assert job.state.value == "succeeded", out + cli("logs", juid, "--setup").stdout
    pull, run, *rest = _calls(log)
    ref = f"{reg.host}/lab/tiny@{reg.digests['2']}"
    assert pull["args"][0] == "pull" and pull["args"][-1] == ref
    assert _flags(pull["args"], "--authfile") and _flags(pull["args"], "--cert-dir")
    args = run["args"]
    assert args[:2] == ["run", "--rm"] and _flags(args, "--name") == [f"monkey-{juid}-1"]
    assert _flags(args, "--user") == [f"{os.getuid()}:{os.getgid()}"]
    assert _flags(args, "--userns") == ["keep-id"]
    assert _flags(args, "--device") == ["nvidia.com/gpu=0"]  # CDI, the job's GPU
    run_dir = str(home / "runs" / juid / "1")
    assert f"{run_dir}:{run_dir}" in _flags(args, "--volume")  # its run folder, at its path
    assert any(v.endswith(":ro") and "jobcode" in v for v in _flags(args, "--volume"))
    work = _flags(args, "--workdir")[0]
    assert work.startswith(run_dir) and out == f"kept\n{work}\n"
    assert "MINE" in _flags(args, "--env") and "PYTHONPATH" in _flags(args, "--env")
    assert "kept" not in args  # values never on a command line
    assert args[args.index("--entrypoint") + 1 :] == ["sh", ref, "-c", "echo $MINE; pwd"]
    # the container removed once the job ended (rm -f is idempotent: the end of the job and
    # the agent's own clean-up may both ask)
    assert rest and all(c["args"][:3] == ["rm", "-f", f"monkey-{juid}-1"] for c in rest), rest
    assert not any(registry.PASSWORD in " ".join(c["args"]) for c in _calls(log))


def test_apptainer_gets_nv_binds_and_the_login_in_its_own_environment_only(
    cli, monkey, reg, home, tmp_path, monkeypatch
):
    log = _standin(tmp_path, monkeypatch, "apptainer")
    providers(home, "{type: local, engine: apptainer, gpus: 1}")
    login(cli, reg)
    assert "local: images apptainer\n" in cli("list", "providers").stdout
    juid = cli("run", "--gpus", "1", "--image", f"{reg.host}/lab/tiny:2", "--env", "MINE=kept",
               "--", "sh", "-c", "echo $MINE; env | grep -c APPTAINER || true").stdout.strip()  # fmt: skip
    job = ended(monkey, juid)
    out = cli("logs", juid).stdout
    assert job.state.value == "succeeded", out + cli("logs", juid, "--setup").stdout
    assert out == "kept\n0\n"  # its variable, and nothing of apptainer's (the login) inside
    [run] = _calls(log)
    args = run["args"]
    assert args[:2] == ["exec", "--cleanenv"] and "--nv" in args
    run_dir = str(home / "runs" / juid / "1")
    assert f"{run_dir}:{run_dir}" in _flags(args, "--bind")
    assert _flags(args, "--pwd")[0].startswith(run_dir)
    assert f"docker://{reg.host}/lab/tiny@{reg.digests['2']}" in args
    assert {"APPTAINER_DOCKER_USERNAME", "APPTAINER_DOCKER_PASSWORD", "APPTAINERENV_MINE",
            "APPTAINERENV_PYTHONPATH"} <= set(run["env"])  # fmt: skip
    assert registry.PASSWORD not in " ".join(args)


def test_an_engine_a_worker_lacks_is_said_by_provider_check_and_an_unknown_one_refused(
    cli, monkey, reg, home, monkeypatch, tmp_path
):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no podman anywhere
    providers(home, "{type: local, engine: podman}")
    assert (
        "none: podman is not installed on this worker" in cli("provider", "check", "local").stdout
    )
    bad = cli("provider", "check", "local")
    assert bad.returncode == 0
    (home / "providers.yml").write_text("providers:\n  local: {type: local, engine: rkt}\n")
    refused = cli("list", "providers")
    assert refused.returncode != 0 and "engine must be one of auto, bwrap, docker" in refused.stderr


SETUP_SH = 'cat /etc/said > "$VIRTUAL_ENV/said"\necho built >> "$VIRTUAL_ENV/builds"\n'
SHOW = ('command -v python; cat "$VIRTUAL_ENV/said" "$VIRTUAL_ENV/builds"; '
        'python -c "import sys, monkey; print(sys.prefix == sys.base_prefix)"')  # fmt: skip


def test_a_job_yml_set_up_runs_in_the_image_with_docker_once_per_worker_and_digest(
    cli, monkey, reg, home, dockerd, monkeypatch
):
    monkeypatch.setenv("DOCKER_HOST", dockerd)
    providers(home, "{type: local, engine: docker}")
    login(cli, reg)
    Path("requirements.txt").write_text("")
    Path("setup.sh").write_text(SETUP_SH)
    Path("job.yml").write_text(
        f"image: {reg.host}/lab/py:1\n"
        "run: {env_type: pip, env_file: requirements.txt, install_script: setup.sh}\n"
    )
    first = cli("run", "--", "sh", "-c", SHOW).stdout.strip()
    job = ended(monkey, first, timeout=180)
    out, setup = cli("logs", first).stdout, cli("logs", first, "--setup").stdout
    assert job.state.value == "succeeded", out + setup
    python, said, builds, base = out.splitlines()
    assert python.endswith("/bin/python") and "/envs/" in python  # the environment's, first
    assert said == "python inside"  # the install script ran in the image, not on this machine
    assert builds == "built" and base == "False"  # in the virtualenv, monkey importable
    assert "building pip environment" in setup
    second = cli("run", "--", "sh", "-c", SHOW).stdout.strip()
    assert ended(monkey, second, timeout=120).state.value == "succeeded"
    assert cli("logs", second).stdout == out  # built once: reused as it is
    assert "reusing environment" in cli("logs", second, "--setup").stdout
    assert not containers(dockerd)  # every step's container gone


@pytest.mark.parametrize("engine", ["podman", "apptainer"])
def test_a_job_yml_set_up_runs_through_podman_and_apptainer_once_per_digest(
    cli, monkey, reg, home, tmp_path, monkeypatch, engine
):
    log = _standin(tmp_path, monkeypatch, engine)
    providers(home, f"{{type: local, engine: {engine}}}")
    login(cli, reg)
    Path("requirements.txt").write_text("")
    Path("setup.sh").write_text('echo built >> "$VIRTUAL_ENV/builds"\n')
    Path("job.yml").write_text(
        f"image: {reg.host}/lab/tiny:2\n"
        "run: {env_type: pip, env_file: requirements.txt, install_script: setup.sh}\n"
    )
    show = 'command -v python; cat "$VIRTUAL_ENV/builds"; echo $PATH'
    first = cli("run", "--", "sh", "-c", show).stdout.strip()
    job = ended(monkey, first, timeout=120)
    out = cli("logs", first).stdout
    assert job.state.value == "succeeded", out + cli("logs", first, "--setup").stdout
    python, builds, path = out.splitlines()
    assert python.endswith("/bin/python") and "/envs/" in python
    assert builds == "built"
    assert path == f"{python.rsplit('/', 1)[0]}:/usr/bin:/bin"  # its bin/, then the image's PATH
    runs = [c for c in _calls(log) if c["args"][0] in ("run", "exec")]
    steps, job_run = runs[:-1], runs[-1]
    ref = f"{reg.host}/lab/tiny@{reg.digests['2']}"
    assert len(steps) == 3 and all(ref in " ".join(c["args"]) for c in steps)  # venv, pip, script
    envs = python.rsplit("/", 3)[0]  # ROOT/envs, where the steps build it: bound writable
    binds = _flags(steps[0]["args"], "--volume" if engine == "podman" else "--bind")
    assert f"{envs}:{envs}" in binds
    named = set(job_run["env"]) if engine == "apptainer" else set(_flags(job_run["args"], "--env"))
    assert {"PATH", "VIRTUAL_ENV"} <= {n.removeprefix("APPTAINERENV_") for n in named}
    second = cli("run", "--", "sh", "-c", show).stdout.strip()
    assert ended(monkey, second).state.value == "succeeded"
    assert cli("logs", second).stdout == out  # reused: no step ran again
    assert len([c for c in _calls(log) if c["args"][0] in ("run", "exec")]) == len(runs) + 1


LAB_IP = "10.213.9.1"  # not loopback: an address Docker verifies a registry's certificate at


@contextlib.contextmanager
def lab_network() -> Iterator[None]:
    """This test process (and what it starts: the registry, dockerd, monkey's core, agent
    and jobs) in a network namespace of its own whose loopback also has LAB_IP."""
    name = f"mk{os.getpid()}{secrets.token_hex(2)}-lab"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"network namespaces cannot be created here: {made.stderr.strip()}")
    libc = ctypes.CDLL(None, use_errno=True)
    home_ns = os.open("/proc/self/ns/net", os.O_RDONLY)
    try:
        for step in (["link", "set", "lo", "up"], ["addr", "add", f"{LAB_IP}/32", "dev", "lo"]):
            subprocess.run(["ip", "-n", name, *step], check=True, capture_output=True)
        lab_ns = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
        try:
            assert libc.setns(lab_ns, 0x40000000) == 0, os.strerror(ctypes.get_errno())
        finally:
            os.close(lab_ns)
        try:
            yield
        finally:
            assert libc.setns(home_ns, 0x40000000) == 0, os.strerror(ctypes.get_errno())
    finally:
        os.close(home_ns)
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def test_docker_pulls_from_a_registry_whose_ca_only_monkey_was_given(
    cli, monkey, home, tmp_path, monkeypatch
):
    with contextlib.ExitStack() as stack:
        stack.enter_context(lab_network())
        own, proc = registry.start(tmp_path / "registry", address=LAB_IP)
        stack.callback(proc.wait)
        stack.callback(proc.kill)
        own.push("lab/tiny:1", {"/etc/said": "one\n"})
        (tmp_path / "dockerd").mkdir()
        sock = stack.enter_context(docker_engine(tmp_path / "dockerd"))
        monkeypatch.setenv("DOCKER_HOST", sock)
        providers(home, "{type: local, engine: docker}")
        login(cli, own)  # --ca-file: monkey's own trust, nothing of Docker's configured
        ref = f"{own.host}/lab/tiny:1"
        juid = cli("run", "--image", ref, "--", "cat", "/etc/said").stdout.strip()
        job = ended(monkey, juid, timeout=120)
        out, setup = cli("logs", juid).stdout, cli("logs", juid, "--setup").stdout
        assert job.state.value == "succeeded", out + setup + cli("info", juid).stdout
        assert out == "one\n"
        assert "loaded into docker" in setup
        again = cli("run", "--image", ref, "--", "cat", "/etc/said").stdout.strip()
        assert ended(monkey, again, timeout=60).state.value == "succeeded"
        assert "in docker already (0 bytes pulled)" in cli("logs", again, "--setup").stdout


def test_in_a_slurm_allocation_auto_prefers_pyxis_then_apptainer_then_monkeys_runner(
    tmp_path, monkeypatch
):
    from monkey.client_agent import engines, sandbox

    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # bubblewrap works here; no engine else
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    assert sandbox.choose_engine("auto") == ("bwrap", "")
    _standin(tmp_path, monkeypatch, "apptainer")
    assert sandbox.choose_engine("auto") == ("apptainer", "")
    for name in ("srun", "enroot"):
        _standin(tmp_path, monkeypatch, name)
    engines._PYXIS.clear()
    assert sandbox.choose_engine("auto") == ("pyxis", "")
    monkeypatch.delenv("SLURM_JOB_ID")  # outside an allocation: monkey's own runner first
    assert sandbox.choose_engine("auto") == ("bwrap", "")
    assert sandbox.choose_engine("pyxis")[0] == ""
