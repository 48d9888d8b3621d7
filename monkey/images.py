"""OCI images of jobs, on the submitting side: references, their resolution to a digest
(once, at submission: a moved tag never changes a job or its rerun), and the registry
logins of this home (`monkey registry`).

The registry protocol is skopeo's (a well-kept tool every worker needs anyway for the
pull): ``skopeo inspect --raw`` fetches the manifest a reference names, and its digest is
the SHA-256 of those bytes. Logins live in ``MONKEY_HOME/secrets/registries.json`` (0600),
in the containers' ``auth.json`` format skopeo reads with ``--authfile``; without a login
for a host, skopeo's own defaults apply (``~/.docker/config.json`` among them). A
registry's CA (a lab's self-signed one) is kept in ``MONKEY_HOME/registries/HOST/ca.crt``
and given as ``--cert-dir``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import threading
from pathlib import Path

from monkey.config import Home, write_private
from monkey.models import MonkeyError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

DOCKER_HUB = "docker.io"
REF_MAX = 512
NAME_MAX = 255  # the distribution spec's limit of HOST/PATH
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"  # never "." or ".." (a folder is named so)
_HOST = re.compile(rf"(?:{_LABEL}(?:\.{_LABEL})*|\[[0-9A-Fa-f:]+\])(?::[0-9]{{1,5}})?")
_PATH = re.compile(
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
)
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_TIMEOUT = 120.0


class Reference:
    """An OCI image reference split in its parts, Docker Hub's short names filled in."""

    __slots__ = ("host", "path", "tag", "digest")

    def __init__(self, host: str, path: str, tag: str | None, digest: str | None) -> None:
        self.host, self.path, self.tag, self.digest = host, path, tag, digest

    @property
    def name(self) -> str:
        """HOST/PATH: the repository."""
        return f"{self.host}/{self.path}"

    def pinned(self, digest: str) -> str:
        """The reference of DIGEST in this repository: what a worker pulls."""
        return f"{self.name}@{digest}"


def is_host(text: str) -> bool:
    """Whether TEXT is a registry's host (a name or address, and a port in 1-65535)."""
    port = "" if text.endswith("]") else text.rpartition(":")[2]
    return bool(_HOST.fullmatch(text)) and (not port.isdigit() or 0 < int(port) < 65536)


def parse(text: Any) -> Reference:
    """TEXT as a reference (``pytorch/pytorch:2.4.0``, ``ghcr.io/o/r@sha256:...``,
    ``127.0.0.1:5000/lab/tiny:1``); MonkeyError naming what is wrong with it."""
    if not isinstance(text, str) or not text or len(text) > REF_MAX or text != text.strip():
        raise MonkeyError(
            f"image {text!r}: give an image reference such as pytorch/pytorch:2.4.0 or "
            "ghcr.io/OWNER/NAME@sha256:DIGEST"
        )
    rest, digest = text, None
    if "@" in rest:
        rest, digest = rest.split("@", 1)
        if not _DIGEST.fullmatch(digest):
            raise MonkeyError(f"image {text!r}: the digest must be sha256: and 64 hex digits")
    tag = None
    slash = rest.rfind("/")
    colon = rest.rfind(":")
    if colon > slash:
        rest, tag = rest[:colon], rest[colon + 1 :]
        if not _TAG.fullmatch(tag):
            raise MonkeyError(f"image {text!r}: {tag!r} is not a valid tag")
    first, _, remainder = rest.partition("/")
    if remainder and ("." in first or ":" in first or first == "localhost"):
        host, path = first, remainder
        if not is_host(host):
            raise MonkeyError(f"image {text!r}: {host!r} is not a registry host")
    else:
        host, path = DOCKER_HUB, rest if remainder else f"library/{rest}"
    if not _PATH.fullmatch(path):
        raise MonkeyError(
            f"image {text!r}: {path!r} is not a repository name (lower-case letters, digits, "
            "and . _ - between them, parts separated by /)"
        )
    if len(host) + 1 + len(path) > NAME_MAX:
        raise MonkeyError(
            f"image {text[:60]!r}...: a repository name is at most {NAME_MAX} characters "
            "with its registry host"
        )
    if tag is None and digest is None:
        tag = "latest"
    return Reference(host, path, tag, digest)


