"""Jobs in OCI images (issue 44), with monkey's own unprivileged runner (skopeo, umoci and
bubblewrap) on the local provider, against a real registry on 127.0.0.1 with TLS and a
login (tests/registry.py)."""

from __future__ import annotations

import json
from pathlib import Path

import registry
from conftest import wait_for
from mainnode import node  # noqa: F401  (the fixture)
from registry import reg  # noqa: F401  (the fixture)
from test_disk_full import api, disk  # noqa: F401  (the fixtures)


def login(cli, reg) -> None:
    done = cli("registry", "login", reg.host, "--username", registry.USER, "--password-stdin",
               "--ca-file", str(reg.ca), input=registry.PASSWORD + "\n")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"logged in to {reg.host} as {registry.USER}" in done.stdout


def ended(monkey, juid: str, timeout: float = 60):
    from monkey.models import TERMINAL

    return wait_for(
        lambda: (j := monkey.job(juid).record).state in TERMINAL and j,
        timeout,
        what=f"{juid} to end",
    )


def test_a_job_runs_in_its_image_pinned_by_digest_and_a_rerun_keeps_the_digest(
    cli, monkey, reg, home
):
    login(cli, reg)
    engine = "images unprivileged (bubblewrap)"
    assert f"local: {engine}\n" in cli("list", "providers").stdout
    assert cli("provider", "check", "local").stdout.endswith(f"  {engine}\n")
    listed = cli("registry", "list").stdout
    assert reg.host in listed and registry.USER in listed and "yes" in listed  # the CA kept
    assert oct((home / "secrets" / "registries.json").stat().st_mode & 0o777) == "0o600"
    Path("secret.txt").write_text("only outside\n")
    ref = f"{reg.host}/lab/tiny:1"
    juid = cli("run", "--image", ref, "--env", "MINE=kept", "--", "sh", "-c",
               "cat /etc/said; echo $IMAGE_SAYS $MINE; ls /usr 2>&1 | head -1; "
               f"cat secret.txt; id -u; test -e {home}/monkey.db && echo home-visible; "
               "echo $PYTHONPATH; echo ${MONKEY_HOME:-unset}").stdout.strip()  # fmt: skip
    job = ended(monkey, juid)
    out = cli("logs", juid).stdout
    assert job.state.value == "succeeded", out + cli("logs", juid, "--setup").stdout
    lines = out.splitlines()
    assert lines[0] == "one"  # the image's file, not this machine's
    assert lines[1] == "hello kept"  # the image's Env and the job's own variable
    assert "No such file" in lines[2]  # this machine's /usr is not there
    assert lines[3] == "only outside"  # its code, at the same path
    assert "home-visible" not in out  # MONKEY_HOME of the worker is not in the image
    assert lines[-2].endswith("/python") and ":" not in lines[-2]  # monkey's in-job package
    assert lines[-1] == "unset"  # nothing of the worker's environment
    info = cli("info", juid).stdout
    assert f"image        {ref} @ {reg.digests['1']}\n" in info
    assert registry.PASSWORD not in info and "auth" not in json.dumps(monkey.job(juid).record.env)
    assert not list(home.rglob("pull-auth.json"))  # the pull's login is gone with the pull

    # the tag moves; a rerun runs the first digest, a new run the new one
    reg.push("lab/tiny:1", {"/etc/said": "moved\n"})
    again = cli("rerun", juid).stdout.split()[0]
    fresh = cli("run", "--image", ref, "--", "cat", "/etc/said").stdout.strip()
    assert ended(monkey, again).state.value == "succeeded"
    assert ended(monkey, fresh).state.value == "succeeded"
    assert cli("logs", again).stdout.splitlines()[0] == "one"
    assert cli("logs", fresh).stdout == "moved\n"
    assert f"@ {reg.digests['1']}\n" in cli("info", again).stdout
    moved = cli("diff", again, fresh).stdout
    assert "[image]" in moved and f"- {ref} @ {reg.digests['1']}\n" in moved


