"""Every command and option README's command table documents runs at least once, against a
real core, and ends with the exit status a user expects and never a traceback.

The table is read from README.md (tests/readme_table.py): a row or an option added there
without a case here fails `test_every_documented_option_has_a_case`."""

from __future__ import annotations

import json
import re
import shlex
import socket
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import wait_for
from tests.readme_table import command_rows, leaves, options, row_commands

TRAIN = """\
import json, os, sys
import monkey
lr = float(sys.argv[sys.argv.index('--lr') + 1]) if '--lr' in sys.argv else 0.1
os.makedirs('output', exist_ok=True)
open('output/result.txt', 'w').write(str(lr))
for step in range(3):
    monkey.log({'acc': lr * step, 'loss': 1 - lr * step}, step=step)
print(json.dumps({'experiment': {'val': lr}}))
print('done', lr, file=sys.stderr)
"""

# (command line, the exit statuses it may end with). {a} and {b} are succeeded jobs with
# metrics and persisted folders, {failed} a failed one, {slow} one that sleeps, {sweep} a
# finished sweep named `scan`, {tmp} a scratch folder. In order: some change what follows.
CASES: list[tuple[str, set[int]]] = [
    ("--help", {0}),
    ("--version", {0}),
    # run
    (
        "run --provider local --name n1 --cpus 1 --gpus 0 --memory 1M --time 1m --outputs 'out*' "
        "--retries 1 --dataset {tmp}/data.csv:D --env K=V --workdir . --no-job-yml --json --yes "
        "-- echo hi",
        {0},
    ),
    ("run -p local -d {tmp}/data.csv -e K=V -f -- echo hi", {0}),
    ("run --follow --job-yml job.yml -- echo hi", {0}),
    ("run --host nowhere -- echo hi", {1}),
    ("run --after {a} --after-any {failed},{b} --priority 3 -- echo after", {0}),
    ("run --after no-such-sweep -- echo never", {1}),
    ("run", {2}),
    # images: a registry that is not there is refused at submission, in one line
    ("run --image 127.0.0.1:1/lab/none:1 -- true", {1}),
    ("sweep --image 127.0.0.1:1/lab/none:1 --grid x=1 -- echo {{x}}", {1}),
    ("registry list", {0}),
    ("registry list --json", {0}),
    ("registry login 127.0.0.1:1 --username u --password-stdin --ca-file {tmp}/no.crt", {1}),
    ("registry login 127.0.0.1:1 -u u --password-stdin", {1}),
    ("registry logout 127.0.0.1:1", {1}),
    # list
    ("list jobs --running --queued --finished --failed --provider local --limit 5", {0}),
    ("list jobs --all --json", {0}),
    ("list jobs --mine", {0}),
    ("list jobs --owner nobody --json", {0}),
    ("list jobs --mine --owner x", {2}),
    ("list providers", {0}),
    ("list providers --json", {0}),
    ("list providers --monkey-instances --json", {0}),
    ("list providers --monkey-instances --all", {0}),
    ("list providers -a", {2}),
    ("list instances", {0}),
    ("list instances --all --json", {0}),
    ("list instances -a", {0}),
    ("list sweeps", {0}),
    ("list sweeps --json", {0}),
    # info, logs, search
    ("info job {a}", {0}),
    ("info {a} --json", {0}),
    ("info job --juid {a} --files", {0}),
    ("info job {a} --files --json", {0}),
    ("info job", {2}),
    ("logs {a}", {0}),
    ("logs --follow {a}", {0}),
    ("logs -f --juid {failed}", {3}),
    ("logs {a} --stdout --tail 1", {0}),
    ("logs {a} --stderr --attempt 1", {0}),
    ("logs {a} --setup", {0}),
    ("logs {a} --follow --tail 1 --stderr", {0}),
    ("search done --limit 5", {0}),
    ("search done --json", {0}),
    # metrics, compare, diff, plot, report
    ("metrics {a}", {0}),
    ("metrics {a} --name acc", {0}),
    ("metrics --juid {a} --json", {0}),
    ("metrics {a} --csv", {0}),
    ("metrics {a} --plot --x time", {0}),
    ("compare {a} {b} --sort acc --reverse --sys", {0}),
    ("compare --juid {a} {b} --json", {0}),
    ("compare --sweep scan --csv", {0}),
    ("diff {a} {b}", {0}),
    ("diff {a} --juid {b} --json", {0}),
    ("diff {a}", {2}),
    (
        "plot {a} {b} -m acc -m loss -o {tmp}/p.png --smooth 0.6 --log-y --x step --size 600x400",
        {0},
    ),
    ("plot --sweep scan --metric acc --out {tmp}/s.svg", {0}),
    ("plot --juid {a} --jobs {b} --name 'n*' --since 1d -m acc -o {tmp}/j.png", {0, 1}),
    ("plot --jobs {a} {b} -m acc -o {tmp}/j.png", {0}),
    ("report scan -o {tmp}/r.html", {0}),
    ("report --jobs {a} {b} --name '*' --since 1d --out {tmp}/r2.html", {0}),
    # export
    ("export {a} {b} --to {tmp}/runs.db", {0}),
    ("export --sweep scan --csv {tmp}/csv --json", {0}),
    ("export --name 'n*' --since 1d --to {tmp}/runs.db", {0}),
    ("export", {2}),
    # sweeps
    (
        "sweep --grid lr=0.1,0.2 --metric acc --goal max --max-parallel 1 --retries 0 "
        "--early-terminate median --name s2 --max-cells 10 --provider local --cpus 1 --gpus 0 "
        "--memory 1M --dataset {tmp}/data.csv:D --env K=V --workdir . --time 10m --yes --json "
        "-- sh -c 'sleep 600 # {{lr}}'",
        {0},
    ),
    (
        "sweep --random 2 --uniform a=0:1 --log-uniform b=0.001:0.1 --int c=1:3 --choice d=x,y "
        "--seed 1 -- echo {{a}} {{b}} {{c}} {{d}}",
        {0},
    ),
    ("sweep --file {tmp}/sweep.yml", {0}),
    ("sweep --grid x=1,2 --after {a} --after-any {failed} --priority -1 -- echo {{x}}", {0}),
    ("sweep status scan", {0}),
    ("sweep status scan --json", {0}),
    ("sweep pause s2", {0}),
    ("sweep resume s2", {0}),
    ("sweep cancel s2", {0}),
    ("sweep retry s2", {0}),
    ("sweep cancel s2", {0}),
    ("sweep retry scan", {1}),
    ("sweep stauts scan", {2}),
    ("sweep note scan 'x=2 wins'", {0}),
    ("sweep --clear note scan", {0}),
    ("sweep tag scan paper", {0}),
    ("sweep untag scan paper", {0}),
    ("sweep tag scan 'no way'", {1}),
    # rerun, clone, cat, pull
    (
        "rerun {a} --set lr=0.3 --provider local --cpus 1 --gpus 0 --memory 1M --time 1m "
        "--name again --json",
        {0},
    ),
    ("rerun {a} -f", {0}),
    ("rerun {a} --after scan --after-any {failed} --priority 2", {0}),
    ("rerun --juid {a} --follow", {0}),
    ("rerun --sweep scan --failed", {1}),
    ("rerun --sweep scan --cells 1 --in-place", {0}),
    ("rerun --sweep scan --cells x", {2}),
    ("clone {a} --to {tmp}/c1 --with-data", {0}),
    ("clone --juid {a} --to {tmp}/c2", {0}),
    ("cat {a} train.py", {0}),
    ("cat --juid {a} nothing.py", {1}),
    ("pull {a} --to {tmp}/pulled", {0}),
    ("pull --juid {a} --to {tmp}/pulled --force", {0}),
    # job control
    ("job pause {slow}", {0}),
    ("resume --juid {slow}", {0}),
    ("pause --juid {slow}", {0}),
    ("job priority {slow} 4", {0}),
    ("job resume {slow}", {0}),
    ("job priority {a} 4", {1}),
    ("job note {a} 'a fine run'", {0}),
    ("job note --juid {a} --clear", {0}),
    ("job note {a}", {2}),
    ("job tag {a} baseline", {0}),
    ("job tag --juid {a} 'no way'", {1}),
    ("list jobs --tag baseline", {0}),
    ("job untag {a} baseline", {0}),
    ("job untag --juid {a} baseline", {0}),
    ("job cancel --juid {slow}", {0}),
    ("cancel {slow}", {1}),
    ("kill job --juid {slow2}", {0}),
    ("kill job {slow2}", {1}),
    ("job retry {failed}", {0}),
    ("retry --juid {b}", {0}),
    ("logs --follow --juid {failed}", {3}),
    ("logs -f {b}", {0}),  # until the retries end
    # dashboard (no terminal here: one line saying so)
    ("dash", {1}),
    ("dash {a}", {1}),
    ("dash --juid {a}", {1}),
    ("web --juid nosuchjob --no-browser", {1}),  # nothing started for an unknown job
    ("web -j {a} --no-browser", {0}),  # a one-time link (the server of this home started)
    ("web {a} --no-browser", {0}),
    ("web --no-browser", {0}),
    ("web --sweep scan --no-browser", {0}),
    ("web --compare {a} {b} --no-browser", {0}),
    ("server stop", {0}),  # the server `web` started: the server cases below start their own
    # providers and instances (nothing answers at these addresses: one-line errors)
    (
        "provider add ssh lab --host me@127.0.0.1:1 --user me --key {tmp}/key --cpus 2 --gpus 0 "
        "--memory 1G --workdir /tmp/nowhere --python python3 --trust-on-first-use",
        {0},
    ),
    ("provider add ssh lab --host 127.0.0.1:1 --force", {0}),
    ("provider check lab", {1}),
    ("provider check lab --json", {1}),
    (
        "provider add aws cloud --region us-east-1 --size t3.micro --image ami-12345678 --spot "
        "--max-instances 1 --idle-timeout 60 --bucket b --endpoint http://127.0.0.1:1 "
        "--credentials {tmp}/aws-credentials --profile p --user ubuntu --address private "
        "--ssh-from 127.0.0.1/32 --subnet-cidr 10.0.0.0/24 --force",
        {1},
    ),
    (
        "provider add gcp g --credentials {tmp}/no-key.json --project p --zone us-central1-a "
        "--size e2-small --image debian-12 --preemptible --network default --max-instances 1 "
        "--idle-timeout 60 --bucket b --user monkey --address public --ssh-from 127.0.0.1/32 "
        "--force",
        {1},
    ),
    (
        "provider add slurm hpc --partition p --account a --qos q --time 1:00:00 --gres gpu:1 "
        "--constraint c --signal B:USR1@60 --workdir {tmp}/slurm --extra-arg=--nice=1 "
        "--login me@127.0.0.1:1 --key {tmp}/key --trust-new-host --force",
        {1},
    ),
    (
        "provider add kubernetes k --kubeconfig {tmp}/no-kubeconfig --context c --namespace n "
        "--image python:3.12-slim --schedule-timeout 30 --memory 1G --node-selector pool=gpu "
        "--priority-class p --service-account s --queue q --cache-claim c --checkpoint-every 10 "
        "--force",
        {1},
    ),
    ("create instance --provider local", {1}),
    ("create instance -p lab --size big", {1}),
    ("create instance -p lab --spot", {1}),
    ("create instance -p lab --on-demand", {1}),
    ("create instance -p lab --host nope --json", {1}),
    ("delete instance i-nothing --force", {1}),
    # housekeeping
    ("rm {failed} --yes", {0}),
    ("rm --sweep s2 --yes", {0}),
    ("rm --older-than 30d --failed -y", {0}),
    ("rm --juid {b} --yes", {0}),
    ("verify", {0}),
    ("verify {a} --juid {a}", {0}),
    ("gc --grace 1h", {0}),
    ("gc --grace 0", {0}),
    ("gc --image-keep 7d", {0}),
    ("du", {0}),
    ("du --json", {0}),
    ("du --hosts", {0}),
    ("du --hosts --json", {0}),
    ("completion bash", {0}),
    ("completion zsh", {0}),
    (
        "init --name proj --env-type pip --env-file requirements.txt --install-script setup.sh "
        "--persist output --data data --yes --force",
        {0},
    ),
    # notifications (nothing listens on {port} yet: a test is refused; no add sends)
    (
        "notify add ci webhook http://127.0.0.1:{port}/hook --secret generated "
        "--on failed,sweep --sweep scan --name 'n*'",
        {0},
    ),
    ("notify add team slack https://hooks.example.org/services/T/B/X --on all", {0}),
    (
        "notify add ops slack https://hooks.example.org/services/T/B/Y --on idle --idle-after 1h --spend-over 100",
        {0},
    ),
    (
        "notify add me email me@example.org --smtp 127.0.0.1:{port} --plain --from m@example.org "
        "--no-check",
        {0},
    ),
    ("notify add m2 email me@example.org --smtp smtp.example.org --ssl --no-check", {0}),
    ("notify add m3 email me@example.org --smtp smtp.example.org --starttls --no-check", {0}),
    (
        "notify add m4 email me@example.org --smtp smtp.example.org --user u "
        "--password-env NO_SUCH_VARIABLE",
        {1},
    ),
    ("notify add x webhook http://example.org/x", {1}),
    ("notify list", {0}),
    ("notify list --json", {0}),
    ("notify test ci", {1}),
    ("run --notify team -- echo told", {0}),
    ("sweep --grid x=5,6 --notify team,ci -- echo {{x}}", {0}),
    ("rerun {a} --notify team", {0}),
    ("rerun --sweep scan --notify team", {2}),
    ("notify remove me", {0}),
    ("notify remove me", {1}),
    # the main node ({port}: a free port; the remotes' settings go to {tmp}/config)
    ("server start --bind 127.0.0.1:{port}", {0}),
    ("server status", {0}),
    ("server status --json", {0}),
    ("server run --bind 127.0.0.1:{port} --cert {tmp}/key --key {tmp}/key --no-tls", {1}),
    ("server start", {1}),
    ("server start --trusted-proxy 127.0.0.1/32", {1}),  # already running
    ("server run --bind 127.0.0.1:{port} --trusted-proxy 10.0.0.0/33", {1}),
    ("server start --cert {tmp}/key --key {tmp}/key --no-tls", {1}),
    ("server user add bob --admin", {0}),
    ("server user list", {0}),
    ("server user list --json", {0}),
    ("server user token bob", {0}),
    ("server audit", {0}),
    ("server audit --json", {0}),
    ("server audit --user bob --since 1h", {0}),
    ("server quota set bob --provider local --jobs 4 --gpus 1 --spend 2.5", {0}),
    ("server quota set --default --jobs unlimited", {0}),
    ("server quota set bob --share 2", {0}),
    ("server quota set bob --storage 50G", {0}),
    ("server notify-allow 10.1.0.0/16", {0}),
    ("server notify-allow", {0}),
    ("server notify-allow 10.1.0.0/16 --remove", {0}),
    ("server quota set bob --jobs many", {1}),
    ("server quota list", {0}),
    ("server quota list --json", {0}),
    ("server quota remove bob --provider local", {0}),
    ("server quota remove --default", {0}),
    ("remote add lab https://127.0.0.1:{port} --token nope", {1}),
    ("remote add lab https://127.0.0.1:{port} --token nope --fingerprint SHA256:" + "0" * 64, {1}),
    ("remote add lab ssh://nobody@127.0.0.1:{port} --token nope --trust-on-first-use", {1}),
    ("remote use lab", {1}),
    ("remote use --local", {0}),
    ("remote list", {0}),
    ("remote list --json", {0}),
    ("remote remove lab", {1}),
    ("remote prune lab", {1}),
    ("remote prune", {0}),
    ("server user remove bob", {0}),
    ("server install-service --print", {0}),
    ("server install-service", {0}),
    ("server stop", {0}),
    ("server run --bind 0.0.0.0:{port} --no-tls", {1}),
    ("daemon status", {0}),
    ("daemon start", {0}),
    ("daemon run", {1}),
    ("daemon stop --all", {0}),
    ("daemon status", {3}),
]


