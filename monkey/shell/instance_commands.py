"""Instances monkey made or holds: `monkey list instances`' table, and
`monkey create instance` / `monkey delete instance` (the core carries them out)."""

from __future__ import annotations

import argparse
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def print_monkey_instances(instances: list[dict[str, Any]], as_json: bool) -> int:
    """`monkey list instances`: one row per instance monkey created, and per pod it runs
    on a Kubernetes cluster (NODE: the pod's); a cluster that cannot be reached says why
    on stderr."""
    import json

    from monkey.shell.table import ago, render
    from monkey.store.cost import dollars

    if as_json:
        print(json.dumps({"instances": instances}, indent=2))
        return 0
    for i in instances:
        if i.get("error"):
            sys.stderr.write(f"{i['provider']}: {i['error']}\n")
    instances = [i for i in instances if not i.get("error")]
    if not instances:
        print(
            "no instances: monkey creates them for jobs of cloud providers, and pods for "
            "jobs of Kubernetes ones (`monkey run -p NAME`)"
        )
        return 0
    why = any("ended" in i for i in instances)  # --all: why each terminated one ended
    pods = any("node" in i for i in instances)
    render(
        [
            "INSTANCE",
            "PROVIDER",
            "STATE",
            "SIZE",
            "SPOT",
            "ADDRESS",
            *(["NODE"] if pods else []),
            "JOBS",
            "AGE",
            "IDLE",
            "$/H",
            "COST",
            *(["ENDED"] if why else []),
        ],
        [
            [
                i["id"],
                i["provider"],
                i["state"],
                i["size"] or "-",
                "spot" if i["spot"] else "-",
                i["address"] or "-",
                *([i.get("node") or "-"] if pods else []),
                ",".join(i["jobs"]) or "-",
                ago(i["age"]),
                ago(i.get("idle")),
                "-" if i["price"] is None else f"{i['price']:g}",
                dollars(i["cost"]),
                *([i.get("ended") or "-"] if why else []),
            ]
            for i in instances
        ],
    )
    total = [i["cost"] for i in instances if i["cost"] is not None]
    if total:
        print(f"estimated cost so far: {dollars(sum(total))}")
    return 0


# -- `monkey create instance` / `monkey delete instance` (the original Monkey's) -------------


def create_parser(cls: type[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p = cls(
        prog="monkey create",
        description="Create a cloud instance, or claim an SSH host, "
        "before jobs need it; it then takes jobs and idles out as usual.",
    )
    sub = p.add_subparsers(dest="what", required=True, metavar="{instance}")
    inst = sub.add_parser(
        "instance",
        help="create (cloud) or claim (SSH) one instance",
        description="Create (cloud) or claim (SSH) one instance; prints its id.",
    )
    inst.add_argument("--provider", "-p", required=True, help="the provider to create it on")
    inst.add_argument("--size", help="cloud: the machine size (default: the provider's)")
    spot = inst.add_mutually_exclusive_group()
    spot.add_argument(
        "--spot",
        action="store_true",
        default=None,
        help="cloud: a spot (preemptible) instance (default: the provider's)",
    )
    spot.add_argument(
        "--on-demand",
        dest="spot",
        action="store_false",
        help="cloud: an on-demand instance on a spot provider",
    )
    inst.add_argument("--host", help="SSH: the host to claim (default: one not reached yet)")
    inst.add_argument("--json", action="store_true", help="print the instance as JSON")
    inst.set_defaults(func=cmd_create_instance)
    return p


def delete_parser(cls: type[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p = cls(prog="monkey delete", description="Terminate a cloud instance, or release an SSH host.")
    sub = p.add_subparsers(dest="what", required=True, metavar="{instance}")
    inst = sub.add_parser(
        "instance",
        help="terminate (cloud) or release (SSH) one instance",
        description="Terminate a cloud instance, or release an SSH host (its "
        "agent stops once idle). One that runs jobs needs --force.",
    )
    inst.add_argument(
        "instance", metavar="ID", help="instance id or a unique prefix (`monkey list providers`)"
    )
    inst.add_argument(
        "--force",
        action="store_true",
        help="a cloud instance also when it runs jobs: they end lost (retried "
        "while retries remain)",
    )
    inst.set_defaults(func=cmd_delete_instance)
    return p


def _instance_row(m: Any, instance: str) -> dict[str, Any]:
    return next((r for r in m.instances() if r["id"] == instance), {"id": instance})


def cmd_create_instance(args: argparse.Namespace) -> int:
    import json

    from monkey.shell.common import monkey

    m = monkey()
    req = m.create_instance(args.provider, size=args.size, spot=args.spot, host=args.host)
    row = _instance_row(m, req["instance"])
    if args.json:
        print(
            json.dumps(
                {k: row.get(k) for k in ("id", "provider", "state", "size", "spot", "address")},
                indent=2,
            )
        )
        return 0
    print(req["instance"])
    what = ", ".join(x for x in (row.get("size"), "spot" if row.get("spot") else None) if x)
    print(
        f"monkey: {args.provider}: {req['instance']} "
        + (f"created ({what}); " if what else "up; ")
        + "it takes jobs, and goes after its provider's idle timeout with none "
        f"(`monkey delete instance {req['instance']}` ends it now)",
        file=sys.stderr,
    )
    return 0


def cmd_delete_instance(args: argparse.Namespace) -> int:
    from monkey.shell.common import monkey

    m = monkey()
    req = m.delete_instance(args.instance, force=args.force)
    row = _instance_row(m, req["instance"])
    print(
        f"{req['instance']} " + ("terminated" if row.get("state") == "terminated" else "released")
    )
    return 0
