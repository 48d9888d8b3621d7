"""The container engines a worker may run jobs' images with, beside monkey's own
unprivileged runner (image.py): Docker, Podman and Apptainer, through their command lines.
Standard library only (see agent.py); launcher.py runs the job through them.

Each engine pulls the pinned digest with the pull's login (Docker: a private ``--config``
folder; Podman: ``--authfile`` and ``--cert-dir``; Apptainer: ``APPTAINER_DOCKER_USERNAME``
and ``_PASSWORD`` in its own environment). A registry whose CA a login gave (a lab's
self-signed one) is pulled from by monkey's own pull for Docker, streamed into ``docker
load``: Docker's engine trusts a CA only from a root-owned ``certs.d`` on every worker, and
only for all its users. Then each engine runs the command in the image as the
worker's user, the job's folders bound at their own paths, in its folder, with the job's
own variables (given by name, their values in the engine's environment: never on a command
line) and GPUs passed through when the job has some (``CUDA_VISIBLE_DEVICES``): Docker's
``--gpus``, Podman's CDI devices (``nvidia.com/gpu=N``), Apptainer's ``--nv``. A Docker or
Podman container is named ``monkey-JUID-ATTEMPT`` and removed when it ends. A job.yml
set-up runs in the image the same way, step by step (``Inside``), once per worker and digest.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# an "engine:" of providers.yml, or auto
ENGINES = ("bwrap", "docker", "podman", "apptainer", "pyxis")
LABELS = {
    "bwrap": "unprivileged (bubblewrap)",
    "docker": "docker",
    "podman": "podman",
    "apptainer": "apptainer",
    "pyxis": "pyxis (srun --container-image)",
}
_PROBE_TIMEOUT = 10.0
_PYXIS: dict[str, str] = {}  # srun's path -> itself when it has pyxis's flags, else ""


def cli(engine: str) -> str:
    """The path of ENGINE's command on this worker ("" when it has none; Apptainer's may be
    called singularity; pyxis's is srun, in a Slurm allocation whose srun has pyxis's
    ``--container-image`` and whose node has enroot)."""
    if engine == "pyxis":
        return _pyxis()
    names = ("apptainer", "singularity") if engine == "apptainer" else (engine,)
    return next((p for p in map(shutil.which, names) if p), "")


def _pyxis() -> str:
    srun = shutil.which("srun")
    if not srun or "SLURM_JOB_ID" not in os.environ or not shutil.which("enroot"):
        return ""
    if srun not in _PYXIS:
        try:
            said = subprocess.run([srun, "--help"], stdin=subprocess.DEVNULL, capture_output=True,
                                  timeout=_PROBE_TIMEOUT).stdout  # fmt: skip
        except (OSError, subprocess.TimeoutExpired):
            said = b""
        _PYXIS[srun] = srun if b"--container-image" in said else ""
    return _PYXIS[srun]


def works(engine: str) -> str:
    """ "" when ENGINE (docker, podman, apptainer or pyxis) can run jobs here, else why not."""
    path = cli(engine)
    if not path:
        if engine == "pyxis":
            return "pyxis is not here (srun without --container-image, or not in an allocation)"
        return f"{engine} is not installed on this worker"
    if engine in ("apptainer", "pyxis"):
        return ""
    try:
        proc = subprocess.run(
            [path, "info", "--format", "{{json .}}"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=_PROBE_TIMEOUT,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{engine} cannot run: {e}"
    if proc.returncode != 0:
        said = proc.stderr.decode(errors="replace").strip().splitlines()
        return f"{engine} cannot reach its engine ({said[-1] if said else proc.returncode})"
    return ""


def name(cfg: dict[str, Any]) -> str:
    """The container's name: monkey-JUID-ATTEMPT."""
    return f"monkey-{cfg['juid']}-{cfg['attempt']}"


class EngineError(Exception):
    """The engine cannot pull the image; the message is one line for the user."""