ENDED = {"succeeded", "failed", "cancelled"}

# The cases that ask the core for something it does later (pause, cancel or kill a running
# job): the job (or sweep's cells) to wait for and the states that mean it is done, so the
# next case starts where a user who waited for the first would (`resume` refuses a job
# still being paused).
SETTLE: dict[str, tuple[str, set[str]]] = {
    "sweep cancel s2": ("s2", ENDED),
    "job pause {slow}": ("slow", {"paused"}),
    "pause --juid {slow}": ("slow", {"paused"}),
    "job cancel --juid {slow}": ("slow", {"cancelled"}),
    "kill job --juid {slow2}": ("slow2", ENDED),
}


def _settle(cli: Any, case: str, values: dict[str, str]) -> None:
    """Wait until what CASE asked of the core is done (see SETTLE)."""
    if case not in SETTLE:
        return
    ref, states = SETTLE[case]

    def done() -> bool:
        if ref in values:
            return json.loads(cli("info", values[ref], "--json").stdout)["state"] in states
        return all(
            j["state"] in states
            for j in json.loads(cli("sweep", "status", ref, "--json").stdout)["jobs"]
        )

    wait_for(done, timeout=60, what=f"`monkey {case}` to be done")


def _argv(case: str) -> list[str]:
    return shlex.split(case)