def test_image_problems_are_one_line_at_submission_and_nothing_is_recorded(cli, reg, monkey, home):
    ref = f"{reg.host}/lab/tiny:1"
    untrusted = cli("run", "--image", ref, "--", "true")
    assert untrusted.returncode == 1
    assert f"registry {reg.host}'s certificate is not trusted" in untrusted.stderr
    assert f"monkey registry login {reg.host} --ca-file" in untrusted.stderr
    wrong = cli("registry", "login", reg.host, "--username", registry.USER,
                "--password-stdin", "--ca-file", str(reg.ca), input="wrong\n")  # fmt: skip
    assert wrong.returncode == 1 and "unauthorized" in wrong.stderr
    assert registry.USER not in cli("registry", "list").stdout
    login(cli, reg)
    missing = cli("run", "--image", f"{reg.host}/lab/nothing:1", "--", "true")
    assert missing.returncode == 1
    assert missing.stderr.strip().endswith(
        f"not found in registry {reg.host}; check its name and tag"
    )
    for words in (
        ["logout", ".."],
        ["logout", "../x"],
        ["login", "..", "-u", "x", "--password-stdin"],
    ):
        refused = cli("registry", *words, input="pw\n")  # never a folder: `..` is not a host
        assert refused.returncode == 1 and "give a host" in refused.stderr, refused.stderr
    assert (home / "monkey.db").is_file() and (home / "secrets" / "registries.json").is_file()
    bad = cli("run", "--image", "Not A Ref", "--", "true")
    assert (
        bad.returncode != 0 and "image reference" in bad.stderr or "repository name" in bad.stderr
    )
    assert monkey.jobs() == []
    assert cli("registry", "logout", reg.host).returncode == 0
    denied = cli("run", "--image", ref, "--", "true")
    assert denied.returncode == 1  # the CA went with the logout: untrusted again
    assert monkey.jobs() == []


def test_a_command_missing_from_the_image_never_started_and_a_second_job_pulls_nothing(
    cli, monkey, reg, home
):
    login(cli, reg)
    ref = f"{reg.host}/lab/tiny:2"
    juid = cli("run", "--image", ref, "--", "python3", "-c", "pass").stdout.strip()
    job = ended(monkey, juid)
    assert job.state.value == "failed" and job.exit_code == 127
    assert (
        "command not found in the image: python3"
        in cli("logs", juid).stdout + cli("logs", juid, "--stderr").stdout
    )
    first_pull = cli("logs", juid, "--setup").stdout
    assert f"image {ref} @ {reg.digests['2']}: pulled " in first_pull
    second = cli("run", "--image", ref, "--", "cat", "/etc/said").stdout.strip()
    assert ended(monkey, second).state.value == "succeeded"
    assert cli("logs", second).stdout == "two\n"
    assert "on this worker already (0 bytes pulled)" in cli("logs", second, "--setup").stdout


TRAIN = """\
import os, sys, monkey
attempt = int(os.environ["MONKEY_ATTEMPT"])
state = monkey.checkpoint_dir() / "state"
seen = state.read_text() if state.exists() else "none"
state.write_text(f"saved by {attempt}")
monkey.log({"acc": 0.25 * attempt}, step=attempt)
print("attempt", attempt, "found", seen, "python", sys.version.split()[0], open("/etc/said").read().strip())
sys.exit(3 if attempt == 1 else 0)
"""


def test_monkey_log_and_checkpoints_work_inside_an_image_across_attempts(cli, monkey, reg):
    login(cli, reg)
    Path("train.py").write_text(TRAIN)
    juid = cli("run", "--image", f"{reg.host}/lab/py:1", "--retries", "1", "--",
               "python3", "train.py").stdout.strip()  # fmt: skip
    job = ended(monkey, juid, timeout=120)
    out = cli("logs", juid).stdout
    assert job.state.value == "succeeded", out + cli("logs", juid, "--setup").stdout
    assert "attempt 1 found none python 3.11" in out and "python inside" in out
    assert "attempt 2 found saved by 1" in out  # the checkpoint folder, bound in the image
    assert [value for _step, value, _t in monkey.metrics(juid)["acc"]] == [0.25, 0.5]


def test_cancel_stops_every_process_of_a_job_inside_its_image(cli, monkey, reg):
    login(cli, reg)
    marker = "4217"  # a sleep no other test runs
    juid = cli("run", "--image", f"{reg.host}/lab/tiny:2", "--", "sh", "-c",
               f"sleep {marker} & sleep {marker} & echo started; wait").stdout.strip()  # fmt: skip
    wait_for(lambda: "started" in cli("logs", juid).stdout, 60, what="the job to start")
    wait_for(lambda: len(_sleeps(marker)) == 2, 10, what="its two children")
    assert cli("job", "cancel", juid).returncode == 0
    assert ended(monkey, juid).state.value == "cancelled"
    wait_for(lambda: not _sleeps(marker), 10, what="every process of the job to be gone")