def fetch(cfg: dict[str, Any], login: dict[str, Any], run_dir: str, log: Any) -> None:
    """Pull CFG's pinned image with its engine (its output in LOG), with LOGIN in a private
    folder gone once the pull is over; EngineError in one line when it cannot."""
    if _loaded(cfg, login):
        _load(cfg, login, run_dir, log)
        return
    if cfg["engine"] == "pyxis":
        _import(cfg, login, log)
        return
    folder = os.path.join(run_dir, f"engine-auth-{os.getpid()}")
    os.makedirs(folder, 0o700, exist_ok=True)
    try:
        argv = pull(cfg, login, folder)
        if not argv:
            return
        started = time.monotonic()
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.PIPE)
    except OSError as e:
        raise EngineError(f"image {cfg['ref']}: {cfg['engine']} cannot pull it: {e}") from None
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if proc.returncode != 0:
        log.write(proc.stderr)
        raise EngineError(_said(cfg, proc.stderr))
    seconds = time.monotonic() - started
    log.write(f"[monkey] image {cfg['ref']} @ {cfg['digest']}: pulled by {cfg['engine']} in "
              f"{seconds:.2f} s\n".encode())  # fmt: skip
    log.flush()


def _loaded(cfg: dict[str, Any], login: dict[str, Any]) -> bool:
    """Whether Docker gets CFG's image from monkey's own pull (``docker load``) rather than
    pulling it itself: when the registry's CA is a login's (a lab's self-signed one), which
    Docker's engine would trust only from a root-owned certs.d on every worker."""
    return cfg["engine"] == "docker" and bool(login.get("ca"))


def local_ref(cfg: dict[str, Any], login: dict[str, Any]) -> str:
    """The reference CFG's engine runs the image by: its digest, the tag of the digest
    monkey loaded into Docker (``NAME:sha256-HEX``; ``docker load`` records no digest), or
    for pyxis the squashfs file enroot imported it as (``STORE/enroot/HEX.sqsh``)."""
    if cfg["engine"] == "pyxis":
        return os.path.join(cfg["store"], "enroot", cfg["digest"].split(":", 1)[1] + ".sqsh")
    if _loaded(cfg, login):
        return f"{cfg['name']}:{cfg['digest'].replace(':', '-')}"
    return f"{cfg['name']}@{cfg['digest']}"


def _load(cfg: dict[str, Any], login: dict[str, Any], run_dir: str, log: Any) -> None:
    """Pull CFG's image with monkey's own pull (LOGIN's CA trusted, every blob checked
    against its digest) streamed into ``docker load``, tagged ``local_ref``; nothing pulled
    when Docker has that tag already."""
    import image  # type: ignore[import-not-found]  # beside this file
    import pull  # type: ignore[import-not-found]  # beside this file

    path, tag, what = cfg["engine_path"], local_ref(cfg, login), f"image {cfg['ref']}"
    found = subprocess.run([path, "image", "inspect", "--format", "{{.Id}}", tag],
                           stdin=subprocess.DEVNULL, capture_output=True)  # fmt: skip
    if found.returncode == 0:
        image.progress(run_dir, 0, None, done=True)
        log.write(
            f"[monkey] {what} @ {cfg['digest']}: in docker already (0 bytes pulled)\n".encode()
        )
        log.flush()
        return
    started = time.monotonic()
    image.progress(run_dir, 0, None, done=False)
    with tempfile.TemporaryFile() as err:
        try:
            proc = subprocess.Popen([path, "load", "-q"], stdin=subprocess.PIPE, stdout=log,
                                    stderr=err)  # fmt: skip
        except OSError as e:
            raise EngineError(f"{what}: docker cannot load it: {e}") from None
        assert proc.stdin is not None
        try:
            fetched = pull.archive(
                cfg, login, proc.stdin, tag,
                lambda got, total: image.progress(run_dir, got, total, done=False),
            )  # fmt: skip
            proc.stdin.close()
        except pull.PullError as e:
            proc.kill()
            proc.wait()
            raise EngineError(f"{what}: {e}") from None
        except OSError as e:  # docker load ended first (its stderr says why)
            proc.kill()
            proc.wait()
            err.seek(0)
            said = err.read().decode(errors="replace").strip().splitlines()
            raise EngineError(f"{what}: docker load failed: {said[-1] if said else e}") from None
        if proc.wait() != 0:
            err.seek(0)
            said = err.read().decode(errors="replace").strip().splitlines()
            raise EngineError(
                f"{what}: docker load failed: {said[-1] if said else proc.returncode}"
            )
    image.progress(run_dir, fetched, None, done=True)
    log.write(f"[monkey] {what} @ {cfg['digest']}: pulled {fetched:,} bytes and loaded into "
              f"docker in {time.monotonic() - started:.2f} s\n".encode())  # fmt: skip
    log.flush()


