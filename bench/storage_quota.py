"""What the storage quota costs an upload to a main node (issue 41, finding 8): the server
counts what the uploading user holds (``monkey.facade.storage.held``) once per upload
request when a storage quota binds them. Measured in-process on a home where that user has
JOBS jobs (default 1,000) over SNAPSHOTS code snapshots (default 10) of FILES files each
(default 1,000, one file changed between snapshots), against gc's scan of what every job
references (``needed_blobs``, the same kind of work an admin's gc does). A home without
storage quotas pays nothing. `python bench/storage_quota.py [JOBS] [SNAPSHOTS] [FILES]`.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import fresh_home


def main() -> None:
    jobs = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    snapshots = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    files = int(sys.argv[3]) if len(sys.argv) > 3 else 1000
    home = fresh_home()
    from monkey.api import Monkey
    from monkey.facade.storage import held
    from monkey.snapshot.blobs import BlobStore
    from monkey.snapshot.manifest import needed_blobs

    m = Monkey(home)
    m.actor = "ana"
    project = Path(tempfile.mkdtemp(prefix="monkey-bench-storage-"))
    for i in range(files):
        (project / f"f{i}.py").write_text(f"x = {i}\n")
    for s in range(snapshots):
        (project / "changed.py").write_text(f"version = {s}\n")
        for _ in range(jobs // snapshots):
            m.run(["true"], workdir=str(project), start_core=False)
    blobs = BlobStore(m.home.blobs)
    quota, gc = [], []
    for _ in range(3):
        t = time.perf_counter()
        used = held(m.store, blobs, "ana")["ana"]
        quota.append(time.perf_counter() - t)
        t = time.perf_counter()
        needed_blobs(m.store, blobs)
        gc.append(time.perf_counter() - t)
    print(
        f"{jobs} jobs, {snapshots} snapshots of {files} files ({used:,} bytes held): "
        f"the upload's quota count {statistics.median(quota) * 1000:.0f} ms (median of 3), "
        f"gc's reference scan {statistics.median(gc) * 1000:.0f} ms"
    )


if __name__ == "__main__":
    main()