def test_every_documented_option_has_a_case() -> None:
    """README's rows, command by command and option by option, against CASES."""
    from monkey.shell.cli import expand

    parsers = leaves()
    runs = [expand(_argv(c)) for c, _ in CASES if not c.startswith("-")]
    missing = []
    for row in command_rows():
        for command in row_commands(row, parsers):
            words = command.split()
            mine = [argv[len(words) :] for argv in runs if argv[: len(words)] == words]
            if not mine:
                missing.append(f"`{command}`")
            known = {o for strings in options(parsers[command]) for o in strings}
            for flag in sorted(row.flags & known):
                if not any(flag in [w.partition("=")[0] for w in argv] for argv in mine):
                    missing.append(f"`{command} {flag}`")
    assert not missing, "README documents these, and no case runs them: " + ", ".join(missing)


def _setup(cli: Any, home: Path, tmp: Path) -> dict[str, str]:
    """Jobs, a sweep and files for the cases."""
    home.mkdir(exist_ok=True)  # slots for the sleeping jobs and the rest, on 2 CPUs
    (home / "providers.yml").write_text("providers:\n  local: {type: local, slots: 8}\n")
    Path("train.py").write_text(TRAIN)
    Path("job.yml").write_text(
        yaml.safe_dump({"name": "proj", "persist": [{"name": "output", "path": "output"}]})
    )
    Path("requirements.txt").write_text("")
    Path("setup.sh").write_text("true\n")
    Path("data").mkdir()
    (tmp / "data.csv").write_text("a,b\n1,2\n")
    (tmp / "key").write_text("not a key\n")
    (tmp / "aws-credentials").write_text("[p]\naws_access_key_id = x\naws_secret_access_key = y\n")
    (tmp / "sweep.yml").write_text("command: echo {x}\nparameters:\n  x: [1]\n")

    def submit(*argv: str) -> str:
        return json.loads(cli("run", "--json", *argv, check=True).stdout)["job"]

    refs = {
        "a": submit("--name", "n-a", "--", "python3", "train.py", "--lr", "0.1"),
        "b": submit("--name", "n-b", "--", "python3", "train.py", "--lr", "0.2"),
        "failed": submit("--no-job-yml", "--", "sh", "-c", "exit 3"),
        "slow": submit("--no-job-yml", "--", "sleep", "600"),
        "slow2": submit("--no-job-yml", "--", "sleep", "600"),
    }
    cli(
        "sweep",
        "--name",
        "scan",
        "--grid",
        "lr=0.1,0.2",
        "--metric",
        "acc",
        "--",
        "python3",
        "train.py",
        "--lr",
        "{lr}",
        check=True,
    )
    for ref in ("a", "b", "failed"):
        wait_for(
            lambda r=ref: (
                json.loads(cli("info", refs[r], "--json").stdout)["state"]
                in ("succeeded", "failed")
            ),
            timeout=60,
            what=f"job {ref} to end",
        )
    wait_for(
        lambda: json.loads(cli("sweep", "status", "scan", "--json").stdout)["state"] == "finished",
        timeout=60,
        what="the sweep to end",
    )
    assert json.loads(cli("info", refs["a"], "--json").stdout)["state"] == "succeeded"
    return {**refs, "tmp": str(tmp)}