def _import(cfg: dict[str, Any], login: dict[str, Any], log: Any) -> None:
    """Import CFG's pinned image with enroot as the squashfs file pyxis runs (once per worker
    and digest), LOGIN's credentials in a private ``ENROOT_CONFIG_PATH`` (``.credentials``,
    netrc) and its CA as curl's bundle, gone once imported."""
    sqsh, what = local_ref(cfg, login), f"image {cfg['ref']}"
    if os.path.exists(sqsh):
        log.write(
            f"[monkey] {what} @ {cfg['digest']}: on this worker already (0 bytes pulled)\n".encode()
        )
        log.flush()
        return
    enroot = shutil.which("enroot")
    if not enroot:
        raise EngineError(f"{what}: pyxis needs enroot on the node, and it has none")
    os.makedirs(os.path.dirname(sqsh), 0o700, exist_ok=True)
    folder = f"{sqsh}.auth-{os.getpid()}"
    tmp = f"{sqsh}.tmp-{os.getpid()}"
    env = dict(os.environ)
    os.makedirs(folder, 0o700, exist_ok=True)
    started = time.monotonic()
    try:
        creds = _creds(login, cfg["name"].split("/", 1)[0])
        if creds:
            user, _, password = creds.partition(":")
            host = cfg["name"].split("/", 1)[0]
            _write(
                os.path.join(folder, ".credentials"),
                f"machine {host} login {user} password {password}\n",
            )
            env["ENROOT_CONFIG_PATH"] = folder
        if login.get("ca"):
            _write(os.path.join(folder, "ca.crt"), login["ca"])
            env["CURL_CA_BUNDLE"] = os.path.join(folder, "ca.crt")
        argv = [enroot, "import", "--output", tmp, f"docker://{cfg['name']}@{cfg['digest']}"]
        proc = subprocess.run(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.PIPE, env=env
        )
        if proc.returncode != 0:
            log.write(proc.stderr)
            raise EngineError(_said(cfg, proc.stderr))
        os.replace(tmp, sqsh)
    except OSError as e:
        raise EngineError(f"{what}: enroot cannot import it: {e}") from None
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        if os.path.exists(tmp):
            os.unlink(tmp)
    log.write(f"[monkey] {what} @ {cfg['digest']}: imported by enroot in "
              f"{time.monotonic() - started:.2f} s\n".encode())  # fmt: skip
    log.flush()


def _said(cfg: dict[str, Any], stderr: bytes) -> str:
    """An engine's failed pull as one line, with the fix."""
    said = stderr.decode(errors="replace")
    low = said.lower()
    host = cfg["name"].split("/", 1)[0]
    what = f"image {cfg['ref']}"
    if "unauthorized" in low or "authentication required" in low or "denied" in low:
        return f"{what}: registry {host} refused access (unauthorized); log in: monkey registry login {host}"
    if "manifest unknown" in low or "not found" in low:
        return f"{what}: not found in registry {host}"
    if "x509" in low or "certificate" in low:
        return (
            f"{what}: {cfg['engine']} does not trust registry {host}'s certificate; give its CA: "
            f"monkey registry login {host} --ca-file CA.crt"
        )
    if "no space left" in low:
        return f"{what}: no space left on the worker for {cfg['engine']}'s images"
    lines = [ln.strip() for ln in said.splitlines() if ln.strip()]
    return f"{what}: {cfg['engine']} could not pull it: {(lines[-1] if lines else 'no message')[-300:]}"


