"""Small standard-library programs the SSH driver runs on a host with ``python3 -c``.

Each takes its inputs as arguments (shell-quoted by the caller) and on stdin.
"""

from __future__ import annotations

# Connects stdin/stdout to the agent's Unix socket, starting the agent (detached, in its
# own session) when nobody listens. Prints one line "ok" once connected, so the core
# tells "agent reachable" from "python3 failed" before speaking the protocol.
# argv: socket root code_dir idle_timeout heartbeat
RELAY = r"""
import os, selectors, socket, stat, subprocess, sys, time
# What the relay and the agent it starts create is the user's alone; the agent gives its
# jobs the login's own umask back.
os.environ.setdefault("MONKEY_JOB_UMASK", "%o" % os.umask(0o077))
sock_path, root, code, idle, beat = sys.argv[1:6]
sock_path, root, code = (os.path.abspath(p) for p in (sock_path, root, code))  # the agent runs in root
def tighten(root):
    # A root an older monkey left open (0755/0644): it and its direct entries lose group and
    # other permissions, which puts everything deeper out of anyone else's reach.
    try:
        if not os.stat(root).st_mode & 0o077:
            return
        with os.scandir(root) as entries:
            for entry in entries:
                if not entry.is_symlink():
                    os.chmod(entry.path, stat.S_IMODE(entry.stat(follow_symlinks=False).st_mode) & 0o700)
        os.chmod(root, stat.S_IMODE(os.stat(root).st_mode) & 0o700)  # last: redone if cut short
    except FileNotFoundError:
        pass
tighten(root)
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
                          "--idle-timeout", idle, "--heartbeat", beat, "--reserve", str(1 << 20)],
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
# unchanged bytes; a changed one is hashed again (see client_agent.blobs.blob_intact).
CHECK = r"""
import hashlib, os
os.umask(0o077)
def stamp(st):
    return "%d %d %d %d" % (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
def side_of(path):
    return os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".sha256")
def record(path, sha):
    side = side_of(path)
    tmp = side + ".tmp-%d" % os.getpid()
    with open(tmp, "w") as f:
        f.write("%s %s" % (sha, stamp(os.stat(path))))
    os.replace(tmp, side)
def intact(path):
    try:
        with open(side_of(path)) as f:
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
# check or damaged (they are sent again, replacing the copy there); the others are touched:
# in use, another home's gc on this host keeps them for its grace. argv: blobs_dir
MISSING = (
    CHECK
    + r"""
import sys
base = sys.argv[1]
for line in sys.stdin:
    d = line.strip()
    if not d:
        continue
    path = os.path.join(base, d[:2], d[2:])
    if not intact(path):
        sys.stdout.write(d + "\n")
        continue
    try:
        os.utime(side_of(path))  # the blob's own times are its check's stamp: left alone
    except OSError:
        pass
"""
)

# Stores blobs from stdin framed as b"<digest> <size>\n" + bytes + b"<sha256>\n" (the
# sender's hash of the bytes it checked against the digest), each through a temporary name
# and a rename, with its check beside it; bytes that arrive otherwise are refused. Prints
# "ok N" at the end. A full disk leaves no partial file and ends it with DISK_FULL's exit
# code and "disk full at PATH (N bytes free)" on stderr. argv: blobs_dir
DISK_FULL = 28  # ENOSPC
RECEIVE = (
    CHECK
    + r"""
import errno, re, sys
base = sys.argv[1]
src = sys.stdin.buffer
name = re.compile(rb"[A-Za-z0-9][A-Za-z0-9_:-]{2,199}")
count = 0
tmp = None
def store(digest, left):
    global tmp
    folder = os.path.join(base, digest[:2])
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, ".tmp-%s-%d" % (digest[2:], os.getpid()))
    h = hashlib.sha256()
    with open(tmp, "wb") as out:
        while left:
            chunk = src.read(min(left, 1 << 20))
            if not chunk:
                sys.exit("stream cut short")
            h.update(chunk)
            out.write(chunk)
            left -= len(chunk)
    sha = src.readline().strip().decode()
    if sha != h.hexdigest():
        sys.exit("blob %s arrived damaged (sha256 %s, sent %s)" % (digest, h.hexdigest(), sha or "none"))
    final = os.path.join(folder, digest[2:])
    os.rename(tmp, final)
    tmp = None
    record(final, sha)
try:
    while True:
        head = src.readline()
        if not head:
            break
        digest, size = head.split()
        if not name.fullmatch(digest):
            sys.exit("bad digest %r" % digest)
        store(digest.decode(), int(size))
        count += 1
except OSError as e:
    if tmp is not None:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        tmp = None
    if e.errno not in (errno.ENOSPC, errno.EDQUOT):
        raise
    st = os.statvfs(base)
    sys.stderr.write("disk full at %s (%d bytes free)\n" % (base, st.f_bavail * st.f_frsize))
    sys.exit(28)
finally:
    if tmp is not None:  # cut short (the stream, a signal, a damaged blob): no partial file stays
        try:
            os.unlink(tmp)
        except OSError:
            pass
print("ok", count)
"""
)

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
os.umask(0o077)
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

