"""Snapshots, datasets and git provenance, against real files and a real Store."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import blake3
import pytest
from conftest import REPO
from pathspec import GitIgnoreSpec

from monkey import snapshot
from monkey.models import MonkeyError
from monkey.snapshot import (
    BlobStore,
    FileEntry,
    GitQuery,
    dataset,
    dataset_name,
    hash_file,
    load_manifest,
    manifest,
    parse_dataset_spec,
    snapshot_dir,
)
from monkey.snapshot.git import _git_top
from monkey.snapshot.walk import _Rules
from monkey.store.db import Store


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(tmp_path / "monkey.db")
    yield s
    s.close()


@pytest.fixture
def blobs(tmp_path: Path) -> BlobStore:
    return BlobStore(tmp_path / "blobs")


def write(root: Path, files: dict[str, str | bytes]) -> None:
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, str):
            content = content.encode()
        path.write_bytes(content)


def backdate(root: Path) -> None:
    """Age every file so the stat cache may remember it (recent files are 'racy')."""
    old = time.time() - 3600
    for folder, _, names in os.walk(root):
        for name in names:
            os.utime(os.path.join(folder, name), (old, old), follow_symlinks=False)


def blob_files(blobs: BlobStore) -> list[Path]:
    return [p for p in blobs.root.glob("??/*") if not p.name.startswith(".tmp-")]


def paths(snap) -> list[str]:
    return [f.path for f in snap.files]


def count_hashes(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    calls: list[Path] = []
    real = manifest.hash_file

    def counting(path: Path) -> str:
        calls.append(path)
        return real(path)

    monkeypatch.setattr(manifest, "hash_file", counting)
    return calls


# -- ignore rules -------------------------------------------------------------------------


def test_ignore_rules(tmp_path: Path, blobs: BlobStore, store: Store) -> None:
    wd = tmp_path / "wd"
    write(
        wd,
        {
            ".gitignore": "*.log\n!keep.log\nbuild/\n!build/inside.txt\n__pycache__/\n",
            ".monkeyignore": "data/\nsecret.txt\n!important.log\n",
            "main.py": "print(1)\n",
            "run.log": "noise",
            "keep.log": "kept by negation",
            "important.log": "re-included by .monkeyignore",
            "secret.txt": "hidden",
            "data/big.bin": "x",
            "build/out.o": "o",
            "build/inside.txt": "a file in an excluded folder cannot be re-included",
            "pkg/__pycache__/m.cpython-311.pyc": "c",
            "pkg/mod.py": "x = 1\n",
            "pkg/local.txt": "ignored by pkg/.gitignore",
            "pkg/.gitignore": "/local.txt\n*.tmp\n!*.log\n",
            "pkg/deeper/local.txt": "anchored pattern: only pkg/local.txt",
            "pkg/deeper/x.tmp": "ignored: *.tmp applies below pkg",
            "pkg/deeper/trace.log": "re-included by the deeper !*.log",
            "local.txt": "root file, untouched by pkg/.gitignore",
            "x.tmp": "root file, untouched by pkg/.gitignore",
            ".git/HEAD": "ref: refs/heads/main\n",
            ".git/objects/ab/cdef": "object",
            "sub/.git": "gitdir: ../.git/modules/sub\n",
            "sub/code.py": "y = 2\n",
        },
    )
    snap = snapshot_dir(wd, blobs, store)
    assert paths(snap) == [
        ".gitignore",
        ".monkeyignore",
        "important.log",
        "keep.log",
        "local.txt",
        "main.py",
        "pkg/.gitignore",
        "pkg/deeper/local.txt",
        "pkg/deeper/trace.log",
        "pkg/mod.py",
        "sub/code.py",
        "x.tmp",
    ]


def test_monkeyignore_in_a_subfolder_applies_there(
    tmp_path: Path, blobs: BlobStore, store: Store
) -> None:
    """A .monkeyignore deeper in the project works like a .gitignore there, and wins over
    the .gitignore beside it."""
    wd = tmp_path / "wd"
    write(
        wd,
        {
            "train.py": "pass\n",
            "big.ckpt": "root file, untouched by models/.monkeyignore",
            "models/.monkeyignore": "*.ckpt\n!notes.txt\n",
            "models/.gitignore": "notes.txt\n",
            "models/net.py": "pass\n",
            "models/w.ckpt": "w",
            "models/notes.txt": "git ignores it; monkey keeps it",
            "models/old/w2.ckpt": "w",
        },
    )
    snap = snapshot_dir(wd, blobs, store)
    assert paths(snap) == [
        "big.ckpt",
        "models/.gitignore",
        "models/.monkeyignore",
        "models/net.py",
        "models/notes.txt",
        "train.py",
    ]


def test_gitignore_above_workdir_applies(tmp_path: Path, blobs: BlobStore, store: Store) -> None:
    repo = tmp_path / "repo"
    write(
        repo,
        {
            ".git/HEAD": "ref: refs/heads/main\n",
            ".git/info/exclude": "*.secret\n",
            ".gitignore": "*.bin\nproj/outputs/\n",
            "proj/.gitignore": "/scratch.txt\n",
            "proj/train.py": "pass\n",
            "proj/weights.bin": "w",
            "proj/key.secret": "k",
            "proj/outputs/run1.txt": "o",
            "proj/scratch.txt": "s",
            "proj/src/scratch.txt": "kept: the anchored pattern is for proj/ only",
        },
    )
    snap = snapshot_dir(repo / "proj", blobs, store)
    assert paths(snap) == [".gitignore", "src/scratch.txt", "train.py"]


def test_prefilter_agrees_with_pathspec() -> None:
    lines = [
        "*.log",
        "!keep.log",
        "build/",
        "/top.txt",
        "a/**/b",
        "docs/*.md",
        "!docs/README.md",
        "**/tmp",
        "cache",
        "[Tt]humbs.db",
        "\\#hash",
        "trailing\\ ",
        "x?y",
        "deep/nested/",
    ]
    spec = GitIgnoreSpec.from_lines(lines)
    rules = _Rules(spec, 0, "")
    assert rules.quick is not None
    candidates = [
        "a.log",
        "keep.log",
        "d/keep.log",
        "build/",
        "build",
        "x/build/",
        "top.txt",
        "x/top.txt",
        "a/b",
        "a/x/y/b",
        "a/b/",
        "docs/x.md",
        "docs/README.md",
        "docs/sub/x.md",
        "tmp",
        "q/tmp/",
        "cache/",
        "w/cache",
        "Thumbs.db",
        "thumbs.db",
        "#hash",
        "trailing ",
        "xzy",
        "xy",
        "deep/nested/",
        "deep/nested",
        "src/main.py",
        "README",
        "logs/app.txt",
    ]
    for path in candidates:
        assert rules.check(path) == spec.check_file(path).include, path


# -- storing and the stat cache -------------------------------------------------------------


def test_unchanged_tree_is_stored_once(tmp_path: Path, blobs: BlobStore, store: Store) -> None:
    wd = tmp_path / "wd"
    write(wd, {"a.py": "a", "b.py": "b", "same1.txt": "dup", "same2.txt": "dup", "empty": ""})
    first = snapshot_dir(wd, blobs, store)
    store.add_blobs(first.new_blobs)
    # 4 distinct contents + the manifest
    assert len(first.new_blobs) == 5
    assert sorted(d for d, _ in first.new_blobs) == sorted(
        p.parent.name + p.name for p in blob_files(blobs)
    )
    assert first.size == 1 + 1 + 3 + 3 + 0
    count = store.blob_count()
    on_disk = len(blob_files(blobs))

    second = snapshot_dir(wd, blobs, store)
    store.add_blobs(second.new_blobs)
    assert second.digest == first.digest
    assert second.new_blobs == []
    assert store.blob_count() == count
    assert len(blob_files(blobs)) == on_disk


def test_blob_layout_and_manifest_round_trip(
    tmp_path: Path, blobs: BlobStore, store: Store
) -> None:
    wd = tmp_path / "wd"
    write(wd, {"run.sh": "#!/bin/sh\necho hi\n", "pkg/mod.py": "x = 1\n"})
    os.chmod(wd / "run.sh", 0o755)
    snap = snapshot_dir(wd, blobs, store)
    assert load_manifest(blobs, snap.digest) == snap.files
    by_path = {f.path: f for f in snap.files}
    assert by_path["run.sh"].mode == 0o755
    assert by_path["pkg/mod.py"].size == 6
    for entry in snap.files:
        blob = blobs.root / entry.digest[:2] / entry.digest[2:]
        assert blobs.path(entry.digest) == blob
        assert blob.read_bytes() == (wd / entry.path).read_bytes()
        assert stat.S_IMODE(blob.stat().st_mode) == (0o500 if entry.mode & 0o100 else 0o400)
        assert len(entry.digest) == 64
    manifest = blobs.read_bytes(snap.digest)
    assert blake3.blake3(manifest).hexdigest() == snap.digest
    assert manifest.startswith(b'{"files":[[".gitignore"') is False  # no .gitignore here
    assert manifest.startswith(b'{"files":[["pkg/mod.py",')
    assert b" " not in manifest  # compact


def test_load_manifest_accepts_entries_without_size(blobs: BlobStore) -> None:
    digest, _ = blobs.put_bytes(b'{"files":[["a.py","' + b"0" * 64 + b'",420]]}')
    assert load_manifest(blobs, digest) == [FileEntry("a.py", "0" * 64, 420, 0)]
    bad, _ = blobs.put_bytes(b"not json")
    with pytest.raises(MonkeyError, match="not a snapshot manifest"):
        load_manifest(blobs, bad)
    with pytest.raises(MonkeyError, match="missing"):
        load_manifest(blobs, "1" * 64)


def test_edit_after_snapshot_keeps_the_stored_blob(
    tmp_path: Path, blobs: BlobStore, store: Store
) -> None:
    wd = tmp_path / "wd"
    write(wd, {"train.py": "lr = 0.1\n"})
    first = snapshot_dir(wd, blobs, store)
    old = first.files[0].digest
    (wd / "train.py").write_text("lr = 0.5\n")
    second = snapshot_dir(wd, blobs, store)
    assert second.digest != first.digest
    assert blobs.read_bytes(old) == b"lr = 0.1\n"
    assert load_manifest(blobs, first.digest)[0].digest == old
    assert blobs.read_bytes(second.files[0].digest) == b"lr = 0.5\n"


def test_stat_cache_avoids_rehash(
    tmp_path: Path, blobs: BlobStore, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    wd = tmp_path / "wd"
    write(wd, {f"m{i}.py": f"x = {i}\n" for i in range(20)})
    backdate(wd)
    calls = count_hashes(monkeypatch)
    first = snapshot_dir(wd, blobs, store)
    assert len(calls) == 20
    calls.clear()
    second = snapshot_dir(wd, blobs, store)
    assert calls == []
    assert second.digest == first.digest
    # one edited file (new size and mtime) is the only one hashed again
    (wd / "m3.py").write_text("x = 'three'\n")
    third = snapshot_dir(wd, blobs, store)
    assert [p.name for p in calls] == ["m3.py"]
    assert third.digest != first.digest
    # same size, new mtime: hashed again, content change detected
    calls.clear()
    (wd / "m4.py").write_text("x = 9\n")
    fourth = snapshot_dir(wd, blobs, store)
    assert [p.name for p in calls] == ["m3.py", "m4.py"]  # m3 is still too recent to cache
    assert {f.path: f.digest for f in fourth.files}["m4.py"] == blake3.blake3(
        b"x = 9\n"
    ).hexdigest()


def test_recently_modified_files_are_not_cached(
    tmp_path: Path, blobs: BlobStore, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    wd = tmp_path / "wd"
    write(wd, {"fresh.py": "1", "old.py": "2"})
    old = time.time() - 3600
    os.utime(wd / "old.py", (old, old))
    calls = count_hashes(monkeypatch)
    snapshot_dir(wd, blobs, store)
    calls.clear()
    snapshot_dir(wd, blobs, store)
    assert [p.name for p in calls] == ["fresh.py"]


def test_file_changing_during_snapshot_stores_what_was_copied(
    tmp_path: Path, blobs: BlobStore, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    wd = tmp_path / "wd"
    write(wd, {"model.py": "v1\n"})
    backdate(wd)
    real = manifest.hash_file

    def racing(path: Path) -> str:
        digest = real(path)
        Path(path).write_text("v2, written between hashing and copying\n")
        return digest

    monkeypatch.setattr(manifest, "hash_file", racing)
    snap = snapshot_dir(wd, blobs, store)
    (entry,) = snap.files
    content = blobs.read_bytes(entry.digest)
    assert content == b"v2, written between hashing and copying\n"
    assert blake3.blake3(content).hexdigest() == entry.digest
    assert entry.size == len(content)
    # the racing stat was not cached: the next snapshot hashes again
    monkeypatch.setattr(manifest, "hash_file", real)
    calls = count_hashes(monkeypatch)
    snapshot_dir(wd, blobs, store)
    assert len(calls) == 1


def test_missing_blob_is_stored_again(tmp_path: Path, blobs: BlobStore, store: Store) -> None:
    wd = tmp_path / "wd"
    write(wd, {"a.py": "a\n", "b.py": "b\n"})
    backdate(wd)
    first = snapshot_dir(wd, blobs, store)
    for digest, _ in first.new_blobs:  # e.g. a garbage collection removed everything
        blobs.path(digest).unlink()
    second = snapshot_dir(wd, blobs, store)
    assert second.digest == first.digest
    assert sorted(second.new_blobs) == sorted(first.new_blobs)
    for entry in second.files:
        assert blobs.read_bytes(entry.digest) == (wd / entry.path).read_bytes()


def test_large_file_uses_the_threaded_path(tmp_path: Path, blobs: BlobStore, store: Store) -> None:
    wd = tmp_path / "wd"
    data = os.urandom(3 * 1024 * 1024 + 17)
    write(wd, {"weights.bin": data})
    assert hash_file(wd / "weights.bin") == blake3.blake3(data).hexdigest()
    snap = snapshot_dir(wd, blobs, store)
    (entry,) = snap.files
    assert entry.size == len(data)
    assert blobs.read_bytes(entry.digest) == data
    assert (entry.digest, len(data)) in snap.new_blobs
    assert not list(blobs.root.glob(".tmp-*"))


def test_blobstore_basics(tmp_path: Path, blobs: BlobStore) -> None:
    digest, new = blobs.put_bytes(b"hello")
    assert new and blobs.has(digest)
    assert blobs.put_bytes(b"hello") == (digest, False)
    src = tmp_path / "f.txt"
    src.write_bytes(b"file content")
    d = hash_file(src)
    assert blobs.put_file(src, d) is True
    assert blobs.put_file(src, d) is False
    assert blobs.read_bytes(d) == b"file content"
    src.write_bytes(b"changed")
    wrong = blake3.blake3(b"something else").hexdigest()
    with pytest.raises(MonkeyError, match="changed while it was being stored"):
        blobs.put_file(src, wrong)
    assert not blobs.has(wrong)
    assert not blobs.has(blake3.blake3(b"changed").hexdigest())
    with pytest.raises(MonkeyError, match="not a blob digest"):
        blobs.path("../../etc/passwd")
    assert blobs.put_path(src) == (blake3.blake3(b"changed").hexdigest(), 7, True)
    assert not [p for p in blobs.root.rglob(".tmp-*")]


# -- symlinks and special files ------------------------------------------------------------


def test_symlinks_and_special_files(
    tmp_path: Path, blobs: BlobStore, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    outside = tmp_path / "outside"
    write(outside, {"shared.py": "shared\n", "lib/util.py": "u\n"})
    wd = tmp_path / "wd"
    write(wd, {"main.py": "m\n", "pkg/mod.py": "x\n"})
    os.symlink(outside / "shared.py", wd / "shared.py")  # leaves the project: a link
    os.symlink("../outside/lib", wd / "lib")  # the same, for a folder
    os.symlink("main.py", wd / "alias.py")  # to a file inside: its content is stored
    os.symlink(wd / "pkg", wd / "pkg2")  # to a folder inside: not descended
    os.symlink(wd / "missing.py", wd / "broken.py")  # broken: skipped
    os.mkfifo(wd / "pipe")
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(os.fspath(wd / "sock"))
        snap = snapshot_dir(wd, blobs, store)
    finally:
        sock.close()
    assert paths(snap) == ["alias.py", "lib", "main.py", "pkg/mod.py", "shared.py"]
    by_path = {f.path: f for f in snap.files}
    assert blobs.read_bytes(by_path["alias.py"].digest) == b"m\n"
    for rel, target in (("shared.py", os.fspath(outside / "shared.py")), ("lib", "../outside/lib")):
        assert by_path[rel].mode == stat.S_IFLNK | 0o777 == snapshot.LINK_MODE
        assert blobs.read_bytes(by_path[rel].digest) == target.encode()
    assert all(b"shared\n" != p.read_bytes() for p in blob_files(blobs))  # never read
    assert (
        f"note: 2 symlink(s) leave the project and were recorded as links: "
        f"lib -> ../outside/lib, shared.py -> {outside / 'shared.py'}"
    ) in caplog.text
    assert load_manifest(blobs, snap.digest) == snap.files


def test_a_symlinked_folder_left_out_is_named(
    tmp_path: Path, blobs: BlobStore, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """`data -> other/data` inside the project: the user is told the job will not have it
    there, until it is listed in .monkeyignore."""
    wd = tmp_path / "wd"
    write(wd, {"train.py": "pass\n", "disk/data/x.csv": "1\n"})
    os.symlink(wd / "disk" / "data", wd / "data")
    snapshot_dir(wd, blobs, store)
    assert "does not get symlinked folder(s) data; pass data with --dataset" in caplog.text
    caplog.clear()
    (wd / ".monkeyignore").write_text("/data\n")
    assert paths(snapshot_dir(wd, blobs, store)) == [".monkeyignore", "disk/data/x.csv", "train.py"]
    assert "symlinked" not in caplog.text


def test_an_ignored_link_out_of_the_project_is_not_recorded(
    tmp_path: Path, blobs: BlobStore, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    write(tmp_path / "disk", {"data/x.csv": "1\n"})
    wd = tmp_path / "wd"
    write(wd, {"train.py": "pass\n", ".monkeyignore": "data/\n"})
    os.symlink(tmp_path / "disk" / "data", wd / "data")
    assert paths(snapshot_dir(wd, blobs, store)) == [".monkeyignore", "train.py"]
    assert "symlink" not in caplog.text


def test_blobs_are_private_and_read_only(tmp_path: Path, blobs: BlobStore, store: Store) -> None:
    """A 0600 .env must not become readable by others through its blob; the owner's
    execute bit is kept, and the manifest keeps each file's own mode."""
    wd = tmp_path / "wd"
    write(wd, {".env": "TOKEN=1\n", "run.sh": "#!/bin/sh\n", "big.bin": b"x" * (2 << 20)})
    os.chmod(wd / ".env", 0o600)
    os.chmod(wd / "run.sh", 0o755)
    os.chmod(wd / "big.bin", 0o644)
    snap = snapshot_dir(wd, blobs, store)
    assert {f.path: f.mode for f in snap.files} == {
        ".env": 0o600,
        "big.bin": 0o644,
        "run.sh": 0o755,
    }
    modes = {f.path: stat.S_IMODE(blobs.path(f.digest).stat().st_mode) for f in snap.files}
    assert modes == {".env": 0o400, "big.bin": 0o400, "run.sh": 0o500}
    assert stat.S_IMODE(blobs.path(snap.digest).stat().st_mode) == 0o400  # the manifest
    assert {stat.S_IMODE(p.stat().st_mode) for p in blobs.root.glob("??")} == {0o700}


