"""Small standard-library programs the SSH driver runs on a host with ``python3 -c``.

Each takes its inputs as arguments (shell-quoted by the caller) and on stdin.
"""

from __future__ import annotations

# Connects stdin/stdout to the agent's Unix socket, starting the agent (detached, in its
# own session) when nobody listens. Prints one line "ok" once connected, so the core
# tells "agent reachable" from "python3 failed" before speaking the protocol.
# argv: socket root code_dir idle_timeout heartbeat
RELAY = r"""
import os, selectors, socket, subprocess, sys, time
sock_path, root, code, idle, beat = sys.argv[1:6]
sock_path, root, code = (os.path.abspath(p) for p in (sock_path, root, code))  # the agent runs in root
def dial():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sock_path)
    return s
try:
    s = dial()
except OSError:
    os.makedirs(root, exist_ok=True)
    boot = "import sys; sys.path.insert(0, sys.argv.pop(1)); from monkey.client_agent.agent import main; main()"
    with open(os.path.join(root, "agent.log"), "ab") as log:
        subprocess.Popen([sys.executable, "-I", "-c", boot, code, "--root", root, "--socket", sock_path,
                          "--idle-timeout", idle, "--heartbeat", beat],
                         stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=root,
                         start_new_session=True, close_fds=True)
    deadline = time.monotonic() + 15
    while True:
        try:
            s = dial()
            break
        except OSError:
            if time.monotonic() > deadline:
                sys.stderr.write("the agent did not start; see " + os.path.join(root, "agent.log") + "\n")
                sys.exit(3)
            time.sleep(0.01)
os.write(1, b"ok\n")
sel = selectors.DefaultSelector()
sel.register(0, selectors.EVENT_READ)
sel.register(s, selectors.EVENT_READ)
while True:
    for key, _ in sel.select():
        if key.fileobj == 0:
            data = os.read(0, 1 << 16)
            if not data:
                sys.exit(0)
            s.sendall(data)
        else:
            data = s.recv(1 << 16)
            if not data:
                sys.exit(0)
            view = memoryview(data)
            while view:
                view = view[os.write(1, view):]
"""

# A blob's check on a host, where no blake3 is (the agent is stdlib-only): beside blob
# D[2:] its receiver keeps ``.D[2:].sha256``, "<sha256 of the bytes> <size> <mtime_ns>
# <ctime_ns> <inode>" as stored. Blobs are never written in place, so an unchanged stat means
# unchanged bytes; a changed one is hashed again (see client_agent.agent.blob_intact).
CHECK = r"""
import hashlib, os
def stamp(st):
    return "%d %d %d %d" % (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
def record(path, sha):
    side = os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".sha256")
    tmp = side + ".tmp-%d" % os.getpid()
    with open(tmp, "w") as f:
        f.write("%s %s" % (sha, stamp(os.stat(path))))
    os.replace(tmp, side)
def intact(path):
    side = os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".sha256")
    try:
        with open(side) as f:
            sha, known = f.read().split(" ", 1)
        st = os.stat(path)
    except (OSError, ValueError):
        return False
    if known == stamp(st):
        return True
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            chunk = f.read(1 << 20)
            if not chunk:
                break
            h.update(chunk)
    if h.hexdigest() != sha:
        return False
    record(path, sha)
    return True
"""

# Prints the digests read on stdin (one a line) that blobs_dir lacks, or holds without its
# check or damaged (they are sent again, replacing the copy there). argv: blobs_dir
MISSING = CHECK + r"""
import sys
base = sys.argv[1]
for line in sys.stdin:
    d = line.strip()
    if d and not intact(os.path.join(base, d[:2], d[2:])):
        sys.stdout.write(d + "\n")
"""