class Registries:
    """The registry logins and trusted CAs of a home."""

    def __init__(self, home: Home) -> None:
        self.authfile = home.secrets / "registries.json"
        self.certs = home.root / "registries"

    def _auths(self) -> dict[str, Any]:
        try:
            data = json.loads(self.authfile.read_bytes())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise MonkeyError(
                f"{self.authfile} is unreadable ({exc}); remove it and log in again: "
                "monkey registry login HOST"
            ) from None
        auths = data.get("auths") if isinstance(data, dict) else None
        return auths if isinstance(auths, dict) else {}

    def cert_dir(self, host: str) -> Path | None:
        """The folder of HOST's CA, when one was given."""
        folder = self.certs / _host_folder(host)
        return folder if (folder / "ca.crt").is_file() else None

    def options(self, host: str) -> list[str]:
        """skopeo's options for HOST: this home's login and CA, when it has them."""
        out: list[str] = []
        if host in self._auths():
            out += ["--authfile", str(self.authfile)]
        folder = self.cert_dir(host)
        if folder is not None:
            out += ["--cert-dir", str(folder)]
        return out

    def basic(self, host: str) -> tuple[str, str | None] | None:
        """(HOST's Basic Authorization value, "" when this home has no login for it; its CA
        file or None), or None when a login it has is not a user and password."""
        entry = self._auths().get(host)
        auth = entry.get("auth") if isinstance(entry, dict) else ""
        if entry is not None and not (isinstance(auth, str) and auth):
            return None
        folder = self.cert_dir(host)
        return auth or "", str(folder / "ca.crt") if folder is not None else None

    def pull_auth(self, host: str) -> dict[str, Any] | None:
        """What a worker needs to pull from HOST: its auth.json entry and CA (never stored
        with a job; sent with the start request only)."""
        entry = self._auths().get(host)
        folder = self.cert_dir(host)
        if entry is None and folder is None:
            return None
        out: dict[str, Any] = {}
        if entry is not None:
            out["auths"] = {host: entry}
        if folder is not None:
            out["ca"] = (folder / "ca.crt").read_text()
        return out

    def login(self, host: str, username: str, password: str, ca: str | None = None) -> None:
        """Check USERNAME and PASSWORD against HOST (trusting the CA file CA) and keep them."""
        folder = self.certs / _host_folder(host)
        if ca is not None:
            try:
                pem = Path(ca).expanduser().read_text()
            except (OSError, UnicodeDecodeError) as exc:
                raise MonkeyError(f"--ca-file {ca}: cannot read it ({exc})") from None
            if "BEGIN CERTIFICATE" not in pem:
                raise MonkeyError(f"--ca-file {ca}: not a PEM certificate")
        self.authfile.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        trial = self.authfile.with_name(f"registries.{os.getpid()}.json")
        write_private(trial, b'{"auths": {}}')
        trial_certs = self.certs / f".{_host_folder(host)}.{os.getpid()}"
        try:
            argv = [skopeo(), "login", "--authfile", str(trial), "--username", username]
            argv += ["--password-stdin"]
            if ca is not None:
                trial_certs.mkdir(parents=True, exist_ok=True)
                (trial_certs / "ca.crt").write_text(pem)
                argv += ["--cert-dir", str(trial_certs)]
            elif self.cert_dir(host) is not None:
                argv += ["--cert-dir", str(folder)]
            proc = subprocess.run(
                [*argv, host],
                input=password.encode(),
                capture_output=True,
                timeout=_TIMEOUT,
            )
            if proc.returncode != 0:
                raise MonkeyError(_skopeo_error(proc.stderr, host, f"login to {host}"))
            entry = json.loads(trial.read_bytes())["auths"][host]
            auths = self._auths()
            auths[host] = entry
            write_private(self.authfile, json.dumps({"auths": auths}, indent=1).encode())
            if ca is not None:
                shutil.rmtree(folder, ignore_errors=True)
                trial_certs.rename(folder)
        except subprocess.TimeoutExpired:
            raise MonkeyError(f"registry {host} did not answer within {_TIMEOUT:.0f}s") from None
        finally:
            trial.unlink(missing_ok=True)
            shutil.rmtree(trial_certs, ignore_errors=True)

    def logout(self, host: str) -> bool:
        """Forget HOST's login and CA; False when there was neither."""
        folder = self.certs / _host_folder(host)
        auths = self._auths()
        had = auths.pop(host, None) is not None
        if had:
            write_private(self.authfile, json.dumps({"auths": auths}, indent=1).encode())
        if folder.is_dir():
            shutil.rmtree(folder)
            had = True
        return had

    def listing(self) -> list[dict[str, Any]]:
        """[{host, username, ca}] of every registry this home has a login or CA for."""
        rows: dict[str, dict[str, Any]] = {}
        for host, entry in self._auths().items():
            user = ""
            try:
                user = base64.b64decode(entry.get("auth", "")).decode().split(":", 1)[0]
            except (ValueError, UnicodeDecodeError, AttributeError):
                pass
            rows[host] = {"host": host, "username": user, "ca": False}
        if self.certs.is_dir():
            for folder in self.certs.iterdir():
                if (folder / "ca.crt").is_file():
                    host = folder.name.replace("_", ":")
                    rows.setdefault(host, {"host": host, "username": "", "ca": False})["ca"] = True
        return sorted(rows.values(), key=lambda r: r["host"])


