"""Running `monkey server`: its files under MONKEY_HOME/server (settings, certificate and
key, pid, lock, log), the first start (a certificate, an admin), the foreground server
(uvicorn) and the detached one (started and stopped like the core: one per MONKEY_HOME,
held by a file lock)."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from monkey.config import (
    Home,
    first_error,
    lock_now,
    open_private,
    python_entry,
    stop_process,
    write_private,
)
from monkey.models import MonkeyError, whole_number

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

DEFAULT_BIND = "127.0.0.1:8443"
LOOPBACK = ("127.0.0.1", "::1", "localhost")


class Files:
    """The server's files in MONKEY_HOME/server."""

    def __init__(self, home: Home) -> None:
        self.home = home
        self.root = home.root / "server"

    def ensure(self) -> Files:
        self.root.mkdir(mode=0o700, exist_ok=True)
        return self

    settings = property(lambda self: self.root / "server.json")
    cert = property(lambda self: self.root / "cert.pem")
    key = property(lambda self: self.root / "key.pem")
    pid = property(lambda self: self.root / "server.pid")
    lock = property(lambda self: self.root / "server.lock")
    log = property(lambda self: self.root / "server.log")


def parse_bind(text: str) -> tuple[str, int]:
    """(host, port) of HOST:PORT ([::1]:PORT for IPv6); MonkeyError naming the fix."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    number = whole_number(port)
    if not sep or not host or number is None or not 0 < number < 65536:
        raise MonkeyError(f"--bind {text!r}: give HOST:PORT, e.g. 127.0.0.1:8443 or 0.0.0.0:8443")
    return host, number


def parse_proxies(given: list[str]) -> list[str]:
    """The networks of GIVEN (``--trusted-proxy``: addresses or CIDR networks; ``none``
    trusts none), normalised; MonkeyError naming the one that is neither."""
    import ipaddress

    if [g.strip().lower() for g in given] == ["none"]:
        return []
    networks = []
    for text in given:
        try:
            networks.append(str(ipaddress.ip_network(text.strip(), strict=False)))
        except ValueError:
            raise MonkeyError(
                f"--trusted-proxy {text!r}: give the address or network (CIDR) of a proxy in "
                "front of this server, e.g. 10.0.0.5 or 10.0.0.0/24 (none: trust no proxy)"
            ) from None
    return list(dict.fromkeys(networks))


def configure(
    home: Home,
    bind: str | None = None,
    cert: str | None = None,
    key: str | None = None,
    no_tls: bool = False,
    trusted_proxies: list[str] | None = None,
    personal: bool | None = None,
) -> dict[str, Any]:
    """The server's settings: those given, else those of the last start, else the defaults;
    saved for the next start. Refuses plain HTTP off loopback, a half-given --cert/--key
    and a --trusted-proxy that names no address or network. PERSONAL: made by `monkey web`
    for this machine's own view (it stops with the core); `server start|run` make it a main
    node (False); None keeps what was saved."""
    files = Files(home).ensure()
    saved = saved_settings(home)
    if (cert is None) != (key is None):
        raise MonkeyError(
            "give --cert and --key together (the certificate and its private key, PEM)"
        )
    settings: dict[str, Any] = {
        "bind": bind or saved.get("bind") or DEFAULT_BIND,
        "cert": str(Path(cert).resolve()) if cert else saved.get("cert"),
        "key": str(Path(key).resolve()) if key else saved.get("key"),
        "tls": not no_tls if (no_tls or bind) else saved.get("tls", True),
        "trusted_proxies": (
            parse_proxies(trusted_proxies)
            if trusted_proxies is not None
            else list(saved.get("trusted_proxies") or [])
        ),
    }
    host, _ = parse_bind(settings["bind"])
    if not settings["tls"] and host not in LOOPBACK:
        raise MonkeyError(
            f"--no-tls serves plain HTTP, allowed on loopback only (127.0.0.1, ::1), "
            f"not {host}; drop --no-tls to serve HTTPS"
        )
    for what in ("cert", "key"):
        if settings[what] and not Path(settings[what]).is_file():
            raise MonkeyError(f"--{what} {settings[what]}: no such file")
    settings["url"] = url(settings)  # for links to its pages (the core's notifications)
    settings["personal"] = bool(saved.get("personal")) if personal is None else personal
    write_private(files.settings, json.dumps(settings, indent=2).encode())
    return settings


def saved_settings(home: Home) -> dict[str, Any]:
    """The settings of the last start ({} before the first)."""
    try:
        return dict(json.loads(Files(home).settings.read_text()))
    except (OSError, ValueError):
        return {}


def url(settings: dict[str, Any]) -> str:
    host, port = parse_bind(settings["bind"])
    shown = socket.gethostname() if host in ("0.0.0.0", "::") else host
    shown = f"[{shown}]" if ":" in shown else shown
    return f"{'https' if settings['tls'] else 'http'}://{shown}:{port}"


def cert_paths(home: Home, settings: dict[str, Any]) -> tuple[Path, Path] | None:
    """The certificate and key the server serves with, made (self-signed) when missing."""
    if not settings["tls"]:
        return None
    if settings["cert"]:
        return Path(settings["cert"]), Path(settings["key"])
    files = Files(home).ensure()
    if not files.cert.exists() or not files.key.exists():
        from monkey.server.tls import make_self_signed, names_for

        make_self_signed(files.cert, files.key, names_for(parse_bind(settings["bind"])[0]))
    return files.cert, files.key


def first_admin(home: Home) -> tuple[str, str] | None:
    """On the first start (no user yet): create an admin named after this machine's user,
    who owns the jobs submitted here; (name, token), else None."""
    from monkey.server.auth import add_user, check_name
    from monkey.store import Store
    from monkey.store.db import local_user

    store = Store(home.db)
    try:
        if store.count_users():
            return None
        try:
            name = check_name(local_user())
        except MonkeyError:
            name = "admin"
        return name, add_user(store, name, admin=True)
    finally:
        store.close()


def welcome(home: Home, settings: dict[str, Any], admin: tuple[str, str] | None) -> list[str]:
    """The lines a start prints: the URL, the fingerprint, and with a new admin its ready
    `monkey remote add` line (its token is shown this once)."""
    from monkey.server.tls import fingerprint

    paths = cert_paths(home, settings)
    lines = [f"server: {url(settings)}"]
    if paths is not None:
        lines.append(f"certificate: {fingerprint(paths[0])}")
    if admin is not None:
        name, token = admin
        lines += [
            f"admin user {name} created; its token is shown only now. On your laptop:",
            f"  {remote_add_line(home, token)}",
            "more users: monkey server user add NAME",
        ]
    return lines


def remote_add_line(home: Home, token: str) -> str:
    """The `monkey remote add` command that reaches this server with TOKEN (pinning a
    self-signed certificate; one of the user's own is taken as CA-signed)."""
    from monkey.server.tls import fingerprint

    settings = {"bind": DEFAULT_BIND, "cert": None, "tls": True, **saved_settings(home)}
    cert = Files(home).cert  # made by the first start; none yet: nothing to pin
    pin = (
        f" --fingerprint {fingerprint(cert)}"
        if settings["tls"] and not settings["cert"] and cert.exists()
        else ""
    )
    return f"monkey remote add lab {url(settings)} --token {token}{pin}"


def _try_lock(files: Files) -> int | None:
    """The server's lock, taken (its fd), or None when a server holds it."""
    return lock_now(os.open(files.lock, os.O_RDWR | os.O_CREAT, 0o600))


def status(home: Home) -> int | None:
    """PID of the server of this MONKEY_HOME, or None (-1: still starting)."""
    files = Files(home).ensure()
    fd = _try_lock(files)
    if fd is not None:
        os.close(fd)
        return None
    try:
        return int(files.pid.read_text().strip())
    except (OSError, ValueError):
        return -1


def serve(home: Home | None = None) -> int:
    """Serve the API in the foreground with the saved settings until SIGTERM/SIGINT."""
    home = (home or Home()).ensure()
    files = Files(home).ensure()
    fd = _try_lock(files)
    if fd is None:
        print(
            f"monkey: error: a server is already running for {home.root} (pid "
            f"{status(home)}); stop it with `monkey server stop`",
            file=sys.stderr,
        )
        return 1
    files.pid.unlink(missing_ok=True)  # left by a server killed (uvicorn dies by the signal it got)
    try:
        settings = configure(home)
        paths = cert_paths(home, settings)
        import uvicorn

        from monkey.core import daemon
        from monkey.server import repeats
        from monkey.server.app import build
        from monkey.server.bounds import MAX_HEADERS

        core = daemon.start(home)  # the core beside it: the API's requests are its work
        host, port = parse_bind(settings["bind"])
        logging.basicConfig(
            level=os.environ.get("MONKEY_LOG_LEVEL", "INFO"),
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
        quiet = repeats.install(logging.getLogger())  # a flood of one error: written once
        config = uvicorn.Config(
            build(home),
            host=host,
            port=port,
            log_level="warning",
            access_log=False,
            lifespan="off",
            server_header=False,
            timeout_graceful_shutdown=3,
            log_config=None,  # its records through the root logger: one format, one filter
            http="h11",  # h11 bounds a request's line and headers (httptools would not)
            h11_max_incomplete_event_size=MAX_HEADERS,  # (see monkey.server.bounds)
            # X-Forwarded-For and -Proto count only from a proxy given with --trusted-proxy
            # (uvicorn would trust them from loopback: any tunnel user could claim an address)
            proxy_headers=bool(settings["trusted_proxies"]),
            forwarded_allow_ips=settings["trusted_proxies"] or [],
            ssl_certfile=str(paths[0]) if paths else None,
            ssl_keyfile=str(paths[1]) if paths else None,
        )
        root = home.root

        class Server(uvicorn.Server):
            async def startup(self, sockets: Any = None) -> None:
                await super().startup(sockets)
                if self.started:  # bound: `start` waits for the pid file
                    write_private(files.pid, f"{os.getpid()}\n".encode())
                    logging.getLogger("monkey.server").info(
                        "server %d serving %s on %s", os.getpid(), root, url(settings)
                    )

            async def shutdown(self, sockets: Any = None) -> None:
                from monkey.server.app import STOPPING

                STOPPING.set()  # follows end now; calls under way finish
                await super().shutdown(sockets)
                repeats.flush(logging.getLogger(), quiet)  # (uvicorn then dies by its signal)

        from monkey.server.reclaim import Reclaimer
        from monkey.server.supervise import CoreWatch

        reclaimer = Reclaimer(home)  # uploads no job uses go after the gc grace
        watch = CoreWatch(home, core)  # a core that dies is started again
        server = Server(config)
        try:
            server.run()
        finally:
            watch.close()
            reclaimer.close()
        return 0 if server.started else 1
    except MonkeyError as exc:
        print(f"monkey: error: the server cannot start: {exc}", file=sys.stderr)
        return 1
    finally:
        files.pid.unlink(missing_ok=True)
        os.close(fd)


def start(home: Home, timeout: float = 20.0) -> int:
    """Start a detached server (if none runs) and wait until it accepts connections;
    MonkeyError with its first error when it cannot start."""
    files = Files(home).ensure()
    pid = status(home)
    if pid:
        return pid
    offset = files.log.stat().st_size if files.log.exists() else 0
    files.pid.unlink(
        missing_ok=True
    )  # a stale one (a server killed) must not pass for the new one's
    with open_private(files.log) as out:
        proc = subprocess.Popen(
            python_entry("monkey.server.service", "serve"),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            env=dict(os.environ, MONKEY_HOME=str(home.root)),
            cwd=home.root,
            start_new_session=True,
            close_fds=True,
        )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise MonkeyError(
                f"the server could not start: {first_error(files.log, offset)}; see {files.log}"
            )
        pid = status(home)
        if pid and pid > 0:  # written once it listens
            return pid
        time.sleep(0.05)
    raise MonkeyError(f"the server did not come up within {timeout:.0f}s; see {files.log}")


def stop(home: Home, timeout: float = 15.0) -> int | None:
    """Stop the server; the pid that stopped, or None when none ran."""
    return stop_process(lambda: status(home), "the server", timeout, every=0.05)


def systemd_unit(home: Home) -> str:
    """A systemd user unit that keeps the server up across reboots."""
    argv = " ".join([sys.executable, "-m", "monkey", "server", "run"])
    return (
        "[Unit]\nDescription=monkey server (the main node's HTTPS API)\nAfter=network-online.target\n\n"
        f"[Service]\nEnvironment=MONKEY_HOME={home.root}\nExecStart={argv}\nRestart=on-failure\n\n"
        "[Install]\nWantedBy=default.target\n"
    )
