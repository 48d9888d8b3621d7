"""The main node's memory under two 1 GiB unauthenticated posts to Monkey Web's login form
at once (one chunked, one with a Content-Length), as anyone who can reach the port could
send them: the growth of the server's peak resident memory (VmHWM of /proc/PID/status over
its VmRSS before).

Target (issue 41): under 64 MiB (each body is refused once past its bound, 64 KiB, and
never read further). `python bench/server_body_bound.py`.
"""

from __future__ import annotations

import json
import socket
import ssl
import sys
import threading
import time

from common import fresh_home, start_main_node, stop_everything

SIZE = 1 << 30


def memory(pid: int, field: str) -> int:
    """FIELD (VmRSS, VmHWM) of process PID, in bytes."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise SystemExit(f"no {field} for process {pid}")


def post(port: int, chunked: bool, answers: list[bytes]) -> None:
    """POST SIZE bytes to /web/login with no token; its answer's status line in ANSWERS."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    sock = ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=120))
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {SIZE}"
    sock.sendall(
        f"POST /web/login HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
        f"application/x-www-form-urlencoded\r\n{framing}\r\n\r\n".encode()
    )
    piece = b"t" * (1 << 20)
    answer = b""
    try:
        for _ in range(SIZE // len(piece)):
            sock.setblocking(False)
            try:
                answer = sock.recv(4096)  # (the socket's readiness may be a TLS ticket)
            except ssl.SSLWantReadError:
                pass
            sock.settimeout(120)
            if answer:
                break  # the server answered: it reads no more
            sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
        else:
            if chunked:
                sock.sendall(b"0\r\n\r\n")
    except OSError:
        pass  # closed by the server
    try:
        while chunk := sock.recv(4096):
            answer += chunk
    except OSError:
        pass
    sock.close()
    answers.append(answer.split(b"\r\n", 1)[0])


def main() -> None:
    home = fresh_home()
    start_main_node(home)
    pid = int((home / "server" / "server.pid").read_text())
    port = int(json.loads((home / "server" / "server.json").read_text())["bind"].split(":")[1])
    try:
        time.sleep(1)
        before = memory(pid, "VmRSS")
        answers: list[bytes] = []
        threads = [
            threading.Thread(target=post, args=(port, chunked, answers))
            for chunked in (True, False)
        ]
        started = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        took = time.monotonic() - started
        peak = memory(pid, "VmHWM")
    finally:
        from monkey.config import Home
        from monkey.server.service import stop

        stop(Home(home))
        stop_everything(home)
    print(f"answers: {', '.join(a.decode(errors='replace') for a in answers)} ({took:.1f} s)")
    print(f"server RSS before: {before / 2**20:7.1f} MiB")
    growth = (peak - before) / 2**20
    print(f"peak RSS growth under two 1 GiB posts: {growth:7.1f} MiB (target < 64 MiB)")
    sys.exit(0 if growth < 64 else 1)


if __name__ == "__main__":
    main()