# Stores blobs from stdin framed as b"<digest> <size>\n" + bytes + b"<sha256>\n" (the
# sender's hash of the bytes it checked against the digest), each through a temporary name
# and a rename, with its check beside it; bytes that arrive otherwise are refused. Prints
# "ok N" at the end. argv: blobs_dir
RECEIVE = CHECK + r"""
import re, sys
base = sys.argv[1]
src = sys.stdin.buffer
name = re.compile(rb"[A-Za-z0-9][A-Za-z0-9_:-]{2,199}")
count = 0
while True:
    head = src.readline()
    if not head:
        break
    digest, size = head.split()
    if not name.fullmatch(digest):
        sys.exit("bad digest %r" % digest)
    digest, left = digest.decode(), int(size)
    folder = os.path.join(base, digest[:2])
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, ".tmp-%s-%d" % (digest[2:], os.getpid()))
    h = hashlib.sha256()
    with open(tmp, "wb") as out:
        while left:
            chunk = src.read(min(left, 1 << 20))
            if not chunk:
                os.unlink(tmp)
                sys.exit("stream cut short")
            h.update(chunk)
            out.write(chunk)
            left -= len(chunk)
    sha = src.readline().strip().decode()
    if sha != h.hexdigest():
        os.unlink(tmp)
        sys.exit("blob %s arrived damaged (sha256 %s, sent %s)" % (digest, h.hexdigest(), sha or "none"))
    final = os.path.join(folder, digest[2:])
    os.rename(tmp, final)
    record(final, sha)
    count += 1
print("ok", count)
"""

# A file helper serving the core for the connection's lifetime: one round trip per batch.
# A batch on stdin is one JSON line [[OP, [ARGS...]], ...]; its reply one JSON line, a list
# with one result per call, then the bytes of every result's "sizes" (-1: no such file)
# back to back, in order. Ops:
#   tail [[path, offset], ...]  -> each file's bytes from offset (at most 8 MiB per call)
#   listing root                -> exists, files [[relpath, size, mtime_ns]], dirs [relpath]
#   mkdirs [path, ...]          -> made [bool]: whether each folder was new
#   matches base [glob, ...]    -> files [relpath]: regular files the globs match (a folder:
#                                  all its files), relative to base
HELPER = r"""
import json, os, stat, sys
src, out = sys.stdin.buffer, sys.stdout.buffer
def tail(files):
    sizes, blobs = [], []
    for path, offset in files:
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read(8 << 20)
        except FileNotFoundError:
            sizes.append(-1)
            continue
        sizes.append(len(data))
        blobs.append(data)
    return {"sizes": sizes}, blobs
def listing(root):
    files, dirs = [], []
    for path, subdirs, names in os.walk(root):
        rel = os.path.relpath(path, root)
        dirs += [os.path.normpath(os.path.join(rel, d)) for d in subdirs]
        for name in names:
            st = os.lstat(os.path.join(path, name))
            if stat.S_ISREG(st.st_mode):
                files.append([os.path.normpath(os.path.join(rel, name)), st.st_size, st.st_mtime_ns])
    return {"exists": os.path.isdir(root), "files": files, "dirs": dirs}, []
def mkdirs(paths):
    made = [not os.path.isdir(p) for p in paths]
    for p in paths:
        os.makedirs(p, exist_ok=True)
    return {"made": made}, []
def matches(base, patterns):
    import glob
    found = set()
    for pattern in patterns:
        for path in glob.glob(os.path.join(glob.escape(base), pattern), recursive=True):
            rel = os.path.relpath(path, base)
            if os.path.isfile(path) and not os.path.islink(path):
                found.add(os.path.normpath(rel))
            elif os.path.isdir(path) and not os.path.islink(path):
                for sub, _, names in os.walk(path):
                    for name in names:
                        if os.path.isfile(os.path.join(sub, name)):
                            found.add(os.path.normpath(os.path.relpath(os.path.join(sub, name), base)))
    return {"files": sorted(found)}, []
OPS = {"tail": tail, "listing": listing, "mkdirs": mkdirs, "matches": matches}
for line in src:
    heads, blobs = [], []
    for op, args in json.loads(line):
        try:
            head, data = OPS[op](*args)
            head["ok"] = True
        except Exception as e:
            head, data = {"ok": False, "error": "%s: %s" % (type(e).__name__, e)}, []
        heads.append(head)
        blobs += data
    out.write(json.dumps(heads).encode() + b"\n")
    for blob in blobs:
        out.write(blob)
    out.flush()
"""
