"""Notes and tags on jobs and sweeps (issue 43, item 10): `monkey job note|tag|untag`,
`monkey sweep note|tag|untag`, `list jobs --tag`, shown by `info job` and `sweep status`;
bounded, one-line errors; through a main node only the owner (or an admin) writes them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import wait_for


def test_a_job_is_noted_tagged_found_by_tag_and_shown(monkey, cli):
    job = monkey.run(["true"])
    other = monkey.run(["true"]).juid
    job.wait(timeout=60)
    saved = cli("job", "note", job.juid, "lr 0.1 diverged at step 458\nretry with warm-up")
    assert saved.returncode == 0 and saved.stdout.strip() == f"{job.juid} note saved", saved.stderr
    tagged = cli("job", "tag", job.juid, "baseline", "lr-0.1", "baseline")
    assert tagged.stdout.strip() == f"{job.juid} tags: baseline lr-0.1", tagged.stderr
    listed = cli("list", "jobs", "--tag", "baseline", "--json", check=True).stdout
    found = json.loads(listed)["jobs"]
    assert [(j["job"], j["tags"]) for j in found] == [(job.juid, ["baseline", "lr-0.1"])]
    assert other not in cli("list", "jobs", "--tag", "baseline", check=True).stdout
    assert "no jobs match" in cli("list", "jobs", "--tag", "none", check=True).stdout
    info = cli("info", "job", job.juid, check=True).stdout.splitlines()
    assert any(line.split() == ["tags", "baseline", "lr-0.1"] for line in info), info
    note = next(i for i, line in enumerate(info) if line.startswith("note "))
    assert info[note].split(None, 1)[1] == "lr 0.1 diverged at step 458"
    assert info[note + 1].strip() == "retry with warm-up"
    shown = json.loads(cli("info", job.juid, "--json", check=True).stdout)
    assert shown["note"]["text"] == "lr 0.1 diverged at step 458\nretry with warm-up"
    assert shown["tags"] == ["baseline", "lr-0.1"]
    untagged = cli("job", "untag", job.juid, "baseline")
    assert untagged.stdout.strip() == f"{job.juid} tags: lr-0.1"
    cleared = cli("job", "note", job.juid, "--clear")
    assert cleared.stdout.strip() == f"{job.juid} note removed"
    assert json.loads(cli("info", job.juid, "--json", check=True).stdout)["note"] is None


def test_bad_notes_and_tags_are_one_line_errors_that_change_nothing(monkey, cli, tmp_path):
    juid = monkey.run(["true"]).juid
    cli("job", "tag", juid, "keep", check=True)
    cli("job", "note", juid, "kept", check=True)
    for argv, says in [
        (["job", "note", juid, "x" * 10_001], "the note is 10,001 bytes, over the 10,000 allowed"),
        (["job", "note", juid, "   "], "the note is empty"),
        (["job", "note", juid, "a\x07b"], "the note holds control characters"),
        (["job", "tag", juid, "has space"], "tag 'has space': a tag is 1 to 32 letters"),
        (["job", "tag", juid, "_x"], "a tag is 1 to 32"),
        (["job", "tag", juid, "ok", "y" * 33], "tag '" + "y" * 33 + "'"),
        (["job", "tag", juid, *(f"t{i}" for i in range(20))], "would have 21 tags, over the 20"),
        (["list", "jobs", "--tag", "a b"], "tag 'a b': a tag is"),
        (["job", "note", "99-99", "x"], "no job matches '99-99'"),
    ]:
        done = cli(*argv)
        assert done.returncode == 1, (argv, done.stdout, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and says in lines[0], (argv, lines)
    both = cli("job", "note", juid, "x", "--clear")
    assert both.returncode == 2 and "not both" in both.stderr
    shown = json.loads(cli("info", juid, "--json", check=True).stdout)
    assert shown["tags"] == ["keep"] and shown["note"]["text"] == "kept"


@pytest.mark.system  # runs a sweep
def test_a_sweep_is_noted_and_tagged(monkey, cli):
    sid = cli("sweep", "--grid", "x=1,2", "--name", "scan", "--", "echo", "{x}", check=True)
    sid_text = sid.stdout.strip()
    saved = cli("sweep", "note", "scan", "x=2 is the one")
    assert saved.stdout.strip() == f"{sid_text} note saved", saved.stderr
    tagged = cli("sweep", "tag", "scan", "paper", "fig-3")
    assert tagged.stdout.strip() == f"{sid_text} tags: fig-3 paper", tagged.stderr
    listed = json.loads(cli("list", "sweeps", "--json", check=True).stdout)
    assert [s["tags"] for s in listed] == [["fig-3", "paper"]]
    status = cli("sweep", "status", "scan", check=True).stdout
    assert "tags: fig-3 paper" in status and "x=2 is the one" in status
    untagged = cli("sweep", "untag", "scan", "paper")
    assert untagged.stdout.strip() == f"{sid_text} tags: fig-3"
    cleared = cli("sweep", "note", "scan", "--clear")
    assert cleared.stdout.strip() == f"{sid_text} note removed"
    st = json.loads(cli("sweep", "status", "scan", "--json", check=True).stdout)
    assert st["note"] is None and st["tags"] == ["fig-3"]
    bad = cli("sweep", "tag", "scan", "no way")
    assert bad.returncode == 1 and bad.stderr.strip().startswith("monkey: error: tag 'no way'")
    usage = cli("sweep", "note", "scan")
    assert usage.returncode == 2 and "--clear" in usage.stderr
    # removing the sweep's jobs removes the sweep, and its note and tags with it
    for job in json.loads(cli("list", "jobs", "--json", check=True).stdout)["jobs"]:
        wait_for(lambda j=job["job"]: monkey.get_job(j).state.value == "succeeded", timeout=60)
    cli("sweep", "note", "scan", "kept until the sweep goes", check=True)
    cli("rm", "--sweep", "scan", "--yes", check=True)
    assert monkey.store.note_of("sweep", sid_text) is None
    assert monkey.store.tags_of("sweep", [sid_text]) == {}


@pytest.mark.system  # starts a main node
def test_through_a_remote_a_plain_user_cannot_note_or_tag_another_users_job(
    home: Path, tmp_path: Path
):
    from mainnode import MainNode

    node = MainNode(home, tmp_path)
    node.start()
    try:
        node.add_remote(node.add_user("bob"), name="bob")
        node.add_remote(node.add_user("ana"), name="ana")
        ran = node.laptop("--remote", "ana", "run", "--", "true")
        assert ran.returncode == 0, ran.stderr
        ana = ran.stdout.strip()
        for argv, verb in [
            (["job", "tag", ana, "mine"], "change the tags of"),
            (["job", "note", ana, "mine"], "write the note of"),
        ]:
            refused = node.laptop("--remote", "bob", *argv)
            assert refused.returncode == 1
            assert refused.stderr.strip().splitlines() == [
                f"monkey: error: job {ana} belongs to ana; only its owner or an admin may {verb} it"
            ]
        done = node.laptop("--remote", "ana", "job", "tag", ana, "baseline")
        assert done.stdout.strip() == f"{ana} tags: baseline", done.stderr
        listed = node.laptop("--remote", "bob", "list", "jobs", "--tag", "baseline", "--json")
        assert [j["job"] for j in json.loads(listed.stdout)["jobs"]] == [ana], listed.stderr
        info = json.loads(node.server("info", ana, "--json").stdout)
        assert info["tags"] == ["baseline"] and info["note"] is None
        bad = node.laptop("--remote", "ana", "job", "note", ana, "x" * 10_001)
        assert bad.returncode == 1 and "over the 10,000 allowed" in bad.stderr
    finally:
        node.close()