# Deletes this home's folders of deleted jobs and, with "gc", the blobs no home needs and
# partial uploads left behind; prints what it freed as one JSON line. Blobs named by any
# home's runs/<tag>/blobs.needed (written here by each home's gc: this one's is replaced by
# "keep") stay, and so does every blob used (see MISSING) or written in the last GRACE
# seconds: several homes may share a host's blobs folder. A partial upload is removed once
# a minute old (a live one is written to without pause).
# argv: workdir runs_dir grace; stdin: {"runs": [juid...], "gc": bool, "keep": [digest...]}
CLEAN = r"""
import json, os, re, shutil, sys, time
os.umask(0o077)
work, runs, grace = sys.argv[1], sys.argv[2], float(sys.argv[3])
req = json.load(sys.stdin)
name = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
out = {"runs": 0, "run_bytes": 0, "blobs": 0, "blob_bytes": 0, "partial": 0, "partial_bytes": 0}
def size(path):
    total = 0
    for folder, _, names in os.walk(path):
        for n in names:
            try:
                total += os.lstat(os.path.join(folder, n)).st_size
            except OSError:
                pass
    return total
for juid in req.get("runs") or []:
    path = os.path.join(runs, juid)
    if name.fullmatch(juid) and juid != "blobs.needed" and os.path.isdir(path) and not os.path.islink(path):
        out["run_bytes"] += size(path)
        for folder, _, _ in os.walk(path):  # read-only folders (datasets, persisted)
            try:
                os.chmod(folder, 0o700)
            except OSError:
                pass
        shutil.rmtree(path, ignore_errors=True)
        out["runs"] += 1
if req.get("gc"):
    keep = set(req.get("keep") or [])
    os.makedirs(runs, exist_ok=True)
    mine = os.path.join(runs, "blobs.needed")
    with open(mine + ".tmp", "w") as f:
        f.write("".join(d + "\n" for d in sorted(keep)))
    os.replace(mine + ".tmp", mine)
    base = os.path.dirname(runs)
    for tag in os.listdir(base):
        other = os.path.join(base, tag, "blobs.needed")
        if other != mine:
            try:
                with open(other) as f:
                    keep.update(line.strip() for line in f)
            except OSError:
                pass
    now = time.time()
    blobs = os.path.join(work, "blobs")
    for shard in sorted(os.listdir(blobs)) if os.path.isdir(blobs) else []:
        folder = os.path.join(blobs, shard)
        if len(shard) != 2 or not os.path.isdir(folder):
            continue
        names = set(os.listdir(folder))
        for n in sorted(names):
            path = os.path.join(folder, n)
            side = os.path.join(folder, "." + n + ".sha256")  # the blob's check (see CHECK)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if n.startswith(".") and n.endswith(".sha256"):  # a check: goes with its blob
                if n[1:-7] not in names and st.st_mtime < now - 60:
                    try:
                        os.unlink(path)
                    except OSError:
                        pass
                continue
            partial = n.startswith(".tmp-") or ".sha256.tmp-" in n
            try:  # a blob in use has its check touched (MISSING), its own times left alone
                used = max(st.st_mtime, os.lstat(side).st_mtime)
            except OSError:
                used = st.st_mtime
            if partial and st.st_mtime > now - 60 or not partial and (
                    shard + n in keep or used > now - grace):
                continue
            try:
                os.unlink(path)
            except OSError:
                continue
            if not partial:
                try:
                    os.unlink(side)
                except OSError:
                    pass
            out["partial" if partial else "blobs"] += 1
            out["partial_bytes" if partial else "blob_bytes"] += st.st_size
print(json.dumps(out))
"""

# What monkey keeps on the host, as one JSON line: {part: [bytes, files]} for this home's run
# folders (with their count of jobs), other homes' run folders, blobs, partial uploads,
# dataset copies, environments and the installed agents; and the bytes free there.
# argv: workdir runs_dir
USAGE = r"""
import json, os, sys
work, runs = sys.argv[1], sys.argv[2]
def walk(path, skip=None):
    total = files = 0
    for folder, dirs, names in os.walk(path):
        if skip:
            dirs[:] = [d for d in dirs if os.path.join(folder, d) != skip]
        for n in names:
            try:
                total += os.lstat(os.path.join(folder, n)).st_size
                files += 1
            except OSError:
                pass
    return [total, files]
out = {"runs": walk(runs), "other_homes": walk(os.path.join(work, "runs"), skip=runs)}
out["jobs"] = len([n for n in os.listdir(runs) if os.path.isdir(os.path.join(runs, n))]) if os.path.isdir(runs) else 0
blobs, partial = [0, 0], [0, 0]
base = os.path.join(work, "blobs")
for folder, _, names in os.walk(base):
    for n in names:
        try:
            size = os.lstat(os.path.join(folder, n)).st_size
        except OSError:
            continue
        part = partial if n.startswith(".tmp-") else blobs
        part[0] += size
        part[1] += 1
out.update(blobs=blobs, partial=partial, datasets=walk(os.path.join(work, "datasets")),
           envs=walk(os.path.join(work, "envs")), agent=walk(os.path.join(work, "agent")))
try:
    st = os.statvfs(work)
    out["free"] = st.f_bavail * st.f_frsize
except OSError:
    out["free"] = None
print(json.dumps(out))
"""