def test_undecodable_file_name(tmp_path: Path, blobs: BlobStore, store: Store) -> None:
    wd = tmp_path / "wd"
    wd.mkdir()
    with open(os.path.join(os.fsencode(wd), b"caf\xe9.txt"), "wb") as f:
        f.write(b"latin-1 name")
    snap = snapshot_dir(wd, blobs, store)
    (entry,) = load_manifest(blobs, snap.digest)
    assert os.fsencode(entry.path) == b"caf\xe9.txt"
    assert snapshot_dir(wd, blobs, store).digest == snap.digest


# -- errors -------------------------------------------------------------------------------


def test_missing_workdir(tmp_path: Path, blobs: BlobStore, store: Store) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(MonkeyError) as exc:
        snapshot_dir(missing, blobs, store)
    assert str(exc.value) == (
        f"workdir {missing} does not exist; pass an existing folder with --workdir"
    )
    (tmp_path / "file.py").write_text("x")
    with pytest.raises(
        MonkeyError, match="is not a folder; pass an existing folder with --workdir"
    ):
        snapshot_dir(tmp_path / "file.py", blobs, store)


def test_missing_dataset(tmp_path: Path, blobs: BlobStore, store: Store) -> None:
    with pytest.raises(MonkeyError) as exc:
        dataset("nothing/here.csv:train", blobs, store, base=tmp_path)
    assert str(exc.value) == (
        f"dataset {tmp_path / 'nothing/here.csv'} does not exist; check the path given to --dataset"
    )


