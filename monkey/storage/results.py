"""The core's side of results that workers upload themselves (cloud providers with a bucket).

Layout under ``runs/<juid>/results/`` and the manifest format: see
``monkey/client_agent/results.py``. The core gives each attempt an upload form and the GET
URLs of the newest manifest's checkpoint and persisted files (``start_fields``), and brings
an ended attempt's results from the bucket into MONKEY_HOME (``bring_back``) where the SSH
transport would have put them: ``runs/<juid>/checkpoint``, ``runs/<juid>/persist`` and the
attempt's ``work/`` for outputs. Both run in the core's workers (they call the bucket).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from monkey.client_agent import rundir
from monkey.models import MonkeyError
from monkey.storage.base import check_rel

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from monkey.config import Home
    from monkey.storage.base import Storage

FORM_EXPIRES = 7 * 24 * 3600  # the longest a SigV4 signature lives
KEPT = ("checkpoint", "persist")


def prefix(juid: str) -> str:
    return f"runs/{juid}/results"


def read_manifest(storage: Storage, juid: str) -> dict[str, Any] | None:
    """The newest manifest of the job's uploads, or None when nothing was uploaded."""
    with tempfile.TemporaryDirectory(prefix="monkey-manifest-") as tmp:
        path = Path(tmp) / "manifest.json"
        if not storage.get_file(f"{prefix(juid)}/manifest.json", path):
            return None
        try:
            manifest = json.loads(path.read_bytes())
            files = manifest["files"]
            for rel, (sha, size, mode) in files.items():
                check_rel(rel, prefix(juid))
                if not (isinstance(sha, str) and isinstance(size, int) and isinstance(mode, int)):
                    raise ValueError(rel)
        except (ValueError, KeyError, TypeError) as exc:
            raise MonkeyError(
                f"{prefix(juid)}/manifest.json is not a manifest monkey wrote "
                f"({exc}); delete it to start the job afresh"
            ) from None
        return manifest


def start_fields(
    storage: Storage,
    juid: str,
    attempt: int,
    dirs: dict[str, str],
    outputs: list[str],
    every: float,
) -> dict[str, Any]:
    """The ``results`` field of the agent's start of ATTEMPT: an upload form for the job's
    prefix, the instance's kept folders (DIRS: checkpoint, persist), the OUTPUTS globs, the
    period, and what to restore (the newest manifest's kept files, by presigned GET; a
    first attempt has none, and the bucket is not asked)."""
    manifest = read_manifest(storage, juid) if attempt > 1 else None
    restore = {}
    for rel, (sha, size, mode) in (manifest or {}).get("files", {}).items():
        if rel.split("/", 1)[0] in KEPT:
            restore[rel] = [storage.get_url(f"{prefix(juid)}/objects/{sha}"), size, sha, mode]
    form = storage.upload_form(prefix(juid), FORM_EXPIRES)
    return {
        "results": {
            **form,
            "prefix": prefix(juid),
            "every": every,
            "dirs": dirs,
            "outputs": outputs,
            "restore": restore,
        }
    }


def bring_back(storage: Storage, home: Home, juid: str, attempt: int, current: bool) -> int:
    """Make MONKEY_HOME's copies match the newest manifest: the kept folders when ATTEMPT
    is the job's CURRENT one, the outputs when the manifest is the attempt's own; returns
    the bytes fetched."""
    manifest = read_manifest(storage, juid)
    if manifest is None:
        return 0
    places: dict[str, Path] = {}
    if current:
        places.update({name: home.runs / juid / name for name in KEPT})
    if manifest.get("attempt") == attempt:
        places["outputs"] = home.run_dir(juid, attempt) / rundir.WORK
    wanted: dict[Path, tuple[str, int, int]] = {}
    for rel, (sha, size, mode) in manifest["files"].items():
        top, _, rest = rel.partition("/")
        if top in places:
            wanted[places[top] / rest] = (sha, size, mode)
    fetched = 0
    for path, (sha, size, mode) in sorted(wanted.items()):
        if _sha(path) == sha:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.monkey-tmp")
        if not storage.get_file(f"{prefix(juid)}/objects/{sha}", tmp):
            raise MonkeyError(f"{prefix(juid)}/objects/{sha} is missing from the bucket")
        os.chmod(tmp, mode & 0o777)
        os.replace(tmp, path)
        fetched += size
    for name in KEPT if current else ():
        root = home.runs / juid / name
        for path in sorted(root.rglob("*"), reverse=True) if root.is_dir() else []:
            if path.is_file() and path not in wanted:
                path.unlink()
            elif path.is_dir() and not any(path.iterdir()):
                path.rmdir()
    return fetched


def read_left(
    storage: Storage, home: Home, juid: str, attempt: int, offset: int
) -> tuple[str, list[tuple[int, dict[str, Any]]]] | None:
    """What the agent of a machine that powered itself off left of ATTEMPT (see
    client_agent.results.leave), or None when it left nothing: MONKEY_HOME's copies of the
    attempt's logs get the bytes they lack (from their local size, as over SSH: no line
    lost or doubled); returns why the agent powered the machine off and the events after
    byte OFFSET of its events.jsonl, each with the offset just after it."""
    base = f"{prefix(juid)}/left/{attempt}"
    with tempfile.TemporaryDirectory(prefix="monkey-left-") as tmp:
        path = Path(tmp) / "record.json"
        if not storage.get_file(f"{base}/record.json", path):
            return None
        try:
            record = json.loads(path.read_bytes())
            why, files = str(record["why"]), dict(record["files"])
        except (ValueError, KeyError, TypeError) as exc:
            raise MonkeyError(f"{base}/record.json is not a record monkey wrote ({exc})") from None
        events: list[tuple[int, dict[str, Any]]] = []
        local = home.run_dir(juid, attempt)
        local.mkdir(parents=True, exist_ok=True)
        for name in rundir.LEFT:
            size = files.get(name)
            mine = local / name
            have = (
                offset if name == rundir.EVENTS else (mine.stat().st_size if mine.exists() else 0)
            )
            if not isinstance(size, int) or size <= have:
                continue  # nothing the core lacks
            got = Path(tmp) / name
            if not storage.get_file(f"{base}/{name}", got):
                raise MonkeyError(f"{base}/{name} is missing from the bucket")
            if name == rundir.EVENTS:
                for end, line in rundir.read_lines_after(str(got), offset):
                    try:
                        event = json.loads(line)
                    except ValueError:  # torn: an agent killed while writing it
                        continue
                    if end <= size and isinstance(event, dict):
                        events.append((end, event))
                continue
            with open(got, "rb") as src, open(mine, "ab") as out:
                src.seek(have)
                left = size - have
                while left > 0 and (chunk := src.read(min(left, 1 << 20))):
                    out.write(chunk)
                    left -= len(chunk)
        return why, events


def _sha(path: Path) -> str | None:
    try:
        digest = hashlib.sha256()
        with open(path, "rb") as src:
            while chunk := src.read(1 << 20):
                digest.update(chunk)
        return digest.hexdigest()
    except OSError:
        return None