def pull(cfg: dict[str, Any], login: dict[str, Any], folder: str) -> list[str]:
    """The argv that pulls CFG's pinned image with LOGIN (kept in the private FOLDER), or
    [] when the run pulls it itself (Apptainer)."""
    engine, path = cfg["engine"], cfg["engine_path"]
    ref = f"{cfg['name']}@{cfg['digest']}"
    auths = login.get("auths") or {}
    if engine == "docker":
        _write(os.path.join(folder, "config.json"), json.dumps({"auths": auths}))
        return [path, "--config", folder, "pull", "-q", ref]
    if engine == "podman":
        argv = [path, "pull", "-q"]
        if auths:
            _write(os.path.join(folder, "auth.json"), json.dumps({"auths": auths}))
            argv += ["--authfile", os.path.join(folder, "auth.json")]
        if login.get("ca"):
            os.makedirs(os.path.join(folder, "certs"), 0o700, exist_ok=True)
            _write(os.path.join(folder, "certs", "ca.crt"), login["ca"])
            argv += ["--cert-dir", os.path.join(folder, "certs")]
        return [*argv, ref]
    return []


def run(
    cfg: dict[str, Any],
    cmd: list[str],
    env: dict[str, str],
    login: dict[str, Any],
    activated: dict[str, str] | None = None,
) -> tuple[list[str], dict[str, str]]:
    """(the argv that runs CMD in CFG's image with CFG's engine, the environment of that
    process). ENV: the job's own variables (CFG's "env" names them) and its PYTHONPATH;
    ACTIVATED: those of its job.yml environment (built in the image: ``Inside``)."""
    own = {k: env[k] for k in cfg["env"] if k in env}
    own.update(activated or {})
    own["PYTHONPATH"] = cfg["path"]
    gpus = [g for g in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g]
    return _argv(cfg, cfg["cwd"], cmd, own, login, gpus)


def _argv(
    cfg: dict[str, Any],
    cwd: str,
    cmd: list[str],
    own: dict[str, str],
    login: dict[str, Any],
    gpus: list[str],
) -> tuple[list[str], dict[str, str]]:
    """(the argv that runs CMD in CWD in CFG's image with OWN as the variables it gives,
    GPUS passed through; the environment of that process: OWN's values, never on its
    command line)."""
    engine, path = cfg["engine"], cfg["engine_path"]
    ref = local_ref(cfg, login)
    outer = {"PATH": os.environ.get("PATH") or "/usr/bin:/bin"}
    for key in ("DOCKER_HOST", "CONTAINER_HOST", "XDG_RUNTIME_DIR", "HOME"):
        if key in os.environ:  # where the engine's client finds its engine and its files
            outer[key] = os.environ[key]
    if engine == "pyxis":  # a step of the allocation, its srun's environment
        outer.update({k: v for k, v in os.environ.items() if k.startswith("SLURM")})
        outer.update(own)  # the image's values win over srun's but for these (--container-env)
        mounts = [f"{f}:{f}" for f in cfg["writable"]] + [f"{f}:{f}:ro" for f in cfg["readable"]]
        argv = [path, "--overlap", "--nodes=1", "--ntasks=1", "--quiet", f"--container-image={ref}",
                f"--container-mounts={','.join(mounts)}", f"--container-workdir={cwd}",
                "--no-container-mount-home", f"--container-env={','.join(sorted(own))}"]  # fmt: skip
        return [*argv, *cmd], outer
    if engine == "apptainer":
        argv = [path, "exec", "--cleanenv", "--containall", "--no-home", "--pwd", cwd]
        argv += ["--nv"] if gpus else []
        for folder in cfg["writable"]:
            argv += ["--bind", f"{folder}:{folder}"]
        for folder in cfg["readable"]:
            argv += ["--bind", f"{folder}:{folder}:ro"]
        outer.update({f"APPTAINERENV_{k}": v for k, v in own.items()})
        creds = _creds(login, cfg["name"].split("/", 1)[0])
        if creds:
            user, _, password = creds.partition(":")
            outer["APPTAINER_DOCKER_USERNAME"], outer["APPTAINER_DOCKER_PASSWORD"] = user, password
        return [*argv, f"docker://{ref}", *cmd], outer
    argv = [path, "run", "--rm", "--name", name(cfg), "--init", "--network", "host"]
    argv += ["--user", f"{os.getuid()}:{os.getgid()}", "--workdir", cwd]
    if engine == "podman":
        argv += ["--userns", "keep-id"]  # the worker's user inside, its files its own
        for gpu in gpus:
            argv += ["--device", f"nvidia.com/gpu={gpu}"]  # CDI
    elif gpus:
        argv += ["--gpus", f'"device={",".join(gpus)}"']
    for folder in cfg["writable"]:
        argv += ["--volume", f"{folder}:{folder}"]
    for folder in cfg["readable"]:
        argv += ["--volume", f"{folder}:{folder}:ro"]
    for key, value in sorted(own.items()):
        argv += ["--env", key]  # its value from this process's environment
        outer[key] = value
    return [*argv, "--entrypoint", cmd[0], ref, *cmd[1:]], outer


