"""What the agent knows of processes: /proc readers, signals, cgroups (v2), the subreaper
sweep of a job's leftovers (job_tree, children_of), GPU and memory figures. Standard library
only (see agent.py)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time

from monkey.client_agent.common import RequestError, log, read_small

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, TypeGuard

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def read_stat(pid: int) -> list[bytes] | None:
    """Fields of /proc/PID/stat after the command name (index 0 is field 3), or None."""
    data = read_small(f"/proc/{pid}/stat")
    return None if data is None else data[data.rfind(b")") + 2 :].split()


def stat_start_ticks(fields: list[bytes]) -> int:
    """Field 22 (starttime, clock ticks after boot)."""
    return int(fields[19])


def is_running(fields: list[bytes] | None) -> TypeGuard[list[bytes]]:
    """True for a process that has not exited yet (not a zombie)."""
    return fields is not None and fields[0] not in (b"Z", b"X", b"x")


def proc_pids() -> list[int]:
    """Every process id in /proc."""
    return [int(n) for n in os.listdir("/proc") if n.isdigit()]


def job_tree(sid: int | None, tag: bytes | None, roots: set[int]) -> set[int]:
    """Pids of a job's processes: its session SID, the orphans whose environment has the
    line TAG (a process the job started that left the session and lost its parent, having
    kept its environment), the pids in ROOTS, and every descendant of all of those. Only
    orphans (adopted by this agent as subreaper, or by init) have their environment read:
    any other process of the job descends from one already found."""
    parents: dict[int, int] = {}
    found = set(roots)
    adopters = {1, os.getpid()}
    for pid in proc_pids():
        fields = read_stat(pid)
        if fields is None or pid == os.getpid():
            continue
        ppid = parents[pid] = int(fields[1])
        if sid is not None and int(fields[3]) == sid:
            found.add(pid)
        elif tag is not None and ppid in adopters and tag in environ_lines(pid):
            found.add(pid)
    grew = True
    while grew:
        more = {pid for pid, ppid in parents.items() if ppid in found and pid not in found}
        found |= more
        grew = bool(more)
    return found


def environ_lines(pid: int) -> list[bytes]:
    """The NUL-separated lines of /proc/PID/environ (empty when unreadable)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def signal_pids(pids: set[int], signum: int) -> None:
    """Send SIGNUM to each of PIDS that still exists."""
    for pid in pids:
        try:
            os.kill(pid, signum)
        except OSError:
            pass


def cgroup2_self() -> str | None:
    """The folder of this process's cgroup v2, or None without a cgroup2 mount."""
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as f:
            own = next((line[3:].strip() for line in f if line.startswith("0::")), None)
        with open("/proc/self/mounts", encoding="utf-8") as f:
            mount = next((m.split()[1] for m in f if m.split()[2:3] == ["cgroup2"]), None)
    except OSError:
        return None
    if own is None or mount is None:
        return None
    return os.path.join(mount, own.lstrip("/"))


