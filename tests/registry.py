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

import pytest
from ports import free_port

USER, PASSWORD = "ana", "s3cret-registry"


@dataclass
class Registry:
    """A running registry: HOST (127.0.0.1:PORT), its CA file, and where it keeps its data."""

    host: str
    ca: Path
    root: Path

    def push(
        self, name: str, files: dict[str, str | Path], cmd: str = "/bin/sh", python: bool = False
    ) -> str:
        """Build an image of busybox plus FILES (path in the image: text, or a file to copy),
        with PYTHON this
        machine's Debian python3 (its binary, standard library and libraries), and push it
        as HOST/NAME (NAME has its tag); returns the pushed manifest's digest."""
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
        if python:
            _add_python(rootfs)
        for path, text in files.items():
            (rootfs / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
            if isinstance(text, Path):
                shutil.copy(text, rootfs / path.lstrip("/"))
            else:
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
            "--config.env", "PATH=/usr/bin:/bin", "--config.env", "IMAGE_SAYS=hello")  # fmt: skip
        digest = work / "digest"
        run("skopeo", "copy", "--dest-cert-dir", str(self.ca.parent),
            "--dest-creds", f"{USER}:{PASSWORD}", "--digestfile", str(digest),
            f"oci:{layout}:img", f"docker://{self.host}/{name}")  # fmt: skip
        return digest.read_text().strip()


def _add_python(rootfs: Path) -> None:
    """Debian's python3 of this machine into ROOTFS, with the libraries it links."""
    exe = Path("/usr/bin/python3.11")
    (rootfs / "usr/bin").mkdir(parents=True, exist_ok=True)
    shutil.copy(exe, rootfs / "usr/bin/python3")
    skip = {"test", "idlelib", "tkinter", "lib2to3", "dist-packages", "turtledemo",
            "config-3.11-x86_64-linux-gnu", "pydoc_data"}  # fmt: skip
    shutil.copytree("/usr/share/python-wheels", rootfs / "usr/share/python-wheels")  # venv's pip
    shutil.copytree(
        "/usr/lib/python3.11",
        rootfs / "usr/lib/python3.11",
        ignore=lambda _d, names: [n for n in names if n in skip],
    )
    linked = subprocess.run(["ldd", str(exe)], capture_output=True, text=True, check=True)
    for line in linked.stdout.splitlines():
        path = line.split("=>")[-1].split("(")[0].strip()
        if path.startswith("/"):
            dest = rootfs / path.lstrip("/")
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, dest)


def start(
    root: Path, port: int = 0, address: str = "127.0.0.1"
) -> tuple[Registry, subprocess.Popen]:
    """A registry serving from ROOT on ADDRESS (on PORT, else a free one), with its process
    (the caller stops it). Started again on the same ROOT and PORT, it serves what it held."""
    port = port or free_port()
    certs = root / "certs"
    if (root / "registry.yml").exists():
        return Registry(f"{address}:{port}", certs / "ca.crt", root), _serve(root, port, address)
    certs.mkdir(parents=True)
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(root / "key.pem"), "-out", str(certs / "ca.crt"), "-days", "2",
         "-subj", f"/CN={address}", "-addext", f"subjectAltName=IP:{address}"],
        check=True, capture_output=True,
    )  # fmt: skip
    hashed = subprocess.run(
        ["htpasswd", "-Bbn", USER, PASSWORD], check=True, capture_output=True, text=True
    ).stdout
    (root / "htpasswd").write_text(hashed)
    (root / "registry.yml").write_text(
        "version: 0.1\n"
        f"storage: {{filesystem: {{rootdirectory: {root}/data}}, delete: {{enabled: true}}}}\n"
        f"http: {{addr: {address}:{port}, tls: {{certificate: {certs}/ca.crt, key: {root}/key.pem}}}}\n"
        f"auth: {{htpasswd: {{realm: lab, path: {root}/htpasswd}}}}\n"
        "log: {level: warn}\n"
    )
    return Registry(f"{address}:{port}", certs / "ca.crt", root), _serve(root, port, address)


def _serve(root: Path, port: int, address: str) -> subprocess.Popen:
    log = open(root / "registry.log", "ab")
    proc = subprocess.Popen(
        ["docker-registry", "serve", str(root / "registry.yml")], stdout=log, stderr=log
    )
    deadline = time.monotonic() + 20
    while True:
        try:
            socket.create_connection((address, port), timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError((root / "registry.log").read_text()) from None
            time.sleep(0.05)
    return proc


def push_layers(reg: Registry, name: str, layers: list[bytes]) -> str:
    """Push an image made of LAYERS (uncompressed tar files, as given: nothing checks or
    cleans them) as HOST/NAME; its digest."""
    import hashlib
    import json

    layout = reg.root / "build" / f"raw-{name.replace('/', '_').replace(':', '_')}"
    shutil.rmtree(layout, ignore_errors=True)
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def blob(data: bytes, media: str) -> dict:
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        return {"mediaType": media, "digest": f"sha256:{digest}", "size": len(data)}

    diff_ids = [f"sha256:{hashlib.sha256(layer).hexdigest()}" for layer in layers]
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Env": ["PATH=/bin"], "Cmd": ["/bin/sh"]},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": blob(json.dumps(config).encode(), "application/vnd.oci.image.config.v1+json"),
        "layers": [blob(layer, "application/vnd.oci.image.layer.v1.tar") for layer in layers],
    }
    entry = blob(json.dumps(manifest).encode(), "application/vnd.oci.image.manifest.v1+json")
    entry["annotations"] = {"org.opencontainers.image.ref.name": "img"}
    (layout / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [entry]}))
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    digest = layout / "digest"
    subprocess.run(
        ["skopeo", "copy", "--dest-cert-dir", str(reg.ca.parent),
         "--dest-creds", f"{USER}:{PASSWORD}", "--digestfile", str(digest),
         f"oci:{layout}:img", f"docker://{reg.host}/{name}"],
        check=True, capture_output=True,
    )  # fmt: skip
    return digest.read_text().strip()


@pytest.fixture(scope="module")
def reg(tmp_path_factory):
    """A registry (for a test module) with lab/tiny:1 and lab/tiny:2 (busybox images whose
    /etc/said says "one" and "two") and lab/py:1 (with Python)."""
    reg, proc = start(tmp_path_factory.mktemp("registry"))
    try:
        reg.digests = {  # type: ignore[attr-defined]
            tag: reg.push(f"lab/tiny:{tag}", {"/etc/said": f"{word}\n"})
            for tag, word in (("1", "one"), ("2", "two"))
        }
        reg.push("lab/py:1", {"/etc/said": "python inside\n"}, python=True)
        yield reg
    finally:
        proc.kill()
        proc.wait()
