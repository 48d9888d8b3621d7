"""monkey.log, stdout scraping, ingestion into SQLite and `monkey metrics`, through a real
core and agent; losing nothing and doubling nothing across restarts and signals."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import REPO, kill_core, start_core, wait_for
from in_job import SCRIPT, bare_python, check_tracked, open_tmp  # noqa: F401 - a fixture

from monkey.models import State
from monkey.tracking.ingest import parse_log_lines, points_of


def write(path: Path, code: str) -> Path:
    path.write_text(textwrap.dedent(code))
    return path


def job_python_pid(monkey, juid: str) -> int:
    """The pid of the job's own python (the child of the wrapper shell)."""
    att = wait_for(lambda: (a := monkey.store.get_attempt(juid, 1)) and a.pid and a, what="pid")
    children = f"/proc/{att.pid}/task/{att.pid}/children"
    return int(wait_for(lambda: open(children).read().split(), what="the job's python")[0])


def steps(monkey, juid: str, name: str) -> list[int]:
    return [s for s, _, _ in monkey.metrics(juid, name)[name]]


def test_log_forms_params_summary_and_scraping(home, monkey, cli):
    write(
        Path("train.py"),
        """
        import json, monkey
        monkey.log_params({"lr": 0.1, "optim": {"name": "sgd", "momentum": 0.9}})
        for i in range(3):
            monkey.log("acc", 0.5 + i / 10, step=i)
            monkey.log({"loss": 1.0 - i / 10, "div": float("nan")}, step=i)
            monkey.log("plain", i)
        print(json.dumps({"experiment": {"val_acc": 0.93, "val": {"loss": 0.24}}}))
        print(json.dumps({"monkey": {"step": 7, "lr_now": 0.05}}))
        print(json.dumps({"experiment": {"epoch": 2, "ep_acc": 0.8}}))
        print('{"other": {"x": 1}}')
        print('not json {"experiment": {"x": 1}}')
        print('{"experiment": broken')
        monkey.summary(best_acc=0.7)
        """,
    )
    job = monkey.run("python train.py")
    assert job.wait(60) == State.SUCCEEDED
    m = monkey.metrics(job.juid)
    assert [(s, v) for s, v, _ in m["acc"]] == [(0, 0.5), (1, 0.6), (2, 0.7)]
    assert [s for s, _, _ in m["loss"]] == [0, 1, 2]
    assert all(v != v for _, v, _ in m["div"])  # NaN is kept as NaN
    assert [(s, v) for s, v, _ in m["plain"]] == [(None, 0.0), (None, 1.0), (None, 2.0)]
    assert [v for _, v, _ in m["val_acc"]] == [0.93]
    assert [v for _, v, _ in m["val.loss"]] == [0.24]
    assert m["lr_now"][0][:2] == (7, 0.05)
    assert m["ep_acc"][0][:2] == (2, 0.8) and "epoch" not in m  # epoch is the step
    assert "x" not in m and "other.x" not in m
    assert set(monkey.metric_names(job.juid)) >= {"acc", "loss", "div", "plain", "val_acc"}
    assert job.record.params == {"lr": 0.1, "optim": {"name": "sgd", "momentum": 0.9}}
    assert monkey.store.summaries([job.juid])[job.juid] == {"best_acc": 0.7}
    # stdout itself is untouched
    assert '{"other": {"x": 1}}' in job.logs() and '{"experiment": broken' in job.logs()

    table = cli("metrics", job.juid, check=True).stdout
    assert "acc" in table.splitlines()[1] and "0.7" in table
    points = json.loads(cli("metrics", job.juid, "--name", "acc", "--json", check=True).stdout)
    assert [p["value"] for p in points["acc"]] == [0.5, 0.6, 0.7]
    csv_lines = cli("metrics", job.juid, "--name", "loss", "--csv", check=True).stdout.splitlines()
    assert csv_lines[0] == "job,name,step,value,time" and len(csv_lines) == 4
    plot = cli("metrics", job.juid, "--name", "acc", "--plot", check=True).stdout
    assert "acc" in plot and "\x1b[" not in plot and len(plot.splitlines()) > 10
    bad = cli("metrics", job.juid, "--name", "nope")
    assert bad.returncode == 1 and "no metric 'nope'" in bad.stderr and "acc" in bad.stderr


