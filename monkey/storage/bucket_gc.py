"""`rm` and `gc` in a cloud provider's bucket (called by the core, see monkey/core/cleanup.py):
a deleted job's ``runs/<juid>/`` objects, and blobs and packs no job needs.

Several homes may share a bucket: each home's gc writes the digests its jobs need to
``needed/<tag>`` first, and a blob any home's list names stays. A blob or pack written in
the last GRACE seconds stays too (a submission or a start may be using it); packs are only
a cache of blobs, made again when a start needs one.
"""

from __future__ import annotations

import time

from monkey.storage.bucket import BucketStorage


def clean(
    storage: BucketStorage, runs: list[str], keep: list[str] | None, grace: float, tag: str
) -> dict[str, int]:
    """Delete RUNS' objects and, unless KEEP is None, the blobs (and packs) no home needs,
    older than GRACE seconds; what was freed, as SSH hosts report it."""
    freed = {
        "runs": 0,
        "run_bytes": 0,
        "blobs": 0,
        "blob_bytes": 0,
        "partial": 0,
        "partial_bytes": 0,
    }
    for juid in runs:
        prefix = f"runs/{juid}"
        with storage._errors(f"listing {prefix}"):
            found = [
                (k, size)
                for k, size in storage._list(prefix)
                if k == prefix or k.startswith(prefix + "/")
            ]
        if found:
            storage._delete_keys([k for k, _ in found], prefix)
            freed["runs"] += 1
            freed["run_bytes"] += sum(size for _, size in found)
    if keep is None:
        return freed
    needed = set(keep)
    mine = f"needed/{tag}"
    with storage._errors("recording the blobs this home needs"):
        storage._put_bytes(mine, "".join(f"{d}\n" for d in sorted(needed)).encode())
        for key, _ in list(storage._list("needed/")):
            if key != mine:
                needed.update((storage._get_bytes(key) or b"").decode(errors="replace").split())
    cut = time.time() - grace
    with storage._errors("listing blobs"):
        blobs = [
            (k, size)
            for k, size, at in storage._list_dated("blobs/")
            if at <= cut and k[len("blobs/") :] not in needed
        ]
        packs = [(k, size) for k, size, at in storage._list_dated("packs/") if at <= cut]
    for doomed, prefix in ((blobs, "blobs/"), (packs, "packs/")):
        if doomed:
            storage._delete_keys([k for k, _ in doomed], prefix)
    with storage._lock:
        storage._known.clear()  # what is stored is asked again
    freed["blobs"] = len(blobs) + len(packs)
    freed["blob_bytes"] = sum(size for _, size in blobs + packs)
    return freed
