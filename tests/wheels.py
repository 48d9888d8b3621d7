"""Real, installable pure-Python wheels written by hand: pip environments without network."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path


def write_wheel(
    folder: Path, name: str, version: str, files: dict[str, bytes], entry_points: str = ""
) -> Path:
    """A real, installable wheel of FILES (path in site-packages -> content), with its
    metadata and RECORD, and ENTRY_POINTS (entry_points.txt text) when given."""
    dist = f"{name}-{version}.dist-info"
    files = dict(files)
    files[f"{dist}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
    )
    files[f"{dist}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: monkey-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    if entry_points:
        files[f"{dist}/entry_points.txt"] = entry_points.encode()
    record = f"{dist}/RECORD"
    rows = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
        rows.append(f"{path},sha256={digest.decode()},{len(data)}")
    files[record] = ("\n".join([*rows, f"{record},,"]) + "\n").encode()
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, data in files.items():
            z.writestr(path, data)
    return wheel


def build_wheel(folder: Path, name: str = "tinypkg", version: str = "1.0") -> Path:
    """A real, installable pure-Python wheel, written by hand (no network, no build)."""
    return write_wheel(
        folder, name, version, {f"{name}/__init__.py": f"VALUE = '{name} {version}'\n".encode()}
    )