def test_log_outside_monkey_writes_a_local_file(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONKEY_")}
    env["PYTHONPATH"] = str(REPO)
    code = "import monkey\nfor i in range(5): monkey.log('x', i, step=i)\nmonkey.summary(done=1)"
    subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, check=True, timeout=30)
    batches, params, summary = parse_log_lines((tmp_path / "monkey-metrics.jsonl").read_text())
    assert [p[:3] for p in points_of(batches)] == [("x", i, float(i)) for i in range(5)]
    assert summary == {"done": 1} and params == {}


def test_metrics_file_lines_in_plain_json_are_read_too():
    text = '[["acc", 1, 0.5, 1700000000000000000], ["acc", null, NaN, 1700000001000000000]]\n'
    points = points_of(parse_log_lines(text + "garbage\n")[0])
    assert points[0] == ("acc", 1, 0.5, 1.7e9) and points[1][:3] == ("acc", None, None)


def test_bad_log_calls_raise_at_once(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO), MONKEY_METRICS_FILE=str(tmp_path / "m"))
    code = textwrap.dedent("""
        import monkey
        for call in (lambda: monkey.log("a", "high"), lambda: monkey.log(3, 1.0),
                     lambda: monkey.log({"a": 1}, 2), lambda: monkey.log_params(x=object())):
            try:
                call()
            except (TypeError, ValueError) as e:
                print(type(e).__name__)
        """)
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.split()
    assert out == ["ValueError", "TypeError", "TypeError", "TypeError"]


LOOP = """
    import os, sys, time, monkey
    progress = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    i = 0
    while True:
        monkey.log("x", i, step=i)
        if i % 100 == 0:
            os.pwrite(progress, f"{i:>12} {time.time():.6f}".encode(), 0)
            time.sleep(0.01)
        i += 1
    """


def read_progress(path: Path) -> tuple[int, float]:
    """The last step the job reported, (-1, 0) before it has written one."""
    parts = path.read_text().split() if path.exists() else []
    return (int(parts[0]), float(parts[1])) if len(parts) == 2 else (-1, 0.0)


def test_sigterm_loses_nothing(home, monkey, tmp_path):
    write(Path("loop.py"), LOOP)
    progress = tmp_path / "progress"
    job = monkey.run(["python", "loop.py", str(progress)])
    wait_for(lambda: read_progress(progress)[0] >= 2000, what="logging")
    os.kill(job_python_pid(monkey, job.juid), signal.SIGTERM)
    assert job.wait(30) == State.FAILED
    last, _ = read_progress(progress)
    got = wait_for(lambda: (s := steps(monkey, job.juid, "x")) and s, what="points")
    assert got == list(range(len(got)))  # in order, no gap, no double
    assert got[-1] >= last  # everything up to the moment it died


def test_sigkill_loses_at_most_the_last_second(home, monkey, tmp_path):
    write(Path("loop.py"), LOOP)
    progress = tmp_path / "progress"
    job = monkey.run(["python", "loop.py", str(progress)])
    # 150 pauses of 10 ms: well past the first flushes
    wait_for(lambda: read_progress(progress)[0] >= 15000, what="logging")
    os.kill(job_python_pid(monkey, job.juid), signal.SIGKILL)
    killed_at = time.time()
    assert job.wait(30) == State.FAILED
    got = steps(monkey, job.juid, "x")
    assert got == list(range(len(got)))
    last_wall = monkey.metrics(job.juid, "x")["x"][-1][2]
    assert killed_at - last_wall < 1.0


def test_core_and_agent_killed_while_logging_lose_and_double_nothing(home, monkey, tmp_path):
    write(
        Path("burst.py"),
        """
        import time, monkey
        for i in range(30000):
            monkey.log("x", i, step=i)
            if i % 1000 == 0:
                time.sleep(0.1)
        """,
    )
    job = monkey.run("python burst.py")
    wait_for(lambda: monkey.store.metric_names(job.juid), what="first metrics")
    kill_core(home)
    agent_pid = int((home / "private" / "agent.pid").read_text())
    os.kill(agent_pid, signal.SIGKILL)
    time.sleep(0.5)  # the job goes on logging while nothing watches it
    start_core(home)
    assert job.wait(60) == State.SUCCEEDED
    assert steps(monkey, job.juid, "x") == list(range(30000))