def _sleeps(marker: str) -> list[str]:
    import os

    found = []
    for pid in os.listdir("/proc"):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmd[:2] == [b"sleep", marker.encode()]:
            found.append(pid)
    return found


def _layer(entries: list[tuple[str, str, str]]) -> bytes:
    """An uncompressed tar layer of (kind, name, data-or-target) entries, as hostile as
    given: kind f (file), s (symlink), h (hard link), c (character device)."""
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for kind, name, value in entries:
            info = tarfile.TarInfo(name)
            data = None
            if kind == "f":
                data = value.encode()
                info.size, info.mode = len(data), 0o644
            elif kind in "sh":
                info.type = tarfile.SYMTYPE if kind == "s" else tarfile.LNKTYPE
                info.linkname = value
            else:
                info.type, info.devmajor, info.devminor = tarfile.CHRTYPE, 1, 3
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def test_a_hostile_layer_writes_nothing_outside_the_image_root(cli, monkey, reg, home, tmp_path):
    import os
    import stat

    login(cli, reg)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "target").write_text("keep")
    refused = {  # each layer refused whole, in one line naming its entry
        "an absolute path": [("f", f"{outside}/by-absolute", "x")],
        "a path with ..": [("f", f"../../../../../../../..{outside}/by-dotdot", "x")],
        "an opaque whiteout of /": [("f", "fine", "x"), ("f", ".wh..wh..opq", "")],
        "a hard link to what the layer's root lacks": [("h", "hard", f"{str(outside)[1:]}/target")],
    }
    failed = {}
    for n, (why, entries) in enumerate(refused.items()):
        digest = registry.push_layers(reg, f"evil/refused{n}:1", [_layer(entries)])
        ref = f"{reg.host}/evil/refused{n}@{digest}"
        failed[why] = cli("run", "--image", ref, "--", "true").stdout.strip()
    # links out of the root are followed inside it; a device file is not made
    confined = registry.push_layers(reg, "evil/confined:1", [_layer([
        ("s", "esc", str(outside)),
        ("f", "esc/through-a-link", "inside"),
        ("s", "up", "../../../.."),
        ("f", "up/by-relative-link", "inside"),
        ("c", "a-device", ""),
    ])])  # fmt: skip
    ran = cli("run", "--image", f"{reg.host}/evil/confined@{confined}", "--", "true").stdout.strip()
    for why, juid in failed.items():
        job = ended(monkey, juid)
        assert job.state.value == "failed"
        state = next(ln for ln in cli("info", juid).stdout.splitlines() if ln.startswith("state"))
        assert f"unpacking failed: layer 1 refused: {why}" in state, state
    ended(monkey, ran)  # (the image has no `true`)
    assert "1 device files not made" in cli("logs", ran, "--setup").stdout
    rootfs = home / "images" / "roots" / confined.split(":")[1] / "rootfs"
    assert (rootfs / str(outside)[1:] / "through-a-link").read_text() == "inside"
    assert (rootfs / "by-relative-link").read_text() == "inside"
    assert sorted(os.listdir(outside)) == ["target"]  # nothing written outside...
    assert (outside / "target").read_text() == "keep"  # ...nor changed
    for path in (home / "images").rglob("*"):  # no device node made from a layer
        assert not stat.S_ISCHR(path.lstat().st_mode) and not stat.S_ISBLK(path.lstat().st_mode)


