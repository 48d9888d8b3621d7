"""The job launcher: restores persisted folders, prepares the job's environment once per
worker, runs the job inside it and saves its persisted folders while it runs.

Standard library only, nothing from the rest of ``monkey`` (it travels with the agent).
The agent runs it, instead of the job's command, inside the job's session:

    python launcher.py LAUNCH_JSON -- ARGV...

so that nothing here ever blocks the agent's loop, and a signal to the job's session
reaches the setup and the job alike. LAUNCH_JSON (written by the agent in the run dir)::

    {"run_dir": ..., "work": ..., "envs": ROOT/envs,
     "setup": {"type": "pip"|"conda"|"none", "env_file": rel|null, "env_file_digest": d,
               "install_script": rel|null, "install_script_digest": d} | null,
     "persist": [{"name": N, "path": rel}], "persist_dir": dir,
     "package": the monkey folder the agent runs from (see expose_monkey),
     "image": {"ref", "name", "digest", "store": ROOT/images, "bwrap": path, "cwd": dir,
               "writable": [dir], "readable": [dir], "env": [the job's own variables],
               "path": its PYTHONPATH}
              | absent: a job in an OCI image (pulled first, then run in it: image.py)}

Files it writes in the run dir: ``setup.log`` (everything the set-up printed, and what the
launcher did), ``setup.json`` ({"key", "reused", "seconds"}) once the environment is
ready, and ``setup.failed`` (one line) when set-up failed; the job is then not run and
the launcher exits 1 (the agent reports the exit with reason ``setup``).

Environments live in ``ENVS/<key>/``, key = digest of the env type, env file, install
script and this python. ``ENVS/<key>.lock`` (flock) makes concurrent jobs build it once;
``ENVS/<key>/.monkey-ready`` marks a finished build (a partial one is rebuilt).

Persisted folders: ``persist_dir/<name>`` is copied over ``work/<path>`` before set-up, and
``work/<path>`` is saved there every MONKEY_PERSIST_INTERVAL seconds (default 60) and when
the job ends, whatever ended it; the launcher exits only after that last save, so the
core sees the exit once the progress is safe. A save is built beside the previous one
(unchanged files hard-linked) and renamed into place.
"""

from __future__ import annotations

import errno
import fcntl
import glob
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, BinaryIO

READY = ".monkey-ready"


class SetupError(Exception):
    """Preparing the environment failed; the message is one line for the user."""


def note(log: BinaryIO, text: str) -> None:
    """A line of the launcher's own in the setup log."""
    stamp = time.strftime("%H:%M:%S")
    log.write(f"[monkey {stamp}] {text}\n".encode())
    log.flush()


def env_key(setup: dict[str, Any], image: str = "") -> str:
    """What makes two environments the same: inputs and the worker's python, or the
    digest of the IMAGE the environment is built and used in."""
    parts = [setup.get("type"), setup.get("env_file_digest"), setup.get("install_script_digest")]
    parts += ["image", image] if image else [os.path.realpath(sys.executable), sys.version]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:24]


def activation(setup: dict[str, Any], prefix: str, path: str | None = None) -> dict[str, str]:
    """Variables that put the job inside the environment at PREFIX (its bin/ before PATH:
    this process's, or an image's)."""
    if setup["type"] == "none":
        return {}
    if path is None:
        path = os.environ.get("PATH", "")
    path = os.path.join(prefix, "bin") + os.pathsep + path
    if setup["type"] == "pip":
        return {"PATH": path, "VIRTUAL_ENV": prefix}
    return {"PATH": path, "CONDA_PREFIX": prefix, "CONDA_DEFAULT_ENV": prefix}


