"""The relay monkey runs in a Kubernetes pod, through the API server's exec channel: it
joins the exec's stdin and stdout to the pod's agent's socket, and sends the attempt's logs
along the same stream, so the core needs no inbound port and no second request per pod.

    python3 -I -c BOOT CODE_DIR SOCKET RUN_DIR NAME=OFFSET... [kept:FOLDER=0...]

It prints ``ok`` once connected (waiting up to 60 s for the agent, which starts once its
code is in the pod), then relays whole lines of the agent both ways. Each file NAME of
RUN_DIR that grew past OFFSET is sent as a line ``{"push": "file", "name": NAME, "at":
OFFSET, "data": BASE64}`` before the agent's next lines: the bytes a job wrote before its
exit come before its exit event. A line ``{"push": "kept"}`` says that a FOLDER beside
RUN_DIR (the job's checkpoint, its persisted folders) changed since the relay started or
since the last such line: the core reads them back then, not by asking every pod. (An older
relay takes ``kept:FOLDER`` for a file that is not there.) Standard library only (see
agent.py).
"""

from __future__ import annotations

import base64
import json
import os
import selectors
import socket
import sys
import time

CHUNK = 1 << 20  # bytes of one file sent in one line
TAIL_EVERY = 0.2
KEPT = "kept:"  # an argument kept:FOLDER=0 names a folder to watch for changes
KEPT_EVERY = 1.0  # seconds between looks at the kept folders


def _dial(path: str, wait: float) -> socket.socket:
    deadline = time.monotonic() + wait
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(path)
            return s
        except OSError:
            s.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _write(data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(1, view) :]


def _tail(run_dir: str, offsets: dict[str, int]) -> None:
    """Send what each followed file gained since its offset."""
    for name, at in offsets.items():
        try:
            size = os.path.getsize(os.path.join(run_dir, name))
        except OSError:
            continue
        while size > at:
            with open(os.path.join(run_dir, name), "rb") as f:
                f.seek(at)
                data = f.read(min(CHUNK, size - at))
            if not data:
                break
            line = {"push": "file", "name": name, "at": at, "data": base64.b64encode(data).decode()}
            _write(json.dumps(line).encode() + b"\n")
            at += len(data)
        offsets[name] = at


def _signature(folders: list[str]) -> list[tuple[str, int, int]]:
    """The files under FOLDERS, with their sizes and modification times."""
    out = []
    for top in folders:
        for folder, _, names in os.walk(top):
            for name in names:
                path = os.path.join(folder, name)
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                out.append((path, st.st_size, st.st_mtime_ns))
    return sorted(out)


def relay(sock_path: str, run_dir: str, offsets: dict[str, int], kept: list[str]) -> int:
    try:
        s = _dial(sock_path, 60)
    except OSError as e:
        sys.stderr.write(f"the agent of this pod is not listening on {sock_path}: {e}\n")
        return 3
    _write(b"ok\n")
    sel = selectors.DefaultSelector()
    sel.register(0, selectors.EVENT_READ)
    sel.register(s, selectors.EVENT_READ)
    held = b""  # the agent's output after its last whole line
    next_tail = 0.0
    seen, next_look = _signature(kept), time.monotonic() + KEPT_EVERY
    while True:
        ready = sel.select(TAIL_EVERY)
        if time.monotonic() >= next_tail or any(k.fileobj is s for k, _ in ready):
            _tail(run_dir, offsets)
            next_tail = time.monotonic() + TAIL_EVERY
        if kept and time.monotonic() >= next_look:
            now = _signature(kept)
            if now != seen:
                seen = now
                _write(b'{"push": "kept"}\n')
            next_look = time.monotonic() + KEPT_EVERY
        for key, _ in ready:
            if key.fileobj == 0:
                data = os.read(0, 1 << 16)
                if not data:
                    return 0
                s.sendall(data)
            else:
                data = s.recv(1 << 16)
                if not data:
                    _write(held)
                    return 0
                held += data
                cut = held.rfind(b"\n") + 1
                if cut:
                    _write(held[:cut])
                    held = held[cut:]


def main() -> int:
    sock_path, run_dir, *pairs = sys.argv[1:]
    offsets, kept = {}, []
    for pair in pairs:
        name, _, at = pair.rpartition("=")
        if name.startswith(KEPT):
            kept.append(os.path.join(os.path.dirname(run_dir), name[len(KEPT) :]))
        else:
            offsets[name] = int(at)
    return relay(sock_path, run_dir, offsets, kept)


if __name__ == "__main__":
    sys.exit(main())