class Inside:
    """The image a job.yml set-up runs in with CFG's engine (launcher.py): each step runs
    in the image as the job will (its folders bound at their paths, as the worker's user,
    in a container of the job's name, removed once the step is over), with the image's
    environment (its config's Env, read from the registry with LOGIN once per worker and
    digest); the environment built is the image's alone (keyed by its digest)."""

    def __init__(self, cfg: dict[str, Any], login: dict[str, Any]) -> None:
        self.cfg, self.login, self.digest = cfg, login, cfg["digest"]
        self.env = image_env(cfg, login)

    def wrap(
        self, command: list[str], cwd: str, env: dict[str, str]
    ) -> tuple[list[str], dict[str, str]]:
        """(the argv that runs COMMAND in CWD in the image with ENV as its environment, the
        environment of that argv's process)."""
        return _argv(self.cfg, cwd, command, env, self.login, [])


def image_env(cfg: dict[str, Any], login: dict[str, Any]) -> dict[str, str]:
    """The environment CFG's image gives its processes (its config's ``Env``), kept in
    CFG's store as ``configs/HEX.json`` once read from the registry with LOGIN;
    EngineError in one line when it cannot be read."""
    import pull  # beside this file, as in _load

    path = os.path.join(cfg["store"], "configs", cfg["digest"].split(":", 1)[1] + ".json")
    try:
        with open(path) as f:
            config = json.load(f)
    except (OSError, ValueError):
        try:
            registry = pull.Registry(cfg["name"], login, login.get("ca"))
            config = registry.config(registry.manifest(cfg["digest"])["config"]).get("config")
        except pull.PullError as e:
            raise EngineError(f"image {cfg['ref']}: reading its config: {e}") from None
        config = config if isinstance(config, dict) else {}
        os.makedirs(os.path.dirname(path), 0o700, exist_ok=True)
        _write(f"{path}.{os.getpid()}", json.dumps(config))
        os.replace(f"{path}.{os.getpid()}", path)
    listed = config.get("Env") if isinstance(config, dict) else None
    pairs = [i.split("=", 1) for i in listed or [] if isinstance(i, str) and "=" in i]
    env = dict(pairs)
    env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    return env


def remove(cfg: dict[str, Any]) -> None:
    """Remove CFG's container, if it is still there (its job is over)."""
    if cfg["engine"] in ("docker", "podman"):
        subprocess.run(
            [cfg["engine_path"], "rm", "-f", name(cfg)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _creds(login: dict[str, Any], host: str) -> str:
    entry = (login.get("auths") or {}).get(host) or {}
    try:
        return base64.b64decode(entry.get("auth", "")).decode()
    except (ValueError, UnicodeDecodeError, AttributeError):
        return ""
