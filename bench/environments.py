"""A job.yml project with a pip environment (a requirements file naming a local wheel, so
no network), run on the local provider: the first job builds the environment, the next
ones on the same worker reuse it. Target: preparing an unchanged environment under 1 s,
against the full build of that same environment measured here first.

Figures come from each attempt's setup.json (written by the worker's launcher).
"""

from __future__ import annotations

import base64
import hashlib
import json
import statistics
import tempfile
import time
import zipfile
from pathlib import Path

from common import fresh_home, stop_everything

REUSES = 7


def write_wheel(folder: Path, name: str = "benchpkg", version: str = "1.0") -> None:
    """A pure-Python wheel written by hand."""
    files = {
        f"{name}/__init__.py": "VALUE = 1\n",
        f"{name}-{version}.dist-info/METADATA":
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{name}-{version}.dist-info/WHEEL":
            "Wheel-Version: 1.0\nGenerator: bench\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }  # fmt: skip
    record = f"{name}-{version}.dist-info/RECORD"
    rows = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        rows.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    files[record] = "\n".join([*rows, f"{record},,"]) + "\n"
    folder.mkdir(parents=True)
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as z:
        for path, text in files.items():
            z.writestr(path, text)


def main() -> None:
    home = fresh_home()
    from monkey.api import Monkey

    project = Path(tempfile.mkdtemp(prefix="monkey-bench-project-"))
    write_wheel(project / "wheels")
    (project / "requirements.txt").write_text(
        f"--no-index\n--find-links {project / 'wheels'}\nbenchpkg\n")
    (project / "job.yml").write_text(
        "run:\n  env_type: pip\n  env_file: requirements.txt\n"
        'code:\n  ignore: ["wheels**"]\n')
    m = Monkey(home)
    argv = ["python", "-c", "import benchpkg"]

    def one() -> tuple[dict, float]:
        t = time.perf_counter()
        job = m.run(argv, workdir=project)
        state = job.wait(timeout=300)
        wall = time.perf_counter() - t
        if state.value != "succeeded":
            raise SystemExit(f"job {job.juid} {state.value}: {m.setup_logs(job.juid).decode()}")
        return json.loads((home / "runs" / job.juid / "1" / "setup.json").read_text()), wall

    try:
        built, built_wall = one()
        assert not built["reused"]
        reuses = [one() for _ in range(REUSES)]
        assert all(r["reused"] for r, _ in reuses)
        prep = [r["seconds"] for r, _ in reuses]
        walls = [w for _, w in reuses]
        med = statistics.median(prep)
        print(f"full build of the pip environment (job 1):  {built['seconds'] * 1000:8.1f} ms "
              f"(job wall {built_wall * 1000:.0f} ms)")
        print(f"reused environment, jobs 2-{REUSES + 1} (median):   {med * 1000:8.1f} ms "
              f"(max {max(prep) * 1000:.1f} ms; job wall median "
              f"{statistics.median(walls) * 1000:.0f} ms; target < 1000 ms)")
        print(f"ratio build / reuse: {built['seconds'] / med:,.0f}x")
    finally:
        stop_everything(home)


if __name__ == "__main__":
    main()