def test_system_metrics_with_cpu_memory_and_gpu(home, monkey, tmp_path, monkeypatch):
    fake = tmp_path / "bin"
    fake.mkdir()
    smi = fake / "nvidia-smi"
    smi.write_text(
        textwrap.dedent("""\
        #!/bin/sh
        case "$1" in
          --query-gpu=index) echo 0 ;;
          --query-gpu=index,name,memory.total) echo "0, Fake GPU, 16000" ;;
          --query-gpu=index,utilization.gpu,memory.used) echo "0, 55, 1234" ;;
        esac
        """)
    )
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    job = monkey.run("python -c 'import time; time.sleep(2.5)'", gpus=1)
    assert job.wait(60) == State.SUCCEEDED
    m = monkey.metrics(job.juid)
    assert m["sys/cpu"] and m["sys/mem"] and all(v > 0 for _, v, _ in m["sys/mem"])
    assert [v for _, v, _ in m["sys/gpu0_util"]][0] == 55.0
    assert [v for _, v, _ in m["sys/gpu0_mem"]][0] == 1234.0


def test_points_survive_an_exception_and_forked_children_never_double(home, monkey):
    write(
        Path("crash.py"),
        """
        import os, monkey
        for i in range(100):
            monkey.log("x", i, step=i)
        pid = os.fork()  # the child gets a copy of the unwritten buffer
        if pid == 0:
            monkey.log("child", 1.0)
            monkey.summary(child=True)
            os._exit(0)
        os.waitpid(pid, 0)
        raise RuntimeError("diverged")
        """,
    )
    job = monkey.run("python crash.py")
    assert job.wait(60) == State.FAILED
    assert steps(monkey, job.juid, "x") == list(range(100))
    assert monkey.store.summaries([job.juid])[job.juid] == {"child": True}
    assert len(monkey.metrics(job.juid, "child")["child"]) == 1


def test_points_logged_in_forked_multiprocessing_children_and_threads_all_arrive(home, monkey):
    # A fork-started multiprocessing child ends with os._exit, which skips atexit.
    write(
        Path("train.py"),
        """
        import multiprocessing as mp, threading, monkey
        def child(i):
            for s in range(5):
                monkey.log(f"child{i}", s, step=s)
        def thread():
            for s in range(5):
                monkey.log("thread", s, step=s)
        if __name__ == "__main__":
            monkey.log("parent", 1.0)
            procs = [mp.get_context("fork").Process(target=child, args=(i,)) for i in range(2)]
            [p.start() for p in procs]
            [p.join() for p in procs]
            t = threading.Thread(target=thread)
            t.start()
            t.join()
            with mp.get_context("fork").Pool(2) as pool:
                pool.map(child, [2, 3])
        """,
    )
    job = monkey.run("python train.py")
    assert job.wait(60) == State.SUCCEEDED
    for name in ("child0", "child1", "child2", "child3", "thread"):
        assert steps(monkey, job.juid, name) == [0, 1, 2, 3, 4], name
    assert steps(monkey, job.juid, "parent") == [None]


