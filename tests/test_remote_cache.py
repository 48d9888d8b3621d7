"""The laptop's blob cache of a remote (issue 27): bounded by MONKEY_REMOTE_CACHE_MAX, the
least recently used blobs removed after each command, a re-submit after a removal reading
the files again and uploading nothing the server holds; `remote remove` deletes it, `remote
list` shows its size, `remote prune` empties it; two submissions at once; bad input. A real
TLS main node and a laptop with its own HOME (tests/mainnode.py)."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import blake3
import pytest
from mainnode import MainNode, node, wait_until_ended  # noqa: F401 - node: a fixture

pytestmark = pytest.mark.system

LIMIT = 600_000  # bytes of blobs a cache keeps in these tests (a trim leaves 80% of it)


@pytest.fixture(autouse=True)
def lab(node: MainNode) -> None:
    node.add_remote()
    node.laptop_env["MONKEY_REMOTE_CACHE_MAX"] = str(LIMIT)


def cache(node: MainNode, name: str = "lab") -> Path:
    return node.laptop_root / ".cache" / "monkey" / "remotes" / name


def cached(node: MainNode) -> dict[str, int]:
    """The blobs in the laptop's cache of lab: digest -> size."""
    return {
        p.parent.name + p.name: p.stat().st_size
        for p in (cache(node) / "blobs").glob("??/*")
        if not p.name.startswith(".")
    }


def server_blobs(node: MainNode) -> set[str]:
    return {p.parent.name + p.name for p in (node.home / "blobs").glob("??/*")}


def project(root: Path, tag: str, size: int = 200_000) -> Path:
    """A project whose code prints TAG and the digest of its data file of SIZE random bytes."""
    root.mkdir(parents=True)
    (root / "main.py").write_text(
        "import hashlib\n"
        f"print({tag!r}, hashlib.sha256(open('weights.bin', 'rb').read()).hexdigest())\n"
    )
    (root / "weights.bin").write_bytes(os.urandom(size))
    return root


def expected(code: Path, tag: str) -> str:
    import hashlib

    return f"{tag} {hashlib.sha256((code / 'weights.bin').read_bytes()).hexdigest()}\n"


