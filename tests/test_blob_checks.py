"""Stored code is checked against its digest on every read for a job (issue 24 §2): a blob
whose bytes were flipped or truncated is named (job, file, blob) by `clone`, `cat`,
`rerun`, a local run and an SSH run, never used; a damaged copy on an SSH host is replaced
from the good local one; `monkey verify` says what is damaged and which jobs it affects."""

from __future__ import annotations

import json
import os
from pathlib import Path

import test_ssh
from test_ssh import configure, job_info, run, wait_state

from monkey.snapshot import BlobStore
from tests.sshd import Lab

CODE = "print('the right code')\n"
lab = test_ssh.lab  # SSH hosts on loopback (a fixture)


def submit(cli, *options: str) -> str:
    """Run train.py (printing one line) with OPTIONS; its juid, once it succeeded."""
    juid = cli("run", *options, "--", "python3", "train.py", check=True).stdout.strip()
    follow = cli("logs", "--follow", juid)
    assert follow.returncode == 0 and follow.stdout == "the right code\n", follow
    return juid


def code_blob(home: Path, text: str = CODE) -> Path:
    """The stored blob of train.py."""
    blobs = BlobStore(home / "blobs")
    digest = __import__("blake3").blake3(text.encode()).hexdigest()
    assert blobs.has(digest)
    return blobs.path(digest)


def damage(blob: Path, how: str) -> None:
    """Damage a blob in place as a disk or a careless user would: flip a byte, truncate."""
    data = blob.read_bytes()
    blob.chmod(0o600)
    if how == "flip":
        data = data[:6] + bytes([data[6] ^ 0x20]) + data[7:]
    else:
        data = data[: len(data) // 2]
    with open(blob, "r+b") as f:  # the same file (inode), written in place
        f.truncate(0)
        f.write(data)
    blob.chmod(0o400)


def printed(cli, juid: str) -> str:
    """What the job printed, without the attempts' headers."""
    out = cli("logs", juid, check=True).stdout
    return "".join(line for line in out.splitlines(keepends=True) if not line.startswith("── "))


def one_line_naming(text: str, juid: str, path: str, digest: str) -> None:
    lines = [line for line in text.splitlines() if "damaged" in line]
    assert lines, text
    assert juid in lines[0] and path in lines[0] and digest in lines[0], text


def test_damaged_code_is_named_by_clone_cat_and_never_run_by_a_rerun_or_a_local_run(
    cli, home: Path, tmp_path: Path
) -> None:
    Path("train.py").write_text(CODE)
    Path("other.py").write_text("x = 1\n")
    juid = submit(cli)
    blob = code_blob(home)
    digest = blob.parent.name + blob.name
    for how in ("flip", "truncate"):
        damage(blob, how)
        cat = cli("cat", juid, "train.py")
        assert cat.returncode != 0 and cat.stdout == "", cat
        one_line_naming(cat.stderr, juid, "train.py", digest)
        clone = cli("clone", juid, "--to", str(tmp_path / f"clone-{how}"))
        assert clone.returncode != 0, clone
        one_line_naming(clone.stderr, juid, "train.py", digest)
        assert not (tmp_path / f"clone-{how}").exists()
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(f".clone-{how}")]
        # A rerun (its blobs are there: it is queued, as fast as ever), and the same
        # project submitted again: each job fails naming the blob, it never runs.
        rerun = cli("rerun", juid, check=True).stdout.strip().split()[-1]
        again = cli("run", "--", "python3", "train.py", check=True).stdout.strip()
        for job in (rerun, again):
            assert cli("logs", "--follow", job).returncode != 0
            info = json.loads(cli("info", "job", job, "--json", check=True).stdout)
            assert info["state"] == "failed" and info["attempts"] == 1, info
            one_line_naming(info["reason"], job, "train.py", digest)
            assert not (home / "runs" / job / "1" / "stdout.log").exists()
        blob.chmod(0o600)
        blob.write_text(CODE)  # repaired in place
        blob.chmod(0o400)
    assert cli("cat", juid, "train.py", check=True).stdout == CODE
    submit(cli)


