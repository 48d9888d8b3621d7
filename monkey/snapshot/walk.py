"""Walking a folder for a snapshot or dataset: the .gitignore / .monkeyignore rules and the
files they leave in."""

from __future__ import annotations

import json
import os
import re
import stat
import time
from collections.abc import Callable, Sequence

from monkey.models import MonkeyError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from pathspec import GitIgnoreSpec

# The stat cache does not remember files modified this recently (the "racy git" problem):
# an edit landing in the same timestamp tick as our stat would otherwise go unnoticed.
_RACY_NS = 2_000_000_000


class _Rules:
    """One ignore file's patterns, applied to paths relative to the folder holding it."""

    __slots__ = ("spec", "quick", "strip", "prefix")

    def __init__(self, spec: GitIgnoreSpec, strip: int, prefix: str) -> None:
        self.spec = spec
        self.strip = strip  # characters of the walk-relative path to drop ...
        self.prefix = prefix  # ... and what to put in front, giving the file-relative path
        self.quick = _prefilter(spec)

    def check(self, rel: str) -> bool | None:
        """True if ignored, False if re-included by a negation, None if no pattern matches."""
        path = self.prefix + rel[self.strip :] if (self.strip or self.prefix) else rel
        if self.quick is not None and self.quick.match(path) is None:
            return None
        return self.spec.check_file(path).include


_ANY_DIR = "^(?:.+/)?"


def _prefilter(spec: GitIgnoreSpec) -> re.Pattern[str] | None:
    """One regex matching whenever any pattern does, so most paths skip the per-pattern loop.

    Patterns that may match at any depth share a single ``^(?:.+/)?`` prefix, which keeps
    the backtracking to one pass per path."""
    anywhere, anchored = [], []
    for pattern in spec.patterns:
        regex = getattr(pattern, "regex", None)
        if getattr(pattern, "include", None) is None or regex is None:
            continue
        source = regex.pattern
        if not isinstance(source, str) or not source.startswith("^") or regex.flags & ~re.UNICODE:
            return None
        source = re.sub(r"\(\?P<\w+>", "(?:", source)
        if source.startswith(_ANY_DIR):
            anywhere.append(f"(?:{source[len(_ANY_DIR) :]})")
        else:
            anchored.append(f"(?:{source})")
    if anywhere:
        anchored.append(f"(?:{_ANY_DIR}(?:{'|'.join(anywhere)}))")
    if not anchored:
        return re.compile(r"(?!)")
    try:
        return re.compile("|".join(anchored))
    except re.error:
        return None


# Ignore files parsed by this process: (path, strip, prefix, extra) -> (the file's size,
# mtime, ctime and inode when read, or None when missing; its rules). An entry is used
# only while the file's stat is the same, and never kept for a file changed in the racy
# window (ctime, which no tool can set back, is checked too).
_RulesKey = tuple[str, int, str, tuple[str, ...]]
_parsed: dict[_RulesKey, tuple[tuple[int, int, int, int] | None, _Rules | None]] = {}
_PARSED_MAX = 1024


def _load_rules(path: str, strip: int, prefix: str, extra: Sequence[str] = ()) -> _Rules | None:
    """The patterns of the ignore file PATH (if any) followed by EXTRA patterns."""
    try:
        st = os.stat(path)
        stamp: tuple[int, int, int, int] | None = (
            st.st_size,
            st.st_mtime_ns,
            st.st_ctime_ns,
            st.st_ino,
        )
    except OSError:
        if not extra:
            return None
        stamp = None
    key = (path, strip, prefix, tuple(extra))
    known = _parsed.get(key)
    if known is not None and known[0] == stamp:
        return known[1]
    text = ""
    if stamp is not None:
        try:
            with open(path, "rb") as f:
                text = f.read().decode("utf-8", "surrogateescape")
        except OSError:
            if not extra:
                return None
            stamp = None
    rules = _parse_rules(text, extra, strip, prefix)
    if stamp is None or max(stamp[1], stamp[2]) < time.time_ns() - _RACY_NS:
        if len(_parsed) >= _PARSED_MAX:
            _parsed.clear()
        _parsed[key] = (stamp, rules)
    return rules


