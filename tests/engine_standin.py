#!/usr/bin/env python3
"""A stand-in for `podman`, `apptainer`, or pyxis's `srun` and `enroot` (named by its file's
name) on a test's PATH: it records each call (its arguments, and the names of the variables
the call's environment gives the engine) as a JSON line in ENGINE.jsonl beside its folder,
then does what the engine would for monkey: `pull` succeeds; `run` (podman) and `exec`
(apptainer) run the command on this machine, in the --workdir/--pwd, with the variables
named by --env (podman) or given as APPTAINERENV_NAME (apptainer); `srun --help` lists
pyxis's flags, `srun --container-image=...` runs the command in --container-workdir with
srun's environment (pyxis passes it into the container); `enroot import --output F` writes
F. No image is entered: the arguments are what is checked."""

import json
import os
import sys

engine = os.path.basename(sys.argv[0])
args = sys.argv[1:]
here = os.path.dirname(os.path.abspath(sys.argv[0]))
record = {"engine": engine, "args": args, "env": sorted(os.environ)}
if engine == "enroot" and "ENROOT_CONFIG_PATH" in os.environ:  # the hosts of its login
    with open(os.path.join(os.environ["ENROOT_CONFIG_PATH"], ".credentials")) as f:
        record["netrc"] = [line.split()[1] for line in f if line.startswith("machine ")]
with open(os.path.join(os.path.dirname(here), f"{engine}.jsonl"), "a") as f:
    f.write(json.dumps(record) + "\n")
if args[:1] in (["pull"], ["rm"], ["info"]):
    sys.exit(0)
if engine == "enroot":
    with open(args[args.index("--output") + 1], "w") as f:
        f.write("squashfs stand-in\n")
    sys.exit(0)
if engine == "srun" and args == ["--help"]:
    print(
        "Usage: srun [OPTIONS...] executable [args...]\n      --container-image=[USER@][REGISTRY#]IMAGE[:TAG]|PATH"
    )
    sys.exit(0)
env = {"PATH": os.environ["PATH"]}
if engine == "srun":
    at = next(i for i, a in enumerate(args) if not a.startswith("-"))
    cmd = args[at:]
    cwd = next(a.split("=", 1)[1] for a in args[:at] if a.startswith("--container-workdir="))
    env = dict(os.environ)
elif engine == "podman":
    at = args.index("--entrypoint")
    cmd = [args[at + 1], *args[at + 3 :]]
    cwd = args[args.index("--workdir") + 1]
    for i, a in enumerate(args[:at]):
        if a == "--env":
            env[args[i + 1]] = os.environ[args[i + 1]]
else:
    at = next(i for i, a in enumerate(args) if a.startswith("docker://"))
    cmd = args[at + 1 :]
    cwd = args[args.index("--pwd") + 1]
    env.update({k[13:]: v for k, v in os.environ.items() if k.startswith("APPTAINERENV_")})
os.chdir(cwd)
os.execvpe(cmd[0], cmd, env)