def test_a_core_started_after_the_damage_finds_it_though_the_mtime_was_put_back(
    cli, home: Path
) -> None:
    # A new core trusts the stat a submitter recorded when it hashed the bytes it stored,
    # not the bytes: a change, even one that sets the mtime back, moves the ctime.
    Path("train.py").write_text(CODE)
    juid = submit(cli)
    blob = code_blob(home)
    digest = blob.parent.name + blob.name
    cli("daemon", "stop", check=True)
    before = blob.stat()
    damage(blob, "flip")
    os.utime(blob, ns=(before.st_atime_ns, before.st_mtime_ns))
    cli("daemon", "start", check=True)
    rerun = cli("rerun", juid, check=True).stdout.strip().split()[-1]
    assert cli("logs", "--follow", rerun).returncode != 0
    info = json.loads(cli("info", "job", rerun, "--json", check=True).stdout)
    assert info["state"] == "failed", info
    one_line_naming(info["reason"], rerun, "train.py", digest)


def test_verify_names_damaged_and_missing_blobs_and_the_jobs_they_affect(cli, home: Path) -> None:
    Path("train.py").write_text(CODE)
    first = submit(cli)
    second = submit(cli)
    assert cli("verify", check=True).stdout.startswith("checked ")
    blob = code_blob(home)
    digest = blob.parent.name + blob.name
    damage(blob, "flip")
    out = cli("verify", first)
    assert out.returncode == 1, out
    [line] = [x for x in out.stdout.splitlines() if x.startswith("damaged")]
    assert digest in line and f"job {first} train.py" in line and f"job {second} train.py" in line
    assert first in out.stderr and second in out.stderr
    # Set aside: the next submission of the source stores a good copy, and runs.
    assert not blob.exists() and (home / "blobs" / ".damaged" / digest).exists()
    third = submit(cli)
    assert cli("verify", check=True).returncode == 0
    assert cli("cat", third, "train.py", check=True).stdout == CODE
    # gc removes what was set aside.
    cli("gc", "--grace", "0s", check=True)
    assert not (home / "blobs" / ".damaged").exists() or not any(
        (home / "blobs" / ".damaged").iterdir()
    )


def test_a_damaged_blob_is_never_sent_and_a_damaged_host_copy_is_replaced(
    cli, home: Path, lab: Lab
) -> None:
    host = lab.add("h1")
    configure(home, [host.entry(key=lab.key)])
    Path("train.py").write_text(CODE)
    first = run(cli, "--provider", "lab", "--", "python3", "train.py")
    assert wait_state(cli, first, "succeeded", "failed") == "succeeded", job_info(cli, first)
    local = code_blob(home)
    digest = local.parent.name + local.name
    remote = Path(host.workdir) / "blobs" / digest[:2] / digest[2:]
    assert remote.read_text() == CODE
    # The host's copy is damaged (the core has it marked as sent): the next job refuses it
    # at its start, and the good copy is sent again; the job runs the right code.
    for how in ("flip", "truncate"):
        damage(remote, how)
        juid = run(cli, "--provider", "lab", "--", "python3", "train.py")
        assert wait_state(cli, juid, "succeeded", "failed") == "succeeded", job_info(cli, juid)
        assert printed(cli, juid) == "the right code\n"
        assert remote.read_text() == CODE
    # Damaged while the core was stopped: found when the new core asks what the host lacks.
    cli("daemon", "stop", check=True)
    damage(remote, "flip")
    juid = run(cli, "--provider", "lab", "--", "python3", "train.py")
    assert wait_state(cli, juid, "succeeded", "failed") == "succeeded", job_info(cli, juid)
    assert printed(cli, juid) == "the right code\n"
    assert remote.read_text() == CODE
    # The local copy damaged: never sent, the job fails naming it.
    cli("daemon", "stop", check=True)
    os.unlink(remote)
    damage(local, "flip")
    juid = run(cli, "--provider", "lab", "--", "python3", "train.py")
    assert wait_state(cli, juid, "failed") == "failed"
    one_line_naming(job_info(cli, juid)["reason"], juid, "train.py", digest)
    assert not remote.exists()