def test_file_deleted_during_snapshot_is_left_out(
    tmp_path: Path, blobs: BlobStore, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    wd = tmp_path / "wd"
    write(wd, {"keep.py": "k", "gone.py": "g"})
    real = manifest.hash_file

    def deleting(path: Path) -> str:
        if path.name == "gone.py":
            path.unlink()
        return real(path)

    monkeypatch.setattr(manifest, "hash_file", deleting)
    assert paths(snapshot_dir(wd, blobs, store)) == ["keep.py"]


def test_unwritable_blob_store(tmp_path: Path, store: Store) -> None:
    wd = tmp_path / "wd"
    write(wd, {"a.py": "a"})
    (tmp_path / "blobs").write_text("a file where the blob folder should be")
    with pytest.raises(MonkeyError, match="cannot store blobs in .*blobs"):
        snapshot_dir(wd, BlobStore(tmp_path / "blobs"), store)


def test_unreadable_file(
    tmp_path: Path, blobs: BlobStore, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    wd = tmp_path / "wd"
    write(wd, {"locked.py": "secret"})

    def denied(path: Path) -> str:  # as with chmod 0, which root would ignore
        raise PermissionError(13, "Permission denied", os.fspath(path))

    monkeypatch.setattr(manifest, "hash_file", denied)
    with pytest.raises(MonkeyError) as exc:
        snapshot_dir(wd, blobs, store)
    assert str(exc.value) == (
        f"cannot read {(wd / 'locked.py').resolve()} (Permission denied); "
        "fix its permissions or list it in .monkeyignore"
    )


# -- datasets -----------------------------------------------------------------------------


def test_dataset_spec_parsing(tmp_path: Path) -> None:
    assert parse_dataset_spec("data/train.csv:train") == ("data/train.csv", "TRAIN")
    assert parse_dataset_spec("data/train.csv:Train_2") == ("data/train.csv", "TRAIN_2")
    assert parse_dataset_spec("data/train.csv") == ("data/train.csv", None)
    assert parse_dataset_spec("s3:bucket/data.csv") == ("s3:bucket/data.csv", None)
    assert parse_dataset_spec("/a:b/c:d/e.csv") == ("/a:b/c:d/e.csv", None)
    assert parse_dataset_spec("/x/y:1abc") == ("/x/y:1abc", None)
    assert parse_dataset_spec("/x/y:") == ("/x/y:", None)
    assert parse_dataset_spec("/a:b/c.csv:val") == ("/a:b/c.csv", "VAL")
    # a file really named `run:final` is kept whole when `run` does not exist
    (tmp_path / "run:final").write_text("x")
    assert parse_dataset_spec("run:final", tmp_path) == ("run:final", None)
    (tmp_path / "run").write_text("y")
    assert parse_dataset_spec("run:final", tmp_path) == ("run", "FINAL")
    assert dataset_name("data/my-data.v2.csv", True) == "MY_DATA_V2"
    assert dataset_name("data/train-set", False) == "TRAIN_SET"
    assert dataset_name("data/train-set/", False) == "TRAIN_SET"


def test_dataset_file(tmp_path: Path, blobs: BlobStore, store: Store) -> None:
    write(tmp_path, {"a/train-2024.csv": "x,y\n1,2\n", "b/train-2024.csv": "x,y\n1,2\n"})
    one = dataset("a/train-2024.csv", blobs, store, base=tmp_path)
    assert one.name == "TRAIN_2024"
    assert one.single
    assert [f.path for f in one.files] == ["train-2024.csv"]
    assert one.size == 8
    assert len(one.new_blobs) == 2  # content + manifest
    again = dataset(f"{tmp_path}/b/train-2024.csv:tr", blobs, store)
    assert again.name == "TR"
    assert again.digest == one.digest  # same data, elsewhere
    assert again.new_blobs == []
    assert load_manifest(blobs, one.digest) == one.files


def test_dataset_folder(tmp_path: Path, blobs: BlobStore, store: Store) -> None:
    data = tmp_path / "imagenet-mini"
    write(
        data,
        {
            "train/a.bin": b"\x00\x01",
            "train/b.bin": b"\x02",
            "val/a.bin": b"\x00\x01",
            ".gitignore": "*.bin\n",  # no ignore rules for datasets
            ".git/config": "[core]\n",
            "labels.txt": "cat\ndog\n",
        },
    )
    ds = dataset(os.fspath(data), blobs, store)
    assert ds.name == "IMAGENET_MINI"
    assert not ds.single
    assert [f.path for f in ds.files] == [
        ".gitignore",
        "labels.txt",
        "train/a.bin",
        "train/b.bin",
        "val/a.bin",
    ]
    assert ds.size == 2 + 1 + 2 + 6 + 8
    store.add_blobs(ds.new_blobs)
    count = store.blob_count()
    copy = tmp_path / "elsewhere" / "copy"
    shutil.copytree(data, copy)
    again = dataset(f"{copy}:imagenet", blobs, store)
    assert again.name == "IMAGENET"
    assert again.digest == ds.digest
    assert again.new_blobs == []
    assert store.blob_count() == count
    assert load_manifest(blobs, ds.digest) == ds.files


def test_dataset_folder_follows_symlinked_folders_once(
    tmp_path: Path, blobs: BlobStore, store: Store
) -> None:
    shards = tmp_path / "mnt" / "shards"
    write(shards, {"s0.bin": "0", "s1.bin": "1"})
    data = tmp_path / "data"
    write(data, {"meta.json": "{}"})
    os.symlink(shards, data / "shards")
    os.symlink(data, data / "loop")  # a cycle is not followed
    ds = dataset("data", blobs, store, base=tmp_path)
    assert [f.path for f in ds.files] == ["meta.json", "shards/s0.bin", "shards/s1.bin"]


# -- git ----------------------------------------------------------------------------------


def git(cwd: Path, *args: str) -> str:
    env = dict(
        os.environ,
        GIT_AUTHOR_NAME="t",
        GIT_AUTHOR_EMAIL="t@example.com",
        GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@example.com",
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_CONFIG_NOSYSTEM="1",
    )
    return subprocess.run(
        ["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True
    ).stdout


needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


@needs_git
def test_git_info_in_a_repo(tmp_path: Path, blobs: BlobStore) -> None:
    repo = tmp_path / "repo"
    write(repo, {"train.py": "lr = 0.1\n", "src/model.py": "m\n", ".gitignore": "*.log\n"})
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "init")
    sha = git(repo, "rev-parse", "HEAD").strip()

    info, new = GitQuery(repo / "src").result(blobs)
    assert info == {
        "commit": sha,
        "branch": "main",
        "dirty": False,
        "diff": None,
        "root": os.fspath(repo.resolve()),
        "untracked": [],
    }
    assert new == []

    (repo / "train.py").write_text("lr = 0.5\n")
    write(repo, {"notes.txt": "untracked", "debug.log": "ignored", "new/dir.py": "x"})
    info, new = GitQuery(repo).result(blobs)
    assert info["commit"] == sha and info["dirty"] is True
    assert info["untracked"] == ["new/", "notes.txt"]
    diff = blobs.read_bytes(info["diff"])
    assert b"-lr = 0.1" in diff and b"+lr = 0.5" in diff
    assert new == [(info["diff"], len(diff))]
    # the stored diff applies to the commit
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", os.fspath(repo), os.fspath(clone))
    (clone / "change.patch").write_bytes(diff)
    git(clone, "apply", "change.patch")
    assert (clone / "train.py").read_text() == "lr = 0.5\n"

    again, new = GitQuery(repo).result(blobs)
    assert again == info and new == []  # the same diff blob is not stored twice

    git(repo, "checkout", "-q", "--detach")
    assert GitQuery(repo).result(blobs)[0]["branch"] is None


@needs_git
def test_git_info_without_commits(tmp_path: Path, blobs: BlobStore) -> None:
    repo = tmp_path / "fresh"
    write(repo, {"a.py": "a"})
    git(repo, "init", "-q", "-b", "dev")
    info, new = GitQuery(repo).result(blobs)
    assert info["commit"] is None and info["diff"] is None and info["branch"] == "dev"
    assert info["untracked"] == ["a.py"]
    assert new == []


def test_git_info_outside_a_repo(
    tmp_path: Path, blobs: BlobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    if _git_top(os.fspath(plain.resolve())) is not None:
        pytest.skip("the temporary folder is inside a git repository")
    assert GitQuery(plain).result(blobs) == ({}, [])
    assert GitQuery(tmp_path / "missing").result(blobs) == ({}, [])


@needs_git
def test_git_info_without_git_on_path(
    tmp_path: Path, blobs: BlobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    monkeypatch.setenv("PATH", os.fspath(tmp_path / "no-bin"))
    assert GitQuery(repo).result(blobs) == ({}, [])


@needs_git
def test_a_submission_that_fails_leaves_no_git_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """git runs while the code is stored; when the submission then fails (here a dataset
    that does not exist), its git processes are stopped, not left behind."""
    from monkey.api import Monkey

    repo = tmp_path / "repo"
    write(repo, {"train.py": "x\n"})
    git(repo, "init", "-q")
    slow = tmp_path / "bin" / "git"  # a git that takes its time (and is found by it)
    slow.parent.mkdir()
    tag = f"sleep 30.{os.getpid()}"
    slow.write_text(f"#!/bin/sh\nexec {tag}\n")
    slow.chmod(0o755)
    monkeypatch.setenv("PATH", f"{slow.parent}:{os.environ['PATH']}")
    m = Monkey(tmp_path / "home")
    with pytest.raises(MonkeyError, match="does not exist"):
        m.run(["true"], workdir=repo, datasets=[tmp_path / "missing"], start_core=False)
    running = subprocess.run(["pgrep", "-f", tag], capture_output=True, text=True).stdout
    assert running == ""
    assert m.jobs() == []


def test_what_monkey_writes_outside_a_job_is_not_code(
    tmp_path: Path, blobs: BlobStore, store: Store
) -> None:
    """A training script run once outside monkey leaves ./checkpoints (checkpoint_dir()) and
    ./monkey-metrics.jsonl: neither is in a later job's snapshot; the script is."""
    wd = tmp_path / "wd"
    write(
        wd,
        {
            "train.py": (
                "import monkey\n"
                "monkey.log('loss', 0.5, step=1)\n"
                "(monkey.checkpoint_dir() / 'model.pt').write_bytes(b'weights' * 1000)\n"
                "monkey.flush()\n"
            )
        },
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONKEY_")}
    subprocess.run(
        [sys.executable, "train.py"], cwd=wd, env={**env, "PYTHONPATH": str(REPO)}, check=True
    )
    assert (wd / "checkpoints" / "model.pt").exists() and (wd / "monkey-metrics.jsonl").exists()
    assert paths(snapshot_dir(wd, blobs, store)) == ["train.py"]
