"""A remote one-shot client's start: `monkey --remote lab info JOB` and `monkey --remote lab
list jobs` against a main node on loopback (TLS) holding one job, beside `python -c pass`,
and whether the client imported the API's validation library (it must not: only the
server checks arguments, monkey.server.door).

Target (issue 41): no slower than 1.1x the client before the typed contract. Run it on
both commits, in the same clean virtualenv (common.PY; MONKEY_BENCH_PYTHON names one):
`python bench/remote_client_start.py [REPEAT]` (default 21 runs each, medians).
"""

from __future__ import annotations

import resource
import statistics
import subprocess
import sys

from common import MONKEY, PY, fresh_home, median_wall, start_main_node, stop_everything


def median_cpu(fn: object, repeat: int) -> float:
    """Median CPU time (user + system) of the child process FN runs: steadier than the wall
    time on a machine other work shares."""
    times = []
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        fn()  # type: ignore[operator]
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        times.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return statistics.median(times)


def main() -> None:
    repeat = int(sys.argv[1]) if len(sys.argv) > 1 else 21
    home = fresh_home()
    from monkey.api import Monkey

    juid = Monkey(home).run(["true"], start_core=False).juid
    laptop_env, stop = start_main_node(home)
    try:

        def quiet(argv: list[str], env: dict[str, str] | None = None) -> None:
            subprocess.run(
                argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, env=env
            )

        base = median_wall(lambda: quiet([PY, "-c", "pass"]), repeat)
        info = median_wall(
            lambda: quiet([*MONKEY, "--remote", "lab", "info", juid], laptop_env), repeat
        )
        listing = median_wall(
            lambda: quiet([*MONKEY, "--remote", "lab", "list", "jobs"], laptop_env), repeat
        )
        cpu = median_cpu(
            lambda: quiet([*MONKEY, "--remote", "lab", "info", juid], laptop_env), repeat
        )
        cpu_base = median_cpu(lambda: quiet([PY, "-c", "pass"]), repeat)
        probe = subprocess.run(
            [MONKEY[0], "-X", "importtime", *MONKEY[1:], "--remote", "lab", "info", juid],
            capture_output=True,
            text=True,
            env=laptop_env,
        )
        loaded = [
            line.rsplit("|", 1)[1].strip()
            for line in probe.stderr.splitlines()
            if line.startswith("import time:") and "|" in line
        ]
    finally:
        stop()
        stop_everything(home)
    print(f"python -c pass:                    {base * 1000:7.1f} ms")
    print(f"monkey --remote lab info JOB:      {info * 1000:7.1f} ms")
    print(f"monkey --remote lab list jobs:     {listing * 1000:7.1f} ms")
    print(f"CPU of info JOB (user+sys):        {cpu * 1000:7.1f} ms ({cpu_base * 1000:.1f} pass)")
    print(f"modules the client imported:       {len(loaded)}")
    print(f"msgspec imported by the client:    {'msgspec' in loaded}")


if __name__ == "__main__":
    main()