@pytest.mark.system  # Python processes of their own
def test_pools_terminated_as_soon_as_made_never_wait_for_a_worker(tmp_path):
    """`with Pool(4): ...` ending at once SIGTERMs workers that may not have run a line yet.
    A SIGTERM reaching such a child before its after-fork hooks found monkey.log's Python
    handler, whose flag the child's interpreter clears after a fork: lost, and the Pool's
    exit waited for that worker forever (about 15% of these scripts under load, before)."""
    script = tmp_path / "pools.py"
    script.write_text(
        "import multiprocessing as mp, monkey\n"
        "if __name__ == '__main__':\n"
        "    monkey.log('parent', 1.0)\n"
        "    for _ in range(20):\n"
        "        with mp.get_context('fork').Pool(4):\n"
        "            pass\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("MONKEY_RUN_DIR", None)
    hung = 0
    for _ in range(3):  # six at once: the load that opens the window
        procs = [
            subprocess.Popen(
                [sys.executable, str(script)],
                cwd=tmp_path,
                env={**env, "MONKEY_METRICS_FILE": str(tmp_path / f"m{i}.jsonl")},
                start_new_session=True,
            )
            for i in range(6)
        ]
        for proc in procs:
            try:
                assert proc.wait(30) == 0
            except subprocess.TimeoutExpired:
                hung += 1
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert hung == 0, f"{hung} of 18 scripts hung at a Pool's exit"


def test_metrics_json_with_nan_and_infinity_is_valid_json(home, monkey, cli):
    write(
        Path("train.py"),
        """
        import monkey
        monkey.log({"nan": float("nan"), "inf": float("inf"), "ninf": float("-inf")}, step=1)
        """,
    )
    job = monkey.run("python train.py")
    assert job.wait(60) == State.SUCCEEDED

    def refuse(constant: str) -> None:
        raise ValueError(f"bare {constant} is not JSON")

    out = cli("metrics", job.juid, "--json", check=True).stdout
    data = json.loads(out, parse_constant=refuse)
    assert [p["value"] for p in data["nan"]] == ["NaN"]
    assert [p["value"] for p in data["inf"]] == ["Infinity"]
    assert [p["value"] for p in data["ninf"]] == ["-Infinity"]
    json.loads(cli("compare", job.juid, "--json", check=True).stdout, parse_constant=refuse)


def test_a_python_without_monkey_logs_through_the_agents_monkey(home, cli, open_tmp: Path) -> None:
    """A local job whose python cannot import monkey (a bare virtualenv, nothing on its
    PYTHONPATH), in a project with a folder named `monkey` (no package): `import monkey`
    gives it the in-job API, and it is tracked as anywhere; a job asking for the rest of the
    API is told in one line why it is not there."""
    python = bare_python(open_tmp / "bare")
    Path("train.py").write_text(SCRIPT)
    Path("monkey").mkdir()
    (Path("monkey") / "notes.txt").write_text("a data folder, not a package\n")
    juid = json.loads(
        cli("run", "--json", "--env", "PYTHONPATH=", "--", python, "train.py", check=True).stdout
    )["job"]
    assert cli("logs", "--follow", juid).returncode == 0, cli("logs", "--stderr", juid).stdout
    check_tracked(cli, juid)
    Path("api.py").write_text("import monkey\nmonkey.Monkey()\n")
    other = json.loads(
        cli("run", "--json", "--env", "PYTHONPATH=", "--", python, "api.py", check=True).stdout
    )["job"]
    assert cli("logs", "--follow", other).returncode == 1
    assert cli("logs", "--stderr", other, check=True).stdout.splitlines()[-1] == (
        "AttributeError: monkey.Monkey is not available in a job on this worker: only the in-job "
        "API (checkpoint_dir, flush, log, log_params, preempted, summary) is, as monkey is not "
        "installed in the job's environment"
    )


def test_info_shows_each_metrics_last_and_best_value(home, monkey, cli):
    write(
        Path("train.py"),
        """
        import monkey
        for step, (loss, acc) in enumerate([(0.9, 0.5), (0.2, 0.8), (0.4, 0.7)]):
            monkey.log({"loss": loss, "acc": acc}, step=step)
        """,
    )
    job = monkey.run("python train.py")
    assert job.wait(60) == State.SUCCEEDED
    out = cli("info", job.juid, check=True).stdout
    assert re.search(r"\nmetric acc +last 0\.7 \(step 2\) · best 0\.8 \(max\) · 3 points\n", out)
    assert re.search(r"\nmetric loss +last 0\.4 \(step 2\) · best 0\.2 \(min\) · 3 points\n", out)
    assert "sys/" not in out
    info = json.loads(cli("info", job.juid, "--json", check=True).stdout)
    assert info["metrics"]["loss"] == {
        "last": 0.4,
        "step": 2,
        "min": 0.2,
        "max": 0.9,
        "count": 3,
        "goal": "min",
        "best": 0.2,
    }
