"""Datasets: a file, or every file of a folder, stored as a manifest named by its digest."""

from __future__ import annotations

import os
import re
import stat
import time
from pathlib import Path

from monkey.models import MonkeyError, later_pattern
from monkey.snapshot.blobs import BlobStore
from monkey.snapshot.manifest import Dataset, _size_check, _store_files
from monkey.snapshot.walk import _existing, _walk
from monkey.store.db import Store

_NAME_RE = later_pattern(r"[A-Za-z_][A-Za-z0-9_]*")


def parse_dataset_spec(spec: str, base: Path | None = None) -> tuple[str, str | None]:
    """Split ``PATH[:NAME]`` into (path, upper-cased name or None).

    The split happens at the last colon only when what follows is a valid name
    (``[A-Za-z_][A-Za-z0-9_]*``), so ``a:b/c.csv`` is a path. A path that exists as written
    (colon and all) while the part before the colon does not is kept whole."""
    head, sep, tail = spec.rpartition(":")
    if sep and head and _NAME_RE.fullmatch(tail):
        if not (os.path.lexists(_join(base, spec)) and not os.path.lexists(_join(base, head))):
            return head, tail.upper()
    return spec, None


def _join(base: Path | None, path: str) -> str:
    path = os.path.expanduser(path)
    return os.path.join(base, path) if base is not None else path


def dataset_name(path: str, is_file: bool) -> str:
    """The default dataset name: the basename (stem for a file), upper-cased, with every
    non-alphanumeric character replaced by ``_``."""
    base = os.path.basename(os.path.abspath(path))
    if is_file:
        base = Path(base).stem
    return re.sub(r"[^A-Za-z0-9]", "_", base).upper() or "DATA"


def dataset(
    spec: str, blobs: BlobStore, store: Store, base: Path | None = None, yes: bool = False
) -> Dataset:
    """Store a dataset given as ``PATH[:NAME]`` (a file, or every file of a folder).

    Relative paths are taken from ``base`` (default: the current folder). A folder dataset
    takes all files recursively (``.git`` skipped, no ignore rules; symlinked folders are
    followed, each folder once). A single file's manifest entry is named by its basename.
    The digest is the manifest's, so identical data gets the same digest wherever it
    lives; blobs are stored once."""
    raw, name = parse_dataset_spec(spec, base)
    target = _join(base, raw)
    head, sep, tail = spec.rpartition(":")
    if name is None and sep and not os.path.lexists(target) and os.path.lexists(_join(base, head)):
        raise MonkeyError(
            f"dataset {spec}: name {tail!r} is not valid; use letters, digits "
            f"and _, not starting with a digit, e.g. {head}:train"
        )
    since = time.time_ns()
    root = _existing(target, "dataset", "check the path given to --dataset")
    st = os.stat(root)
    single = not stat.S_ISDIR(st.st_mode)
    if single:
        if not stat.S_ISREG(st.st_mode):
            raise MonkeyError(
                f"dataset {target} is not a regular file or folder; "
                "check the path given to --dataset"
            )
        found = [(os.path.basename(os.path.abspath(target)), root, st)]
    else:
        found = _walk(root, ignore=False, follow_dirs=True)
    with _size_check(found, "dataset", root, yes) as tick:
        files, new, digest, size = _store_files(found, blobs, store, since, tick=tick)
    return Dataset(
        name=name or dataset_name(target, single),
        digest=digest,
        single=single,
        files=files,
        new_blobs=new,
        size=size,
    )