def test_an_ssh_host_runs_a_job_in_its_image_as_a_plain_user(cli, monkey, reg, home, tmp_path,
                                                            monkeypatch):  # fmt: skip
    import yaml
    from sshd import Lab

    client_home = tmp_path / "client"
    monkeypatch.setenv("HOME", str(client_home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    lab = Lab(client_home)
    try:
        host = lab.add("h1")
        home.mkdir(exist_ok=True)
        (home / "providers.yml").write_text(yaml.safe_dump(
            {"providers": {"lab": {"type": "ssh", "hosts": [host.entry(key=lab.key)]}}}
        ))  # fmt: skip
        login(cli, reg)
        checked = cli("provider", "check", "lab").stdout
        assert "images unprivileged (bubblewrap)" in checked, checked
        Path("train.py").write_text(TRAIN)
        juid = cli("run", "-p", "lab", "--image", f"{reg.host}/lab/py:1", "--", "sh", "-c",
                   "id -u; python3 train.py").stdout.strip()  # fmt: skip
        job = ended(monkey, juid, timeout=120)
        out = cli("logs", juid).stdout
        assert job.state.value == "failed" and job.exit_code == 3, out  # attempt 1 exits 3
        uid = out.splitlines()[0]
        assert uid != "0" and "attempt 1 found none python 3.11" in out and "python inside" in out
        assert [v for _s, v, _t in monkey.metrics(juid)["acc"]] == [0.25]
        assert not list(Path(host.workdir).rglob("pull-auth.json"))
        assert registry.PASSWORD not in "".join(
            p.read_text(errors="replace") for p in Path(host.workdir).rglob("*.log")
        )
    finally:
        lab.close()


def test_a_pull_from_an_unreachable_registry_is_shown_and_tried_again(cli, monkey, tmp_path):
    own, proc = registry.start(tmp_path / "registry")
    try:
        own.push("lab/tiny:1", {"/etc/said": "came through\n"})
        login(cli, own)
        blocker = cli("run", "--", "sleep", "1").stdout.strip()
        juid = cli("run", "--after", blocker, "--image", f"{own.host}/lab/tiny:1", "--",
                   "cat", "/etc/said").stdout.strip()  # fmt: skip
        proc.kill()
        proc.wait()
        row = wait_for(
            lambda: (
                next(
                    (ln for ln in cli("list", "jobs").stdout.splitlines() if ln.startswith(juid)),
                    "",
                ).split()[2:3]
                == ["pulling"]
            ),
            30,
            what="list jobs to say the job is pulling",
        )
        assert row
        assert "(pulling 0 B" in cli("info", juid).stdout
        _, proc = registry.start(own.root, int(own.host.rsplit(":", 1)[1]))
        job = ended(monkey, juid, timeout=60)
        assert job.state.value == "succeeded"
        assert cli("logs", juid).stdout == "came through\n"
        setup = cli("logs", juid, "--setup").stdout
        assert f"registry {own.host} is unreachable from the worker; trying again in 2 s" in setup
        assert "(pulling" not in cli("info", juid).stdout
    finally:
        proc.kill()
        proc.wait()


def test_a_sweeps_cells_all_run_in_the_image_pinned_once(cli, monkey, reg):
    login(cli, reg)
    sid = cli("sweep", "--image", f"{reg.host}/lab/tiny:2", "--grid", "n=1,2", "--", "sh",
              "-c", "echo cell {n}; cat /etc/said").stdout.strip().split()[-1]  # fmt: skip
    jobs = wait_for(
        lambda: len(js := [j for j in monkey.jobs() if j.sweep == sid]) == 2 and js,
        30,
        what="cells",
    )
    for job in jobs:
        assert ended(monkey, job.juid).state.value == "succeeded"
        assert cli("logs", job.juid).stdout.endswith("two\n")
        assert f"@ {reg.digests['2']}\n" in cli("info", job.juid).stdout


def test_through_a_remote_the_main_node_pins_the_image_with_its_own_login(node, reg):
    from mainnode import wait_until_ended

    node.add_remote(node.add_user("ana"), name="ana")
    laptop_login = node.laptop("--remote", "ana", "registry", "list")
    assert laptop_login.returncode != 0 and "run it on the main node" in laptop_login.stderr
    ref = f"{reg.host}/lab/tiny:2"
    refused = node.laptop("--remote", "ana", "run", "--image", ref, "--", "true")
    assert refused.returncode == 1 and "certificate is not trusted" in refused.stderr
    done = node.server("registry", "login", reg.host, "-u", registry.USER, "--password-stdin",
                       "--ca-file", str(reg.ca), input=registry.PASSWORD + "\n")  # fmt: skip
    assert done.returncode == 0, done.stderr
    Path("job.yml").write_text(f"image: {ref}\n")
    juid = node.laptop("--remote", "ana", "run", "--", "cat", "/etc/said").stdout.strip()
    wait_until_ended(node, juid)
    assert node.laptop("--remote", "ana", "logs", juid).stdout == "two\n"
    assert (
        f"image        {ref} @ {reg.digests['2']}\n"
        in node.laptop("--remote", "ana", "info", juid).stdout
    )


def test_gc_removes_images_no_job_used_for_a_week_but_not_one_a_queued_job_needs(
    cli, monkey, reg, home
):
    import os
    import time

    login(cli, reg)
    one = cli("run", "--image", f"{reg.host}/lab/tiny:1", "--", "true").stdout.strip()
    two = cli("run", "--image", f"{reg.host}/lab/tiny:2", "--", "true").stdout.strip()
    py = cli("run", "--image", f"{reg.host}/lab/py:1", "--", "true").stdout.strip()
    for juid in (one, two, py):
        ended(monkey, juid)
    roots = home / "images" / "roots"
    assert len(list(roots.iterdir())) == 3
    assert "images" in cli("du").stdout
    week_ago = time.time() - 8 * 86400
    for root in roots.iterdir():
        os.utime(root / ".monkey-ready", (week_ago, week_ago))
    blocker = cli("run", "--", "sleep", "30").stdout.strip()
    waiting = cli("run", "--after", blocker, "--image", f"{reg.host}/lab/tiny:2", "--",
                  "cat", "/etc/said").stdout.strip()  # fmt: skip
    before = sum(f.stat().st_size for f in (home / "images").rglob("*") if f.is_file())
    freed = cli("gc").stdout
    assert "2 images (" in freed, freed
    left = sorted(p.name for p in roots.iterdir())
    assert left == [reg.digests["2"].split(":")[1]]  # the queued job's
    after = sum(f.stat().st_size for f in (home / "images").rglob("*") if f.is_file())
    assert after < before - 5_000_000  # the python image's layer went with it
    cli("job", "cancel", blocker)
    assert ended(monkey, waiting).state.value == "cancelled"


def test_a_registry_sending_a_huge_manifest_is_refused_in_one_line(cli, monkey, reg, tmp_path):
    """A hostile registry (here a TLS server with the test registry's certificate, on
    another port) answering a manifest of 6 MiB: the submission is refused, the submitting
    process does not hold it all."""
    import http.server
    import ssl
    import threading

    class Huge(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"{}" if self.path == "/v2/" else b"x" * (6 << 20)
            self.send_response(200)
            self.send_header("Content-Type", "application/vnd.oci.image.manifest.v1+json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_HEAD = do_GET

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Huge)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(reg.ca, reg.root / "key.pem")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    host = f"127.0.0.1:{server.server_address[1]}"
    try:
        done = cli("registry", "login", host, "-u", "x", "--password-stdin", "--ca-file",
                   str(reg.ca), input="y\n")  # fmt: skip
        assert done.returncode == 0, done.stderr
        huge = cli("run", "--image", f"{host}/evil/huge:1", "--", "true")
        assert huge.returncode == 1
        assert f"registry {host} sent a manifest over 4 MiB" in huge.stderr
        assert monkey.jobs() == []
    finally:
        server.shutdown()


def test_a_pull_that_fills_the_workers_disk_fails_in_one_line_with_the_space_left(
    cli, api, reg, disk
):
    """MONKEY_HOME on an 8 MB tmpfs: the Python image (9 MB of layers) cannot be pulled."""
    login(cli, reg)
    juid = cli("run", "--image", f"{reg.host}/lab/py:1", "--", "python3", "-c", "pass")
    assert juid.returncode == 0, juid.stderr
    job = ended(api, juid.stdout.strip())
    assert job.state.value == "failed"
    state = next(ln for ln in cli("info", job.juid).stdout.splitlines() if ln.startswith("state"))
    assert f"no space left on the worker at {disk / 'images'} (" in state
    assert " bytes free) while pulling" in state
    assert not list((disk / "images" / "roots").glob("*"))  # nothing half-unpacked kept


def test_a_job_with_persisted_folders_in_a_pulled_image_never_sees_the_registry_login(
    cli, monkey, reg
):
    """Such a job goes through the launcher even when its image is on the worker: the login
    left for the pull is gone before the job runs."""
    login(cli, reg)
    ref = f"{reg.host}/lab/tiny:2"
    first = cli("run", "--image", ref, "--", "true").stdout.strip()  # pulls it
    assert ended(monkey, first).state.value == "succeeded"
    Path("job.yml").write_text("persist:\n  - name: out\n    path: out\n")
    juid = cli("run", "--image", ref, "--", "sh", "-c", 'mkdir -p out; ls -a "$MONKEY_RUN_DIR"')
    job = ended(monkey, juid.stdout.strip())
    out = cli("logs", job.juid).stdout
    assert job.state.value == "succeeded", out
    assert "stdout.log" in out and "pull-auth.json" not in out


def test_layers_apply_their_whiteouts_in_order_and_only_the_image_is_kept(cli, monkey, reg, home):
    login(cli, reg)
    base = _layer([("f", "a", "lower"), ("f", "d/x", "lower"), ("f", "d/y", "lower"),
                   ("f", "keep", "lower")])  # fmt: skip
    upper = _layer([("f", ".wh.a", ""), ("f", "d/.wh..wh..opq", ""), ("f", "d/z", "upper")])
    digest = registry.push_layers(reg, "lab/layered:1", [base, upper, _layer([("f", "e", "")])])
    juid = cli("run", "--image", f"{reg.host}/lab/layered@{digest}", "--", "true").stdout
    ended(monkey, juid.strip())  # (the image has no `true`: the pull is what counts)
    layered = home / "images" / "roots" / digest.split(":")[1] / "rootfs"
    assert sorted(p.relative_to(layered).as_posix() for p in layered.rglob("*")) == [
        "d", "d/z", "e", "keep"
    ]  # fmt: skip
    assert sorted(p.name for p in (home / "images").iterdir()) == [".lock", "roots", "tmp"]
    assert not list((home / "images" / "tmp").iterdir())  # no layer left once unpacked


def test_a_job_yml_set_up_runs_inside_the_image_once_per_worker_and_is_reused(cli, monkey, reg):
    login(cli, reg)
    Path("requirements.txt").write_text("")
    Path("setup.sh").write_text(
        'cat /etc/said > "$VIRTUAL_ENV/said"\necho built >> "$VIRTUAL_ENV/builds"\n'
    )
    Path("job.yml").write_text(
        f"image: {reg.host}/lab/py:1\n"
        "run: {env_type: pip, env_file: requirements.txt, install_script: setup.sh}\n"
    )
    show = ('command -v python; cat "$VIRTUAL_ENV/said" "$VIRTUAL_ENV/builds"; '
            'python -c "import sys, monkey; print(sys.prefix == sys.base_prefix)"')  # fmt: skip
    first = cli("run", "--", "sh", "-c", show).stdout.strip()
    job = ended(monkey, first, timeout=120)
    out = cli("logs", first).stdout
    assert job.state.value == "succeeded", out + cli("logs", first, "--setup").stdout
    python, said, builds, base = out.splitlines()
    assert python.endswith("/bin/python") and "/envs/" in python  # the environment's, first
    assert said == "python inside"  # the install script ran in the image
    assert builds == "built" and base == "False"  # in the virtualenv, monkey importable
    second = cli("run", "--", "sh", "-c", show).stdout.strip()
    assert ended(monkey, second).state.value == "succeeded"
    assert cli("logs", second).stdout == out  # built once: reused as it is
    assert "reusing environment" in cli("logs", second, "--setup").stdout


def pinned(cli, ref: str) -> str:
    """The digest a job submitted in the image REF was pinned to."""
    juid = cli("run", "--image", ref, "--", "true").stdout.strip()
    return json.loads(cli("info", "job", juid, "--json").stdout)["image"]["digest"]


def test_a_tag_resolved_before_is_asked_of_its_registry_again_at_each_submission(
    cli, monkey, tmp_path
):
    own, proc = registry.start(tmp_path / "registry")
    ref = f"{own.host}/lab/tiny:1"
    try:
        first = own.push("lab/tiny:1", {"/etc/said": "first\n"})
        login(cli, own)
        assert [pinned(cli, ref) for _ in range(2)] == [first, first]
        moved = own.push("lab/tiny:1", {"/etc/said": "moved\n"})
        assert pinned(cli, ref) == moved  # the registry said the tag moved
    finally:
        proc.kill()
        proc.wait()
    gone = cli("run", "--image", ref, "--", "true")  # never the digest it named before
    assert gone.returncode == 1 and f"registry {own.host} is unreachable" in gone.stderr
    assert len(monkey.jobs()) == 3