def _parse_rules(text: str, extra: Sequence[str], strip: int, prefix: str) -> _Rules | None:
    # pathspec is imported only when there are rules: it loads asyncio (~16 ms) on import.
    from pathspec import GitIgnoreSpec

    spec = GitIgnoreSpec.from_lines([*text.splitlines(), *extra])
    if not any(getattr(p, "include", None) is not None for p in spec.patterns):
        return None
    return _Rules(spec, strip, prefix)


def _ancestor_files(root: str, top: str | None) -> list[tuple[str, str]]:
    """(path, prefix) of the ignore files that may apply above ``root`` up to TOP, the top
    of its repository (None: outside one): .git/info/exclude and each .gitignore, whether
    they exist or not."""
    if top is None:
        return []
    rel_top = os.path.relpath(root, top).replace(os.sep, "/")
    found = [
        (os.path.join(top, ".git", "info", "exclude"), "" if rel_top == "." else rel_top + "/")
    ]
    here = top
    parts = [] if rel_top == "." else rel_top.split("/")
    for i in range(len(parts)):
        found.append((os.path.join(here, ".gitignore"), "/".join(parts[i:]) + "/"))
        here = os.path.join(here, parts[i])
    return found


def _ignored(chain: tuple[_Rules, ...], first: _Rules | None, rel: str) -> bool:
    if first is not None:
        verdict = first.check(rel)
        if verdict is not None:
            return verdict
    for rules in reversed(chain):  # deeper ignore files override shallower ones
        verdict = rules.check(rel)
        if verdict is not None:
            return verdict
    return False


def _matcher(chain: tuple[_Rules, ...], first: _Rules | None) -> Callable[[str], bool] | None:
    """A function telling whether a walk-relative path is ignored (None: nothing is)."""
    if first is None and not chain:
        return None
    if first is None and len(chain) == 1 and not chain[0].strip and not chain[0].prefix:
        only = chain[0]  # the common case: a single top-level .gitignore
        quick, spec = only.quick, only.spec
        if quick is not None:
            return lambda rel: quick.match(rel) is not None and spec.check_file(rel).include is True
    return lambda rel: _ignored(chain, first, rel)


_Stamp = list[int] | None  # an ignore file's size, mtime, ctime and inode; None: absent
_Source = tuple[str, int, str, tuple[str, ...]]  # an ignore file: _load_rules' arguments


def _stamp(path: str) -> _Stamp:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


class WalkMemo:
    """What a code walk's ignore files decided, kept between commands (as git's untracked
    cache): a folder whose entries and whose ignore files, its own and those above it, are
    all unchanged since reuses the decisions, so a walk where nothing that decides changed
    parses no ignore file (pathspec's import alone is ~25 ms of `monkey run`).

    ``data`` is what ``dumps`` gave last time (None: nothing known). Folders and ignore
    files changed in the racy window are not remembered."""

    def __init__(self, data: str | None = None) -> None:
        self.old: dict[str, Any] = {}
        if data:
            try:
                old = json.loads(data)
            except ValueError:
                old = None
            if isinstance(old, dict) and old.get("v") == 1 and isinstance(old.get("dirs"), dict):
                old["dirs"] = {k: v for k, v in old["dirs"].items() if _well_formed(v)}
                self.old = old
        self.new: dict[str, Any] = {"v": 1, "base": None, "dirs": {}}
        self.racy_after = time.time_ns() - _RACY_NS
        self.reused = 0  # folders this walk decided from memory

    @property
    def changed(self) -> bool:
        """Whether this walk learnt something the last one did not know."""
        return self.new != self.old

    def dumps(self) -> str:
        return json.dumps(self.new, separators=(",", ":"))

    def settled(self, stamps: list[_Stamp]) -> bool:
        """Whether none of STAMPS changed in the racy window (then they can be kept)."""
        return all(st is None or max(st[1], st[2]) < self.racy_after for st in stamps)


def _well_formed(known: Any) -> bool:
    """Whether KNOWN is a folder's record as _decide writes it (a damaged one is dropped)."""
    return (
        isinstance(known, list)
        and len(known) == 4
        and (known[0] is None or isinstance(known[0], list))
        and isinstance(known[1], list)
        and all(
            isinstance(names, list) and all(isinstance(n, str) for n in names)
            for names in known[2:]
        )
    )


