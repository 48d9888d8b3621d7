"""`monkey provider add aws` and the EC2 clients, against moto's server on 127.0.0.1."""

from __future__ import annotations

import os
import pty
import socket
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from monkey.config import Home
from monkey.drivers.ec2_setup import validate
from monkey.models import MonkeyError

SECRET = "never-stored-secret-0123456789"


def add_aws(
    cli: Any, moto: Any, *extra: str, name: str = "aws"
) -> subprocess.CompletedProcess[str]:
    return cli(
        "provider",
        "add",
        "aws",
        name,
        "--endpoint",
        moto.endpoint,
        "--region",
        "us-east-1",
        "--size",
        "t3.micro",
        "--image",
        moto.image,
        "--subnet-cidr",
        "127.0.0.0/24",
        "--address",
        "private",
        "--user",
        "tester",
        *extra,
    )


def entry(home: Path, name: str = "aws") -> dict[str, Any]:
    return yaml.safe_load((home / "providers.yml").read_text())["providers"][name]


def count(moto: Any) -> dict[str, int]:
    """How many of each resource `provider add aws` creates exist in moto now."""
    ec2, s3 = moto.boto3("ec2"), moto.boto3("s3")
    return {
        "vpcs": len(ec2.describe_vpcs()["Vpcs"]),
        "subnets": len(ec2.describe_subnets()["Subnets"]),
        "internet_gateways": len(ec2.describe_internet_gateways()["InternetGateways"]),
        "security_groups": len(ec2.describe_security_groups()["SecurityGroups"]),
        "key_pairs": len(ec2.describe_key_pairs()["KeyPairs"]),
        "routes": sum(len(t["Routes"]) for t in ec2.describe_route_tables()["RouteTables"]),
        "buckets": len(s3.list_buckets()["Buckets"]),
    }


def tags(resource: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in resource.get("Tags", [])}