def run_step(
    argv: list[str],
    log: BinaryIO,
    cwd: str,
    env: dict[str, str],
    what: str,
    inside: Any = None,
) -> None:
    """Run ARGV for WHAT (on this worker, or INSIDE an image: the ``Inside`` of image.py
    or engines.py)."""
    note(log, f"$ {' '.join(argv)}")
    if inside is not None:
        argv, env = inside.wrap(argv, cwd, env)
    try:
        code = subprocess.run(
            argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
        ).returncode
    except OSError as e:
        raise SetupError(f"{what} could not start: {e}") from None
    if code != 0:
        raise SetupError(f"{what} exited {code}")


def build(setup: dict[str, Any], prefix: str, work: str, log: BinaryIO, inside: Any = None) -> None:
    """Create the environment at PREFIX and run the install script inside it: with this
    worker's python and conda, or those of the image INSIDE runs the steps in."""
    kind = setup["type"]
    base = inside.env if inside is not None else os.environ
    env = dict(base, PIP_NO_INPUT="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    if kind == "pip":
        python = "python3" if inside is not None else sys.executable
        run_step([python, "-m", "venv", prefix], log, work, env, "creating the virtualenv", inside)
        pip = [os.path.join(prefix, "bin", "python"), "-m", "pip", "install"]
        run_step(
            [*pip, "-r", os.path.join(work, setup["env_file"])],
            log,
            work,
            env,
            f"pip install -r {setup['env_file']}",
            inside,
        )
    elif kind == "conda":
        if inside is not None:
            conda: str | None = "conda"  # the image's (on its PATH)
        else:
            conda = os.environ.get("CONDA_EXE") or shutil.which("conda")
        if not conda:
            raise SetupError(
                "conda is not installed on this worker (not on PATH, no CONDA_EXE); "
                "install Miniconda there or use env_type: pip"
            )
        run_step(
            [
                conda,
                "env",
                "create",
                "--quiet",
                "-p",
                prefix,
                "-f",
                os.path.join(work, setup["env_file"]),
            ],
            log,
            work,
            env,
            f"conda env create -f {setup['env_file']}",
            inside,
        )
    else:
        os.makedirs(prefix)
    if setup.get("install_script"):
        env.update(activation(setup, prefix, base.get("PATH", "")))
        run_step(
            ["/bin/sh", os.path.join(work, setup["install_script"])],
            log,
            work,
            env,
            f"install_script {setup['install_script']}",
            inside,
        )


def prepare(
    setup: dict[str, Any],
    envs: str,
    work: str,
    run_dir: str,
    log: BinaryIO,
    package: str | None = None,
    inside: Any = None,
) -> dict[str, str]:
    """The environment ready (built now, or reused: once per worker, and image when built
    INSIDE one); returns its activation variables."""
    started = time.monotonic()
    key = env_key(setup, inside.digest if inside is not None else "")
    prefix = os.path.join(envs, key)
    os.makedirs(envs, 0o700, exist_ok=True)
    with open(os.path.join(envs, f"{key}.lock"), "wb") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            note(log, f"waiting for another job preparing environment {key}")
            fcntl.flock(lock, fcntl.LOCK_EX)
        ready = os.path.join(prefix, READY)
        reused = os.path.exists(ready)
        if reused:
            note(log, f"reusing environment {key} at {prefix}")
        else:
            if os.path.lexists(prefix):
                note(log, f"removing an unfinished build of {key}")
                shutil.rmtree(prefix)
            note(log, f"building {setup['type']} environment {key} at {prefix}")
            try:
                build(setup, prefix, work, log, inside)
            except BaseException:
                shutil.rmtree(prefix, ignore_errors=True)
                raise
            with open(ready, "w") as f:
                f.write(f"{time.time()}\n")
        if setup["type"] != "none" and inside is None:  # an image's job has it on PYTHONPATH
            try:
                expose_monkey(prefix, package)
            except OSError as e:  # the job may not need it: say so, do not fail
                note(log, f"cannot make monkey importable in the environment: {e}")
    seconds = time.monotonic() - started
    note(log, f"environment {'reused' if reused else 'built'} in {seconds:.2f}s")
    record = {"key": key, "reused": reused, "seconds": seconds, "prefix": prefix}
    with open(os.path.join(run_dir, "setup.json"), "w") as f:
        json.dump(record, f)
    return activation(setup, prefix, inside.env.get("PATH", "") if inside is not None else None)


def expose_monkey(prefix: str, package: str | None) -> None:
    """Let a job inside the environment ``import monkey`` (for ``monkey.log``): a .pth file
    in its site-packages names a folder holding only this worker's monkey package. It comes
    last on sys.path, so a monkey the requirements install wins. The agent copied to other
    workers carries only the in-job API, which every job gets anyway (shim.py); nothing is
    done there."""
    if not package or not os.path.isfile(os.path.join(package, "api.py")):
        return  # PACKAGE, the agent's monkey folder, is its client_agent alone
    shelf = os.path.join(prefix, ".monkey-lib")
    link = os.path.join(shelf, "monkey")
    if os.path.realpath(link) != os.path.realpath(package):
        os.makedirs(shelf, exist_ok=True)
        tmp = f"{link}.{os.getpid()}"
        os.symlink(package, tmp)
        os.replace(tmp, link)
    for site in glob.glob(os.path.join(prefix, "lib", "python*", "site-packages")):
        pth = os.path.join(site, "monkey-worker.pth")
        if not os.path.exists(pth):
            with open(pth, "w") as f:
                f.write(shelf + "\n")


# ---------------------------------------------------------------- persisted folders


def copy_over(src: str, dst: str) -> None:
    """Copy the tree SRC over DST (files replaced, others kept)."""
    shutil.copytree(src, dst, symlinks=True, dirs_exist_ok=True)


def save(src: str, dest: str) -> bool:
    """Snapshot the folder SRC as DEST (built aside, then renamed into place)."""
    if not os.path.isdir(src):
        return False
    parent = os.path.dirname(dest)
    os.makedirs(parent, exist_ok=True)
    tmp = f"{dest}.saving-{os.getpid()}"
    stem = os.path.basename(dest) + ".saving-"
    for name in os.listdir(parent):  # left by a save cut short (one attempt runs at a time)
        if name.startswith(stem):
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)

    def link_or_copy(s: str, d: str) -> None:
        prev = os.path.join(dest, os.path.relpath(d, tmp))
        try:
            a, b = os.stat(s), os.stat(prev)
            if a.st_size == b.st_size and a.st_mtime_ns == b.st_mtime_ns:
                os.link(prev, d)
                return
        except OSError:
            pass
        shutil.copy2(s, d)

    shutil.copytree(src, tmp, symlinks=True, copy_function=link_or_copy)
    old = f"{dest}.old-{os.getpid()}"
    if os.path.isdir(dest):
        os.rename(dest, old)
    os.rename(tmp, dest)
    shutil.rmtree(old, ignore_errors=True)
    return True


