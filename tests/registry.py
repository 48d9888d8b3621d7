"""A real OCI registry on 127.0.0.1 for the images tests: Debian's `docker-registry` (the
CNCF distribution registry) with TLS and htpasswd auth, and small images built without a
daemon (busybox in a root folder, made an OCI image with umoci, pushed with skopeo)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

USER, PASSWORD = "ana", "s3cret-registry"


@dataclass
class Registry:
    """A running registry: HOST (127.0.0.1:PORT), its CA file, and where it keeps its data."""

    host: str
    ca: Path
    root: Path

    def push(self, name: str, files: dict[str, str], cmd: str = "/bin/sh") -> str:
        """Build an image of busybox plus FILES (path in the image: text) and push it as
        HOST/NAME (NAME has its tag); returns the pushed manifest's digest."""
        work = self.root / "build" / name.replace("/", "_").replace(":", "_")
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        rootfs = work / "rootfs"
        for folder in ("bin", "etc", "tmp", "home", "root"):
            (rootfs / folder).mkdir(parents=True)
        shutil.copy(shutil.which("busybox") or "/bin/busybox", rootfs / "bin" / "busybox")
        for tool in ("sh", "echo", "cat", "id", "ls", "sleep", "env", "pwd", "true", "touch"):
            (rootfs / "bin" / tool).symlink_to("busybox")
        (rootfs / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
        for path, text in files.items():
            (rootfs / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
            (rootfs / path.lstrip("/")).write_text(text)
        layout = f"{work}/oci"
        run = lambda *argv: subprocess.run(argv, check=True, capture_output=True, cwd=work)  # noqa: E731
        run("umoci", "init", "--layout", layout)
        run("umoci", "new", "--image", f"{layout}:img")
        run("umoci", "unpack", "--rootless", "--image", f"{layout}:img", f"{work}/bundle")
        shutil.rmtree(work / "bundle" / "rootfs")
        shutil.copytree(rootfs, work / "bundle" / "rootfs", symlinks=True)
        run("umoci", "repack", "--image", f"{layout}:img", f"{work}/bundle")
        run("umoci", "config", "--image", f"{layout}:img", "--config.cmd", cmd,
            "--config.env", "PATH=/bin", "--config.env", "IMAGE_SAYS=hello")  # fmt: skip
        digest = work / "digest"
        run("skopeo", "copy", "--dest-cert-dir", str(self.ca.parent),
            "--dest-creds", f"{USER}:{PASSWORD}", "--digestfile", str(digest),
            f"oci:{layout}:img", f"docker://{self.host}/{name}")  # fmt: skip
        return digest.read_text().strip()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(root: Path) -> tuple[Registry, subprocess.Popen]:
    """A registry serving from ROOT, with its process (the caller stops it)."""
    port = free_port()
    certs = root / "certs"
    certs.mkdir(parents=True)
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(root / "key.pem"), "-out", str(certs / "ca.crt"), "-days", "2",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    hashed = subprocess.run(
        ["htpasswd", "-Bbn", USER, PASSWORD], check=True, capture_output=True, text=True
    ).stdout
    (root / "htpasswd").write_text(hashed)
    (root / "registry.yml").write_text(
        "version: 0.1\n"
        f"storage: {{filesystem: {{rootdirectory: {root}/data}}, delete: {{enabled: true}}}}\n"
        f"http: {{addr: 127.0.0.1:{port}, tls: {{certificate: {certs}/ca.crt, key: {root}/key.pem}}}}\n"
        f"auth: {{htpasswd: {{realm: lab, path: {root}/htpasswd}}}}\n"
        "log: {level: warn}\n"
    )
    log = open(root / "registry.log", "wb")
    proc = subprocess.Popen(
        ["docker-registry", "serve", str(root / "registry.yml")], stdout=log, stderr=log
    )
    deadline = time.monotonic() + 20
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError((root / "registry.log").read_text()) from None
            time.sleep(0.05)
    return Registry(f"127.0.0.1:{port}", certs / "ca.crt", root), proc
