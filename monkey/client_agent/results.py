"""Results through a bucket: an attempt's checkpoint, persisted folders and outputs sent to
the provider's bucket by the agent, and restored from it before the next attempt starts.

Standard library only (copied to workers with the agent). Workers hold no credentials: the
core gives each attempt an upload form (a presigned POST policy scoped to the key prefix
``runs/<juid>/``, or a ``file://`` folder for a storage on this machine) and a presigned GET
URL per object to restore. Keys under the prefix:

    objects/<sha256>                 a file's content (never overwritten: content-addressed)
    manifests/<attempt>-<seq>.json   one consistent set: {"juid", "attempt", "seq", "ts",
                                     "final", "files": {rel: [sha256, size, mode]}}
    manifest.json                    a copy of the newest manifest (the switch)

    left/<attempt>/<name>            the attempt's run-dir files (rundir.LEFT), put there
                                     by an agent that powers its machine off before the
                                     core fetched the attempt (``leave``)
    left/<attempt>/record.json       then: {"why", "ts", "files": {name: size}}

``rel`` is ``checkpoint/<path>``, ``persist/<name>/<path>`` or ``outputs/<path>`` (outputs
are sent with the final upload only). A file is copied to a temporary file while it is
hashed; one that changed during the copy keeps its previous entry (or is left out), so a
manifest never names a torn file. Objects go first, then the numbered manifest, then
``manifest.json``: a reader always finds every object its manifest names.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import stat
import tempfile
import threading
import time
import urllib.parse
import urllib.request
import uuid

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

TIMEOUT = 60.0  # seconds one request may stall
Entry = tuple[int, int, str, int]  # size, mtime_ns, sha256, mode


class Results:
    """The uploads of one attempt (thread-safe: one upload at a time)."""

    def __init__(
        self, cfg: dict[str, Any], juid: str, attempt: int, work: str, seq_path: str = ""
    ) -> None:
        """SEQ_PATH: where the number of the last manifest is kept (an agent that adopts
        the attempt numbers its manifests on from there)."""
        self.url = str(cfg["url"])
        self.fields = {str(k): str(v) for k, v in (cfg.get("fields") or {}).items()}
        self.prefix = str(cfg["prefix"]).rstrip("/") + "/"
        self.every = max(1.0, float(cfg.get("every", 60)))
        self.dirs = {str(k): str(v) for k, v in (cfg.get("dirs") or {}).items()}
        self.outputs = [str(g) for g in cfg.get("outputs") or []]
        self.juid, self.attempt, self.work = juid, attempt, work
        self.known: dict[str, Entry] = {}  # rel -> what was uploaded (or restored)
        self.stored: set[str] = set()  # digests under objects/
        self.seq_path = seq_path
        self.seq = _read_int(seq_path)
        self.lock = threading.Lock()
        self.next_at = time.monotonic() + self.every
        self.last: dict[str, Any] | None = None

    # -- restore ---------------------------------------------------------------------------

    def restore(self, files: Any) -> int:
        """Make the kept folders (made when missing) hold the FILES of a manifest ({rel:
        [url, size, sha, mode]}) and nothing else, fetching those that differ; returns the
        bytes fetched. OSError/ValueError when one cannot be had."""
        fetched = 0
        for root in self.dirs.values():
            os.makedirs(root, 0o700, exist_ok=True)
        wanted = set()
        for rel, (url, size, sha, mode) in sorted((files or {}).items()):
            path = self._path(rel)
            if path is None:
                raise ValueError(f"bad restore path {rel!r}")
            wanted.add(path)
            os.makedirs(os.path.dirname(path), 0o700, exist_ok=True)
            if not _same(path, size, sha):
                fd, tmp = tempfile.mkstemp(prefix=".monkey-", dir=os.path.dirname(path))
                try:
                    with (
                        os.fdopen(fd, "wb") as out,
                        urllib.request.urlopen(url, timeout=TIMEOUT) as src,
                    ):
                        shutil.copyfileobj(src, out, 1 << 20)
                    if os.path.getsize(tmp) != size:
                        raise ValueError(f"{rel}: {os.path.getsize(tmp)} bytes instead of {size}")
                    os.chmod(tmp, mode & 0o777)
                    os.replace(tmp, path)
                finally:
                    if os.path.exists(tmp):
                        os.unlink(tmp)
                fetched += size
            st = os.stat(path)
            self.known[rel] = (st.st_size, st.st_mtime_ns, sha, mode)
            self.stored.add(sha)
        for root in self.dirs.values():  # left by an attempt here after its last upload
            for folder, dirs, names in os.walk(root, topdown=False):
                for name in names:
                    if os.path.join(folder, name) not in wanted:
                        os.unlink(os.path.join(folder, name))
                for name in dirs:
                    path = os.path.join(folder, name)
                    if os.path.islink(path):
                        os.unlink(path)
                    elif not os.listdir(path):
                        os.rmdir(path)
        return fetched

    # -- upload ----------------------------------------------------------------------------

    def due(self, now: float) -> bool:
        return now >= self.next_at and not self.lock.locked()

    def upload(self, final: bool = False) -> dict[str, Any]:
        """Send what changed since the last upload and switch the manifest to it; returns
        {"bytes": sent, "digest": the manifest's sha256, "files": count}."""
        with self.lock:
            sent = 0
            files: dict[str, Entry] = {}
            for rel, path in self._walk(final):
                try:
                    st = os.stat(path)
                except OSError:
                    continue
                old = self.known.get(rel)
                if old and (old[0], old[1]) == (st.st_size, st.st_mtime_ns):
                    files[rel] = old
                    continue
                entry, nbytes = self._send_file(path, st)
                if entry is None:  # changed while read: keep what was sent before
                    if old:
                        files[rel] = old
                    continue
                files[rel] = self.known[rel] = entry
                sent += nbytes
            if final and not files and not self.seq and self.attempt == 1:
                # Nothing was ever stored for the job: an empty manifest says no more than
                # none, and the exit need not wait for two requests.
                self.last = {"bytes": 0, "digest": None, "files": 0}
                return self.last
            self.seq += 1
            body = json.dumps(
                {
                    "juid": self.juid,
                    "attempt": self.attempt,
                    "seq": self.seq,
                    "ts": time.time(),
                    "final": final,
                    "files": {r: [e[2], e[0], e[3]] for r, e in sorted(files.items())},
                },
                sort_keys=True,
            ).encode()
            self._put(f"manifests/{self.attempt}-{self.seq:06d}.json", body)
            self._put("manifest.json", body)
            if self.seq_path:
                with open(
                    os.open(self.seq_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w"
                ) as out:
                    out.write(f"{self.seq}\n")
            self.next_at = time.monotonic() + self.every
            self.last = {
                "bytes": sent,
                "digest": hashlib.sha256(body).hexdigest(),
                "files": len(files),
            }
            return self.last

    def _walk(self, final: bool) -> list[tuple[str, str]]:
        """(rel, path) of the regular files to send."""
        found = []
        for name, root in self.dirs.items():
            for folder, dirs, names in os.walk(root):
                dirs.sort()
                for leaf in sorted(names):
                    path = os.path.join(folder, leaf)
                    if (
                        os.path.isfile(path)
                        and not os.path.islink(path)
                        and not leaf.startswith(".monkey-")
                    ):
                        found.append((f"{name}/{os.path.relpath(path, root)}", path))
        if final and self.work:
            for pattern in self.outputs:
                for rel in sorted(glob.glob(pattern, root_dir=self.work, recursive=True)):
                    path = os.path.join(self.work, rel)
                    if (
                        os.path.isfile(path)
                        and not os.path.islink(path)
                        and ".." not in rel.split("/")
                    ):
                        found.append((f"outputs/{os.path.normpath(rel)}", path))
        return found

    def _send_file(self, path: str, st: os.stat_result) -> tuple[Entry | None, int]:
        """Copy PATH aside while hashing it, then send the copy under its digest (unless
        stored already). (None, 0) when the file changed during the copy."""
        sha = hashlib.sha256()
        fd, tmp = tempfile.mkstemp(prefix="monkey-upload-")
        try:
            with os.fdopen(fd, "wb") as out, open(path, "rb") as src:
                while chunk := src.read(1 << 20):
                    sha.update(chunk)
                    out.write(chunk)
            after = os.stat(path)
            if (after.st_size, after.st_mtime_ns, after.st_ino) != (
                st.st_size,
                st.st_mtime_ns,
                st.st_ino,
            ):
                return None, 0
            digest = sha.hexdigest()
            sent = 0
            if digest not in self.stored:
                self._post_file(f"objects/{digest}", tmp)
                self.stored.add(digest)
                sent = st.st_size
            return (st.st_size, st.st_mtime_ns, digest, stat.S_IMODE(st.st_mode)), sent
        finally:
            os.unlink(tmp)

    def _path(self, rel: str) -> str | None:
        """Where REL of a manifest lives here (None: unsafe, or not a kept folder)."""
        parts = rel.split("/")
        if len(parts) < 2 or parts[0] not in self.dirs or any(p in ("", ".", "..") for p in parts):
            return None
        return os.path.join(self.dirs[parts[0]], *parts[1:])

    def _put(self, key: str, data: bytes) -> None:
        fd, tmp = tempfile.mkstemp(prefix="monkey-upload-")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            self._post_file(key, tmp)
        finally:
            os.unlink(tmp)

    def _post_file(self, key: str, path: str) -> None:
        """Send the file at PATH to KEY under the prefix through the upload form."""
        key = self.prefix + key
        if self.url.startswith("file:"):
            target = os.path.join(
                urllib.request.url2pathname(urllib.parse.urlparse(self.url).path), key
            )
            os.makedirs(os.path.dirname(target), 0o700, exist_ok=True)
            tmp = f"{target}.monkey-{uuid.uuid4().hex[:8]}"
            shutil.copyfile(path, tmp)
            os.replace(tmp, target)
            return
        boundary = uuid.uuid4().hex
        head = (
            b"".join(
                f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
                for k, v in {**self.fields, "key": key}.items()
            )
            + (
                f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="blob"\r\n'
                "Content-Type: application/octet-stream\r\n\r\n"
            ).encode()
        )
        tail = f"\r\n--{boundary}--\r\n".encode()
        with open(path, "rb") as src:
            body = _Body(head, src, tail, os.fstat(src.fileno()).st_size)
            request = urllib.request.Request(
                self.url,
                data=body,
                method="POST",
                headers={
                    "Content-Type": f"multipart/form-data; boundary={boundary}",
                    "Content-Length": str(body.length),
                },
            )
            with urllib.request.urlopen(request, timeout=TIMEOUT) as reply:
                reply.read()


def leave(cfg: dict[str, Any], juid: str, attempt: int, run_dir: str, why: str) -> int:
    """Put the ended attempt's run-dir files that the core reads (``rundir.LEFT``) in the
    bucket through its upload form CFG (the run dir's ``RESULTS``), then the record that
    says they are all there and WHY the machine powers off; returns the bytes sent."""
    from monkey.client_agent.rundir import LEFT

    sender = Results(cfg, juid, attempt, "")
    files, sent = {}, 0
    for name in LEFT:
        path = os.path.join(run_dir, name)
        try:
            size = os.path.getsize(path)
        except FileNotFoundError:
            continue
        if size:  # an empty file is only its size
            sender._post_file(f"left/{attempt}/{name}", path)
        files[name], sent = size, sent + size
    record = {"why": why, "ts": time.time(), "files": files}
    sender._put(f"left/{attempt}/record.json", json.dumps(record, sort_keys=True).encode())
    return sent


class _Body:
    """A multipart body read in blocks: HEAD, the file, TAIL (never all in memory)."""

    def __init__(self, head: bytes, src: Any, tail: bytes, size: int) -> None:
        self.parts = [head, src, tail]
        self.length = len(head) + size + len(tail)

    def read(self, n: int = 1 << 16) -> bytes:
        while self.parts:
            part = self.parts[0]
            if isinstance(part, bytes):
                self.parts.pop(0)
                if part:
                    return part
                continue
            chunk = part.read(n)
            if chunk:
                return chunk
            self.parts.pop(0)
        return b""


def _read_int(path: str) -> int:
    """The number in the file at PATH; 0 when there is none."""
    try:
        with open(path) as src:
            return int(src.read().strip() or 0)
    except (OSError, ValueError):
        return 0


def _same(path: str, size: int, sha: str) -> bool:
    """Whether PATH holds SIZE bytes whose sha256 is SHA."""
    try:
        if os.path.getsize(path) != size:
            return False
        digest = hashlib.sha256()
        with open(path, "rb") as src:
            while chunk := src.read(1 << 20):
                digest.update(chunk)
        return digest.hexdigest() == sha
    except OSError:
        return False