def test_every_documented_command_runs_without_a_traceback(
    cli, home: Path, tmp_path: Path, monkeypatch: Any
) -> None:
    (tmp_path / "scratch").mkdir()
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "scratch" / "config"))  # remotes, units
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "scratch" / "cache"))  # remotes' caches
    values = _setup(cli, home, tmp_path / "scratch")
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        values["port"] = str(free.getsockname()[1])
    problems = []
    for case, codes in CASES:
        argv = _argv(case.format(**values))
        proc = cli(*argv, input="", process=case.startswith(("-", "daemon")))  # the entry point
        where = f"monkey {shlex.join(argv)} -> {proc.returncode}"
        if "Traceback" in proc.stderr or "Traceback" in proc.stdout:
            problems.append(f"{where}: traceback\n{proc.stderr[-2000:]}")
        elif proc.returncode not in codes:
            problems.append(f"{where}, expected {sorted(codes)}: {proc.stderr.strip()[-500:]}")
        elif (
            proc.returncode
            and not re.match(r"monkey: ", proc.stderr)
            and argv[:2] not in (["provider", "check"], ["daemon", "status"])
        ):
            problems.append(f"{where}: an error that is not a `monkey: ...` line: {proc.stderr!r}")
        _settle(cli, case, values)
    assert not problems, "\n".join(problems)