def restore_persisted(cfg: dict[str, Any], log: BinaryIO) -> None:
    folder = cfg["persist_dir"]
    names = os.listdir(folder) if os.path.isdir(folder) else []
    for item in cfg["persist"]:
        saved = os.path.join(folder, item["name"])
        aside = [n for n in names if n.startswith(item["name"] + ".old-")]
        if aside and not os.path.isdir(saved):  # a save stopped between its two renames
            os.rename(os.path.join(folder, aside[0]), saved)
        if os.path.isdir(saved):
            copy_over(saved, os.path.join(cfg["work"], item["path"]))
            note(log, f"restored persisted folder {item['path']} from {saved}")


def save_persisted(cfg: dict[str, Any], log: BinaryIO) -> None:
    for item in cfg["persist"]:
        src = os.path.join(cfg["work"], item["path"])
        try:
            if save(src, os.path.join(cfg["persist_dir"], item["name"])):
                note(log, f"saved {item['path']}")
        except OSError as e:
            note(log, f"saving {item['path']} failed: {e}")


# ---------------------------------------------------------------- main


def _not_started(program: str, error: OSError | str, code: int = 0) -> int:
    """Say that PROGRAM could not be run (ERROR: the exec's, or why not in words with its
    CODE) and mark the claim as the wrapper does (a line "spawn": the job never started);
    the exit code: 126 not executable, else 127."""
    if isinstance(error, str):
        sys.stderr.write(f"monkey: {error}\n")
    else:
        sys.stderr.write(f"monkey-job: {program}: {error.strerror}\n")
        code = 126 if error.errno in (errno.EACCES, errno.EISDIR, errno.ENOEXEC) else 127
    try:
        with open(os.environ["MONKEY_STARTED_FILE"], "a") as f:
            f.write("spawn\n")
    except (KeyError, OSError):
        pass
    return code


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        sys.stderr.write("usage: launcher.py LAUNCH_JSON -- ARGV...\n")
        return 2
    with open(argv[0]) as f:
        cfg = json.load(f)
    cmd = argv[2:]
    stop: list[int] = []
    # The agent signals the whole session: the job gets the signal itself; the launcher
    # stays to save the persisted folders once the job is gone.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda signum, _f: stop.append(signum))
    run_dir = cfg["run_dir"]
    env = dict(os.environ)
    image = cfg.get("image")
    inside = None  # the image the set-up runs in
    activated: dict[str, str] = {}
    engine = image.get("engine", "bwrap") if image else ""  # bwrap: monkey's own runner
    with open(os.path.join(run_dir, "setup.log"), "ab") as log:
        try:
            if image:
                sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
                import image as runner  # type: ignore[import-not-found]  # beside this file

                if engine != "bwrap":
                    import engines  # type: ignore[import-not-found]  # beside this file

                    login = runner.take_login(run_dir)  # first: the job never sees it
                    try:
                        engines.fetch(image, login, run_dir, log)
                        if cfg.get("setup"):
                            inside = engines.Inside(image, login)
                    except engines.EngineError as e:
                        raise SetupError(str(e)) from None
                else:
                    try:
                        bundle = runner.pull(image, run_dir, log)
                    except runner.ImageError as e:
                        raise SetupError(str(e)) from None
                    inside = runner.Inside(image, bundle)
            restore_persisted(cfg, log)
            if cfg.get("setup"):
                activated = prepare(
                    cfg["setup"],
                    cfg["envs"],
                    cfg["work"],
                    run_dir,
                    log,
                    cfg.get("package"),
                    inside,
                )
                env.update(activated)
        except (SetupError, OSError) as e:
            if stop:
                note(log, f"set-up stopped by signal {stop[0]}")
                return 128 + stop[0]
            note(log, f"set-up failed: {e}")
            with open(os.path.join(run_dir, "setup.failed"), "w") as f:
                f.write(" ".join(str(e).split()) + "\n")
            return 1
        if stop:
            return 128 + stop[0]
        if engine and engine != "bwrap":  # the launcher stays, to remove the container
            cmd, env = engines.run(image, cmd, env, login, activated)
        elif image:
            boxed, why, code = runner.command(image, bundle, cmd, env, activated)
            if why:
                return _not_started(cmd[0], why, code)
            cmd = boxed
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}  # bwrap's own
        if not cfg["persist"] and engine in ("", "bwrap"):  # nothing to save: become the job
            log.close()
            try:
                os.execvpe(cmd[0], cmd, env)
            except OSError as e:
                return _not_started(cmd[0], e)
        try:
            proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL)
        except OSError as e:
            return _not_started(cmd[0], e)
        try:
            interval = float(os.environ.get("MONKEY_PERSIST_INTERVAL", "60"))
        except ValueError:
            note(log, "MONKEY_PERSIST_INTERVAL is not a number of seconds; saving every 60 s")
            interval = 60.0
        while True:
            try:
                code = proc.wait(timeout=max(0.05, interval))
                break
            except subprocess.TimeoutExpired:
                save_persisted(cfg, log)
        save_persisted(cfg, log)
        if engine and engine != "bwrap":
            engines.remove(image)
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
