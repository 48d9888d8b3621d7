"""`monkey provider add ssh NAME --host ...` and `monkey provider check NAME`."""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from monkey.config import Home

from monkey.models import MonkeyError

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_HOST_RE = re.compile(r"^(?:(?P<user>[^@\s]+)@)?(?P<host>[^@:\s/]+)(?::(?P<port>\d+))?$")


# Said under each kind's --help: what `provider add` does through a remote (on_main_node).
_ON_MAIN_NODE = (
    "Through a remote (--remote NAME), the main node runs it, for its admins: the files the "
    "options name (--key, --credentials, --workdir) are the main node's, and so are the "
    "credentials, the checks and the providers.yml written (its core uses them); a relative "
    "path starts from its home folder."
)


def provider_parser(cls: type[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p = cls(
        prog="monkey provider", description="Add a provider to providers.yml, or check its hosts."
    )
    sub = p.add_subparsers(dest="action", required=True, metavar="{add,check}")
    add = sub.add_parser(
        "add",
        help="add a provider to providers.yml",
        description="Add a provider to providers.yml.",
    )
    kinds = add.add_subparsers(dest="kind", required=True, metavar="{ssh,aws,gcp,slurm,kubernetes}")
    ssh = kinds.add_parser(
        "ssh",
        help="a pool of SSH hosts",
        description="Add an `ssh` provider: hosts reached over SSH.",
        epilog=_ON_MAIN_NODE,
    )
    ssh.add_argument("name", help="the provider's name, used with `run --provider NAME`")
    ssh.add_argument(
        "--host",
        action="append",
        required=True,
        metavar="[USER@]HOST[:PORT]",
        help="a host (repeatable); a ~/.ssh/config alias works",
    )
    ssh.add_argument("--user", help="login user for hosts that name none")
    ssh.add_argument("--key", help="private key file (default: ssh-agent, then ~/.ssh keys)")
    ssh.add_argument("--cpus", type=int, help="job slots per host (default: its CPU count)")
    ssh.add_argument("--gpus", type=int, help="GPUs per host (default: what nvidia-smi finds)")
    ssh.add_argument("--memory", help="memory per host for placement, e.g. 64G")
    ssh.add_argument(
        "--workdir",
        help="folder on each host for the agent, code and runs (default: ~/.monkey-agent)",
    )
    ssh.add_argument("--python", help="python3 on the hosts (default: python3)")
    ssh.add_argument(
        "--trust-on-first-use",
        action="store_true",
        help="accept unknown host keys once, recorded in MONKEY_HOME/known_hosts",
    )
    ssh.add_argument("--force", action="store_true", help="replace a provider of that name")
    ssh.set_defaults(func=_anywhere(cmd_provider_add_ssh, ssh))
    _aws_parser(kinds)
    _gcp_parser(kinds)
    _slurm_parser(kinds)
    _kubernetes_parser(kinds)
    check = sub.add_parser(
        "check",
        help="connect to a provider's hosts and report each",
        description="Connect to each host of an ssh provider (or check this machine, for a "
        "local one) and report it: up or why not, CPUs, GPUs, memory, and whether its jobs "
        "run in a sandbox (isolation).",
    )
    check.add_argument("name", help="the provider's name")
    check.add_argument("--json", action="store_true", help="print JSON")
    check.set_defaults(func=cmd_provider_check)
    return p


def ssh_entry(args: argparse.Namespace) -> dict[str, Any]:
    """The providers.yml entry the `provider add ssh` arguments describe."""
    hosts = []
    for text in args.host:
        match = _HOST_RE.match(text)
        if not match:
            raise MonkeyError(
                f"--host {text!r} is not [USER@]HOST[:PORT]; e.g. --host me@gpu1:2222"
            )
        entry: dict[str, Any] = {"host": match["host"]}
        if match["port"]:
            entry["port"] = int(match["port"])
        if match["user"] or args.user:
            entry["user"] = match["user"] or args.user
        for key in ("key", "cpus", "gpus", "memory", "workdir", "python"):
            value = getattr(args, key)
            if value is not None:
                entry[key] = os.path.abspath(os.path.expanduser(value)) if key == "key" else value
        hosts.append(entry)
    provider: dict[str, Any] = {"type": "ssh", "hosts": hosts}
    if args.trust_on_first_use:
        provider["trust_on_first_use"] = True
    return provider


def _check_name(name: str) -> None:
    if name == "local":
        raise MonkeyError("`local` is this machine; choose another name")
    if not _NAME_RE.match(name):
        raise MonkeyError(
            f"provider name {name!r}: use letters, digits, '.', '_' and '-', e.g. lab"
        )


def _previous(name: str, kind: str, force: bool) -> tuple[Any, dict[str, Any]]:
    """MONKEY_HOME, and the options of provider NAME when it is of KIND already (a second run
    reuses them); one of another kind is replaced only with FORCE. A broken providers.yml is
    refused before anything is created."""
    from monkey.config import Home
    from monkey.drivers import load_providers

    home = Home().ensure()
    old = load_providers(home).get(name)
    _check_name(name)
    if old is not None and old.type != kind and not force:
        raise MonkeyError(
            f"provider {name!r} exists already as {old.type}; pass --force to replace it"
        )
    return home, dict(old.options) if old is not None and old.type == kind else {}


def _save_provider(home: Any, name: str, entry: dict[str, Any]) -> Any:
    """Put ENTRY under NAME in providers.yml: written to a staged copy, validated, then moved
    over the file, which is untouched if the result is refused. Returns the file's path."""
    import yaml

    from monkey.config import read_yaml, write_private
    from monkey.drivers import load_providers

    path = home.providers_file
    data = (read_yaml(path) if path.exists() else None) or {}
    data.setdefault("providers", {})
    data["providers"][name] = entry
    tmp = path.with_name(path.name + ".tmp")
    write_private(tmp, yaml.safe_dump(data, sort_keys=False).encode())
    try:
        load_providers(cast("Home", _Staged(home, tmp)))  # the fields load_providers reads
    except MonkeyError as exc:
        tmp.unlink()
        raise MonkeyError(str(exc).removeprefix(f"{tmp}: ")) from None
    os.replace(tmp, path)
    return path


def _anywhere(
    command: Callable[[argparse.Namespace], int], parser: argparse.ArgumentParser
) -> Callable[[argparse.Namespace], int]:
    """COMMAND (a `provider add` kind parsed by PARSER) run here, or, with a remote selected,
    by the main node as its own command (see monkey.shell.routing.on_main_node)."""

    def run(args: argparse.Namespace) -> int:
        from monkey.shell.routing import on_main_node

        if not on_main_node("provider", args):
            return command(args)
        from monkey.remote.facade import RemoteMonkey

        done = RemoteMonkey().provider_add(command_words(args, parser), args.name)
        sys.stdout.write(done["stdout"])
        sys.stdout.flush()
        sys.stderr.write(done["stderr"])
        return int(done["code"])

    return run


def command_words(args: argparse.Namespace, parser: argparse.ArgumentParser) -> list[str]:
    """The words after `provider add` that give ARGS again (as parsed by PARSER, a kind's):
    the kind, each option given as --OPTION=VALUE (a value may start with '-'), and the
    positional name last, after `--`."""
    words, last = [args.kind], []
    for action in parser._actions:
        value = getattr(args, action.dest, None)
        if value is None or isinstance(action, argparse._HelpAction):
            continue
        if not action.option_strings:
            last = ["--", str(value)]
        elif isinstance(action, argparse.BooleanOptionalAction):
            words.append(action.option_strings[0 if value else 1])  # --spot, --no-spot
        elif action.nargs == 0:  # a flag
            words += [action.option_strings[0]] if value else []
        elif isinstance(value, list):  # repeatable
            words += [f"{action.option_strings[0]}={v}" for v in value]
        else:
            words.append(f"{action.option_strings[0]}={value}")
    return words + last


def cmd_provider_add_ssh(args: argparse.Namespace) -> int:
    from monkey.config import Home
    from monkey.drivers import load_providers

    home = Home().ensure()
    providers = load_providers(home)  # refuses a broken file before we touch it
    _check_name(args.name)
    if args.name in providers and not args.force:
        raise MonkeyError(f"provider {args.name!r} exists already; pass --force to replace it")
    if args.key and not os.path.isfile(os.path.expanduser(args.key)):
        raise MonkeyError(f"--key {args.key}: no such file")
    path = _save_provider(home, args.name, ssh_entry(args))
    print(f"added provider {args.name!r} ({len(args.host)} host(s)) to {path}")
    print(f"check it with: monkey provider check {args.name}")
    return 0


_AWS_OPTIONS = (
    "region",
    "size",
    "image",
    "spot",
    "max_instances",
    "idle_timeout",
    "bucket",
    "endpoint",
    "credentials",
    "profile",
    "user",
    "address",
    "metadata_url",
)
_ASK = {"region": "AWS region", "size": "instance type", "image": "image (AMI id)"}


def _aws_parser(kinds: Any) -> None:
    aws = kinds.add_parser(
        "aws",
        help="an EC2 region where monkey creates instances for jobs",
        description="Add an `ec2` provider. Checks the credentials, then creates what is missing "
        "(VPC, subnet, internet gateway and route, a security group letting SSH in "
        "from one address range, a key pair, the S3 bucket), tagged monkey-NAME, and "
        "records their ids. Run it again to reuse them or repair what is gone; flags "
        "not given keep the provider's current values. Asks on a terminal for what "
        "is missing.",
        epilog=_ON_MAIN_NODE,
    )
    aws.add_argument("name", help="the provider's name, used with `run --provider NAME`")
    aws.add_argument("--region", help="AWS region, e.g. us-east-1")
    aws.add_argument("--size", help="default instance type, e.g. t3.micro")
    aws.add_argument("--image", help="image (AMI id) of the region, e.g. an Ubuntu AMI")
    aws.add_argument(
        "--spot",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="ask for spot capacity (default: on-demand)",
    )
    aws.add_argument(
        "--max-instances", type=int, metavar="N", help="at most N instances (default 1)"
    )
    aws.add_argument(
        "--idle-timeout",
        type=int,
        metavar="SECONDS",
        help="terminate an instance idle this long (default 600)",
    )
    aws.add_argument(
        "--bucket",
        help="S3 bucket for code, data and results "
        "(default: monkey-<home id>-NAME); created if missing",
    )
    aws.add_argument(
        "--endpoint",
        metavar="URL",
        help="an EC2/S3-compatible endpoint instead of AWS, e.g. http://127.0.0.1:5000",
    )
    aws.add_argument(
        "--credentials",
        metavar="FILE",
        help="an AWS credentials file (default: the environment, then ~/.aws)",
    )
    aws.add_argument("--profile", help="the profile to use in the AWS files")
    aws.add_argument("--user", help="login user of the image (default: ubuntu)")
    aws.add_argument(
        "--address",
        choices=("public", "private"),
        help="which instance address monkey connects to (default: public)",
    )
    aws.add_argument(
        "--ssh-from",
        metavar="CIDR",
        help="addresses SSH may come from, e.g. 203.0.113.7/32 (needed unless the "
        "endpoint is on this machine or the security group has a rule)",
    )
    aws.add_argument(
        "--subnet-cidr",
        default=None,
        metavar="CIDR",
        help="address range of the VPC and subnet when created (default 10.77.0.0/24)",
    )
    aws.add_argument("--metadata-url", help=argparse.SUPPRESS)  # emulators serve their own
    aws.add_argument("--force", action="store_true", help="replace a provider of another kind")
    aws.set_defaults(func=_anywhere(cmd_provider_add_aws, aws))


def cmd_provider_add_aws(args: argparse.Namespace) -> int:
    from monkey.drivers import ec2_setup

    home, base = _previous(args.name, "ec2", args.force)
    options = {key: getattr(args, key) for key in _AWS_OPTIONS}
    for key, label in _ASK.items():
        if options[key] is None and key not in base:
            options[key] = _ask(key, label)
    entry = ec2_setup.entry_from(options, base)
    ec2_setup.validate("monkey provider add aws", args.name, entry)
    entry = ec2_setup.setup(
        home,
        args.name,
        entry,
        ssh_from=args.ssh_from,
        subnet_cidr=args.subnet_cidr or ec2_setup.DEFAULT_SUBNET,
    )
    ec2_setup.validate(str(home.providers_file), args.name, entry)
    path = _save_provider(home, args.name, entry)
    print(f"added provider {args.name!r} (ec2, {entry['region']}) to {path}")
    return 0


_SLURM_OPTIONS = ("partition", "account", "qos", "time", "gres", "constraint", "workdir", "signal")


def _slurm_parser(kinds: Any) -> None:
    slurm = kinds.add_parser(
        "slurm",
        help="a Slurm cluster: each job runs in an allocation made with sbatch",
        description="Add a `slurm` provider. Slurm's commands (sbatch, squeue, sinfo) must work "
        "on this machine, or on the login host given with --login (over SSH); the "
        "partition is checked with sinfo.",
        epilog=_ON_MAIN_NODE,
    )
    slurm.add_argument("name", help="the provider's name, used with `run --provider NAME`")
    slurm.add_argument(
        "--partition", help="partition for the jobs (default: the cluster's default)"
    )
    slurm.add_argument("--account", help="account to charge (sbatch --account)")
    slurm.add_argument("--qos", help="quality of service (sbatch --qos)")
    slurm.add_argument(
        "--time",
        help="default time limit of an allocation, in sbatch --time's "
        "format (a bare number is minutes), e.g. 4:00:00",
    )
    slurm.add_argument("--gres", help="generic resources for every job (sbatch --gres)")
    slurm.add_argument("--constraint", help="node features (sbatch --constraint)")
    slurm.add_argument("--signal", help="warning before the time limit (default B:USR1@120)")
    slurm.add_argument(
        "--workdir",
        help="folder on the shared filesystem for the agent and "
        "Slurm's output (default: MONKEY_HOME/slurm/NAME)",
    )
    slurm.add_argument(
        "--login",
        metavar="USER@HOST[:PORT]",
        help="run Slurm's commands on this login host over SSH; MONKEY_HOME need "
        "not be shared with the cluster (files go under --workdir there)",
    )
    slurm.add_argument(
        "--key", help="SSH private key for the login host (default: ssh-agent, ~/.ssh)"
    )
    slurm.add_argument(
        "--trust-new-host",
        action="store_true",
        help="record the login host's key at first contact (else it must be in known_hosts)",
    )
    slurm.add_argument(
        "--extra-arg",
        action="append",
        default=[],
        metavar="OPTION",
        help="another sbatch option (repeatable), e.g. --extra-arg=--nice=10",
    )
    slurm.add_argument("--force", action="store_true", help="replace a provider of that name")
    slurm.set_defaults(func=_anywhere(cmd_provider_add_slurm, slurm))


def cmd_provider_add_slurm(args: argparse.Namespace) -> int:
    from monkey.config import Home
    from monkey.drivers import load_providers
    from monkey.drivers.slurm_commands import Runner, partitions, slurm_command

    home = Home().ensure()
    providers = load_providers(home)
    _check_name(args.name)
    if args.name in providers and not args.force:
        raise MonkeyError(f"provider {args.name!r} exists already; pass --force to replace it")
    entry: dict[str, Any] = {"type": "slurm"}
    entry.update({k: getattr(args, k) for k in _SLURM_OPTIONS if getattr(args, k) is not None})
    if args.extra_arg:
        entry["extra_args"] = args.extra_arg
    run: Runner = slurm_command
    login = None
    if args.login:
        from monkey.drivers.slurm_login import LoginHost, parse_login

        if args.key and not os.path.isfile(os.path.expanduser(args.key)):
            raise MonkeyError(f"--key {args.key}: no such file")
        entry["login"] = parse_login(args.login)
        if args.key:
            entry["login"]["key"] = os.path.abspath(os.path.expanduser(args.key))
        if args.trust_new_host:
            entry["login"]["trust_new_host"] = True
        logging.getLogger("monkey.ssh").setLevel(logging.ERROR)  # its failure is the one line
        login = LoginHost(args.name, entry["login"], args.workdir, home)
        run = login.run
    elif args.key or args.trust_new_host:
        raise MonkeyError(
            "--key and --trust-new-host are for the login host: give --login USER@HOST too"
        )
    elif args.workdir:  # a folder of this machine (the login host resolves its own)
        entry["workdir"] = os.path.abspath(os.path.expanduser(args.workdir))
    try:
        found = partitions(run)
    finally:
        if login is not None:
            login.close()
    if not found:
        raise MonkeyError("sinfo lists no partition: is this machine part of a Slurm cluster?")
    partition = args.partition or next(
        (p for p, i in found.items() if i["default"]), next(iter(found))
    )
    if partition not in found:
        raise MonkeyError(
            f"no partition {partition!r} on this cluster; partitions: {', '.join(sorted(found))}"
        )
    entry.setdefault("partition", partition)
    path = _save_provider(home, args.name, entry)
    info = found[partition]
    print(
        f"added provider {args.name!r} (slurm, partition {partition}: {info['idle']} idle, "
        f"{info['mixed']} mixed, {info['allocated']} allocated nodes) to {path}"
    )
    return 0


def _kubernetes_parser(kinds: Any) -> None:
    k8s = kinds.add_parser(
        "kubernetes",
        help="a Kubernetes cluster: each job runs in a pod (its image)",
        description="Add a `kubernetes` provider from a context of your kubeconfig. Access is "
        "checked (may you create pods in the namespace? list its nodes?) and the nodes' "
        "allocatable CPUs and GPUs are shown.",
        epilog=_ON_MAIN_NODE,
    )
    k8s.add_argument("name", help="the provider's name, used with `run --provider NAME`")
    k8s.add_argument("--kubeconfig", help="kubeconfig file (default: KUBECONFIG, ~/.kube/config)")
    k8s.add_argument("--context", help="the kubeconfig's context (default: its current one)")
    k8s.add_argument("--namespace", help="namespace of the pods (default: the context's)")
    k8s.add_argument("--image", help="image of jobs run without --image, e.g. python:3.12-slim")
    k8s.add_argument(
        "--schedule-timeout",
        type=float,
        help="seconds a pod may wait for a node before its job is given up (default 60)",
    )
    k8s.add_argument(
        "--checkpoint-every",
        type=float,
        help="seconds between read-backs of a running job's checkpoint and persisted folders "
        "(a pod lost without warning resumes from the last; default 30)",
    )
    k8s.add_argument("--memory", help="memory of a job that asks none, e.g. 4G")
    k8s.add_argument(
        "--node-selector",
        action="append",
        default=[],
        metavar="LABEL=VALUE",
        help="run pods only on nodes with this label (repeatable)",
    )
    k8s.add_argument("--priority-class", help="the pods' priorityClassName")
    k8s.add_argument("--service-account", help="the pods' serviceAccountName")
    k8s.add_argument("--queue", help="a Kueue LocalQueue: the pods' kueue.x-k8s.io/queue-name")
    k8s.add_argument(
        "--cache-claim",
        help="a PersistentVolumeClaim (ReadWriteMany) every pod mounts: the jobs' code and "
        "datasets are sent to the cluster once, by digest",
    )
    k8s.add_argument("--force", action="store_true", help="replace a provider of that name")
    k8s.set_defaults(func=_anywhere(cmd_provider_add_kubernetes, k8s))


def cmd_provider_add_kubernetes(args: argparse.Namespace) -> int:
    from monkey.drivers.k8s_api import Cluster, default_kubeconfig
    from monkey.drivers.k8s_pods import capacity_of
    from monkey.drivers.kubernetes import keep_shapes

    home, _old = _previous(args.name, "kubernetes", args.force)
    providers_have = args.name in _names(home)
    if providers_have and not args.force:
        raise MonkeyError(f"provider {args.name!r} exists already; pass --force to replace it")
    kubeconfig = os.path.abspath(os.path.expanduser(args.kubeconfig or default_kubeconfig()))
    entry: dict[str, Any] = {"type": "kubernetes", "kubeconfig": kubeconfig}
    selector = {}
    for item in args.node_selector:
        label, sep, value = item.partition("=")
        if not sep or not label:
            raise MonkeyError(f"--node-selector {item!r}: give LABEL=VALUE, e.g. gpu=a100")
        selector[label] = value
    cluster = Cluster(kubeconfig, args.context, args.namespace)
    try:
        where = f"context {cluster.context}, namespace {cluster.namespace}"
        if not cluster.can("create", "pods"):
            raise MonkeyError(
                f"{where}: you may not create pods there (kubectl auth can-i create pods "
                f"-n {cluster.namespace} says no); ask the cluster's admins for a Role, or "
                "choose another --namespace"
            )
        try:
            nodes = cluster.nodes()
        except MonkeyError as exc:
            raise MonkeyError(
                f"{where}: {exc}; monkey lists nodes to know the cluster's CPUs and GPUs "
                "(kubectl auth can-i list nodes)"
            ) from None
    finally:
        cluster.close()
    entry["context"] = cluster.context
    entry["namespace"] = cluster.namespace
    for key in ("image", "schedule_timeout", "checkpoint_every", "memory", "priority_class",
                "service_account", "queue", "cache_claim"):  # fmt: skip
        if getattr(args, key) is not None:
            entry[key] = getattr(args, key)
    if selector:
        entry["node_selector"] = selector
    path = _save_provider(home, args.name, entry)
    keep_shapes(home, args.name, nodes)  # a job no node could hold is refused at once
    cap = capacity_of(args.name, nodes)
    print(
        f"added provider {args.name!r} (kubernetes, {where}: {len(nodes)} nodes, "
        f"{cap.slots} CPUs and {len(cap.gpus)} GPUs allocatable) to {path}"
    )
    return 0


def _names(home: Any) -> set[str]:
    from monkey.drivers import load_providers

    return set(load_providers(home))


def _ask(key: str, label: str) -> str:
    """Ask on a terminal for a required option of `provider add aws`."""
    from monkey.drivers.ec2_setup import REQUIRED

    default = {
        "region": os.environ.get("AWS_REGION")
        or os.environ.get("AWS_DEFAULT_REGION")
        or "us-east-1",
        "size": "t3.micro",
    }.get(key)
    return _prompt(f"--{key}", label, default, REQUIRED[key])


_GCP_OPTIONS = (
    "credentials",
    "project",
    "zones",
    "size",
    "image",
    "preemptible",
    "network",
    "max_instances",
    "idle_timeout",
    "bucket",
    "endpoint",
    "storage_endpoint",
    "user",
    "address",
    "metadata_url",
)
_GCP_ASK = {
    "credentials": ("service-account JSON key file", None),
    "zones": ("zone(s), comma-separated", "us-central1-a"),
    "size": ("machine type", "e2-small"),
    "image": ("image or image family", "debian-12"),
}


def _gcp_parser(kinds: Any) -> None:
    gcp = kinds.add_parser(
        "gcp",
        help="GCE zones where monkey creates instances for jobs",
        description="Add a `gce` provider. Checks the service account, project, zone, machine "
        "type and image with API calls, then creates what is missing (the network, "
        "a firewall rule letting SSH in from one address range, an SSH key, the GCS "
        "bucket). Run it again to reuse them; flags not given keep the provider's "
        "current values. Asks on a terminal for what is missing.",
        epilog=_ON_MAIN_NODE,
    )
    gcp.add_argument("name", help="the provider's name, used with `run --provider NAME`")
    gcp.add_argument("--credentials", metavar="FILE", help="service-account JSON key file")
    gcp.add_argument("--project", help="GCP project (default: the key's)")
    gcp.add_argument(
        "--zone",
        dest="zones",
        metavar="ZONE[,ZONE...]",
        help="zone(s), the preferred first, e.g. us-central1-a,us-central1-b",
    )
    gcp.add_argument("--size", help="default machine type, e.g. e2-small")
    gcp.add_argument("--image", help="image or image family, e.g. debian-12")
    gcp.add_argument(
        "--preemptible",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="ask for preemptible instances (default: standard)",
    )
    gcp.add_argument("--network", help="VPC network (default: default); created if missing")
    gcp.add_argument(
        "--max-instances", type=int, metavar="N", help="at most N instances (default 1)"
    )
    gcp.add_argument(
        "--idle-timeout",
        type=int,
        metavar="SECONDS",
        help="delete an instance idle this long (default 600)",
    )
    gcp.add_argument(
        "--bucket",
        help="GCS bucket for code, data and results "
        "(default: monkey-<home id>-NAME); created if missing",
    )
    gcp.add_argument("--endpoint", metavar="URL", help=argparse.SUPPRESS)  # emulators
    gcp.add_argument("--storage-endpoint", metavar="URL", help=argparse.SUPPRESS)
    gcp.add_argument("--user", help="login user made on the instances (default: monkey)")
    gcp.add_argument(
        "--address",
        choices=("public", "private"),
        help="which instance address monkey connects to (default: public)",
    )
    gcp.add_argument(
        "--ssh-from", metavar="CIDR", help="addresses SSH may come from, e.g. 203.0.113.7/32"
    )
    gcp.add_argument("--metadata-url", help=argparse.SUPPRESS)
    gcp.add_argument("--force", action="store_true", help="replace a provider of another kind")
    gcp.set_defaults(func=_anywhere(cmd_provider_add_gcp, gcp))


def cmd_provider_add_gcp(args: argparse.Namespace) -> int:
    from monkey.drivers import gce, gce_setup

    home, base = _previous(args.name, "gce", args.force)
    options = {key: getattr(args, key) for key in _GCP_OPTIONS}
    for key, (label, default) in _GCP_ASK.items():
        if options[key] is None and key not in base and not (key == "zones" and "zone" in base):
            options[key] = _prompt(
                f"--{key.rstrip('s') if key == 'zones' else key}",
                label,
                default,
                gce_setup.REQUIRED.get(key, "e.g. us-central1-a"),
            )
    entry = gce_setup.entry_from(options, base)
    gce_setup.validate("monkey provider add gcp", args.name, entry)
    entry = gce.setup(home, args.name, entry, ssh_from=args.ssh_from)
    gce_setup.validate(str(home.providers_file), args.name, entry)
    path = _save_provider(home, args.name, entry)
    print(f"added provider {args.name!r} (gce, {entry['project']}, {entry['zone']}) to {path}")
    return 0


def _prompt(flag: str, label: str, default: str | None, example: str) -> str:
    """Ask on a terminal for a required option; refuse when there is no terminal."""
    answer = ""
    if sys.stdin.isatty():
        try:
            answer = input(label + (f" [{default}]" if default else "") + ": ").strip()
        except EOFError:
            pass
        answer = answer or default or ""
    if not answer:
        raise MonkeyError(f"{flag} is needed: {example}")
    return answer


class _Staged:
    """A Home whose providers.yml is the staged copy (to validate before replacing)."""

    def __init__(self, home: Any, staged: Any) -> None:
        self.providers_file = staged
        self.root = home.root
        self.private = home.private  # load_providers' cache is keyed by the file's bytes


def cmd_provider_check(args: argparse.Namespace) -> int:
    import json
    import logging

    from monkey.shell.common import monkey

    logging.getLogger("monkey").addHandler(logging.NullHandler())  # the report says it all
    report = monkey().check_provider(args.name)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for host in report:
            if host["error"]:
                print(f"{host['instance']:<24} {host['host']:<32} DOWN  {host['error']}")
            else:
                gpus = ",".join(host["gpus"]) or "-"
                print(
                    f"{host['instance']:<24} {host['host']:<32} up    cpus {host['slots']}  "
                    f"gpus {gpus}  memory {_size(host['memory'])}  "
                    + (f"pods {host['pods']}  " if "pods" in host else "")
                    + f"isolation {host.get('isolation') or 'unknown'}  "
                    f"images {host.get('images') or 'unknown'}"
                )
    bad = [h for h in report if h["error"]]
    if bad:
        sys.stderr.write(f"{len(bad)} of {len(report)} host(s) unusable\n")
    return 1 if bad else 0


def _size(value: int | None) -> str:
    return "-" if not value else f"{value / (1 << 30):.1f}G"


def print_hosts(providers: list[dict[str, Any]]) -> None:
    """The hosts table under `monkey list providers`, when a provider has hosts."""
    from monkey.shell.table import ago, render

    hosts = [h for p in providers for h in p.get("hosts", [])]
    cloud = any("size" in h for h in hosts)  # instances monkey created: size, spot, age too
    rows = [
        [
            h["instance"],
            h["host"],
            h["state"],
            str(h["slots"] or "-"),
            str(len(h["gpus"])),
            _size(h["memory"]),
            str(h["running"]),
        ]
        + (
            [h.get("size") or "-", "spot" if h.get("spot") else "-", ago(h.get("age"))]
            if cloud
            else []
        )
        + [h["error"] or ""]
        for h in hosts
    ]
    if rows:
        print()
        render(
            ["HOST", "ADDRESS", "STATE", "SLOTS", "GPUS", "MEMORY", "RUNNING"]
            + (["SIZE", "SPOT", "AGE"] if cloud else [])
            + ["ERROR"],
            rows,
        )
