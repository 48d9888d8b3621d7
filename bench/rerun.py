"""`monkey rerun JOB --set lr=0.2` of a job whose 5,000-file code snapshot is stored.

Target: the submit under 100 ms: nothing is hashed or copied again (the blobs are checked
to exist, the record is copied). Printed against `python -c pass` measured in the same run:
the in-process submit (Monkey.rerun, no core started) and the same in a new process.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from common import PY, fresh_home, median_wall, run_quiet

FILES = 5_000


def main() -> None:
    home = fresh_home()
    project = Path(tempfile.mkdtemp(prefix="monkey-bench-project-"))
    for i in range(FILES):
        folder = project / f"pkg{i // 100:02d}"
        folder.mkdir(exist_ok=True)
        (folder / f"mod{i:04d}.py").write_text(f"VALUE = {i}\n" + "# padding\n" * (i % 50))
    from monkey.api import Monkey

    m = Monkey(home)
    t = time.perf_counter()
    job = m.run(["python3", "train.py", "--lr", "0.1"], workdir=project, start_core=False)
    first = time.perf_counter() - t
    blobs_before = sum(len(files) for _, _, files in os.walk(m.home.blobs))
    base = median_wall(lambda: run_quiet([PY, "-c", "pass"]), 21)
    api = median_wall(lambda: m.rerun(job.juid, set=["lr=0.2"], start_core=False), 21)
    cli = median_wall(
        lambda: run_quiet(
            [
                PY,
                "-c",
                "import sys; from monkey.api import Monkey; "
                "Monkey().rerun(sys.argv[1], set=['lr=0.2'], "
                "start_core=False)",
                job.juid,
            ]
        ),
        11,
    )
    blobs_after = sum(len(files) for _, _, files in os.walk(m.home.blobs))
    print(f"first submit (hash + copy {FILES} files): {first * 1000:.0f} ms")
    print(f"python -c pass:                           {base * 1000:.1f} ms")
    print(
        f"rerun submit in process (Monkey.rerun):   {api * 1000:.1f} ms "
        f"({api / base:.2f}x python -c pass) target < 100 ms: {'ok' if api < 0.1 else 'MISSED'}"
    )
    print(f"rerun submit in a new process:            {cli * 1000:.1f} ms ({cli / base:.2f}x)")
    print(f"blobs written by the reruns:              {blobs_after - blobs_before}")


if __name__ == "__main__":
    main()