def submit(node: MainNode, code: Path, **env: str) -> str:
    done = node.laptop(
        "--remote", "lab", "run", "--workdir", str(code), "--", "python3", "main.py", **env
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def ran(node: MainNode, juid: str) -> str:
    wait_until_ended(node, juid)
    assert json.loads(node.server("info", juid, "--json").stdout)["state"] == "succeeded"
    return node.server("logs", juid).stdout


def digest_of(node: MainNode, juid: str, path: str) -> str:
    files = json.loads(node.server("info", juid, "--files", "--json").stdout)
    return next(f["digest"] for f in files if f["path"] == path)


SUBMIT_SENT = (
    "import sys\n"
    "from monkey import Monkey\n"
    "m = Monkey(remote='lab')\n"
    "job = m.run(['python3', 'main.py'], workdir=sys.argv[1])\n"
    "print(job.juid, m.gatherer().sent)\n"
)


def test_the_cache_stays_under_its_limit_and_a_resubmit_after_eviction_uploads_nothing(
    node, tmp_path
):
    codes = [project(tmp_path / f"p{i}", f"p{i}") for i in range(4)]
    jobs = []
    for code in codes:
        jobs.append(submit(node, code))
        assert sum(cached(node).values()) <= LIMIT
    for code, juid in zip(codes, jobs):
        assert ran(node, juid) == expected(code, code.name)  # every submission ran
    # the first project's data went (least recently used), the last one's stayed
    first, last = (digest_of(node, j, "weights.bin") for j in (jobs[0], jobs[-1]))
    assert first not in cached(node) and last in cached(node)
    # nothing says the evicted file is unchanged and here any more
    db = sqlite3.connect(cache(node) / "monkey.db")
    assert db.execute("SELECT COUNT(*) FROM stat_cache WHERE digest = ?", (first,)).fetchone() == (
        0,
    )
    db.close()
    # submitting the first project again reads it again and uploads nothing the server holds
    held = server_blobs(node)
    done = subprocess.run(
        [sys.executable, "-c", SUBMIT_SENT, str(codes[0])],
        env=node.laptop_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    juid, sent = done.stdout.split()
    assert sent == "0"
    assert server_blobs(node) == held
    assert ran(node, juid) == expected(codes[0], "p0")
    assert first in cached(node)  # most recently used now
    assert sum(cached(node).values()) <= LIMIT
    # a file changed since: its new content reaches the job, and only it is uploaded
    (codes[0] / "weights.bin").write_bytes(os.urandom(200_000))
    assert ran(node, submit(node, codes[0])) == expected(codes[0], "p0")
    assert len(server_blobs(node) - held) == 2  # the file and the new file list


def test_reading_commands_fetch_into_the_cache_within_its_limit(node, tmp_path):
    code = project(tmp_path / "p", "p", size=500_000)
    data = tmp_path / "data"
    data.mkdir()
    (data / "big.bin").write_bytes(os.urandom(400_000))
    done = node.laptop(
        "--remote", "lab", "run", "--workdir", str(code), "--dataset", str(data), "--", "true"
    )
    assert done.returncode == 0, done.stderr
    juid = done.stdout.strip()
    other = {"XDG_CACHE_HOME": str(tmp_path / "other-cache")}  # a second laptop, empty cache
    dest = tmp_path / "clone"
    done = node.laptop("--remote", "lab", "clone", juid, "--to", str(dest), "--with-data", **other)
    assert done.returncode == 0, done.stderr
    assert (dest / "weights.bin").read_bytes() == (code / "weights.bin").read_bytes()
    assert (dest / "datasets" / "DATA" / "big.bin").read_bytes() == (data / "big.bin").read_bytes()
    fetched = tmp_path / "other-cache" / "monkey" / "remotes" / "lab" / "blobs"
    kept = sum(p.stat().st_size for p in fetched.glob("??/*"))
    assert 0 < kept <= LIMIT
    shown = node.laptop("--remote", "lab", "cat", juid, "main.py", **other)
    assert shown.stdout == (code / "main.py").read_text()


def test_remove_drops_the_cache_list_shows_sizes_and_prune_empties(node, tmp_path):
    code = project(tmp_path / "p", "p", size=100_000)
    submit(node, code)
    listed = node.laptop("remote", "list")
    assert listed.returncode == 0, listed.stderr
    head, row = listed.stdout.splitlines()[:2]
    assert head.split()[-1] == "CACHE" and re.search(r" \d+\.\d (kB|MB)$", row), listed.stdout
    sizes = json.loads(node.laptop("remote", "list", "--json").stdout)["remotes"]
    assert sizes["lab"]["cache_bytes"] >= 100_000
    # a cache an older monkey left behind when its remote was removed
    node.add_remote(name="old")
    assert (
        node.laptop("--remote", "old", "run", "--workdir", str(code), "--", "true").returncode == 0
    )
    settings = node.laptop_root / ".config" / "monkey" / "remotes.json"
    data = json.loads(settings.read_text())
    del data["remotes"]["old"]
    settings.write_text(json.dumps(data))
    listed = node.laptop("remote", "list").stdout
    assert "caches of removed remotes: old (" in listed and "monkey remote prune" in listed
    pruned = node.laptop("remote", "prune", "old")
    assert pruned.returncode == 0, pruned.stderr
    assert pruned.stdout.startswith("old: freed ") and not cache(node, "old").exists()
    # prune empties a remote's cache but for the monkey> shell's history kept there
    (cache(node) / "history").write_text("list jobs\n")
    pruned = node.laptop("remote", "prune")
    assert pruned.returncode == 0, pruned.stderr
    assert pruned.stdout.startswith("lab: freed ")
    assert sorted(p.name for p in cache(node).iterdir()) == ["history"]
    assert (cache(node) / "history").read_text() == "list jobs\n"
    submit(node, code)  # and it fills again
    # remove: the remote, its token and its cache
    removed = node.laptop("remote", "remove", "lab")
    assert removed.returncode == 0, removed.stderr
    assert removed.stdout.startswith("remote lab removed; its cache freed ")
    assert str(cache(node)) in removed.stdout
    assert not cache(node).exists()
    assert all(f.startswith(".config/") for f in node.laptop_files())
    # bad names: one line, nothing removed
    for name, why in (("../..", "cannot name a remote"), ("nope", "no remote 'nope'")):
        bad = node.laptop("remote", "prune", name)
        assert bad.returncode == 1 and why in bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1
    assert node.laptop("remote", "prune").stdout == "no cache to empty\n"


def stop_mid_upload(proc: subprocess.Popen[str], node: MainNode, timeout: float = 60) -> None:
    """Leave PROC stopped (SIGSTOP) in the middle of a blob's upload. It runs in 10 ms steps
    and is looked at only while stopped, when a partial blob on the server stays: a poll
    while it runs can miss every blob's window on a fast machine."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        proc.send_signal(signal.SIGSTOP)
        time.sleep(0.02)  # the server writes what was already sent
        if any((node.home / "blobs").rglob(".tmp-*")):
            return
        if proc.poll() is not None:
            assert proc.stderr is not None
            raise AssertionError(f"the submission ended before its upload: {proc.stderr.read()}")
        proc.send_signal(signal.SIGCONT)
        time.sleep(0.01)
    raise AssertionError(f"no upload began in {timeout}s")


def test_two_submissions_at_once_with_a_tiny_limit_both_succeed(node, tmp_path):
    """One submission stopped mid-upload (SIGSTOP: a slow link, a laptop put to sleep), a
    second one from another terminal runs and trims the cache meanwhile: the first one's
    blobs stay until it ends, and both jobs run."""
    tiny = {"MONKEY_REMOTE_CACHE_MAX": "1000"}
    big = project(tmp_path / "big", "big", size=1000)
    for i in range(4):  # blobs it opens one after the other as it uploads
        (big / f"part{i}.bin").write_bytes(os.urandom(8 << 20))
    small = project(tmp_path / "small", "small")
    first = subprocess.Popen(
        [sys.executable, "-m", "monkey", "--remote", "lab", "run", "--workdir", str(big)]
        + ["--", "python3", "main.py"],
        env={**node.laptop_env, **tiny},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stop_mid_upload(first, node)
        second = submit(node, small, **tiny)  # ends, and trims, while the first uploads
        parts = {blake3.blake3((big / f"part{i}.bin").read_bytes()).hexdigest() for i in range(4)}
        assert parts <= set(cached(node))  # under the first one's lease: kept
        for action in ("remove", "prune"):  # nor is the cache deleted under it
            busy = node.laptop("remote", action, "lab")
            assert busy.returncode == 1
            assert busy.stderr.startswith("monkey: error: a command is using the cache of ")
            assert len(busy.stderr.strip().splitlines()) == 1
        assert "lab" in json.loads(node.laptop("remote", "list", "--json").stdout)["remotes"]
    finally:
        first.send_signal(signal.SIGCONT)
    out, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    assert ran(node, out.strip()) == expected(big, "big")
    assert ran(node, second) == expected(small, "small")
    assert sum(cached(node).values()) <= 1000  # the last one to end trimmed the cache


def test_bad_limit_or_unusable_cache_is_one_line_and_submits_nothing(node, tmp_path):
    code = project(tmp_path / "p", "p", size=2 << 20)  # more than the small disk holds
    bad = node.laptop(
        "--remote",
        "lab",
        "run",
        "--workdir",
        str(code),
        "--",
        "true",
        MONKEY_REMOTE_CACHE_MAX="lots",
    )
    assert bad.returncode == 1
    assert bad.stderr == (
        "monkey: error: MONKEY_REMOTE_CACHE_MAX='lots' is not a size; write e.g. "
        "MONKEY_REMOTE_CACHE_MAX=2G or 500M (0 keeps no blob between commands)\n"
    )
    mount = tmp_path / "disk"
    mount.mkdir()
    for options, why in (
        ("ro,size=1m", "cannot be written (Read-only file system)"),
        ("size=1m", "is on a full disk"),
    ):
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            pytest.skip(f"mounting a tmpfs is not permitted here (needs root): {done.stderr}")
        try:
            refused = node.laptop(
                "--remote",
                "lab",
                "run",
                "--workdir",
                str(code),
                "--",
                "true",
                XDG_CACHE_HOME=str(mount),
            )
            leftovers = [p for p in mount.rglob("*") if p.name.startswith(".tmp-")]
        finally:
            subprocess.run(["umount", str(mount)], check=True)
        assert refused.returncode == 1
        lines = refused.stderr.strip().splitlines()
        assert len(lines) == 1, refused.stderr
        assert f"the cache of remote lab ({mount}/monkey/remotes/lab) {why}" in lines[0]
        assert "XDG_CACHE_HOME" in lines[0]
        assert not leftovers
    assert json.loads(node.server("list", "jobs", "--json").stdout)["jobs"] == []
