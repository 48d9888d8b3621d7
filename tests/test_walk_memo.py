"""The walk memo (snapshot.walk.WalkMemo): a snapshot of a folder whose ignore decisions
cannot have changed parses no ignore file (and never imports pathspec), and whatever
changes between two snapshots, what the memo-aided walk finds is what a walk from nothing
finds."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from monkey.snapshot import BlobStore, snapshot_dir, walk
from monkey.snapshot.walk import WalkMemo, _walk
from monkey.store.db import Store

RACY = 0.02  # the racy window in these tests (2 s in use): a change older than it is trusted


@pytest.fixture(autouse=True)
def short_racy_window(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(walk, "_RACY_NS", int(RACY * 1e9))


def settle() -> None:
    """Let the last change leave the racy window, so that the next walk remembers it."""
    time.sleep(RACY * 1.2)


def project(tmp_path: Path) -> Path:
    """A repository whose folder `proj` has ignore files at every level: above it, its own
    .gitignore and .monkeyignore, a sub-folder's with a negation, .git/info/exclude."""
    top = tmp_path / "repo"
    files = {
        ".git/info/exclude": "*.tmp\n",
        ".gitignore": "proj/notes.txt\n",
        "proj/.gitignore": "*.log\nbuild/\n",
        "proj/.monkeyignore": "data/\n",
        "proj/train.py": "x",
        "proj/notes.txt": "x",
        "proj/run.log": "x",
        "proj/a.tmp": "x",
        "proj/build/out.o": "x",
        "proj/data/big.bin": "x",
        "proj/src/.gitignore": "!keep.log\ncache/\n",
        "proj/src/keep.log": "x",
        "proj/src/drop.log": "x",
        "proj/src/model.py": "x",
        "proj/src/cache/c.bin": "x",
        "proj/src/deep/more.py": "x",
    }
    for rel, text in files.items():
        (top / rel).parent.mkdir(parents=True, exist_ok=True)
        (top / rel).write_text(text)
    return top / "proj"


def found(root: Path, memo: WalkMemo | None, extra: tuple[str, ...] = ()) -> list[object]:
    links: list[tuple[str, str]] = []
    files = _walk(
        str(root),
        ignore=True,
        follow_dirs=False,
        extra_ignore=extra,
        links=links,
        top=str(root.parent),
        memo=memo,
    )
    return [sorted(rel for rel, _, _ in files), sorted(links)]