def test_add_aws_by_flags_creates_and_records_everything(cli, moto, home, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    proc = add_aws(
        cli,
        moto,
        "--bucket",
        "monkey-test-bucket",
        "--spot",
        "--max-instances",
        "3",
        "--idle-timeout",
        "120",
    )
    assert proc.returncode == 0, proc.stderr
    e = entry(home)
    home_id = Home(home).home_id()
    mine = {"monkey-home": home_id, "Name": "monkey-aws"}
    ec2 = moto.boto3("ec2")
    assert e["type"] == "ec2" and e["region"] == "us-east-1" and e["endpoint"] == moto.endpoint
    assert (e["size"], e["image"], e["user"], e["address"]) == (
        "t3.micro",
        moto.image,
        "tester",
        "private",
    )
    assert (e["spot"], e["max_instances"], e["idle_timeout"]) == (True, 3, 120)
    assert e["metadata_url"] == "http://169.254.169.254"

    vpc = ec2.describe_vpcs(VpcIds=[e["vpc"]])["Vpcs"][0]
    assert vpc["CidrBlock"] == "127.0.0.0/24" and tags(vpc) == mine
    subnet = ec2.describe_subnets(SubnetIds=[e["subnet"]])["Subnets"][0]
    assert (
        subnet["VpcId"] == e["vpc"]
        and subnet["CidrBlock"] == "127.0.0.0/24"
        and tags(subnet) == mine
    )
    gateways = ec2.describe_internet_gateways(
        Filters=[{"Name": "attachment.vpc-id", "Values": [e["vpc"]]}]
    )["InternetGateways"]
    assert len(gateways) == 1 and tags(gateways[0]) == mine
    igw = gateways[0]["InternetGatewayId"]
    main = ec2.describe_route_tables(
        Filters=[
            {"Name": "vpc-id", "Values": [e["vpc"]]},
            {"Name": "association.main", "Values": ["true"]},
        ]
    )
    routes = {
        r["DestinationCidrBlock"]: r.get("GatewayId") for r in main["RouteTables"][0]["Routes"]
    }
    assert routes["0.0.0.0/0"] == igw

    group = ec2.describe_security_groups(GroupIds=[e["security_group"]])["SecurityGroups"][0]
    assert group["VpcId"] == e["vpc"] and tags(group) == mine
    assert [
        (p["IpProtocol"], p["FromPort"], p["ToPort"], [r["CidrIp"] for r in p["IpRanges"]])
        for p in group["IpPermissions"]
    ] == [("tcp", 22, 22, ["127.0.0.1/32"])]

    key = Path(e["key"])
    assert key.parent == home / "keys" and stat.S_IMODE(key.stat().st_mode) == 0o600
    pair = ec2.describe_key_pairs(KeyNames=[e["key_name"]], IncludePublicKey=True)["KeyPairs"][0]
    assert tags(pair) == mine
    derived = subprocess.run(
        ["ssh-keygen", "-y", "-f", str(key)], capture_output=True, text=True, check=True
    ).stdout.split()[:2]
    assert pair["PublicKey"].split()[:2] == derived

    s3 = moto.boto3("s3")
    assert [b["Name"] for b in s3.list_buckets()["Buckets"]] == ["monkey-test-bucket"]
    assert e["bucket"] == "monkey-test-bucket"
    bucket_tags = s3.get_bucket_tagging(Bucket="monkey-test-bucket")["TagSet"]
    assert {t["Key"]: t["Value"] for t in bucket_tags} == mine

    # No secret leaves its place: the private key only in keys/, AWS keys nowhere.
    private = [line for line in key.read_text().splitlines() if "PRIVATE KEY" not in line]
    for path in home.rglob("*"):
        if path.is_file() and path.parent != home / "keys":
            data = path.read_bytes()
            assert SECRET.encode() not in data, path
            assert not any(line.encode() in data for line in private), path
    assert SECRET not in proc.stdout + proc.stderr


def test_second_run_creates_nothing_and_keeps_the_ids(cli, moto, home):
    assert add_aws(cli, moto).returncode == 0
    first, before = entry(home), count(moto)
    again = cli("provider", "add", "aws", "aws")  # flags not given: the provider's values
    assert again.returncode == 0, again.stderr
    assert "created" not in again.stdout and "reusing VPC" in again.stdout
    assert count(moto) == before
    assert entry(home) == first
    assert first["bucket"] == f"monkey-{Home(home).home_id()}-aws"


def test_failure_midway_changes_nothing_and_the_next_run_completes_it(cli, moto, home):
    assert cli("provider", "add", "ssh", "lab", "--host", "me@gpu1").returncode == 0
    before_file = (home / "providers.yml").read_bytes()
    home_id = Home(home).ensure().home_id()
    ec2 = moto.boto3("ec2")
    # Someone else's key pair holds the name this provider's key pair needs.
    stranger = subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(home.parent / "stranger")],
        check=True,
    )
    assert stranger.returncode == 0
    ec2.import_key_pair(
        KeyName=f"monkey-aws-{home_id}",
        PublicKeyMaterial=(home.parent / "stranger.pub").read_bytes(),
    )

    failed = add_aws(cli, moto)
    assert failed.returncode == 1
    assert failed.stderr.count("\n") == 1 and "delete-key-pair" in failed.stderr
    assert (home / "providers.yml").read_bytes() == before_file
    vpcs = ec2.describe_vpcs(Filters=[{"Name": "tag:monkey-home", "Values": [home_id]}])["Vpcs"]
    assert len(vpcs) == 1
    assert f"created so far, reused by the next run: VPC {vpcs[0]['VpcId']}" in failed.stdout
    partial = count(moto)

    ec2.delete_key_pair(KeyName=f"monkey-aws-{home_id}")
    done = add_aws(cli, moto)
    assert done.returncode == 0, done.stderr
    assert entry(home)["vpc"] == vpcs[0]["VpcId"]
    assert "created VPC" not in done.stdout and "created key pair" in done.stdout
    after = count(moto)
    assert {k: after[k] - partial[k] for k in after} == {
        "vpcs": 0,
        "subnets": 0,
        "internet_gateways": 0,
        "security_groups": 0,
        "key_pairs": 0,
        "routes": 0,
        "buckets": 1,
    }  # the stranger's key pair gone, ours imported
    assert entry(home, "lab")["type"] == "ssh"


def test_refused_credentials_are_one_line_and_create_nothing(cli, moto, home):
    assert cli("provider", "add", "ssh", "lab", "--host", "me@gpu1").returncode == 0
    before_file, before = (home / "providers.yml").read_bytes(), count(moto)
    moto.reject_credentials()
    proc = add_aws(cli, moto)
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1
    assert "AWS refused the credentials (InvalidClientTokenId" in proc.stderr
    assert "--profile" in proc.stderr
    assert (home / "providers.yml").read_bytes() == before_file
    moto.server.reset_auth()
    assert count(moto) == before