def _host_folder(host: str) -> str:
    """The name of HOST's folder of its CA; MonkeyError when HOST is not a registry host
    (so that no name such as `..` ever becomes a path)."""
    if not is_host(host):
        raise MonkeyError(f"registry {host!r}: give a host, e.g. ghcr.io or 10.0.0.5:5000")
    return host.replace(":", "_")


def skopeo() -> str:
    """skopeo's path; MonkeyError saying how to install it when it is missing."""
    path = shutil.which("skopeo")
    if path is None:
        raise MonkeyError(
            "jobs in images need skopeo on this machine (it resolves an image's tag to its "
            "digest): apt-get install skopeo"
        )
    return path


_ACCEPT = ", ".join(
    (
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    )
)
_HEAD_TIMEOUT = 10.0


class Resolving:
    """The resolution of an image reference to its digest, under way while the submission
    goes on (its code snapshot); ``result`` waits for it. A tag this home resolved before
    (``registries/resolved.json``) is asked of its registry with one HEAD request, in a
    thread: when the registry says the tag still names that digest, that is the answer;
    otherwise (a moved tag, a registry that wants a token, any error) skopeo resolves it,
    as it does every tag the first time, and says what went wrong."""

    def __init__(self, home: Home, text: str) -> None:
        self.text, self.home = text, home
        self.ref = parse(text)
        self.proc: subprocess.Popen[bytes] | None = None
        self.check: _Unchanged | None = None
        ref, registries = self.ref, Registries(home)
        known = None if ref.digest else _resolved(home).get(f"{ref.name}:{ref.tag}")
        if isinstance(known, str) and _DIGEST.fullmatch(known):
            basic = registries.basic(ref.host)
            if basic is not None:
                self.check = _Unchanged(ref, known, *basic)
                self.check.start()
                return
        self._skopeo()

    def _skopeo(self) -> None:
        ref = self.ref
        where = ref.pinned(ref.digest) if ref.digest else f"{ref.name}:{ref.tag}"
        argv = [skopeo(), "inspect", "--raw", *Registries(self.home).options(ref.host)]
        self.proc = subprocess.Popen(
            [*argv, f"docker://{where}"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

    def result(self) -> dict[str, str]:
        """{"ref": TEXT, "digest": "sha256:..."}: the digest of the manifest (or index) the
        reference names now, read from its registry with this home's login. MonkeyError in
        one line when the image cannot be used: not found, unauthorized (with the login
        command), registry unreachable or its certificate not trusted."""
        text, ref = self.text, self.ref
        if self.check is not None:
            self.check.join(_HEAD_TIMEOUT + 1)
            if self.check.said == self.check.digest:  # the registry: the tag is unchanged
                return {"ref": text, "digest": self.check.digest}
            self.check = None
            self._skopeo()
        assert self.proc is not None
        try:  # skopeo reads at most 4 MiB of a manifest (the distribution spec's bound)
            out, err = self.proc.communicate(timeout=_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            raise MonkeyError(
                f"image {text}: registry {ref.host} did not answer within {_TIMEOUT:.0f}s"
            ) from None
        if self.proc.returncode != 0:
            raise MonkeyError(_skopeo_error(err, ref.host, f"image {text}"))
        digest = "sha256:" + hashlib.sha256(out).hexdigest()
        if ref.digest and digest != ref.digest:
            raise MonkeyError(
                f"image {text}: the registry served a manifest of digest {digest}, not the "
                "one named"
            )
        if not ref.digest:
            _remember(self.home, f"{ref.name}:{ref.tag}", digest)
        return {"ref": text, "digest": digest}

    def cancel(self) -> None:
        """Stop the resolution (the submission failed first; a HEAD request ends by itself
        within its timeout)."""
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.communicate()


def _resolved(home: Home) -> dict[str, Any]:
    """The digest each tag this home resolved named then (NAME:TAG -> sha256:...)."""
    try:
        found = json.loads((home.root / "registries" / "resolved.json").read_bytes())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _remember(home: Home, tag: str, digest: str) -> None:
    """Keep that TAG named DIGEST when skopeo resolved it (written aside, then renamed)."""
    known = _resolved(home)
    if known.get(tag) == digest:
        return
    known[tag] = digest
    folder = home.root / "registries"
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        aside = folder / f".resolved.{os.getpid()}.json"
        write_private(aside, json.dumps(known, indent=1).encode())
        os.replace(aside, folder / "resolved.json")
    except OSError:
        pass  # the next submission asks skopeo again


class _Unchanged(threading.Thread):
    """Asks REF's registry with one HEAD request (AUTH: a Basic Authorization's value or
    "", CA: a CA file or None) which digest REF's tag names now: ``said``, None when the
    registry would not say (a token it wants, an error: skopeo then resolves it)."""

    def __init__(self, ref: Reference, digest: str, auth: str, ca: str | None) -> None:
        super().__init__(daemon=True, name="image-head")
        self.ref, self.digest, self.auth, self.ca = ref, digest, auth, ca
        self.said: str | None = None

    def run(self) -> None:
        try:
            self.said = self._ask()
        except (OSError, ValueError):
            self.said = None

    def _ask(self) -> str | None:
        # One HEAD request, written here: http.client's import (the email package) costs
        # about 20 ms of CPU, measured by bench/image_start.py, of the warm start's 50 ms.
        import socket
        import ssl
        from urllib.parse import urlsplit

        ref = self.ref
        host = "registry-1.docker.io" if ref.host == DOCKER_HUB else ref.host
        where = urlsplit(f"//{host}")
        name, port = where.hostname or "", where.port or 443
        context = ssl.create_default_context(cafile=self.ca)
        lines = [
            f"HEAD /v2/{ref.path}/manifests/{ref.tag} HTTP/1.1",
            f"Host: {host}",
            f"Accept: {_ACCEPT}",
            "User-Agent: monkey",
            "Connection: close",
        ]
        if self.auth:
            lines.append(f"Authorization: Basic {self.auth}")
        with socket.create_connection((name, port), timeout=_HEAD_TIMEOUT) as raw:
            # the request is sent at once, not held until the handshake's last segment is
            # acknowledged (Nagle's algorithm against a delayed ACK: 40 ms)
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with context.wrap_socket(raw, server_hostname=name) as tls:
                tls.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
                head = b""
                while b"\r\n\r\n" not in head and len(head) < 65536:
                    chunk = tls.recv(65536)
                    if not chunk:
                        break
                    head += chunk
        status, *fields = head.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
        if status.split(" ")[1:2] != ["200"]:
            return None
        for field in fields:
            key, _, value = field.partition(":")
            if key.strip().lower() == "docker-content-digest":
                return value.strip()
        return None


_EARLY: dict[tuple[Path, str], Resolving] = {}


def resolve_early(home: Home, text: str) -> None:
    """Start resolving the image TEXT now, for a command that is about to submit it: the
    registry is asked while the command loads the rest (the submission takes it over with
    ``resolving``; ``cancel_early`` stops one no submission took). A bad reference is left
    for the submission to refuse."""
    try:
        _EARLY[(home.root, text)] = Resolving(home, text)
    except MonkeyError:
        pass


def resolving(home: Home, text: str) -> Resolving:
    """The resolution of the image TEXT for a submission: the one started early for it,
    else one started now."""
    return _EARLY.pop((home.root, text), None) or Resolving(home, text)


def cancel_early() -> None:
    """Stop the resolutions started early that no submission took (it failed first)."""
    while _EARLY:
        _EARLY.popitem()[1].cancel()


def _skopeo_error(stderr: bytes, host: str, what: str) -> str:
    """skopeo's failure (of WHAT: "image REF", "login to HOST") as one line for a user,
    with the fix."""
    said = stderr.decode(errors="replace")
    low = said.lower()
    if what.startswith("login") and "invalid username/password" in low:
        return f"{what}: refused (unauthorized): check the username and password"
    if any(s in low for s in ("unauthorized", "authentication required", "denied")):
        return (
            f"{what}: registry {host} refused access (unauthorized); log in: "
            f"monkey registry login {host}"
        )
    if "exceeded maximum allowed size" in low:
        return f"{what}: registry {host} sent a manifest over 4 MiB (not an image's)"
    if "manifest unknown" in low or "name unknown" in low or "not found" in low:
        return f"{what}: not found in registry {host}; check its name and tag"
    if "x509" in low or "certificate" in low:
        return (
            f"{what}: registry {host}'s certificate is not trusted; give its CA: "
            f"monkey registry login {host} --ca-file CA.crt"
        )
    if any(s in low for s in ("connection refused", "no such host", "i/o timeout", "network")):
        return f"{what}: registry {host} is unreachable; check the address and network"
    lines = [ln.strip() for ln in said.splitlines() if ln.strip()]
    last = lines[-1] if lines else "no message"
    return f"{what}: skopeo failed: {last[-300:]}"
