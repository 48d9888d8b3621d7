"""A real, installable pure-Python wheel written by hand: pip environments without network."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path


def build_wheel(folder: Path, name: str = "tinypkg", version: str = "1.0") -> Path:
    """A real, installable pure-Python wheel, written by hand (no network, no build)."""
    files = {
        f"{name}/__init__.py": f"VALUE = '{name} {version}'\n",
        f"{name}-{version}.dist-info/METADATA":
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{name}-{version}.dist-info/WHEEL":
            "Wheel-Version: 1.0\nGenerator: monkey-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }  # fmt: skip
    record = f"{name}-{version}.dist-info/RECORD"
    rows = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        rows.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    files[record] = "\n".join([*rows, f"{record},,"]) + "\n"
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    return wheel
