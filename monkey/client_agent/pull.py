"""Pull an image from its registry and unpack it, streamed: each layer is unpacked while it
downloads (the first through memory, those fetched ahead of it through a temporary file
removed once read) and the next ones download beside it. Standard library only, nothing from the
rest of monkey: image.py imports it in launcher.py's process (beside it in the job code
folder), never in the agent.

Registry: the distribution API over HTTPS (``/v2/NAME/manifests/DIGEST``,
``/v2/NAME/blobs/DIGEST``), with the pull's login (Basic, or a Bearer token from the realm
the registry's challenge names, as Docker's token spec says) and CA; every manifest and
blob checked against its digest. No layer is kept once unpacked: writing each one to disk
beside its files would double what a pull writes (the unpacked image is what is kept).

Unpacking (``unpack``): each layer decompressed (zstd through the worker's ``zstd``) and
applied by layers.py, which keeps every entry inside the image's root.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import io
import json
import os
import queue
import shutil
import ssl
import subprocess
import tarfile
import threading
import urllib.error
import urllib.parse
import urllib.request
import zlib

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, BinaryIO

MANIFEST_MAX = 4 << 20  # the distribution spec's bound on a manifest
CHUNK = 1 << 20
PARALLEL = 3  # layers downloading at once (as Docker's max-concurrent-downloads)
TIMEOUT = 60.0  # seconds without a byte from the registry: unreachable
_ACCEPT = ", ".join(
    (
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    )
)


class PullError(Exception):
    """The pull failed: KIND is unreachable (tried again), unauthorized, not-found,
    untrusted, refused (a layer unpacking refused) or failed; the message is one line."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


# ---------------------------------------------------------------- the registry


