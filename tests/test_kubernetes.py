"""The `kubernetes` provider (issue 45) against tests/fake_k8s.py, a fake API server in the
API's shapes whose kubelet really runs each pod in its image (pulled from a real registry on
127.0.0.1, tests/registry.py) with the images issue's unprivileged runner."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import registry
import yaml
from conftest import wait_for
from driver_contract import DriverContract, provider, serve
from fake_k8s import FakeK8s, kubeconfig

pytestmark = pytest.mark.system


@pytest.fixture(scope="module")
def reg(tmp_path_factory):
    """A registry with lab/py:1 (says "one"; busybox's sh, cat, sleep, tar, head, mkdir...
    and python3: what monkey's agent in the pod needs) and lab/tiny:1 (no python3)."""
    reg, proc = registry.start(tmp_path_factory.mktemp("registry"))
    try:
        reg.push("lab/tiny:1", {"/etc/said": "one\n"})
        busybox = Path(shutil.which("busybox") or "/bin/busybox")
        tools = {f"/bin/{tool}": busybox for tool in ("tar", "head", "mkdir", "tr")}
        reg.push("lab/py:1", {"/etc/said": "one\n", **tools}, python=True)
        yield reg
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def cluster(tmp_path, reg):
    """A fake cluster of two nodes of 2 CPUs and 8Gi each, trusting the registry's CA, and
    a kubeconfig reaching it (context `fake`, namespace `ml`)."""
    fake = FakeK8s(tmp_path / "k8s", ca=reg.ca)
    fake.add_node("node-a", cpus=2, memory="8Gi")
    fake.add_node("node-b", cpus=2, memory="8Gi")
    fake.kubeconfig = kubeconfig(fake, tmp_path / "kube" / "config", namespace="ml")
    try:
        yield fake
    finally:
        fake.close()


class TestKubernetesContract(DriverContract):
    """The driver contract against the fake cluster (one node whose runtime has the
    registry's login), the provider's default image having sh, head and tar."""

    @pytest.fixture
    def target(self, home: Path, tmp_path: Path, reg):  # the fixture
        import base64

        login = base64.b64encode(f"{registry.USER}:{registry.PASSWORD}".encode()).decode()
        fake = FakeK8s(tmp_path / "k8s", ca=reg.ca, node_auths={reg.host: {"auth": login}})
        fake.add_node("node-a", cpus=2, memory="8Gi")
        entry = {"type": "kubernetes", "kubeconfig": str(kubeconfig(fake, tmp_path / "kube")),
                 "image": f"{reg.host}/lab/py:1"}  # fmt: skip
        try:
            yield from serve(provider(home, "lab", entry), home, ["lab"])
        finally:
            fake.close()


def added(cli, cluster, *extra: str) -> None:
    done = cli("provider", "add", "kubernetes", "lab", "--kubeconfig", str(cluster.kubeconfig),
               *extra)  # fmt: skip
    assert done.returncode == 0, done.stderr


def login(cli, reg) -> None:
    done = cli("registry", "login", reg.host, "--username", registry.USER, "--password-stdin",
               "--ca-file", str(reg.ca), input=registry.PASSWORD + "\n")  # fmt: skip
    assert done.returncode == 0, done.stderr


def ended(monkey, juid: str, timeout: float = 60):
    from monkey.models import TERMINAL

    return wait_for(
        lambda: (j := monkey.job(juid).record).state in TERMINAL and j,
        timeout,
        what=f"{juid} to end",
    )


def state_line(cli, juid: str) -> str:
    return next(ln for ln in cli("info", juid).stdout.splitlines() if ln.startswith("state"))


def test_provider_add_checks_access_and_writes_the_entry(cli, cluster, home):
    done = cli("provider", "add", "kubernetes", "lab", "--kubeconfig", str(cluster.kubeconfig),
               "--schedule-timeout", "30", "--node-selector", "pool=gpu")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(
        "added provider 'lab' (kubernetes, context fake, namespace ml: 2 nodes, 4 CPUs and "
        "0 GPUs allocatable) to "
    )
    entry = yaml.safe_load((home / "providers.yml").read_text())["providers"]["lab"]
    assert entry == {
        "type": "kubernetes",
        "kubeconfig": str(cluster.kubeconfig),
        "context": "fake",
        "namespace": "ml",
        "schedule_timeout": 30.0,
        "node_selector": {"pool": "gpu"},
    }
    listed = cli("list", "providers").stdout
    assert (
        "lab: fake, namespace ml: 2 of 2 nodes ready, 4 CPUs and 0 GPUs allocatable; 0 pods of "
        "monkey's running\n"
    ) in listed
    checked = cli("provider", "check", "lab")
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.splitlines()[0].split() == [
        "lab", "node-a", "up", "cpus", "2", "gpus", "-", "memory", "8.0G", "pods", "0",
        "isolation", "pod",
        "images", "the", "cluster's", "(fake://1.0)",
    ]  # fmt: skip

    wrong = cli("provider", "add", "kubernetes", "other", "--kubeconfig",
                str(cluster.kubeconfig), "--context", "prod")  # fmt: skip
    assert wrong.returncode == 1
    assert "has no context 'prod'; pick one with --context (contexts: fake)" in wrong.stderr
    cluster.deny("create", "pods")
    denied = cli("provider", "add", "kubernetes", "other", "--kubeconfig",
                 str(cluster.kubeconfig))  # fmt: skip
    assert denied.returncode == 1
    assert "context fake, namespace ml: you may not create pods there" in denied.stderr
    assert "other" not in (home / "providers.yml").read_text()  # nothing written

    entry["schedule_timeout"] = -1
    (home / "providers.yml").write_text(yaml.safe_dump({"providers": {"lab": entry}}))
    bad = cli("list", "providers")
    assert bad.returncode != 0 and "schedule_timeout must be seconds > 0" in bad.stderr


def test_a_broken_kubeconfig_is_one_line_and_nothing_is_written(cli, home, tmp_path):
    broken = tmp_path / "broken"
    broken.write_text("clusters: [\n")
    out = cli("provider", "add", "kubernetes", "k", "--kubeconfig", str(broken))
    assert out.returncode == 1
    assert out.stderr.startswith(f"monkey: error: kubeconfig {broken} is not readable YAML (")
    assert out.stderr.endswith("; fix it or give another with --kubeconfig\n")
    assert len(out.stderr.splitlines()) == 1
    bare = tmp_path / "bare"
    bare.write_text("apiVersion: v1\ncontexts:\n- name: a\n  context: {cluster: c, user: u}\n")
    out = cli("provider", "add", "kubernetes", "k", "--kubeconfig", str(bare))
    assert out.returncode == 1
    assert out.stderr == (
        f"monkey: error: kubeconfig {bare} has no current-context; pick one with --context "
        "(contexts: a)\n"
    )
    assert not (home / "providers.yml").exists() or "k:" not in (home / "providers.yml").read_text()


def test_a_registry_with_its_own_ca_gets_a_pull_secret_and_nodes_without_the_ca_say_so(
    cli, monkey, cluster, reg, tmp_path, home
):
    import base64
    import json

    # The provider's default image is in the private registry: its pods get the login too.
    added(cli, cluster, "--image", f"{reg.host}/lab/py:1")
    login(cli, reg)
    juid = cli("run", "-p", "lab", "--", "cat", "/etc/said").stdout.strip()
    assert ended(monkey, juid).state.value == "succeeded", state_line(cli, juid)
    assert cli("logs", juid).stdout == "one\n"
    [secret] = cluster.created_secrets
    assert secret["type"] == "kubernetes.io/dockerconfigjson"
    config = json.loads(base64.b64decode(secret["data"][".dockerconfigjson"]))
    token = base64.b64encode(f"{registry.USER}:{registry.PASSWORD}".encode()).decode()
    # As `kubectl create secret docker-registry` writes it; the CA cannot be in it.
    assert config == {
        "auths": {
            reg.host: {"username": registry.USER, "password": registry.PASSWORD, "auth": token}
        }
    }
    pod = cluster.created[-1]
    assert pod["spec"]["imagePullSecrets"] == [{"name": secret["metadata"]["name"]}]
    wait_for(lambda: not cluster.secrets, 10, what="the pull secret deleted")

    # A cluster whose nodes do not trust the registry's CA: one line saying what to do.
    bare = FakeK8s(tmp_path / "bare")
    try:
        bare.add_node("node-a", cpus=2, memory="8Gi")
        config_file = kubeconfig(bare, tmp_path / "bare-kube" / "config", namespace="ml")
        done = cli("provider", "add", "kubernetes", "bare", "--kubeconfig", str(config_file))
        assert done.returncode == 0, done.stderr
        failed = cli("run", "-p", "bare", "--image", f"{reg.host}/lab/py:1", "--retries", "1",
                     "--", "true").stdout.strip()  # fmt: skip
        job = ended(monkey, failed, 60)
        assert job.state.value == "failed" and job.attempts == 1
        line = state_line(cli, failed)
        assert "x509: certificate signed by unknown authority" in line, line
        assert line.endswith(
            f"the cluster's nodes do not trust the CA of registry {reg.host}: install it in "
            f"each node's container runtime (containerd: /etc/containerd/certs.d/{reg.host}/"
            "ca.crt; see README, Kubernetes); see `monkey logs --setup "
            f"{failed}`)"
        ), line
    finally:
        bare.close()


def test_a_job_runs_in_a_pod_in_its_image_and_its_exit_code_and_output_come_back(
    cli, monkey, cluster, reg
):
    added(cli, cluster)
    login(cli, reg)  # the pod pulls with this login (a pull secret of its own)
    ref = f"{reg.host}/lab/py:1"
    juid = cli("run", "-p", "lab", "--image", ref, "--cpus", "2", "--memory", "1G", "--env",
               "MINE=kept", "--", "sh", "-c", "cat /etc/said; echo $MINE $IMAGE_SAYS; exit 3"
               ).stdout.strip()  # fmt: skip
    job = ended(monkey, juid)
    assert job.state.value == "failed" and job.exit_code == 3, cli("logs", juid, "--setup").stdout
    assert cli("logs", juid).stdout == "one\nkept hello\n"
    assert "exit 3" in state_line(cli, juid)
    pod = cluster.created[-1]
    assert pod["metadata"]["namespace"] == "ml"
    assert pod["metadata"]["labels"]["monkey.dev/job"] == juid
    assert pod["spec"]["restartPolicy"] == "Never"
    container = pod["spec"]["containers"][0]
    assert container["image"].startswith(f"{reg.host}/lab/py@sha256:")  # pinned
    assert container["resources"]["limits"] == {"cpu": "2", "memory": "1Gi"}
    setup = cli("logs", juid, "--setup").stdout
    assert f"pod {pod['metadata']['name']} scheduled on node node-" in setup
    wait_for(lambda: cluster.pod(pod["metadata"]["name"], "ml") is None, 10, what="pod deleted")
    assert not cluster.secrets  # its pull secret too

    ok = cli("run", "-p", "lab", "--image", ref, "--", "cat", "/etc/said").stdout.strip()
    assert ended(monkey, ok).state.value == "succeeded"
    assert cli("logs", ok).stdout == "one\n"


def test_with_a_cache_claim_the_jobs_code_reaches_the_cluster_once(cli, monkey, cluster, reg):
    added(cli, cluster, "--cache-claim", "monkey-cache")
    login(cli, reg)
    Path("big.bin").write_bytes(os.urandom(1 << 20))  # 1 MiB of the project
    Path("main.sh").write_text("wc -c big.bin\n")
    sizes = []
    for _ in range(2):
        juid = cli("run", "-p", "lab", "--image", f"{reg.host}/lab/py:1", "--", "sh",
                   "main.sh").stdout.strip()  # fmt: skip
        assert ended(monkey, juid).state.value == "succeeded", cli("logs", juid, "--setup").stdout
        assert cli("logs", juid).stdout.split() == ["1048576", "big.bin"]
        setup = cli("logs", juid, "--setup").stdout
        said = next(ln for ln in setup.splitlines() if "monkey's agent and the job's" in ln)
        sizes.append(int(said.split("inputs (")[1].split(" bytes")[0].replace(",", "")))
    assert "2 of its 2 blobs in the cache claim monkey-cache already" in said
    assert sizes[1] < 200_000 < sizes[0]  # the second pod got the agent, not the code
    volumes = cluster.created[-1]["spec"]["volumes"]
    assert {"name": "cache", "persistentVolumeClaim": {"claimName": "monkey-cache"}} in volumes


def test_gc_and_du_hosts_cover_the_cache_claim_as_an_ssh_hosts_cache(cli, monkey, cluster, reg):
    added(cli, cluster, "--cache-claim", "monkey-cache", "--image", f"{reg.host}/lab/py:1")
    login(cli, reg)  # the default image's registry: the pod gc makes gets its login too
    Path("main.sh").write_text("wc -c big.bin\n")
    blobs = cluster.root / "claims" / "monkey-cache" / "blobs"
    juids, bigs = [], []
    for _ in range(2):
        Path("big.bin").write_bytes(os.urandom(1 << 20))
        juids.append(cli("run", "-p", "lab", "--image", f"{reg.host}/lab/py:1", "--", "sh",
                         "main.sh").stdout.strip())  # fmt: skip
        assert ended(monkey, juids[-1]).state.value == "succeeded"
        [big] = {p for p in blobs.glob("*/*") if p.stat().st_size == 1 << 20} - set(bigs)
        bigs.append(big)  # the blob of this job's big.bin, in the claim
    du = cli("du", "--hosts")
    assert du.returncode == 0, du.stderr
    row = next(ln for ln in du.stdout.splitlines() if ln.startswith("lab cache "))
    assert "2.1 MB (3)" in row and row.endswith(" now"), du.stdout  # 3 blobs, measured now
    assert cli("rm", "--yes", juids[0]).returncode == 0
    gc = cli("gc", "--grace", "0")
    assert gc.returncode == 0, gc.stderr
    assert "lab cache: freed 1.0 MB: 1 blobs (1.0 MB), 0 folders of deleted jobs (0 B)" in gc.stdout
    assert not bigs[0].exists() and bigs[1].is_file()  # the job still there keeps its code
    assert not [p for p in cluster.pods.values() if "cache-chores" in p["metadata"]["name"]]
    assert not cluster.secrets  # the pull secret of gc's pod went with it


def test_a_pod_no_node_fits_shows_the_schedulers_reason_and_fails_after_schedule_timeout(
    cli, monkey, cluster, reg
):
    added(cli, cluster, "--schedule-timeout", "3", "--node-selector", "pool=gpu")
    login(cli, reg)
    juid = cli("run", "-p", "lab", "--image", f"{reg.host}/lab/py:1", "--retries", "2",
               "--", "true").stdout.strip()  # fmt: skip
    reason = "0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector."
    wait_for(lambda: f"(pending {reason})" in state_line(cli, juid), 20, what="the reason")
    row = next(ln for ln in cli("list", "jobs").stdout.splitlines() if ln.startswith(juid))
    assert row.split()[2] == "pending"
    job = ended(monkey, juid)
    assert job.state.value == "failed" and job.attempts == 1  # not retried
    assert f"not scheduled within schedule_timeout 3s: {reason}" in state_line(cli, juid)
    assert all(p["metadata"]["name"] not in str(cluster.pods) for p in cluster.created)


def test_an_image_the_registry_lost_or_refuses_fails_in_one_line_without_retries(
    cli, monkey, cluster, reg
):
    added(cli, cluster, "--image", f"{reg.host}/lab/py:1")  # pulled without a login
    refused = cli("run", "-p", "lab", "--retries", "2", "--", "true").stdout.strip()
    job = ended(monkey, refused)
    assert job.state.value == "failed" and job.attempts == 1
    line = state_line(cli, refused)
    assert f"registry {reg.host} refused the pull (unauthorized, ErrImagePull)" in line
    assert f"monkey registry login {reg.host}" in line

    login(cli, reg)  # the entry's image is pulled with the login, as an --image is
    ok = cli("run", "-p", "lab", "--", "cat", "/etc/said").stdout.strip()
    assert ended(monkey, ok).state.value == "succeeded", state_line(cli, ok)
    assert cli("logs", ok).stdout == "one\n"
    reg.push("lab/gone:1", {"/etc/said": "soon gone\n"})
    blocker = cli("run", "--", "sleep", "2").stdout.strip()
    lost = cli("run", "-p", "lab", "--after", blocker, "--image", f"{reg.host}/lab/gone:1",
               "--retries", "2", "--", "true").stdout.strip()  # fmt: skip
    subprocess.run(
        ["skopeo", "delete", "--cert-dir", str(reg.ca.parent), "--creds",
         f"{registry.USER}:{registry.PASSWORD}", f"docker://{reg.host}/lab/gone:1"],
        check=True, capture_output=True,
    )  # fmt: skip
    job = ended(monkey, lost)
    assert job.state.value == "failed" and job.attempts == 1
    assert "/lab/gone@sha256:" in state_line(cli, lost)
    assert f"not found in registry {reg.host} (ErrImagePull)" in state_line(cli, lost)


def test_a_core_that_dies_mid_job_adopts_its_pod_and_a_410_lists_again(
    cli, monkey, cluster, reg, home
):
    from conftest import kill_core, start_core

    added(cli, cluster)
    login(cli, reg)
    juid = cli("run", "-p", "lab", "--image", f"{reg.host}/lab/py:1", "--", "sh", "-c",
               "echo before; while [ ! -e /etc/go-$MONKEY_JUID ]; do sleep 0.1; done; echo after; exit 4"
               ).stdout.strip()  # fmt: skip
    wait_for(lambda: cli("logs", juid).stdout == "before\n", 30, what="the job to start")
    kill_core(home)
    pod = cluster.created[-1]["metadata"]["name"]
    # The job ends while no core runs: the agent in the pod records its exit in the pod's
    # run folder, and the pod waits for a core to take it.
    (cluster.rootfs(pod, "ml") / "etc" / f"go-{juid}").touch()
    uid = cluster.pod(pod, "ml")["metadata"]["uid"]
    events = cluster.root / "pods" / uid / "volumes" / "monkey" / "run" / "events.jsonl"
    wait_for(
        lambda: '"type":"exit"' in events.read_text().replace(" ", ""),
        30,
        what="the exit in the pod",
    )
    assert cluster.pod(pod, "ml")["status"]["phase"] == "Running"
    lists = sum(1 for r in cluster.requests if r.startswith("GET /api/v1/namespaces/ml/pods?"))
    start_core(home)
    wait_for(
        lambda: (
            sum(1 for r in cluster.requests if r.startswith("GET /api/v1/namespaces/ml/pods?"))
            > lists + 1
        ),
        20,
        what="the new core to list and watch the pods",
    )
    expired = len(cluster.requests)
    cluster.expire_history()  # the watch gets 410 Gone: it lists again, and goes on
    job = ended(monkey, juid)
    assert job.state.value == "failed" and job.exit_code == 4 and job.attempts == 1
    assert cli("logs", juid).stdout == "before\nafter\n"  # nothing lost, nothing twice
    assert [r for r in cluster.requests[expired:] if "/pods?" in r and "watch=" not in r]


def test_a_jobs_code_reaches_its_pod_through_exec_and_an_image_without_a_shell_says_so(
    cli, monkey, cluster, reg, home
):
    added(cli, cluster)
    login(cli, reg)
    Path("data").mkdir()
    Path("data/x.txt").write_text("a data file of the project\n")
    Path("main.sh").write_text("echo from the code in $(pwd); cat data/x.txt\n")
    juid = cli("run", "-p", "lab", "--image", f"{reg.host}/lab/py:1", "--",
               "sh", "main.sh").stdout.strip()  # fmt: skip
    job = ended(monkey, juid)
    assert job.state.value == "succeeded", cli("logs", juid, "--setup").stdout
    assert cli("logs", juid).stdout == (
        "from the code in /monkey/run/work\na data file of the project\n"
    )
    assert "monkey's agent and the job's inputs (" in cli("logs", juid, "--setup").stdout
    pod = cluster.created[-1]
    assert pod["spec"]["volumes"] == [{"name": "monkey", "emptyDir": {}}]  # no ConfigMap

    Path("make.sh").write_text("mkdir -p out; echo 42 > out/result.txt; echo no > other.txt\n")
    made = cli("run", "-p", "lab", "--image", f"{reg.host}/lab/py:1", "--outputs", "out",
               "--", "sh", "make.sh").stdout.strip()  # fmt: skip
    assert ended(monkey, made).state.value == "succeeded", cli("logs", made, "--setup").stdout
    assert cli("logs", made).stdout == ""  # the pod's own mark is not the job's output
    work = home / "runs" / made / "1" / "work"  # as run --outputs brings them back
    assert [str(p.relative_to(work)) for p in work.rglob("*.txt")] == ["out/result.txt"]
    assert (work / "out" / "result.txt").read_text() == "42\n"

    shell_less = registry.push_layers(reg, "lab/no-shell:1", [_layer("etc/said", "no shell\n")])
    bare = cli("run", "-p", "lab", "--image", f"{reg.host}/lab/no-shell@{shell_less}",
               "--retries", "1", "--", "sh", "main.sh").stdout.strip()  # fmt: skip
    job = ended(monkey, bare)
    assert job.state.value == "failed" and job.attempts == 1
    assert (
        "the container cannot start (StartError): failed to create containerd task: failed to "
        "create shim task: OCI runtime create failed: runc create failed: unable to start "
        'container process: exec: "sh": executable file not found in $PATH: unknown'
    ) in state_line(cli, bare)


def _layer(name: str, text: str) -> bytes:
    """An uncompressed tar layer holding one file."""
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size = len(text.encode())
        tar.addfile(info, io.BytesIO(text.encode()))
    return buf.getvalue()


def test_cancel_deletes_the_pod_and_stops_its_processes(cli, monkey, cluster, reg):
    added(cli, cluster)
    login(cli, reg)
    juid = cli("run", "-p", "lab", "--image", f"{reg.host}/lab/py:1", "--", "sh", "-c",
               "echo started; sleep 4242").stdout.strip()  # fmt: skip
    wait_for(lambda: "started" in cli("logs", juid).stdout, 30, what="the job to start")
    assert cli("job", "cancel", juid).returncode == 0
    assert ended(monkey, juid).state.value == "cancelled"
    pod = cluster.created[-1]["metadata"]["name"]
    wait_for(lambda: cluster.pod(pod, "ml") is None, 20, what="the pod to be deleted")
    assert not cluster.procs  # the container's processes are gone


@pytest.mark.parametrize("how", ["pressure", "preemption"])
def test_an_evicted_or_preempted_pod_is_a_notice_and_the_job_runs_again_in_a_new_pod(
    cli, monkey, cluster, reg, how
):
    added(cli, cluster)
    login(cli, reg)
    juid = cli("run", "-p", "lab", "--image", f"{reg.host}/lab/py:1", "--", "sh", "-c",
               'echo attempt $MONKEY_ATTEMPT; [ "$MONKEY_ATTEMPT" = 1 ] && sleep 4343; exit 0'
               ).stdout.strip()  # fmt: skip
    wait_for(lambda: "attempt 1" in cli("logs", juid).stdout, 30, what="the first attempt")
    first = cluster.created[-1]["metadata"]["name"]
    cluster.evict(first, "ml", how)
    job = ended(monkey, juid)
    assert job.state.value == "succeeded" and job.attempts == 2 and job.retries == 0
    why = monkey.job(juid).attempts()[0].reason
    expected = {
        "pressure": "preempted: evicted by its node: The node was low on resource: memory.",
        "preemption": "preempted: preempted by the scheduler: default-scheduler: preempting",
    }[how]
    assert why.startswith(expected), why
    assert cluster.created[-1]["metadata"]["name"] != first  # a new pod


def test_a_pod_past_its_memory_limit_is_oomkilled_and_says_its_limit(cli, monkey, cluster, reg):
    added(cli, cluster)
    login(cli, reg)
    juid = cli("run", "-p", "lab", "--image", f"{reg.host}/lab/py:1", "--memory", "48M",
               "--", "sh", "-c", 'echo filling; x=$(head -c 200000000 /dev/zero | tr "\\0" a)'
               ).stdout.strip()  # fmt: skip
    job = ended(monkey, juid)
    assert job.state.value == "failed" and job.exit_code == 137
    assert "exit 137 (OOMKilled, limit 48Mi)" in state_line(cli, juid)
    assert cli("logs", juid).stdout == "filling\n"


def test_a_pod_of_this_home_that_no_attempt_has_is_collected(cli, monkey, cluster, reg, home):
    from monkey.config import Home
    from monkey.drivers.k8s_api import label_value

    added(cli, cluster)
    login(cli, reg)
    mine = label_value(Home(home).home_id())
    for name, labels in (("left-behind", {"monkey.dev/home": mine}),
                         ("someone-elses", {"monkey.dev/home": "another-home"})):  # fmt: skip
        cluster.create_pod("ml", {"metadata": {"name": name, "labels": labels}, "spec": {
            "containers": [{"name": "job", "image": f"{reg.host}/lab/nothing:1"}]}})  # fmt: skip
    juid = cli("run", "-p", "lab", "--image", f"{reg.host}/lab/py:1", "--", "true").stdout.strip()
    assert ended(monkey, juid).state.value == "succeeded"
    wait_for(lambda: cluster.pod("left-behind", "ml") is None, 20, what="the orphan collected")
    assert cluster.pod("someone-elses", "ml") is not None  # another home's pod is left alone


def test_an_image_without_python3_fails_in_one_line_naming_the_requirement(
    cli, monkey, cluster, reg
):
    added(cli, cluster)
    login(cli, reg)
    juid = cli("run", "-p", "lab", "--image", f"{reg.host}/lab/tiny:1", "--retries", "1", "--",
               "true").stdout.strip()  # fmt: skip
    job = ended(monkey, juid)
    assert job.state.value == "failed" and job.attempts == 1
    assert (f"image {reg.host}/lab/tiny@sha256:") in state_line(cli, juid) and (
        "has no python3: monkey's agent runs in the pod with the image's python3 (standard "
        "library only); use an image that has one"
    ) in state_line(cli, juid)
    name = cluster.created[-1]["metadata"]["name"]
    wait_for(lambda: cluster.pod(name, "ml") is None, 20, what="the pod deleted")


TRAIN = """\
import os, signal, sys, time
import monkey

ck = os.path.join(os.environ["MONKEY_CHECKPOINT_DIR"], "step")
step = int(open(ck).read()) if os.path.exists(ck) else 0
attempt = os.environ["MONKEY_ATTEMPT"]
print(f"attempt {attempt} from step {step} in {os.environ['MONKEY_RUN_DIR']}", flush=True)
if attempt == "3":
    sys.exit(0)

def save(*_):
    with open(ck, "w") as f:
        f.write(str(step))
    print(f"saved step {step}", flush=True)
    sys.exit(1)

signal.signal(signal.SIGTERM, save)
while True:
    step += 1
    monkey.log("loss", 1.0 / step, step=step)
    time.sleep(0.05)
"""


def test_monkey_log_and_the_checkpoint_follow_the_job_through_an_eviction_and_a_pause(
    cli, monkey, cluster, reg
):
    import json

    added(cli, cluster)
    login(cli, reg)
    Path("train.py").write_text(TRAIN)
    juid = cli("run", "-p", "lab", "--image", f"{reg.host}/lab/py:1", "--", "python3",
               "train.py").stdout.strip()  # fmt: skip

    def points() -> list[int]:
        got = json.loads(cli("metrics", juid, "--json").stdout or "{}")
        return [p["step"] for p in got.get("loss", [])]

    wait_for(lambda: len(points()) >= 3, 30, what="monkey.log's metrics from the pod")
    assert "attempt 1 from step 0 in /monkey/run\n" in cli("logs", juid).stdout
    cluster.evict(cluster.created[-1]["metadata"]["name"], "ml", "pressure")
    wait_for(lambda: "attempt 2 from" in cli("logs", juid).stdout, 30, what="attempt 2")
    saved = int(cli("logs", juid, "--attempt", "1").stdout.split("saved step ")[1].split()[0])
    assert saved >= 3
    assert f"attempt 2 from step {saved} " in cli("logs", juid).stdout  # the new pod has it
    assert len(cluster.created) == 2
    wait_for(lambda: max(points()) > saved, 30, what="attempt 2's metrics")
    assert cli("job", "pause", juid).returncode == 0
    wait_for(lambda: monkey.job(juid).record.state.value == "paused", 30, what="the pause")
    second = int(cli("logs", juid, "--attempt", "2").stdout.split("saved step ")[1].split()[0])
    assert second > saved
    assert cli("job", "resume", juid).returncode == 0
    job = ended(monkey, juid)
    assert job.state.value == "succeeded" and job.attempts == 3
    assert f"attempt 3 from step {second} " in cli("logs", juid, "--attempt", "3").stdout
    reasons = [a.reason for a in monkey.job(juid).attempts()]
    assert reasons[0].startswith("preempted: evicted by its node") and reasons[1] == (
        "paused by user"
    ), reasons


SAVES_ONCE = """\
import os, sys, time
ck = os.path.join(os.environ["MONKEY_CHECKPOINT_DIR"], "step")
step = int(open(ck).read()) if os.path.exists(ck) else 0
print(f"attempt {os.environ['MONKEY_ATTEMPT']} from step {step}", flush=True)
if os.environ["MONKEY_ATTEMPT"] != "1":
    sys.exit(0)
with open(ck + ".tmp", "w") as f:
    f.write("7")
os.replace(ck + ".tmp", ck)
print("saved step 7", flush=True)
time.sleep(4242)
"""


def test_a_pod_deleted_without_notice_resumes_from_the_checkpoint_read_back_while_it_ran(
    cli, monkey, cluster, reg
):
    added(cli, cluster, "--checkpoint-every", "0.5")
    login(cli, reg)
    Path("train.py").write_text(SAVES_ONCE)
    juid = cli("run", "-p", "lab", "--image", f"{reg.host}/lab/py:1", "--retries", "1", "--",
               "python3", "train.py").stdout.strip()  # fmt: skip
    wait_for(lambda: "saved step 7" in cli("logs", juid).stdout, 30, what="the checkpoint")
    info = cli("info", juid).stdout
    kept = Path(next(ln for ln in info.splitlines() if ln.startswith("checkpoints")).split()[1])
    wait_for(lambda: (kept / "step").is_file(), 10, what="the checkpoint read back")
    assert (kept / "step").read_text() == "7"
    cluster.delete_pod("ml", cluster.created[-1]["metadata"]["name"], 0)  # no time to save
    job = ended(monkey, juid)
    assert job.state.value == "succeeded" and job.attempts == 2, state_line(cli, juid)
    assert "attempt 2 from step 7" in cli("logs", juid, "--attempt", "2").stdout
    assert len(cluster.created) == 2  # in a new pod


JOB_YML = """\
name: k
run:
  env_type: none
  env:
    - TEST_ENV: "HELLO"
  install_script: setup.sh
code:
  path: "."
  ignore: ["data**", "output**"]
persist:
  - name: output
    path: output
data:
  - name: d
    type: copy
    path: data
"""
PROGRESS = """\
import os, sys
print("env", os.environ.get("TEST_ENV"), "data", open("data/x.txt").read().strip())
os.makedirs("output", exist_ok=True)
path = "output/progress.txt"
start = int(open(path).read()) if os.path.exists(path) else 0
print("start", start, flush=True)
with open(path, "w") as f:
    f.write(str(start + 2))
sys.exit(3 if os.environ["MONKEY_ATTEMPT"] == "1" else 0)
"""


def test_a_job_yml_set_up_data_folder_and_persisted_folder_work_in_the_pod(
    cli, monkey, cluster, reg, home
):
    added(cli, cluster)
    login(cli, reg)
    Path("job.yml").write_text(JOB_YML)
    Path("setup.sh").write_text("echo installing in the pod\n")
    Path("data").mkdir()
    Path("data/x.txt").write_text("42\n")
    Path("train.py").write_text(PROGRESS)
    done = cli("run", "-p", "lab", "--image", f"{reg.host}/lab/py:1", "--retries", "1", "--",
               "python3", "train.py")  # fmt: skip
    assert done.returncode == 0, done.stderr
    juid = done.stdout.strip()
    job = ended(monkey, juid)
    assert job.state.value == "succeeded" and job.attempts == 2, cli("logs", juid, "--setup").stdout
    logs = cli("logs", juid).stdout
    assert "env HELLO data 42\nstart 0\n" in logs and logs.endswith("start 2\n")  # restored
    assert "installing in the pod" in cli("logs", juid, "--setup").stdout
    assert (home / "runs" / juid / "persist" / "output" / "progress.txt").read_text() == "4"
    assert not list((home / "runs" / juid).rglob("pod-start.json"))  # its environment: gone


TREE = """\
import os, signal, subprocess, sys, time

data = open(os.environ["MONKEY_DATASET_D"]).read().strip()
print(f"dataset says {data}", flush=True)
child = (
    "import os, signal, sys, time\\n"
    "os.setsid()\\n"
    "signal.signal(signal.SIGTERM, lambda *_: (print('child stopped', flush=True), sys.exit(0)))\\n"
    "print('child ready', flush=True)\\n"
    "while True: time.sleep(0.05)\\n"
)
proc = subprocess.Popen([sys.executable, "-c", child])
signal.signal(signal.SIGTERM, lambda *_: sys.exit(proc.wait()))  # once the child is done
while True:
    time.sleep(1)
"""


def test_a_dataset_reaches_the_pod_and_cancel_stops_the_jobs_whole_tree(cli, monkey, cluster, reg):
    added(cli, cluster)
    login(cli, reg)
    Path("tree.py").write_text(TREE)
    Path("data.csv").write_text("a,b\n")
    juid = cli("run", "-p", "lab", "--image", f"{reg.host}/lab/py:1", "--dataset",
               "data.csv:D", "--", "python3", "tree.py").stdout.strip()  # fmt: skip
    wait_for(lambda: "child ready" in cli("logs", juid).stdout, 30, what="the job's child")
    assert "dataset says a,b\n" in cli("logs", juid).stdout
    pod = cluster.created[-1]["metadata"]["name"]
    listed = cli("list", "providers", "--monkey-instances").stdout  # the pod, its node, its age
    row = next(ln for ln in listed.splitlines() if ln.startswith(pod)).split()
    assert row[1:5] == ["lab", "running", "1", "CPU"] and row[7].startswith("node-"), listed
    assert row[8] == juid
    assert cli("job", "cancel", juid).returncode == 0
    assert ended(monkey, juid).state.value == "cancelled"
    # The child left the job's session: the agent in the pod found it and stopped it too.
    assert "child stopped" in cli("logs", juid).stdout


def test_a_pod_that_ends_before_its_creation_is_answered_ends_its_job_once(
    cli, monkey, cluster, reg
):
    added(cli, cluster)
    login(cli, reg)
    cluster.create_delay = 2.0  # the watch sees the pod run and end first
    juid = cli("run", "-p", "lab", "--image", f"{reg.host}/lab/py:1", "--", "echo", "quick"
               ).stdout.strip()  # fmt: skip
    job = ended(monkey, juid)
    assert job.state.value == "succeeded"
    assert cli("logs", juid).stdout == "quick\n"
    assert cli("daemon", "status").stdout.startswith("core running")  # the core carried on

    # A pod deleted from outside before its creation is answered (never seen running)
    # ends its attempt at once, and the core carries on.
    cluster.create_delay = 3.0
    gone = cli("run", "-p", "lab", "--image", f"{reg.host}/lab/py:1", "--", "sleep", "60"
               ).stdout.strip()  # fmt: skip
    wait_for(lambda: len(cluster.created) == 2, 20, what="the second pod")
    cluster.delete_pod("ml", cluster.created[-1]["metadata"]["name"], 0)
    job = ended(monkey, gone, 30)
    assert job.state.value == "lost", state_line(cli, gone)
    assert "was deleted from outside monkey" in cli("logs", gone, "--setup").stdout
    assert cli("daemon", "status").stdout.startswith("core running")


def test_a_relay_cut_is_opened_again_and_nothing_is_lost_or_doubled(cli, monkey, cluster, reg):
    added(cli, cluster)
    login(cli, reg)
    juid = cli("run", "-p", "lab", "--image", f"{reg.host}/lab/py:1", "--", "sh", "-c",
               "echo one; while [ ! -e /etc/go-$MONKEY_JUID ]; do sleep 0.1; done; echo two"
               ).stdout.strip()  # fmt: skip
    wait_for(lambda: cli("logs", juid).stdout == "one\n", 30, what="the job to start")
    assert cluster.drop_execs() >= 1  # the API server cut the relay
    (cluster.rootfs(cluster.created[-1]["metadata"]["name"], "ml") / "etc" / f"go-{juid}").touch()
    job = ended(monkey, juid)
    assert job.state.value == "succeeded" and job.attempts == 1
    assert cli("logs", juid).stdout == "one\ntwo\n"


def test_logs_follow_a_pod_to_its_end_and_exit_with_its_code(cli, cluster, reg):
    added(cli, cluster)
    login(cli, reg)
    juid = cli("run", "-p", "lab", "--image", f"{reg.host}/lab/py:1", "--", "sh", "-c",
               "echo one; sleep 1; echo two; exit 5").stdout.strip()  # fmt: skip
    followed = cli("logs", "-f", juid)
    lines = followed.stdout.splitlines()
    assert [ln for ln in lines if not ln.startswith("[monkey] ")] == ["one", "two"]
    assert any(" scheduled on node node-" in ln for ln in lines)  # what the pod went through
    assert followed.returncode == 5


def test_a_job_no_node_could_hold_is_refused_at_submission(cli, monkey, cluster, reg):
    added(cli, cluster)  # two nodes of 2 CPUs, 8Gi and no GPU
    login(cli, reg)
    refused = cli("run", "-p", "lab", "--image", f"{reg.host}/lab/py:1", "--gpus", "1",
                  "--", "true")  # fmt: skip
    assert refused.returncode == 1
    assert refused.stderr.strip().endswith(
        "provider 'lab': no node of the cluster could hold a pod asking --cpus 1 --gpus 1 "
        "(the largest allocatable: 2 CPUs, 0 nvidia.com/gpu, 8.0G memory; see monkey "
        "provider check lab)"
    )
    assert monkey.jobs() == []
    cluster.add_node("gpu-node", cpus=8, memory="32Gi", gpus=1)
    assert cli("provider", "check", "lab").returncode == 0
    fits = cli("run", "-p", "lab", "--image", f"{reg.host}/lab/py:1", "--gpus", "1", "--",
               "true")  # fmt: skip
    assert fits.returncode == 0, fits.stderr


def _gpu_node_tainted(cluster) -> str:
    """A GPU node the provider's pods do not tolerate (its taint): the cluster's only GPU is
    one no pod of monkey's can have. The scheduler's message for a GPU pod, then."""
    cluster.add_node("gpu-node", cpus=8, memory="32Gi", gpus=1,
                     taints=[{"key": "nvidia.com/gpu", "value": "present",
                              "effect": "NoSchedule"}])  # fmt: skip
    return (
        "0/3 nodes are available: 2 Insufficient nvidia.com/gpu, 1 node(s) had untolerated "
        "taint {nvidia.com/gpu: present}."
    )


def _with_local(home: Path, gpus: list[int]) -> None:
    """providers.yml gets a `local` provider with GPUS (the ids it hands out)."""
    path = home / "providers.yml"
    data = yaml.safe_load(path.read_text())
    data["providers"]["local"] = {"type": "local", "slots": 2, "gpus": gpus}
    path.write_text(yaml.safe_dump(data))


def test_a_pod_given_up_on_the_cluster_runs_on_the_next_provider_that_can_hold_it(
    cli, monkey, cluster, reg, home
):
    reason = _gpu_node_tainted(cluster)
    added(cli, cluster, "--schedule-timeout", "3", "--image", f"{reg.host}/lab/tiny:1")
    login(cli, reg)
    _with_local(home, [0])
    juid = cli("run", "-p", "lab,local", "--gpus", "1", "--", "sh", "-c",
               "echo ran on $MONKEY_PROVIDER with GPU $CUDA_VISIBLE_DEVICES").stdout.strip()  # fmt: skip
    job = ended(monkey, juid)
    assert job.state.value == "succeeded", cli("info", juid).stdout
    assert job.provider == "local" and job.retries == 0
    given_up = f"lab: not scheduled within schedule_timeout 3s: {reason}"
    assert cli("logs", juid).stdout.splitlines() == [
        "── attempt 1 on lab ──",
        f"── attempt 2 on local, after {given_up}; moved to local ──",
        "ran on local with GPU 0",
    ]
    first, second = monkey.job(juid).attempts()
    assert first.reason == f"{given_up}; moved to local"
    assert second.instance == "local"
    info = cli("info", juid).stdout
    assert f"running -> queued       attempt 1: {given_up}; moved to local\n" in info
    assert "lab -> local            attempt 1: lab gave it up\n" in info
    pod = cluster.created[-1]["metadata"]["name"]
    wait_for(lambda: cluster.pod(pod, "ml") is None, 10, what="the given-up pod deleted")
    assert len(cluster.created) == 1  # not tried on the cluster again


def test_a_pod_given_up_fails_its_job_when_no_other_provider_may_hold_it(
    cli, monkey, cluster, reg, home
):
    reason = _gpu_node_tainted(cluster)
    added(cli, cluster, "--schedule-timeout", "3", "--image", f"{reg.host}/lab/tiny:1")
    login(cli, reg)
    _with_local(home, [])
    pinned = cli("run", "-p", "lab", "--gpus", "1", "--retries", "2", "--", "true").stdout.strip()
    # local is allowed, but has no GPU: nowhere else to go either
    listed = cli("run", "-p", "lab,local", "--gpus", "1", "--", "true").stdout.strip()
    given_up = f"lab: not scheduled within schedule_timeout 3s: {reason}"
    job = ended(monkey, pinned)
    assert job.state.value == "failed" and job.attempts == 1  # not retried
    assert state_line(cli, pinned).split(None, 1)[1] == f"failed ({given_up})"
    job = ended(monkey, listed)
    assert job.state.value == "failed" and job.attempts == 1 and job.provider == "lab"
    assert state_line(cli, listed).split(None, 1)[1] == (
        f"failed ({given_up}; no other provider of lab,local can hold it: provider 'local' "
        "has 2 slots and 0 GPUs; a job asking --cpus 1 --gpus 1 could never run there)"
    )


def test_list_instances_providers_and_check_show_the_nodes_and_monkeys_pods(
    cli, cluster, reg, home
):
    cluster.add_node("gpu-node", cpus=8, memory="32Gi", gpus=2)
    added(cli, cluster)
    login(cli, reg)
    sleeps = ["--image", f"{reg.host}/lab/py:1", "--", "sh", "-c", "echo started; sleep 4242"]
    cpu = cli("run", "-p", "lab", *sleeps).stdout.strip()
    gpu = cli("run", "-p", "lab", "--gpus", "1", *sleeps).stdout.strip()
    for juid in (cpu, gpu):
        wait_for(lambda j=juid: "started" in cli("logs", j).stdout, 30, what=f"{juid} to start")
    pods = {p["metadata"]["labels"]["monkey.dev/job"]: p["metadata"]["name"]
            for p in cluster.created}  # fmt: skip

    listed = cli("list", "instances")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["INSTANCE", "PROVIDER", "STATE", "SIZE", "SPOT", "ADDRESS",
                                "NODE", "JOBS", "AGE", "IDLE", "$/H", "COST"]  # fmt: skip
    rows = {ln.split()[0]: ln for ln in lines[1:]}
    for juid, node, size in ((cpu, "node-a", "1 CPU"), (gpu, "gpu-node", "1 CPU, 1 GPU")):
        line, words = rows[pods[juid]], rows[pods[juid]].split()
        assert words[1:3] == ["lab", "running"] and f" {size} " in line, line  # its requests
        assert words[words.index(node) + 1] == juid, line
    assert rows[pods[gpu]].split()[-4].endswith("s")  # its age, in seconds
    assert len(rows) == 2

    providers = cli("list", "providers").stdout
    assert (
        "lab: fake, namespace ml: 3 of 3 nodes ready, 12 CPUs and 2 GPUs allocatable; 2 pods "
        "of monkey's running\n"
    ) in providers
    hosts = {ln.split()[0]: ln.split() for ln in providers.splitlines() if ln.startswith("lab/")}
    assert hosts == {
        "lab/node-a": ["lab/node-a", "node-a", "ready", "2", "0", "8.0G", "1"],
        "lab/node-b": ["lab/node-b", "node-b", "ready", "2", "0", "8.0G", "0"],
        "lab/gpu-node": ["lab/gpu-node", "gpu-node", "ready", "8", "2", "32.0G", "1"],
    }

    checked = cli("provider", "check", "lab")
    assert checked.returncode == 0, checked.stderr
    nodes = {ln.split()[1]: ln.split()[2:13] for ln in checked.stdout.splitlines()}
    assert nodes["gpu-node"] == ["up", "cpus", "8", "gpus", "0,1", "memory", "32.0G", "pods",
                                 "1", "isolation", "pod"]  # fmt: skip
    assert nodes["node-b"][7:9] == ["pods", "0"]
