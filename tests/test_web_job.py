"""Monkey Web's job page, its remaining parts (issue 28): the code snapshot browser, diffs
against git HEAD and another run, the rerun form and clone instructions; against a real
main node with real jobs, in Debian's chromium (the fixtures of tests/test_web.py)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from conftest import wait_for
from mainnode import MainNode, node, wait_until_ended  # noqa: F401 - node: a fixture
from test_web import (  # noqa: F401 - browser: a fixture
    browser,
    csrf_of,
    login,
    page_for,
    run_job,
    state_of,
)

from monkey.api import Monkey
from monkey.server.web.code import diff_lines, safe_path


def git(where: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(where), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        check=True,
        capture_output=True,
    )


def run_in(node: MainNode, workdir: Path, *argv: str) -> str:
    done = node.server("run", "--workdir", str(workdir), "--", *argv)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_safe_path_refuses_absolute_and_climbing_paths():
    assert safe_path("src/./train.py") == "src/train.py"
    for bad in ("/etc/passwd", "../x", "a/../../x", "a\\b", "", ".", "a/\0"):
        assert safe_path(bad) is None, bad


def test_diff_lines_tell_added_removed_and_hunks():
    text = "--- a/x\n+++ b/x\n@@ -1 +1 @@\n-old <b>\n+new\n same"
    assert diff_lines(text) == (
        [
            ("file", "--- a/x"),
            ("file", "+++ b/x"),
            ("hunk", "@@ -1 +1 @@"),
            ("del", "-old <b>"),
            ("add", "+new"),
            ("ctx", " same"),
        ],
        0,
    )
    assert diff_lines("+a\n+b\n+c", most=2) == ([("add", "+a"), ("add", "+b")], 1)


@pytest.mark.system
def test_the_code_browser_shows_files_as_the_job_saw_them_and_refuses_climbing_out(
    node, browser, tmp_path
):
    code = tmp_path / "proj"
    (code / "src").mkdir(parents=True)
    (code / "src" / "train.py").write_text("print('<lr> & 0.1')\n")
    (code / "data.bin").write_bytes(b"\0\1\2" * 100)
    (code / "big.txt").write_text("x" * 600_000 + "THE END\n")
    juid = run_in(node, code, "true")
    (code / "src" / "train.py").write_text("changed after\n")  # the job keeps its copy
    page = page_for(browser)
    login(page, node, node.token, f"/web/jobs/{juid}")
    page.click("text=Browse its files")
    page.click(".tree >> text=train.py")
    page.wait_for_url(f"**/web/jobs/{juid}/code/src/train.py")
    assert page.inner_text("#source") == "print('<lr> & 0.1')\n"  # as the job saw it, escaped
    raw = page.request.get(node.url + f"/web/jobs/{juid}/code/src/train.py?raw=1")
    assert raw.body() == b"print('<lr> & 0.1')\n"
    page.goto(node.url + f"/web/jobs/{juid}/code/data.bin")
    assert page.inner_text("#binary").startswith("binary, 300 bytes")
    page.goto(node.url + f"/web/jobs/{juid}/code/big.txt")
    assert "truncated" in page.inner_text("#truncated")
    assert "THE END" not in page.inner_text("#source")
    raw = page.request.get(node.url + f"/web/jobs/{juid}/code/big.txt?raw=1")
    assert raw.body().endswith(b"THE END\n") and len(raw.body()) == 600_008
    assert raw.headers["content-disposition"] == "attachment; filename*=UTF-8''big.txt"
    # a damaged copy in the store is refused, never sent as if it were the job's
    stored = Monkey(node.home).code_blob(juid, "big.txt")
    stored.write_bytes(stored.read_bytes().replace(b"THE END", b"THE EMD"))
    damaged = page.request.get(node.url + f"/web/jobs/{juid}/code/big.txt?raw=1")
    assert damaged.status == 404 and "THE EMD" not in damaged.text()
    assert "damaged" in damaged.text()
    # climbing out of the snapshot, or an absolute path, is refused; a missing file is 404
    for bad in ("..%2F..%2Fetc%2Fpasswd", "src/..%2F..%2F..%2Fetc%2Fpasswd", "%2Fetc%2Fpasswd"):
        answer = page.request.get(node.url + f"/web/jobs/{juid}/code/{bad}")
        assert answer.status == 400, bad
        assert "root:" not in answer.text()
        answer = page.request.get(node.url + f"/web/jobs/{juid}/code/{bad}?raw=1")
        assert answer.status == 400, bad
    missing = page.request.get(node.url + f"/web/jobs/{juid}/code/nope.py")
    assert missing.status == 404 and "has no code file" in missing.text()


@pytest.mark.system
def test_diffs_against_git_head_and_another_run_mark_the_changed_lines(node, browser, tmp_path):
    code = tmp_path / "repo"
    code.mkdir()
    (code / "train.py").write_text("lr = 0.1\nepochs = 3\n")
    git(code, "init", "-q")
    git(code, "add", ".")
    git(code, "commit", "-qm", "first")
    clean = run_in(node, code, "true")
    (code / "train.py").write_text("lr = 0.5  # <tuned>\nepochs = 3\n")
    dirty = run_in(node, code, "true")
    page = page_for(browser)
    login(page, node, node.token, f"/web/jobs/{clean}/diff")
    assert "no uncommitted changes" in page.inner_text("#note")
    page.goto(node.url + f"/web/jobs/{dirty}")
    page.click("text=Diff against git HEAD")
    page.wait_for_selector("#diff")
    assert page.inner_text("#diff .l-add").endswith("+lr = 0.5  # <tuned>")  # escaped
    assert page.inner_text("#diff .l-del").endswith("-lr = 0.1")
    # against another run, from the job page's form
    page.goto(node.url + f"/web/jobs/{dirty}")
    page.fill("#code-h ~ form input[name=against]", clean)
    page.click("#code-h ~ form button")
    page.wait_for_url(f"**/web/jobs/{dirty}/diff?against={clean}")
    assert page.inner_text("#diff .l-add").endswith("+lr = 0.5  # <tuned>")
    assert page.inner_text("#diff .l-del").endswith("-lr = 0.1")
    assert "1 changed, 0 added, 0 removed" in page.inner_text("main")
    page.goto(node.url + f"/web/jobs/{dirty}/diff?against=nosuchjob")
    assert "nosuchjob" in page.inner_text("[role=alert]")


@pytest.mark.system
def test_datasets_persisted_folders_and_outputs_are_listed_and_downloadable(
    node, browser, tmp_path
):
    import tarfile

    code = tmp_path / "proj"
    code.mkdir()
    (code / "job.yml").write_text(
        "name: keep\nrun:\n  env_type: none\npersist:\n  - name: out\n    path: out/model\n"
    )
    data = tmp_path / "mnist"
    data.mkdir()
    (data / "x.txt").write_text("42\n" * 100)
    script = (
        "mkdir -p out/model/sub && echo w1 > out/model/weights.txt && echo s > out/model/sub/s"
        " && echo 0.93 > result.json && ln -s /etc/passwd leak.json"
    )
    done = node.server(
        "run",
        "--workdir",
        str(code),
        "--dataset",
        f"{data}:MNIST",
        "--outputs",
        "*.json",
        "--",
        "sh",
        "-c",
        script,
    )
    assert done.returncode == 0, done.stderr
    juid = done.stdout.strip()
    wait_until_ended(node, juid)
    page = page_for(browser)
    login(page, node, node.token, f"/web/jobs/{juid}")
    row = page.inner_text("#datasets tbody tr")
    assert "MNIST" in row and "$MONKEY_DATASET_MNIST" in row and "300 Bytes" in row
    assert "out/model/ 2 files" in page.inner_text("#persisted-h ~ h3")
    with page.expect_download() as got:
        page.click("text=Download .tar.gz")
    with tarfile.open(got.value.path(), "r:gz") as tar:
        names = sorted(m.name for m in tar.getmembers() if m.isfile())
        assert names == ["out/sub/s", "out/weights.txt"]
        assert tar.extractfile("out/weights.txt").read() == b"w1\n"
    with page.expect_download() as got:
        page.click("#persisted-h ~ ul >> text=weights.txt")
    assert Path(got.value.path()).read_bytes() == b"w1\n"
    outputs = page.inner_text("#outputs-h ~ ul")
    assert "result.json" in outputs and "leak.json" not in outputs  # a link out is no output
    with page.expect_download() as got:
        page.click("#outputs-h ~ ul >> text=result.json")
    assert Path(got.value.path()).read_bytes() == b"0.93\n"
    # only the outputs of its folder, never the rest, never out of it
    base = node.url + f"/web/jobs/{juid}"
    for bad, status in (
        ("/outputs/1/leak.json", 404),
        ("/outputs/1/job.yml", 404),
        ("/outputs/1/..%2F..%2F..%2Fsecrets", 400),
        ("/persisted/out/..%2F..%2F..%2Fsecrets", 400),
        ("/persisted/nope.tar.gz", 404),
    ):
        answer = page.request.get(base + bad)
        assert answer.status == status, bad
        assert "root:" not in answer.text()


def job_ids(node: MainNode) -> list[str]:
    done = node.server("list", "jobs", "--all", "--json")
    assert done.returncode == 0, done.stderr
    return sorted(j["job"] for j in json.loads(done.stdout)["jobs"])


@pytest.mark.system
def test_rerun_from_the_form_queues_the_changed_job_and_bad_values_queue_nothing(
    node, browser, tmp_path
):
    bob = node.add_user("bob")
    juid = run_job(node, "echo", "--lr", "0.1", "--epochs", "3")  # the admin's
    wait_until_ended(node, juid)
    page = page_for(browser)
    login(page, node, bob, f"/web/jobs/{juid}")
    assert page.inner_text("#clone-line") == f"monkey clone {juid} --to ./{juid}"
    assert page.inner_text("#rerun-line") == f"monkey rerun {juid}"
    assert page.input_value("input[name='p:lr']") == "0.1"
    before = job_ids(node)
    # a bad value: its one-line error on the form, what was typed kept, nothing queued
    page.fill("input[name='p:lr']", "0.5")
    page.fill("input[name=time]", "5")
    page.click("#rerun-form button[type=submit]")
    assert "time limit '5' has no unit; write 5m" in page.inner_text("#rerun-error")
    assert page.input_value("input[name='p:lr']") == "0.5"
    assert page.input_value("input[name=time]") == "5"
    page.fill("input[name=cpus]", "two")
    page.fill("input[name=time]", "")
    page.click("#rerun-form button[type=submit]")
    assert page.inner_text("#rerun-error") == "cpus 'two' is not a whole number; write e.g. 2"
    assert job_ids(node) == before
    # a forged form without the CSRF token is refused, nothing queued
    forged = page.request.post(node.url + f"/web/jobs/{juid}/rerun", form={"p:lr": "9"})
    assert forged.status == 403
    assert job_ids(node) == before
    # anyone may rerun a job they see (as the API's rerun): bob's new job, its value changed
    page.fill("input[name=cpus]", "1")
    page.click("#rerun-form button[type=submit]")
    page.wait_for_url(re.compile(r".*/web/jobs/(?!" + juid + r")[^/]+$"))
    new = page.url.rsplit("/", 1)[-1]
    info = json.loads(node.server("info", new, "--json").stdout)
    assert info["owner"] == "bob" and info["rerun_of"]["job"] == juid
    page.wait_for_selector("#log >> text=--lr 0.5 --epochs 3")


@pytest.mark.system
def test_a_job_with_another_users_secrets_offers_no_rerun_and_refuses_one(node, browser):
    bob = node.add_user("bob")
    done = node.server("run", "--env", "API_TOKEN=hunter2", "--", "true")
    assert done.returncode == 0, done.stderr
    juid = done.stdout.strip()
    page = page_for(browser)
    login(page, node, bob, f"/web/jobs/{juid}")
    assert "carries secret env values of" in page.inner_text("#rerun-refused")
    assert page.query_selector("#rerun-form") is None
    before = job_ids(node)
    forged = page.request.post(
        node.url + f"/web/jobs/{juid}/rerun", form={"csrf": csrf_of(page), "name": "x"}
    )
    assert forged.status == 400 and "carries secret env values" in forged.text()
    assert "hunter2" not in forged.text()
    assert job_ids(node) == before


@pytest.mark.system
def test_the_new_job_form_queues_a_job_that_runs_and_bad_values_queue_nothing(node, browser):
    page = page_for(browser)
    login(page, node, node.token, "/web/new")
    assert "runs in an empty folder" in page.inner_text("#code-from")
    before = job_ids(node)
    page.fill("#command", "sh -c 'echo hello $GREETING; ls -A | wc -l; echo ${#API_TOKEN}'")
    page.fill("textarea[name=env]", "GREETING=<web>\nAPI_TOKEN=hunter2hunter2\n")
    page.fill("input[name=time]", "5")
    page.click("#new-form button[type=submit]")
    assert page.inner_text("#new-error") == (
        "time limit '5' has no unit; write 5m for 5 minutes (or 5s, 5h, 5d, HH:MM:SS)"
    )
    assert page.input_value("#command").startswith("sh -c 'echo hello $GREETING")
    assert "API_TOKEN=hunter2hunter2" in page.input_value("textarea[name=env]")
    page.fill("input[name=time]", "5m")
    page.fill("textarea[name=env]", "GREETING=<web>\nnot a line")
    page.click("#new-form button[type=submit]")
    assert page.inner_text("#new-error") == (
        "env line 2 'not a line' is not KEY=VALUE; write e.g. SEED=1"
    )
    forged = page.request.post(node.url + "/web/new", form={"command": "true"})
    assert forged.status == 403
    assert job_ids(node) == before  # nothing queued by any of them
    page.fill("textarea[name=env]", "GREETING=<web>\nAPI_TOKEN=hunter2hunter2\n")
    page.click("#new-form button[type=submit]")
    page.wait_for_url(re.compile(r".*/web/jobs/[^/]+$"))
    juid = page.url.rsplit("/", 1)[-1]
    page.wait_for_selector("#log >> text=hello <web>")
    wait_until_ended(node, juid)
    out = node.server("logs", juid).stdout
    assert out.split() == ["hello", "<web>", "0", "14"]  # an empty folder; the secret given
    info = node.server("info", juid, "--json").stdout
    assert "hunter2" not in info
    assert page.inner_text(".who") == json.loads(info)["owner"] + " (admin)"  # the session's
    db = (node.home / "monkey.db").read_bytes()
    assert b"hunter2hunter2" not in db  # as `run --env`: secret values never in the store


@pytest.mark.system
def test_a_new_job_from_another_job_runs_on_its_code(node, browser, tmp_path):
    code = tmp_path / "proj"
    code.mkdir()
    (code / "train.py").write_text("print('trained on the snapshot')\n")
    data = tmp_path / "mnist"
    data.mkdir()
    (data / "x.txt").write_text("42\n")
    done = node.server(
        "run", "--workdir", str(code), "--dataset", f"{data}:MNIST", "--", "python3", "train.py"
    )
    assert done.returncode == 0, done.stderr
    source = done.stdout.strip()
    (code / "train.py").write_text("print('changed since')\n")
    bob = node.add_user("bob")
    page = page_for(browser)
    login(page, node, bob, f"/web/jobs/{source}")
    page.click("#new-from")
    page.wait_for_url(f"**/web/new?from={source}")
    assert page.input_value("#command") == "python3 train.py"
    assert page.is_checked("input[name=datasets][value=MNIST]")
    page.fill("#command", "sh -c 'python3 train.py; cat $MONKEY_DATASET_MNIST/x.txt'")
    page.click("#new-form button[type=submit]")
    page.wait_for_url(re.compile(r".*/web/jobs/(?!" + source + r")[^/]+$"))
    juid = page.url.rsplit("/", 1)[-1]
    wait_until_ended(node, juid)
    assert node.server("logs", juid).stdout.split("\n")[:2] == ["trained on the snapshot", "42"]
    assert json.loads(node.server("info", juid, "--json").stdout)["owner"] == "bob"


@pytest.mark.system
def test_the_new_pages_have_no_horizontal_scroll_at_360_px(node, browser, tmp_path):
    code = tmp_path / "proj"
    (code / ("a-long-folder-name-" * 4)).mkdir(parents=True)
    (code / ("a-long-folder-name-" * 4) / "f.py").write_text("x = '" + "y" * 400 + "'\n")
    git(code, "init", "-q")
    git(code, "add", ".")
    git(code, "commit", "-qm", "first")
    (code / ("a-long-folder-name-" * 4) / "f.py").write_text("x = '" + "z" * 400 + "'\n")
    juid = run_in(node, code, "echo", "--lr", "0." + "1" * 100)
    page = page_for(browser, viewport={"width": 360, "height": 740})
    login(page, node, node.token, f"/web/jobs/{juid}")
    folder = "a-long-folder-name-" * 4
    for path in (
        f"/web/jobs/{juid}",
        f"/web/jobs/{juid}/code",
        f"/web/jobs/{juid}/code/{folder}/f.py",
        f"/web/jobs/{juid}/diff",
        f"/web/new?from={juid}",
        "/web/new",
    ):
        page.goto(node.url + path)
        assert page.evaluate("document.documentElement.scrollWidth") <= 360, path


# -- "Why isn't it running?" (issue 43 item 8) ---------------------------------------------


def state_line(node: MainNode, juid: str) -> str:
    """The state line of `monkey info JUID`."""
    out = node.server("info", juid).stdout
    return next(line for line in out.splitlines() if line.startswith("state"))


@pytest.mark.system
def test_a_waiting_jobs_page_names_the_job_and_the_capacity_it_waits_for(node, browser, tmp_path):
    (node.home / "providers.yml").write_text("providers:\n  local: {type: local, slots: 1}\n")
    flag = tmp_path / "go"
    holder = run_job(node, "sh", "-c", f"while [ ! -e {flag} ]; do sleep 0.05; done", name="holder")
    wait_for(lambda: state_of(node, holder) == "running", timeout=120, what="the job to run")
    behind = run_job(node, "true", name="behind")  # the one slot is taken
    done = node.server("run", "--name", "after", "--after", holder, "--", "true")
    assert done.returncode == 0, done.stderr
    after = done.stdout.strip()
    wait_for(lambda: "slots busy" in state_line(node, behind), timeout=60, what="the core's pass")
    page = page_for(browser)
    login(page, node, node.token, f"/web/jobs/{after}")
    # the state as the jobs list says it, and the job it waits for: a link, with its state
    assert page.inner_text("#state") == "waiting"
    why = page.inner_text("#why-waiting")
    assert why == f"waiting for {holder} (running) to succeed", why
    assert page.get_attribute("#why-waiting a", "href") == f"/web/jobs/{holder}"
    assert state_line(node, after).endswith(f"queued; waiting for {holder} to succeed")
    # a full provider: how many of its slots are busy, and with which job (as `info` says)
    page.goto(node.url + f"/web/jobs/{behind}")
    assert page.inner_text("#state") == "queued"
    why = page.inner_text("#why-waiting")
    assert why == f"waiting: 1 of 1 slots busy: job {holder} (running)", why
    assert state_line(node, behind).endswith(f"queued; waiting: 1 of 1 slots busy: job {holder}")
    assert page.inner_text("#tries") == "0"
    # the slot frees: the page follows without a reload, the reason gone
    flag.touch()
    page.wait_for_selector("#state >> text=succeeded", timeout=60_000)
    assert page.query_selector("#why-waiting") is None
    assert page.inner_text("#tries") == "1"


def test_attempts_that_never_started_are_counted_apart_from_tries(monkey, cli):
    from monkey.models import State
    from monkey.server.web.views import job_page

    job = monkey.run(["true"], start_core=False)
    store = monkey.store
    for n in (1, 2):  # two starts that came to nothing (no process ran)
        record = store.get_job(job.juid)
        assert store.begin_attempt(record, "local", str(monkey.home.run_dir(job.juid, n)))
        store.end_attempt(
            job.juid, n, final=State.QUEUED, exit_code=None, signal=None, reason="never started"
        )
    info = monkey.info(job.juid)
    assert (info["attempts"], info["tries"], info["never_started"]) == (2, 0, 2)
    shown = cli("info", job.juid).stdout
    assert re.search(r"^tries +0, and 2 attempts that never started$", shown, re.M), shown
    user = {"name": "me", "admin": True}
    assert job_page(monkey, job.juid, user)["tries"] == "0, and 2 attempts that never started"