def test_a_walk_with_nothing_changed_parses_no_ignore_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = project(tmp_path)
    store = Store(tmp_path / "monkey.db")
    blobs = BlobStore(tmp_path / "home")
    settle()
    first = snapshot_dir(root, blobs, store)
    assert sorted(f.path for f in first.files) == [
        ".gitignore",
        ".monkeyignore",
        "src/.gitignore",
        "src/deep/more.py",
        "src/keep.log",
        "src/model.py",
        "train.py",
    ]
    parsed: list[str] = []
    load = walk._load_rules
    monkeypatch.setattr(walk, "_load_rules", lambda path, *a: parsed.append(path) or load(path, *a))
    again = snapshot_dir(root, blobs, store)
    assert again.digest == first.digest and parsed == []
    # a new process (as `monkey run` is) does not even import pathspec
    code = (
        "import sys; from pathlib import Path; from monkey.snapshot import BlobStore, snapshot_dir;"
        "from monkey.store.db import Store;"
        f"s = snapshot_dir(Path({str(root)!r}), BlobStore(Path({str(tmp_path / 'home')!r})),"
        f" Store(Path({str(tmp_path / 'monkey.db')!r})));"
        "print(s.digest, 'pathspec' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == [first.digest, "False"]
    # an edited ignore file is read again, and what it says holds
    (root / "src" / ".gitignore").write_text("cache/\n")
    assert "src/keep.log" not in {f.path for f in snapshot_dir(root, blobs, store).files}
    assert parsed


PATTERNS = [
    "*.log",
    "!keep.log",
    "build/",
    "/top.txt",
    "tmp",
    "**/cache",
    "sub/",
    "!sub/x.py",
    "*.bin",
    "a/**/b",
    "x*",
    "!xkeep",
    "deep/",
    "/sub",
]
NAMES = ["a.log", "keep.log", "top.txt", "x.py", "xkeep", "data.bin", "tmp", "b", "m.py"]
FOLDERS = ["build", "cache", "sub", "a", "deep", "tmp", "b"]


CHANGES = {
    "an ignored file appears": (lambda root: (root / "new.log").write_text("x"), "new.log", False),
    "a file a folder's rules drop appears": (
        lambda root: (root / "src" / "deep" / "x.log").write_text("x"),
        "src/deep/x.log",
        False,
    ),
    "a sub-folder's rules change": (
        lambda root: (root / "src" / ".gitignore").write_text("cache/\n"),
        "src/keep.log",
        False,
    ),
    "a sub-folder gets rules for the folders below it": (
        lambda root: (root / "src" / ".monkeyignore").write_text("deep/\n"),
        "src/deep/more.py",
        False,
    ),
    "the rules above the folder change": (
        lambda root: (root.parent / ".gitignore").write_text("proj/train.py\n"),
        "notes.txt",
        True,
    ),
    "git's exclude file changes": (
        lambda root: (root.parent / ".git" / "info" / "exclude").write_text("model.py\n"),
        "src/model.py",
        False,
    ),
    "the root .monkeyignore goes": (
        lambda root: (root / ".monkeyignore").unlink(),
        "data/big.bin",
        True,
    ),
    "a link out of the project named as an ignored folder appears": (
        lambda root: (
            shutil.rmtree(root / "build"),
            (root / "build").symlink_to(root.parent.parent),
        ),
        "build",
        False,
    ),
    "an ignored folder becomes a file": (
        lambda root: (
            shutil.rmtree(root / "src" / "cache"),
            (root / "src" / "cache").write_text("x"),
        ),
        "src/cache",
        True,
    ),
}


@pytest.mark.parametrize("change", CHANGES)
def test_a_change_that_decides_is_seen(tmp_path: Path, change: str) -> None:
    root = project(tmp_path)
    settle()
    memo = WalkMemo()
    found(root, memo)
    make, path, present = CHANGES[change]
    make(root)
    settle()
    again = WalkMemo(memo.dumps())
    after = found(root, again)
    assert after == found(root, None)
    assert (path in after[0] or path in dict(after[1])) is present
    assert again.reused > 0 or change.startswith(("the rules above", "git's", "the root"))


def test_a_folder_changed_just_before_the_walk_is_decided_again_next_time(tmp_path: Path) -> None:
    """Its entries may change again within the same tick of the clock, unseen by a stamp."""
    root = project(tmp_path)
    settle()
    memo = WalkMemo()
    found(root, memo)
    (root / "new.log").write_text("x")
    again = WalkMemo(memo.dumps())
    assert "new.log" not in found(root, again)[0]
    assert again.new["dirs"][""][0] is None and again.new["dirs"]["src/"][0] is not None
    (root / "other.log").write_text("x")
    assert found(root, WalkMemo(again.dumps())) == found(root, None)


@pytest.mark.parametrize("seed", range(4))
def test_whatever_changes_the_memo_finds_what_a_fresh_walk_finds(tmp_path: Path, seed: int) -> None:
    """Random changes of files, folders, ignore files (at every level) and job.yml's ignore
    patterns; after each, the walk with the memo of the walk before must agree with one
    from nothing."""
    rng = random.Random(seed)
    root = project(tmp_path)
    extra: tuple[str, ...] = ()
    settle()
    memo_text: str | None = None
    reused = 0
    for step in range(60):
        folders, files = [], []
        for here, dirs, names in os.walk(root):  # symlinked folders are not entered
            folders.append(Path(here))
            files += [Path(here, n) for n in sorted(names)]
            dirs.sort()
        where = rng.choice(folders)
        what = rng.randrange(9)
        try:
            change(rng, what, step, where, folders, files, tmp_path, root)
        except OSError:
            pass  # e.g. a file where a folder was asked for: nothing changed, still compared
        if what == 7:
            extra = tuple(rng.sample(PATTERNS, rng.randrange(0, 3)))
        settle()
        memo = WalkMemo(memo_text)
        with_memo = found(root, memo, extra)
        from_nothing = found(root, None, extra)
        assert with_memo == from_nothing, f"seed {seed}, step {step}, change {what}"
        reused += memo.reused
        memo_text = memo.dumps()
    assert reused > 40  # folders decided from memory: the memo was trusted, not only dropped


def change(
    rng: random.Random,
    what: int,
    step: int,
    where: Path,
    folders: list[Path],
    files: list[Path],
    tmp_path: Path,
    root: Path,
) -> None:
    """One random change of the fuzz test (7, job.yml's patterns, is made by the caller)."""
    if what == 0:
        (where / rng.choice(NAMES)).write_text("x")
    elif what == 1 and files:
        rng.choice(files).unlink()
    elif what == 2:
        (where / rng.choice(FOLDERS)).mkdir(exist_ok=True)
        (where / rng.choice(FOLDERS) / rng.choice(NAMES)).parent.mkdir(exist_ok=True)
    elif what == 3 and len(folders) > 1:
        shutil.rmtree(rng.choice(folders[1:]))
    elif what == 4:
        at = rng.choice([root.parent, root.parent / ".git" / "info", *folders])
        name = "exclude" if at.name == "info" else rng.choice([".gitignore", ".monkeyignore"])
        lines = rng.sample(PATTERNS, rng.randrange(0, 4))
        (at / name).write_text("".join(f"{line}\n" for line in lines))
    elif what == 5:
        ignores = [p for p in [root.parent / ".gitignore", *files] if p.name.endswith("ignore")]
        if ignores:
            rng.choice(ignores).unlink(missing_ok=True)
    elif what == 6 and files:
        victim = rng.choice(files)  # a file becomes a folder of the same name
        victim.unlink()
        victim.mkdir()
        (victim / rng.choice(NAMES)).write_text("x")
    elif what == 8:
        link = where / f"link{step}"
        link.symlink_to(rng.choice([tmp_path, root / "src", where / "nowhere"]))


def test_a_damaged_memo_is_ignored(tmp_path: Path) -> None:
    root = project(tmp_path)
    settle()
    truth = found(root, None)
    for damaged in (
        "not json",
        "[1, 2]",
        '{"v": 1, "dirs": [1]}',
        '{"v": 1, "base": 5, "dirs": {"": "x", "src/": [null, [], [{"a": 1}], []]}}',
        '{"v": 1, "base": null, "dirs": {"": [null, [], [], [], []]}}',
        '{"v": 2, "dirs": {}}',
    ):
        assert found(root, WalkMemo(damaged)) == truth, damaged