class Registry:
    """The distribution API of the repository NAME (HOST/PATH) with the pull's LOGIN
    ({"auths": {HOST: {"auth": base64 user:password}}}) and CA (PEM text)."""

    def __init__(self, name: str, login: dict[str, Any], ca: str | None) -> None:
        self.host, self.path = name.split("/", 1)
        api = "registry-1.docker.io" if self.host == "docker.io" else self.host
        self.base = f"https://{api}/v2/{self.path}"
        context = ssl.create_default_context()
        if ca:
            context.load_verify_locations(cadata=ca)
        self.opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=context))
        self.creds = _creds(login, self.host)
        # the Authorization that worked, shared by the downloads: Basic from the start when
        # there is a login (a token registry answers it with its challenge, as to none)
        self.header = (
            "Basic " + base64.b64encode(self.creds.encode()).decode() if self.creds else ""
        )
        self.lock = threading.Lock()

    def get(self, what: str, accept: str = "") -> http.client.HTTPResponse:
        """The response of GET BASE/WHAT (authenticated as the registry asks)."""
        for _ in range(2):
            request = urllib.request.Request(f"{self.base}/{what}")
            if accept:
                request.add_header("Accept", accept)
            header = self.header
            if header:  # never sent on a redirect (to the blob's storage)
                request.add_unredirected_header("Authorization", header)
            try:
                return self._open(request)
            except urllib.error.HTTPError as e:
                if e.code != 401 or header != self.header:
                    if e.code != 401:
                        raise self._error(e, what) from None
                    continue  # another download logged in meanwhile
                challenge = e.headers.get("WWW-Authenticate", "")
                e.close()
                with self.lock:
                    if header == self.header:
                        self.header = self._authorize(challenge, header)
        raise self._refused()

    def _open(self, request: urllib.request.Request) -> http.client.HTTPResponse:
        try:
            return self.opener.open(request, timeout=TIMEOUT)
        except urllib.error.HTTPError:
            raise
        except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
            raise _network(e, self.host) from None

    def _authorize(self, challenge: str, tried: str) -> str:
        """The Authorization header CHALLENGE (a 401's) asks for; PullError when none can be
        made (no login, or the login was TRIED and refused)."""
        scheme, _, params = challenge.partition(" ")
        if scheme.lower() == "basic":
            if not self.creds or tried.startswith("Basic "):
                raise self._refused()
            return "Basic " + base64.b64encode(self.creds.encode()).decode()
        if scheme.lower() != "bearer":
            raise self._refused()
        fields = dict(_challenge_fields(params))
        realm = fields.get("realm", "")
        if not realm.startswith("https://") or tried.startswith("Bearer "):
            raise self._refused()
        query = {"service": fields.get("service", "")}
        query["scope"] = fields.get("scope") or f"repository:{self.path}:pull"
        request = urllib.request.Request(
            f"{realm}?{urllib.parse.urlencode({k: v for k, v in query.items() if v})}"
        )
        if self.creds:
            basic = base64.b64encode(self.creds.encode()).decode()
            request.add_unredirected_header("Authorization", f"Basic {basic}")
        try:
            with self._open(request) as reply:
                said = json.loads(reply.read(1 << 20))
        except urllib.error.HTTPError as e:
            raise self._refused() if e.code in (401, 403) else self._error(e, realm) from None
        except ValueError:
            raise self._refused() from None
        token = said.get("token") or said.get("access_token") if isinstance(said, dict) else None
        if not isinstance(token, str) or not token:
            raise self._refused()
        return f"Bearer {token}"

    def _refused(self) -> PullError:
        return PullError(
            "unauthorized",
            f"registry {self.host} refused access (unauthorized); log in: monkey registry "
            f"login {self.host}",
        )

    def _error(self, e: urllib.error.HTTPError, what: str) -> PullError:
        e.close()
        if e.code in (401, 403):
            return self._refused()
        if e.code == 404:
            return PullError("not-found", f"not found in registry {self.host}")
        if e.code == 429 or e.code >= 500:
            return PullError(
                "unreachable",
                f"registry {self.host} is unreachable from the worker (HTTP {e.code})",
            )
        return PullError("failed", f"registry {self.host} answered {e.code} for {what}")

    def manifest(self, digest: str) -> dict[str, Any]:
        """The image manifest DIGEST names for this machine (an index's manifest for its
        platform), checked against its digest."""
        found = self._checked_json(f"manifests/{digest}", digest, _ACCEPT)
        if "manifests" in found:
            arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, "")
            chosen = next(
                (
                    m
                    for m in found["manifests"]
                    if isinstance(m, dict)
                    and m.get("platform", {}).get("architecture") == arch
                    and m.get("platform", {}).get("os", "linux") == "linux"
                ),
                None,
            )
            if chosen is None:
                raise PullError("failed", f"the image has no manifest for linux/{arch}")
            found = self._checked_json(f"manifests/{chosen['digest']}", chosen["digest"], _ACCEPT)
        if not isinstance(found.get("config"), dict) or not isinstance(found.get("layers"), list):
            raise PullError("failed", "the registry sent a manifest that is not an image's")
        return found

    def config(self, descriptor: dict[str, Any]) -> dict[str, Any]:
        """The image's config blob DESCRIPTOR names, checked."""
        return self._checked_json(f"blobs/{descriptor['digest']}", descriptor["digest"])

    def blob(self, digest: str) -> bytes:
        """The small blob (at most 4 MiB: a config) of DIGEST, checked."""
        return self._checked(f"blobs/{digest}", digest)

    def _checked(self, what: str, digest: str, accept: str = "") -> bytes:
        with self.get(what, accept) as reply:
            try:
                body = reply.read(MANIFEST_MAX + 1)
            except (OSError, http.client.HTTPException) as e:
                raise _network(e, self.host) from None
        if len(body) > MANIFEST_MAX:
            raise PullError("failed", f"registry {self.host} sent over 4 MiB for {what}")
        if not _digest_ok(body, digest):
            raise PullError("failed", f"registry {self.host} sent {what} of another digest")
        return body

    def _checked_json(self, what: str, digest: str, accept: str = "") -> dict[str, Any]:
        body = self._checked(what, digest, accept)
        try:
            found = json.loads(body)
        except ValueError:
            found = None
        if not isinstance(found, dict):
            raise PullError("failed", f"registry {self.host} sent {what} that is not JSON")
        return found


def _creds(login: dict[str, Any], host: str) -> str:
    """ "user:password" of HOST from LOGIN (an auth.json), else from the worker's own
    ~/.docker/config.json; "" when neither has it."""
    entries = [login.get("auths") or {}]
    try:
        with open(os.path.expanduser("~/.docker/config.json")) as f:
            entries.append(json.load(f).get("auths") or {})
    except (OSError, ValueError, AttributeError):
        pass
    names = [
        host,
        *(["https://index.docker.io/v1/", "index.docker.io"] if host == "docker.io" else []),
    ]
    for auths in entries:
        for name in names:
            entry = auths.get(name) if isinstance(auths, dict) else None
            if not isinstance(entry, dict):
                continue
            if entry.get("auth"):
                try:
                    return base64.b64decode(entry["auth"]).decode()
                except (ValueError, UnicodeDecodeError):
                    continue
            if entry.get("username") and entry.get("password"):
                return f"{entry['username']}:{entry['password']}"
    return ""