def test_unreachable_endpoint_is_one_line(cli, moto, home):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    proc = cli(
        "provider",
        "add",
        "aws",
        "aws",
        "--endpoint",
        f"http://127.0.0.1:{port}",
        "--region",
        "us-east-1",
        "--size",
        "t3.micro",
        "--image",
        moto.image,
    )
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "checking the AWS credentials" in proc.stderr
    assert "--endpoint" in proc.stderr
    assert not (home / "providers.yml").exists()


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--image", "ami-00000000"], "InvalidAMIID.NotFound"),
        (["--size", "t9.enormous"], "InvalidInstanceType"),
        (["--bucket", "Not_A_Bucket"], "bucket 'Not_A_Bucket' is not a bucket name"),
        (["--region", "zz-north-9"], "region 'zz-north-9' is not an EC2 region"),
        (["--subnet-cidr", "10.0.0.0/8"], "from /16 to /28"),
    ],
)
def test_bad_values_are_refused_before_anything_is_created(cli, moto, home, flags, says):
    before = count(moto)
    proc = add_aws(cli, moto, *flags)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1
    assert says in proc.stderr
    assert count(moto) == before
    assert not (home / "providers.yml").exists()


def test_an_endpoint_elsewhere_needs_ssh_from(moto, home, tmp_path):
    """Off this machine monkey never guesses its own address: it asks for --ssh-from, then
    keeps the rule on later runs. (The endpoint's name resolves to 127.0.0.1 through an
    /etc/hosts bind-mounted in a private mount namespace: no traffic leaves loopback.)"""
    probe = subprocess.run(["unshare", "--mount", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"a private mount namespace is not permitted here: {probe.stderr.strip()}")
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 ec2.test.invalid\n" + Path("/etc/hosts").read_text())
    endpoint = moto.endpoint.replace("127.0.0.1", "ec2.test.invalid")

    def add(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                "unshare",
                "--mount",
                "sh",
                "-c",
                'mount --bind "$0" /etc/hosts && exec "$@"',
                str(hosts),
                sys.executable,
                "-m",
                "monkey",
                "provider",
                "add",
                "aws",
                "aws",
                "--endpoint",
                endpoint,
                "--region",
                "us-east-1",
                "--size",
                "t3.micro",
                "--image",
                moto.image,
                *extra,
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )

    before = count(moto)
    refused = add()
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1
    assert "--ssh-from CIDR is needed" in refused.stderr
    assert count(moto) == before and not (home / "providers.yml").exists()
    assert add("--ssh-from", "198.51.100.7").returncode == 0
    assert add().returncode == 0  # the group's rule is kept
    group = moto.boto3("ec2").describe_security_groups(GroupIds=[entry(home)["security_group"]])[
        "SecurityGroups"
    ][0]
    assert [r["CidrIp"] for p in group["IpPermissions"] for r in p["IpRanges"]] == [
        "198.51.100.7/32"
    ]


def test_missing_values_off_a_terminal_are_refused(cli, moto, home):
    proc = cli(
        "provider",
        "add",
        "aws",
        "aws",
        "--endpoint",
        moto.endpoint,
        "--region",
        "us-east-1",
        "--size",
        "t3.micro",
    )
    assert proc.returncode == 1
    assert (
        proc.stderr.strip() == "monkey: error: --image is needed: an AMI id of the region, "
        "e.g. ami-0123456789abcdef0"
    )


def test_asks_on_a_terminal_for_what_is_missing(moto, home):
    """Region and size offer defaults (Enter takes them); the image is typed in."""
    main, child = pty.openpty()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "monkey",
            "provider",
            "add",
            "aws",
            "asked",
            "--endpoint",
            moto.endpoint,
            "--subnet-cidr",
            "127.0.0.0/24",
        ],
        stdin=child,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    os.close(child)
    os.write(main, f"\n\n{moto.image}\n".encode())
    out, err = proc.communicate(timeout=120)
    os.close(main)
    assert proc.returncode == 0, err
    assert "AWS region [us-east-1]: instance type [t3.micro]: image (AMI id): " in out
    e = entry(home, "asked")
    assert (e["region"], e["size"], e["image"]) == ("us-east-1", "t3.micro", moto.image)


def test_credentials_file_is_recorded_by_path_and_used(cli, moto, home, tmp_path, monkeypatch):
    creds = tmp_path / "aws-credentials"
    creds.write_text(f"[work]\naws_access_key_id = AKIAFILEKEY\naws_secret_access_key = {SECRET}\n")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    proc = add_aws(cli, moto, "--credentials", str(creds), "--profile", "work")
    assert proc.returncode == 0, proc.stderr
    e = entry(home)
    assert (e["credentials"], e["profile"]) == (str(creds), "work")
    assert SECRET not in (home / "providers.yml").read_text()

    from monkey.drivers.ec2_api import credentials, ec2_node_driver

    assert credentials(e)[:2] == ("AKIAFILEKEY", SECRET)
    assert ec2_node_driver(e).key == "AKIAFILEKEY"
    missing = add_aws(cli, moto, "--credentials", str(tmp_path / "nope"), name="other")
    assert (
        missing.returncode == 1
        and "--credentials" in missing.stderr
        and "no such file" in missing.stderr
    )
    unknown = add_aws(cli, moto, "--credentials", str(creds), "--profile", "play", name="other")
    assert unknown.returncode == 1 and unknown.stderr.count("\n") == 1
    assert f"AWS profile 'play' is not in {creds}" in unknown.stderr