# What monkey itself writes into a project when a script runs outside a job (monkey.log's
# file; checkpoint_dir() ignores itself): never code, at any depth. By name, not by pattern:
# a pattern would load pathspec at every submission. (The name is the agent's
# rundir.OUTSIDE_METRICS, written out: importing the agent's module would cost every `monkey
# run` its code; test_what_monkey_writes_outside_a_job_is_not_code checks they agree.)
MONKEY_FILES = frozenset({"monkey-metrics.jsonl"})


def _walk(
    root: str,
    *,
    ignore: bool,
    follow_dirs: bool,
    skip: frozenset[str] = frozenset(),
    extra_ignore: Sequence[str] = (),
    links: list[tuple[str, str]] | None = None,
    top: str | None = None,
    memo: WalkMemo | None = None,
) -> list[tuple[str, str, os.stat_result]]:
    """Regular files under ``root`` as (relative POSIX path, absolute path, stat); folders
    whose absolute path is in ``skip`` are left out; ``extra_ignore`` patterns count as
    lines of the root .monkeyignore; with ``ignore``, the ignore files from ``top`` (the
    top of the repository holding ``root``) down apply, their decisions taken from and
    kept in ``memo`` when given. With a ``links`` list, symlinks leading out of ``root``
    are not followed but appended to it as (relative path, link target)."""
    out: list[tuple[str, str, os.stat_result]] = []
    inside = root.rstrip("/") + "/"
    # Ignore files as (path, strip, prefix, extra), parsed only for a folder deciding anew.
    first_src = (os.path.join(root, ".monkeyignore"), 0, "", tuple(extra_ignore))
    chain: tuple[_Source, ...] = ()
    base_fresh = False
    if ignore:
        ancestors = _ancestor_files(root, top)
        chain = tuple((path, 0, prefix, ()) for path, prefix in ancestors)
        if memo is not None:
            stamps = [_stamp(p) for p, _ in ancestors] + [_stamp(first_src[0])]
            base = [top, list(extra_ignore), stamps]
            base_fresh = memo.old.get("base") == base
            memo.new["base"] = base if memo.settled(stamps) else None
    parsed: dict[tuple[Any, ...], tuple[_Rules, ...]] = {}

    def rules_of(sources: tuple[_Source, ...]) -> tuple[_Rules, ...]:
        if sources not in parsed:
            parsed[sources] = tuple(r for src in sources if (r := _load_rules(*src)) is not None)
        return parsed[sources]

    seen: set[tuple[int, int]] = set()
    linked: list[str] = []  # symlinked folders left out of a code snapshot
    if follow_dirs:
        st = os.stat(root)
        seen.add((st.st_dev, st.st_ino))
    stack: list[tuple[str, str, tuple[Any, ...], bool]] = [(root, "", chain, base_fresh)]
    while stack:
        folder, prefix, chain, fresh = stack.pop()
        try:
            with os.scandir(folder) as it:
                entries = list(it)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise MonkeyError(
                f"cannot read folder {folder} ({exc.strerror}); fix its permissions "
                "or list it in .monkeyignore"
            ) from None
        as_file: set[str] = set()  # names ignored as a file, and as a folder
        as_dir: set[str] = set()
        if ignore:
            # A folder's .monkeyignore overrides its .gitignore; the root one is `first`.
            names = (".gitignore", ".monkeyignore") if prefix else (".gitignore",)
            found = {e.name: e.path for e in entries if e.name in names}
            own: list[_Source] = [(found[n], len(prefix), "", ()) for n in names if n in found]
            chain = (*chain, *own)
            fresh, as_file, as_dir = _decide(
                memo,
                folder,
                prefix,
                entries,
                own,
                fresh,
                lambda c=chain: (rules_of(c), rules_of((first_src,))),  # type: ignore[misc]
            )
        for entry in entries:
            name = entry.name
            if name == ".git":
                continue
            rel = prefix + name
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                continue
            if is_dir:
                if name in as_dir:
                    continue
                if entry.path in skip:
                    continue
                if follow_dirs:
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    key = (st.st_dev, st.st_ino)
                    if key in seen:
                        continue
                    seen.add(key)
                stack.append((entry.path, rel + "/", chain, fresh))
                continue
            if name in as_file or (ignore and name in MONKEY_FILES):
                continue
            if links is not None and entry.is_symlink():
                target = _outside_link(entry.path, inside)
                if target is not None:
                    if not (name in as_dir and os.path.isdir(entry.path)):
                        links.append((rel, target))
                    continue
            try:
                st = entry.stat()  # follows symlinks: a link to a file stores the target
            except OSError:
                continue  # broken symlink, or gone since listed
            if stat.S_ISREG(st.st_mode):
                out.append((rel, entry.path, st))
            elif follow_dirs and stat.S_ISDIR(st.st_mode):
                key = (st.st_dev, st.st_ino)
                if key not in seen:
                    seen.add(key)
                    stack.append((entry.path, rel + "/", chain, fresh))
            elif stat.S_ISDIR(st.st_mode) and name not in as_dir:
                linked.append(rel)
            # other kinds (sockets, fifos, devices, links to folders in code) are skipped
    if linked:  # the job would miss them without a word: say so (once per run)
        import logging

        logging.getLogger("monkey").warning(
            "monkey: the job does not get symlinked folder(s) %s; pass data with --dataset "
            "PATH, or list them in .monkeyignore",
            ", ".join(sorted(linked)[:3])
            + (f" and {len(linked) - 3} more" if len(linked) > 3 else ""),
        )
    return out