class Cgroups:
    """One cgroup v2 per live job, under the agent's own, when the kernel lets the agent make
    them and move processes in (root, or a delegated subtree). Every process a job starts
    stays in its cgroup whatever it does (setsid, double fork), so nothing is left behind.
    ``base`` is None when cgroups cannot be used (the agent then sweeps by session,
    environment and descendants, as a child subreaper).

    A job's cgroup is empty once the job ended and its leftovers were killed: it is kept
    for a later job (making and removing a cgroup costs the kernel more than a short job
    does). Cgroups this agent made are named ``job-PID-N`` by its pid, made with an
    exclusive mkdir, so that no two agents ever hand out the same one."""

    KEEP = 64  # empty cgroups kept for later jobs

    def __init__(self, root: str) -> None:
        self.base: str | None = None
        self.leftover: set[str] = set()  # cgroups to remove once their processes are gone
        self.free: list[str] = []  # empty cgroups of ended jobs, handed out again
        self.made = 0  # cgroups this agent made (the N of their names)
        parent = None if os.environ.get("MONKEY_NO_CGROUP") else cgroup2_self()
        if parent is None:
            return
        name = "monkey-" + re.sub(r"[^A-Za-z0-9]", "_", root)[-40:] + f"-{os.stat(root).st_ino}"
        base = os.path.join(parent, name)
        try:
            os.makedirs(base, exist_ok=True)
            if self._can_move_into(base):
                self.base = base
        except OSError as e:
            log(f"no cgroups for jobs ({e}); sweeping process trees instead")

    @staticmethod
    def _can_move_into(base: str) -> bool:
        """Move a throwaway child into a probe cgroup under BASE, and check it got there."""
        probe = os.path.join(base, f"probe-{os.getpid()}")
        os.makedirs(probe, exist_ok=True)
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(write_end)
            os.read(read_end, 1)
            os._exit(0)
        os.close(read_end)
        try:
            with open(os.path.join(probe, "cgroup.procs"), "w") as f:
                f.write(str(pid))
            with open(f"/proc/{pid}/cgroup", encoding="utf-8") as f:
                return any(line.rstrip().endswith(f"/probe-{os.getpid()}") for line in f)
        finally:
            os.close(write_end)
            os.waitpid(pid, 0)
            os.rmdir(probe)

    def make(self) -> str:
        """An empty cgroup for one attempt ("" when cgroups are not used)."""
        if self.base is None:
            return ""
        while self.free:
            path = self.free.pop()
            if os.path.isdir(path):  # not removed from outside meanwhile
                return path
        while True:
            self.made += 1
            path = os.path.join(self.base, f"job-{os.getpid()}-{self.made}")
            try:
                os.mkdir(path)
                return path
            except FileExistsError:  # an earlier agent of the same pid made it
                continue
            except FileNotFoundError as e:  # its folder vanished: made again once
                if os.path.isdir(self.base) or not self._remake_base(e):
                    log(f"cannot make a cgroup for a job: {e}")
                    return ""
            except OSError as e:
                log(f"cannot make a cgroup for a job: {e}")
                return ""

    def _remake_base(self, why: OSError) -> bool:
        """The agent's cgroup folder vanished (removed from outside while no job ran): make
        it again, so that jobs keep running in cgroups. False when it cannot be."""
        assert self.base is not None
        try:
            os.makedirs(self.base)
        except OSError as e:
            log(f"cannot make a cgroup for a job ({why}), nor its folder again: {e}")
            return False
        log(f"the cgroup folder {self.base} vanished; made it again")
        return True

    @staticmethod
    def pids(path: str) -> set[int]:
        """The processes in the cgroup at PATH."""
        try:
            with open(os.path.join(path, "cgroup.procs"), "rb") as f:
                return {int(p) for p in f.read().split()}
        except (OSError, ValueError):
            return set()

    def release(self, path: str) -> None:
        """SIGKILL every process of the cgroup of a job that ended. An empty one is kept for
        a later job: nothing can enter it any more (the wrapper that joined it has exited,
        and an empty cgroup has no process to fork into it); one with processes left is
        removed once they are gone."""
        try:
            fd = os.open(os.path.join(path, "cgroup.procs"), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        except OSError:
            empty = False
        else:
            try:
                empty = not os.read(fd, 1)
            except OSError:
                empty = False
            finally:
                os.close(fd)
        if empty and len(self.free) < self.KEEP and os.path.dirname(path) == self.base:
            self.free.append(path)
            return
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            pass
        try:
            with open(os.path.join(path, "cgroup.kill"), "w") as f:
                f.write("1")
        except OSError:  # kernels before 5.14
            signal_pids(self.pids(path), signal.SIGKILL)
        self.leftover.add(path)
        self.tidy()

    def tidy(self) -> None:
        """Remove the cgroups left to remove whose processes are gone."""
        for path in list(self.leftover):
            try:
                os.rmdir(path)
            except FileNotFoundError:
                pass
            except OSError:
                continue
            self.leftover.discard(path)

    def close(self, busy: set[str]) -> None:
        """Remove the cgroups kept for later jobs, the empty ones agents that died left under
        BASE (not those of BUSY, live jobs' cgroups, even when still empty), and BASE when
        nothing is left in it (jobs of an earlier agent may still run there)."""
        self.tidy()
        self.free.clear()
        if self.base is None:
            return
        try:
            names = os.listdir(self.base)
        except OSError:
            return
        for name in names:
            path = os.path.join(self.base, name)
            if os.path.isdir(path) and path not in busy:
                try:
                    os.rmdir(path)
                except OSError:
                    pass  # processes still run there
        try:
            os.rmdir(self.base)
        except OSError:
            pass


def session_usage(sids: set[int]) -> dict[int, list[int]]:
    """Per session id: [utime+stime+cutime+cstime ticks, rss pages, processes]."""
    usage: dict[int, list[int]] = {}
    for pid in proc_pids():
        fields = read_stat(pid)
        if fields is None:
            continue
        sid = int(fields[3])
        if sid in sids:
            total = usage.setdefault(sid, [0, 0, 0])
            total[0] += sum(int(x) for x in fields[11:15])
            total[1] += int(fields[21])
            total[2] += 1
    return usage


def boottime() -> float:
    """Seconds since boot, the clock of /proc start times."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def children_of(pid: int) -> set[int]:
    """The children of PID (of all its threads)."""
    found: set[int] = set()
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                found.update(int(c) for c in f.read().split())
    except OSError:
        pass
    return found


def become_subreaper() -> bool:
    """Make this process the child subreaper of its descendants (Linux prctl); False
    where it cannot (a python3 without ctypes' libffi, as in a minimal image)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError, ImportError):
        return False


def gpu_usage_probe() -> subprocess.Popen | None:
    """Start nvidia-smi reading utilisation and memory of every GPU (None without it)."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        return subprocess.Popen(
            [
                "nvidia-smi",
                "--query-gpu=index,utilization.gpu,memory.used",
                "--format=csv,noheader,nounits",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
        )
    except OSError:
        return None


def parse_gpu_usage(out: bytes) -> dict[str, dict[str, float]]:
    """{index: {"util": percent, "mem": MiB}} from nvidia-smi's CSV."""
    usage = {}
    for line in out.decode(errors="replace").splitlines():
        parts = [p.strip() for p in line.split(",")]
        try:
            usage[parts[0]] = {"util": float(parts[1]), "mem": float(parts[2])}
        except (IndexError, ValueError):
            continue
    return usage


def parse_signal(value: Any) -> int:
    """A signal number from "TERM", "SIGTERM" or a number."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        name = value.upper()
        name = name if name.startswith("SIG") else f"SIG{name}"
        sig = getattr(signal.Signals, name, None)
        if sig is not None:
            return int(sig)
    raise RequestError(f"unknown signal {value!r}")


def detect_gpus() -> list[dict[str, Any]]:
    """GPUs reported by nvidia-smi, [] without it."""
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError) as e:
        log(f"nvidia-smi failed: {e}")
        return []
    gpus = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and parts[0].isdigit():
            memory = int(parts[2]) if parts[2].isdigit() else None
            gpus.append({"index": int(parts[0]), "name": parts[1], "memory": memory})
    return gpus


def mem_total() -> int | None:
    """MemTotal of /proc/meminfo in bytes."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def free_bytes(path: str) -> int:
    """Bytes an ordinary user may still write on PATH's filesystem; -1 when unknown."""
    try:
        st = os.statvfs(path)
    except OSError:
        return -1
    return st.f_bavail * st.f_frsize