def _challenge_fields(params: str) -> list[tuple[str, str]]:
    """The key="value" pairs of a WWW-Authenticate challenge's PARAMS."""
    out, rest = [], params.strip()
    while rest:
        key, eq, rest = rest.partition("=")
        if not eq:
            break
        if rest.startswith('"'):
            value, _, rest = rest[1:].partition('"')
        else:
            value, _, rest = rest.partition(",")
        out.append((key.strip().strip(",").strip().lower(), value))
        rest = rest.lstrip(", ")
    return out


def _network(e: BaseException, host: str) -> PullError:
    reason = getattr(e, "reason", e)
    if isinstance(reason, ssl.SSLCertVerificationError):
        return PullError(
            "untrusted",
            f"registry {host}'s certificate is not trusted on the worker; monkey registry "
            f"login {host} --ca-file CA.crt",
        )
    return PullError("unreachable", f"registry {host} is unreachable from the worker")


def _digest_ok(body: bytes, digest: str) -> bool:
    algo, _, hexd = digest.partition(":")
    return algo == "sha256" and hashlib.sha256(body).hexdigest() == hexd


# ---------------------------------------------------------------- downloads


class Download(threading.Thread):
    """One layer's blob fetched and checked against its digest, for a reader (``reader``)
    that unpacks it as it comes: through memory (a bounded queue: nothing written but the
    files unpacked) when MEMORY, else through a temporary file in FOLDER (a layer fetched
    ahead of the one being unpacked), removed once read."""

    def __init__(
        self,
        registry: Registry,
        descriptor: dict[str, Any],
        folder: str,
        memory: bool,
        gate: threading.Semaphore,
        stop: threading.Event,
    ) -> None:
        super().__init__(daemon=True, name="pull-layer")
        self.registry, self.digest = registry, descriptor["digest"]
        self.size = int(descriptor.get("size") or 0)
        self.chunks: queue.Queue[bytes | None] | None = queue.Queue(16) if memory else None
        self.part = os.path.join(folder, f"{self.digest.split(':', 1)[1]}.part-{os.getpid()}")
        self.fd = -1 if memory else os.open(self.part, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        self.gate, self.stop = gate, stop
        self.got = 0
        self.done = False
        self.error: BaseException | None = None
        self.cond = threading.Condition()

    def run(self) -> None:
        try:
            with self.gate:
                if self.stop.is_set():
                    raise PullError("failed", "stopped")
                self._fetch()
        except BaseException as e:  # told to the reader
            self.error = e
        finally:
            with self.cond:
                self.done = True
                self.cond.notify_all()
            if self.chunks is not None:
                self._put(None)

    def _put(self, chunk: bytes | None) -> None:
        assert self.chunks is not None
        while not self.stop.is_set():
            try:
                self.chunks.put(chunk, timeout=0.2)
                return
            except queue.Full:
                continue
        if chunk is not None:
            raise PullError("failed", "stopped")

    def _fetch(self) -> None:
        hasher = hashlib.sha256()
        with self.registry.get(f"blobs/{self.digest}") as reply:
            buf = bytearray(CHUNK)
            view = memoryview(buf)
            while not self.stop.is_set():
                try:
                    n = reply.readinto(buf)
                except (OSError, http.client.HTTPException) as e:
                    raise _network(e, self.registry.host) from None
                if not n:
                    break
                hasher.update(view[:n])
                if self.chunks is not None:
                    self._put(bytes(view[:n]))
                else:
                    written = 0
                    while written < n:
                        written += os.write(self.fd, view[written:n])
                with self.cond:
                    self.got += n
                    self.cond.notify_all()
        if self.stop.is_set():
            raise PullError("failed", "stopped")
        if self.size and self.got != self.size:
            raise PullError(
                "unreachable", f"registry {self.registry.host} is unreachable from the worker "
                f"(a layer ended at {self.got:,} of {self.size:,} bytes)"
            )  # fmt: skip
        if f"sha256:{hasher.hexdigest()}" != self.digest:
            raise PullError("failed", f"layer {self.digest} arrived with another digest")

    def reader(self) -> io.RawIOBase:
        return Queued(self) if self.chunks is not None else Growing(self)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
            try:
                os.unlink(self.part)
            except OSError:
                pass


class Growing(io.RawIOBase):
    """A reader of a DOWNLOAD's file as it grows; at the end, its error (a digest that
    does not match: nothing unpacked from it is kept)."""

    def __init__(self, download: Download) -> None:
        super().__init__()
        self.download, self.pos = download, 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        d = self.download
        with d.cond:
            while self.pos >= d.got and not d.done:
                d.cond.wait()
            got = d.got
        if self.pos >= got:
            finish(d)
            return 0
        data = os.pread(d.fd, min(len(b), got - self.pos), self.pos)
        b[: len(data)] = data
        self.pos += len(data)
        return len(data)


class Queued(io.RawIOBase):
    """A reader of a DOWNLOAD's chunks through memory; at the end, its error."""

    def __init__(self, download: Download) -> None:
        super().__init__()
        self.download, self.left = download, b""
        self.ended = False

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        d = self.download
        assert d.chunks is not None
        while not self.left and not self.ended:
            chunk = d.chunks.get()
            if chunk is None:
                self.ended = True
            else:
                self.left = chunk
        if not self.left:
            finish(d)
            return 0
        n = min(len(b), len(self.left))
        b[:n] = self.left[:n]
        self.left = self.left[n:]
        return n


def finish(download: Download) -> None:
    """Wait for the whole DOWNLOAD; its error if it failed."""
    with download.cond:
        while not download.done:
            download.cond.wait()
    if download.error is not None:
        raise download.error


# ---------------------------------------------------------------- the pull


def fetch(
    cfg: dict[str, Any],
    login: dict[str, Any],
    root: str,
    progress: Callable[[int, int | None], None],
    note: Callable[[str], None],
) -> tuple[int, dict[str, Any]]:
    """Pull the image CFG pins (its "name", "digest"; temporary files in CFG's "store")
    with LOGIN and unpack it into ROOT (made here); PROGRESS(bytes, total) is told how far
    the downloads are. (The bytes fetched, the image's config.)"""
    registry, manifest = _pinned(cfg, login)
    config = registry.config(manifest["config"])
    with _Downloads(registry, manifest["layers"], cfg["store"], progress) as downloads:
        os.makedirs(root, 0o700)
        for number, download in enumerate(downloads, 1):
            stream = download.reader()
            try:
                skipped = unpack(stream, root, f"layer {number}")
                finish(download)
            finally:
                stream.close()
                download.close()  # its file, read: gone
            if skipped:
                note(f"layer {number}: {skipped} device files not made (never in a sandbox)")
        return sum(d.got for d in downloads), config


def archive(
    cfg: dict[str, Any],
    login: dict[str, Any],
    out: BinaryIO,
    tag: str,
    progress: Callable[[int, int | None], None],
) -> int:
    """Write the image CFG pins to OUT as ``docker save`` does (what ``docker load``
    reads), tagged TAG: its config and its layers as the registry serves them, each checked
    against its digest; manifest.json comes last, so that an archive cut short by a failed
    check loads nothing. The bytes fetched."""
    registry, manifest = _pinned(cfg, login)
    config = manifest["config"]
    if not _digest_re_ok(config.get("digest")):
        raise PullError("failed", "the image's manifest names a config without a sha256 digest")
    body = registry.blob(config["digest"])
    tar = tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT)
    _add(tar, f"{config['digest'][7:]}.json", io.BytesIO(body), len(body))
    names = []
    with _Downloads(registry, manifest["layers"], cfg["store"], progress) as downloads:
        for download in downloads:
            if download.size <= 0:
                raise PullError("failed", "the image's manifest names a layer without its size")
            names.append(f"{download.digest[7:]}.tar")  # as served: docker load inflates it
            stream = download.reader()
            try:
                _add(tar, names[-1], stream, download.size)
                finish(download)
            finally:
                stream.close()
                download.close()
        said = [{"Config": f"{config['digest'][7:]}.json", "RepoTags": [tag], "Layers": names}]
        listed = json.dumps(said).encode()
        _add(tar, "manifest.json", io.BytesIO(listed), len(listed))
        tar.close()
        return sum(d.got for d in downloads)