def _decide(
    memo: WalkMemo | None,
    folder: str,
    prefix: str,
    entries: list[os.DirEntry[str]],
    own: list[_Source],
    fresh: bool,
    rules: Callable[[], tuple[tuple[_Rules, ...], tuple[_Rules, ...]]],
) -> tuple[bool, set[str], set[str]]:
    """(whether the ignore files down to this folder are all as remembered, the names of
    its ENTRIES ignored as a file, those ignored as a folder): remembered when the folder
    and those files are unchanged, else decided by RULES (() -> the chain, the root
    .monkeyignore) and remembered. FRESH: the files above it are as remembered; OWN: its
    own ignore files."""
    known = memo.old.get("dirs", {}).get(prefix) if memo is not None else None
    own_stamps = [_stamp(src[0]) for src in own]
    fresh = fresh and known is not None and known[1] == own_stamps
    try:
        st = os.stat(folder)
        here: list[int] | None = [st.st_ctime_ns, st.st_ino]  # ctime: no tool sets it back
    except OSError:
        here = None
    if memo is not None and known is not None and fresh and here is not None and known[0] == here:
        as_file, as_dir = set(known[2]), set(known[3])
        memo.reused += 1
    else:
        chain, first = rules()
        ignored = _matcher(chain, first[0] if first else None)
        as_file, as_dir = set(), set()
        if ignored is not None:
            for entry in entries:
                rel = prefix + entry.name
                try:
                    is_dir = entry.is_dir(follow_symlinks=False)
                except OSError:
                    continue
                if not is_dir and ignored(rel):
                    as_file.add(entry.name)
                if (is_dir or entry.is_symlink()) and ignored(rel + "/"):
                    as_dir.add(entry.name)
    if memo is not None:
        if here is not None and here[0] >= memo.racy_after:
            here = None  # an entry may change within the same tick: decide again next time
        if memo.settled(own_stamps):
            memo.new["dirs"][prefix] = [here, own_stamps, sorted(as_file), sorted(as_dir)]
    return fresh, as_file, as_dir


def _outside_link(path: str, inside: str) -> str | None:
    """The target of the symlink PATH when it resolves outside the folder INSIDE ("/"
    ended), else None (also when it cannot be read)."""
    real = os.path.realpath(path)
    if (real + "/").startswith(inside):
        return None
    try:
        return os.readlink(path)
    except OSError:
        return None


def _existing(path: str | os.PathLike[str], what: str, hint: str) -> str:
    """The real path of PATH; MonkeyError saying WHAT it is and the HINT when it does not
    exist (a symlink loop does not either)."""
    resolved = os.path.realpath(os.path.expanduser(path))
    try:
        os.stat(resolved)
    except OSError:
        raise MonkeyError(f"{what} {path} does not exist; {hint}") from None
    return resolved
