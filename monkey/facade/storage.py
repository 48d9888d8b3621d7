"""What each user stores on a main node, against their storage quota (issue 41, finding 8):
`monkey server quota set ana --storage 50G`, shown in `server quota list` and `du`.

A user holds a blob when one of their jobs names it (its code and the files its file list
names, datasets, data folders, git diff, packages, set-up files: what gc keeps for that job)
or when they uploaded it less than the gc grace ago (after that an upload no job names is
reclaimed: see ``monkey.server.reclaim``). A blob two users hold counts for each of them:
nobody can push bytes onto another user's account, and removing one's own jobs always
lowers one's own use. An upload beyond the quota is refused before its bytes are read (see
``monkey.server.blobs``); a submission naming blobs already stored is not, but counts."""

from __future__ import annotations

import os
import time

from monkey.models import MonkeyError, human_size

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from monkey.snapshot.blobs import BlobStore
    from monkey.store import Store

GRACE = 3600.0  # gc's default grace (`monkey gc --grace`)


def grace() -> float:
    """Seconds an upload no job names is kept and counted: MONKEY_GC_GRACE (an age such as
    1h or 90s, as `gc --grace` takes), default 1h."""
    from monkey.housekeeping import parse_age

    text = os.environ.get("MONKEY_GC_GRACE")
    if not text:
        return GRACE
    try:
        return parse_age(text)
    except MonkeyError:
        raise MonkeyError(
            f"MONKEY_GC_GRACE={text!r} is not an age; give one such as 1h or 90s"
        ) from None


def held(
    store: Store, blobs: BlobStore, user: str | None = None, now: float | None = None
) -> dict[str | None, int]:
    """Bytes of blobs each user holds (USER's only when given; see the module's docstring)."""
    from monkey.snapshot.manifest import with_listed

    since = (time.time() if now is None else now) - grace()
    by_user: dict[str | None, set[str]] = {}
    known: dict[str, list[str]] = {}
    for owner, digests in store.owner_digests(user).items():
        by_user[owner] = with_listed(blobs, digests, known)
    for who, digests in store.uploads_since(since, user).items():
        by_user.setdefault(who, set()).update(digests)
    sizes = store.blob_sizes(set().union(*by_user.values()) if by_user else set())
    return {who: sum(sizes.get(d, 0) for d in digests) for who, digests in by_user.items()}


def storage_rows(store: Store, blobs: BlobStore) -> list[dict[str, Any]]:
    """`du`'s per-user lines on a main node: [{"user", "used", "limit"}] for the server's
    users and every owner holding blobs (limit None: none); [] on a home without users
    or storage quotas."""
    from monkey.store.quotas import storage_limit

    quotas = store.quotas()
    users = {u["name"] for u in store.users()}
    if not users and not any(q.get("storage") is not None for q in quotas):
        return []
    used = held(store, blobs)
    names = sorted(users | {u for u in used if u is not None})
    return [{"user": u, "used": used.get(u, 0), "limit": storage_limit(quotas, u)} for u in names]


def over_quota(user: str, used: int, limit: int, adding: int) -> str:
    """The line refusing USER's upload of ADDING bytes while USED of LIMIT are held."""
    return (
        f"storage quota of {user}: {human_size(used)} held of {human_size(limit)}, and this "
        f"upload adds {human_size(adding)}; remove jobs you no longer need (`monkey rm`; "
        f"their blobs go after the gc grace), or ask an admin: monkey server quota set "
        f"{user} --storage SIZE"
    )