def _add(tar: tarfile.TarFile, name: str, stream: Any, size: int) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = size, 0o644
    tar.addfile(info, stream)


def _pinned(cfg: dict[str, Any], login: dict[str, Any]) -> tuple[Registry, dict[str, Any]]:
    """CFG's registry (with LOGIN) and the manifest of the digest CFG pins, its layers
    checked to be named by digest."""
    registry = Registry(cfg["name"], login, login.get("ca"))
    manifest = registry.manifest(cfg["digest"])
    for layer in manifest["layers"]:
        if not isinstance(layer, dict) or not _digest_re_ok(layer.get("digest")):
            raise PullError("failed", "the image's manifest names a layer without a sha256 digest")
    return registry, manifest


class _Downloads:
    """The LAYERS of REGISTRY downloading (PARALLEL at once; temporary files in STORE's
    tmp/) while the body of the with-statement reads them in order, PROGRESS told how far
    they are; every download stopped and its file gone at its end."""

    def __init__(
        self,
        registry: Registry,
        layers: list[dict[str, Any]],
        store: str,
        progress: Callable[[int, int | None], None],
    ) -> None:
        self.registry, self.layers, self.progress = registry, layers, progress
        self.folder = os.path.join(store, "tmp")
        self.stop, self.gate = threading.Event(), threading.Semaphore(PARALLEL)
        self.downloads: list[Download] = []
        self.meter: _Meter | None = None

    def __enter__(self) -> list[Download]:
        os.makedirs(self.folder, 0o700, exist_ok=True)
        try:
            for number, layer in enumerate(self.layers):
                self.downloads.append(
                    Download(self.registry, layer, self.folder, number == 0, self.gate, self.stop)
                )
            for d in self.downloads:
                d.start()
            self.meter = _Meter(self.downloads, sum(d.size for d in self.downloads), self.progress)
            self.meter.start()
        except BaseException:
            self.__exit__()
            raise
        return self.downloads

    def __exit__(self, *_exc: object) -> None:
        if self.meter is not None:
            self.meter.stop.set()
            self.meter.join()
        self.stop.set()
        for d in self.downloads:
            if d.is_alive():
                d.join()
            d.close()


