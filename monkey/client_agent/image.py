"""Jobs in OCI images without root or a daemon: monkey's own unprivileged runner. Standard
library only (see agent.py); it runs in launcher.py, inside the job's session.

Pull (pull.py, in the launcher's process): the pinned digest's manifest and layers fetched
from the registry's HTTP API, each layer unpacked as it arrives into
``ROOT/images/roots/HEX/rootfs`` (the image's config beside it: ``image.json``), renamed
into place once whole. One pull at a time per worker (``ROOT/images/.lock``); a job finding its image unpacked pulls
nothing. Progress (bytes fetched so far, of the total) is written to the run folder's
``pull.json``; an unreachable registry is tried again after 2, 4, 8 and 16 s.

Run: bubblewrap with the image as the root, read-only (as Apptainer runs images): the
image's folders bound read-only, those on the way to the job's own folders made in the
sandbox's own root so that the job's folders (run folder, checkpoints, persisted folders,
datasets, monkey's in-job package) are bound at the same paths as outside; ``/tmp`` and
the job's HOME are private tmpfs; new user, PID and IPC namespaces, no capabilities. The
environment is the image's (its config's Env) plus the job's own variables; nothing of the
worker's. The command is looked up in the image (not found: 127, marked "spawn").
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, BinaryIO

READY = ".monkey-ready"
# bubblewrap's options of every sandbox (an image's, and a main node's: sandbox.py): new
# user, PID and IPC namespaces, the network as any job's, no capability kept.
ISOLATED = (
    "--unshare-user",
    "--unshare-pid",
    "--unshare-ipc",
    "--share-net",
    "--die-with-parent",
    "--cap-drop",
    "ALL",
)
PULL_TRIES = 5  # an unreachable registry: tried again after 2, 4, 8, 16 s
_LINKS_MAX = 40


class ImageError(Exception):
    """The image cannot be pulled or run; the message is one line for the user."""


def pull(cfg: dict[str, Any], run_dir: str, log: BinaryIO) -> str:
    """The unpacked bundle of the image CFG pins (pulled and unpacked when this worker has
    not got it yet: pull.py); ImageError in one line when it cannot be. Called in
    launcher.py's process, with pull.py beside it."""
    import pull as fetcher  # type: ignore[import-not-found]  # beside this file

    store = cfg["store"]
    final = os.path.join(store, "roots", cfg["digest"].split(":", 1)[1])
    login = take_login(run_dir)  # first, whatever follows: the job never sees it
    if _cached(final, cfg, run_dir, log):
        return final
    os.makedirs(os.path.join(store, "roots"), 0o700, exist_ok=True)
    what = f"image {cfg.get('ref') or cfg['name']}"
    with open(os.path.join(store, ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _cached(final, cfg, run_dir, log):  # pulled while this one waited
            return final
        started = time.monotonic()
        progress(run_dir, 0, None, done=False)
        tmp = f"{final}.tmp"
        for attempt in range(PULL_TRIES):
            shutil.rmtree(tmp, ignore_errors=True)
            try:
                fetched, config = fetcher.fetch(
                    cfg,
                    login,
                    os.path.join(tmp, "rootfs"),
                    lambda got, total: progress(run_dir, got, total, done=False),
                    lambda text: _note(log, f"{what}: {text}"),
                )
                break
            except fetcher.PullError as e:
                shutil.rmtree(tmp, ignore_errors=True)
                message = f"{what}: {e}"
                if e.kind != "unreachable" or attempt == PULL_TRIES - 1:
                    if e.kind == "refused":
                        message = f"{what}: unpacking failed: {e}"
                    raise ImageError(message) from None
                _note(log, f"{message}; trying again in {2 << attempt} s")
                time.sleep(2 << attempt)
            except OSError as e:
                shutil.rmtree(tmp, ignore_errors=True)
                if e.errno in (errno.ENOSPC, errno.EDQUOT):
                    free = shutil.disk_usage(store).free
                    raise ImageError(
                        f"{what}: no space left on the worker at {store} ({free:,} bytes free) "
                        "while pulling"
                    ) from None
                raise ImageError(f"{what}: pulling failed: {e}") from None
        with open(os.path.join(tmp, "image.json"), "w") as f:
            json.dump(config.get("config") or {}, f)
        with open(os.path.join(tmp, READY), "w"):
            pass
        os.rename(tmp, final)
        progress(run_dir, fetched, None, done=True)
        _note(
            log,
            f"image {cfg['ref']} @ {cfg['digest']}: pulled {fetched:,} bytes and unpacked "
            f"in {time.monotonic() - started:.2f} s",
        )
    return final


def ready(cfg: dict[str, Any]) -> str:
    """The bundle of the image CFG pins when this worker has it unpacked, else ""."""
    final = os.path.join(cfg["store"], "roots", cfg["digest"].split(":", 1)[1])
    return final if os.path.exists(os.path.join(final, READY)) else ""


def reused(cfg: dict[str, Any], bundle: str, run_dir: str) -> None:
    """Note in RUN_DIR's setup.log that the job runs in the unpacked BUNDLE as it is."""
    with open(os.path.join(run_dir, "setup.log"), "ab") as log:
        _cached(bundle, cfg, run_dir, log)


def command(
    cfg: dict[str, Any],
    bundle: str,
    cmd: list[str],
    env: dict[str, str],
    activated: dict[str, str] | None = None,
) -> tuple[list[str], str, int]:
    """(the argv that runs CMD in the image at BUNDLE, "", 0), or ([], why not, the exit
    code: 127 not found, 126 not executable) when the image lacks CMD's program. Its
    environment: the image's, the job's own variables of ENV (CFG's "env"), those that
    ACTIVATED its job.yml environment (built in the image: ``Inside``), its PYTHONPATH."""
    own = {k: env[k] for k in cfg["env"] if k in env}
    job_env = {**image_env(bundle), **own, **(activated or {}), "PYTHONPATH": cfg["path"]}
    root = os.path.join(bundle, "rootfs")
    bound = [cfg["cwd"], *cfg["writable"], *cfg["readable"]]
    why, code = find_command(root, cmd[0], job_env["PATH"], cfg["cwd"], bound)
    if why:
        return [], why, code
    out = argv(cfg["bwrap"], bundle, cfg["cwd"], cmd, cfg["writable"], cfg["readable"], job_env)
    return out, "", 0


class Inside:
    """The image a job.yml set-up runs in (launcher.py): its steps run in the image at
    BUNDLE as the job will (its folders bound at their paths), with the image's
    environment; the environment built is the image's alone (keyed by its DIGEST)."""

    def __init__(self, cfg: dict[str, Any], bundle: str) -> None:
        self.cfg, self.bundle, self.digest = cfg, bundle, cfg["digest"]
        self.env = image_env(bundle)

    def wrap(
        self, command: list[str], cwd: str, env: dict[str, str]
    ) -> tuple[list[str], dict[str, str]]:
        """(the argv that runs COMMAND in CWD in the image with ENV as its environment,
        the environment of that argv's process: bwrap's own)."""
        cfg = self.cfg
        out = argv(cfg["bwrap"], self.bundle, cwd, command, cfg["writable"], cfg["readable"], env)
        return out, {"PATH": os.environ.get("PATH") or "/usr/bin:/bin"}


def _cached(final: str, cfg: dict[str, Any], run_dir: str, log: BinaryIO) -> bool:
    """Whether the image is unpacked on this worker already (then noted as used now)."""
    if not os.path.exists(os.path.join(final, READY)):
        return False
    try:
        os.utime(os.path.join(final, READY))  # when a job last used it (for the gc)
    except OSError:
        pass
    progress(run_dir, 0, None, done=True)
    _note(log, f"image {cfg['ref']} @ {cfg['digest']}: on this worker already (0 bytes pulled)")
    return True


def _note(log: BinaryIO, text: str) -> None:
    log.write(f"[monkey] {text}\n".encode())
    log.flush()


def take_login(run_dir: str) -> dict[str, Any]:
    """The pull's login and CA the agent left in RUN_DIR's pull-auth.json, which is gone
    once this returns (read or not); {} when there is none."""
    path = os.path.join(run_dir, "pull-auth.json")
    try:
        with open(path) as f:
            auth = json.load(f)
    except (OSError, ValueError):
        auth = {}
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
    return auth if isinstance(auth, dict) else {}


def progress(run_dir: str, fetched: int, total: int | None, done: bool) -> None:
    """Tell RUN_DIR's pull.json how far the pull is (the agent shows it: `pulling`)."""
    path = os.path.join(run_dir, "pull.json")
    try:
        with open(f"{path}.tmp", "w") as f:
            json.dump({"bytes": max(0, fetched), "total": total, "done": done}, f)
        os.replace(f"{path}.tmp", path)
    except OSError:
        pass


# ---------------------------------------------------------------- running


def image_env(bundle: str) -> dict[str, str]:
    """The environment the image's config gives its processes (its ``Env``)."""
    try:
        with open(os.path.join(bundle, "image.json")) as f:
            listed = json.load(f).get("Env") or []
    except (OSError, ValueError, AttributeError):
        listed = []
    env = dict(item.split("=", 1) for item in listed if isinstance(item, str) and "=" in item)
    env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    return env


def _locate(root: str, path: str, bound: list[str]) -> str | None:
    """The host path of PATH in the sandbox of the image ROOT whose folders BOUND are at
    their own paths (a link there to an absolute path leads into the image); None when it
    does not exist."""
    bound = [os.path.normpath(b) for b in bound if os.path.normpath(b) != "/"]
    for _ in range(_LINKS_MAX):
        if not any(path == b or path.startswith(b + "/") for b in bound):
            return _inside(root, path)
        if not os.path.islink(path):
            return path if os.path.lexists(path) else None
        target = os.readlink(path)
        path = os.path.normpath(os.path.join(os.path.dirname(path), target))
    return None


def _inside(root: str, path: str) -> str | None:
    """The host path of PATH as seen inside the image ROOT (symlinks resolved inside it);
    None when it does not exist."""
    parts = [p for p in path.split("/") if p]
    seen = 0
    done: list[str] = []
    while parts:
        part = parts.pop(0)
        if part == ".":
            continue
        if part == "..":
            if done:
                done.pop()
            continue
        host = os.path.join(root, *done, part)
        if os.path.islink(host):
            seen += 1
            if seen > _LINKS_MAX:
                return None
            target = os.readlink(host)
            if target.startswith("/"):
                done = []
            parts = [p for p in target.split("/") if p] + parts
            continue
        if not os.path.lexists(host):
            return None
        done.append(part)
    return os.path.join(root, *done)


def find_command(
    root: str, program: str, path: str, cwd: str, bound: list[str] | None = None
) -> tuple[str, int]:
    """("", 0) when PROGRAM runs in the image ROOT (looked up on the image's PATH, or at
    its path, relative to CWD; the folders BOUND, CWD's by default, at their own paths),
    else (why, 127 or 126)."""
    if "/" in program:
        candidates = [program if program.startswith("/") else os.path.join(cwd, program)]
    else:
        candidates = [os.path.join(d, program) for d in path.split(":") if d.startswith("/")]
    for candidate in candidates:
        host = _locate(root, candidate, [cwd] if bound is None else bound)
        if host is None:
            continue
        if os.path.isfile(host) and os.access(host, os.X_OK):
            return "", 0
        if "/" in program:
            return f"not executable in the image: {program}", 126
    return f"command not found in the image: {program} (not on the image's PATH)", 127


def argv(
    bwrap: str,
    bundle: str,
    cwd: str,
    command: list[str],
    writable: list[str],
    readable: list[str],
    env: dict[str, str],
) -> list[str]:
    """COMMAND run in CWD in the image unpacked at BUNDLE, with the folders of WRITABLE and
    READABLE bound at their own paths, and ENV as its whole environment."""
    root = os.path.join(bundle, "rootfs")
    own = [os.path.normpath(f) for f in (*writable, *readable, cwd)]
    out = [bwrap, *ISOLATED]
    _splay(root, "/", own, out)
    out += ["--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
    for dev in nvidia_devices():
        out += ["--dev-bind", dev, dev]
    home = env.get("HOME") or "/tmp"
    if home != "/tmp" and home.startswith("/"):
        out += ["--tmpfs", home]
    out += binds(writable, readable)
    out += ["--chdir", cwd, "--clearenv"]
    for name, value in sorted(env.items()):
        out += ["--setenv", name, value]
    return [*out, "--", *command]


_SPECIAL = {"/dev", "/proc", "/tmp", "/sys"}


def _splay(src: str, dst: str, own: list[str], out: list[str]) -> None:
    """Bind the image folder SRC at DST read-only, entry by entry where one of OWN's folders
    lies beneath (those folders are then made in the sandbox's own root, where bwrap can
    make the job's mount points)."""
    try:
        names = sorted(os.listdir(src))
    except OSError:
        return
    for name in names:
        s, d = os.path.join(src, name), os.path.join(dst, name)
        if d in _SPECIAL:
            continue
        if os.path.islink(s):
            out += ["--symlink", os.readlink(s), d]
        elif os.path.isdir(s):
            if any(f == d or f.startswith(d + "/") for f in own):
                out += ["--dir", d]
                _splay(s, d, own, out)
            else:
                out += ["--ro-bind", s, d]
        elif os.path.isfile(s):
            out += ["--ro-bind", s, d]


def binds(writable: list[str], readable: list[str]) -> list[str]:
    """bubblewrap's options binding the folders of WRITABLE then READABLE (those that
    exist), each at its own path."""
    out: list[str] = []
    for folder in writable:
        if os.path.isdir(folder):
            out += ["--bind", folder, folder]
    for folder in readable:
        if os.path.exists(folder):
            out += ["--ro-bind", folder, folder]
    return out


def nvidia_devices() -> list[str]:
    """The GPUs' device files (/dev/nvidia*), passed through to jobs in a sandbox."""
    try:
        return sorted(os.path.join("/dev", n) for n in os.listdir("/dev") if n.startswith("nvidia"))
    except OSError:
        return []
