"""Checking blobs against their digest on read: materialising a 5,000-file, 500 MB snapshot
with the check vs without, measured in the same run.

Target: at most 1.2x. A local run's start is the core's check of each blob then the agent's
copy of each into the run folder; a clone hashes the bytes as it copies them
(BlobStore.copy_out). The core hashes a blob before a start unless it checked it already
(a stat, while the blob's stat is unchanged) or the process that wrote it recorded the stat
it had when its bytes were hashed (`BlobStore.unchecked`, the submitter's stamp in the
blobs table): so the first start by a core that never saw them costs a query and a stat
per blob. Printed: the median of REPEAT alternated runs of each, with the page cache warm
for both (the blobs were just written): a first start of a submitter's blobs (the flow
every job takes), one of blobs with no stamp (stored by monkey before stamps, or changed
since: they are hashed, so this is the cost of blake3 itself), one of blobs a core checked
already, and a clone. Both the store and the run folders are in MONKEY_BENCH_DIR (default
/dev/shm, a tmpfs): the disk's writeback, which dominates a copy of 500 MB on a loaded
machine and makes the ratio look smaller, is left out.
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
    from monkey.client_agent.blobs import clone_file
    from monkey.snapshot import BlobStore
    from monkey.snapshot import blobs as blob_module
    from monkey.store.db import Store

    where = os.environ.get("MONKEY_BENCH_DIR", "/dev/shm" if os.path.isdir("/dev/shm") else None)
    root = Path(tempfile.mkdtemp(prefix="monkey-bench-verify-", dir=where))
    try:
        blobs = BlobStore(root / "blobs")
        store = Store(root / "monkey.db")
        files, rows = [], []
        for i in range(FILES):  # as a submission does: store each blob, then record them
            digest, _ = blobs.put_bytes(os.urandom(SIZE))
            files.append((f"pkg{i // 100:02d}/mod{i:04d}.bin", digest))
            rows.append((digest, SIZE))
        time.sleep(blob_module._RACY_CTIME_NS / 1e9)  # a submission of 500 MB takes longer
        store.add_blobs(blobs.stamped(rows))
        digests = [d for _, d in files]
        folders = sorted({rel.rpartition("/")[0] for rel, _ in files})

        def materialise(check: str, copy) -> None:  # type: ignore[no-untyped-def]
            out = Path(tempfile.mkdtemp(dir=root))
            for folder in folders:
                (out / folder).mkdir()
            if check == "new core":
                blob_module._verified.clear()  # a core that never checked them
            if check:
                stamps = store.blob_stamps if check != "no stamps" else lambda _: {}
                for digest, _size in blobs.unchecked(digests, stamps):
                    blobs.check(digest)
            for rel, digest in files:
                copy(digest, os.path.join(out, rel))
            shutil.rmtree(out)

        def agent_copy(digest: str, target: str) -> None:
            clone_file(os.fspath(blobs.path(digest)), target)

        def plain_copy(digest: str, target: str) -> None:
            shutil.copyfile(blobs.path(digest), target)

        def unstamped() -> None:
            blob_module._verified.clear()
            materialise("no stamps", agent_copy)

        runs: dict[str, list[float]] = {
            k: []
            for k in ("start", "start+check", "start+hash", "start+known", "clone", "clone+check")
        }
        materialise("", agent_copy)  # warm-up: page cache, folders
        for _ in range(REPEAT):
            runs["start"].append(timed(lambda: materialise("", agent_copy)))
            runs["start+check"].append(timed(lambda: materialise("new core", agent_copy)))
            runs["start+hash"].append(timed(unstamped))
            runs["start+known"].append(timed(lambda: materialise("known", agent_copy)))
            runs["clone"].append(timed(lambda: materialise("", plain_copy)))
            runs["clone+check"].append(timed(lambda: materialise("", blobs.copy_out)))
        med = {k: statistics.median(v) for k, v in runs.items()}
        print(f"{FILES:,} files, {FILES * SIZE / 1e6:.0f} MB; median of {REPEAT} alternated runs")
        for label, base, checked in (
            ("local start, new core", "start", "start+check"),
            ("  ... no stamps (hashed)", "start", "start+hash"),
            ("  ... checked by this core", "start", "start+known"),
            ("clone (write_files)", "clone", "clone+check"),
        ):
            ratio = med[checked] / med[base]
            target = (
                ""
                if "hashed" in label
                else f"  target <= 1.2x: {'ok' if ratio <= 1.2 else 'MISSED'}"
            )
            print(
                f"{label:28s} without {med[base]:.3f}s  with {med[checked]:.3f}s  "
                f"{ratio:.2f}x{target}"
            )
        sys.stdout.flush()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