def test_libcloud_driver_works_against_the_endpoint(cli, moto, home):
    """The entry drives libcloud's EC2NodeDriver as any EC2-compatible endpoint: lists come
    back full (the namespace fix), a tagged launch into the subnet works, the fixture sees it."""
    from monkey.drivers.ec2_api import boto3_client, ec2_node_driver

    assert add_aws(cli, moto).returncode == 0
    e = entry(home)
    driver = ec2_node_driver(e)
    assert [i.id for i in driver.list_images(ex_image_ids=[moto.image])] == [moto.image]
    size = next(s for s in driver.list_sizes() if s.id == "t3.micro")
    image = driver.list_images(ex_image_ids=[moto.image])[0]
    subnet = next(s for s in driver.ex_list_subnets() if s.id == e["subnet"])
    node = driver.create_node(
        name="w1",
        size=size,
        image=image,
        ex_keyname=e["key_name"],
        ex_subnet=subnet,
        ex_security_group_ids=[e["security_group"]],
        ex_metadata={"monkey-home": Home(home).home_id()},
    )
    assert node.private_ips == ["127.0.0.4"]
    assert [i["InstanceId"] for i in moto.instances()] == [node.id]
    listed = driver.list_nodes(ex_filters={"tag:monkey-home": Home(home).home_id()})
    assert [n.id for n in listed] == [node.id]
    driver.destroy_node(node)
    assert moto.instances() == []
    assert boto3_client(e, "s3").list_buckets()["Buckets"][0]["Name"] == e["bucket"]


GOOD = {"type": "ec2", "region": "us-east-1", "size": "t3.micro", "image": "ami-1"}


@pytest.mark.parametrize(
    "change, says",
    [
        ({"colour": "red"}, "unknown key 'colour'; allowed: address, boot_timeout, bucket"),
        ({"image": None}, "needs `image:`"),
        ({"size": 3}, "size must be text, got 3"),
        ({"region": "US East"}, "region 'US East' is not a region name"),
        ({"endpoint": "127.0.0.1:5000"}, "endpoint '127.0.0.1:5000' is not an http(s) URL"),
        ({"address": "elastic"}, "address must be public or private"),
        ({"spot": "yes"}, "spot must be true or false"),
        ({"max_instances": 0}, "max_instances must be a positive integer"),
        ({"max_instances": True}, "max_instances must be a positive integer"),
        ({"idle_timeout": "10m"}, "idle_timeout must be a positive number of seconds"),
        ({"boot_timeout": 0}, "boot_timeout must be a positive number of seconds"),
        ({"bucket": "ab"}, "bucket 'ab' is not a bucket name"),
        ({"bucket": "192.168.1.1"}, "bucket '192.168.1.1' is not a bucket name"),
        ({"metadata_url": "ftp://x"}, "metadata_url 'ftp://x' is not an http(s) URL"),
        (
            {"orphan_timeout": "30m"},
            "orphan_timeout must be a number of seconds (0: never), got '30m'",
        ),
        ({"orphan_timeout": -1}, "orphan_timeout must be a number of seconds (0: never)"),
        ({"shutdown_command": ["poweroff"]}, "shutdown_command must be text"),
    ],
)
def test_validate_refuses_with_one_line_naming_the_key(change, says):
    bad = {k: v for k, v in {**GOOD, **change}.items() if v is not None}
    with pytest.raises(MonkeyError) as caught:
        validate("providers.yml", "aws", bad)
    assert str(caught.value).startswith("providers.yml: provider 'aws': ")
    assert says in str(caught.value) and "\n" not in str(caught.value)


def test_validate_accepts_a_full_entry():
    validate(
        "providers.yml",
        "aws",
        {
            **GOOD,
            "endpoint": "http://127.0.0.1:5000",
            "profile": "p",
            "credentials": "/c",
            "user": "ubuntu",
            "key": "/k",
            "key_name": "k",
            "vpc": "vpc-1",
            "subnet": "subnet-1",
            "security_group": "sg-1",
            "address": "private",
            "spot": True,
            "max_instances": 4,
            "idle_timeout": 600,
            "bucket": "my.bucket-1",
            "metadata_url": "http://127.0.0.1:9/{address}",
            "orphan_timeout": 0,
            "shutdown_command": "sudo poweroff",
        },
    )