def _digest_re_ok(digest: Any) -> bool:
    if not isinstance(digest, str) or not digest.startswith("sha256:"):
        return False
    hexd = digest[7:]
    return len(hexd) == 64 and all(c in "0123456789abcdef" for c in hexd)


class _Meter(threading.Thread):
    """Tells PROGRESS the bytes the DOWNLOADS have so far, every half second."""

    def __init__(
        self,
        downloads: list[Download],
        total: int,
        progress: Callable[[int, int | None], None],
    ) -> None:
        super().__init__(daemon=True, name="pull-meter")
        self.downloads, self.total, self.progress = downloads, total, progress
        self.stop = threading.Event()

    def run(self) -> None:
        self.progress(0, self.total)
        while not self.stop.wait(0.5):
            self.progress(sum(d.got for d in self.downloads), self.total)


# ---------------------------------------------------------------- unpacking


def unpack(stream: io.RawIOBase, root: str, what: str) -> int:
    """Apply the layer (a tar, gzip'd or zstd'd or not) read from STREAM onto ROOT;
    PullError "refused" naming WHAT and the entry when the layer is refused. The number of
    device files not made."""
    import layers  # type: ignore[import-not-found]  # beside this file

    buffered = io.BufferedReader(stream, CHUNK)
    magic = buffered.peek(4)[:4]
    feeder = proc = None
    source: Any = buffered
    if magic == b"\x28\xb5\x2f\xfd":  # zstd: the stdlib has no decoder
        zstd = shutil.which("zstd")
        if zstd is None:
            raise PullError(
                "failed", f"{what} is compressed with zstd: apt-get install zstd on the worker"
            )
        proc = subprocess.Popen([zstd, "-dcq"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        feeder = threading.Thread(target=_feed, args=(buffered, proc.stdin), daemon=True)
        feeder.start()
        source = proc.stdout
    try:
        with tarfile.open(fileobj=source, mode="r|*", bufsize=CHUNK) as tar:
            return layers.apply(tar, root)
    except layers.Refused as e:
        raise PullError("refused", f"{what} refused: {e}") from None
    except (tarfile.TarError, EOFError, zlib.error) as e:
        raise PullError("failed", f"{what} is not a readable tar: {e}") from None
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    pipe.close()
        if feeder is not None:
            feeder.join()


def _feed(src: BinaryIO, dst: Any) -> None:
    try:
        while data := src.read(CHUNK):
            dst.write(data)
        dst.close()
    except (OSError, ValueError):
        pass
