"""Checking blobs against their digest on read: materialising a 5,000-file, 500 MB snapshot
with the check vs without, measured in the same run.

Target: at most 1.2x. A local run's start is the core's check of each blob (blake3, see
BlobStore.check; once per core process while the blob's stat stays the same) then the
agent's copy of each into the run folder; a clone hashes the bytes as it copies them
(BlobStore.copy_out). Printed: the median of REPEAT alternated runs of each, with the
page cache warm for both (the blobs were just written), and the check's cost once a core
has checked the blobs already (a stat each). Both the store and the run folders are in
MONKEY_BENCH_DIR (default /dev/shm, a tmpfs): the disk's writeback, which dominates a copy
of 500 MB on a loaded machine and makes the ratio look smaller, is left out.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import compile_repo

FILES = 5_000
SIZE = 100_000  # 5,000 x 100 kB = 500 MB
REPEAT = 3


def timed(fn) -> float:  # type: ignore[no-untyped-def]
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    compile_repo()
    from monkey import snapshot
    from monkey.client_agent.agent import clone_file
    from monkey.snapshot import BlobStore

    where = os.environ.get("MONKEY_BENCH_DIR", "/dev/shm" if os.path.isdir("/dev/shm") else None)
    root = Path(tempfile.mkdtemp(prefix="monkey-bench-verify-", dir=where))
    try:
        blobs = BlobStore(root / "blobs")
        files = []
        for i in range(FILES):
            digest, _ = blobs.put_bytes(os.urandom(SIZE))
            files.append((f"pkg{i // 100:02d}/mod{i:04d}.bin", digest))
        folders = sorted({rel.rpartition("/")[0] for rel, _ in files})

        def materialise(check: bool, copy) -> None:  # type: ignore[no-untyped-def]
            out = Path(tempfile.mkdtemp(dir=root))
            for folder in folders:
                (out / folder).mkdir()
            if check:
                for _rel, digest in files:
                    blobs.check(digest)
            for rel, digest in files:
                copy(digest, os.path.join(out, rel))
            shutil.rmtree(out)

        def agent_copy(digest: str, target: str) -> None:
            clone_file(os.fspath(blobs.path(digest)), target)

        def plain_copy(digest: str, target: str) -> None:
            shutil.copyfile(blobs.path(digest), target)

        runs: dict[str, list[float]] = {k: [] for k in ("start", "start+check", "start+known",
                                                        "clone", "clone+check")}  # fmt: skip
        materialise(False, agent_copy)  # warm-up: page cache, folders
        for _ in range(REPEAT):
            runs["start"].append(timed(lambda: materialise(False, agent_copy)))
            snapshot._verified.clear()  # a core that never checked them
            runs["start+check"].append(timed(lambda: materialise(True, agent_copy)))
            runs["start+known"].append(timed(lambda: materialise(True, agent_copy)))
            runs["clone"].append(timed(lambda: materialise(False, plain_copy)))
            runs["clone+check"].append(timed(lambda: materialise(False, blobs.copy_out)))
        med = {k: statistics.median(v) for k, v in runs.items()}
        print(f"{FILES:,} files, {FILES * SIZE / 1e6:.0f} MB; median of {REPEAT} alternated runs")
        for label, base, checked in (("local start (agent copy)", "start", "start+check"),
                                     ("  ... blobs checked before", "start", "start+known"),
                                     ("clone (write_files)", "clone", "clone+check")):
            ratio = med[checked] / med[base]
            print(f"{label:28s} without {med[base]:.3f}s  with {med[checked]:.3f}s  "
                  f"{ratio:.2f}x  target <= 1.2x: {'ok' if ratio <= 1.2 else 'MISSED'}")
        sys.stdout.flush()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
