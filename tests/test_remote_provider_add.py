"""`monkey --remote lab provider add ...` (issue 27): the main node runs the command as its own,
for its admins: its providers.yml, its files (--key), its credentials and checks (sinfo,
the cloud's API); the laptop prints what it printed and exits with its status, and keeps
nothing of it. Against a real TLS server on 127.0.0.1, real sshd, Slurm and a blackhole."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from blackhole import Blackhole
from conftest import wait_for
from mainnode import MainNode, wait_until_ended
from slurm import PARTITION, SlurmLab, slurm, slurm_cluster  # noqa: F401 - fixtures
from sshd import Lab
from test_server import raw

pytestmark = pytest.mark.system


@pytest.fixture
def node(home: Path, tmp_path: Path):
    n = MainNode(home, tmp_path)
    n.server_env.pop("SSH_AUTH_SOCK", None)  # the main node's keys are its ~/.ssh files
    yield n
    n.close()


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


def providers_yml(node: MainNode) -> str | None:
    path = node.home / "providers.yml"
    return path.read_text() if path.exists() else None


def server_log(node: MainNode) -> str:
    """What the server logged after its start, once it is stopped."""
    assert node.proc is not None and node.proc.stdout is not None
    node.proc.send_signal(signal.SIGTERM)
    text = node.proc.stdout.read()
    node.proc.wait(timeout=30)
    return text


def test_an_admin_adds_an_ssh_provider_on_the_main_node_and_runs_jobs_there(node, tmp_path):
    lab = Lab(tmp_path / "srv-user")  # the main node's ~/.ssh: its key and known_hosts
    try:
        host = lab.add("h1")
        node.start()
        node.add_remote()
        admin = json.loads(node.server("server", "user", "list", "--json").stdout)[0]["name"]
        where = f"{lab.user}@{host.address}:{host.port}"
        # ~ is the main node's home: the key is a file there, not on the laptop
        added = node.laptop(
            *("--remote", "lab", "provider", "add", "ssh", "gpus", "--host", where),
            *("--key", "~/.ssh/id_ed25519", "--workdir", host.workdir),
        )
        assert (added.returncode, added.stdout, added.stderr) == (
            0,
            f"added provider 'gpus' (1 host(s)) to {node.home / 'providers.yml'}\n"
            "check it with: monkey provider check gpus\n",
            "",
        )
        [entry] = yaml.safe_load(providers_yml(node) or "")["providers"]["gpus"]["hosts"]
        assert entry["key"] == lab.key  # the main node's file
        assert "gpus" in node.laptop("--remote", "lab", "list", "providers").stdout
        check = node.laptop("--remote", "lab", "provider", "check", "gpus")
        assert check.returncode == 0 and " up " in check.stdout, check
        ran = node.laptop("--remote", "lab", "run", "--provider", "gpus", "--", "echo", "hi")
        assert ran.returncode == 0, ran.stderr
        juid = ran.stdout.strip()
        wait_until_ended(node, juid)
        assert node.laptop("--remote", "lab", "logs", juid).stdout == "hi\n"
        assert not (node.laptop_root / ".monkey").exists()  # no MONKEY_HOME on the laptop
        assert not [f for f in node.laptop_files() if "provider" in f or ".ssh" in f]
        # the server logs who added what, neither the arguments nor what the command printed
        log = server_log(node)
        told = [line for line in log.splitlines() if "monkey.server: " in line and "provid" in line]
        assert [line.split("monkey.server: ")[1] for line in told] == [
            f"{admin} added provider gpus (ssh)"
        ], log
        assert "check it with" not in log and "(1 host(s))" not in log
    finally:
        lab.close()


def test_provider_add_through_a_remote_is_refused_to_users_and_tells_the_commands_errors(
    node, tmp_path
):
    node.start()
    bob = node.add_user("bob")
    node.add_remote(bob, name="bob")
    node.add_remote()
    # a user who is not an admin: 403 and one line, nothing written
    words = json.dumps({"args": [["ssh", "gpus", "--host", "h1"], "gpus"]}).encode()
    status, _, body = raw(node, "POST", "/api/v1/call/provider_add", bob, body=words)
    assert (status, json.loads(body)) == (
        403,
        {"error": "provider add is for admins of this server; ask one"},
    )
    refused = node.laptop("--remote", "bob", "provider", "add", "ssh", "gpus", "--host", "h1")
    assert (refused.returncode, refused.stdout) == (1, "")
    assert one_line(refused.stderr) == (
        "monkey: error: provider add is for admins of this server; ask one"
    )
    assert providers_yml(node) is None
    # an admin gets the command's own answers, as on the main node
    node.server("provider", "add", "ssh", "old", "--host", "h0")
    before = providers_yml(node)
    for argv in (
        ["ssh", "gpus", "--host", "h1", "--key", str(tmp_path / "no-such-key")],  # not there
        ["ssh", "old", "--host", "h1"],  # exists already
        ["ssh", "local", "--host", "h1"],  # a reserved name
        ["ssh", "gpus", "--host", "a@b@c"],
        ["ssh", "gpus"],  # no --host: a usage error (exit 2), said by the laptop's parser
        ["ssh", "gpus", "--host", "h1", "--cpus", "two"],
    ):
        here = node.server("provider", "add", *argv)
        there = node.laptop("--remote", "lab", "provider", "add", *argv)
        assert (there.returncode, there.stdout, there.stderr) == (
            here.returncode,
            here.stdout,
            here.stderr,
        ), argv
        assert there.returncode in (1, 2) and one_line(there.stderr), argv
    # what no client of this version sends: 400 and one line, nothing run
    for args, error in (
        (
            [["ssh", "x", "--host", "h1", "--remote", "other"], "x"],
            "--remote chooses the main node",
        ),
        ([["ssh x --host h1"], "x"], "send the words after `provider add`"),
        ([["rm", "--yes"], "x"], "send the words after `provider add`"),
        ([[], "x"], "send the words after `provider add`"),
    ):
        body = json.dumps({"args": args}).encode()
        status, _, answer = raw(node, "POST", "/api/v1/call/provider_add", node.token, body=body)
        assert status == 400 and error in json.loads(answer)["error"], (args, answer)
    assert providers_yml(node) == before
    # a path names a file of the main node: a key in the laptop's ~/.ssh is not there
    laptop_key = node.laptop_root / ".ssh" / "id_laptop"
    laptop_key.parent.mkdir(parents=True)
    laptop_key.write_text("not sent\n")
    words = ["provider", "add", "ssh", "x", "--host", "h1", "--key", "~/.ssh/id_laptop"]
    missing = node.laptop("--remote", "lab", *words)
    assert (missing.returncode, one_line(missing.stderr)) == (
        1,
        "monkey: error: --key ~/.ssh/id_laptop: no such file",
    )
    laptop_key.unlink()
    # aws with no --region and no terminal on the main node: the command's one line, no prompt
    aws = node.laptop("--remote", "lab", "provider", "add", "aws", "cloud", timeout=60)
    assert (aws.returncode, aws.stdout) == (1, "")
    assert one_line(aws.stderr).startswith("monkey: error: --region is needed: "), aws.stderr
    assert providers_yml(node) == before
    assert node.laptop_files() == [  # its remotes only
        ".config/monkey/bob.token",
        ".config/monkey/lab.token",
        ".config/monkey/remotes.json",
    ]


def test_the_laptops_environment_stays_on_the_laptop(node):
    """Credentials in the laptop's environment are not the main node's: the command there
    finds none (and the main node's own configuration decides)."""
    for key in [k for k in node.server_env if k.startswith("AWS_")]:
        del node.server_env[key]
    node.server_env["AWS_SHARED_CREDENTIALS_FILE"] = "/nonexistent/credentials"
    node.server_env["AWS_CONFIG_FILE"] = "/nonexistent/config"
    node.start()
    node.add_remote()
    words = ["provider", "add", "aws", "cloud", "--region", "us-east-1", "--size", "t3.micro"]
    words += ["--image", "ami-12345678", "--ssh-from", "10.0.0.0/8"]
    laptop = {"AWS_ACCESS_KEY_ID": "AKIALAPTOPONLY", "AWS_SECRET_ACCESS_KEY": "laptop-secret"}
    there = node.laptop("--remote", "lab", *words, **laptop)
    here = node.server(*words)
    assert (there.returncode, there.stdout, there.stderr) == (
        here.returncode,
        here.stdout,
        here.stderr,
    )
    assert there.returncode == 1 and "credentials" in one_line(there.stderr).lower()
    log = server_log(node)
    assert "AKIALAPTOPONLY" not in log and "laptop-secret" not in log
    print(there.stderr)


def _commands_naming(word: str) -> list[int]:
    """Pids of the processes whose command line holds WORD."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if word.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found


def test_provider_add_that_hangs_on_the_main_node_is_stopped_at_its_limit(node):
    """One runs at a time (each rewrites providers.yml): another meanwhile is one line."""
    hole, first = Blackhole(), None
    try:
        node.server_env.update(
            MONKEY_PROVIDER_ADD_LIMIT="20",
            AWS_ACCESS_KEY_ID="AKIAEXAMPLE",
            AWS_SECRET_ACCESS_KEY="secret",
        )
        node.start()
        node.add_remote()
        words = ["provider", "add", "aws", "cloud", "--region", "us-east-1", "--size", "t3.micro"]
        words += ["--image", "ami-12345678", "--ssh-from", "10.0.0.0/8"]
        first = subprocess.Popen(
            [*node.laptop_prefix, sys.executable, "-m", "monkey", "--remote", "lab", *words]
            + ["--endpoint", hole.endpoint],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=node.laptop_env,
        )
        wait_for(hole.hanging, timeout=60, what="the set-up to reach the endpoint")
        busy = node.laptop("--remote", "lab", "provider", "add", "ssh", "x", "--host", "h1")
        assert (busy.returncode, one_line(busy.stderr)) == (
            1,
            "monkey: error: another provider add runs on the main node; try again when it is done",
        )
        out, err = first.communicate(timeout=120)
        assert first.returncode == 1, (out, err)
        assert err.strip().splitlines()[-1] == (
            "monkey: error: provider add did not finish within 20s on the main node; stopped "
            "(providers.yml unchanged; run it again: what it created is reused)"
        )
        assert providers_yml(node) is None
        assert not _commands_naming(hole.endpoint)  # stopped with its children
        wait_for(lambda: not hole.hanging(), what="the stopped command's connection to close")
        # the next one runs (the first no longer holds the main node's turn)
        again = node.laptop("--remote", "lab", "provider", "add", "ssh", "x", "--host", "h1")
        assert again.returncode == 0, again.stderr
    finally:
        if first is not None and first.poll() is None:
            first.kill()
            first.communicate()
        hole.stop()


def test_slurm_provider_added_through_a_remote_is_checked_with_the_main_nodes_sinfo(
    home,
    tmp_path,
    slurm: SlurmLab,  # noqa: F811 - the fixture
):
    node = MainNode(home, tmp_path)
    node.laptop_env.pop("SLURM_CONF", None)  # Slurm's commands work on the main node only
    try:
        node.start()
        node.add_remote()
        there = node.laptop("--remote", "lab", "provider", "add", "slurm", "hpc")
        here = node.server("provider", "add", "slurm", "hpc2")
        assert (there.returncode, there.stdout.replace("'hpc'", "'hpc2'"), there.stderr) == (
            0,
            here.stdout,
            here.stderr,
        )
        assert f"(slurm, partition {PARTITION}:" in there.stdout
        assert "hpc:" in (providers_yml(node) or "")
        assert not (node.laptop_root / ".monkey").exists()
    finally:
        node.close()


@pytest.mark.parametrize(
    "line",
    [
        "ssh gpus --host me@gpu1:2222 --host gpu2 --user me --key ~/.ssh/id --cpus 2 --gpus 0 "
        "--memory 64G --workdir /data/w --python python3.11 --trust-on-first-use --force",
        "ssh --host=-odd --key=-k -- -named",  # values and a name that start with '-'
        "aws cloud --region us-east-1 --size t3.micro --image ami-1 --spot --max-instances 4 "
        "--idle-timeout 600 --bucket b --endpoint http://127.0.0.1:5000 --credentials ~/c "
        "--profile p --user ubuntu --address private --ssh-from 10.0.0.0/8 --subnet-cidr "
        "10.9.0.0/24 --metadata-url http://127.0.0.1:9/ --force",
        "aws cloud --no-spot",
        "gcp g --credentials ~/sa.json --project p --zone a,b --size e2-small --image debian-12 "
        "--no-preemptible --network n --max-instances 2 --idle-timeout 60 --bucket b --user u "
        "--address public --ssh-from 1.2.3.4/32 --endpoint http://x --storage-endpoint http://y",
        "gcp g --preemptible",
        "slurm hpc --partition p --account a --qos q --time 1:00:00 --gres gpu:1 --constraint c "
        "--signal B:USR1@60 --workdir /w --login me@login:22 --key ~/.ssh/k --trust-new-host "
        "--extra-arg=--nice=10 --extra-arg=--exclusive --force",
        "slurm hpc",
    ],
)
def test_the_words_sent_to_the_main_node_give_the_same_command(line):
    """What the laptop sends is the command line the user typed, written out in full: the
    main node parses it into the same options (the laptop's parser read it first)."""
    import argparse

    from monkey.shell.provider_commands import command_words, provider_parser

    def parsed(words: list[str]) -> tuple[dict[str, object], argparse.ArgumentParser]:
        parser = provider_parser(argparse.ArgumentParser)
        args = parser.parse_args(["add", *words])
        kinds = next(a for a in parser._actions if a.dest == "action").choices["add"]
        kind = next(a for a in kinds._actions if a.dest == "kind").choices[args.kind]
        return args, kind

    args, kind = parsed(line.split())
    words = command_words(args, kind)
    again, _ = parsed(words)
    assert {k: v for k, v in vars(again).items() if k != "func"} == {
        k: v for k, v in vars(args).items() if k != "func"
    }, words
    assert words[0] == args.kind and words[-2:] == ["--", args.name]


def test_an_admin_adds_an_ec2_provider_with_the_main_nodes_credentials(home, tmp_path, moto):
    """The cloud set-up runs on the main node, with its credentials (the laptop has none):
    the VPC, key pair and bucket are made there, the private key lands in its MONKEY_HOME."""
    node = MainNode(home, tmp_path)
    for key in [k for k in node.laptop_env if k.startswith("AWS_")]:
        del node.laptop_env[key]
    try:
        node.start()
        node.add_remote()
        done = node.laptop(
            *("--remote", "lab", "provider", "add", "aws", "cloud", "--endpoint", moto.endpoint),
            *("--region", "us-east-1", "--size", "t3.micro", "--image", moto.image),
            *("--subnet-cidr", "127.0.0.0/24", "--address", "private", "--user", "tester"),
            timeout=180,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines()[-1] == (
            f"added provider 'cloud' (ec2, us-east-1) to {node.home / 'providers.yml'}"
        )
        entry = yaml.safe_load(providers_yml(node) or "")["providers"]["cloud"]
        assert entry["vpc"] in [v["VpcId"] for v in moto.boto3("ec2").describe_vpcs()["Vpcs"]]
        assert Path(entry["key"]).is_file() and Path(entry["key"]).is_relative_to(node.home)
        assert not (node.laptop_root / ".monkey").exists()
        assert node.laptop_files() == [".config/monkey/lab.token", ".config/monkey/remotes.json"]
    finally:
        node.close()
